"""The inbox: every external input, written first, applied by the conductor exactly once.

Senders (the CLI now, the webhook server later) call `submit()`, which only writes a row with the
sender's idempotency key: the same key twice is one entry. On each tick the conductor calls
`apply_inbox()`, which applies every new entry through the handler registered for its kind, and
marks it processed in the same transaction as the handler's own writes, so a conductor killed
half-way applies it again from scratch, never twice. An entry that cannot be applied (an unknown
kind, a bad payload) is marked processed with the reason and never blocks the ones after it.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

from bot.store import InboxEntry, Store, failpoint

log = logging.getLogger(__name__)

Handler = Callable[[Store, InboxEntry], str]
HANDLERS: dict[str, Handler] = {}


class RejectedInput(ValueError):
    """An inbox entry that cannot be applied; the message says why."""


def on(kind: str) -> Callable[[Handler], Handler]:
    """Register the handler of one kind of entry; it writes through the store and says what it did."""
    def register(handler: Handler) -> Handler:
        HANDLERS[kind] = handler
        return handler
    return register


def submit(store: Store, kind: str, payload: dict[str, Any] | None = None, *, author: str,
           key: str | None = None) -> bool:
    """Write one input to the inbox (a new key: a fresh uuid). False if `key` was seen before."""
    if kind not in HANDLERS:
        raise RejectedInput(f"unknown input {kind!r}: one of {', '.join(sorted(HANDLERS))}")
    return store.add_inbox(key=key or f"cli-{uuid.uuid4()}", kind=kind, payload=payload or {}, author=author)


def apply_inbox(store: Store) -> int:
    """Apply every entry not yet processed, in order; returns how many were applied."""
    applied = 0
    for entry in store.pending_inbox():
        handler = HANDLERS.get(entry.kind)
        try:
            with store.transaction():
                if handler is None:
                    raise RejectedInput(f"unknown input {entry.kind!r}")
                if not isinstance(entry.payload, dict):
                    raise RejectedInput(f"its payload must be a JSON object, not {type(entry.payload).__name__}")
                outcome = handler(store, entry)
                store.mark_processed(entry.id, outcome)
                store.event(None, "inbox", f"{entry.kind} from {entry.author}: {outcome}")
        except sqlite3.OperationalError as error:  # the store's fault, not the entry's: it waits for a later tick
            log.warning("inbox entry %s (%s) not applied yet, the store could not take it (%s): trying again on "
                        "the next tick", entry.id, entry.kind, error)
            break
        except Exception as error:  # noqa: BLE001 - one bad entry must never block the ones after it
            store.mark_processed(entry.id, f"rejected: {error}")
            store.event(None, "inbox", f"{entry.kind} from {entry.author} rejected: {error}")
            log.warning("inbox entry %s (%s) rejected: %s", entry.id, entry.kind, error)
            continue
        failpoint("inbox_applied")
        applied += 1
    return applied


@on("steer")
def steer(store: Store, entry: InboxEntry) -> str:
    text = str(entry.payload.get("text", "")).strip()
    if not text:
        raise RejectedInput("steer needs a text, e.g. autoresearch steer \"try a lower learning rate\"")
    store.add_feedback(entry.author, text)
    return f"the agent will read: {text!r}"


@on("pause")
def pause(store: Store, entry: InboxEntry) -> str:
    store.set_setting("paused", "1")
    return "paused: running experiments finish, nothing new is proposed"


@on("resume")
def resume(store: Store, entry: InboxEntry) -> str:
    store.set_setting("paused", "0")
    return "resumed"
