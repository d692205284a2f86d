"""The webhook server: a signed delivery is stored in the inbox exactly once and wakes the
conductor; anything else is refused with a short JSON reason (401, 400, 413, 503), never a 500 or a
traceback; deliveries waiting together are written in one transaction, each answered by its own
row; and fifty deliveries at once through a real uvicorn server are each stored once."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

import bot.app.web
from bot.app.web import STORE_FAILED, create_app
from bot.github.webhooks import normalize
from bot.store import Store
from bot.store.inbox import Inbox

SECRET = "s3cret-for-the-tests"
EXAMPLES = Path(__file__).parents[1] / "github" / "webhook_examples"
HEALTH = {"conductor_last_tick": 1_700_000_000.5, "github_last_contact": None}


def vendored(event: str, action: str | None = None) -> dict[str, Any]:
    for payload in json.loads((EXAMPLES / f"{event}.json").read_text()):
        if payload.get("action") == action:
            return payload
    raise LookupError(f"no vendored {event}.{action}")


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def headers_for(
    event: str, body: bytes, *, delivery: str | None = None, signed: bool = True, **extra: Any
) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
    }
    if signed:
        headers["X-Hub-Signature-256"] = sign(body)
    headers.update(extra)
    return headers


class Wakes:
    """wake() as the conductor gives it: thread-safe, counts its calls."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.count += 1


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "autoresearch.db"


@pytest.fixture
def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
def client(store_path: Path, wakes: Wakes):
    app = create_app(store_path=store_path, secret=SECRET, wake=wakes, health=lambda: dict(HEALTH))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def deliver(
    client: TestClient,
    event: str,
    payload: Any = None,
    *,
    body: bytes | None = None,
    delivery: str | None = None,
    signed: bool = True,
    **extra: Any,
) -> httpx.Response:
    body = json.dumps(payload).encode() if body is None else body
    return client.post(
        "/webhook", content=body, headers=headers_for(event, body, delivery=delivery, signed=signed, **extra)
    )


def inbox(store_path: Path):
    store = Store(store_path)
    try:
        return store.inbox.all()
    finally:
        store.close()


