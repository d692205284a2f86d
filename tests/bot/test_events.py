"""Applying the inbox: a bad entry is rejected with its reason, a store that cannot take a write
now loses nothing (the entry waits for a later tick)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.events import apply_inbox
from bot.store import Store


def test_a_bad_entry_is_rejected_and_the_next_applied(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_inbox(key="k1", kind="steer", payload={"text": ""}, author="bob")
    store.add_inbox(key="k2", kind="pause", payload={}, author="bob")
    assert apply_inbox(store) == 1
    first, second = store.inbox()
    assert first.outcome.startswith("rejected: steer needs a text") and second.outcome.startswith("paused")
    store.close()


def test_a_locked_store_leaves_the_entry_pending_for_the_next_tick(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_inbox(key="k1", kind="pause", payload={}, author="bob")
    store.db.execute("PRAGMA busy_timeout = 50")  # the service waits 30 s; the test need not
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock (the web server, say)
    try:
        assert apply_inbox(store) == 0
        [entry] = store.pending_inbox()
        assert entry.outcome is None, "not rejected: the input is not lost"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert apply_inbox(store) == 1
    assert store.pending_inbox() == [] and store.inbox()[0].outcome.startswith("paused")
    assert store.get_setting("paused") == "1"
    store.close()
