"""The write budget: the research's writes never wait, what people read waits for room under each of
GitHub's windows less a reserve for the research, the ledger survives a restart, and the mode turns
degraded when showing everything in full would break the hour's limit, and full again with room."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from bot.github.budget import WriteBudget, WriteBudgetStopped, open_ledger
from bot.store import Store
from bot.store.writes import WriteLedger, WriteMode

LIMITS = ((60.0, 10), (3600.0, 50))  # GitHub's (80 a minute, 500 an hour), scaled down
PATIENCE_S = 30.0  # how long a test waits for a thread it has released before calling it a hang


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def budget(clock: FakeClock, path: Path | None = None) -> WriteBudget:
    return WriteBudget(open_ledger(path) if path else None, clock=clock, sleep=clock.sleep, limits=LIMITS)


def test_the_research_writes_never_wait_and_say_when_they_outgrow_the_limit(clock, caplog):
    b = budget(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(12):
            b.charge("branch")
    assert clock.slept == []
    assert "outgrow one installation" in caplog.text


def test_a_write_people_read_waits_for_room_under_the_minute_less_the_research_reserve(clock):
    b = budget(clock)
    for _ in range(8):  # a fifth of the minute (2 of 10) is kept for the research
        assert b.wait("comment") == 0
        clock.now += 1.0
    assert b.room() == 0
    assert b.wait("comment") == pytest.approx(52.0)  # the first left the window at 1060; now 1008
    assert clock.slept == [pytest.approx(52.0)]


def fill_the_minute(b: WriteBudget, clock: FakeClock) -> None:
    for _ in range(8):  # what people read may use 8 of the minute's 10
        assert b.wait("comment") == 0
        clock.now += 1.0


def test_a_write_that_must_wait_gives_up_once_the_service_stops(clock, tmp_path: Path):
    """A stopping service must not sit out the hour's window: the write is not made (the publisher
    shows it after the next start) and the wait ends."""
    stop = threading.Event()

    def sleep(seconds: float) -> None:  # the service is stopped while the write waits
        clock.sleep(seconds)
        assert len(clock.slept) == 1, "the wait went on after the service stopped"
        stop.set()
        clock.now -= seconds  # and no time passed: the write would still have to wait

    path = tmp_path / "state.db"
    b = WriteBudget(open_ledger(path), clock=clock, sleep=sleep, limits=LIMITS, stop=stop)
    fill_the_minute(b, clock)
    with pytest.raises(WriteBudgetStopped, match="the service is stopping"):
        b.wait("comment")
    assert len(clock.slept) == 1 and Store(path).writes.summary(clock.now).counts[0][1] == 8  # not recorded


def test_a_write_that_fits_is_made_while_the_service_stops(clock):
    stop = threading.Event()
    b = WriteBudget(None, clock=clock, sleep=clock.sleep, limits=LIMITS, stop=stop)
    stop.set()
    assert b.wait("comment") == 0  # the last snapshot shows what it can without waiting


def test_by_default_the_wait_is_on_the_stop_event_and_ends_when_it_is_set(clock):
    b = WriteBudget(None, clock=clock, limits=LIMITS)  # the clock stands still: only stop ends the wait
    fill_the_minute(b, clock)
    outcome: list[BaseException] = []

    def publish() -> None:
        try:
            b.wait("comment")
        except WriteBudgetStopped as error:
            outcome.append(error)

    worker = threading.Thread(target=publish)
    worker.start()
    b.stop.set()
    worker.join(PATIENCE_S)
    assert not worker.is_alive() and len(outcome) == 1


class LockCheckingLedger(WriteLedger):
    """Notes whether the budget's lock was held each time the mode was written."""

    def __init__(self, ledger: WriteLedger) -> None:
        super().__init__(ledger.db)
        self.budget: WriteBudget | None = None
        self.held: list[bool] = []

    @property
    def mode(self) -> WriteMode:
        return WriteLedger.mode.fget(self)

    @mode.setter
    def mode(self, value: WriteMode) -> None:
        if self.budget is not None:
            self.held.append(self.budget._lock.locked())
        WriteLedger.mode.fset(self, value)


