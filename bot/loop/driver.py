"""The driver: calls the conductor's tick() when something arrives, and on a slow timer otherwise.

Something arrives when the agent answers, a runner says a job changed (both call `wake()` from
their own threads), or a new inbox entry appears in the store (written by another process, so it
is polled: one indexed query every `inbox_poll_s`). The timer catches what nobody announces (a
job adopted after a restart, a run past its deadline, a retry whose backoff ran out), and the
conductor names the one moment it can foresee (`next_due_s`: a running run comes within the paced
lookahead's horizon, so a question should be opened for its slot) for a tick then. The same
driver runs `autoresearch demo` and the long-running service. Before it returns (finished,
stopped, or main needs a person) it waits for the publishing worker to show the last tick's
snapshot (bot.loop.publishing), so what people see is never left one tick behind; but at most
`publish_close_s`, since GitHub's write limits can hold a write up to an hour: what is not shown
then is shown after the next start (the publisher makes up the difference between the store and
what people see, and the first tick hands it a snapshot), and a stopping service is not held up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from bot.loop.conductor import Conductor, ConductorError, Summary

log = logging.getLogger(__name__)

PUBLISH_CLOSE_S = 20.0  # the longest the driver waits for the publishing worker before it returns
MIN_WAIT_S = 0.01  # a due time already reached ticks again after this, not in a busy loop


class Driver:
    def __init__(
        self,
        conductor: Conductor,
        *,
        timer_s: float = 30.0,
        inbox_poll_s: float = 0.5,
        on_pass: Callable[[Conductor], None] | None = None,
        on_wait: Callable[[Conductor], None] | None = None,
        publish_close_s: float = PUBLISH_CLOSE_S,
    ) -> None:
        self.conductor = conductor
        self.timer_s = timer_s
        self.inbox_poll_s = inbox_poll_s
        self.on_pass = on_pass  # after every tick (print new events, say)
        self.on_wait = on_wait  # every inbox poll while waiting (refresh a live display, say)
        self.publish_close_s = publish_close_s
        self.ticks = 0
        self._wake = threading.Event()
        conductor.wake_on(self.wake)

    def wake(self) -> None:
        """Tick as soon as possible; safe from any thread."""
        self._wake.set()

    def run(self, *, forever: bool = False, stop: threading.Event | None = None) -> Summary:
        """Tick until the conductor has nothing more to do; raise ConductorError if main needs a human.

        `forever` (the service): keep ticking after that, since a person can always ask for more
        (a /rerun, a reopened pull request, a fixed main), until `stop` is set."""
        conductor = self.conductor
        conductor.start()
        cpu, wall = time.process_time(), time.monotonic()
        try:
            return self._loop(forever, stop or threading.Event())
        finally:
            # the last state shown before returning, unless GitHub holds it up: then after the next start
            if not conductor.close_publishing(self.publish_close_s):
                log.warning(
                    "publishing did not finish within %.0f s: what is not shown yet is shown after the next start",
                    self.publish_close_s,
                )
            # the conductor process's own CPU (agent and publishing threads included, training children not)
            conductor.store.state.driver_last_run = {
                "ticks": self.ticks,
                "cpu_seconds": round(time.process_time() - cpu, 3),
                "wall_seconds": round(time.monotonic() - wall, 3),
            }

    def _loop(self, forever: bool, stop: threading.Event) -> Summary:
        conductor = self.conductor
        while not stop.is_set():
            seen_inbox = conductor.store.inbox.last_id()
            self._wake.clear()
            conductor.tick()
            self.ticks += 1
            if self.on_pass:
                self.on_pass(conductor)
            if conductor.finished() and not forever:
                break
            self._wait(seen_inbox)
        if conductor.blocked and not forever:
            raise ConductorError(conductor.blocked)
        return conductor.summary()

    def _wait(self, seen_inbox: int) -> None:
        due_s = self.conductor.next_due_s()
        wait_s = self.timer_s if due_s is None else min(self.timer_s, max(MIN_WAIT_S, due_s))
        deadline = time.monotonic() + wait_s
        # work that can wait, until something arrives or is due
        self.conductor.idle(lambda: self._wake.is_set() or time.monotonic() >= deadline)
        while not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._wake.wait(timeout=min(self.inbox_poll_s, left)):
                return
            if self.on_wait:
                self.on_wait(self.conductor)
            if self.conductor.store.inbox.last_id() != seen_inbox:
                return
