"""Benchmark: `autoresearch serve` under a webhook load while its conductor works, on loopback.

Three processes, so that no two of them share an interpreter (and its GIL):

- the GitHub stand-in of the tests (`--standin`), the repository the bot works on;
- the service (`--child`): the real `autoresearch serve` command (bot.app.cli, its settings from
  AUTORESEARCH_* variables, its logging, uvicorn with its access log) with the `scripted` agent
  (a JSON-lines file of proposals) and one thing swapped: the local runner is the tests'
  FakeRunner, whose runs finish at their first lookup, so the conductor proposes, publishes and
  decides experiments (pull requests, check runs, comments, merges on the stand-in) throughout;
- this process: the clients.

Once the conductor has its first experiment under way, the clients send N signed
`issue_comment.created` deliveries (the vendored example, put on a pull request, its author a
MEMBER, each with its own comment id and text) with at most C requests in flight, each on a new
connection as GitHub's hookshot does. A share of them (--redeliver) are redeliveries: the same
X-GitHub-Delivery id and bytes sent at the same instant as the original (each pair takes two of
the C places). A request's latency is its wall time from connecting to the last byte of the
answer, measured by an asyncio client (one thread, plain sockets, no HTTP library). Before the
measured load, `--warmup` deliveries start the server's worker threads (reported apart).

After the load the bench waits until the conductor has applied the whole inbox, stops the
service (SIGTERM, as systemd would) and checks the store read-only: every delivery id sent is
one inbox row, there is no other row, every row is processed, each comment reached the agent's
feedback exactly once (a redelivery applied twice would show twice), each pair was answered
once 202 and once 200, and nothing answered 5xx or failed. Any miss exits non-zero.

    .venv/bin/python bench/webhook_load.py [--deliveries 5000] [--concurrency 64] [--redeliver 0.1]
        [--rate R] [--trace-store] [--web-module FILE] [--events-module FILE] [--quiet] [--fast-http DIR]
        [--switch-ms MS]

To find where the time goes: --trace-store times the web's inbox writes and the conductor's write
transactions and reports the service's CPU by thread; --web-module and --events-module run another
bot/app/web.py and bot/loop/inbox.py (say HEAD's) for a before/after in one session; --quiet, --fast-http
and --switch-ms each change one thing about the service process. On a small machine compare runs
of one session, not across days.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import math
import os
import platform
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the project first: tests/bot (a directory, no package) must not shadow bot/
sys.path.append(str(ROOT / "tests"))

from bench.webhook_latency import template  # noqa: E402 - the delivery payload both benches send

SECRET = "bench-webhook-secret"
TEXT = "load comment"  # every comment's text starts so; the feedback check finds them by it


# --- the GitHub stand-in and the service, each in its own process ----------------------------------


def standin_main(root: Path, key_file: Path) -> None:
    """A GitHubStandIn; prints its URL, serves until stdin closes, then prints what it served."""
    from cryptography.hazmat.primitives import serialization
    from github_standin import GitHubStandIn

    files = {name: (root / "files" / name).read_text() for name in ("train.py", "program.md")}
    public = serialization.load_pem_public_key(key_file.read_bytes())
    with GitHubStandIn(root / "github", files=files, app_public_key=public) as gh:
        print(json.dumps({"api_url": gh.api_url}), flush=True)
        sys.stdin.read()
        requests = gh.requests
        print(
            json.dumps(
                {
                    "requests": len(requests),
                    "creating": sum(r.created for r in requests),
                    "violations": len(gh.violations),
                }
            ),
            flush=True,
        )


def child_main(
    run_seconds: float,
    quiet: bool,
    trace: Path | None,
    web_module: Path | None,
    switch_ms: float | None,
    events_module: Path | None = None,
) -> None:
    """`autoresearch serve`, as typed, with the local runner swapped for the tests' FakeRunner (its
    jobs lasting `run_seconds`); `quiet`: without the log lines a delivery costs (uvicorn's
    access log, bot.app.web's INFO line); `trace`: time the store's writes, written there at exit;
    `web_module`, `events_module`: this file serves as bot.app.web, bot.loop.inbox (another version of it, to
    compare in one session);
    `switch_ms`: the interpreter's switch interval (sys.setswitchinterval; Python's default is 5 ms)."""
    if switch_ms is not None:
        sys.setswitchinterval(switch_ms / 1000)
    for name, path in (("bot.loop.inbox", events_module), ("bot.app.web", web_module)):
        if path is not None:
            import importlib.util

            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    import logging
    import threading

    import uvicorn
    from fakes import IDENTITY, FakeRunner

    import bot.app.serve
    from bot.agent.choice import make_agent
    from bot.app.cli import app
    from bot.core.records import RunStatus

    class TimedRunner(FakeRunner):
        """A job runs `run_seconds`, then tells the driver (as a real runner does)."""

        def __init__(self) -> None:
            super().__init__(auto=True)
            self.ends: dict[int, float] = {}

        def submit(self, job: Any) -> str:
            if job.run_id not in self.ends:
                self.ends[job.run_id] = time.monotonic() + run_seconds
                threading.Timer(run_seconds, lambda: self._notify and self._notify()).start()
            return super().submit(job)

        def lookup(self, run_id: int) -> RunStatus:
            if time.monotonic() < self.ends.get(run_id, 0.0):
                return RunStatus("running", progress={"step": 1, "loss": 5.0, "progress": 0.5})
            return super().lookup(run_id)

    def fake_local_parts(settings: Any, client: Any = None) -> bot.app.serve.Parts:
        agent, budget = make_agent(settings.agent, script=settings.agent_script)
        return bot.app.serve.Parts(runner=TimedRunner(), agent=agent, identity=dict(IDENTITY), budget_usd=budget)

    bot.app.serve.local_parts = fake_local_parts  # default_parts looks it up when the conductor connects
    if quiet:
        configure = uvicorn.Config.configure_logging

        def configure_quietly(self: uvicorn.Config) -> None:
            configure(self)
            logging.getLogger("uvicorn.access").setLevel(logging.WARNING)

        uvicorn.Config.configure_logging = configure_quietly  # type: ignore[method-assign]
        logging.getLogger("bot.app.web").setLevel(logging.WARNING)
    if trace is None:
        app(["serve"], prog_name="autoresearch")
        return
    from bot.store.db import Database
    from bot.store.inbox import Inbox

    spans: dict[str, Any] = {"inbox_insert": [], "conductor_write": [], "writer_commit": []}
    add_inbox, add_inbox_many, transaction = Inbox.add, Inbox.add_many, Database.transaction

    def timed_add_inbox(self: Inbox, **kwargs: Any) -> bool:
        start = time.time()
        try:
            return add_inbox(self, **kwargs)
        finally:
            spans["inbox_insert"].append((start, time.time()))

    def timed_add_inbox_many(self: Inbox, entries: list[dict[str, Any]], **kwargs: Any) -> list[bool]:
        start = time.time()
        try:
            return add_inbox_many(self, entries, **kwargs)
        finally:  # waits for the lock, inserts, commits
            spans["writer_commit"].append((start, time.time(), len(entries)))

    @contextlib.contextmanager
    def timed_transaction(self: Database) -> Any:
        outer, start = not self._depth, time.time()
        try:
            with transaction(self) as db:
                yield db
        finally:
            if outer and threading.current_thread().name == "conductor":  # waits for, then holds
                spans["conductor_write"].append((start, time.time()))

    def write_trace(*_: Any) -> None:
        spans["threads"] = {str(t.native_id): t.name for t in threading.enumerate()}
        trace.write_text(json.dumps(spans))
        sys.exit(0)

    Inbox.add, Inbox.add_many = timed_add_inbox, timed_add_inbox_many  # type: ignore[method-assign]
    Database.transaction = timed_transaction  # type: ignore[method-assign]
    # uvicorn restores this handler after its shutdown and raises SIGTERM again
    signal.signal(signal.SIGTERM, write_trace)
    app(["serve"], prog_name="autoresearch")


def proposals(n: int) -> list[dict[str, str]]:
    """n scripted proposals: a third better than main, a third worse, a third crashing."""
    from fakes import CRASH_MARK, with_effect

    main = with_effect((ROOT / "train.py").read_text(), 0.0, "main")
    out = []
    for i in range(n):
        kind = ("keep", "discard", "crash")[i % 3]
        effect = {"keep": -0.01 * (i + 1), "discard": 0.1, "crash": 0.0}[kind]
        out.append(
            {
                "title": f"{kind} {i}",
                "hypothesis": f"hypothesis {i}",
                "train_py": with_effect(main, effect, f"p{i}") + (CRASH_MARK if kind == "crash" else ""),
            }
        )
    return out


def program(n: int) -> str:
    return (
        f"---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n  max_experiments: {n}\n---\n\n"
        "Lower val_bpb.\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process so far."""
    return cpu_seconds_of(Path(f"/proc/{pid}/stat"))