def assert_clean_error(response: httpx.Response, status: int) -> None:
    """A short JSON error: the status given, no traceback, no secret."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"error"}
    assert "Traceback" not in response.text and 'File "' not in response.text and SECRET not in response.text


# --- storing --------------------------------------------------------------------------------------


def test_a_signed_delivery_is_stored_once_and_wakes_the_conductor(
    client: TestClient, store_path: Path, wakes: Wakes
) -> None:
    payload = vendored("pull_request", "closed")
    response = deliver(client, "pull_request", payload, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert response.status_code == 202
    assert response.json() == {"ok": True, "stored": "github:72d3162e-cc78-11e3-81ab-4c9367dc0958", "kind": "pr_closed"}
    [entry] = inbox(store_path)
    assert (entry.key, entry.kind, entry.author, entry.processed_at) == (
        "github:72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "github",
        "Codertocat",
        None,
    )
    assert entry.payload == normalize("pull_request", "72d3162e-cc78-11e3-81ab-4c9367dc0958", payload).to_payload()
    assert wakes.count == 1


def test_a_redelivery_is_answered_but_stored_and_woken_for_once(
    client: TestClient, store_path: Path, wakes: Wakes
) -> None:
    payload = vendored("check_run", "rerequested")
    first = deliver(client, "check_run", payload, delivery="same-delivery")
    again = deliver(client, "check_run", payload, delivery="same-delivery")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == {"ok": True, "detail": "duplicate delivery, already stored"}
    assert len(inbox(store_path)) == 1
    assert wakes.count == 1


def test_every_handled_vendored_example_is_stored_as_its_normalized_event(client: TestClient, store_path: Path) -> None:
    expected = {}
    for path in sorted(EXAMPLES.glob("*.json")):
        for i, payload in enumerate(json.loads(path.read_text())):
            delivery = f"{path.stem}-{i}"
            event = normalize(path.stem, delivery, payload)
            response = deliver(client, path.stem, payload, delivery=delivery)
            status = {"ping": 200, "ignored": 202}.get(event.kind, 202)
            assert response.status_code == status, (delivery, response.text)
            if event.kind not in ("ping", "ignored"):
                expected[f"github:{delivery}"] = event.to_payload()
    stored = {entry.key: entry.payload for entry in inbox(store_path)}
    assert stored == expected and len(stored) > 20


def test_a_failing_wake_still_answers_202_since_the_delivery_is_stored(store_path: Path) -> None:
    def wake() -> None:
        raise RuntimeError("the conductor's event is gone")

    with TestClient(create_app(store_path=store_path, secret=SECRET, wake=wake), raise_server_exceptions=False) as c:
        response = deliver(c, "pull_request", vendored("pull_request", "reopened"))
    assert response.status_code == 202
    assert len(inbox(store_path)) == 1


def test_a_workflow_delivery_tells_the_runner_and_stores_nothing(store_path: Path) -> None:
    changed = Wakes()
    with TestClient(
        create_app(store_path=store_path, secret=SECRET, runs_changed=changed), raise_server_exceptions=False
    ) as c:
        payload = {"action": "completed", "workflow_run": {"id": 30433642, "status": "completed"}}
        answers = [deliver(c, event, payload) for event in ("workflow_run", "workflow_job")]
        refused = deliver(c, "workflow_run", payload, signed=False)
    assert [a.status_code for a in answers] == [202, 202] and refused.status_code == 401
    assert changed.count == 2 and inbox(store_path) == []


# --- refusing -------------------------------------------------------------------------------------


def test_a_missing_or_wrong_signature_is_401_and_stores_nothing(
    client: TestClient, store_path: Path, wakes: Wakes
) -> None:
    body = json.dumps(vendored("pull_request", "closed")).encode()
    cases = [
        {},  # no signature header
        {"X-Hub-Signature-256": sign(body, "another secret")},
        {"X-Hub-Signature-256": sign(body + b" ")},  # the body changed after signing
        {"X-Hub-Signature-256": sign(body).removeprefix("sha256=")},
        {"X-Hub-Signature-256": "sha256="},
        {"X-Hub-Signature": "sha1=" + hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()},
    ]
    answers = []
    for extra in cases:
        response = client.post(
            "/webhook", content=body, headers=headers_for("pull_request", body, signed=False, **extra)
        )
        assert_clean_error(response, 401)
        answers.append(response.json())
    assert all(answer == {"error": "signature missing or wrong"} for answer in answers)  # nothing to tell apart
    assert inbox(store_path) == [] and wakes.count == 0


def test_a_signed_request_without_the_github_headers_is_400(client: TestClient, store_path: Path) -> None:
    body = json.dumps(vendored("pull_request", "closed")).encode()
    for missing in ("X-GitHub-Event", "X-GitHub-Delivery"):
        headers = headers_for("pull_request", body)
        del headers[missing]
        response = client.post("/webhook", content=body, headers=headers)
        assert_clean_error(response, 400)
        assert missing in response.json()["error"]
    assert inbox(store_path) == []


def test_a_malformed_payload_is_400_with_the_reason(client: TestClient, store_path: Path) -> None:
    payload = vendored("pull_request", "closed")
    payload = {**payload, "pull_request": {**payload["pull_request"], "number": "2"}}
    response = deliver(client, "pull_request", payload)
    assert_clean_error(response, 400)
    assert response.json()["error"] == "pull_request.closed: pull_request.number must be an integer, not a string"
    assert inbox(store_path) == []


def test_an_ignored_event_is_accepted_logged_once_and_not_stored(
    client: TestClient, store_path: Path, wakes: Wakes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.app.web"):
        response = deliver(client, "star", vendored("star", "created"), delivery="star-delivery-1")
    assert response.status_code == 202
    assert response.json() == {"ok": True, "ignored": "star.created"}
    lines = [r.getMessage() for r in caplog.records if r.name == "bot.app.web"]
    assert lines == ["ignored star.created delivery star-delivery-1"]
    assert inbox(store_path) == [] and wakes.count == 0


# GitHub's shape of an organization project's item (no repository: it belongs to the organization)
PROJECT_ITEM = {
    "action": "created",
    "projects_v2_item": {
        "id": 5678510,
        "node_id": "PVTI_lADOAWcTxs07G84AVqWu",
        "project_node_id": "PVT_kwDOAWcTxs07Gw",
        "content_node_id": "DI_lADOAWcTxs07G84AIjOy",
        "content_type": "DraftIssue",
        "creator": {"login": "Codertocat", "id": 21031067, "type": "User"},
        "created_at": "2022-06-08T20:34:26Z",
        "updated_at": "2022-06-08T20:34:26Z",
        "archived_at": None,
    },
    "organization": {"login": "Octocoders", "id": 38302899},
    "sender": {"login": "Codertocat", "id": 21031067, "type": "User"},
    "installation": {"id": 1, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMQ=="},
}


def test_an_event_name_with_digits_is_accepted_and_ignored(
    client: TestClient, store_path: Path, wakes: Wakes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.app.web"):
        item = deliver(client, "projects_v2_item", PROJECT_ITEM, delivery="project-item-1")
        project = deliver(client, "projects_v2", {**PROJECT_ITEM, "action": "edited"}, delivery="project-1")
    assert (item.status_code, project.status_code) == (202, 202)
    assert item.json() == {"ok": True, "ignored": "projects_v2_item.created"}
    assert project.json() == {"ok": True, "ignored": "projects_v2.edited"}
    assert "ignored projects_v2_item.created delivery project-item-1" in caplog.messages
    assert inbox(store_path) == [] and wakes.count == 0


def test_every_answer_to_a_delivery_is_logged_once_by_the_server_itself(
    client: TestClient, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The service leaves POST /webhook out of uvicorn's access log: each answer has its own line here."""
    payload = vendored("pull_request", "closed")
    body = json.dumps(payload).encode()
    with caplog.at_level(logging.INFO, logger="bot.app.web"):
        answers = [
            deliver(client, "pull_request", payload, delivery="d1").status_code,
            deliver(client, "pull_request", payload, delivery="d1").status_code,
            deliver(client, "ping", vendored("ping"), delivery="p1").status_code,
            deliver(client, "workflow_run", {"action": "completed"}, delivery="w1").status_code,
            deliver(client, "pull_request", payload, signed=False).status_code,
            deliver(client, "pull_request", body=b"not json").status_code,
            client.post(
                "/webhook", content=body, headers={**headers_for("pull_request", body), "Content-Length": str(10**9)}
            ).status_code,
        ]
    assert answers == [202, 200, 200, 202, 401, 400, 413]
    lines = [r.getMessage() for r in caplog.records if r.name == "bot.app.web"]
    assert lines[:4] == [
        "stored pull_request.closed delivery d1 as pr_closed",
        "delivery d1 (pull_request) was already stored",
        "ping delivery p1 answered",
        "workflow_run delivery w1: the runner will ask GitHub about its runs",
    ]
    assert lines[4].startswith("webhook refused from testclient: signature missing or wrong")
    assert lines[5:] == [
        "webhook from testclient refused with 400: the body is not JSON",
        "webhook from testclient refused with 413: the body is over 25 MB",
    ]


