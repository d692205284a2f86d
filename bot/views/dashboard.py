"""The dashboard: a read-only web page over one store, for a researcher checking an overnight run
from a phone.

    GET /               the page (bot/views/dashboard_static/index.html)
    GET /static/{name}  its script and style sheet (those files only, by name)
    GET /api/state      everything the page shows, as JSON (bot.views.dashboard_state.build_state says what)
    GET /api/stream     server-sent events (bot.views.dashboard_stream): `state` (the whole state) when
                        the store changed, `progress` (the running slots only) when only the runs'
                        progress moved, `problem` when the store cannot be read, and a comment every 15 s

It only reads, through the store's read-only pool (bot.store.pool, as bot.app.web's /healthz does:
one connection per worker thread), and each answer is read in one read transaction, so it is
consistent and never blocks the conductor's writes for long. What it shows is the read model
(bot.views.read_model), the numbers every other view shows too. Many viewers cost little more than
one: the state is built and encoded once per change of the store, /api/state then reads only the
running slots (Look), and every open stream on the server shares one look a second (Feed); at most
MAX_STREAMS streams are open at once. Nothing here calls GitHub, a runner or an agent. What only a
running conductor knows (its runs' latest progress, why it stopped, the agent's budget) comes from
`live()`, passed in by the process that holds the conductor (read_model.conductor_live). With a
token every route answers 401 without it (`?token=` or `Authorization: Bearer`), compared in
constant time. Without one it is open to whoever reaches the server: exposure_warning says when that
is a stranger (a server that takes webhooks is reachable by design). The page's files ship with the
package and the page loads nothing else, so it works on a machine with no route to the internet.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import ipaddress
import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from bot.store import Experiment, ReadPool, StoreUnavailable
from bot.views import dashboard_state, dashboard_stream
from bot.views.dashboard_state import Links, Look, encode, fingerprint, running_slots
from bot.views.dashboard_stream import EventStream, Feed
from bot.views.read_model import Live

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "dashboard_static"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
HEADERS = {  # the token may sit in the page's URL: no referrer leaves it, nothing else may load
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
}


class Dashboard:
    """The reads behind the routes. The store's part of the state is built and encoded once per
    change of the store (or of the conductor's report) and shared by every page and stream; the
    running slots are read afresh each time, since progress moves without the store changing, and
    spliced into the encoded state. Every open stream on an event loop shares one look a second
    (Feed); at most dashboard_stream.MAX_STREAMS are open at once."""

    def __init__(self, store_path: Path, live: Callable[[], Live] | None, links: Links | None) -> None:
        self.readers = ReadPool(store_path)
        self._fingerprints = threading.local()  # this thread's (connection, data_version, fingerprint)
        self.live = live
        self.links = links
        self.closing = threading.Event()  # set: open streams end within a second (a server stopping)
        # (store key, the state built for it as JSON less slots, updated_at and the closing brace)
        self._built: tuple[str, bytes] | None = None
        self._lock = threading.Lock()
        self._streams = 0  # open /api/stream responses, all loops together
        self._feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Feed] = weakref.WeakKeyDictionary()

    def close(self) -> None:
        self.closing.set()

    def live_now(self) -> dict[str, Any]:
        if self.live is None:
            return {}
        try:
            return dict(self.live() or {})
        except Exception:  # noqa: BLE001 - the store alone still makes a page
            log.exception("live() failed; showing the store alone")
            return {}

    def state(self) -> dict[str, Any]:
        """The state as build_state describes it (with the running slots of now)."""
        return json.loads(self.look().body)

    def look(self, generation: int = 0) -> Look:
        """One read transaction: the store key, the slots, and the whole state encoded; raises
        StoreUnavailable. The state's store part is built and encoded only when the key changed."""
        live = self.live_now()
        with self.readers.snapshot() as db:
            key = self._store_key(db, live)
            with self._lock:
                built = self._built
            if built is None or built[0] != key:
                state = dashboard_state.build_state(db, live=live, links=self.links)
                slots = state["slots"]
                built = (key, encode({k: v for k, v in state.items() if k not in ("slots", "updated_at")})[:-1])
                with self._lock:
                    self._built = built
            else:
                slots = running_slots(db, live)
        now = time.time()
        body = built[1] + b',"slots":' + encode(slots) + b',"updated_at":' + encode(now) + b"}"
        return Look(
            key=key, slots=slots, body=body, progress=encode({"slots": slots, "updated_at": now}), generation=generation
        )

    def look_or_problem(self, generation: int = 0) -> Look:
        """look(), or a Look holding why the store cannot be read (a stream says so and goes on)."""
        try:
            return self.look(generation)
        except StoreUnavailable as error:
            return Look(
                key=None, slots=None, body=encode({"error": str(error)}), error=str(error), generation=generation
            )

    # --- the streams ---------------------------------------------------------------------------------
    def open_stream(self) -> Feed | None:
        """A place among the open streams and the feed of this event loop, or None when
        MAX_STREAMS are open. Give it back with close_stream."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._streams >= dashboard_stream.MAX_STREAMS:
                return None
            self._streams += 1
            feed = self._feeds.get(loop)
            if feed is None:
                feed = self._feeds[loop] = Feed(self)
        feed.join()
        return feed

    def close_stream(self, feed: Feed) -> None:
        feed.leave()
        with self._lock:
            self._streams -= 1

    @property
    def open_streams(self) -> int:
        return self._streams

    def _store_key(self, db: sqlite3.Connection, live: dict[str, Any]) -> str:
        """A hash of fingerprint() and the conductor's report. The fingerprint is taken again only
        when another connection has committed since (PRAGMA data_version), so an idle stream reads
        next to nothing."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        cached = getattr(self._fingerprints, "cached", None)
        if cached is None or cached[0] is not db or cached[1] != version:
            cached = (db, version, fingerprint(db))
            self._fingerprints.cached = cached
        report = {k: live.get(k) for k in ("stop_reason", "blocked", "budget_usd")}
        return hashlib.sha256(repr((cached[2], report)).encode()).hexdigest()[:20]


def create_dashboard(
    *, store_path: Path, token: str | None = None, live: Callable[[], Live] | None = None, links: Links | None = None
) -> APIRouter:
    """The dashboard's routes over the store at `store_path`, to include in an app (any prefix: the
    page's URLs are relative). `token`: required of every request when set. `live()`: see Live.
    `links(experiment, published)`: the links shown beside each experiment (github_links)."""
    if token is not None and not token.strip():
        raise ValueError("the dashboard token is empty: set a real one, or none to leave the dashboard open")
    dash = Dashboard(Path(store_path), live, links)
    router = APIRouter(dependencies=[Depends(_require(token))] if token else [])
    query = html.escape(f"?token={quote(token, safe='')}") if token else ""

    def page(name: str) -> Response:
        text = (STATIC / name).read_text(encoding="utf-8")
        if name == "index.html":
            text = text.replace("{{query}}", query)
        return Response(text, media_type=FILES[name], headers={**HEADERS, "Cache-Control": "no-cache"})

    @router.get("/", response_class=HTMLResponse)
    def index() -> Response:
        return page("index.html")

    @router.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in FILES:  # by name from a fixed list: no path ever reaches the file system
            raise HTTPException(404, f"no file {name!r} here")
        return page(name)

    @router.get("/api/state")
    def state() -> Response:
        look = dash.look_or_problem()
        if look.error is not None:
            return Response(
                look.body, status_code=503, media_type="application/json", headers={"Cache-Control": "no-store"}
            )
        return Response(look.body, media_type="application/json", headers={**HEADERS, "Cache-Control": "no-store"})

    @router.get("/api/stream")
    async def stream(request: Request) -> Response:
        return EventStream(dash, request.headers.get("last-event-id"), HEADERS)

    router.dashboard = dash  # type: ignore[attr-defined] - for dashboard_app to close its connections
    return router


def _require(token: str) -> Callable[[Request], None]:
    expected = token.encode("utf-8")

    def check(request: Request) -> None:
        given = request.query_params.get("token")
        if given is None:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        if given is None or not hmac.compare_digest(given.encode("utf-8"), expected):
            raise HTTPException(
                401,
                "the dashboard needs its token: open it as …/?token=<token>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check


def dashboard_app(
    *, store_path: Path, token: str | None = None, live: Callable[[], Live] | None = None, links: Links | None = None
) -> FastAPI:
    """The dashboard alone, at the root (`autoresearch dashboard`, the demo)."""
    router = create_dashboard(store_path=store_path, token=token, live=live, links=links)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        router.dashboard.readers.close_all()  # type: ignore[attr-defined]

    app = FastAPI(title="autoresearch dashboard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)

    app.include_router(router)
    app.state.dashboard = router.dashboard  # type: ignore[attr-defined] - Background.stop ends its streams
    return app


def exposure_warning(*, host: str, port: int, token: str | None, takes_webhooks: bool) -> str | None:
    """Why strangers can read the dashboard (its hypotheses, numbers and links), or None when a
    token guards it or nothing outside this machine can reach it. A server that takes webhooks is
    reachable from the internet by design: GitHub must reach its /webhook, directly or through a
    reverse proxy or tunnel, and a proxy on this machine connects from 127.0.0.1, so the address it
    binds says nothing there. Without webhooks, a bind beyond loopback is what exposes it."""
    if token:
        return None
    if takes_webhooks:
        return (
            f"the dashboard at / is readable by anyone who can reach the webhook URL: GitHub must reach this "
            f"server ({host}:{port}, directly or through a proxy or tunnel), and so can anyone else; set "
            "AUTORESEARCH_DASHBOARD_TOKEN to require a token"
        )
    if not _loopback(host):
        return (
            f"the dashboard at / is readable by anyone who reaches {host}:{port}; set "
            "AUTORESEARCH_DASHBOARD_TOKEN to require a token"
        )
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def github_links(repository: str, api_url: str = "https://api.github.com") -> Links:
    """Links to an experiment on GitHub: its pull request, its branch, its diff against its main."""
    parsed = urlparse(api_url)
    if parsed.hostname == "api.github.com":
        web = "https://github.com"
    else:  # GitHub Enterprise Server serves its API at <host>/api/v3
        web = f"{parsed.scheme}://{parsed.netloc}{parsed.path.removesuffix('/').removesuffix('/api/v3')}"
    base = f"{web}/{repository}"

    def links(exp: Experiment, published: dict[str, str]) -> dict[str, str]:
        found = {}
        if published.get("pr"):
            found[f"PR #{published['pr']}"] = f"{base}/pull/{published['pr']}"
        if exp.branch and exp.head_sha:
            found["branch"] = f"{base}/tree/{quote(exp.branch)}"
            found["diff"] = f"{base}/compare/{exp.base_sha}...{exp.head_sha}"
        return found

    return links


@dataclass
class Background:
    """A uvicorn server on its own thread (the demo's dashboard, the tests)."""

    app: FastAPI
    server: Any
    thread: threading.Thread
    url: str

    def stop(self, timeout: float = 10.0) -> None:
        dash = getattr(self.app.state, "dashboard", None)
        if dash is not None:
            dash.close()  # uvicorn waits for open responses: end the streams first
        self.server.should_exit = True
        self.thread.join(timeout)


def serve_in_thread(app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, start_s: float = 10.0) -> Background:
    """Serve `app` on a daemon thread; port 0 takes a free one. Raises RuntimeError if it cannot listen."""
    import uvicorn

    # open streams would hold a shutdown for minutes: a short grace, then they are cut
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the dashboard could not listen on {host}:{port} (is the port taken?)")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return Background(app=app, server=server, thread=thread, url=f"http://{host}:{bound}/")
