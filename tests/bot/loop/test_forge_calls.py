"""The forge's branch and rebase writes off the conductor's thread (bot.loop.forge_calls): a call is
PENDING until the worker's own forge made it, then its result (or its exception) once; one at a
time; a call asked again with other inputs takes a queued one's place, or waits for the one being
made and drops its result. Then
the whole loop with the worker on the real local forge: branches, a keep, a rebase, all made on the
worker's thread. No test waits on a clock: each waits for the worker to say it is done."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import ForgeError
from bot.core.records import Proposal
from bot.forge.local import LocalForge, init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.forge_calls import PENDING, ForgeWorker, InlineCalls
from bot.store import Store


class Gate:
    """A forge whose `create_branch` waits until the test opens it; records which threads called."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()  # a call is being made
        self.threads: list[str] = []
        self.made: list[str] = []  # branch@base, in the order the calls were made
        self.at_once = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        with self._lock:
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        self.threads.append(threading.current_thread().name)
        self.made.append(f"{branch}@{base_sha}")
        self.entered.set()
        try:
            self.open.wait(10)
            if branch == "bad":
                raise ForgeError("no such base")
            return f"sha-of-{branch}-on-{base_sha}"
        finally:
            with self._lock:
                self.at_once -= 1


class Ended:
    """Counts the worker's calls that ended; `wait(n)` until n have."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait(self, n: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= n, 10), f"{self.count} of {n} calls ended"


def branch(name: str, base: str = "b1"):
    return lambda forge: forge.create_branch(name, base, {}, "m")


def worker() -> tuple[ForgeWorker, Gate, Ended]:
    gate, ended = Gate(), Ended()
    made: list[Gate] = []
    w = ForgeWorker(lambda: made.append(gate) or gate)
    w.on_done(ended)
    return w, gate, ended


def test_a_call_is_pending_until_the_workers_own_forge_made_it_then_its_result_once() -> None:
    w, gate, ended = worker()
    assert w.call(("branch", 1, "b1"), branch("x")) is PENDING
    assert w.call(("branch", 1, "b1"), branch("x")) is PENDING  # asked again: not made twice
    gate.open.set()
    ended.wait(1)
    assert w.call(("branch", 1, "b1"), branch("x")) == "sha-of-x-on-b1"
    assert gate.threads == ["forge"]  # on the worker's thread, once
    assert w.call(("branch", 1, "b1"), branch("x")) is PENDING  # taken: a new ask is a new call
    ended.wait(2)
    w.close(5)


def test_a_calls_exception_is_raised_where_its_result_is_taken() -> None:
    w, gate, ended = worker()
    gate.open.set()
    assert w.call(("branch", 2, "b1"), branch("bad")) is PENDING
    ended.wait(1)
    with pytest.raises(ForgeError, match="no such base"):
        w.call(("branch", 2, "b1"), branch("bad"))
    w.close(5)


def test_calls_are_made_one_at_a_time() -> None:
    w, gate, ended = worker()
    for exp_id in range(1, 6):
        assert w.call(("branch", exp_id, "b1"), branch(f"e{exp_id}")) is PENDING
    assert w.busy() == 5
    gate.open.set()
    ended.wait(5)
    assert gate.most_at_once == 1 and len(gate.threads) == 5
    assert [w.call(("branch", i, "b1"), branch(f"e{i}")) for i in range(1, 6)] == [
        f"sha-of-e{i}-on-b1" for i in range(1, 6)
    ]
    w.close(5)


def test_a_call_asked_with_other_inputs_waits_for_the_one_being_made_and_drops_its_result() -> None:
    w, gate, ended = worker()
    assert w.call(("rebase", 3, "main1"), branch("r", "main1")) is PENDING
    assert gate.entered.wait(10)
    assert w.call(("rebase", 3, "main2"), branch("r", "main2")) is PENDING  # main moved again meanwhile
    gate.open.set()
    ended.wait(1)
    assert w.call(("rebase", 3, "main2"), branch("r", "main2")) is PENDING  # the stale one dropped, this one made
    ended.wait(2)
    assert w.call(("rebase", 3, "main2"), branch("r", "main2")) == "sha-of-r-on-main2"
    w.close(5)


def test_a_queued_call_asked_with_other_inputs_is_made_once_with_the_newest_in_its_place() -> None:
    w, gate, ended = worker()
    assert w.call(("branch", 1, "b1"), branch("first")) is PENDING  # being made: holds the thread
    assert gate.entered.wait(10)
    assert w.call(("rebase", 3, "main1"), branch("r", "main1")) is PENDING
    assert w.call(("branch", 4, "b1"), branch("after")) is PENDING
    assert w.call(("rebase", 3, "main2"), branch("r", "main2")) is PENDING  # main moved while it queued
    assert w.call(("rebase", 3, "main3"), branch("r", "main3")) is PENDING  # ... and again
    assert w.busy() == 3
    gate.open.set()
    ended.wait(3)
    assert gate.made == ["first@b1", "r@main3", "after@b1"]  # the rebase made once, onto the newest main, in its place
    assert w.call(("rebase", 3, "main3"), branch("r", "main3")) == "sha-of-r-on-main3"
    assert w.call(("branch", 4, "b1"), branch("after")) == "sha-of-after-on-b1"
    w.close(5)


def test_a_forge_that_cannot_be_made_fails_the_call_and_is_tried_again() -> None:
    tries: list[int] = []
    gate, ended = Gate(), Ended()
    gate.open.set()

    def make() -> Gate:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("GitHub is down")
        return gate

    w = ForgeWorker(make)
    w.on_done(ended)
    w.call(("branch", 1, "b1"), branch("x"))
    ended.wait(1)
    with pytest.raises(ConnectionError):
        w.call(("branch", 1, "b1"), branch("x"))
    w.call(("branch", 1, "b1"), branch("x"))
    ended.wait(2)
    assert w.call(("branch", 1, "b1"), branch("x")) == "sha-of-x-on-b1" and len(tries) == 2
    w.close(5)


def test_closing_forgets_the_calls_not_started() -> None:
    w, gate, ended = worker()
    w.call(("branch", 1, "b1"), branch("a"))
    w.call(("branch", 2, "b1"), branch("b"))
    assert gate.entered.wait(10)
    threading.Timer(0.05, gate.open.set).start()
    w.close(10)
    assert gate.threads == ["forge"]  # the first was being made; the second was forgotten
    assert w.busy() == 0
    assert w.call(("branch", 2, "b1"), branch("b")) is PENDING  # asked again: made then
    ended.wait(2)
    w.close(5)


def test_a_slot_is_held_from_its_ask_until_its_result_is_taken() -> None:
    w, gate, ended = worker()
    assert not w.holds(("branch", 1))
    assert w.call(("branch", 1, "b1"), branch("x")) is PENDING
    assert w.holds(("branch", 1)) and not w.holds(("branch", 2))  # queued or being made
    gate.open.set()
    ended.wait(1)
    assert w.holds(("branch", 1))  # done, its result not taken yet
    assert w.call(("branch", 1, "b1"), branch("x")) == "sha-of-x-on-b1"
    assert not w.holds(("branch", 1)) and not InlineCalls(gate).holds(("branch", 1))  # type: ignore[arg-type]
    w.close(5)


def test_inline_calls_are_made_at_once_on_the_conductors_forge() -> None:
    gate = Gate()
    gate.open.set()
    assert InlineCalls(gate).call(("branch", 1, "b1"), branch("x")) == "sha-of-x-on-b1"  # type: ignore[arg-type]
    assert gate.threads == [threading.current_thread().name]


# --- the loop with its branches and rebases on the worker ----------------------------------------

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"


class ThreadedForge(LocalForge):
    """The local forge, noting the thread of each branch and rebase."""

    threads: list[tuple[str, str]] = []

    def create_branch(self, branch: str, base_sha: str, files: dict[str, str], message: str) -> str:
        ThreadedForge.threads.append(("branch", threading.current_thread().name))
        return super().create_branch(branch, base_sha, files, message)

    def rebase_branch(self, branch: str, onto_sha: str, path: str) -> str:
        ThreadedForge.threads.append(("rebase", threading.current_thread().name))
        return super().rebase_branch(branch, onto_sha, path)


def run_with_worker(loop: Conductor, done, *, between=None) -> None:
    """Tick as the driver does: at once when the worker, the agent or the runner says something."""
    wake = threading.Event()
    loop.wake_on(wake.set)
    for _ in range(2000):
        wake.clear()
        loop.tick()
        if done():
            return
        if between is not None:
            between()
        wake.wait(0.05)
    raise AssertionError(f"never done: {loop.store.experiments.all()}")


def test_the_loop_with_its_branches_and_rebases_on_the_worker_keeps_and_discards_as_inline(tmp_path: Path) -> None:
    ThreadedForge.threads = []
    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    forge = LocalForge(tmp_path / "repo")
    proposals = [
        Proposal("better", "h", with_effect(MAIN, -0.1, "better")),
        Proposal("worse", "h", with_effect(MAIN, +0.1, "worse")),
    ]
    loop = Conductor(
        Store(tmp_path / "state.db"),
        forge,
        FakeRunner(slots=2),
        ScriptedAgent(proposals),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=2, retry_base_s=0.0),
        forge_worker=ForgeWorker(lambda: ThreadedForge(tmp_path / "repo")),
    )
    run_with_worker(loop, loop.finished)
    assert [(e.title, e.status) for e in loop.store.experiments.all()] == [("better", "keep"), ("worse", "discard")]
    assert forge.main_sha() == loop.store.experiments.all()[0].merged_sha
    assert {thread for _, thread in ThreadedForge.threads} == {"forge"}  # never on the conductor's thread
    loop.lifecycle.calls.close(5)


def test_a_change_measured_on_a_main_that_moved_is_rebased_on_the_worker_and_measured_again(tmp_path: Path) -> None:
    ThreadedForge.threads = []
    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    forge = LocalForge(tmp_path / "repo")
    runner = FakeRunner(auto=False)
    loop = Conductor(
        Store(tmp_path / "state.db"),
        forge,
        runner,
        ScriptedAgent([Proposal("better", "h", with_effect(MAIN, -0.1, "better"))]),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=1, retry_base_s=0.0),
        forge_worker=ForgeWorker(lambda: ThreadedForge(tmp_path / "repo")),
    )

    def finish_main_runs() -> None:
        for run_id in runner.running():
            if loop.store.runs.get(run_id).purpose == "baseline":
                runner.finish(run_id)

    run_with_worker(
        loop,
        lambda: any(r.purpose == "candidate" for r in loop.store.runs.all(state="running")),
        between=finish_main_runs,
    )
    human = MAIN.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.45")  # a line apart from the change
    old = forge.main_sha()
    forge.create_branch("human", old, {"train.py": human}, "a human commit")
    forge.merge("human", old, "a human commit")
    runner.auto = True
    for run_id in runner.running():
        runner.finish(run_id)
    run_with_worker(loop, loop.finished)
    [exp] = loop.store.experiments.all()
    [remeasure] = [r for r in loop.store.runs.all(experiment_id=exp.id) if r.purpose == "remeasure"]
    assert "WARMDOWN_RATIO = 0.45" in remeasure.asset and exp.status == "keep"
    assert ("rebase", "forge") in ThreadedForge.threads
    assert {thread for _, thread in ThreadedForge.threads} == {"forge"}
    loop.lifecycle.calls.close(5)