def thread_cpu(pid: int) -> dict[str, float]:
    """User + system CPU of each live thread of a process so far, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[task.name] = cpu_seconds_of(task / "stat")
        except (OSError, IndexError):
            pass  # the thread ended meanwhile
    return out


def cpu_seconds_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    """The stand-in and the service, started in a fresh directory; stop() ends both."""

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from fakes import with_effect

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        (root / "files").mkdir()
        (root / "files" / "train.py").write_text(with_effect((ROOT / "train.py").read_text(), 0.0, "main"))
        (root / "files" / "program.md").write_text(program(args.experiments))
        key_file = root / "app.pub"
        key_file.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        script = root / "proposals.jsonl"
        script.write_text("".join(json.dumps(p) + "\n" for p in proposals(args.experiments)))
        self.standin = subprocess.Popen(
            [sys.executable, __file__, "--standin", str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.standin.stdout.readline()
        if not line:
            raise RuntimeError("the GitHub stand-in did not start; see its output above")
        api_url = json.loads(line)["api_url"]
        self.port = free_port()
        self.state_dir = root / "state"
        self.log = root / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_")}
        env.update(
            AUTORESEARCH_REPOSITORY="octo-org/research",
            AUTORESEARCH_GITHUB_APP_ID="1",
            AUTORESEARCH_GITHUB_PRIVATE_KEY=pem,
            AUTORESEARCH_GITHUB_API_URL=api_url,
            AUTORESEARCH_WEBHOOK_SECRET=SECRET,
            AUTORESEARCH_STATE_DIR=str(self.state_dir),
            AUTORESEARCH_PROFILE="smoke",
            AUTORESEARCH_PORT=str(self.port),
            AUTORESEARCH_AGENT="scripted",
            AUTORESEARCH_AGENT_SCRIPT=str(script),
        )
        if args.fast_http:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.fast_http), env.get("PYTHONPATH")]))
        self.trace = root / "store-trace.json" if args.trace_store else None
        self.service = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                "--run-seconds",
                str(args.run_seconds),
                *(["--quiet"] if args.quiet else []),
                *(["--switch-ms", str(args.switch_ms)] if args.switch_ms else []),
                *(["--web-module", str(args.web_module)] if args.web_module else []),
                *(["--events-module", str(args.events_module)] if args.events_module else []),
                *(["--trace-file", str(self.trace)] if self.trace else []),
            ],
            cwd=root,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> dict[str, Any]:
        if self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(30)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)
        out, _ = self.standin.communicate(input="", timeout=60)
        return json.loads(out.strip().splitlines()[-1])


def healthz(port: int) -> dict[str, Any] | None:
    import http.client

    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        return json.loads(answer.read()) if answer.status == 200 else None
    except (OSError, ValueError):
        return None


def read_store(path: Path, query: str, args: tuple = ()) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(query, args).fetchall()
    finally:
        db.close()


def conductor_counts(store: Path) -> dict[str, int]:
    [(experiments, done)] = read_store(store, "SELECT COUNT(*), COALESCE(SUM(state = 'done'), 0) FROM experiments")
    [(runs,)] = read_store(store, "SELECT COUNT(*) FROM runs WHERE finished_at IS NOT NULL")
    [(events,)] = read_store(store, "SELECT COUNT(*) FROM events")
    [(processed,)] = read_store(store, "SELECT COUNT(*) FROM inbox WHERE processed_at IS NOT NULL")
    return {
        "experiments": experiments,
        "experiments_done": done,
        "runs_finished": runs,
        "events": events,
        "inbox_processed": processed,
    }


# --- deliveries ------------------------------------------------------------------------------------


class Delivery:
    """One signed request, its bytes built before the clock starts."""

    def __init__(self, payload: dict, comment_id: int, port: int) -> None:
        payload = {**payload, "comment": {**payload["comment"], "id": comment_id, "body": f"{TEXT} {comment_id}"}}
        self.id = str(uuid.uuid4())
        self.comment_id = comment_id
        body = json.dumps(payload).encode("utf-8")
        signature = hmac.new(SECRET.encode("utf-8"), body, hashlib.sha256).hexdigest()
        head = (
            f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n"
            "User-Agent: GitHub-Hookshot/bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-GitHub-Event: issue_comment\r\nX-GitHub-Delivery: {self.id}\r\n"
            f"X-GitHub-Hook-ID: 1\r\nX-Hub-Signature-256: sha256={signature}\r\nConnection: close\r\n\r\n"
        )
        self.request = head.encode("ascii") + body


def batches(n: int, share: float, port: int, first_comment: int) -> list[list[Delivery]]:
    """n requests: pairs (an original and its redelivery, sent at once) spread evenly among singles."""
    pairs = round(n * share)
    unique = n - pairs
    payload = template()
    out: list[list[Delivery]] = []
    for i in range(unique):
        delivery = Delivery(payload, first_comment + i, port)
        paired = pairs and math.floor((i + 1) * pairs / unique) > math.floor(i * pairs / unique)
        out.append([delivery, delivery] if paired else [delivery])
    return out


# --- the client ------------------------------------------------------------------------------------


class Result:
    __slots__ = ("delivery", "end", "error", "start", "status")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery, self.status, self.start, self.end, self.error = delivery, None, 0.0, 0.0, None

    @property
    def ms(self) -> float:
        return 1000 * (self.end - self.start)


async def send(port: int, result: Result) -> None:
    """One request on a new connection; the status of the answer once its last byte is read."""
    result.start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(result.delivery.request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next(
                (int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), None
            )
            if length is None:
                await reader.read()  # no length: the answer ends with the connection
            else:
                await reader.readexactly(length)
            result.status = int(lines[0].split()[1])
        finally:
            writer.close()
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as error:
        result.error = repr(error)
    result.end = time.perf_counter()


async def fire(
    port: int, work: list[list[Delivery]], concurrency: int, rate: float | None = None
) -> tuple[list[list[Result]], float]:
    """Every batch, at most `concurrency` requests in flight; a pair starts both its requests at once.
    With `rate`, batch i starts no earlier than i / rate seconds after the first."""
    places = asyncio.Semaphore(concurrency)
    out = [[Result(d) for d in batch] for batch in work]
    tasks = []

    async def one(result: Result) -> None:
        try:
            await send(port, result)
        finally:
            places.release()

    started = time.perf_counter()
    for i, batch in enumerate(out):
        if rate and (wait := started + i / rate - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        for _ in batch:
            await places.acquire()
        tasks += [asyncio.create_task(one(result)) for result in batch]
    await asyncio.gather(*tasks)
    return out, time.perf_counter() - started


# --- reporting -------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summarize(results: list[Result], wall: float) -> dict[str, Any]:
    ms = [r.ms for r in results]
    return {
        "requests": len(results),
        "wall_s": round(wall, 2),
        "per_s": round(len(results) / wall, 1),
        "p50_ms": round(percentile(ms, 50), 1),
        "p95_ms": round(percentile(ms, 95), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
        "over_100ms": sum(m > 100 for m in ms),
        "statuses": dict(sorted(Counter(str(r.status) for r in results).items())),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=5000, help="requests in the measured load (default 5000)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at most (default 64)")
    parser.add_argument(
        "--redeliver",
        type=float,
        default=0.1,
        help="share of the requests that redeliver an id at the same instant (default 0.1)",
    )
    parser.add_argument("--warmup", type=int, default=64, help="deliveries sent first, reported apart (default 64)")
    parser.add_argument("--experiments", type=int, default=300, help="proposals the agent has (default 300)")
    parser.add_argument("--keep", type=Path, help="keep the state directory and the service's log here")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="BIN",
        help="sample the service with this py-spy during the "
        "load (the thread holding the GIL), collapsed stacks into --keep's py-spy.txt",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="the service without its log lines per delivery "
        "(bot.app.web's INFO line; uvicorn's access line, which `serve` now leaves out for /webhook "
        "anyway), to see what they cost",
    )
    parser.add_argument(
        "--fast-http",
        type=Path,
        metavar="DIR",
        help="put DIR on the service's PYTHONPATH: with "
        "httptools and uvloop there, uvicorn uses them (its 'auto' choice) instead of h11 and asyncio",
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=6.0,
        help="how long a training run lasts (default 6: "
        "about GitHub's 80 content-creating requests a minute, so the conductor is not held by its "
        "write pacing for long)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="open loop: start a delivery (or a redelivery pair) this many "
        "times a second, still at most --concurrency in flight (default: closed loop, as fast as "
        "answers come)",
    )
    parser.add_argument(
        "--trace-store",
        action="store_true",
        help="time the service's inbox inserts and the conductor's "
        "write transactions (into --keep's store-trace.json) and report how they overlap",
    )
    parser.add_argument(
        "--web-module",
        type=Path,
        metavar="FILE",
        help="serve with FILE as bot.app.web (e.g. "
        "`git show HEAD~1:bot/app/web.py > /tmp/web_before.py`), to compare two versions in one session",
    )
    parser.add_argument(
        "--events-module",
        type=Path,
        metavar="FILE",
        help="serve with FILE as bot.loop.inbox (the inbox's applier), as --web-module does for bot.app.web",
    )
    parser.add_argument(
        "--switch-ms",
        type=float,
        help="the service's GIL switch interval in ms (Python's default: 5); "
        "a thread back from SQLite waits up to this long for the GIL while the event loop computes",
    )
    parser.add_argument("--standin", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace-file", dest="trace", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standin:
        standin_main(args.standin, args.standin / "app.pub")
        return 0
    if args.child:
        child_main(args.run_seconds, args.quiet, args.trace, args.web_module, args.switch_ms, args.events_module)
        return 0
    if args.deliveries < 2 or args.concurrency < 2 or not 0 <= args.redeliver <= 0.5:
        parser.error("--deliveries and --concurrency must be at least 2, --redeliver within 0..0.5")

    machine = {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    print(
        f"# {' '.join(sys.argv)}  |  {time.strftime('%Y-%m-%d %H:%M')}  |  {machine['cpu_count']} CPUs "
        f"{machine['processor']}, {machine['platform']}, Python {machine['python']}, SQLite {machine['sqlite']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="webhook-load-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        procs = Processes(root, args)
        store = procs.state_dir / "state.db"
        try:
            report = drive(args, procs, store)
        finally:
            served = procs.stop()
        report["github_standin"] = served
        window = report.pop("window")
        report["pacing_s_during_load"] = pacing(procs.log, *window)
        threads = report.pop("thread_cpu")
        if procs.trace is not None and procs.trace.exists():
            spans = json.loads(procs.trace.read_text())
            report["store_trace"] = store_trace(spans, *window)
            names = Counter()
            for tid, cpu in threads.items():
                name = spans["threads"].get(tid, "other threads (request workers, the inbox writer)")
                names["event loop (MainThread)" if name == "MainThread" else name] += cpu
            report["service_cpu_s_by_thread"] = {k: round(v, 2) for k, v in names.most_common()}
        failures = check(report, store)
    report.update(load_after=[round(x, 2) for x in os.getloadavg()], machine=machine, ok=not failures)
    print_report(report)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def drive(args: argparse.Namespace, procs: Processes, store: Path) -> dict[str, Any]:
    """Wait for the service and its first experiment, send the warm-up and the load, wait for the
    conductor to apply the inbox; the figures and what was sent."""
    deadline = time.monotonic() + 120
    while not ((health := healthz(procs.port)) and health.get("conductor") == "running"):
        if procs.service.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the service did not start; its log:\n{procs.tail()}")
        time.sleep(0.2)
    comments = iter(range(1_000_000, 2_000_000))
    warm_work = [batch for _ in range(args.warmup) for batch in batches(1, 0.0, procs.port, next(comments))]
    warm, warm_wall = asyncio.run(fire(procs.port, warm_work, args.concurrency)) if warm_work else ([], 1.0)
    first = summarize([r for batch in warm for r in batch], warm_wall) if warm else None
    # The runner's jobs end at their first lookup, but only a tick looks: a delivery a second wakes
    # the conductor until it has proposed its first experiment (these count as warm-up too).
    while not read_store(store, "SELECT COUNT(*) FROM experiments")[0][0]:
        if procs.service.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the service did not start its first experiment; its log:\n{procs.tail()}")
        nudge = batches(1, 0.0, procs.port, next(comments))
        warm_work += nudge
        warm += asyncio.run(fire(procs.port, nudge, 1))[0]
        time.sleep(1.0)
    work = batches(args.deliveries, args.redeliver, procs.port, 2_000_000)

    spy = None
    if args.py_spy:
        spy = subprocess.Popen(
            [
                str(args.py_spy),
                "record",
                "--gil",
                "--threads",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(procs.log.with_name("py-spy.txt")),
                "-p",
                str(procs.service.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
    load_before = [round(x, 2) for x in os.getloadavg()]
    before, cpu0, client0 = conductor_counts(store), cpu_seconds(procs.service.pid), time.process_time()
    threads0 = thread_cpu(procs.service.pid)
    load_started = time.time()
    results, wall = asyncio.run(fire(procs.port, work, args.concurrency, args.rate))
    load_ended = time.time()
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    server_cpu, client_cpu = cpu_seconds(procs.service.pid) - cpu0, time.process_time() - client0
    threads = {tid: cpu - threads0.get(tid, 0.0) for tid, cpu in thread_cpu(procs.service.pid).items()}
    during = {k: v - before[k] for k, v in conductor_counts(store).items()}

    sent = {d.id for batch in warm_work + work for d in batch}
    drain_start = time.monotonic()
    while read_store(store, "SELECT COUNT(*) FROM inbox WHERE processed_at IS NULL")[0][0]:
        if procs.service.poll() is not None or time.monotonic() > drain_start + 600:
            break  # check() reports what is left unprocessed
        time.sleep(0.2)
    drain_s = time.monotonic() - drain_start

    flat = [r for batch in results for r in batch]
    pairs = [batch for batch in results if len(batch) == 2]
    return {
        "load": summarize(flat, wall),
        "warmup": first,
        "concurrency": args.concurrency,
        "unique_ids": len(work),
        "pairs": len(pairs),
        "pairs_overlapping": sum(max(a.start, b.start) < min(a.end, b.end) for a, b in pairs),
        "pair_answers": dict(Counter(",".join(sorted(str(r.status) for r in batch)) for batch in pairs)),
        "errors": [r.error for r in flat + [r for b in warm for r in b] if r.error][:5],
        "non_2xx": sum(1 for r in flat + [r for b in warm for r in b] if r.status is None or not 200 <= r.status < 300),
        "server_cpu_s": round(server_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "conductor_during_load": during,
        "drain_s_after_load": round(drain_s, 1),
        "load_before": load_before,
        "sent_ids": sent,
        "rate": args.rate,
        "window": (load_started, load_ended),
        "thread_cpu": threads,
        "sent_comments": {d.comment_id for batch in warm_work + work for d in batch},
    }


def pacing(log: Path, start: float, end: float) -> float:
    """Seconds of the load window the conductor spent waiting in GitHub's write pacing (its log says)."""
    from datetime import datetime

    held = 0.0
    for line in log.read_text(errors="replace").splitlines():
        if "pacing writes" in line and line[:4].isdigit():
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            wait = float(line.rsplit("waiting ", 1)[1].split()[0])
            held += max(0.0, min(end, at + wait) - max(start, at))
    return round(held, 1)


