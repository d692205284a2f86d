"""The dashboard: a read-only web page over one store, for a researcher checking an overnight run
from a phone.

    GET /               the page (bot/views/dashboard_static/index.html)
    GET /static/{name}  its script and style sheet (those files only, by name)
    GET /api/state      everything the page shows, as JSON (build_state says what)
    GET /api/stream     server-sent events: `state` (the whole state) when the store changed,
                        `progress` (the running slots only) when only the runs' progress moved,
                        `problem` when the store cannot be read, and a comment every 15 s

It only reads. The store is opened with SQLite's `mode=ro` and `query_only`, one connection per
worker thread (as bot.app.web does), and each answer is read in one read transaction, so it is
consistent and never blocks the conductor's writes for long. Many viewers cost little more than
one: the state is built and encoded once per change of the store, /api/state then reads only the
running slots (Look), and every open stream on the server shares one look a second (_Feed). At most
MAX_STREAMS streams are open at once (more answer 503 with Retry-After, and the page polls
/api/state meanwhile); each ends after STREAM_S, or once its client has taken nothing for SEND_S, so
a client that stops reading holds its place for at most STREAM_S + SEND_S, and never a thread (a
stream is a coroutine; only the feed's look runs on a worker thread). Nothing here calls GitHub, a runner or
an agent. What only a running conductor knows (its runs' latest progress, why it stopped, the
agent's budget) comes from `live()`, passed in by the process that holds the conductor
(conductor_live). With a token every route answers 401 without it (`?token=` or
`Authorization: Bearer`), compared in constant time. Without one it is open to whoever reaches the
server: exposure_warning says when that is a stranger (a server that takes webhooks is reachable by
design). The page's files ship with the package and the page loads nothing else, so it works on a
machine with no route to the internet.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import ipaddress
import json
import logging
import os
import sqlite3
import statistics
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from bot.core.states import RunState, State, Status
from bot.loop.judge import JudgeConfig, margin, pooled_noise
from bot.loop.program import LoopSettings
from bot.store import Experiment, schema

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "dashboard_static"
FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "style.css": "text/css; charset=utf-8"}
CHECK_S = 1.0  # how often a stream looks for a change
HEARTBEAT_S = 15.0  # a comment on a quiet stream, so proxies and phones keep it open
STREAM_S = 60.0  # a stream ends after this long; the browser reconnects (a state only if it changed), so an
# open page never holds up a server's shutdown for longer
MAX_STREAMS = 16  # open /api/stream responses at once; past it 503 (the page polls /api/state meanwhile)
SEND_S = 10.0  # a stream whose client has not taken an event for this long stopped reading: it is closed
EVENTS = 12  # recent events shown
HEADERS = {  # the token may sit in the page's URL: no referrer leaves it, nothing else may load
    "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"}
_EXP_COLUMNS = ", ".join(f.name for f in fields(Experiment) if f.name != "train_py")  # train.py is heavy

Live = Callable[[], dict[str, Any]]
"""What the conductor's process knows beyond the store; every key optional: `progress` (run id ->
its latest progress line), `stop_reason`, `blocked`, `budget_usd` (the agent's), `margin`."""
Links = Callable[[Experiment, dict[str, str]], dict[str, str]]
"""(experiment, what GitHub shows of it: store.published, "pr" among it) -> {label: URL}."""


class StoreUnavailable(RuntimeError):
    """The store cannot be read now; the message says why and what to do."""


class _Readers:
    """One read-only connection per worker thread; a connection that failed is dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = path.resolve().as_uri() + "?mode=ro"
        self.local = threading.local()
        self.opened: list[sqlite3.Connection] = []
        self.lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        db = getattr(self.local, "db", None)
        if db is not None:
            return db
        if not self.path.is_file():
            raise StoreUnavailable(f"no store at {self.path} yet: start the loop there (autoresearch demo or "
                                   "serve), and this page fills in by itself")
        try:
            db = sqlite3.connect(self.uri, uri=True, timeout=5, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA query_only = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as error:
            raise StoreUnavailable(f"cannot read the store at {self.path}: {error}") from None
        if version != schema.VERSION:
            db.close()
            which = "an older" if version < schema.VERSION else "a newer"
            raise StoreUnavailable(f"the store at {self.path} was written by {which} release (schema {version}, "
                                   f"this one reads {schema.VERSION}): run this release's bot on it once, or "
                                   "the dashboard of the release that wrote it")
        self.local.db = db
        with self.lock:
            self.opened.append(db)
        return db

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A connection inside one read transaction: everything read in it is from one moment."""
        db = self.get()
        try:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                db.execute("COMMIT")  # ends the read: the conductor's checkpoints are never held up
        except sqlite3.Error as error:
            self.local.db = None
            with self.lock:
                self.opened = [d for d in self.opened if d is not db]
            db.close()
            raise StoreUnavailable(f"cannot read the store at {self.path}: {error}") from None

    def close_all(self) -> None:
        with self.lock:
            opened, self.opened = self.opened, []
        for db in opened:
            db.close()


# --- the state: a few queries whatever the number of experiments ---------------------------------
def build_state(db: sqlite3.Connection, *, live: dict[str, Any] | None = None,
                links: Links | None = None) -> dict[str, Any]:
    """Everything the page shows, from one connection (in a read transaction) and `live`:

    updated_at   seconds since the epoch
    main         {val_bpb, source ("baseline runs" | "kept experiment, not re-measured yet" | null), runs,
                  commit, baseline_val_bpb (the first main's), margin (the noise margin now, or null)}
    agent        {state: thinking | waiting | paused | stopped | blocked, detail, experiment (being
                  proposed), budget_usd, budget_left_usd}
    spent_usd    what the agent's answers cost so far
    queued       runs waiting for a slot
    counts       {keep, discard, crash, failed, cancelled (finished experiments), active}
    slots        [{run, experiment, title, purpose, started_at, step, loss, progress (0-1),
                  remaining_seconds, training_seconds}], one per running run
    chart        {points: [{x, id, title, val_bpb, status, kept}] (the baseline at x 0, then each kept
                  or discarded experiment at its place among the finished ones), crashes: [{x, id,
                  title, status}], best: [[x, val_bpb], ...] (the running best's step vertices), x_max}
    experiments  [{id, title, state, status, val_bpb, delta, margin, remeasured_delta, runs (finished),
                  in_flight (queued or running), cost_usd, reason (first line), request, pr, links
                  {label: url}, updated_at}] in id order; a proposal in the making is no row
    events       the latest EVENTS events, newest first: [{id, at, experiment, kind, message}]
    """
    live = live or {}
    settings = dict(db.execute("SELECT key, value FROM settings WHERE key IN "
                               "('identity', 'paused', 'agent.spent_usd', 'program.settings')").fetchall())
    experiments = [_experiment(row) for row in db.execute(f"SELECT {_EXP_COLUMNS} FROM experiments ORDER BY id")]
    runs = db.execute("SELECT id, experiment_id, purpose, code_hash, commit_sha, state, status, val_bpb, profile,"
                      " harness_hash, data_fingerprint, json_extract(metrics, '$.clock') AS clock,"
                      " json_extract(metrics, '$.threads') AS threads, run_dir, started_at FROM runs ORDER BY id"
                      ).fetchall()
    published: dict[int, dict[str, str]] = {}
    if links is not None:
        for exp_id, key, value in db.execute("SELECT experiment_id, key, value FROM published"):
            published.setdefault(exp_id, {})[key] = value
    else:
        for exp_id, value in db.execute("SELECT experiment_id, value FROM published WHERE key = 'pr'"):
            published[exp_id] = {"pr": value}
    events = db.execute("SELECT id, at, experiment_id, kind, message FROM events ORDER BY id DESC LIMIT ?",
                        (EVENTS,)).fetchall()

    identity = json.loads(settings.get("identity") or "{}")
    counted = [r for r in runs if r["state"] == RunState.DONE and r["status"] == "ok" and r["val_bpb"] is not None
               and _counts(r, identity)]
    by_id = {e.id: e for e in experiments}
    done_runs: dict[int, int] = {}
    waiting: dict[int, int] = {}
    for r in runs:
        if r["experiment_id"] is not None and r["state"] == RunState.DONE:
            done_runs[r["experiment_id"]] = done_runs.get(r["experiment_id"], 0) + 1
        elif r["experiment_id"] is not None and r["state"] in (RunState.QUEUED, RunState.RUNNING):
            waiting[r["experiment_id"]] = waiting.get(r["experiment_id"], 0) + 1
    rows = [_row(e, done_runs.get(e.id, 0), waiting.get(e.id, 0), published.get(e.id, {}), links)
            for e in experiments if e.state != State.PROPOSING]
    main = _main(runs, counted, experiments, settings, live)
    spent = float(settings.get("agent.spent_usd") or 0.0)
    counts = {s.value: 0 for s in Status}
    for e in experiments:
        if e.state == State.DONE and e.status in counts:
            counts[e.status] += 1
    counts["active"] = sum(1 for e in experiments if e.state not in (State.DONE, State.PROPOSING))
    return {
        "updated_at": time.time(),
        "main": main,
        "agent": _agent(experiments, settings, live, spent),
        "spent_usd": spent,
        "queued": sum(1 for r in runs if r["state"] == RunState.QUEUED),
        "counts": counts,
        "slots": _slots([r for r in runs if r["state"] == RunState.RUNNING], by_id, live),
        "chart": _chart(experiments, main["baseline_val_bpb"]),
        "experiments": rows,
        "events": [{"id": e["id"], "at": e["at"], "experiment": e["experiment_id"], "kind": e["kind"],
                    "message": _first_line(e["message"], 240)} for e in events],
    }


def _experiment(row: sqlite3.Row) -> Experiment:
    data = dict(row)
    data["meta"] = json.loads(data["meta"] or "{}")
    return Experiment(train_py=None, **data)


def _counts(run: sqlite3.Row, identity: dict[str, Any]) -> bool:
    """bot.loop.measurement.counts on the columns read here (a Run would drag its train.py along)."""
    if not identity:
        return True
    threads = identity.get("threads")
    return (run["profile"] == identity.get("profile") and run["harness_hash"] == identity.get("harness_hash")
            and run["data_fingerprint"] == identity.get("data_fingerprint")
            and (threads is None or run["clock"] != "cpu" or run["threads"] == int(threads)))


def _row(e: Experiment, runs: int, waiting: int, shown: dict[str, str], links: Links | None) -> dict[str, Any]:
    failed = e.status in (Status.CRASH, Status.FAILED)  # their numbers mean nothing (as in results.tsv)
    found: dict[str, str] = {}
    if links is not None:
        try:
            found = {str(k): str(v) for k, v in (links(e, shown) or {}).items() if v}
        except Exception:  # noqa: BLE001 - a broken link helper must not take the page down
            log.exception("links() failed for experiment %s", e.id)
    pr = shown.get("pr")
    return {"id": e.id, "title": e.title, "state": e.state, "status": e.status,
            "val_bpb": None if failed else e.val_bpb, "delta": None if failed else e.delta, "margin": e.margin,
            "remeasured_delta": e.remeasured_delta, "runs": runs, "in_flight": waiting,
            "cost_usd": e.meta.get("cost_usd"), "reason": _first_line(e.reason, 240), "request": e.request,
            "pr": int(pr) if pr and pr.isdigit() else None, "links": found, "updated_at": e.updated_at}


def _main(runs: list[sqlite3.Row], counted: list[sqlite3.Row], experiments: list[Experiment],
          settings: dict[str, str], live: dict[str, Any]) -> dict[str, Any]:
    """Main's val_bpb: the mean of its own baseline runs (the latest baseline queued is of the current
    main); until it has one, the latest kept experiment's number, flattering as it is."""
    baselines = [r for r in runs if r["purpose"] == "baseline"]
    code = baselines[-1]["code_hash"] if baselines else None
    values = [r["val_bpb"] for r in counted if r["purpose"] == "baseline" and r["code_hash"] == code]
    first = next((r["code_hash"] for r in counted if r["purpose"] == "baseline"), None)
    first_values = [r["val_bpb"] for r in counted if r["purpose"] == "baseline" and r["code_hash"] == first]
    kept = [e for e in experiments if e.state == State.DONE and e.status == Status.KEEP and e.val_bpb is not None]
    value, source = (statistics.fmean(values), "baseline runs") if values else (None, None)
    if value is None and kept:
        value, source = kept[-1].val_bpb, "kept experiment, not re-measured yet"
    band = live.get("margin")
    if band is None and values:
        groups: dict[tuple[str, int | None], list[float]] = {}  # as Conductor.noise groups them
        for r in counted:
            groups.setdefault((r["code_hash"], None if r["purpose"] == "baseline" else r["experiment_id"]),
                              []).append(r["val_bpb"])
        noise = pooled_noise(groups.values())
        band = margin(noise, 1, len(values), _judge_config(settings)) if noise else None
    return {"val_bpb": value, "source": source, "runs": len(values),
            "commit": baselines[-1]["commit_sha"][:7] if baselines else None,
            "baseline_val_bpb": statistics.fmean(first_values) if first_values else None, "margin": band}


def _judge_config(settings: dict[str, str]) -> JudgeConfig:
    """The judge's settings from program.md as the conductor last read them (as Conductor._judge_config)."""
    try:
        loop = LoopSettings.model_validate_json(settings["program.settings"])
    except (KeyError, ValueError):
        loop = LoopSettings()
    return JudgeConfig(noise_sigmas=loop.noise_sigmas, confirm_sigmas=loop.confirm_sigmas,
                       confirm_below=loop.confirm_below, min_margin=loop.min_margin, confirm=loop.confirm)


def _agent(experiments: list[Experiment], settings: dict[str, str], live: dict[str, Any],
           spent: float) -> dict[str, Any]:
    budget = live.get("budget_usd")
    stop, blocked = live.get("stop_reason") or "", live.get("blocked") or ""
    proposing = next((e.id for e in experiments if e.state == State.PROPOSING), None)
    if blocked:
        state, detail = "blocked", blocked
    elif settings.get("paused") == "1" or stop.startswith("paused"):
        state, detail = "paused", stop or "paused: `autoresearch resume` (or /resume) lets it go on"
    elif stop:
        state, detail = "stopped", stop
    elif budget is not None and spent >= budget:
        state, detail = "stopped", f"its budget of ${budget:.2f} is spent"
    elif proposing is not None:
        state, detail = "thinking", f"proposing experiment {proposing}"
    else:
        state, detail = "waiting", "for runs to finish or a slot to free"
    return {"state": state, "detail": detail, "experiment": proposing, "budget_usd": budget,
            "budget_left_usd": None if budget is None else max(0.0, budget - spent)}


def _slots(running: list[sqlite3.Row], by_id: dict[int, Experiment], live: dict[str, Any]) -> list[dict[str, Any]]:
    progress = live.get("progress") or {}
    slots = []
    for r in running:
        # the conductor's copy is as old as its last tick; a local run's file may be newer
        lines = [progress.get(r["id"]) or progress.get(str(r["id"])), _last_progress(r["run_dir"])]
        line = max((x for x in lines if isinstance(x, dict)), key=lambda x: x.get("step") or -1, default={})
        exp = by_id.get(r["experiment_id"]) if r["experiment_id"] is not None else None
        slots.append({"run": r["id"], "experiment": r["experiment_id"], "purpose": r["purpose"],
                      "title": exp.title if exp else f"baseline of main {r['commit_sha'][:7]}",
                      "started_at": r["started_at"], "step": line.get("step"), "loss": line.get("loss"),
                      "progress": line.get("progress"), "remaining_seconds": line.get("remaining_seconds"),
                      "training_seconds": line.get("training_seconds")})
    return slots


def _last_progress(run_dir: str | None) -> dict[str, Any] | None:
    """The last whole line of a local run's progress.jsonl. Unlike runners.local.last_progress it
    takes the line before one still being written, and treats any unreadable file as no progress
    (a remote runner's handle is not a directory)."""
    if not run_dir:
        return None
    try:
        with open(Path(run_dir) / "progress.jsonl", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-2:]):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _chart(experiments: list[Experiment], baseline: float | None) -> dict[str, Any]:
    """x is the position among finished experiments (the baseline at 0); a judged experiment is a
    point, a crash or failure a mark on the axis; `best` is the running best as step vertices."""
    points: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []
    if baseline is not None:
        points.append({"x": 0, "id": 0, "title": "baseline", "val_bpb": baseline, "status": "baseline",
                       "kept": True})
    best: list[list[float]] = [[0, baseline]] if baseline is not None else []
    x = 0
    for e in experiments:
        if e.state != State.DONE:
            continue
        x += 1
        if e.status in (Status.KEEP, Status.DISCARD) and e.val_bpb is not None:
            kept = e.status == Status.KEEP
            points.append({"x": x, "id": e.id, "title": e.title, "val_bpb": e.val_bpb, "status": e.status,
                           "kept": kept})
            if kept and (not best or e.val_bpb < best[-1][1]):
                if best:
                    best.append([x, best[-1][1]])
                best.append([x, e.val_bpb])
        elif e.status in (Status.CRASH, Status.FAILED):
            crashes.append({"x": x, "id": e.id, "title": e.title, "status": e.status})
    if best and best[-1][0] < x:
        best.append([x, best[-1][1]])
    return {"points": points, "crashes": crashes, "best": best, "x_max": x}


