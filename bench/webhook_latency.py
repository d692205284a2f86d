"""Benchmark: how fast the webhook server acknowledges deliveries that arrive together, on loopback.

Starts the real app (bot.app.web.create_app over a fresh store in a temporary directory) under a real
uvicorn server in a thread of this process, then sends rounds of N concurrent deliveries (N client
threads released together by a barrier). Each delivery is a real GitHub `issue_comment.created`
payload (the vendored example, put on a pull request, its author a MEMBER) with its own
X-GitHub-Delivery uuid and comment id, signed with HMAC-SHA256 like GitHub signs it, and sent on a
new connection as GitHub's hookshot does. A request's latency is its wall time from connecting to
the last byte of the answer. Before the measured rounds, one cold round (the first requests start
the server's worker threads, each opening its own SQLite connection) is reported apart.

Then a redelivery race: N deliveries, each sent twice at the same instant (2N threads). Each id
must be answered once 202 (stored) and once 200 (already stored), and the store must hold exactly
one row per id. At the end the store must hold one row per delivery sent and `wake()` must have
been called once per row. Any non-2xx answer, or a failed check, exits non-zero.

The client threads share the interpreter (and its GIL) with the server, so the latencies include
some client time; on a small machine that is part of what the numbers show.

    .venv/bin/python bench/webhook_latency.py [--rounds 10] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import hmac
import http.client
import json
import math
import os
import platform
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Self

import uvicorn

from bot.app.web import create_app

ROOT = Path(__file__).resolve().parent.parent

EXAMPLE = ROOT / "tests" / "bot" / "github" / "webhook_examples" / "issue_comment.json"
SECRET = "bench-webhook-secret"


# --- deliveries ------------------------------------------------------------------------------------


def template() -> dict:
    """The first `issue_comment.created` example, moved onto a pull request, by a MEMBER."""
    example = next(p for p in json.loads(EXAMPLE.read_text()) if p["action"] == "created")
    payload = copy.deepcopy(example)
    issue = payload["issue"]
    api = issue["url"].replace("/issues/", "/pulls/")
    html = issue["html_url"].replace("/issues/", "/pull/")
    issue["pull_request"] = {
        "url": api,
        "html_url": html,
        "diff_url": html + ".diff",
        "patch_url": html + ".patch",
        "merged_at": None,
    }
    payload["comment"]["author_association"] = "MEMBER"
    return payload


class Delivery:
    """One signed request, built before the clock starts."""

    def __init__(self, payload: dict, comment_id: int, delivery_id: str | None = None) -> None:
        payload = {**payload, "comment": {**payload["comment"], "id": comment_id}}
        self.id = delivery_id or str(uuid.uuid4())
        self.body = json.dumps(payload).encode("utf-8")
        signature = hmac.new(SECRET.encode("utf-8"), self.body, hashlib.sha256).hexdigest()
        self.headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/bench",
            "X-GitHub-Event": "issue_comment",
            "X-GitHub-Delivery": self.id,
            "X-GitHub-Hook-ID": "1",
            "X-Hub-Signature-256": f"sha256={signature}",
        }


class Deliveries:
    def __init__(self) -> None:
        self.payload = template()
        self.next_comment = 1_000_000

    def make(self, n: int) -> list[Delivery]:
        out = []
        for _ in range(n):
            self.next_comment += 1
            out.append(Delivery(self.payload, self.next_comment))
        return out


# --- the server ------------------------------------------------------------------------------------


class Server:
    """create_app under uvicorn, in a daemon thread, on a free loopback port."""

    def __init__(self, store_path: Path) -> None:
        self.wakes = 0
        self._lock = threading.Lock()
        self.app = create_app(store_path=store_path, secret=SECRET, wake=self._wake)
        # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on the accepted connections (it checks the
        # listening socket's proto); without it an answer can wait out loopback's delayed ACK
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, backlog=4096, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="bench-uvicorn", daemon=True
        )

    def _wake(self) -> None:
        with self._lock:
            self.wakes += 1

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


# --- the client ------------------------------------------------------------------------------------


def fire(port: int, deliveries: list[Delivery]) -> tuple[list[tuple[int | None, float]], float]:
    """Send every delivery at once, one thread each. Returns (status, seconds) per request (status
    None when the request failed) and the round's wall time (first send to last answer)."""
    results: list[tuple[int | None, float]] = [(None, 0.0)] * len(deliveries)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(deliveries)
    barrier = threading.Barrier(len(deliveries))

    def send(i: int, delivery: Delivery) -> None:
        barrier.wait()
        start = time.perf_counter()
        status: int | None = None
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/webhook", body=delivery.body, headers=delivery.headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            finally:
                connection.close()
        except (OSError, http.client.HTTPException) as error:
            print(f"request {delivery.id} failed: {error!r}", file=sys.stderr)
        end = time.perf_counter()
        results[i] = (status, end - start)
        spans[i] = (start, end)

    threads = [threading.Thread(target=send, args=(i, d), daemon=True) for i, d in enumerate(deliveries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return results, wall


# --- reporting -------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summarize(name: str, results: list[tuple[int | None, float]], wall: float) -> dict:
    ms = [1000 * seconds for _, seconds in results]
    return {
        "round": name,
        "requests": len(results),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "requests_per_s": round(len(results) / wall, 1),
        "non_2xx": sum(1 for status, _ in results if status is None or not 200 <= status < 300),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (default 10)")
    parser.add_argument("--concurrency", type=int, default=50, help="deliveries sent at once per round (default 50)")
    args = parser.parse_args()
    if args.rounds < 1 or args.concurrency < 1:
        parser.error("--rounds and --concurrency must be at least 1")

    machine = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    print(
        f"# {' '.join(sys.argv)}  |  {time.strftime('%Y-%m-%d')}  |  {machine['processor']}, "
        f"{machine['cpu_count']} CPUs, {machine['platform']}, Python {machine['python']}, SQLite {machine['sqlite']}"
    )

    deliveries = Deliveries()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="webhook-latency-") as tmp:
        store_path = Path(tmp) / "state.db"
        sent: list[str] = []
        with Server(store_path) as server:
            batch = deliveries.make(args.concurrency)
            cold, cold_wall = fire(server.port, batch)
            sent += [d.id for d in batch]

            measured: list[tuple[int | None, float]] = []
            measured_wall = 0.0
            for _ in range(args.rounds):
                batch = deliveries.make(args.concurrency)
                results, wall = fire(server.port, batch)
                measured += results
                measured_wall += wall
                sent += [d.id for d in batch]

            # redelivery race: each delivery twice, the same bytes, all 2N at the same instant
            race = deliveries.make(args.concurrency)
            race_results, race_wall = fire(server.port, race + race)
            sent += [d.id for d in race]
            wakes = server.wakes

        rows = [
            summarize("cold (first round)", cold, cold_wall),
            summarize(f"{args.rounds} rounds x {args.concurrency}", measured, measured_wall),
            summarize(f"redelivery race ({args.concurrency} ids x 2)", race_results, race_wall),
        ]

        # the checks
        for row in rows:
            if row["non_2xx"]:
                failures.append(f"{row['round']}: {row['non_2xx']} answers were not 2xx")
        for i, delivery in enumerate(race):
            pair = sorted((race_results[i][0], race_results[i + len(race)][0]), key=str)
            if pair != [200, 202]:
                failures.append(f"race {delivery.id}: answered {pair}, expected one 202 and one 200")
        db = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)
        counts = dict(db.execute("SELECT key, COUNT(*) FROM inbox GROUP BY key").fetchall())
        kinds = dict(db.execute("SELECT json_extract(payload, '$.kind'), COUNT(*) FROM inbox GROUP BY 1").fetchall())
        associations = {a for (a,) in db.execute("SELECT DISTINCT json_extract(payload, '$.association') FROM inbox")}
        db.close()
        race_bad = [d.id for d in race if counts.get(f"github:{d.id}") != 1]
        if race_bad:
            failures.append(f"race: {len(race_bad)} delivery ids are not stored exactly once")
        missing = [d for d in sent if counts.get(f"github:{d}") != 1]
        if missing or len(counts) != len(sent):
            failures.append(f"store holds {len(counts)} rows for {len(sent)} deliveries ({len(missing)} missing)")
        if kinds != {"feedback": len(sent)} or associations != {"MEMBER"}:
            failures.append(f"stored events are not all PR feedback by a MEMBER: {kinds}, {associations}")
        if wakes != len(sent):
            failures.append(f"wake() was called {wakes} times for {len(sent)} stored deliveries")

    print("| round | requests | p50 ms | p90 ms | p99 ms | max ms | requests/s | non-2xx |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['round']} | {row['requests']} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['max_ms']:.2f} | {row['requests_per_s']:.0f} | {row['non_2xx']} |"
        )
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    main_row = rows[1]
    summary = {
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        **{k: v for k, v in main_row.items() if k != "round"},
        "cold_p99_ms": rows[0]["p99_ms"],
        "race_p99_ms": rows[2]["p99_ms"],
        "race_non_2xx": rows[2]["non_2xx"],
        "race_one_row_per_id": not race_bad,
        "stored_rows": len(counts),
        "deliveries": len(sent),
        "ok": not failures,
        "machine": machine,
    }
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