def store_trace(spans: dict[str, list[list[float]]], start: float, end: float) -> dict[str, Any]:
    """In the load window: how long the web's inbox inserts took (lock waits, busy waits, fsync; for a
    web server that writes in batches, each batch's transaction from waiting for the lock to its
    commit, and the rows in it), the conductor's write transactions (waiting for and holding the
    write lock), and the inserts that ran while a conductor transaction did."""
    batched = [(a, b, n) for a, b, n in spans.get("writer_commit", []) if start <= a <= end]
    commits = [(a, b) for a, b, _ in batched]
    inserts = commits or [(a, b) for a, b in spans["inbox_insert"] if start <= a <= end]
    writes = [(a, b) for a, b in spans["conductor_write"] if b >= start and a <= end]
    busy = sum(min(b, end) - max(a, start) for a, b in writes)

    def during_write(a: float, b: float) -> bool:
        return any(wa < b and a < wb for wa, wb in writes)

    def ms(pairs: list[tuple[float, float]]) -> dict[str, float]:
        values = [1000 * (b - a) for a, b in pairs] or [0.0]
        return {
            "n": len(pairs),
            "p50_ms": round(percentile(values, 50), 2),
            "p99_ms": round(percentile(values, 99), 2),
            "max_ms": round(max(values), 1),
            "sum_s": round(sum(values) / 1000, 2),
        }

    overlapping = [p for p in inserts if during_write(*p)]
    rows = [n for _, _, n in batched] or [0]
    return {
        "inbox_inserts": ms(inserts),
        "writer_commits": {**ms(commits), "rows_mean": round(sum(rows) / len(rows), 1), "rows_max": max(rows)},
        "inserts_during_a_conductor_write": ms(overlapping),
        "inserts_otherwise": ms([p for p in inserts if not during_write(*p)]),
        "conductor_writes": ms(writes),
        "conductor_write_share_of_window": round(busy / (end - start), 3),
    }