def _first_line(text: str | None, limit: int) -> str | None:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else None
    return line if line is None or len(line) <= limit else line[: limit - 1] + "…"


def fingerprint(db: sqlite3.Connection) -> tuple[Any, ...]:
    """Changes whenever build_state's store part would: an event, an experiment's update, a run
    queued, started or ended, a setting or a pull request shown; one cheap query."""
    return tuple(db.execute(
        "SELECT (SELECT COALESCE(MAX(id), 0) FROM events),"
        " (SELECT COUNT(*) || ':' || COALESCE(MAX(updated_at), 0) FROM experiments),"
        " (SELECT group_concat(id || ':' || state || ':' || COALESCE(run_dir, '')) FROM runs"
        "  WHERE state IN ('queued', 'running')),"
        " (SELECT COUNT(*) || ':' || COALESCE(MAX(id), 0) FROM runs),"
        " (SELECT group_concat(key || '=' || value) FROM settings"
        "  WHERE key IN ('paused', 'agent.spent_usd', 'identity', 'program.settings')),"
        " (SELECT COUNT(*) FROM published WHERE key = 'pr')").fetchone())


# --- the routes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Look:
    """One read of the store and of live(): what a page or a stream shows, already encoded."""

    key: str | None  # the store key (the state event's id); None when the store could not be read
    slots: list[dict[str, Any]] | None
    body: bytes  # the whole state as JSON, or {"error": ...}
    progress: bytes = b""  # {"slots", "updated_at"} as JSON
    error: str | None = None
    generation: int = 0  # which look of a stream feed this is


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


