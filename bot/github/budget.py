"""GitHub's write budget, planned with rather than stalled on.

GitHub allows about 80 content-creating requests a minute and 500 an hour (POST, PATCH, PUT and
DELETE, a workflow dispatch among them; its "secondary limits"). Every writer charges the budget
before each such request, and the budget keeps them in a ledger (bot.store.writes) that survives
a restart and that `autoresearch status` and the dashboard read. Writes come in two priorities:

- The research's (a branch a runner must fetch, a commit, the fast-forward of main, a workflow
  dispatch): `charge()` records them and never waits, so nothing the conductor does sleeps here.
  When they alone would break a limit the budget says so in the log (once a minute): the runners
  outgrow one installation (at 2 writes a branch, about 250 experiments an hour; with the Actions
  runner's dispatch, about 160; fewer when keeps make main move under many experiments in flight,
  each of which is rebased, 3 writes).
- What people read (pull requests, check runs, comments, labels, the research log): `wait()`
  records one once it fits, sleeping the caller meanwhile (the publisher, on its own worker). It
  fits while each window's count stays under its limit less a reserve for the research's writes
  to come (their rate over the last hour or the last sixth of it, whichever is higher, times the
  window; in a minute at least a fifth of the limit), so what people read never crowds out a run.
  The wait ends early when `stop` is set (the service is stopping): a write that must still wait
  then raises WriteBudgetStopped and is not made; the publisher shows it after the next start,
  since it makes up the difference between the store and what people see.

The mode. Each pass the publisher asks `decide_mode()`, which forecasts the writes an hour that
showing every experiment in full would take: the research's writes at their recent rate, plus
PEOPLE_WRITES_PER_EXPERIMENT for each experiment (counted by the branches made at that rate),
plus the research log's LOG_WRITES_PER_HOUR. An experiment whose branch the degraded mode left
unmade (bot.github.branches, `note_unbranched`) counts as one more experiment and its branch's
BRANCH_WRITES, so the savings of the degraded mode do not talk it back into the full one; one that
gets its branch later (promising) is forgotten then (`forget_unbranched`), its writes counting it.
The notes are kept in memory only: for an hour after a restart the forecast does not see them.
Above ENTER of the hour's limit the mode turns "degraded" (what that shows and what it leaves out:
bot.github.publisher) at once; below LEAVE it turns "full" again, but only once it has been degraded
for DEGRADED_AT_LEAST of the hour: the forecast follows bursts (the last sixth of the hour counts),
and near the threshold (8 runners, bench/duty_cycle.py) it turned the mode back and forth four times
in an hour, so that people saw pull requests for one run of experiments and none for the next.
Each change is written to the ledger with when and why, and logged.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from bot.core.errors import PublishingStopped
from bot.store.db import Database
from bot.store.writes import DEFAULT_LIMITS, Write, WriteLedger, WriteMode

__all__ = ["WRITE_LIMITS", "WriteBudget", "WriteBudgetStopped", "open_ledger"]

log = logging.getLogger(__name__)

WRITE_LIMITS = DEFAULT_LIMITS  # ((60 s, 80), (3600 s, 500)): GitHub's secondary limits on writes
PEOPLE_WRITES_PER_EXPERIMENT = 4  # full mode: pull request, check run, decision comment, label and close
BRANCH_WRITES = 2  # an experiment's branch: its ref, the PUT of its file (bot.github.forge)
LOG_WRITES_PER_HOUR = 12  # the research log's body: one edit per 300 s at most (bot.github.research_log)
ENTER, LEAVE = 0.9, 0.7  # degraded above ENTER x the hour's limit forecast, full again below LEAVE x it
DEGRADED_AT_LEAST = 0.25  # of the longest window (15 minutes of GitHub's hour): the least a degraded mode lasts
SHORT_WINDOW_RESERVE = 0.2  # in the shortest window, at least this share is kept for the research


def open_ledger(path: Path) -> WriteLedger:
    """The ledger of the store at `path` on a connection of its own (the store is migrated first),
    which waits at most 0.2 s for the store's lock: a write is recorded later rather than held up."""
    Database(path).close()
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0.2)
    return WriteLedger(conn)


