"""The conductor: the whole experiment lifecycle, in one place.

An experiment moves through these states, each written to the store before its side effect, and
each side effect safe to repeat, so that a conductor killed anywhere resumes where it stopped:

    proposed  --create branch-->  branched  --queue run-->  measuring
    measuring --judge--> measuring (confirmation run) | rebasing | merging | closing
    rebasing  --graft train.py onto the new main, queue a re-measure-->  measuring
    merging   --squash-merge into main (expected sha)-->  closing
    closing   --mark the branch closed-->  done  (status keep | discard | crash)

Main's own train.py is measured `baseline_runs` times (the noise estimate); a kept experiment's
runs become main's measurements. The agent only proposes; judging, merging and bookkeeping are
this module's, from the store's numbers alone.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot import results
from bot.agent import Agent, AgentError
from bot.forge import Forge, MainMoved, MergeConflict
from bot.judge import JudgeConfig, decide, pooled_sigma
from bot.records import HistoryEntry, Job, Proposal, ProposalContext, code_hash
from bot.runners import Runner
from bot.settings import LoopSettings, Program, parse_program
from bot.store import Experiment, Run, Store
from runner.profiles import get_profile

log = logging.getLogger(__name__)

ASSET = "train.py"
PROGRAM = "program.md"
RUN_PRIORITY = {"baseline": 0, "remeasure": 1, "confirm": 2, "candidate": 3}
MAX_BASELINE_CRASHES = 2  # crashes of main's own train.py before the loop asks for a human


class ConductorError(RuntimeError):
    """The loop cannot go on without a human (for example main's train.py crashes)."""


@dataclass
class ConductorConfig:
    profile: str
    max_experiments: int = 0  # 0: take program.md's setting (whose 0 means no limit)
    # harness_hash and data_fingerprint that runs must match; empty: those of the latest ok run
    identity: dict[str, str] = field(default_factory=dict)
    poll_interval_s: float = 0.5
    max_refusals: int = 5  # invalid proposals in a row before the agent is given up on


@dataclass
class Summary:
    experiments: int
    kept: int
    discarded: int
    crashed: int
    baseline_val_bpb: float | None
    best_val_bpb: float | None
    results_tsv: Path
    stop_reason: str


class Conductor:
    def __init__(self, store: Store, forge: Forge, runner: Runner, agent: Agent, config: ConductorConfig,
                 *, results_tsv: Path, on_update: Callable[["Conductor"], None] | None = None) -> None:
        self.store = store
        self.forge = forge
        self.runner = runner
        self.agent = agent
        self.config = config
        self.results_tsv = results_tsv
        self.on_update = on_update
        self.profile = get_profile(config.profile)
        self.stop_reason = ""
        self._agent_stop = ""  # set once the agent has nothing more to propose
        self._main_cache: dict[str, tuple[str, str, Program]] = {}

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> Summary:
        """Drive experiments until the target is reached and nothing is in flight."""
        self.recover()
        while True:
            self.stop_reason = self._agent_stop  # target, pause and goal are read afresh each pass
            self.collect()
            program = self.program()
            for exp in self.store.experiments(active=True):
                self.advance(exp)
            self.schedule_baseline()
            self.propose_while_room(program.settings)
            self.dispatch()
            if self.on_update:
                self.on_update(self)
            if self.idle():
                break
            time.sleep(self.config.poll_interval_s)
        results.export_tsv(self.store, self.results_tsv)
        return self.summary()

    def recover(self) -> None:
        """After a restart: follow runs that went on without us; re-queue those that were lost."""
        for run in self.store.runs(state="running"):
            if run.run_dir and self.runner.reattach(run.id, run.run_dir):
                log.info("run %s: picked up again after a restart", run.id)
                continue
            self.store.replace_lost_run(run.id, "its process was gone after a restart")

    def idle(self) -> bool:
        busy = self.store.experiments(active=True) or self.store.runs(state="queued") \
            or self.store.runs(state="running")
        return not busy and bool(self.stop_reason)

    # --- main and its measurements ---------------------------------------------------------------
    def _main(self) -> tuple[str, str, str, Program]:
        """Main's sha, train.py, its code hash and program.md, read from git once per main commit."""
        sha = self.forge.main_sha()
        if sha not in self._main_cache:
            text = self.forge.read_file(sha, ASSET)
            try:
                program_md = self.forge.read_file(sha, PROGRAM)
            except FileNotFoundError:
                program_md = ""
            self._main_cache = {sha: (text, code_hash(text), parse_program(program_md))}
        text, code, program = self._main_cache[sha]
        return sha, text, code, program

    def program(self) -> Program:
        return self._main()[3]

    def main_asset(self) -> tuple[str, str, str]:
        """(main sha, main's train.py, its code hash)."""
        return self._main()[:3]

    def identity(self) -> dict[str, str | None]:
        """What makes measurements comparable: profile, harness version, data. Set in the config, or
        taken from the latest successful run, so that a new harness version starts a new baseline."""
        if self.config.identity:
            return dict(self.config.identity)
        for run in reversed(self.store.runs(state="done")):
            if run.status == "ok" and run.profile == self.profile.name:
                return {"harness_hash": run.harness_hash, "data_fingerprint": run.data_fingerprint}
        return {}

    def counted(self, runs: list[Run]) -> list[Run]:
        """Runs that finished and were measured under the current profile, harness and data.
        A crash has no identity of its own and counts under the current one."""
        want = self.identity()
        return [r for r in runs if r.state == "done" and r.profile == self.profile.name
                and (r.status == "crash" or all(r.metrics.get(k) == v for k, v in want.items()))]

    def measurements(self, code: str) -> list[float]:
        """Main's val_bpb values: its baseline runs only. The runs that got a change kept were
        selected for coming out low, so they would flatter main (they still count for the noise)."""
        return [r.val_bpb for r in self.counted(self.store.runs(code_hash=code))
                if r.status == "ok" and r.val_bpb is not None and r.purpose == "baseline"]

    def noise_sigma(self) -> float | None:
        groups: dict[str, list[float]] = {}
        for run in self.counted(self.store.runs()):
            if run.status == "ok" and run.val_bpb is not None:
                groups.setdefault(run.code_hash, []).append(run.val_bpb)
        return pooled_sigma(list(groups.values()))

    def schedule_baseline(self) -> None:
        settings = self.program().settings
        sha, text, code = self.main_asset()
        runs = self.store.runs(code_hash=code)
        crashed = [r for r in self.counted(runs) if r.status == "crash" and r.purpose == "baseline"]
        if len(crashed) >= MAX_BASELINE_CRASHES:
            raise ConductorError(
                f"train.py on main ({sha[:7]}) crashed in {len(crashed)} baseline runs, so nothing can be "
                "judged against it. Commit a fixed train.py to main in the research repository (a new main "
                f"gets a new baseline), then run the same command again. The last run said:\n{crashed[-1].error}")
        pending = [r for r in runs if r.state in ("queued", "running")]
        missing = settings.baseline_runs - len(self.measurements(code)) - len(pending)
        for _ in range(max(0, missing)):
            self.store.add_run(experiment_id=None, purpose="baseline", code_hash=code, commit_sha=sha,
                               base_sha=sha, asset=text, profile=self.profile.name,
                               reason=f"measure main {sha[:7]}")

    # --- proposing -----------------------------------------------------------------------------
    def propose_while_room(self, settings: LoopSettings) -> None:
        while not self.stop_reason and self.room_for_proposal(settings):
            if not self.propose():
                return

    def room_for_proposal(self, settings: LoopSettings) -> bool:
        target = self.config.max_experiments or settings.max_experiments
        if target and len(self.store.experiments()) >= target:
            self.stop_reason = f"reached {target} experiments"
            return False
        if settings.target_val_bpb is not None:
            main_values = self.measurements(self.main_asset()[2])
            if main_values and statistics.fmean(main_values) <= settings.target_val_bpb:
                self.stop_reason = f"main reached the target val_bpb {settings.target_val_bpb}"
                return False
        if settings.paused:
            self.stop_reason = "paused in program.md"
            return False
        queued = len(self.store.runs(state="queued"))
        return self.runner.free_slots() - queued > 0

    def propose(self) -> bool:
        """Ask the agent for one experiment; True if one was recorded."""
        context = self.context()
        for _ in range(self.config.max_refusals):
            try:
                proposal = self.agent.propose(context)
            except AgentError as error:
                self.store.event(None, "agent", f"the agent stopped: {error}")
                self._agent_stop = self.stop_reason = f"the agent has nothing more to propose ({error})"
                return False
            problem = self.validate(proposal, context)
            if problem is None:
                break
            self.store.event(None, "refused", f"proposal {proposal.title!r} refused: {problem}")
            log.warning("proposal %r refused: %s", proposal.title, problem)
            context.seen_hashes.add(code_hash(proposal.train_py))
            context.feedback.append(f"(conductor) your proposal {proposal.title!r} was refused: {problem}")
        else:
            self._agent_stop = self.stop_reason = (
                f"the agent's last {self.config.max_refusals} proposals were all refused")
            return False
        exp = self.store.add_experiment(title=proposal.title, hypothesis=proposal.hypothesis,
                                        slug=proposal.slug, code_hash=code_hash(proposal.train_py),
                                        train_py=proposal.train_py, meta=proposal.meta,
                                        base_sha=context.main_sha)  # the main the agent read
        log.info("experiment %s proposed: %s", exp.id, exp.title)
        self.advance(exp)
        return True

    def validate(self, proposal: Proposal, context: ProposalContext) -> str | None:
        if not proposal.title.strip():
            return "it has no title"
        try:
            compile(proposal.train_py, ASSET, "exec")
        except SyntaxError as error:
            return f"train.py does not compile: {error.msg} (line {error.lineno})"
        digest = code_hash(proposal.train_py)
        if digest == code_hash(context.train_py):
            return "train.py is identical to main's"
        if digest in context.seen_hashes:
            earlier = self.store.experiment_by_code(digest)
            return f"it repeats experiment {earlier.id} ({earlier.title!r})" if earlier else "it repeats an earlier run"
        return None

    def context(self) -> ProposalContext:
        sha, text, code, program = self._main()
        main_values = self.measurements(code)
        done = self.store.experiments()
        history = [HistoryEntry(id=e.id, title=e.title, hypothesis=e.hypothesis,
                                status=e.status or "running", val_bpb=e.val_bpb, delta=e.delta,
                                code_hash=e.code_hash, meta=e.meta, error_tail=e.error_tail) for e in done]
        finished = [e for e in done if e.state == "done"]
        last_crash = finished[-1].error_tail if finished and finished[-1].status == "crash" else None
        return ProposalContext(program_md=program.instructions, train_py=text, main_sha=sha,
                               main_val_bpb=statistics.fmean(main_values) if main_values else None,
                               history=history, feedback=self.store.recent_feedback(), last_crash=last_crash,
                               seen_hashes=self.store.seen_code_hashes() | {code},
                               profile=self.profile.name, device_kind=self.profile.device)

    # --- the state machine -----------------------------------------------------------------------
    def advance(self, exp: Experiment) -> None:
        """Do the next step of one experiment (and the steps after it that need no waiting)."""
        while exp.state != "done":
            step = getattr(self, f"_step_{exp.state}")
            after = step(exp)
            if after is None:
                return
            exp = after

    def _step_proposed(self, exp: Experiment) -> Experiment:
        head = self.forge.create_branch(exp.branch, exp.base_sha, {ASSET: exp.train_py},
                                        f"{exp.title}\n\n{exp.hypothesis}\n\nautoresearch-experiment: {exp.id}")
        return self.store.update_experiment(exp.id, state="branched", head_sha=head,
                                            event=f"pushed {exp.branch} at {head[:7]}")

    def _step_branched(self, exp: Experiment) -> Experiment:
        self.store.add_run(experiment_id=exp.id, purpose="candidate", code_hash=exp.code_hash,
                           commit_sha=exp.head_sha or "", base_sha=exp.base_sha, asset=exp.train_py,
                           profile=self.profile.name, experiment_fields={"state": "measuring"})
        return self.store.experiment(exp.id)

    def _step_measuring(self, exp: Experiment) -> Experiment | None:
        runs = [r for r in self.store.runs(experiment_id=exp.id)
                if r.code_hash == exp.code_hash and r.base_sha == exp.base_sha and r.state != "lost"]
        if any(r.state in ("queued", "running") for r in runs):
            return None
        counted = self.counted(runs)
        if not counted:  # its runs were measured under another harness or data: measure again
            self._requeue(exp, "candidate", "no run under the current harness and data")
            return None
        crash = next((r for r in counted if r.status == "crash"), None)
        main_sha, _, main_code = self.main_asset()
        decision = decide(candidate=[r.val_bpb for r in counted if r.status == "ok"],
                          crash=(crash.error or "crashed") if crash else None,
                          main=self.measurements(main_code), sigma=self.noise_sigma(),
                          measured_on=exp.base_sha, current_main=main_sha,
                          config=JudgeConfig(**self._judge_settings()))
        if decision.action == "wait":
            return None
        if decision.action == "confirm":
            self._requeue(exp, "confirm", decision.reason)
            return None
        if decision.action == "remeasure":
            return self.store.update_experiment(exp.id, state="rebasing", event=decision.reason)
        numbers = dict(val_bpb=decision.val_bpb, delta=decision.delta, reason=decision.reason)
        if decision.action == "keep":
            return self.store.update_experiment(exp.id, state="merging", event=decision.reason, **numbers)
        status = "crash" if decision.action == "crash" else "discard"
        error_tail = _error_tail(crash) if crash else None
        return self.store.update_experiment(exp.id, state="closing", status=status, error_tail=error_tail,
                                            event=decision.reason, **numbers)

    def _step_rebasing(self, exp: Experiment) -> Experiment:
        main_sha, _, main_code = self.main_asset()
        try:
            head = self.forge.rebase_branch(exp.branch, main_sha, ASSET)
        except MergeConflict as error:
            return self.store.update_experiment(
                exp.id, state="closing", status="discard", val_bpb=None, delta=None,
                reason=f"its change to train.py conflicts with main {main_sha[:7]}: {error}", event="conflict")
        text = self.forge.read_file(head, ASSET)
        if code_hash(text) == main_code:
            return self.store.update_experiment(exp.id, state="closing", status="discard", val_bpb=None,
                                                delta=None, reason="main already holds this change",
                                                event="already in main")
        self.store.add_run(experiment_id=exp.id, purpose="remeasure", code_hash=code_hash(text), commit_sha=head,
                           base_sha=main_sha, asset=text, profile=self.profile.name,
                           reason=f"rebased onto main {main_sha[:7]}",
                           experiment_fields={"state": "measuring", "base_sha": main_sha, "head_sha": head,
                                              "train_py": text, "code_hash": code_hash(text)})
        return self.store.experiment(exp.id)

    def _step_merging(self, exp: Experiment) -> Experiment:
        message = (f"{exp.title} (val_bpb {exp.val_bpb:.6f}, {exp.delta:+.6f})\n\n{exp.hypothesis}\n\n"
                   f"{exp.reason}\n\nautoresearch-experiment: {exp.id}\nautoresearch-val-bpb: {exp.val_bpb:.6f}")
        try:
            merged = self.forge.merge(exp.branch, exp.base_sha, message)
        except MainMoved as error:
            return self.store.update_experiment(exp.id, state="rebasing", event=f"main moved before the merge: {error}")
        return self.store.update_experiment(exp.id, state="closing", status="keep", merged_sha=merged,
                                            event=f"merged into main as {merged[:7]}")

    def _step_closing(self, exp: Experiment) -> Experiment:
        self.forge.close(exp.branch, exp.status or "discard")
        exp = self.store.update_experiment(exp.id, state="done", event=f"{exp.status}: {exp.reason}")
        log.info("experiment %s %s: %s", exp.id, exp.status, exp.reason)
        results.export_tsv(self.store, self.results_tsv)
        return exp

    def _requeue(self, exp: Experiment, purpose: str, reason: str) -> None:
        """Queue one more run of the experiment as it stands (its state stays measuring)."""
        self.store.add_run(experiment_id=exp.id, purpose=purpose, code_hash=exp.code_hash,
                           commit_sha=exp.head_sha or "", base_sha=exp.base_sha, asset=exp.train_py,
                           profile=self.profile.name, reason=reason)

    def _judge_settings(self) -> dict[str, Any]:
        settings = self.program().settings
        return dict(noise_sigmas=settings.noise_sigmas, min_margin=settings.min_margin, confirm=settings.confirm)

    # --- runs ------------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Start queued runs on free slots: baselines first, then re-measures, confirmations, candidates."""
        queued = sorted(self.store.runs(state="queued"), key=lambda r: (RUN_PRIORITY[r.purpose], r.id))
        for run in queued[: max(0, self.runner.free_slots())]:
            self.store.mark_run_started(run.id, self.runner.handle(run.id))
            self.runner.start(Job(run_id=run.id, asset=run.asset, profile=run.profile, seed=run.seed,
                                  commit=run.commit_sha))
            log.info("run %s (%s) started", run.id, run.purpose)

    def collect(self) -> None:
        for result in self.runner.poll():
            run = self.store.finish_run(result.run_id, status=result.status, val_bpb=result.val_bpb,
                                        metrics=result.metrics, error=result.error, log_tail=result.log_tail)
            log.info("run %s finished: %s %s", run.id, run.status,
                     f"val_bpb {run.val_bpb:.6f}" if run.val_bpb is not None else (run.error or ""))
            if run.experiment_id is not None:
                self.advance(self.store.experiment(run.experiment_id))

    # --- reporting -------------------------------------------------------------------------------
    def in_flight(self) -> list[dict[str, Any]]:
        """The runs now running, with their latest progress, for a live display."""
        rows = []
        for run in self.store.runs(state="running"):
            exp = self.store.experiment(run.experiment_id) if run.experiment_id else None
            rows.append({"run": run.id, "purpose": run.purpose, "experiment": exp.id if exp else None,
                         "title": exp.title if exp else "baseline of main",
                         "progress": self.runner.progress(run.id) or {}})
        return rows

    def summary(self) -> Summary:
        done = self.store.experiments(active=False)
        baseline = results.baseline_val_bpb(self.store)
        main_values = self.measurements(self.main_asset()[2])
        kept = [e for e in done if e.status == "keep" and e.val_bpb is not None]
        best = statistics.fmean(main_values) if main_values else (kept[-1].val_bpb if kept else baseline)
        return Summary(experiments=len(done), kept=sum(e.status == "keep" for e in done),
                       discarded=sum(e.status == "discard" for e in done),
                       crashed=sum(e.status == "crash" for e in done), baseline_val_bpb=baseline,
                       best_val_bpb=best,
                       results_tsv=self.results_tsv, stop_reason=self.stop_reason)


def _error_tail(run: Run, lines: int = 20) -> str:
    text = (run.error or "").strip() or (run.log_tail or "").strip()
    return "\n".join(text.splitlines()[-lines:])