class Dashboard:
    """The reads behind the routes. The store's part of the state is built and encoded once per
    change of the store (or of the conductor's report) and shared by every page and stream; the
    running slots are read afresh each time, since progress moves without the store changing, and
    spliced into the encoded state. Every open stream on an event loop shares one look a second
    (_Feed); at most MAX_STREAMS are open at once."""

    def __init__(self, store_path: Path, live: Live | None, links: Links | None) -> None:
        self.readers = _Readers(store_path)
        self.live = live
        self.links = links
        self.closing = threading.Event()  # set: open streams end within a second (a server stopping)
        # (store key, the state built for it as JSON less slots, updated_at and the closing brace)
        self._built: tuple[str, bytes] | None = None
        self._lock = threading.Lock()
        self._streams = 0  # open /api/stream responses, all loops together
        self._feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Feed] = weakref.WeakKeyDictionary()

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
                state = build_state(db, live=live, links=self.links)
                slots = state["slots"]
                built = (key, _json({k: v for k, v in state.items() if k not in ("slots", "updated_at")})[:-1])
                with self._lock:
                    self._built = built
            else:
                slots = self._slots(db, live)
        now = time.time()
        body = built[1] + b',"slots":' + _json(slots) + b',"updated_at":' + _json(now) + b"}"
        return Look(key=key, slots=slots, body=body, progress=_json({"slots": slots, "updated_at": now}),
                    generation=generation)

    def look_or_problem(self, generation: int = 0) -> Look:
        """look(), or a Look holding why the store cannot be read (a stream says so and goes on)."""
        try:
            return self.look(generation)
        except StoreUnavailable as error:
            return Look(key=None, slots=None, body=_json({"error": str(error)}), error=str(error),
                        generation=generation)

    # --- the streams ---------------------------------------------------------------------------------
    def open_stream(self) -> _Feed | None:
        """A place among the open streams and the feed of this event loop, or None when
        MAX_STREAMS are open. Give it back with close_stream."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._streams >= MAX_STREAMS:
                return None
            self._streams += 1
            feed = self._feeds.get(loop)
            if feed is None:
                feed = self._feeds[loop] = _Feed(self)
        feed.join()
        return feed

    def close_stream(self, feed: _Feed) -> None:
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
        cached = getattr(self.readers.local, "fingerprint", None)
        if cached is None or cached[0] is not db or cached[1] != version:
            cached = (db, version, fingerprint(db))
            self.readers.local.fingerprint = cached
        report = {k: live.get(k) for k in ("stop_reason", "blocked", "budget_usd", "margin")}
        return hashlib.sha256(repr((cached[2], report)).encode()).hexdigest()[:20]

    @staticmethod
    def _slots(db: sqlite3.Connection, live: dict[str, Any]) -> list[dict[str, Any]]:
        running = db.execute("SELECT id, experiment_id, purpose, commit_sha, run_dir, started_at FROM runs "
                             "WHERE state = 'running' ORDER BY id").fetchall()
        titles = {r["id"]: _experiment(r) for r in db.execute(
            f"SELECT {_EXP_COLUMNS} FROM experiments WHERE id IN (SELECT experiment_id FROM runs "
            "WHERE state = 'running')")}
        return _slots(running, titles, live)


def create_dashboard(*, store_path: Path, token: str | None = None, live: Live | None = None,
                     links: Links | None = None) -> APIRouter:
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
            return Response(look.body, status_code=503, media_type="application/json",
                            headers={"Cache-Control": "no-store"})
        return Response(look.body, media_type="application/json", headers={**HEADERS, "Cache-Control": "no-store"})

    @router.get("/api/stream")
    async def stream(request: Request) -> Response:
        return _EventStream(dash, request.headers.get("last-event-id"))

    router.dashboard = dash  # type: ignore[attr-defined] - for dashboard_app to close its connections
    return router


class _Feed:
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
                    look = Look(key=None, slots=None, body=b"", error=f"the dashboard failed: {error}; see the log",
                                generation=self.looks)
                self.latest = look
                fresh, self.fresh = self.fresh, asyncio.Event()
                fresh.set()
                await asyncio.sleep(CHECK_S)
        finally:
            self.task = None  # no await between the last check and here: a stream joining later starts another
            self.latest = None  # a look older than CHECK_S is never shown as fresh


class _StoppedReading(Exception):
    """The client took no event for SEND_S."""


class _EventStream(StreamingResponse):
    """/api/stream for one client: a place among MAX_STREAMS or 503 with Retry-After, the shared
    feed's looks as events, and an end after STREAM_S, or once the client has taken nothing for
    SEND_S (a client that stopped reading holds neither a place nor a thread for longer)."""

    def __init__(self, dash: Dashboard, last_event_id: str | None) -> None:
        self.dash, self.last_event_id = dash, last_event_id
        self.feed: _Feed | None = None
        super().__init__(self._events(), media_type="text/event-stream",
                         headers={**HEADERS, "Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.feed = self.dash.open_stream()
        if self.feed is None:
            await self.body_iterator.aclose()  # type: ignore[attr-defined] - never started
            full = JSONResponse({"error": f"the dashboard has {MAX_STREAMS} live streams open, its most: the page "
                                          "shows the state by polling meanwhile and tries again later. If there "
                                          "should not be that many viewers, set AUTORESEARCH_DASHBOARD_TOKEN"},
                                status_code=503,
                                headers={"Retry-After": str(round(STREAM_S)), "Cache-Control": "no-store"})
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
                        event = b"event: problem\ndata: " + _json({"error": look.error}) + b"\n\n"
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


def _require(token: str) -> Callable[[Request], None]:
    expected = token.encode("utf-8")

    def check(request: Request) -> None:
        given = request.query_params.get("token")
        if given is None:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        if given is None or not hmac.compare_digest(given.encode("utf-8"), expected):
            raise HTTPException(401, "the dashboard needs its token: open it as …/?token=<token>",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


def dashboard_app(*, store_path: Path, token: str | None = None, live: Live | None = None,
                  links: Links | None = None) -> FastAPI:
    """The dashboard alone, at the root (`autoresearch dashboard`, the demo)."""
    router = create_dashboard(store_path=store_path, token=token, live=live, links=links)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        router.dashboard.readers.close_all()  # type: ignore[attr-defined]

    app = FastAPI(title="autoresearch dashboard", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

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
        return (f"the dashboard at / is readable by anyone who can reach the webhook URL: GitHub must reach this "
                f"server ({host}:{port}, directly or through a proxy or tunnel), and so can anyone else; set "
                "AUTORESEARCH_DASHBOARD_TOKEN to require a token")
    if not _loopback(host):
        return (f"the dashboard at / is readable by anyone who reaches {host}:{port}; set "
                "AUTORESEARCH_DASHBOARD_TOKEN to require a token")
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


# --- what the conductor's process passes in ---------------------------------------------------------
def conductor_live(get: Callable[[], Any], budget_usd: float | None = None) -> Live:
    """live() over the conductor `get()` returns (None until there is one), read from the web
    threads: copies of plain attributes only, never a call that reads the forge or the store."""
    def live() -> dict[str, Any]:
        conductor = get()
        if conductor is None:
            return {"budget_usd": budget_usd}
        return {"progress": dict(conductor.progress), "stop_reason": conductor.stop_reason,
                "blocked": conductor.blocked,
                "budget_usd": conductor.config.agent_budget_usd if budget_usd is None else budget_usd}
    return live


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
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
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
