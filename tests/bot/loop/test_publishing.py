"""Publishing on its own worker: a tick hands over the snapshot and returns while GitHub is slow,
only the latest snapshot is published, failures are recorded once and retried, and the driver
returns only once the last tick's snapshot is shown. Publishers here block on events the test
sets, never on time."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import Publisher, Snapshot
from bot.core.records import Proposal
from bot.forge.local import LocalForge, init_research_repo
from bot.github.budget import WriteBudgetStopped
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.driver import Driver
from bot.loop.publishing import PublishWorker
from bot.store import Store
from bot.views.results import ResultsFile, export_tsv

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"
PATIENCE_S = 30.0  # how long a test waits for a thread it has released before calling it a hang


def snapshot(sha: str) -> Snapshot:
    return Snapshot(main_sha=sha, main_val_bpb=None, margin=None, progress={}, budget_s=300.0)


class Gated(Publisher):
    """A publisher as slow as GitHub's write pacer: each publish waits until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()  # a publish has begun
        self.gate = threading.Event()
        self.snapshots: list[Snapshot] = []

    def publish(self, snapshot: Snapshot) -> None:
        self.entered.set()
        assert self.gate.wait(PATIENCE_S), "the test never opened the gate"
        self.snapshots.append(snapshot)


class Recording(Publisher):
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)


class FailingOnce(Publisher):
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.snapshots: list[Snapshot] = []

    def publish(self, snapshot: Snapshot) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("GitHub is down")
        self.snapshots.append(snapshot)


class OpensAtClose(PublishWorker):
    """The real worker, remembering what it was handed; its publisher's gate opens only when someone
    closes it, so every publish waits until then."""

    def __init__(self, publisher: Gated, store: Store) -> None:
        super().__init__([publisher], store)
        self.gate = publisher.gate
        self.handed: list[Snapshot] = []

    def hand_over(self, snapshot: Snapshot) -> None:
        self.handed.append(snapshot)
        super().hand_over(snapshot)

    def close(self, timeout: float | None = None) -> bool:
        self.gate.set()
        return super().close(timeout)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, proposals: list[Proposal], publishing: PublishWorker, **kwargs) -> Conductor:
    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    return Conductor(
        Store(tmp_path / "state.db"),
        LocalForge(tmp_path / "repo"),
        FakeRunner(),
        ScriptedAgent(proposals),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=len(proposals)),
        publishing=publishing,
        **kwargs,
    )


def better(title: str = "better") -> Proposal:
    return Proposal(title, "a clear gain", with_effect(MAIN, -0.1, title))


# --- the worker ------------------------------------------------------------------------------------------


def test_the_worker_publishes_only_the_latest_snapshot_never_a_queue_of_stale_ones(tmp_path: Path) -> None:
    slow = Gated()
    worker = PublishWorker([slow], Store(tmp_path / "state.db"))
    worker.hand_over(snapshot("a"))
    assert slow.entered.wait(PATIENCE_S)
    worker.hand_over(snapshot("b"))  # replaced by c before the worker is free: never shown
    worker.hand_over(snapshot("c"))
    slow.gate.set()
    assert worker.flush(PATIENCE_S)
    assert [s.main_sha for s in slow.snapshots] == ["a", "c"]


def test_a_slow_publisher_holds_up_no_fast_one_after_it_has_shown_the_snapshot(tmp_path: Path) -> None:
    """Publishers on the worker go in turn; the fast one beside a slow one waits for it, which is why
    results.tsv stays in the tick (next test)."""
    slow, fast = Gated(), Recording()
    worker = PublishWorker([fast, slow], Store(tmp_path / "state.db"))
    worker.hand_over(snapshot("a"))
    assert slow.entered.wait(PATIENCE_S)
    assert [s.main_sha for s in fast.snapshots] == ["a"]
    slow.gate.set()
    assert worker.close(PATIENCE_S)