class WriteBudgetStopped(PublishingStopped):
    """A write people read was to wait for room while the service stops: it is not made now."""


class WriteBudget:
    """The writes of the last hour in memory (the ledger's copy on disk), the two priorities, the mode."""

    def __init__(
        self,
        ledger: WriteLedger | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] | None = None,
        limits: tuple[tuple[float, int], ...] = WRITE_LIMITS,
        stop: threading.Event | None = None,
    ) -> None:
        self.stop = stop or threading.Event()  # set: wait() gives up instead of waiting (WriteBudgetStopped)
        self.sleep = sleep or self.stop.wait  # by default a wait ends as soon as `stop` is set
        self.clock, self.limits = clock, tuple(sorted(limits))
        self.ledger = ledger
        self.waited = 0.0  # seconds wait() has slept in all
        self._longest = max(window for window, _ in self.limits)
        self._lock = threading.Lock()  # never held while sleeping
        self._writes: deque[Write] = deque(ledger.since(clock() - self._longest) if ledger else ())
        self._unbranched: deque[float] = deque()  # when experiments were left without a branch (memory only)
        self._unsaved: list[Write] = []
        self._warned_at = -math.inf  # when the research's writes were last said to outgrow the limits
        self._mode = ledger.mode if ledger else WriteMode(limits=self.limits)
        if self._mode.limits != self.limits:  # what the views divide by: these limits
            mode = self._mode
            self._save_mode(WriteMode(mode.mode, mode.since, mode.why, self.limits))

    # --- charging ---------------------------------------------------------------------------------
    def charge(self, what: str = "write") -> None:
        """A write the research needs: recorded, never waited for."""
        with self._lock:
            now = self.clock()
            self._record(Write(now, what, True))
            over = [(window, most) for window, most in self.limits if self._count(now, window) > most]
            if over and now - self._warned_at < self.limits[0][0]:
                over = []  # said once per shortest window
            elif over:
                self._warned_at = now
        for window, most in over:
            log.warning(
                "GitHub: more than %d writes in %.0f s (the last one: %s); the research's writes alone "
                "outgrow one installation: give it fewer runners",
                most,
                window,
                what,
            )

    def wait(self, what: str) -> float:
        """A write people read: waits until it fits (under each limit less the research's reserve),
        records it, and returns the seconds waited. Only a publisher's own thread may call this.
        Raises WriteBudgetStopped, the write not recorded, if it must wait once `stop` is set."""
        waited = 0.0
        while True:
            with self._lock:
                now = self.clock()
                delay = self._delay(now)
                if delay <= 0:
                    self._record(Write(now, what, False))
                    break
            if self.stop.is_set():
                self.waited += waited
                raise WriteBudgetStopped(
                    f"{what} is not written: the service is stopping (shown after it starts again)"
                )
            log.info("GitHub: the write budget holds %s back %.1f s", what, delay)
            self.sleep(delay)
            waited += delay
        self.waited += waited
        return waited

    def room(self) -> int:
        """How many writes people read fit now without waiting."""
        with self._lock:
            now = self.clock()
            return max(
                0, min(self._allowed(now, window, most) - self._count(now, window) for window, most in self.limits)
            )

    # --- the mode -----------------------------------------------------------------------------------
    @property
    def mode(self) -> WriteMode:
        return self._mode

    def note_unbranched(self) -> float:
        """One experiment is left without its branch (degraded: bot.github.branches); the forecast
        counts it as shown in full, its branch included. Returns the note's time (its key)."""
        with self._lock:
            now = self.clock()
            self._unbranched.append(now)
            while self._unbranched and self._unbranched[0] <= now - self._longest:
                self._unbranched.popleft()
            return now

    def forget_unbranched(self, at: float) -> None:
        """The experiment noted at `at` gets its branch after all (promising): its writes count it."""
        with self._lock:
            if at in self._unbranched:
                self._unbranched.remove(at)

    def forecast(self) -> float:
        """The writes an hour that showing every experiment in full would take at the recent pace."""
        with self._lock:
            now = self.clock()
            research = self._rate(now, lambda w: w.research)
            branched = self._rate(now, lambda w: w.what == "branch")
            unbranched = max(
                sum(1 for at in self._unbranched if at > now - window) * self._longest / window
                for window in (self._longest, self._longest / 6)
            )
        return (
            research
            + unbranched * BRANCH_WRITES
            + (branched + unbranched) * PEOPLE_WRITES_PER_EXPERIMENT
            + LOG_WRITES_PER_HOUR * self._longest / 3600
        )

    def decide_mode(self) -> WriteMode:
        """Full or degraded, from the forecast (see the module docstring); a change is saved and logged."""
        hour = max(most for window, most in self.limits if window == self._longest)
        need = self.forecast()
        current = self._mode
        if current.mode == "full" and need > ENTER * hour:
            why = (
                f"showing every experiment in full would take {need:.0f} writes per {self._longest:.0f} s "
                f"at the recent pace, over {ENTER:.0%} of GitHub's {hour}"
            )
            self._set_mode(WriteMode("degraded", self.clock(), why, self.limits))
        elif (
            current.mode == "degraded"
            and need < LEAVE * hour
            and self.clock() - (current.since or 0.0) >= DEGRADED_AT_LEAST * self._longest
        ):
            why = f"the recent pace needs {need:.0f} writes per {self._longest:.0f} s in full, under {LEAVE:.0%} of {hour}"
            self._set_mode(WriteMode("full", self.clock(), why, self.limits))
        return self._mode

    def _set_mode(self, mode: WriteMode) -> None:
        log.warning("GitHub write budget: %s mode: %s", mode.mode, mode.why)
        self._save_mode(mode)

    def _save_mode(self, mode: WriteMode) -> None:
        # under the lock: the ledger's connection is shared with _record's writes from other threads,
        # and an upsert between another thread's BEGIN and COMMIT would be rolled back with it
        with self._lock:
            self._mode = mode
            if self.ledger is not None:
                try:
                    self.ledger.mode = mode
                except sqlite3.OperationalError as error:  # the store is busy: shown at the next change
                    log.info("the write budget's mode is not saved yet: %s", error)

    # --- the windows ----------------------------------------------------------------------------------
    def _record(self, write: Write) -> None:
        self._writes.append(write)
        while self._writes and self._writes[0].at <= write.at - self._longest:
            self._writes.popleft()
        self._unsaved.append(write)
        if self.ledger is None:
            self._unsaved.clear()
            return
        try:
            self.ledger.add(self._unsaved)
            self._unsaved.clear()
        except sqlite3.OperationalError as error:  # the store is busy: saved with the next write
            log.info("%d writes wait to be saved in the ledger: %s", len(self._unsaved), error)

    def _count(self, now: float, window: float, keep: Callable[[Write], bool] = lambda w: True) -> int:
        return sum(1 for w in self._writes if w.at > now - window and keep(w))

    def _rate(self, now: float, keep: Callable[[Write], bool]) -> float:
        """Writes per longest window: the higher of the last window's count and its last sixth's x 6."""
        recent = self._longest / 6
        return max(self._count(now, self._longest, keep), self._count(now, recent, keep) * 6.0)

    def _allowed(self, now: float, window: float, most: int) -> int:
        """The count a window may reach with writes people read: its limit less the research's reserve."""
        reserve = math.ceil(self._rate(now, lambda w: w.research) * window / self._longest)
        if window == self.limits[0][0]:
            reserve = max(reserve, math.ceil(most * SHORT_WINDOW_RESERVE))
        return max(1, most - reserve)

    def _delay(self, now: float) -> float:
        """Seconds until one more write people read fits in every window (0: now)."""
        delay = 0.0
        for window, most in self.limits:
            inside = [w.at for w in self._writes if w.at > now - window]
            allowed = self._allowed(now, window, most)
            if len(inside) >= allowed:
                delay = max(delay, inside[len(inside) - allowed] + window - now)
        return delay
