"""bot.loop.driver: when it ticks. On an event (a wake), on a new inbox entry, on its timer, and at
the moment the conductor names as due (a question the paced lookahead will want), which nothing
else announces. Its waits are recorded, not slept, so no test here depends on a clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bot.loop.driver import MIN_WAIT_S, Driver


class Inbox:
    def last_id(self) -> int:
        return 0


@dataclass
class State:
    driver_last_run: dict | None = None


@dataclass
class Store:
    inbox: Inbox = field(default_factory=Inbox)
    state: State = field(default_factory=State)


class Conductor:
    """Ticks `ticks` times, then is finished; `due` says what next_due_s answers after each tick."""

    def __init__(self, ticks: int, due: Callable[[int], float | None]) -> None:
        self.store = Store()
        self.blocked = ""
        self.ticks = 0
        self.total = ticks
        self.due = due
        self.idled = 0

    def wake_on(self, callback: Callable[[], None]) -> None:
        pass

    def start(self) -> None:
        pass

    def tick(self) -> None:
        self.ticks += 1

    def finished(self) -> bool:
        return self.ticks >= self.total

    def next_due_s(self) -> float | None:
        return self.due(self.ticks)

    def idle(self, busy: Callable[[], bool]) -> None:
        self.idled += 1

    def close_publishing(self, timeout_s: float) -> bool:
        return True

    def summary(self) -> str:
        return "done"


class RecordedWake:
    """The driver's wake event: records each wait's timeout and returns at once, as if it had run out."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return True  # as if woken: the driver ticks again


def drive(conductor: Conductor, **kwargs) -> list[float]:
    driver = Driver(conductor, **kwargs)
    wake = driver._wake = RecordedWake()  # type: ignore[assignment]
    assert driver.run() == "done"
    return wake.timeouts


def test_a_due_time_shortens_the_wait_to_it() -> None:
    timeouts = drive(Conductor(3, lambda tick: {1: 0.25, 2: None}[tick]), timer_s=30.0, inbox_poll_s=0.5)
    assert timeouts[0] <= 0.25  # the question due in 0.25 s: the driver ticks then
    assert timeouts[1] == 0.5  # nothing due: the usual inbox poll, until the timer


def test_a_due_time_later_than_the_timer_leaves_the_timer_in_charge() -> None:
    timeouts = drive(Conductor(2, lambda tick: 90.0), timer_s=0.2, inbox_poll_s=0.5)
    assert timeouts == [timeouts[0]] and timeouts[0] <= 0.2


def test_a_due_time_already_past_waits_a_moment_not_a_busy_loop() -> None:
    timeouts = drive(Conductor(2, lambda tick: -5.0), timer_s=30.0, inbox_poll_s=0.5)
    assert len(timeouts) == 1 and 0 < timeouts[0] <= MIN_WAIT_S


def test_the_conductor_works_ahead_before_each_wait() -> None:
    conductor = Conductor(3, lambda tick: None)
    timeouts = drive(conductor, timer_s=30.0, inbox_poll_s=0.5)
    assert conductor.idled == len(timeouts) == 2  # once before each wait, none after the last tick


def test_work_ahead_stops_when_the_due_time_comes(monkeypatch) -> None:
    """Idle work is cut short by what is due as well as by what arrives: a question due in 5 s is
    asked then, not after the work ahead."""
    from bot.loop import driver

    now = [1000.0]
    monkeypatch.setattr(driver.time, "monotonic", lambda: now[0])
    seen: list[bool] = []

    class Ahead(Conductor):
        def idle(self, busy: Callable[[], bool]) -> None:
            seen.append(busy())
            now[0] += 6.0  # the work ahead took past the due time
            seen.append(busy())

    drive(Ahead(2, lambda tick: 5.0), timer_s=30.0, inbox_poll_s=0.5)
    assert seen == [False, True]