def check(report: dict[str, Any], store: Path) -> list[str]:
    """What must hold: every id one row, all processed, each comment applied once, pairs 202+200."""
    failures = []
    sent, comments = report.pop("sent_ids"), report.pop("sent_comments")
    rows = read_store(store, "SELECT key, processed_at IS NOT NULL, outcome FROM inbox")
    keys = Counter(key for key, _, _ in rows)
    stored = {key.removeprefix("github:") for key in keys}
    missing, extra = sent - stored, stored - sent
    twice = [k for k, n in keys.items() if n > 1]
    unprocessed = [k for k, done, _ in rows if not done]
    outcomes = Counter(outcome for _, _, outcome in rows)
    feedback = Counter(
        text.rsplit(" ", 1)[1]
        for (text,) in read_store(store, "SELECT text FROM feedback WHERE text LIKE ?", (f"%: {TEXT} %",))
    )
    applied = Counter(feedback.get(str(c), 0) for c in comments)
    report["store"] = {
        "inbox_rows": len(rows),
        "ids_sent": len(sent),
        "missing": len(missing),
        "extra": len(extra),
        "stored_twice": len(twice),
        "unprocessed": len(unprocessed),
        "outcomes": dict(outcomes),
        "comments_applied": {f"{k}x": v for k, v in sorted(applied.items())},
    }
    if missing or extra or twice:
        failures.append(f"store: {len(missing)} ids missing, {len(extra)} rows not sent, {len(twice)} stored twice")
    if unprocessed:
        failures.append(f"{len(unprocessed)} inbox rows were never processed by the conductor")
    if set(applied) != {1}:
        failures.append(f"comments reached the feedback {dict(applied)} times (each must once)")
    if report["non_2xx"]:
        failures.append(f"{report['non_2xx']} requests were not answered 2xx ({report['errors']})")
    if report["pairs"] and report["pair_answers"] != {"200,202": report["pairs"]}:
        failures.append(f"redelivery pairs answered {report['pair_answers']}, each must be one 202 and one 200")
    if report["github_standin"].get("violations"):
        failures.append(f"the stand-in saw {report['github_standin']['violations']} requests GitHub would refuse")
    return failures