def test_the_services_access_log_leaves_out_webhooks_only() -> None:
    from bot.app.serve import not_a_webhook

    def access(method: str, path: str) -> logging.LogRecord:
        return logging.LogRecord(
            "uvicorn.access",
            logging.INFO,
            __file__,
            1,
            '%s - "%s %s HTTP/%s" %d',
            ("127.0.0.1:5000", method, path, "1.1", 202),
            None,
        )

    assert not not_a_webhook(access("POST", "/webhook")) and not not_a_webhook(access("POST", "/webhook?x=1"))
    assert not_a_webhook(access("GET", "/healthz")) and not_a_webhook(access("GET", "/webhook"))
    assert not_a_webhook(access("GET", "/")) and not_a_webhook(logging.LogRecord("x", 20, "f", 1, "plain", None, None))


def test_ping_answers_with_its_zen_and_stores_nothing(client: TestClient, store_path: Path, wakes: Wakes) -> None:
    response = deliver(client, "ping", vendored("ping"))
    assert response.status_code == 200
    assert response.json() == {"ok": True, "zen": "Anything added dilutes everything else."}
    assert inbox(store_path) == [] and wakes.count == 0


def test_a_body_over_25_mb_is_413_before_it_is_read(client: TestClient) -> None:
    body = b" " * (25 * 1024 * 1024 + 1)
    response = client.post("/webhook", content=body, headers=headers_for("push", b"", signed=False))
    assert_clean_error(response, 413)


