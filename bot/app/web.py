"""The webhook server: verify the signature, store the delivery in the inbox, answer. Nothing else.

GitHub waits 10 seconds for an answer and shows a delivery that got none, or an error, as failed
(it can be redelivered from the App's settings). So this process never calls GitHub, a runner or an
agent: it writes one inbox row (key `github:<X-GitHub-Delivery>`, so a redelivery is stored once),
calls `wake()` so the conductor looks at the inbox now rather than at its next tick, and answers.
The conductor applies the entry later through bot.loop.inbox.

Answers, in the order they are decided:

- 413: a body over 25 MB (GitHub caps payloads there, so it is not GitHub);
- 503 while the bodies being received at once pass MAX_BUFFERED_BYTES: a body can only be judged
  once it is all read (the signature covers every byte), so without this bound anyone could make
  the server hold 25 MB per connection they open; GitHub redelivers what was refused;
- 401: `X-Hub-Signature-256` missing or wrong; nothing else is read from an unsigned request, and
  the answer says nothing more;
- 400: X-GitHub-Event or X-GitHub-Delivery missing (or not a name: lowercase letters, digits and
  `_`, as in `projects_v2_item`, up to 64 characters), a body that is not a JSON object (the App must
  send `application/json`; the Content-Type header itself is not trusted or needed), or a payload
  that lacks a field the bot needs (bot.github.webhooks.MalformedPayload says which);
- 200 with GitHub's zen for a ping; 202 for an event the bot does not act on, whatever its name
  (logged, not stored);
- 202 once the delivery is stored, 200 when that delivery id was already stored;
- 503 when the store cannot be written: GitHub shows the delivery as failed, and redelivering it
  later stores it;
- 500, as JSON and without a traceback, for anything else (a bug: the traceback goes to the log).

The store is SQLite in WAL mode. The webhook handler runs on the event loop (its checks cost
microseconds; a body over 1 MB is checked on a worker thread) and hands its row to one writer
thread, which writes the rows of all waiting requests in one transaction and then answers each
request from its own row's insert: so an answer still means the row is committed, and 202 or 200
is exact even for two copies of a delivery in one transaction. /healthz runs in FastAPI's thread
pool and reads through the store's read-only pool (bot.store.pool: one connection per worker thread).
`wake` is called from the writer thread, once per new row, so it must be thread-safe (setting a
threading.Event is). The secret is never logged.

GET /healthz is for the container's health check and an operator: 200 when the store answers and
`health()` says the service is well, 503 otherwise, with `ok` and what each part said. It is open
to anyone who reaches the server, so `health()` must return nothing secret (bot.app.serve redacts).
Every other path or method answers a short JSON error (404, 405); no API docs are served.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from bot.github.webhooks import MalformedPayload, normalize, verify_signature
from bot.store import ReadPool, Store, StoreUnavailable
from bot.store.schema import SchemaTooNew

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 25 * 1024 * 1024  # GitHub caps webhook payloads at 25 MB
LOOP_BODY_BYTES = 1024 * 1024  # a body up to this size is checked on the event loop, a larger one on a thread
MAX_BUFFERED_BYTES = 4 * MAX_BODY_BYTES  # all the bodies held at once, read or being checked
BUSY = "the server is receiving too much at once; GitHub can redeliver this delivery later"
STORE_FAILED = "could not store the delivery; GitHub will show it as failed and it can be redelivered"
UNEXPECTED = "unexpected error; the delivery was not acted on and can be redelivered"
_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")  # GitHub's names: push, projects_v2_item, ...
_DELIVERY = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # GitHub sends a GUID
_LENGTH = re.compile(r"[0-9]{1,20}")
# what opening or writing the store raises when it cannot (a full disk, a lock held too long, a file
# replaced or upgraded by a newer release): the delivery is refused with 503 and can be redelivered
STORE_ERRORS = (sqlite3.Error, OSError, SchemaTooNew)


class _Refused(Exception):
    """An answer with an error status, decided while the body is read (its size, its length header)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Buffered:
    """The bytes of request bodies the server holds at once. Used on the event loop only (where
    bodies are read and answers sent), so a plain counter needs no lock."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


class _InboxWriter:
    """The one thread that writes deliveries to the inbox. A request hands over its row and awaits
    the outcome; the thread takes every row waiting, writes them all in one transaction (one fsync),
    and then settles each request: True stored, False already stored, or the store's error. So an
    answer still means the row is on disk, a burst costs a few commits rather than one per row, and
    no request waits in SQLite's busy handler (Inbox.add_many polls the lock instead)."""

    def __init__(self, path: Path, wake: Callable[[], None]) -> None:
        self.path, self.wake = path, wake
        self.waiting: list[tuple[dict[str, Any], asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.ready = threading.Condition()
        self.thread: threading.Thread | None = None
        self.closing = False

    async def add(self, **entry: Any) -> bool:
        """Store one row (Inbox.add's arguments); False if its key was already stored."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.ready:
            if self.closing:
                raise sqlite3.OperationalError("the webhook server is shutting down")
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="inbox-writer", daemon=True)
                self.thread.start()
            self.waiting.append((entry, loop, future))
            self.ready.notify()
        return await future

    def close(self) -> None:
        """Write what is waiting, then stop the thread (it closes its connection); a row added
        later starts a new one."""
        with self.ready:
            self.closing = True
            self.ready.notify()
            thread = self.thread
        if thread is not None:
            thread.join(timeout=60)
        with self.ready:
            self.closing = False

    def _run(self) -> None:
        store: Store | None = None  # this thread's own connection
        while True:
            with self.ready:
                while not self.waiting and not self.closing:
                    self.ready.wait()
                batch, self.waiting = self.waiting, []
            if not batch:  # closing, and nothing left
                break
            store, outcomes = self._write(store, [entry for entry, _, _ in batch])
            loops: dict[asyncio.AbstractEventLoop, list] = {}
            for (_, loop, future), outcome in zip(batch, outcomes, strict=True):
                loops.setdefault(loop, []).append((future, outcome))
            for loop, settled in loops.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # that loop is closed: nobody waits for these answers any more
                    pass
        if store is not None:
            store.close()

    def _write(self, store: Store | None, entries: list[dict[str, Any]]) -> tuple[Store | None, list[Any]]:
        """The connection to use next, and for each entry True, False or the exception to raise."""
        try:
            store = store or Store(self.path)
            stored = store.inbox.add_many(entries)
        except Exception as error:  # every request waiting must get an answer (503, or 500 for a bug)
            log.exception("could not write %d deliveries to the inbox", len(entries))
            if store is not None:  # a fresh connection for the next batch
                try:
                    store.close()
                except sqlite3.Error:
                    pass
            return None, [error] * len(entries)
        for new in stored:
            if new:
                try:
                    self.wake()
                except Exception:  # the delivery is stored: the conductor finds it on its next tick
                    log.exception("a delivery was stored, but waking the conductor failed")
        return store, list(stored)


def _settle(settled: list[tuple[asyncio.Future, Any]]) -> None:
    """On the requests' event loop: each waiting request gets its outcome (unless it was cancelled)."""
    for future, outcome in settled:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _refuse(request: Request, status: int, message: str) -> JSONResponse:
    """A delivery refused (400, 413): logged, as every answer to POST /webhook is logged here (the
    service leaves these requests out of uvicorn's access log), and answered with the reason."""
    log.warning("webhook from %s refused with %d: %s", request.client.host if request.client else "?", status, message)
    return _error(status, message)


async def _raw_body(request: Request, buffered: _Buffered) -> bytes:
    """The body as sent (the signature covers these exact bytes), refused past MAX_BODY_BYTES
    before it is all read, and while the bodies held at once would pass MAX_BUFFERED_BYTES. Its
    bytes stay counted in `buffered` until the caller gives them back (len(body))."""
    length = request.headers.get("content-length")
    if length is not None:
        if not _LENGTH.fullmatch(length):
            raise _Refused(400, "Content-Length must be a number of bytes")
        if int(length) > MAX_BODY_BYTES:
            raise _Refused(413, f"the body is over {MAX_BODY_BYTES // (1024 * 1024)} MB")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            if size + len(chunk) > MAX_BODY_BYTES:
                raise _Refused(413, f"the body is over {MAX_BODY_BYTES // (1024 * 1024)} MB")
            if not buffered.take(len(chunk)):
                raise _Refused(503, BUSY)
            size += len(chunk)
            chunks.append(chunk)
    except ClientDisconnect:
        buffered.give_back(size)
        raise _Refused(400, "the request ended before its body did") from None
    except BaseException:
        buffered.give_back(size)
        raise
    return b"".join(chunks)


WORKFLOW_EVENTS = ("workflow_run", "workflow_job")  # a training job on GitHub Actions moved


class _Webhooks:
    """POST /webhook: the body read within the memory cap, the checks (signature, headers, JSON),
    and the delivery stored in the inbox; nothing else (the conductor acts on it)."""

    def __init__(self, key: bytes, writer: _InboxWriter, buffered: _Buffered, runs_changed: Callable[[], None]) -> None:
        self.key, self.writer, self.buffered, self.runs_changed = key, writer, buffered, runs_changed

    async def handle(self, request: Request) -> JSONResponse:
        try:
            body = await _raw_body(request, self.buffered)
        except _Refused as error:
            return _refuse(request, error.status, error.message)
        try:
            return await self._deliver(request, body)
        except Exception:  # a bug must answer JSON, never a traceback
            log.exception("unexpected error handling a webhook delivery")
            return _error(500, UNEXPECTED)
        finally:
            self.buffered.give_back(len(body))

    async def _deliver(self, request: Request, body: bytes) -> JSONResponse:
        # The checks are CPU work of microseconds for GitHub's usual payloads, done on the event loop;
        # a large body (up to 25 MB) is hashed and parsed on a worker thread so the loop never stalls.
        if len(body) > LOOP_BODY_BYTES:
            checked = await run_in_threadpool(self._check, request, body)
        else:
            checked = self._check(request, body)
        if isinstance(checked, JSONResponse):
            return checked
        name, delivery, payload = checked
        if name in WORKFLOW_EVENTS:
            try:
                await run_in_threadpool(self.runs_changed)
            except Exception:  # the runner polls GitHub anyway
                log.exception("delivery %s (%s): telling the runner failed", delivery, name)
            log.info("%s delivery %s: the runner will ask GitHub about its runs", name, delivery)
            return JSONResponse({"ok": True, "detail": "the runner will ask GitHub about its runs"}, status_code=202)
        try:
            event = normalize(name, delivery, payload)
        except MalformedPayload as error:
            return _refuse(request, 400, str(error)[:500])
        if event.kind == "ping":
            log.info("ping delivery %s answered", delivery)
            zen = payload.get("zen")
            return JSONResponse({"ok": True, "zen": zen if isinstance(zen, str) else None})
        if event.kind == "ignored":
            log.info("ignored %s.%s delivery %s", name, event.action or "-", delivery)
            return JSONResponse({"ok": True, "ignored": f"{name}.{event.action or '-'}"}, status_code=202)
        inbox_key = f"github:{delivery}"
        try:
            stored = await self.writer.add(
                key=inbox_key, kind="github", payload=event.to_payload(), author=event.sender or "github"
            )
        except STORE_ERRORS as error:  # the writer logged it with its traceback
            log.warning("could not store delivery %s (%s): %s", delivery, name, error)
            return _error(503, STORE_FAILED)
        if not stored:
            log.info("delivery %s (%s) was already stored", delivery, name)
            return JSONResponse({"ok": True, "detail": "duplicate delivery, already stored"})
        log.info("stored %s.%s delivery %s as %s", name, event.action or "-", delivery, event.kind)
        return JSONResponse({"ok": True, "stored": inbox_key, "kind": event.kind}, status_code=202)

    def _check(self, request: Request, body: bytes) -> JSONResponse | tuple[str, str, dict[str, Any]]:
        """The signature, the headers and the JSON: a refusal, or the event's name, id and payload."""
        headers = request.headers
        if not verify_signature(self.key, body, headers.get("x-hub-signature-256")):
            log.warning(
                "webhook refused from %s: signature missing or wrong (if it came from GitHub, the "
                "secret here differs from the App's)",
                request.client.host if request.client else "?",
            )
            return _error(401, "signature missing or wrong")
        name, delivery = headers.get("x-github-event"), headers.get("x-github-delivery")
        if name is None or not _EVENT_NAME.fullmatch(name):
            return _refuse(request, 400, "X-GitHub-Event is missing or not an event name")
        if delivery is None or not _DELIVERY.fullmatch(delivery):
            return _refuse(request, 400, "X-GitHub-Delivery is missing or not a delivery id")
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
            hint = " (set the webhook's content type to application/json)" if body.startswith(b"payload=") else ""
            return _refuse(request, 400, f"the body is not JSON{hint}")
        if not isinstance(payload, dict):
            return _refuse(request, 400, "the body must be a JSON object")
        return name, delivery, payload


def _healthz(readers: ReadPool, health: Callable[[], dict]) -> Callable[[], JSONResponse]:
    """GET /healthz over the store's read-only connections and the service's health()."""

    def healthz() -> JSONResponse:
        """200 when the store answers and health() says all is well, 503 otherwise, with what failed."""
        healthy = True
        try:
            readers.check()
            store = "ok"
        except StoreUnavailable as error:
            store, healthy = f"cannot read the store: {error.reason}", False
        try:
            info: dict[str, Any] = jsonable_encoder(dict(health()))
        except Exception as error:  # a health report must not fail with a traceback
            log.exception("health() failed")
            info, healthy = {"health": f"could not collect: {error}"}, False
        healthy = healthy and info.pop("ok", True) is not False
        return JSONResponse({"ok": healthy, **info, "store": store}, status_code=200 if healthy else 503)

    return healthz


def create_app(
    *,
    store_path: Path,
    secret: str,
    wake: Callable[[], None] = lambda: None,
    health: Callable[[], dict] = dict,
    runs_changed: Callable[[], None] = lambda: None,
) -> FastAPI:
    """The webhook app over the store at `store_path` (created or migrated here, so a path that
    cannot hold a store stops the server at start rather than at the first delivery).

    `secret` is the App's webhook secret; `wake()` is called after each new delivery is stored;
    `health()` adds what GET /healthz reports beside the store (the conductor's state, its last tick,
    the last contact with GitHub); an `"ok": False` in it makes the answer 503 (the conductor
    stalled or stopped). It is shown to anyone who asks, so it must hold nothing secret. `runs_changed()` is
    called for a verified `workflow_run` or `workflow_job` delivery: a GitHub Actions run of a
    training job moved, and the runner asks GitHub now rather than at its next poll. Nothing of such a delivery is stored: the runner's polling is the record.
    """
    if not secret:
        raise ValueError(
            "a webhook secret is required: set the same one in the GitHub App's settings "
            "(without it anyone could post deliveries)"
        )
    key = secret.encode("utf-8")
    Store(store_path).close()  # schema created or migrated once, before any worker opens its own
    readers = ReadPool(store_path)  # /healthz reads through these
    writer = _InboxWriter(store_path, wake)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(writer.close)
        readers.close_all()

    # no /docs or /openapi.json: this server answers GitHub, not people
    app = FastAPI(title="autoresearch-bot webhooks", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.inbox_writer = writer  # for the tests: the rows waiting for it
    buffered = _Buffered(MAX_BUFFERED_BYTES)
    app.state.buffered = buffered  # for the tests: the bytes held

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.error("unexpected error answering %s %s", request.method, request.url.path, exc_info=error)
        return _error(500, UNEXPECTED)

    webhook = _Webhooks(key, writer, buffered, runs_changed)

    # A plain route, not @app.post: FastAPI's parameter machinery cost about 0.1 ms a delivery, for nothing
    # this endpoint uses (it reads the raw body itself, as the signature covers those exact bytes).
    app.router.add_route("/webhook", webhook.handle, methods=["POST"])

    app.get("/healthz")(_healthz(readers, health))
    return app