def print_report(report: dict[str, Any]) -> None:
    load = report["load"]
    print("| run | requests | concurrency | deliveries/s | p50 ms | p95 ms | p99 ms | max ms | >100 ms | statuses |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rate = f" at {report['rate']:g}/s" if report["rate"] else ""
    for name, row in (("warm-up", report["warmup"]), (f"load{rate}", load)):
        if row:
            print(
                f"| {name} | {row['requests']} | {report['concurrency']} | {row['per_s']:.0f} | {row['p50_ms']:.1f} | "
                f"{row['p95_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_ms']:.1f} | {row['over_100ms']} | "
                f"{row['statuses']} |"
            )
    during = report["conductor_during_load"]
    print(
        f"redeliveries: {report['pairs']} pairs, {report['pairs_overlapping']} overlapping in time, "
        f"answered {report['pair_answers']}"
    )
    print(
        f"CPU during the load: service {report['server_cpu_s']} s, client {report['client_cpu_s']} s "
        f"over {load['wall_s']} s wall; load average {report['load_before']} before, {report['load_after']} after"
    )
    print(
        f"conductor during the load: {during['experiments']} experiments started, {during['experiments_done']} "
        f"decided, {during['runs_finished']} runs finished, {during['inbox_processed']} inbox rows applied, "
        f"{during['events']} events; the rest of the inbox applied {report['drain_s_after_load']} s after the load; "
        f"GitHub stand-in: {report['github_standin']}"
    )
    print(f"the conductor waited in GitHub's write pacing {report['pacing_s_during_load']} s of the load")
    if "store_trace" in report:
        print(f"store trace: {report['store_trace']}")
        print(f"service CPU by thread during the load: {report['service_cpu_s_by_thread']}")
    print(f"store: {report['store']}")
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
