"""When an experiment gets its branch (bot.loop.branching, its policy bot.core.protocols.BranchPolicy): a
proposal whose policy can wait runs from the asset its job carries, is re-grafted onto a newer
main in memory, and is pushed when the policy wants it; a keep is always pushed before main takes
it. The real local forge, counting its calls; a fake runner whose jobs end when the test says; no
training."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, result_for, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import ForgeError
from bot.core.records import Proposal, RunStatus
from bot.forge.local import LocalForge, init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.forge_calls import ForgeWorker
from bot.store import Store

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"


class CountingForge(LocalForge):
    """The local forge, with the branch writes it was asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.created: list[tuple[str, str]] = []  # (branch, base)
        self.rebased: list[str] = []
        self.closed: list[str] = []

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        if branch.startswith("autoresearch/"):  # not the test's own commits to main
            self.created.append((branch, base_sha))
        return super().create_branch(branch, base_sha, files, message)

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        self.rebased.append(branch)
        return super().rebase_branch(branch, onto_sha, path)

    def close(self, branch: str, label: str) -> None:
        self.closed.append(branch)
        super().close(branch, label)


class Policy:
    """A branch policy the test sets: pushed once started (`when="started"`, GitHub in full mode with
    a runner that carries the asset) or only when promising (`when="promising"`, the degraded mode)."""

    def __init__(self, when: str) -> None:
        self.when = when
        self.asked: list[tuple[int, bool, bool]] = []

    def wanted(self, experiment_id: int, *, started: bool, promising: bool) -> bool:
        self.asked.append((experiment_id, started, promising))
        return promising or (self.when == "started" and started)


def make(
    tmp_path: Path,
    proposals: list[Proposal],
    policy: Policy,
    runner: FakeRunner,
    worker: ForgeWorker | None = None,
    **settings: object,
) -> Conductor:
    front = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in settings.items())
    program = PROGRAM.replace("---\n\n", f"{front}\n---\n\n") if settings else PROGRAM
    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": program})
    return Conductor(
        Store(tmp_path / "state.db"),
        CountingForge(tmp_path / "repo"),
        runner,
        ScriptedAgent(proposals),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=len(proposals), retry_base_s=0.0),
        branches=policy,
        forge_worker=worker,
    )


def tick_until(loop: Conductor, done, *, ticks: int = 400) -> None:
    for _ in range(ticks):
        loop.tick()
        if done():
            return
        time.sleep(0.002)
    raise AssertionError("the condition was never reached")


def proposal(effect: float, title: str, base: str = MAIN) -> Proposal:
    return Proposal(title, f"hypothesis of {title}", with_effect(base, effect, title))


def commit_to_main(forge: LocalForge, files: dict[str, str]) -> str:
    old = forge.main_sha()
    forge.create_branch("human", old, files, "a human commit")
    return forge.merge("human", old, "a human commit")


def until_the_second_waits(loop: Conductor, runner: FakeRunner) -> None:
    """Main's runs end until the first proposal's run holds the one slot and the second's is queued."""

    def second_waits() -> bool:
        for run in loop.store.runs.all(state="running"):
            if run.purpose == "baseline":
                runner.finish(run.id)
        runs = loop.store.runs.all()
        return any(r.purpose == "candidate" and r.state == "queued" for r in runs) and any(
            r.purpose == "candidate" and r.state == "running" for r in runs
        )

    tick_until(loop, second_waits)


def finish_all(loop: Conductor, runner: FakeRunner) -> None:
    runner.auto = True
    for run_id in runner.running():
        runner.finish(run_id)
    tick_until(loop, loop.finished)


