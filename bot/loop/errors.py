"""Errors the loop goes on after: logged each time, recorded in the store's events once while they repeat.

A phase of the tick that fails (bot.loop.conductor) and a publisher that fails on its own worker
(bot.loop.publishing) are tried again on the next tick; the same failure at every tick would fill
the events with copies, so only a message that differs from the last one recorded is added. The
store may itself be what failed (a full disk): then the log line is all there is.
"""

from __future__ import annotations

import logging

from bot.store import Store

log = logging.getLogger(__name__)


class RepeatedErrors:
    """One thread's record of the errors it goes on after (each owner has its own store connection)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._last = ""  # the last message recorded

    def record(self, message: str) -> None:
        log.error("%s", message)
        if message == self._last:
            return
        self._last = message
        try:
            self.store.events.add(None, "error", message)
        except Exception:  # noqa: BLE001 - the store itself may be what failed (a full disk)
            log.exception("could not record the error in the store")