def test_the_mode_is_written_under_the_lock_other_threads_write_the_ledger_under(clock, tmp_path: Path):
    """The ledger's connection is shared across threads: a mode written outside the lock could land
    inside another thread's transaction and be rolled back with it."""
    ledger = LockCheckingLedger(open_ledger(tmp_path / "state.db"))
    b = WriteBudget(ledger, clock=clock, sleep=clock.sleep, limits=LIMITS)
    ledger.budget = b
    for _ in range(9):
        b.charge("branch")
        b.charge("commit")
        clock.now += 60.0
    assert b.decide_mode().mode == "degraded"
    assert ledger.held == [True]


def test_the_research_rate_is_reserved_in_the_hour(clock):
    b = budget(clock)
    for _ in range(30):  # 30 research writes an hour, 2 a minute: the hour keeps 30 of its 50 for them
        b.charge("branch")
        clock.now += 30.0
    assert b.room() == 0  # 30 in the window already, 50 - 30 allowed: nothing fits
    clock.now += 3600.0  # all gone, and the pace with them
    assert b.room() == 8


def test_the_ledger_survives_a_restart_and_forgets_what_left_the_hour(clock, tmp_path: Path):
    path = tmp_path / "state.db"
    first = budget(clock, path)
    for what in ("branch", "commit", "pull"):
        first.charge(what)
    clock.now += 3000.0
    first.wait("check")
    again = budget(clock, path)
    assert again.room() == 7  # the minute's 10, less 2 kept for the research, less the check
    clock.now += 700.0  # the first three are over an hour old now
    store = Store(path)
    summary = store.writes.summary(clock.now)
    assert summary.counts == [(60.0, 0, 10), (3600.0, 1, 50)]
    assert [w.what for w in store.writes.since(0)] == ["branch", "commit", "pull", "check"]


def test_the_mode_turns_degraded_with_why_and_full_again_with_room(clock, tmp_path: Path):
    path = tmp_path / "state.db"
    b = budget(clock, path)
    assert b.decide_mode().mode == "full"
    for _ in range(9):  # 9 experiments in 10 minutes: 54 an hour, 2 writes each, 4 more to show each in full
        b.charge("branch")
        b.charge("commit")
        clock.now += 60.0
    mode = b.decide_mode()
    assert mode.mode == "degraded" and mode.since == clock.now
    assert "over 90% of GitHub's 50" in mode.why
    assert Store(path).writes.mode == mode  # what status and the dashboard read
    clock.now += 2 * 3600.0
    back = b.decide_mode()
    assert back.mode == "full" and back.since == clock.now and "under 70%" in back.why
    assert Store(path).writes.summary(clock.now).mode == back


def test_a_degraded_mode_lasts_a_quarter_hour_before_it_may_turn_full_again(clock, monkeypatch):
    """The forecast follows bursts; near its threshold it would turn the mode back and forth, and
    people would see pull requests for one run of experiments and none for the next."""
    b = budget(clock)
    need = {"writes": 46.0}  # over 90% of the hour's 50
    monkeypatch.setattr(b, "forecast", lambda: need["writes"])
    assert b.decide_mode().mode == "degraded"
    degraded_at = clock.now
    need["writes"] = 10.0  # the burst is over: far under 70%
    clock.now = degraded_at + 0.25 * 3600.0 - 1.0
    assert b.decide_mode().mode == "degraded"  # not yet: a quarter of the hour first
    clock.now = degraded_at + 0.25 * 3600.0
    assert b.decide_mode().mode == "full"
    need["writes"] = 46.0
    assert b.decide_mode().mode == "degraded"  # turning degraded is never held back


def test_a_store_without_a_mode_reads_full_under_githubs_limits(tmp_path: Path):
    summary = Store(tmp_path / "state.db").writes.summary(0.0)
    assert summary.mode == WriteMode()
    assert summary.counts == [(60.0, 0, 80), (3600.0, 0, 500)]


def test_the_research_outgrowing_the_limit_is_said_once_a_minute(clock, caplog):
    b = budget(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(60):  # over the minute's 10 and the hour's 50
            b.charge("branch")
        clock.now += 61.0
        b.charge("branch")  # still over the hour's
    assert caplog.text.count("outgrow one installation") == 2
