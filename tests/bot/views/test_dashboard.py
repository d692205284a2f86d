"""The dashboard: its JSON holds every experiment, the chart's points, the running slot with its
progress and main's numbers, built in a few queries; it only reads; a token guards every route; the
static route serves its three files and nothing else; the stream sends a `state` event; and in a real
headless Chromium the page draws it all and follows a run that finishes, by itself."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest
from fastapi.testclient import TestClient

from bot.store import ReadPool, Store
from bot.store.writes import Write, WriteMode
from bot.views import dashboard, dashboard_state, dashboard_stream
from bot.views.dashboard import dashboard_app, serve_in_thread
from bot.views.dashboard_state import build_state
from runner.progress import PROGRESS_FILE

MAIN_A = "aaaaaaa" + "1" * 33
MAIN_B = "bbbbbbb" + "2" * 33
IDENTITY = {"profile": "cpu", "harness_hash": "h1", "data_fingerprint": "d1"}
COUNTED = {"harness_hash": "h1", "data_fingerprint": "d1", "num_steps": 100}
TOKEN = "dash-t0ken/with?odd&chars"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
PATH = {"measuring": ["branched", "measuring"], "done": ["branched", "measuring", "closing", "done"]}


def measured(
    store: Store,
    *,
    experiment_id: int | None,
    purpose: str,
    code: str,
    commit: str,
    status: str,
    val_bpb: float | None,
    metrics: dict | None = None,
) -> int:
    run = store.runs.add(
        experiment_id=experiment_id,
        purpose=purpose,
        code_hash=code,
        commit_sha=commit,
        base_sha=MAIN_A,
        asset="print()\n",
        profile="cpu",
    )
    store.runs.finish(
        run.id,
        status=status,
        val_bpb=val_bpb,
        metrics=COUNTED if metrics is None else metrics,
        error="Traceback\nRuntimeError: boom" if status == "crash" else None,
        log_tail="",
    )
    return run.id


def experiment(
    store: Store, title: str, *, code: str, runs: list[tuple[str, float | None]], state: str = "done", **fields
) -> int:
    exp = store.experiments.start_proposing(MAIN_A)
    store.experiments.fill_proposal(
        exp.id,
        title=title,
        hypothesis="because",
        slug="x",
        code_hash=code,
        asset="print()\n",
        meta={"cost_usd": 0.012},
    )
    for status, value in runs:
        measured(
            store, experiment_id=exp.id, purpose="candidate", code=code, commit="f" * 40, status=status, val_bpb=value
        )
    for step in PATH[state][:-1]:
        store.experiments.update(exp.id, state=step)
    store.experiments.update(exp.id, state=PATH[state][-1], head_sha=code[0] * 40, **fields)
    return exp.id


def progress_line(step: int, loss: float, fraction: float, left: float) -> str:
    return (
        json.dumps(
            {
                "step": step,
                "loss": loss,
                "progress": fraction,
                "remaining_seconds": left,
                "training_seconds": 60 - left,
                "tokens": step * 1024,
                "clock": "cpu",
            }
        )
        + "\n"
    )


@pytest.fixture
def seeded(tmp_path: Path):
    """Main A measured twice (plus a run under another harness, which does not count), 1 kept, then
    main B measured twice, 2 discarded, 3 crashed, 4 measuring with run 11 running, whose
    progress.jsonl (where the harness writes it, under scratch/) has two lines and a half-written third."""
    store = Store(tmp_path / "state.db")
    store.state.identity = IDENTITY
    for value in (1.0, 1.02):
        measured(store, experiment_id=None, purpose="baseline", code="A", commit=MAIN_A, status="ok", val_bpb=value)
    measured(
        store,
        experiment_id=None,
        purpose="baseline",
        code="A",
        commit=MAIN_A,
        status="ok",
        val_bpb=0.5,
        metrics={"harness_hash": "old", "data_fingerprint": "d1"},
    )
    experiment(
        store,
        "Raise the learning rate",
        code="E1",
        runs=[("ok", 0.98), ("ok", 0.97)],
        status="keep",
        val_bpb=0.975,
        delta=-0.035,
        margin=0.012,
        reason="kept: clears the margin\nmore text",
    )
    for value in (0.97, 0.972):
        measured(store, experiment_id=None, purpose="baseline", code="B", commit=MAIN_B, status="ok", val_bpb=value)
    experiment(store, "Deeper model", code="E2", runs=[("ok", 0.99)], status="discard", val_bpb=0.99, delta=0.019)
    experiment(store, "Huge <b>batch</b>", code="E3", runs=[("crash", None)], status="crash", val_bpb=0.7, delta=-0.3)
    running = experiment(store, "Still running", code="E4", runs=[], state="measuring")
    run = store.runs.add(
        experiment_id=running,
        purpose="candidate",
        code_hash="E4",
        commit_sha="4" * 40,
        base_sha=MAIN_B,
        asset="print()\n",
        profile="cpu",
    )
    run_dir = tmp_path / "runs" / str(run.id)
    (run_dir / PROGRESS_FILE).parent.mkdir(parents=True)
    (run_dir / PROGRESS_FILE).write_text(
        progress_line(100, 3.5, 0.4, 36.0) + progress_line(120, 3.2141, 0.5, 30.0) + '{"step": 13'
    )
    store.runs.mark_started(run.id, str(run_dir))
    store.runs.add(
        experiment_id=None,
        purpose="baseline",
        code_hash="B",
        commit_sha=MAIN_B,
        base_sha=MAIN_B,
        asset="print()\n",
        profile="cpu",
    )  # queued
    store.state.spent_usd = 1.25
    store.published.set(1, "pr", "7")
    yield store, run.id
    store.close()


@pytest.fixture
def client(seeded):
    store, _ = seeded
    with TestClient(dashboard_app(store_path=store.path)) as c:
        yield c


# --- the state -------------------------------------------------------------------------------------


def test_state_has_every_experiment_with_its_numbers(client: TestClient):
    state = client.get("/api/state").json()
    rows = {e["id"]: e for e in state["experiments"]}
    assert list(rows) == [1, 2, 3, 4]
    assert (rows[1]["status"], rows[1]["val_bpb"], rows[1]["delta"], rows[1]["margin"]) == (
        "keep",
        0.975,
        -0.035,
        0.012,
    )
    assert rows[1]["runs"] == 2 and rows[1]["cost_usd"] == 0.012 and rows[1]["pr"] == 7
    assert rows[1]["reason"] == "kept: clears the margin"  # its first line
    assert rows[3]["status"] == "crash" and rows[3]["val_bpb"] is None and rows[3]["delta"] is None
    assert (rows[4]["state"], rows[4]["status"], rows[4]["in_flight"], rows[4]["runs"]) == ("measuring", None, 1, 0)
    assert all(row["links"] == {} for row in rows.values())  # no links() given
    assert state["counts"] == {
        "keep": 1,
        "discard": 1,
        "crash": 1,
        "rejected": 0,
        "failed": 0,
        "cancelled": 0,
        "active": 1,
        "kept_for_simplicity": 0,
    }
    assert all(row["kept_for_simplicity"] is None for row in rows.values())
    assert state["queued"] == 1 and state["spent_usd"] == 1.25


def test_main_is_the_latest_mains_own_runs_under_the_pinned_identity(client: TestClient):
    main = client.get("/api/state").json()["main"]
    assert main["val_bpb"] == pytest.approx(0.971) and main["runs"] == 2 and main["commit"] == MAIN_B[:7]
    assert main["baseline_val_bpb"] == pytest.approx(1.01)  # the 0.5 under another harness does not count
    assert main["source"] == "baseline runs"
    assert main["margin"] is not None and 0 < main["margin"] < 0.2  # the noise is known: groups of two


def test_chart_has_the_baseline_and_each_judged_experiment_and_the_running_best(client: TestClient):
    chart = client.get("/api/state").json()["chart"]
    assert [(p["x"], p["id"], p["status"], p["kept"]) for p in chart["points"]] == [
        (0, 0, "baseline", True),
        (1, 1, "keep", True),
        (2, 2, "discard", False),
    ]
    assert [(c["x"], c["id"]) for c in chart["crashes"]] == [(3, 3)]
    assert chart["best"] == [[0, pytest.approx(1.01)], [1, pytest.approx(1.01)], [1, 0.975], [3, 0.975]]
    assert chart["x_max"] == 3


def test_the_running_slot_shows_the_last_whole_progress_line(client: TestClient, seeded):
    _, run_id = seeded
    [slot] = client.get("/api/state").json()["slots"]
    assert (slot["run"], slot["experiment"], slot["title"], slot["purpose"]) == (
        run_id,
        4,
        "Still running",
        "candidate",
    )
    assert (slot["step"], slot["loss"], slot["progress"], slot["remaining_seconds"]) == (120, 3.2141, 0.5, 30.0)


def test_the_freshest_progress_and_the_conductors_report_are_shown(seeded):
    store, run_id = seeded
    live = {
        "progress": {run_id: {"step": 150, "loss": 3.0, "progress": 0.75, "remaining_seconds": 15.0}},
        "stop_reason": "reached 6 experiments",
        "budget_usd": 5.0,
    }
    with TestClient(dashboard_app(store_path=store.path, live=lambda: live)) as c:
        state = c.get("/api/state").json()
    with TestClient(dashboard_app(store_path=store.path)) as c:
        alone = c.get("/api/state").json()
    assert (state["slots"][0]["step"], state["slots"][0]["progress"]) == (150, 0.75)  # live is ahead of the file
    assert state["agent"] == {
        "state": "stopped",
        "detail": "reached 6 experiments",
        "experiment": None,
        "budget_usd": 5.0,
        "budget_left_usd": 3.75,
    }
    assert state["main"] == alone["main"]  # main's numbers are the store's, whatever the conductor says
    live["progress"] = {run_id: {"step": 90, "loss": 3.9}}  # the conductor's last tick is behind the file
    with TestClient(dashboard_app(store_path=store.path, live=lambda: live)) as c:
        assert c.get("/api/state").json()["slots"][0]["step"] == 120


def test_a_failing_live_leaves_the_store_view(seeded):
    store, _ = seeded

    def broken() -> dict:
        raise RuntimeError("conductor gone")

    with TestClient(dashboard_app(store_path=store.path, live=broken)) as c:
        answer = c.get("/api/state")
    assert answer.status_code == 200 and answer.json()["slots"][0]["step"] == 120


@pytest.mark.parametrize(
    ("setup", "live", "expected"),
    [
        (lambda s: None, {}, "waiting"),
        (lambda s: s.experiments.start_proposing(MAIN_B), {}, "thinking"),
        (lambda s: setattr(s.state, "paused", True), {}, "paused"),
        (lambda s: s.experiments.start_proposing(MAIN_B), {"blocked": "main's train.py crashed twice"}, "blocked"),
        (lambda s: None, {"budget_usd": 1.0}, "stopped"),  # 1.25 spent
    ],
)
def test_the_agents_state(seeded, setup, live, expected):
    store, _ = seeded
    setup(store)
    with TestClient(dashboard_app(store_path=store.path, live=lambda: live)) as c:
        state = c.get("/api/state").json()
    assert state["agent"]["state"] == expected
    assert [e["id"] for e in state["experiments"]] == [1, 2, 3, 4]  # a proposal in the making is no row


def test_links_get_the_experiment_and_what_github_shows_of_it(seeded):
    store, _ = seeded
    links = dashboard.github_links("owner/repo")
    with TestClient(dashboard_app(store_path=store.path, links=links)) as c:
        rows = {e["id"]: e for e in c.get("/api/state").json()["experiments"]}
    assert rows[1]["links"] == {
        "PR #7": "https://github.com/owner/repo/pull/7",
        "branch": "https://github.com/owner/repo/tree/autoresearch/1-x",
        "diff": f"https://github.com/owner/repo/compare/{MAIN_A}...{'E' * 40}",
    }
    enterprise = dashboard.github_links("o/r", "https://ghe.example.com/api/v3")
    assert enterprise(store.experiments.get(1), {"pr": "7"})["PR #7"] == "https://ghe.example.com/o/r/pull/7"


def test_it_mounts_under_a_prefix_next_to_other_routes(seeded):
    from fastapi import FastAPI

    store, _ = seeded
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    app.include_router(dashboard.create_dashboard(store_path=store.path, token=TOKEN), prefix="/dashboard")
    with TestClient(app) as c:
        assert c.get("/healthz").json() == {"ok": True}  # the token guards the dashboard only
        assert c.get("/dashboard/api/state", params={"token": TOKEN}).json()["queued"] == 1
        assert c.get("/dashboard/api/state").status_code == 401
        moved = c.get("/dashboard", params={"token": TOKEN}, follow_redirects=False)
        assert moved.status_code in (307, 308)  # the page's relative URLs need the slash
        assert moved.headers["location"].endswith("/dashboard/?token=" + quote(TOKEN, safe=""))
        assert 'src="static/app.js?token=' in c.get("/dashboard/", params={"token": TOKEN}).text


def test_an_empty_store_and_a_missing_one(tmp_path: Path):
    Store(tmp_path / "state.db").close()
    with TestClient(dashboard_app(store_path=tmp_path / "state.db")) as c:
        state = c.get("/api/state").json()
    assert state["experiments"] == [] and state["chart"]["points"] == [] and state["main"]["val_bpb"] is None
    with TestClient(dashboard_app(store_path=tmp_path / "none" / "state.db")) as c:
        answer = c.get("/api/state")
    assert answer.status_code == 503 and "no store at" in answer.json()["error"]
    assert not (tmp_path / "none").exists()  # nothing created


def test_a_store_of_an_older_release_is_not_read(tmp_path: Path):
    path = tmp_path / "state.db"
    shutil.copyfile(Path(__file__).parents[1] / "store" / "fixtures" / "state_v0.db", path)
    with TestClient(dashboard_app(store_path=path)) as c:
        answer = c.get("/api/state")
    assert answer.status_code == 503 and "older release" in answer.json()["error"]


# --- read-only, a few queries -------------------------------------------------------------------------


def test_only_get_routes_and_the_store_is_never_written(client: TestClient, seeded):
    store, _ = seeded
    router = dashboard.create_dashboard(store_path=store.path)
    assert {(route.path, *route.methods) for route in router.routes} == {
        ("/", "GET"),
        ("/static/{name}", "GET"),
        ("/api/state", "GET"),
        ("/api/stream", "GET"),
    }
    assert client.post("/api/state").status_code == 405
    before = store.db.execute("PRAGMA data_version").fetchone()[0], store.path.stat().st_mtime_ns
    for path in ("/", "/api/state", "/static/app.js"):
        assert client.get(path).status_code == 200
    assert (store.db.execute("PRAGMA data_version").fetchone()[0], store.path.stat().st_mtime_ns) == before
    readers = ReadPool(store.path)
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
        readers.get().execute("INSERT INTO settings(key, value) VALUES ('x', 'y')")
    readers.close_all()


def _big_store(path: Path, experiments: int) -> None:
    """`experiments` finished experiments with three runs each, written in one transaction (small
    train.py and assets: what is counted here is queries, not bytes)."""
    store = Store(path)
    now = time.time()
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
            " seed, state, status, val_bpb, metrics, queued_at) VALUES (NULL, 'baseline', 'A', ?, ?, ?,"
            " 'cpu', 0, 'done', 'ok', ?, '{}', ?)",
            [(MAIN_A, MAIN_A, "print()\n", 1.0 + i / 1000, now) for i in range(6)],
        )
        for i in range(1, experiments + 1):
            status = ("keep", "discard", "discard", "crash")[i % 4]
            db.execute(
                "INSERT INTO experiments(id, state, status, title, hypothesis, branch, code_hash, asset, "
                "meta, base_sha, head_sha, val_bpb, delta, margin, reason, created_at, updated_at) VALUES "
                "(?, 'done', ?, ?, 'h', ?, ?, ?, '{\"cost_usd\": 0.01}', ?, ?, ?, ?, 0.01, 'r', ?, ?)",
                (
                    i,
                    status,
                    f"experiment {i}",
                    f"autoresearch/{i}-x",
                    f"E{i}",
                    "print()\n",
                    MAIN_A,
                    "e" * 40,
                    1.0 - i / 10_000,
                    -0.001,
                    now,
                    now,
                ),
            )
            db.executemany(
                "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
                " seed, state, status, val_bpb, metrics, queued_at) VALUES (?, 'candidate', ?, ?, ?, ?,"
                " 'cpu', 0, 'done', 'ok', ?, '{\"num_steps\": 100}', ?)",
                [(i, f"E{i}", "e" * 40, MAIN_A, "print()\n", 1.0 - i / 10_000, now)] * 3,
            )
            db.execute("INSERT INTO events(at, experiment_id, kind, message) VALUES (?, ?, 'done', 'm')", (now, i))
    store.close()


def _selects(path: Path) -> tuple[int, dict]:
    readers = ReadPool(path)
    statements: list[str] = []
    with readers.snapshot() as db:
        db.set_trace_callback(statements.append)
        state = build_state(db, links=lambda exp, shown: {"diff": "https://example.com/" + str(exp.id)})
        db.set_trace_callback(None)
    readers.close_all()
    return sum(s.lstrip().upper().startswith("SELECT") for s in statements), state


def test_a_thousand_experiments_take_the_same_few_queries(tmp_path: Path):
    _big_store(tmp_path / "small.db", 3)
    _big_store(tmp_path / "big.db", 1000)
    small, _ = _selects(tmp_path / "small.db")
    big, state = _selects(tmp_path / "big.db")
    assert small == big <= 10  # no query per experiment: one per table, and one per setting (the write ledger: 2)
    assert len(state["experiments"]) == 1000 and len(state["chart"]["points"]) == 1 + 750
    # its time is a benchmark's question (docs/benchmarks.md), not a test's: machines here are shared


# --- the token, the static files ---------------------------------------------------------------------


def test_a_token_guards_every_route(seeded):
    store, _ = seeded
    with TestClient(dashboard_app(store_path=store.path, token=TOKEN)) as c:
        for path in ("/", "/api/state", "/api/stream", "/static/app.js", "/static/style.css"):
            refused = c.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == "Bearer" and "token" in refused.json()["error"]
            assert c.get(path, params={"token": "wrong"}).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/state", params={"token": TOKEN}).status_code == 200
        assert c.get("/api/state", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/api/state", params={"token": TOKEN + "x"}).status_code == 401
        assert c.get("/api/state", params={"token": "ü"}).status_code == 401  # not ASCII: refused, no 500
        page = c.get("/", params={"token": TOKEN}).text
    # the page asks for its files with the token, escaped for a URL inside HTML
    assert 'src="static/app.js?token=dash-t0ken%2Fwith%3Fodd%26chars"' in page
    assert "{{query}}" not in page
    with pytest.raises(ValueError, match="empty"):
        dashboard.create_dashboard(store_path=store.path, token=" ")


def test_the_page_and_its_files_come_from_the_package_with_strict_headers(client: TestClient):
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert 'href="static/style.css"' in page.text and 'src="static/app.js"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "default-src 'none'" in page.headers["content-security-policy"]


@pytest.mark.parametrize(
    "path",
    [
        "/static/..%2Fdashboard.py",
        "/static/..%2F..%2Fpyproject.toml",
        "/static/%2e%2e%2fstore.py",
        "/static/dashboard.py",
        "/static/",
        "/static/.%2Fapp.js",
        "/static/app.js%00",
        "/static/%2Fetc%2Fpasswd",
        "/static/..\\dashboard.py",
    ],
)
def test_the_static_route_serves_its_three_files_only(client: TestClient, path: str):
    answer = client.get(path)
    assert answer.status_code == 404
    assert "import" not in answer.text and "root:" not in answer.text


# --- the stream ----------------------------------------------------------------------------------------


def read_event(lines) -> tuple[str, dict]:
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and name:
            return name, json.loads(line.removeprefix("data: "))
    raise AssertionError("the stream ended without an event")


def test_the_stream_starts_with_the_whole_state(client: TestClient):
    with client.stream("GET", "/api/stream") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        name, state = read_event(answer.iter_lines())
    assert name == "state" and [e["id"] for e in state["experiments"]] == [1, 2, 3, 4]


def test_the_stream_sends_progress_then_a_new_state_through_uvicorn(seeded, tmp_path: Path, monkeypatch):
    store, run_id = seeded
    monkeypatch.setattr(dashboard_stream, "CHECK_S", 0.05)  # each change is seen within a tick, not a second
    server = serve_in_thread(dashboard_app(store_path=store.path, token=TOKEN))
    try:
        with httpx.stream("GET", server.url + "api/stream", params={"token": TOKEN}, timeout=10) as answer:
            lines = answer.iter_lines()
            assert read_event(lines)[0] == "state"
            with open(tmp_path / "runs" / str(run_id) / PROGRESS_FILE, "a") as f:
                f.write('9, "x": 1}\n' + progress_line(140, 3.1, 0.6, 24.0))
            name, data = read_event(lines)
            assert name == "progress" and data["slots"][0]["step"] == 140
            store.runs.finish(run_id, status="ok", val_bpb=0.965, metrics=COUNTED, error=None, log_tail="")
            name, data = read_event(lines)
            assert name == "state" and data["slots"] == []
    finally:
        server.stop()
    assert not server.thread.is_alive()


# --- a real browser ------------------------------------------------------------------------------------

PHONE = {"width": 412, "height": 915, "deviceScaleFactor": 1, "mobile": True}


@pytest.fixture
def served(seeded, monkeypatch):
    """The dashboard, with a token, on a free loopback port (stopped after the browser has quit);
    its stream looks at the store every 0.05 s instead of every second."""
    store, _ = seeded
    monkeypatch.setattr(dashboard_stream, "CHECK_S", 0.05)
    server = serve_in_thread(dashboard_app(store_path=store.path, token=TOKEN))
    yield server
    server.stop()
    assert not server.thread.is_alive()


@pytest.fixture
def browser(served):
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip(
            "the browser test needs /usr/bin/chromium and /usr/bin/chromedriver "
            "(Debian: apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--proxy-server=127.0.0.1:9",
    ):  # a proxy that answers nothing: a request off this machine fails
        options.add_argument(argument)
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)  # a phone's screen
        yield driver
    finally:
        driver.quit()


def screenshot(browser, name: str, tmp_path: Path) -> None:
    """The whole page on the phone's screen, into tests/artifacts (kept by the CI) and the test's tmp dir."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**PHONE, "height": max(PHONE["height"], height)})
    ARTIFACTS.mkdir(exist_ok=True)
    for path in (ARTIFACTS / name, tmp_path / name):
        assert browser.save_screenshot(str(path)), path
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)