def test_a_proposal_runs_from_its_job_and_is_pushed_once_its_run_starts(tmp_path: Path) -> None:
    runner = FakeRunner(auto=False)
    loop = make(tmp_path, [proposal(-0.1, "better")], Policy("started"), runner)
    forge: CountingForge = loop.forge  # type: ignore[assignment]

    def candidate_queued() -> bool:
        for run in loop.store.runs.all(state="running"):  # main's baselines end
            if run.purpose == "baseline":
                runner.finish(run.id)
        return any(r.purpose == "candidate" for r in loop.store.runs.all())

    tick_until(loop, candidate_queued)
    [exp] = loop.store.experiments.all()
    assert exp.head_sha is None and forge.created == [] and forge.branch_head(exp.branch) is None

    tick_until(loop, lambda: loop.store.experiments.all()[0].head_sha is not None)
    [exp] = loop.store.experiments.all()
    [candidate] = [r for r in loop.store.runs.all() if r.purpose == "candidate"]
    assert candidate.state == "running" and runner.jobs[candidate.id].commit == ""  # the job carried the asset
    assert forge.created == [(exp.branch, exp.base_sha)]
    assert forge.read_file(exp.head_sha, "train.py") == exp.asset == runner.jobs[candidate.id].asset

    finish_all(loop, runner)
    [exp] = loop.store.experiments.all()
    assert exp.status == "keep" and forge.main_sha() == exp.merged_sha
    assert forge.read_file(exp.merged_sha, "train.py") == exp.asset and len(forge.created) == 1


def test_a_proposal_overtaken_before_it_ran_is_regrafted_without_a_forge_call(tmp_path: Path) -> None:
    runner = FakeRunner(auto=False)  # one slot: the second proposal waits behind the first's run
    loop = make(tmp_path, [proposal(+0.1, "worse"), proposal(-0.1, "better")], Policy("started"), runner)
    forge: CountingForge = loop.forge  # type: ignore[assignment]

    until_the_second_waits(loop, runner)
    old_main = forge.main_sha()
    human = MAIN.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.45")  # a line apart from the change
    moved_to = commit_to_main(forge, {"train.py": human})
    finish_all(loop, runner)

    worse, better = loop.store.experiments.all()
    assert worse.status == "discard" and "has moved on since" in worse.reason  # judged where it ran
    runs = loop.store.runs.all(experiment_id=better.id)
    assert [(r.purpose, r.state) for r in runs] == [("candidate", "cancelled"), ("remeasure", "done")]
    said = " ".join(e["message"] for e in loop.store.events.all(better.id))
    assert f"re-grafted onto main {moved_to[:7]}" in said and "WARMDOWN_RATIO = 0.45" in runs[1].asset
    assert forge.rebased == []  # nothing was rebased: each branch was pushed where its run ran
    assert forge.created == [(worse.branch, old_main), (better.branch, moved_to)]
    assert better.status == "keep" and forge.read_file(better.merged_sha, "train.py") == runs[1].asset


