"""The forge's slow writes (an experiment's branch, its rebase onto a new main), made inline or off
the conductor's thread.

At 100 ms a GitHub call an experiment's branch takes 0.4-0.8 s (bench/duty_cycle.py), and with 8 or
16 runners a keep sends most experiments in flight to a rebase: made on the conductor's thread,
those calls are the gap in which freed slots wait for the tick. So the lifecycle asks for them
through `call(key, fn)`:

- `InlineCalls` runs `fn` on the conductor's own forge at once (the demo, the tests, a local
  forge): the lifecycle moves on in the same tick, as it always did.
- `ForgeWorker` runs it on one thread of its own, with a forge of its own (a PyGithub connection
  holds the request in flight, so threads never share one), and answers PENDING until it is done;
  then it wakes the driver, and the next tick takes the result (or the exception, which the
  lifecycle handles as it would have inline: a retry with backoff, a conflict's discard). One
  thread, so the bot's writes to GitHub stay serial, as GitHub asks of one client.

A call is known by its key: what it does and for which experiment (`key[:2]`, the call's slot),
then its inputs. One call per slot at a time: asked again with other inputs while one is queued,
the new call takes its place in the queue (a keep moves main under a wave of queued rebases: each
is made once, onto the newest main); while one is being made, the answer is PENDING until it
ends, its result is then dropped as stale and the new call made. Every call the lifecycle makes this way is safe to repeat (the branch name is its
idempotency key), so a result lost to a restart costs only a repeat.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Final

from bot.core.protocols import Forge

log = logging.getLogger(__name__)


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Final = _Pending()  # the call is being made; ask again on a later tick

DONE_KEPT = 1024  # answers kept for the lifecycle to take; beyond it the oldest go (asked again, made again)
Key = tuple[Hashable, ...]  # (what, experiment id, inputs...)
Call = Callable[[Forge], Any]


class InlineCalls:
    """Each call made at once, on the conductor's forge."""

    def __init__(self, forge: Forge) -> None:
        self.forge = forge

    def call(self, key: Key, fn: Call) -> Any:
        return fn(self.forge)

    def holds(self, slot: Key) -> bool:
        """Nothing is ever held: a call ends when it returns."""
        return False

    def on_done(self, callback: Callable[[], None]) -> None:
        """Nothing to tell: every call is done when it returns."""

    def close(self, timeout: float | None = None) -> None:
        """Nothing to stop."""


class ForgeWorker:
    """Calls made one at a time on a thread with its own forge (made by `make_forge`, on that thread)."""

    def __init__(self, make_forge: Callable[[], Forge], *, name: str = "forge") -> None:
        self.make_forge = make_forge
        self.name = name
        self._lock = threading.Condition()
        self._queue: deque[tuple[Key, Call]] = deque()
        self._in_flight: dict[Key, Key] = {}  # slot -> the key of its call queued or being made
        self._done: dict[Key, tuple[Key, bool, Any]] = {}  # slot -> (key, ok, result or exception)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._notify: Callable[[], None] | None = None

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the worker's thread) each time a call ends: the driver ticks."""
        self._notify = callback

    def call(self, key: Key, fn: Call) -> Any:
        """The call's result (raising its exception) once it is done; until then PENDING, and the
        call is queued the first time it is asked for."""
        slot = key[:2]
        with self._lock:
            if slot in self._done:
                done_key, ok, result = self._done.pop(slot)
                if done_key == key:
                    if ok:
                        return result
                    raise result
                log.debug("dropped a stale forge call %r (now %r)", done_key, key)
            if slot in self._in_flight:
                if self._in_flight[slot] != key and self._replace_queued(slot, key, fn):
                    log.debug("a queued forge call of %r now has the inputs %r", slot, key[2:])
                return PENDING  # this call, or an older one of the slot being made, which must end first
            self._in_flight[slot] = key
            self._queue.append((key, fn))
            self._closing = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._lock.notify_all()
            return PENDING

    def _replace_queued(self, slot: Key, key: Key, fn: Call) -> bool:
        """Put `key` in the place of its slot's call while that one is still queued (under the lock)."""
        for index, (queued, _) in enumerate(self._queue):
            if queued[:2] == slot:
                self._queue[index] = (key, fn)
                self._in_flight[slot] = key
                return True
        return False  # being made

    def holds(self, slot: Key) -> bool:
        """Whether a call of this slot (what, experiment id) is queued, being made, or done and not
        yet taken."""
        with self._lock:
            return slot in self._in_flight or slot in self._done

    def busy(self) -> int:
        """Calls queued or being made."""
        with self._lock:
            return len(self._in_flight)

    def close(self, timeout: float | None = None) -> None:
        """End the thread once the call being made ends (waiting at most `timeout`); calls queued
        and not started are forgotten (asked again, they are made then). A later call starts another."""
        with self._lock:
            for key, _ in self._queue:
                self._in_flight.pop(key[:2], None)
            self._queue.clear()
            self._closing = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _work(self) -> None:
        forge: Forge | None = None
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    self._thread = None
                    return
                key, fn = self._queue.popleft()
            outcome: tuple[bool, Any] = (False, RuntimeError("the forge worker stopped in this call"))
            try:
                if forge is None:
                    forge = self.make_forge()
                outcome = (True, fn(forge))
            except Exception as error:  # noqa: BLE001 - the lifecycle handles it as it would inline
                outcome = (False, error)
            finally:  # whatever ended the call, its slot is free again and its answer is there
                with self._lock:
                    slot = key[:2]
                    self._in_flight.pop(slot, None)
                    self._done[slot] = (key, *outcome)
                    if len(self._done) > DONE_KEPT:  # answers nobody took (their experiment ended meanwhile)
                        del self._done[next(iter(self._done))]
                if self._notify is not None:
                    self._notify()