def test_bodies_held_at_once_past_their_bound_are_503_and_their_bytes_are_given_back(
    client: TestClient, store_path: Path
) -> None:
    """An unsigned body can only be refused once it is read: a stranger opening many connections
    must not make the server hold 25 MB each."""
    buffered = client.app.state.buffered
    payload = vendored("pull_request", "closed")
    body = json.dumps(payload).encode()
    buffered.held = buffered.limit - len(body) + 1  # other requests hold all but one byte too few
    assert_clean_error(deliver(client, "pull_request", payload, delivery="busy-1"), 503)
    assert_clean_error(deliver(client, "pull_request", payload, delivery="busy-2", signed=False), 503)
    assert buffered.held == buffered.limit - len(body) + 1  # the refused bodies gave their bytes back
    buffered.held = 0  # the others answered
    assert deliver(client, "pull_request", payload, delivery="busy-1").status_code == 202  # redelivered
    deliver(client, "pull_request", payload, signed=False)
    deliver(client, "pull_request", body=b"not json")
    assert buffered.held == 0  # every answer, stored or refused, gives its body's bytes back
    assert [e.key for e in inbox(store_path)] == ["github:busy-1"]


def test_a_streamed_body_past_the_limit_is_413(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bot.app.web, "MAX_BODY_BYTES", 1000)
    chunks = (b"x" * 300 for _ in range(4))  # no Content-Length: chunked
    response = client.post("/webhook", content=chunks, headers=headers_for("push", b""))
    assert_clean_error(response, 413)


# --- the inbox writer ------------------------------------------------------------------------------