def test_a_conflict_found_in_memory_discards_it_and_pushes_nothing(tmp_path: Path) -> None:
    runner = FakeRunner(auto=False)
    changed = with_effect(MAIN.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.05"), -0.1, "lr")
    loop = make(tmp_path, [proposal(+0.1, "worse"), Proposal("lr", "h", changed)], Policy("started"), runner)
    forge: CountingForge = loop.forge  # type: ignore[assignment]
    until_the_second_waits(loop, runner)
    commit_to_main(forge, {"train.py": MAIN.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.03")})
    finish_all(loop, runner)

    worse, exp = loop.store.experiments.all()
    assert exp.status == "discard" and "conflicts with main" in exp.reason
    assert exp.head_sha is None and forge.branch_head(exp.branch) is None
    assert forge.created == [(worse.branch, worse.base_sha)] and forge.closed == [worse.branch]


def test_degraded_a_discard_gets_no_branch_and_a_keep_gets_one_before_main_takes_it(tmp_path: Path) -> None:
    policy = Policy("promising")
    loop = make(tmp_path, [proposal(+0.1, "worse"), proposal(-0.1, "better")], policy, FakeRunner())
    forge: CountingForge = loop.forge  # type: ignore[assignment]
    tick_until(loop, loop.finished)

    worse, better = loop.store.experiments.all()
    assert worse.status == "discard" and worse.head_sha is None and forge.branch_head(worse.branch) is None
    assert better.status == "keep" and forge.main_sha() == better.merged_sha and better.head_sha
    assert forge.read_file(better.merged_sha, "train.py") == forge.read_file(better.head_sha, "train.py")
    assert forge.created == [(better.branch, better.base_sha)] and forge.closed == [better.branch]
    jobs = [job for job in loop.runner.jobs.values() if job.experiment_id]  # main's runs carry main's commit
    assert jobs and all(job.commit == "" for job in jobs)
    assert (worse.id, True, False) in policy.asked  # asked once it ran: the policy said no


def test_degraded_a_promising_experiment_is_pushed_when_its_confirmation_is_asked_for(tmp_path: Path) -> None:
    # main: 2.000, 2.010, 1.990; one candidate run 0.025 better: the judge asks to confirm it
    values = {1: 2.000, 2: 2.010, 3: 1.990, 4: 1.975}
    runner = FakeRunner(
        auto=False,
        outcome=lambda job: result_for(job, **({"val_bpb": values[job.run_id]} if job.run_id in values else {})),
    )
    loop = make(tmp_path, [proposal(-0.025, "borderline")], Policy("promising"), runner, first_baseline_runs=3)
    forge: CountingForge = loop.forge  # type: ignore[assignment]

    def confirmation_queued() -> bool:
        for run_id in runner.running():
            if run_id in values:
                runner.finish(run_id)
        return any(r.purpose == "confirm" for r in loop.store.runs.all())

    tick_until(loop, confirmation_queued)
    tick_until(loop, lambda: loop.store.experiments.all()[0].head_sha is not None)
    [exp] = loop.store.experiments.all()
    assert exp.state == "measuring" and forge.created == [(exp.branch, exp.base_sha)]
    assert forge.read_file(exp.head_sha, "train.py") == exp.asset


def test_a_keep_without_a_branch_is_pushed_on_the_conductors_thread_not_queued_behind_other_writes(
    tmp_path: Path,
) -> None:
    workers: list[CountingForge] = []

    def worker_forge() -> CountingForge:
        workers.append(CountingForge(tmp_path / "repo"))
        return workers[-1]

    worker = ForgeWorker(worker_forge)
    loop = make(tmp_path, [proposal(-0.1, "better")], Policy("promising"), FakeRunner(), worker)
    loop.wake_on(lambda: None)
    try:
        tick_until(loop, loop.finished)
    finally:
        worker.close(5.0)
    [better] = loop.store.experiments.all()
    forge: CountingForge = loop.forge  # type: ignore[assignment]
    assert better.status == "keep" and forge.created == [(better.branch, better.base_sha)]
    assert all(w.created == [] for w in workers)  # every slot waits for a keep's merge: no round trip


def test_in_full_mode_every_experiment_that_ran_ends_with_its_branch(tmp_path: Path) -> None:
    # each run ends at its first look: some end before the tick after their start could push them
    loop = make(
        tmp_path,
        [proposal(+0.1, f"worse {i}") for i in range(4)] + [proposal(-0.1, "better")],
        Policy("started"),
        FakeRunner(slots=2),
    )
    tick_until(loop, loop.finished)
    forge: CountingForge = loop.forge  # type: ignore[assignment]
    exps = loop.store.experiments.all()
    assert [e.status for e in exps] == ["discard"] * 4 + ["keep"]
    assert all(e.head_sha and forge.branch_head(e.branch) == e.head_sha for e in exps[:4])
    assert sorted(forge.closed) == sorted(e.branch for e in exps)


def test_a_failing_push_of_a_branch_people_read_never_costs_the_experiment_its_verdict(tmp_path: Path) -> None:
    class NoPushes(CountingForge):
        def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
            if branch.startswith("autoresearch/"):
                raise ForgeError("GitHub 502")
            return super().create_branch(branch, base_sha, files, message)

    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    loop = Conductor(
        Store(tmp_path / "state.db"),
        NoPushes(tmp_path / "repo"),
        FakeRunner(),
        ScriptedAgent([proposal(+0.1, "worse")]),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=1, retry_base_s=0.0),
        branches=Policy("started"),
    )
    tick_until(loop, loop.finished)
    [exp] = loop.store.experiments.all()
    assert exp.status == "discard" and "is worse than main" in (exp.reason or "")  # the judge's verdict
    assert exp.head_sha is None and exp.failures == 0


def test_main_moving_only_program_md_under_a_waiting_proposal_moves_its_base_alone(tmp_path: Path) -> None:
    runner = FakeRunner(auto=False)
    loop = make(tmp_path, [proposal(+0.1, "worse"), proposal(-0.1, "better")], Policy("started"), runner)
    forge: CountingForge = loop.forge  # type: ignore[assignment]
    until_the_second_waits(loop, runner)
    moved_to = commit_to_main(forge, {"program.md": PROGRAM + "\nA human note.\n"})
    finish_all(loop, runner)
    worse, better = loop.store.experiments.all()
    said = " ".join(e["message"] for e in loop.store.events.all(better.id))
    assert f"followed main to {moved_to[:7]}" in said and forge.rebased == [worse.branch]  # worse had run
    assert (better.branch, moved_to) in forge.created and better.status == "keep"


def test_a_run_queued_before_its_branch_was_pushed_carries_the_commit_once_there_is_one(tmp_path: Path) -> None:
    class LosesTheFirstCandidate(FakeRunner):
        looked: dict[int, int] = {}

        def lookup(self, run_id: int):
            job = self.jobs.get(run_id)
            if job is not None and job.experiment_id and not self.lost:
                self.looked[run_id] = self.looked.get(run_id, 0) + 1
                if self.looked[run_id] == 2:  # a tick after it started (its branch pushed): preempted
                    self.lost.add(run_id)
                return super().lookup(run_id) if run_id in self.lost else RunStatus("running")
            return super().lookup(run_id)

    runner = LosesTheFirstCandidate()
    loop = make(tmp_path, [proposal(+0.1, "worse")], Policy("started"), runner)
    tick_until(loop, loop.finished)
    [exp] = loop.store.experiments.all()
    first, again = [job for job in runner.jobs.values() if job.experiment_id]
    assert first.commit == "" and again.commit == exp.head_sha  # the re-run went out after the push


def test_a_push_in_flight_is_recorded_even_if_the_policy_has_turned_to_no_by_then(tmp_path: Path) -> None:
    gate = threading.Event()

    class GatedForge(CountingForge):
        def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
            if branch.startswith("autoresearch/"):
                gate.wait(10)
            return super().create_branch(branch, base_sha, files, message)

    worker = ForgeWorker(lambda: GatedForge(tmp_path / "repo"))
    runner, policy = FakeRunner(auto=False), Policy("started")
    loop = make(tmp_path, [proposal(+0.1, "worse")], policy, runner, worker)
    loop.wake_on(lambda: None)
    try:

        def push_asked() -> bool:
            for run in loop.store.runs.all(state="running"):
                if run.purpose == "baseline":
                    runner.finish(run.id)
            return worker.holds(("branch", 1))

        tick_until(loop, push_asked)  # its run started: its push is on the worker, held at the gate
        policy.when = "never"  # the degraded mode, say, from here on
        gate.set()
        tick_until(loop, lambda: loop.store.experiments.get(1).head_sha is not None)
    finally:
        gate.set()
        worker.close(5.0)
    exp = loop.store.experiments.get(1)
    assert loop.forge.branch_head(exp.branch) == exp.head_sha  # made on GitHub, and recorded: no orphan
