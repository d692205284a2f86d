"""The dashboard's event stream, /api/stream: server-sent events for one client each, fed by one
look at the store a second shared by every stream open on an event loop.

Events: `state` (the whole state) when the store changed, `progress` (the running slots only)
when only the runs' progress moved, `problem` when the store cannot be read, and a comment every
HEARTBEAT_S. At most MAX_STREAMS streams are open at once (more answer 503 with Retry-After, and
the page polls /api/state meanwhile); each ends after STREAM_S, or once its client has taken
nothing for SEND_S, so a client that stops reading holds its place for at most STREAM_S + SEND_S,
and never a thread (a stream is a coroutine; only the feed's look runs on a worker thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from bot.views.dashboard_state import Look, encode

if TYPE_CHECKING:
    from bot.views.dashboard import Dashboard

log = logging.getLogger(__name__)

CHECK_S = 1.0  # how often a stream looks for a change
HEARTBEAT_S = 15.0  # a comment on a quiet stream, so proxies and phones keep it open
STREAM_S = 60.0  # a stream ends after this long; the browser reconnects (a state only if it changed), so an
# open page never holds up a server's shutdown for longer
MAX_STREAMS = 16  # open /api/stream responses at once; past it 503 (the page polls /api/state meanwhile)
SEND_S = 10.0  # a stream whose client has not taken an event for this long stopped reading: it is closed


class Feed:
    """The looks at the store for every stream open on one event loop: one look each CHECK_S,
    however many streams wait for it, taken on a worker thread while at least one is open."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        self.latest: Look | None = None
        self.fresh = asyncio.Event()  # set when a look newer than the last one is in, then replaced
        self.streams = 0  # this loop's open streams; used on the loop only
        self.task: asyncio.Task[None] | None = None
        self.looks = 0  # how many looks were taken (for the tests)

    def join(self) -> None:
        self.streams += 1
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="dashboard-feed")

    def leave(self) -> None:
        self.streams -= 1

    async def next(self, after: int) -> Look | None:
        """The latest look if newer than generation `after`, else the next one, or None after CHECK_S
        without one (a slow store, a server stopping: the caller checks its own limits)."""
        if self.latest is not None and self.latest.generation > after:
            return self.latest
        with anyio.move_on_after(CHECK_S):  # in this task, so the server cancelling it reaches the wait
            await self.fresh.wait()
            return self.latest
        return None

    async def _run(self) -> None:
        try:
            while self.streams > 0 and not self.dash.closing.is_set():
                self.looks += 1
                try:
                    look = await run_in_threadpool(self.dash.look_or_problem, self.looks)
                except Exception as error:  # noqa: BLE001 - a bug: the streams say so, the feed goes on
                    log.exception("the dashboard could not read the store")
                    look = Look(
                        key=None,
                        slots=None,
                        body=b"",
                        error=f"the dashboard failed: {error}; see the log",
                        generation=self.looks,
                    )
                self.latest = look
                fresh, self.fresh = self.fresh, asyncio.Event()
                fresh.set()
                await asyncio.sleep(CHECK_S)
        finally:
            self.task = None  # no await between the last check and here: a stream joining later starts another
            self.latest = None  # a look older than CHECK_S is never shown as fresh


class _StoppedReading(Exception):
    """The client took no event for SEND_S."""


class EventStream(StreamingResponse):
    """/api/stream for one client: a place among MAX_STREAMS or 503 with Retry-After, the shared
    feed's looks as events, and an end after STREAM_S, or once the client has taken nothing for
    SEND_S (a client that stopped reading holds neither a place nor a thread for longer)."""

    def __init__(self, dash: Dashboard, last_event_id: str | None, headers: dict[str, str]) -> None:
        self.dash, self.last_event_id = dash, last_event_id
        self.feed: Feed | None = None
        super().__init__(
            self._events(),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.feed = self.dash.open_stream()
        if self.feed is None:
            await self.body_iterator.aclose()  # type: ignore[attr-defined] - never started
            full = JSONResponse(
                {
                    "error": f"the dashboard has {MAX_STREAMS} live streams open, its most: the page "
                    "shows the state by polling meanwhile and tries again later. If there "
                    "should not be that many viewers, set AUTORESEARCH_DASHBOARD_TOKEN"
                },
                status_code=503,
                headers={"Retry-After": str(round(STREAM_S)), "Cache-Control": "no-store"},
            )
            await full(scope, receive, send)
            return

        async def patient(message: Message) -> None:
            try:
                with anyio.fail_after(SEND_S):
                    await send(message)
            except TimeoutError:
                raise _StoppedReading from None

        try:
            await super().__call__(scope, receive, patient)
        except _StoppedReading:
            client = scope.get("client") or ("?",)
            log.info("a dashboard stream to %s was closed: its client took nothing for %.0f s", client[0], SEND_S)
        finally:
            self.dash.close_stream(self.feed)
            await self.body_iterator.aclose()  # type: ignore[attr-defined]

    async def _events(self) -> AsyncIterator[bytes]:
        dash, feed = self.dash, self.feed
        assert feed is not None
        seen: tuple[Any, Any] = (self.last_event_id, None)
        problem = None
        generation = 0
        started = beat = time.monotonic()
        yield b"retry: 2000\n\n"
        while time.monotonic() - started < STREAM_S and not dash.closing.is_set():
            look = await feed.next(generation)
            event = b""
            if look is not None:
                generation = look.generation
                if look.error is not None:
                    if look.error != problem:
                        event = b"event: problem\ndata: " + encode({"error": look.error}) + b"\n\n"
                    problem, seen = look.error, (None, None)
                elif look.key != seen[0]:
                    event = f"id: {look.key}\nevent: state\ndata: ".encode() + look.body + b"\n\n"
                    problem, seen = None, (look.key, look.slots)
                elif look.slots != seen[1]:
                    event = b"event: progress\ndata: " + look.progress + b"\n\n"
                    problem, seen = None, (seen[0], look.slots)
            if event:
                yield event
                beat = time.monotonic()
            elif time.monotonic() - beat >= HEARTBEAT_S:
                yield b": still here\n\n"
                beat = time.monotonic()