def test_a_failing_publisher_is_recorded_once_and_tried_again_on_the_next_hand_over(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    failing, beside = FailingOnce(failures=2), Recording()
    worker = PublishWorker([failing, beside], store)
    for sha in ("a", "b", "c"):
        worker.hand_over(snapshot(sha))
        assert worker.flush(PATIENCE_S)
    errors = [e["message"] for e in store.events.all() if e["kind"] == "error"]
    assert errors == ["publishing failed: RuntimeError: GitHub is down; trying again on the next tick"]
    assert [s.main_sha for s in failing.snapshots] == ["c"]
    assert [s.main_sha for s in beside.snapshots] == ["a", "b", "c"]  # held up by none of the failures
    worker.close()


class StoppedPartWay(Publisher):
    """GitHub's publisher when the service stops while it waits for room under the write limits."""

    def publish(self, snapshot: Snapshot) -> None:
        raise WriteBudgetStopped("a check run waited for room under GitHub's write limits while the service stopped")


def test_a_publisher_stopped_part_way_by_the_service_stopping_records_no_failure(tmp_path: Path, caplog) -> None:
    store = Store(tmp_path / "state.db")
    beside = Recording()
    worker = PublishWorker([StoppedPartWay(), beside], store)
    with caplog.at_level(logging.INFO, logger="bot.loop.publishing"):
        worker.hand_over(snapshot("a"))
        assert worker.flush(PATIENCE_S)
    assert [e for e in store.events.all() if e["kind"] == "error"] == []
    assert "publishing stopped part way, as the service stops" in caplog.text
    assert [s.main_sha for s in beside.snapshots] == ["a"]
    worker.close()


def test_close_flushes_ends_the_thread_and_a_later_hand_over_starts_another(tmp_path: Path) -> None:
    recording = Recording()
    worker = PublishWorker([recording], Store(tmp_path / "state.db"), name="publisher-under-test")
    worker.hand_over(snapshot("a"))
    assert worker.close(PATIENCE_S)
    assert [s.main_sha for s in recording.snapshots] == ["a"]
    assert "publisher-under-test" not in {t.name for t in threading.enumerate()}
    worker.hand_over(snapshot("b"))
    assert worker.close(PATIENCE_S)
    assert [s.main_sha for s in recording.snapshots] == ["a", "b"]


def test_busy_s_says_how_long_the_publish_in_progress_has_run(tmp_path: Path) -> None:
    slow, clock = Gated(), Clock()
    worker = PublishWorker([slow], Store(tmp_path / "state.db"), clock=clock)
    assert worker.busy_s is None
    worker.hand_over(snapshot("a"))
    assert slow.entered.wait(PATIENCE_S)
    clock.now += 42
    assert worker.busy_s == 42
    slow.gate.set()
    assert worker.flush(PATIENCE_S)
    assert worker.busy_s is None
    worker.close()


# --- the conductor and the driver --------------------------------------------------------------------------


def test_a_tick_hands_over_and_returns_while_github_is_slow_and_results_tsv_is_written_in_it(
    tmp_path: Path,
) -> None:
    slow = Gated()
    path, expected = tmp_path / "results.tsv", tmp_path / "expected.tsv"
    loop = make(tmp_path, [better()], PublishWorker([slow], Store(tmp_path / "state.db")))
    loop.publishers.append(ResultsFile(loop.store, path))
    loop.tick()  # a publish begins on the worker and waits at the gate
    assert slow.entered.wait(PATIENCE_S)
    loop.tick()  # returns although the worker is stuck: had it waited, the gate would never open
    export_tsv(loop.store, expected)
    assert path.read_text() == expected.read_text()  # the fast, local publisher in the tick itself
    assert slow.snapshots == []  # nothing shown yet: both ticks returned while the worker waited
    slow.gate.set()
    assert loop.publishing is not None and loop.publishing.flush(PATIENCE_S)
    assert slow.snapshots[-1].main_sha == loop.forge.main_sha()
    loop.close_publishing()


def test_the_driver_returns_only_once_the_last_ticks_snapshot_is_shown(tmp_path: Path) -> None:
    """Every publish waits until the worker is closed: a driver that returned without closing it
    would leave the last snapshot (and every other) unshown."""
    slow = Gated()
    worker = OpensAtClose(slow, Store(tmp_path / "state.db"))
    loop = make(tmp_path, [better()], worker)
    try:
        summary = Driver(loop, timer_s=0.05).run()
        assert summary.kept == 1
        assert slow.snapshots and slow.snapshots[-1] is worker.handed[-1]
    finally:
        slow.gate.set()


def test_the_driver_waits_for_publishing_only_so_long_and_returns(tmp_path: Path, caplog) -> None:
    """GitHub's write limits can hold a publish up to an hour: a stopping service must not wait
    that long (its runner is closed after the driver returns). What is not shown then is shown after
    the next start, the publisher being level-triggered from the store."""
    slow = Gated()  # never opened while the driver runs: the publish in progress never ends
    worker = PublishWorker([slow], Store(tmp_path / "state.db"))
    loop = make(tmp_path, [better()], worker)
    try:
        with caplog.at_level(logging.WARNING, logger="bot.loop.driver"):
            summary = Driver(loop, timer_s=0.05, publish_close_s=0.0).run()
        assert summary.kept == 1 and slow.entered.wait(PATIENCE_S) and slow.snapshots == []
        assert "what is not shown yet is shown after the next start" in caplog.text
    finally:
        slow.gate.set()
    assert worker.close(PATIENCE_S)