def test_deliveries_waiting_together_are_written_in_one_transaction_and_each_answered_exactly(
    store_path: Path, wakes: Wakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the writer commits one delivery, nine more wait (two copies of d2, one redelivery of d0):
    they are written in the next single transaction, and each copy is answered 202 or 200 by its own
    row's insert."""
    batches: list[list[str]] = []
    entered, release = threading.Event(), threading.Event()
    real = Inbox.add_many

    def gated(self: Inbox, entries: list[dict[str, Any]], **kwargs: Any) -> list[bool]:
        batches.append(sorted(e["key"] for e in entries))
        if len(batches) == 1:
            entered.set()
            release.wait(timeout=30)
        return real(self, entries, **kwargs)

    monkeypatch.setattr(Inbox, "add_many", gated)
    app = create_app(store_path=store_path, secret=SECRET, wake=wakes)
    writer = app.state.inbox_writer
    payload = vendored("pull_request", "closed")
    later = ["d1", "d2", "d0", "d3", "d2", "d4", "d5", "d6", "d7"]
    with TestClient(app, raise_server_exceptions=False) as c, ThreadPoolExecutor(max_workers=10) as pool:
        first = pool.submit(deliver, c, "pull_request", payload, delivery="d0")
        assert entered.wait(timeout=30)
        rest = [(d, pool.submit(deliver, c, "pull_request", payload, delivery=d)) for d in later]
        with writer.ready:  # every one of them handed to the writer, none written yet
            assert writer.ready.wait_for(lambda: len(writer.waiting) == len(later), timeout=30)
        release.set()
        answers = [("d0", first.result(timeout=30))] + [(d, f.result(timeout=30)) for d, f in rest]
    assert batches == [["github:d0"], sorted(f"github:{d}" for d in later)]
    statuses: dict[str, list[int]] = {}
    for delivery, response in answers:
        statuses.setdefault(delivery, []).append(response.status_code)
    assert {d: sorted(s) for d, s in statuses.items()} == {
        "d0": [200, 202],
        "d1": [202],
        "d2": [200, 202],
        "d3": [202],
        "d4": [202],
        "d5": [202],
        "d6": [202],
        "d7": [202],
    }
    assert sorted(e.key for e in inbox(store_path)) == sorted(f"github:d{i}" for i in range(8))
    assert wakes.count == 8


def test_a_delivery_is_answered_once_another_writer_lets_go_of_the_store(
    store_path: Path, wakes: Wakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conductor holds the write lock: the delivery waits (polling, not in SQLite's busy
    handler) and is answered 202 once the lock is free, its row committed."""
    entered = threading.Event()
    real = Inbox.add_many

    def watched(self: Inbox, entries: list[dict[str, Any]], **kwargs: Any) -> list[bool]:
        entered.set()
        return real(self, entries, **kwargs)

    monkeypatch.setattr(Inbox, "add_many", watched)
    app = create_app(store_path=store_path, secret=SECRET, wake=wakes)
    other = sqlite3.connect(store_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with TestClient(app, raise_server_exceptions=False) as c, ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(deliver, c, "pull_request", vendored("pull_request", "closed"), delivery="waited")
        assert entered.wait(timeout=30)
        other.execute("COMMIT")
        assert answer.result(timeout=30).status_code == 202
    other.close()
    assert [e.key for e in inbox(store_path)] == ["github:waited"] and wakes.count == 1


def test_a_large_body_is_checked_on_a_worker_thread_with_the_same_answers(
    client: TestClient, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bot.app.web, "LOOP_BODY_BYTES", 100)  # every body here is larger
    payload = vendored("pull_request", "closed")
    assert deliver(client, "pull_request", payload, delivery="big").status_code == 202
    assert_clean_error(deliver(client, "pull_request", payload, signed=False), 401)
    assert_clean_error(deliver(client, "pull_request", body=b"[" * 200), 400)
    assert [e.key for e in inbox(store_path)] == ["github:big"]


def test_the_writer_stops_with_the_app_and_starts_again_with_it(store_path: Path, wakes: Wakes) -> None:
    app = create_app(store_path=store_path, secret=SECRET, wake=wakes)
    payload = vendored("pull_request", "closed")
    for delivery in ("before", "after"):
        with TestClient(app, raise_server_exceptions=False) as c:
            assert deliver(c, "pull_request", payload, delivery=delivery).status_code == 202
        assert not app.state.inbox_writer.thread.is_alive()  # its connection closed with it
    assert [e.key for e in inbox(store_path)] == ["github:before", "github:after"]


# --- failures of the store and of the app ---------------------------------------------------------


def test_a_store_failure_is_503_without_a_traceback_and_a_redelivery_then_stores_it(
    client: TestClient, store_path: Path, wakes: Wakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(self: Inbox, **kwargs: Any) -> bool:
        raise sqlite3.OperationalError("database or disk is full")

    payload = vendored("pull_request", "closed")
    with monkeypatch.context() as patch:
        patch.setattr(Inbox, "add", full_disk)
        response = deliver(client, "pull_request", payload, delivery="retry-me")
    assert_clean_error(response, 503)
    assert response.json() == {"error": STORE_FAILED}
    assert inbox(store_path) == [] and wakes.count == 0
    assert deliver(client, "pull_request", payload, delivery="retry-me").status_code == 202  # redelivered
    assert [e.key for e in inbox(store_path)] == ["github:retry-me"]


def test_a_store_that_cannot_be_opened_any_more_is_503_for_deliveries_and_health(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(store_path=store_path, secret=SECRET)
    for leftover in store_path.parent.iterdir():  # the database replaced by a directory
        leftover.unlink()
    store_path.mkdir()
    with TestClient(app, raise_server_exceptions=False) as c:
        assert_clean_error(deliver(c, "pull_request", vendored("pull_request", "closed")), 503)
        health = c.get("/healthz")
    assert health.status_code == 503
    assert health.json()["store"].startswith("cannot read the store: ")


def test_create_app_refuses_an_empty_secret_and_a_path_that_cannot_hold_a_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="webhook secret is required"):
        create_app(store_path=tmp_path / "a.db", secret="")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        create_app(store_path=tmp_path / "file" / "a.db", secret=SECRET)


def test_an_unexpected_error_is_a_json_500_without_a_traceback(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(bot.app.web, "normalize", broken)
    response = deliver(client, "pull_request", vendored("pull_request", "closed"))
    assert_clean_error(response, 500)


# --- health ---------------------------------------------------------------------------------------


def test_healthz_reports_the_store_and_what_the_conductor_said(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "store": "ok", **HEALTH}


def test_healthz_is_503_when_health_says_the_service_is_not_ok(store_path: Path) -> None:
    report = {"ok": False, "conductor": "stopped", "conductor_detail": "ImportError: no torch"}
    with TestClient(create_app(store_path=store_path, secret=SECRET, health=lambda: dict(report))) as c:
        response = c.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {**report, "store": "ok"}


def test_healthz_is_503_when_the_store_cannot_be_read(client: TestClient, store_path: Path) -> None:
    for leftover in store_path.parent.glob(store_path.name + "*"):  # the file, its WAL and shared memory
        leftover.unlink()
    store_path.write_bytes(b"not a database, but long enough to have a header " * 4)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "store": "cannot read the store: file is not a database", **HEALTH}


def test_healthz_is_503_when_health_itself_fails(store_path: Path) -> None:
    def health() -> dict:
        raise RuntimeError("no tick yet")

    with TestClient(
        create_app(store_path=store_path, secret=SECRET, health=health), raise_server_exceptions=False
    ) as c:
        response = c.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "store": "ok", "health": "could not collect: no tick yet"}


def test_the_secret_never_reaches_the_log(
    client: TestClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with caplog.at_level(logging.DEBUG):
        deliver(client, "pull_request", vendored("pull_request", "closed"))
        deliver(client, "pull_request", vendored("pull_request", "closed"), signed=False)
        deliver(client, "star", vendored("star", "created"))
        monkeypatch.setattr(Inbox, "add", lambda self, **kw: (_ for _ in ()).throw(sqlite3.OperationalError()))
        deliver(client, "pull_request", vendored("pull_request", "reopened"))
    assert caplog.records and SECRET not in caplog.text


# --- bad inputs, table ----------------------------------------------------------------------------

PUSH = json.dumps(vendored("push", None)).encode()
PR_COMMENT = {
    **vendored("issue_comment", "created"),
    "comment": {**vendored("issue_comment", "created")["comment"], "body": "half an emoji \ud83d and a NUL \u0000"},
}
PR_COMMENT["issue"] = {**PR_COMMENT["issue"], "pull_request": {"url": "https://example.invalid/pulls/1"}}
DEEP = b"[" * 100_000 + b"]" * 100_000


def _case(event: Any, body: bytes, status: int, *, id: str, signed: bool = True, **headers: Any):
    return pytest.param(event, body, status, signed, headers, id=id)


BAD_INPUTS = [
    _case("push", b"\x00\xffgarbage", 401, signed=False, id="unsigned garbage"),
    _case("push", b"\x00\xffgarbage", 400, id="signed garbage"),
    _case("push", b"", 400, id="empty body"),
    _case("push", b'{"ref": "\xff\xfe"}', 400, id="not utf-8"),
    _case("push", b"null", 400, id="json null"),
    _case("push", b"[]", 400, id="json array"),
    _case("push", b'[{"ref": "refs/heads/main"}]', 400, id="array of objects"),
    _case("push", b'"refs/heads/main"', 400, id="json string"),
    _case("push", b"3", 400, id="json number"),
    _case("push", DEEP, 400, id="nested 100000 deep"),
    _case("push", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, id="objects nested 50000 deep"),
    _case("push", b'{"n": ' + b"9" * 10_000 + b"}", 400, id="10000-digit number"),
    _case("push", b'{"ref": null, "repository": null, "commits": [null], "sender": null}', 400, id="nested nulls"),
    _case(
        "push",
        b'{"ref": "refs/heads/main", "before": "a", "after": "b", "repository": {"full_name": null}}',
        400,
        id="null full_name",
    ),
    _case("pull_request", b'{"action": "closed", "pull_request": null, "repository": {}}', 400, id="null pr"),
    _case("pull_request", b'{"action": ["closed"]}', 400, id="action of the wrong type"),
    _case(
        "issue_comment",
        b'{"action": "created", "issue": null, "comment": {"body": null}}',
        400,
        id="comment without issue",
    ),
    _case("ping", b'{"zen": NaN, "hook_id": Infinity}', 200, id="NaN in a ping"),
    _case("issue_comment", json.dumps(PR_COMMENT).encode(), 202, id="lone surrogate and NUL in a comment"),
    _case("push", PUSH, 202, **{"Content-Type": "text/plain"}, id="wrong content type, signed"),
    _case(
        "push",
        PUSH,
        401,
        signed=False,
        **{"Content-Type": "application/x-www-form-urlencoded"},
        id="wrong content type, unsigned",
    ),
    _case(
        "push",
        b"payload=%7B%7D",
        400,
        **{"Content-Type": "application/x-www-form-urlencoded"},
        id="form-encoded delivery",
    ),
    _case("a" * 100_000, PUSH, 400, id="huge event header"),
    _case("push", PUSH, 400, **{"X-GitHub-Delivery": "d" * 100_000}, id="huge delivery header"),
    _case("push", PUSH, 400, **{"X-GitHub-Delivery": b"\xff\xfe\x80"}, id="non-ascii delivery header"),
    _case(b"p\xffush", PUSH, 400, id="non-ascii event header"),
    _case("push", PUSH, 400, **{"X-GitHub-Delivery": "../../etc/passwd"}, id="path in delivery header"),
    _case("push", PUSH, 400, **{"X-GitHub-Delivery": ""}, id="empty delivery header"),
    _case("PUSH", PUSH, 400, id="event name in capitals"),
    _case("projects_v2_status_update", PUSH, 202, id="event name with a digit"),
    _case("e" * 64, PUSH, 202, id="event name of 64 characters"),
    _case("e" * 65, PUSH, 400, id="event name of 65 characters"),
    _case("2fa", PUSH, 400, id="event name starting with a digit"),
    _case("pull-request", PUSH, 400, id="event name with a hyphen"),
    _case("push ", PUSH, 400, id="event name with a space"),
    _case("push", PUSH, 401, signed=False, **{"X-Hub-Signature-256": b"sha256=\xff\xfe"}, id="non-ascii signature"),
    _case("push", PUSH, 401, signed=False, **{"X-Hub-Signature-256": "sha256=" + "a" * 100_000}, id="huge signature"),
    _case("push", PUSH, 401, signed=False, **{"X-Hub-Signature-256": "sha256=" + sign(PUSH)}, id="sign twice"),
]


@pytest.mark.parametrize(("event", "body", "status", "signed", "headers"), BAD_INPUTS)
def test_bad_inputs_are_refused_with_a_json_reason_never_a_500_or_a_traceback(
    client: TestClient, event: Any, body: bytes, status: int, signed: bool, headers: dict[str, Any]
) -> None:
    request_headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
    }
    if signed:
        request_headers["X-Hub-Signature-256"] = sign(body)
    request_headers.update(headers)
    response = client.post("/webhook", content=body, headers=request_headers)
    if status >= 400:
        assert_clean_error(response, status)
    else:
        assert response.status_code == status, response.text
        assert response.json()["ok"] is True


def test_other_paths_and_methods_answer_json_errors(client: TestClient) -> None:
    assert_clean_error(client.get("/webhook"), 405)
    assert_clean_error(client.put("/webhook", content=b"{}"), 405)
    assert_clean_error(client.post("/healthz", content=b"{}"), 405)
    for path in ("/docs", "/redoc", "/openapi.json", "/.env", "/state.db", "/webhook/../healthz/x"):
        assert_clean_error(client.get(path), 404)
    assert_clean_error(client.post("/elsewhere", content=b"{}"), 404)


# --- a real server under load ---------------------------------------------------------------------


def test_fifty_concurrent_deliveries_through_uvicorn_are_each_stored_once(store_path: Path, wakes: Wakes) -> None:
    """50 deliveries, each sent twice at the same moment (100 requests in flight): 50 rows."""
    app = create_app(store_path=store_path, secret=SECRET, wake=wakes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/webhook"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    body = json.dumps(vendored("pull_request", "closed")).encode()
    start = threading.Barrier(100, timeout=20)

    # one client (httpx's is thread-safe) with a connection per request in flight
    http = httpx.Client(timeout=20, limits=httpx.Limits(max_connections=100, max_keepalive_connections=100))

    def send(i: int) -> tuple[int, float]:
        headers = headers_for("pull_request", body, delivery=f"load-{i % 50}")
        start.wait()
        began = time.monotonic()
        response = http.post(url, content=body, headers=headers)
        return response.status_code, time.monotonic() - began

    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started
        with ThreadPoolExecutor(max_workers=100) as pool:
            results = list(pool.map(send, range(100)))
    finally:
        http.close()
        server.should_exit = True
        thread.join(timeout=10)
    assert Counter(status for status, _ in results) == {202: 50, 200: 50}
    assert sorted(e.key for e in inbox(store_path)) == sorted(f"github:load-{i}" for i in range(50))
    assert wakes.count == 50
