"""The inbox: every external input, written first, applied by the conductor exactly once.

The CLI calls `submit()` for the loop's own inputs (`router` here: steer, pause, resume), which
only writes a row with the sender's idempotency key: the same key twice is one entry; the webhook
server and the poller write GitHub's events the same way. On each tick the conductor calls
`apply_inbox()` with the router the app joined (bot.core.router: the service's adds the GitHub
events of bot.github.handlers), which applies every new entry through the handler of its kind and
marks it processed in the same transaction as the handler's own writes, so a conductor killed
half-way applies it again from scratch, never twice. An entry that cannot be applied (a kind the
router does not know, a bad payload) is marked processed with the reason and never blocks the ones
after it.

A handler that cannot decide yet (GitHub could not say whether a commenter may steer) raises
Deferred: its writes are rolled back, the entry stays pending for the next tick, and so do the later
entries of the same kind in this pass, so a person's commands still apply in the order they were
written; entries of other kinds go on. The handler owns the bound: it gives an entry up (processed,
with the reason) once it has waited long enough, so nothing waits forever.

Entries are applied in batches, one transaction per batch (at most BATCH_ENTRIES entries or
BATCH_SECONDS of work), each entry inside its own savepoint: a handler that fails rolls back only
its own writes. A burst of deliveries then costs the store a few commits rather than one per entry,
and the webhook server's inserts wait behind a few short transactions rather than thousands.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any

from bot.core.router import Deferred, RejectedInput, Router
from bot.store import InboxEntry, Store, failpoint

log = logging.getLogger(__name__)

InboxHandler = Callable[[Store, InboxEntry], str]  # writes through the store, returns what it did
router: Router[InboxHandler] = Router()  # the loop's own inputs


def submit(
    store: Store, kind: str, payload: dict[str, Any] | None = None, *, author: str, key: str | None = None
) -> bool:
    """Write one of the loop's own inputs to the inbox (a new key: a fresh uuid). False if `key`
    was seen before."""
    if router.handler(kind) is None:
        raise RejectedInput(f"unknown input {kind!r}: one of {', '.join(router.kinds)}")
    return store.inbox.add(key=key or f"cli-{uuid.uuid4()}", kind=kind, payload=payload or {}, author=author)


def apply_inbox(store: Store, routes: Router[InboxHandler]) -> int:
    """Apply every entry not yet processed, in order, through `routes`; returns how many were applied."""
    pending = store.inbox.pending()
    applied = done = 0
    waiting: dict[str, str] = {}  # kind -> why its entries wait for the next tick
    while done < len(pending):
        try:
            with store.transaction():
                batch = _apply_batch(store, routes, pending[done:], waiting)
        except sqlite3.OperationalError as error:  # the store's fault, not an entry's: they wait for a later tick
            log.warning(
                "%d inbox entries from id %s on not applied yet, the store could not take them (%s): "
                "trying again on the next tick",
                len(pending) - done,
                pending[done].id,
                error,
            )
            break
        failpoint("inbox_applied")  # the crash tests: the batch is committed
        done += len(batch)
        applied += sum(taken is True for taken in batch)
    for kind, why in waiting.items():
        left = sum(entry.kind == kind for entry in store.inbox.pending())
        log.warning("%d %s inbox entries wait for the next tick: %s", left, kind, why)
    return applied


BATCH_ENTRIES = 200  # entries per transaction at most
BATCH_SECONDS = 0.02  # and about this much work: the webhook server's inserts wait while it is held


def _apply_batch(
    store: Store, routes: Router[InboxHandler], entries: list[InboxEntry], waiting: dict[str, str]
) -> list[bool | None]:
    """Apply entries, in order, inside the caller's transaction until the batch is full; for each
    entry taken, whether it was applied (False: rejected, None: deferred, left pending). An entry
    whose kind is in `waiting` (an earlier one of its kind was deferred) is deferred unread; a
    deferral adds its kind.

    Each entry's writes go in a savepoint: a handler's failure rolls back its own writes only, and
    the entry is marked rejected with the reason. A store error (sqlite3.OperationalError)
    propagates, so the caller rolls back the whole batch and it is applied again later."""
    started = time.monotonic()
    taken: list[bool | None] = []
    for entry in entries:
        if len(taken) >= BATCH_ENTRIES or (taken and time.monotonic() - started > BATCH_SECONDS):
            break
        if entry.kind in waiting:
            taken.append(None)
            continue
        try:
            with store.savepoint():
                _apply(store, routes, entry)
        except sqlite3.OperationalError:
            raise
        except Deferred as why:
            waiting[entry.kind] = f"entry {entry.id} ({entry.author}): {why}"
            taken.append(None)
            continue
        except Exception as error:  # noqa: BLE001 - one bad entry must never block the ones after it
            store.inbox.mark_processed(entry.id, f"rejected: {error}")
            store.events.add(None, "inbox", f"{entry.kind} from {entry.author} rejected: {error}")
            log.warning("inbox entry %s (%s) rejected: %s", entry.id, entry.kind, error)
            taken.append(False)
            continue
        taken.append(True)
    return taken


def _apply(store: Store, routes: Router[InboxHandler], entry: InboxEntry) -> None:
    handler = routes.handler(entry.kind)
    if handler is None:
        raise RejectedInput(f"unknown input {entry.kind!r}")
    if not isinstance(entry.payload, dict):
        raise RejectedInput(f"its payload must be a JSON object, not {type(entry.payload).__name__}")
    outcome = handler(store, entry)
    store.inbox.mark_processed(entry.id, outcome)
    store.events.add(None, "inbox", f"{entry.kind} from {entry.author}: {outcome}")


@router.on("steer")
def steer(store: Store, entry: InboxEntry) -> str:
    text = str(entry.payload.get("text", "")).strip()
    if not text:
        raise RejectedInput('steer needs a text, e.g. autoresearch steer "try a lower learning rate"')
    store.feedback.add(entry.author, text)
    return f"the agent will read: {text!r}"


@router.on("pause")
def pause(store: Store, entry: InboxEntry) -> str:
    store.state.paused = True
    return "paused: running experiments finish, nothing new is proposed"


@router.on("resume")
def resume(store: Store, entry: InboxEntry) -> str:
    store.state.paused = False
    return "resumed"
