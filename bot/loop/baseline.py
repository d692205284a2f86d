"""Main as the loop sees it: read once per tick, measured by its own baseline runs, blocked when it
cannot be measured.

`read()` asks the forge for main's sha and, for a sha not seen last time, reads its train.py and
program.md (the agent's instructions and the loop's settings; an invalid front matter keeps the
last valid settings). What it read stays as `main`, so the live display and the snapshot show it
without reading git again.

Main's val_bpb is the mean of main's own baseline runs (the rules are bot.loop.measurement's): the
first main is measured `first_baseline_runs` times, every later main (after a keep)
`baseline_runs` times afresh; a kept experiment's runs were selected for coming out low, so they
feed the noise but never main's value. A run of main set aside as an outlier, or grown old once
main's runs drift (measurement.main_runs), no longer counts, so `schedule()`, which queues the runs
main still needs, measures main again; what it noticed is recorded as an event ("outlier",
"drift"), once per main and process. The values and what is computed from them (the pooled
noise, each main's runs, each experiment's differences from main under the same seeds and the
paired noise they pool to) are read once per change: after a run finished. A train.py on
main that crashes (or is rejected) MAX_BASELINE_CRASHES times in a row, or whose runs cannot be
measured at all, blocks the loop until a human commits a new one. Once a kept experiment's new
main has its fresh baseline, the experiment gets its re-measured delta (the unselected one to quote).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from bot.core.protocols import Forge
from bot.core.records import code_hash, full_budget
from bot.core.states import RunState, State, Status
from bot.loop import measurement, pairing
from bot.loop.judge import Noise, main_runs_wanted
from bot.loop.program import LoopSettings, SettingsError, loop_task, parse_program
from bot.store import Experiment, Run, Store
from bot.store.runs import ahead_of, is_ahead

log = logging.getLogger(__name__)

PROGRAM = "program.md"
MAX_BASELINE_CRASHES = 2  # crashes of main's own train.py before the loop asks for a human


@dataclass(frozen=True)
class Main:
    """Main as read once per tick."""

    sha: str
    asset: str  # train.py's text
    code_hash: str  # of asset
    instructions: str  # program.md without its front matter
    settings: LoopSettings


class Baseline:
    def __init__(self, store: Store, forge: Forge, *, identity: dict[str, str], profile: str) -> None:
        self.store = store
        self.forge = forge
        self.identity = identity  # the pinned measurement identity: only runs under it count
        self.task = loop_task(identity)  # what main holds and the loop measures: train.py, or another task's asset
        self.profile = profile
        self.main: Main | None = None  # main as last read: read() reads its files again only for a new sha
        self.blocked = ""  # why main cannot be measured ('' while it can): a human must fix main
        self._blocked_code_hash = ""  # of main's train.py when blocked: a new train.py lifts the block
        # commit sha -> code_hash of its train.py: every tick compares experiments' bases with main,
        # and a commit never changes
        self._code_at: dict[str, str] = {}
        # the values that count, read again only after a run finished, so an idle tick reads no history;
        # what is computed from them (the pooled noise, each main's values) is kept beside them until then
        self._values: list[tuple[str, int | None, str, float]] | None = None
        self._seeded: list[tuple[int, str, str | None]] = []  # (seed, base_sha, params_fingerprint) beside each value
        self._noise: tuple[Noise | None] | None = None  # a 1-tuple once computed: None is a valid answer
        self._main_runs: dict[str, measurement.MainRuns] = {}
        self._pairs: dict[pairing.Side, pairing.Paired] | None = None
        self._paired_pool: pairing.PairedPool | None = None
        self._noted: set[tuple[str, str]] = set()  # (code_hash, what was noticed) already recorded as an event

    # --- main ------------------------------------------------------------------------------------
    def read(self) -> Main:
        """Main now: its sha from the forge, its files only when the sha is new."""
        sha = self.forge.main_sha()
        if self.main is None or self.main.sha != sha:
            text = self.forge.read_file(sha, self.task.asset)
            try:
                program_md = self.forge.read_file(sha, PROGRAM)
            except FileNotFoundError:
                program_md = ""
            instructions, settings = self._program(sha, program_md)
            self.main = Main(sha, text, code_hash(text), instructions, settings)
            self._code_at[sha] = self.main.code_hash
        return self.main

    def _program(self, sha: str, text: str) -> tuple[str, LoopSettings]:
        """program.md's instructions and settings; an invalid front matter keeps the last valid
        settings (stored, so a restart keeps them too) and records the error once per commit."""
        try:
            program = parse_program(text, task=self.task.name)
        except SettingsError as error:
            kept = self.store.state.program_settings
            settings = LoopSettings.model_validate_json(kept) if kept else LoopSettings()
            which = "the last valid settings stay" if kept else "the default settings are"
            self.store.events.add(
                None,
                "settings_error",
                f"program.md on main {sha[:7]} is invalid, so {which} in force until it is fixed: {error}",
            )
            log.error("program.md on main %s: %s", sha[:7], error)
            return text, settings
        self.store.state.program_settings = program.settings.model_dump_json()
        return program.instructions, program.settings

    def code_at(self, sha: str) -> str:
        """The code_hash of train.py at commit `sha`."""
        if sha not in self._code_at:
            self._code_at[sha] = code_hash(self.forge.read_file(sha, self.task.asset))
        return self._code_at[sha]

    # --- what the runs measured ------------------------------------------------------------------
    def values(self) -> list[tuple[str, int | None, str, float]]:
        """(code_hash, experiment, purpose, val_bpb) of every full run that counts, in run order: those
        measurement.counted would pick, selected by the store's query (a screening's short runs never
        count here: bot.loop.screening)."""
        if self._values is None:
            ident = self.identity
            runs = self.store.runs.measured_runs(
                profile=ident["profile"],
                harness_hash=ident["harness_hash"],
                data_fingerprint=ident["data_fingerprint"],
                threads=measurement.pinned_threads(ident),
            )
            runs = [run for run in runs if full_budget(run[2])]  # short runs: bot.loop.screening's alone
            self._values = [run[:4] for run in runs]
            self._seeded = [run[4:] for run in runs]
        return self._values

    def run_finished(self) -> None:
        """A run's result was recorded: the values, and what is computed from them, are read again
        when next asked for."""
        self._values = None
        self._noise = None
        self._main_runs = {}
        self._pairs = None
        self._paired_pool = None

    def main_runs(self, code_hash: str) -> measurement.MainRuns:
        """Main's own runs for the train.py whose hash is `code_hash` as the judge reads them
        (measurement.main_runs: an outlier set aside, only recent runs once main drifts)."""
        if code_hash not in self._main_runs:
            self._main_runs[code_hash] = measurement.main_runs(self.values(), code_hash, self.noise())
        return self._main_runs[code_hash]

    def main_values(self, code_hash: str) -> list[float]:
        """Main's val_bpb values for the train.py whose hash is `code_hash`: its own baseline runs only."""
        return list(self.main_runs(code_hash).values)

    def noise(self) -> Noise | None:
        """The pooled run-to-run noise (measurement.noise), computed once per change of the values."""
        if self._noise is None:
            self._noise = (measurement.noise(self.values()),)
        return self._noise[0]

    def _paired(self) -> dict[pairing.Side, pairing.Paired]:
        """Each experiment's runs minus main's under the same seeds, by (experiment, code_hash)
        (pairing.paired_differences), computed once per change of the values."""
        if self._pairs is None:
            values, seeded = self.values(), self._seeded
            mains = {sha: v[0] for v, (_, sha, _) in zip(values, seeded, strict=True) if v[2] == "baseline"}
            for (_, experiment, _, _), (_, sha, params) in zip(values, seeded, strict=True):
                pairable = params is not None or self.task.seed_pairs
                if experiment is not None and pairable and sha not in mains and not is_ahead(sha):
                    mains[sha] = self.code_at(sha)  # main moved without a new train.py: no baseline run there
            self._pairs = pairing.paired_differences(
                values, seeded, mains, self.main_runs, seed_pairs=self.task.seed_pairs
            )
        return self._pairs

    def pairs_of(self, experiment: int, code_hash: str) -> pairing.Pairs | None:
        """What the judge's paired rule reads of the experiment's runs of the train.py whose hash is
        `code_hash`: its differences from main under the same seeds and the paired noise pooled with
        and without them (`paired_pool`); None when no run of it pairs with main's."""
        paired = self._paired().get((experiment, code_hash))
        if paired is None:
            return None
        pool = self.paired_pool()
        return pairing.Pairs(paired.differences, pool.noise(), pool.noise(without=(experiment, code_hash)))

    def paired_pool(self) -> pairing.PairedPool:
        """The paired noise's pool over every experiment's differences from main (pairing.paired_pool),
        computed once per change of the values."""
        if self._paired_pool is None:
            self._paired_pool = pairing.paired_pool(self._paired())
        return self._paired_pool

    # --- main's own runs -------------------------------------------------------------------------
    def schedule(self, main: Main) -> None:
        """Queue the baseline runs main still needs, or block the loop when main keeps crashing."""
        if self.blocked:
            if self._blocked_code_hash == main.code_hash:
                return  # main needs a human; a new train.py on main clears it
            self.blocked = ""
        runs = [r for r in self.store.runs.all(code_hash=main.code_hash) if r.purpose == "baseline"]
        ahead = [r.id for r in runs if r.base_sha == ahead_of(main.code_hash)]
        if ahead:  # queued while the keep that made this main was being merged: main's runs now
            self.store.runs.adopt(ahead, main.sha)
            self.run_finished()  # the values carry each run's base (pairing reads it)
            runs = [r for r in self.store.runs.all(code_hash=main.code_hash) if r.purpose == "baseline"]
        crashed = []  # main's crashes (or rejections) since its last good run: one may be bad luck (an OOM, a NaN)
        for run in (r for r in runs if r.state == RunState.DONE):
            crashed = crashed + [run] if run.status in ("crash", "rejected") else []
        if len(crashed) >= MAX_BASELINE_CRASHES:
            self.block(
                main,
                f"{self.task.asset} on main ({main.sha[:7]}) {_failed_how(crashed)} in {len(crashed)} baseline "
                "runs in a row, "
                f"so nothing can be judged against it. Commit a fixed {self.task.asset} to main in the research "
                "repository (a new main gets a new baseline), then run the same command again. The last "
                f"run said:\n{crashed[-1].error}",
            )
            return
        pending = [r for r in runs if r.state in (RunState.QUEUED, RunState.RUNNING)]
        own = self.main_runs(main.code_hash)
        self._note(main, own)
        reason = f"measure main {main.sha[:7]}" + (" afresh: its runs drift" if own.drift else "")
        for _ in range(max(0, self.runs_wanted(main) - len(own.values) - len(pending))):
            self.queue_run(main, reason)

    def queue_ahead(self, kept: Experiment, main: Main) -> None:
        """Queue the fresh runs the kept experiment's train.py will want as main, now, while its merge
        is made (a push and a fast-forward, and in full mode on GitHub a wait for its pull request):
        the slots the keep frees start them at once (bot.loop.runs.dispatch), where they waited for
        the merge before. Their base is bot.store.runs.ahead_of that train.py until main takes the
        commit (`schedule` adopts them); a merge that fails sets them aside (Runs.cancel_ahead)."""
        future = Main(
            kept.head_sha or ahead_of(kept.code_hash), kept.asset, kept.code_hash, main.instructions, main.settings
        )
        pending = [
            r
            for r in self.store.runs.all(code_hash=kept.code_hash)
            if r.purpose == "baseline" and r.state in (RunState.QUEUED, RunState.RUNNING)
        ]
        reason = f"measure experiment {kept.id}'s {self.task.asset} afresh, main once it is merged"
        for _ in range(max(0, self.runs_wanted(future) - len(self.main_runs(kept.code_hash).values) - len(pending))):
            self.store.runs.add(
                experiment_id=None,
                purpose="baseline",
                code_hash=kept.code_hash,
                commit_sha=kept.head_sha or "",  # a runner that checks out the commit has the branch's
                base_sha=ahead_of(kept.code_hash),
                asset=kept.asset,
                profile=self.profile,
                reason=reason,
            )

    def runs_wanted(self, main: Main) -> int:
        """How many values main needs before experiments are judged against it (judge.main_runs_wanted):
        the first main's count while the noise rests on it alone, baseline_runs once other code has
        been measured or once main drifts (then the noise is known, and only a fresh mean is needed)."""
        return main_runs_wanted(
            measurement.is_first_main(self.values(), main.code_hash) and self.main_runs(main.code_hash).drift is None,
            main.settings.first_baseline_runs,
            main.settings.baseline_runs,
        )

    def _note(self, main: Main, own: measurement.MainRuns) -> None:
        """Record, once per main, what its runs showed: a run set aside as an outlier, a drift."""
        metric = self.task.metric  # the events name it and show its values and changes (Metric.value, format_change)
        if own.outlier is not None and (main.code_hash, f"outlier {own.outlier!r}") not in self._noted:
            self._noted.add((main.code_hash, f"outlier {own.outlier!r}"))
            self.store.events.add(
                None,
                "outlier",
                f"a run of main {main.sha[:7]} measured {metric.name} {metric.value(own.outlier):.6f}, worse than "
                "main's other runs by more than the noise allows: it is left out of main's value and main is "
                "measured once more",
            )
        if own.drift is not None and (main.code_hash, "drift") not in self._noted:
            self._noted.add((main.code_hash, "drift"))
            self.store.events.add(
                None,
                "drift",
                f"main {main.sha[:7]}'s measurement moves with time: its {own.drift.runs} runs drift by "
                f"{metric.format_change(100 * own.drift.slope, 6)} {metric.name} per 100 runs of the loop "
                f"(t = {own.drift.t if metric.lower_is_better else -own.drift.t:+.1f}), more than the noise explains. It is judged against its runs among the loop's last {measurement.RECENT_RUNS} "
                "and measured afresh when they grow older",
            )

    def queue_run(self, main: Main, reason: str, *, seed: int | None = None) -> None:
        """Queue one more run of main's own train.py, under `seed` when given (the seed an experiment's
        next run takes, to pair with it), else under a seed main's train.py has not run under."""
        self.store.runs.add(
            experiment_id=None,
            purpose="baseline",
            code_hash=main.code_hash,
            commit_sha=main.sha,
            base_sha=main.sha,
            asset=main.asset,
            profile=self.profile,
            seed=seed,
            reason=reason,
        )

    def block(self, main: Main, message: str) -> None:
        """Nothing can be judged until a human fixes main: say so once."""
        self._blocked_code_hash = main.code_hash
        if self.blocked != message:
            self.blocked = message
            self.store.events.add(None, "blocked", message)
            log.error("%s", message)

    def note_remeasured_delta(self, code_hash: str, main: Main) -> None:
        """Once a kept experiment's new main (the train.py whose hash is `code_hash`) has its fresh baseline, record the
        unselected delta: that baseline against the old main's."""
        values = self.main_values(code_hash)
        if len(values) < main.settings.baseline_runs:
            return
        for exp in self.store.experiments.in_state(State.DONE):
            if exp.status == Status.KEEP and exp.code_hash == code_hash and exp.remeasured_delta is None:
                old = self.main_values(exp.meta.get("main_code", ""))
                if old:
                    delta = statistics.fmean(values) - statistics.fmean(old)
                    self.store.experiments.update(
                        exp.id,
                        remeasured_delta=delta,
                        event=f"re-measured: the new main's fresh baseline is {self.task.metric.format_change(delta, 6)} "
                        f"against the old main's ({len(values)} run(s))",
                    )


def _failed_how(runs: list[Run]) -> str:
    """How main's runs `runs` ended without a number, in words: crashed, was rejected, or both."""
    said = {"crash": "crashed", "rejected": "was rejected"}
    return " or ".join(dict.fromkeys(said[r.status or "crash"] for r in runs))
