"""Applying the inbox: each entry through the handler its router names (a kind no router handles is
rejected, two handlers of one kind are refused), a bad entry is rejected with its reason, a store
that cannot take a write now loses nothing (the entry waits for a later tick), and entries are
applied in batches of one transaction each, every entry exactly once even when the conductor is
killed half-way."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bot.core.router import RejectedInput, Router
from bot.loop import inbox as events
from bot.loop.inbox import InboxHandler
from bot.store import InboxEntry, Store


def apply_inbox(store: Store, routes: Router[InboxHandler] = events.router) -> int:
    """The loop's own inputs unless `routes` says otherwise."""
    return events.apply_inbox(store, routes)


def with_handler(kind: str, handler: InboxHandler) -> Router[InboxHandler]:
    """The loop's own router joined with one more handler, as an app joins its routers."""
    extra: Router[InboxHandler] = Router()
    extra.on(kind)(handler)
    return Router(events.router, extra)


def test_a_bad_entry_is_rejected_and_the_next_applied(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.inbox.add(key="k1", kind="steer", payload={"text": ""}, author="bob")
    store.inbox.add(key="k2", kind="pause", payload={}, author="bob")
    assert apply_inbox(store) == 1
    first, second = store.inbox.all()
    assert first.outcome.startswith("rejected: steer needs a text") and second.outcome.startswith("paused")
    store.close()


def test_an_entry_no_router_handles_is_rejected_and_a_joined_router_applies_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.inbox.add(key="k1", kind="wave", payload={}, author="bob")
    assert apply_inbox(store) == 0
    assert store.inbox.all()[0].outcome == "rejected: unknown input 'wave'"
    store.inbox.add(key="k2", kind="wave", payload={}, author="bob")
    assert apply_inbox(store, with_handler("wave", lambda store, entry: "waved back")) == 1
    assert store.inbox.all()[1].outcome == "waved back"
    store.close()


def test_two_handlers_of_one_kind_cannot_be_joined() -> None:
    with pytest.raises(ValueError, match="two handlers for 'pause'"):
        with_handler("pause", lambda store, entry: "paused twice")


def test_only_the_loops_own_inputs_can_be_submitted(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with pytest.raises(RejectedInput, match="unknown input 'github': one of pause, resume, steer"):
        events.submit(store, "github", {}, author="bob")
    assert events.submit(store, "pause", author="bob") and store.inbox.all()[0].kind == "pause"
    store.close()


def test_a_locked_store_leaves_the_entry_pending_for_the_next_tick(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.inbox.add(key="k1", kind="pause", payload={}, author="bob")
    store.db.execute("PRAGMA busy_timeout = 50")  # the service waits 30 s; the test need not
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock (the web server, say)
    try:
        assert apply_inbox(store) == 0
        [entry] = store.inbox.pending()
        assert entry.outcome is None, "not rejected: the input is not lost"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert apply_inbox(store) == 1
    assert store.inbox.pending() == [] and store.inbox.all()[0].outcome.startswith("paused")
    assert store.state.paused
    store.close()


# --- batches --------------------------------------------------------------------------------------


def steers(store: Store, n: int, first: int = 0) -> None:
    with store.transaction():
        for i in range(first, first + n):
            store.inbox.add(key=f"k{i}", kind="steer", payload={"text": f"note {i}"}, author="bob")


def commits(store: Store) -> list[str]:
    """The statements that end a transaction on this connection, as they run."""
    seen: list[str] = []
    store.db.set_trace_callback(lambda sql: seen.append(sql) if sql in ("COMMIT", "ROLLBACK") else None)
    return seen


def test_entries_are_applied_in_batches_of_one_transaction_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "BATCH_SECONDS", 3600.0)  # only the count bounds a batch here
    store = Store(tmp_path / "state.db")
    steers(store, 450)
    ended = commits(store)
    assert apply_inbox(store) == 450
    assert ended == ["COMMIT"] * 3, "200 + 200 + 50 entries"
    assert store.inbox.pending() == [] and len(store.feedback.recent(1000)) == 450
    store.close()


def test_a_batch_ends_after_its_time_even_when_not_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "BATCH_SECONDS", -1.0)  # every entry is past the time: one entry a batch
    store = Store(tmp_path / "state.db")
    steers(store, 3)
    ended = commits(store)
    assert apply_inbox(store) == 3
    assert ended == ["COMMIT"] * 3
    store.close()


def test_a_failing_handler_rolls_back_only_its_own_writes_in_the_batch(tmp_path: Path) -> None:
    def half_done(store: Store, entry: InboxEntry) -> str:
        store.feedback.add(entry.author, "written before the failure")
        store.state.paused = True
        raise KeyError("a bug in the handler")

    store = Store(tmp_path / "state.db")
    steers(store, 1)
    store.inbox.add(key="bad", kind="half", payload={}, author="eve")
    steers(store, 1, first=1)
    ended = commits(store)
    assert apply_inbox(store, with_handler("half", half_done)) == 2
    assert ended == ["COMMIT"], "one batch"
    assert store.feedback.recent() == ["note 0", "note 1"] and not store.state.paused
    outcomes = [e.outcome for e in store.inbox.all()]
    assert outcomes[1] == "rejected: 'a bug in the handler'" and all(e.processed_at for e in store.inbox.all())
    assert [e["message"] for e in store.events.all()] == [
        "steer from bob: the agent will read: 'note 0'",
        "half from eve rejected: 'a bug in the handler'",
        "steer from bob: the agent will read: 'note 1'",
    ]
    store.close()


def test_a_store_error_in_a_batch_rolls_all_of_it_back_and_it_is_applied_once_later(tmp_path: Path) -> None:
    failures = [sqlite3.OperationalError("disk I/O error")]

    def flaky(store: Store, entry: InboxEntry) -> str:
        store.feedback.add(entry.author, "flaky")
        if failures:
            raise failures.pop()
        return "done"

    routes = with_handler("flaky", flaky)
    store = Store(tmp_path / "state.db")
    steers(store, 2)
    store.inbox.add(key="flaky", kind="flaky", payload={}, author="bob")
    steers(store, 1, first=2)
    assert apply_inbox(store, routes) == 0
    assert len(store.inbox.pending()) == 4 and store.feedback.recent() == [], "the whole batch rolled back"
    assert apply_inbox(store, routes) == 4
    assert store.feedback.recent() == ["note 0", "note 1", "flaky", "note 2"], "each entry once"
    store.close()


def test_the_batches_committed_before_the_store_locks_stay_and_the_rest_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "BATCH_ENTRIES", 2)
    monkeypatch.setattr(events, "BATCH_SECONDS", 3600.0)
    store = Store(tmp_path / "state.db")
    store.db.execute("PRAGMA busy_timeout = 50")
    steers(store, 5)
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    committed: list[str] = []

    def then_another_writer(name: str) -> None:  # right after a batch's commit, another writer takes the lock
        committed.append(name)
        if len(committed) == 1:
            other.execute("BEGIN IMMEDIATE")

    monkeypatch.setattr(events, "failpoint", then_another_writer)
    try:
        assert apply_inbox(store) == 2
        assert [e.key for e in store.inbox.pending()] == ["k2", "k3", "k4"]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert apply_inbox(store) == 3
    assert committed == ["inbox_applied"] * 3
    assert store.feedback.recent() == [f"note {i}" for i in range(5)]
    store.close()


CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from bot.core.router import Router
    from bot.loop import inbox as events
    from bot.store import Store

    store = Store(Path(sys.argv[1]))
    events.BATCH_ENTRIES, events.BATCH_SECONDS = 3, 3600.0
    routes = Router()

    @routes.on("steer")
    def steer_or_die(store, entry):
        if entry.payload["text"] == sys.argv[2]:
            os.kill(os.getpid(), signal.SIGKILL)
        return events.steer(store, entry)

    events.apply_inbox(store, routes)
    print("survived", flush=True)
""")


@pytest.mark.parametrize(
    ("failpoint", "dies_at", "committed"),
    [
        (None, "note 4", 3),  # killed half-way through the second batch: the first stays, the second is undone
        ("inbox_applied", None, 3),  # killed right after the first batch's commit
    ],
)
def test_a_conductor_killed_during_the_inbox_applies_each_entry_once_after_restart(
    tmp_path: Path, failpoint: str | None, dies_at: str | None, committed: int
) -> None:
    db_path = tmp_path / "state.db"
    store = Store(db_path)
    steers(store, 7)
    env = {k: v for k, v in os.environ.items() if k != "AUTORESEARCH_FAILPOINT"}
    if failpoint:
        env["AUTORESEARCH_FAILPOINT"] = failpoint
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(db_path), dies_at or "-"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[3],
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(store.feedback.recent(100)) == committed
    assert [e.key for e in store.inbox.pending()] == [f"k{i}" for i in range(committed, 7)]
    assert apply_inbox(store) == 7 - committed
    assert store.feedback.recent(100) == [f"note {i}" for i in range(7)], "each entry applied once"
    store.close()
