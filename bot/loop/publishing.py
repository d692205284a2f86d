"""Publishing on a thread of its own: a tick hands over what to show and returns; GitHub is told when it can be.

The store says what must be shown, and a publisher (bot.github.publisher) makes up the difference
between it and what people see, level-triggered: only the latest snapshot matters. So the worker
coalesces: it publishes the newest snapshot handed over, and one handed over while it was busy
replaces any it had not started (never a queue of stale ones). A publisher that is slow, or waits
for room under GitHub's write limits, holds up no tick; the conductor's fast, local publisher
(results.tsv) stays in the tick (bot.loop.conductor says why).

A publisher that fails is logged and recorded in the store's events (once while the same error
repeats), the others go on, and the next hand-over tries again. One that stops part way because
the service stops (bot.core.errors.PublishingStopped) is logged only: nothing failed. `flush()` waits until what was
handed over has been shown; `close()` flushes and ends the thread: the driver (bot.loop.driver)
calls it, with a bound, before it returns, so the last state is shown before the service or the
demo exits unless GitHub's write limits hold it up (then it is shown after the next start).

The worker's publishers, and the store it records errors in, use a store connection of their own
(a Store serves one thread at a time): the wiring (bot.app.serve) opens one for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from bot.core.errors import PublishingStopped
from bot.core.protocols import Publisher, Snapshot
from bot.loop.errors import RepeatedErrors
from bot.store import Store

log = logging.getLogger(__name__)


class PublishWorker:
    """One thread that shows the latest snapshot handed over to each of `publishers` in turn."""

    def __init__(
        self,
        publishers: Sequence[Publisher],
        store: Store,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "publisher",
    ) -> None:
        self.publishers = list(publishers)
        self.store = store  # the worker's own connection: errors are recorded through it
        self.clock = clock
        self.name = name
        self._changed = threading.Condition()
        self._latest: Snapshot | None = None  # handed over and not yet started
        self._handed = 0  # hand-overs so far
        self._shown = 0  # the hand-overs whose snapshot (or a later one) has been published
        self._busy_since: float | None = None  # clock() when the publish in progress began
        self._closing = False
        self._thread: threading.Thread | None = None
        self._errors = RepeatedErrors(store)  # an error that repeats at every hand-over is recorded once

    # --- the conductor's side ------------------------------------------------------------------------
    def hand_over(self, snapshot: Snapshot) -> None:
        """Show `snapshot` as soon as the worker is free (replacing one still waiting); returns at once."""
        with self._changed:
            self._latest = snapshot
            self._handed += 1
            self._closing = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed over so far has been published (the latest snapshot shown
        to every publisher, a failure recorded); False if `timeout` passed first."""
        with self._changed:
            target = self._handed
            return self._changed.wait_for(lambda: self._shown >= target or not self._running(), timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then end the thread (a later hand-over starts another); False if `timeout` passed first."""
        deadline = None if timeout is None else self.clock() + timeout
        flushed = self.flush(timeout)
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(None if deadline is None else max(0.0, deadline - self.clock()))
        return flushed

    @property
    def busy_s(self) -> float | None:
        """How long the publish in progress has run (None while the worker is idle)."""
        started = self._busy_since
        return None if started is None else max(0.0, self.clock() - started)

    # --- the worker's thread -------------------------------------------------------------------------
    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._latest is not None or self._closing)
                if self._latest is None:
                    self._thread = None  # under the lock: a hand-over from now on starts another
                    return
                snapshot, upto = self._latest, self._handed
                self._latest = None
                self._busy_since = self.clock()
            try:
                self._publish(snapshot)
            finally:
                with self._changed:
                    self._busy_since = None
                    self._shown = upto
                    self._changed.notify_all()

    def _publish(self, snapshot: Snapshot) -> None:
        for publisher in self.publishers:  # one that fails holds up none of the others
            try:
                publisher.publish(snapshot)
            except PublishingStopped as stopped:  # the service stops: the next start shows the rest
                log.info("publishing stopped part way, as the service stops: %s", stopped)
            except Exception as error:  # noqa: BLE001 - GitHub may be down; the next hand-over tries again
                self._record(error)

    def _record(self, error: Exception) -> None:
        self._errors.record(f"publishing failed: {type(error).__name__}: {error}; trying again on the next tick")