def test_the_page_in_a_browser_draws_the_state_and_follows_a_finished_run(seeded, served, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    store, run_id = seeded
    browser.get(served.url + "?" + urlencode({"token": TOKEN}))
    wait = WebDriverWait(browser, 10, poll_frequency=0.1)

    def count(selector: str) -> int:
        return len(browser.find_elements(By.CSS_SELECTOR, selector))

    wait.until(lambda _: count("#experiments tbody tr") == 4)
    assert browser.find_element(By.ID, "link").text == "live"
    assert count("#chart svg circle") == 3  # baseline, kept, discarded
    assert count("#chart svg path.crash") == 1
    assert [r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#experiments tbody tr")] == [
        "4",
        "3",
        "2",
        "1",
    ]  # newest first
    assert "Huge <b>batch</b>" in browser.find_element(By.CSS_SELECTOR, "tr[data-id='3']").text  # text, not HTML
    [slot] = browser.find_elements(By.CSS_SELECTOR, "#slots .slot")
    assert "#4 Still running" in slot.text and "step 120" in slot.text and "30 s left" in slot.text
    assert browser.find_element(By.ID, "main-value").text == "0.971000"
    assert browser.find_element(By.ID, "queued").text == "(1 queued)"
    assert browser.execute_script("return [window.innerWidth, document.documentElement.scrollWidth]") == [412, 412]
    assert browser.execute_script(  # the phone sees the whole table without scrolling it sideways
        "const t = document.querySelector('.table-wrap'); return t.scrollWidth <= t.clientWidth"
    )
    screenshot(browser, "dashboard.png", tmp_path)
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    screenshot(browser, "dashboard-dark.png", tmp_path)

    assert not browser.find_element(By.ID, "key-simplicity").is_displayed()  # no keep for simplicity yet
    store.runs.finish(run_id, status="ok", val_bpb=0.965, metrics=COUNTED, error=None, log_tail="")
    store.experiments.update(
        4,
        state="done",
        status="keep",
        val_bpb=0.9712,
        delta=0.0002,
        reason="kept for simplicity: 2 fewer lines of code (9 fewer code tokens)",
        meta={"kept_for_simplicity": {"lines": 2, "tokens": 9, "loss_margin": 0.004}},
    )
    wait.until(lambda _: count("#slots .slot") == 0 and count("#chart svg rect.point.simplicity") == 1)
    assert count("#chart svg circle") == 3  # a keep for simplicity is a square, not a dot
    assert "nothing running" in browser.find_element(By.ID, "slots").text
    pill = browser.find_element(By.CSS_SELECTOR, "tr[data-id='4'] .pill")
    assert pill.text == "keep (simplicity)"
    assert pill.get_attribute("title") == "kept for simplicity, 2 fewer lines of code (9 fewer code tokens)"
    assert browser.find_element(By.ID, "key-simplicity").is_displayed()
    assert "2 kept (1 for simplicity)" in browser.find_element(By.ID, "counts-detail").text
    assert browser.find_element(By.ID, "link").text == "live"  # by the stream, not by polling

    origins = browser.execute_script("return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert set(origins) <= {served.url.rstrip("/")}  # nothing loaded from elsewhere
    problems = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert problems == []  # no script error, no blocked resource, no Content-Security-Policy violation


# --- what many viewers cost ------------------------------------------------------------------------------


def test_the_state_is_built_and_encoded_once_per_change_of_the_store(seeded, tmp_path: Path, monkeypatch):
    store, run_id = seeded
    built = []
    real = dashboard_state.build_state
    monkeypatch.setattr(dashboard_state, "build_state", lambda db, **kw: built.append(1) or real(db, **kw))
    with TestClient(dashboard_app(store_path=store.path)) as c:
        states = [c.get("/api/state").json() for _ in range(20)]
        with open(tmp_path / "runs" / str(run_id) / PROGRESS_FILE, "a") as f:
            f.write('9, "x": 1}\n' + progress_line(140, 3.1, 0.6, 24.0))
        moved = c.get("/api/state").json()
        assert len(built) == 1  # progress moves without the store changing: only the slots are read again
        store.runs.finish(run_id, status="ok", val_bpb=0.965, metrics=COUNTED, error=None, log_tail="")
        finished = c.get("/api/state").json()
    assert len(built) == 2
    assert all(
        {k: v for k, v in s.items() if k != "updated_at"} == {k: v for k, v in states[0].items() if k != "updated_at"}
        for s in states
    )
    assert states[0]["slots"][0]["step"] == 120 and moved["slots"][0]["step"] == 140
    assert {k: v for k, v in moved.items() if k not in ("slots", "updated_at")} == {
        k: v for k, v in states[0].items() if k not in ("slots", "updated_at")
    }
    assert finished["slots"] == [] and finished["queued"] == states[0]["queued"]
    assert set(finished) == set(states[0])  # the same keys, whichever way the answer was put together


def test_open_streams_share_one_read_of_the_store(seeded, monkeypatch):
    store, _ = seeded
    monkeypatch.setattr(dashboard_stream, "CHECK_S", 3600.0)  # the feed's next look is an hour away
    app = dashboard_app(store_path=store.path)
    dash = app.state.dashboard
    looks = []
    real = dash.look
    dash.look = lambda generation=0: looks.append(generation) or real(generation)
    with TestClient(app) as c, ExitStack() as open_streams:
        ids, readers = [], []  # a reader dropped would close its stream
        for _ in range(5):
            answer = open_streams.enter_context(c.stream("GET", "/api/stream"))
            readers.append(answer.iter_lines())
            name, state = read_event(readers[-1])
            assert name == "state"
            ids.append(state["updated_at"])
        assert dash.open_streams == 5
    assert looks == [1]  # five streams, one read: each got the same look
    assert len(set(ids)) == 1
    assert dash.open_streams == 0


def test_streams_past_the_bound_are_503_with_retry_after(seeded, monkeypatch):
    store, _ = seeded
    monkeypatch.setattr(dashboard_stream, "MAX_STREAMS", 3)
    app = dashboard_app(store_path=store.path)
    with TestClient(app) as c:
        with ExitStack() as open_streams:
            readers = []  # a reader dropped would close its stream
            for _ in range(3):
                answer = open_streams.enter_context(c.stream("GET", "/api/stream"))
                readers.append(answer.iter_lines())
                assert answer.status_code == 200 and read_event(readers[-1])[0] == "state"
            assert app.state.dashboard.open_streams == 3
            refused = c.get("/api/stream")
            assert c.get("/api/state").status_code == 200  # the page polls meanwhile
        assert app.state.dashboard.open_streams == 0  # each closed stream gave its place back
        with c.stream("GET", "/api/stream") as answer:
            assert answer.status_code == 200 and read_event(answer.iter_lines())[0] == "state"
    assert refused.status_code == 503 and refused.headers["retry-after"] == "60"
    assert refused.headers["cache-control"] == "no-store"
    assert refused.json()["error"].startswith("the dashboard has 3 live streams open, its most: the page shows")


def test_a_client_that_stops_reading_is_closed_and_gives_its_place_back(seeded, monkeypatch, caplog):
    store, _ = seeded
    monkeypatch.setattr(dashboard_stream, "MAX_STREAMS", 1)
    monkeypatch.setattr(dashboard_stream, "SEND_S", 0.2)  # the test client takes nothing it is not asked for
    app = dashboard_app(store_path=store.path)
    dash = app.state.dashboard
    with TestClient(app) as c, caplog.at_level("INFO", logger="bot.views.dashboard_stream"):
        with c.stream("GET", "/api/stream") as stuck:  # the headers came; the body is never read
            assert stuck.status_code == 200
            deadline = time.monotonic() + 10
            while dash.open_streams and time.monotonic() < deadline:
                time.sleep(0.02)
            assert dash.open_streams == 0
            with c.stream("GET", "/api/stream") as answer:  # its place is free for a reader
                assert answer.status_code == 200 and read_event(answer.iter_lines())[0] == "state"
    assert "its client took nothing for 0 s" in caplog.text


def test_the_write_budget_is_shown_with_its_mode(seeded):
    store, _ = seeded
    now = time.time()
    store.writes.add(
        [Write(now - 4000, "branch", True), Write(now - 100, "branch", True), Write(now - 5, "pull", False)]
    )
    store.writes.mode = WriteMode("degraded", now - 60, "over 90% of GitHub's 500")
    with TestClient(dashboard_app(store_path=store.path)) as c:
        shown = c.get("/api/state").json()["write_budget"]
    assert shown == {
        "windows": [{"seconds": 60.0, "writes": 1, "limit": 80}, {"seconds": 3600.0, "writes": 2, "limit": 500}],
        "mode": "degraded",
        "since": pytest.approx(now - 60),
        "why": "over 90% of GitHub's 500",
    }
