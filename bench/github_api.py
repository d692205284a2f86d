"""Benchmark: GitHub API calls per experiment, by endpoint, and how many of them create content.

Runs the real service (bot.app.serve.Service: conductor, GitHub forge, publisher, webhook server) on
the GitHub stand-in of the tests, with a runner whose results are chosen (no training) and a
scripted agent: N experiments, a third kept, a third discarded, a third crashed. Every request
the bot makes is recorded by the stand-in. The counts depend on the code, not on speed, except
two that follow the clock: main's head is read once per tick (GET git/ref, so about one a
tick: the driver ticks on every event and every 30 s when idle; here every 0.1 s), and a run in
progress updates its check at most once per 120 s (none here: the fake runs finish at once). The
service runs in poll mode (no webhook server needed), so the poller's reads are counted too.

    .venv/bin/python bench/github_api.py [--experiments 6] [--token] [--run-minutes 5]

--token: a personal access token instead of an App (commit statuses instead of check runs).

From the measured figures it prints the most experiments an hour one installation sustains under
GitHub's limits: the secondary limit on content-creating requests (80 a minute, 500 an hour) and
the primary limit (5,000 requests an hour for a token; an App installation 5,000 rising with its
repositories and users to 12,500, and 15,000 on GitHub Enterprise Cloud). 304 answers cost nothing
against the primary limit and are counted apart. Calls that follow the clock rather than the
experiments are counted per hour apart: main's head read each idle tick (a 304 while main stands
still), the poller's reads in poll mode, and the updates while a candidate run trains (--run-minutes
long; the fake runs here finish at once, so none are measured): for a run longer than SHORT_RUN_S
(10 minutes) an App's check goes in progress and is updated every PROGRESS_EVERY_S (120 s), with a
token one more commit status ("training") is posted; a shorter run's check is made once, at its end.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the project first: tests/bot (a directory, no package) must not shadow bot/
sys.path.append(str(ROOT / "tests"))

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from fakes import CRASH_MARK, IDENTITY, FakeRunner, with_effect  # noqa: E402
from github_standin import GitHubStandIn  # noqa: E402

from bot.agent.scripted import ScriptedAgent  # noqa: E402
from bot.app.serve import Parts, Service  # noqa: E402
from bot.app.settings import load_service_settings  # noqa: E402
from bot.core.records import Proposal  # noqa: E402
from bot.github.publisher import PROGRESS_EVERY_S, SHORT_RUN_S  # noqa: E402
from bot.store import Store  # noqa: E402

MAIN = with_effect((ROOT / "train.py").read_text(), 0.0, "main")


def proposals(n: int) -> list[Proposal]:
    out = []
    for i in range(n):
        kind = ("keep", "discard", "crash")[i % 3]
        effect = {"keep": -0.05 * (i + 1), "discard": 0.1, "crash": 0.0}[kind]
        text = with_effect(MAIN, effect, f"p{i}") + (CRASH_MARK if kind == "crash" else "")
        out.append(Proposal(f"{kind} {i}", f"hypothesis {i}", text))
    return out


def program(n: int) -> str:
    return (
        f"---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n  max_experiments: {n}\n---\n\n"
        "Lower val_bpb.\n"
    )


def endpoint(method: str, path: str) -> str:
    """The path with its numbers, shas and ref names replaced, as GitHub's docs name it."""
    path = re.sub(r"/repos/[^/]+/[^/]+", "/repos/{o}/{r}", path)
    path = re.sub(r"/[0-9a-f]{40}", "/{sha}", path)
    path = re.sub(r"/\d+", "/{n}", path)
    path = re.sub(r"/git/(ref|refs|matching-refs)/.*", r"/git/\1/{ref}", path)
    path = re.sub(r"/contents/.*", "/contents/{path}", path)
    path = re.sub(r"/labels/[^/]+$", "/labels/{name}", path)
    return f"{method} {path}"


def run(n: int, token: bool) -> dict:
    for name in [k for k in os.environ if k.startswith("AUTORESEARCH_")]:
        del os.environ[name]
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    with (
        tempfile.TemporaryDirectory() as tmp,
        GitHubStandIn(
            Path(tmp) / "github",
            files={"train.py": MAIN, "program.md": program(n)},
            token_users={"tok-bot": "researcher"} if token else None,
            collaborators={"researcher": "admin"},
            app_public_key=key.public_key(),
        ) as gh,
    ):
        auth = dict(github_token="tok-bot") if token else dict(github_app_id=1, github_private_key=pem)
        settings = load_service_settings(
            repository="octo-org/research",
            github_api_url=gh.api_url,
            poll=True,
            state_dir=Path(tmp) / "state",
            profile="smoke",
            **auth,
        )
        service = Service(
            settings,
            make_parts=lambda s, c, t: Parts(FakeRunner(), ScriptedAgent(proposals(n)), dict(IDENTITY)),
            timer_s=0.1,
        )
        started = time.monotonic()
        service.start()
        store = Store(settings.state_dir / "state.db")
        while True:
            exps = store.experiments.all()
            if len(exps) == n and all(
                e.state == "done" and store.published.get(e.id).get("final") == e.status for e in exps
            ):
                break
            if time.monotonic() - started > 300:
                raise SystemExit(f"timed out; conductor: {service.status}")
            time.sleep(0.1)
        service.stop()
        calls = collections.Counter(endpoint(r.method, r.path) for r in gh.requests)
        creating = collections.Counter(endpoint(r.method, r.path) for r in gh.requests if r.created)
        free = collections.Counter(endpoint(r.method, r.path) for r in gh.requests if r.status == 304)
        statuses = collections.Counter(e.status for e in exps)
        assert not gh.violations, gh.violations
    return {
        "experiments": n,
        "statuses": dict(statuses),
        "auth": "token" if token else "app",
        "requests": sum(calls.values()),
        "creating": sum(creating.values()),
        "not_modified": sum(free.values()),
        "by_endpoint": {
            k: [v, creating.get(k, 0), free.get(k, 0)] for k, v in sorted(calls.items(), key=lambda kv: -kv[1])
        },
        "seconds": round(time.monotonic() - started, 1),
    }


SECONDARY_PER_HOUR, SECONDARY_PER_MINUTE = 500, 80
PRIMARY = {
    "token, or an App's minimum": 5000,
    "App, most (repositories/users)": 12500,
    "App on Enterprise Cloud": 15000,
}


def sustainable(report: dict, run_minutes: float) -> list[str]:
    """The most experiments an hour under each limit, from the measured per-experiment figures
    (everything the run made, its one-off sign-in included, divided by the experiments)."""
    n = report["experiments"]
    billable = (report["requests"] - report["not_modified"]) / n
    creating = report["creating"] / n
    # while it trains, only for a run longer than SHORT_RUN_S: the check's move to in_progress, then one update
    # per PROGRESS_EVERY_S; a token's commit status says "training" once. A shorter run's check is made at its end.
    long_run = run_minutes * 60 > SHORT_RUN_S
    progress = (
        0.0 if not long_run else 1.0 if report["auth"] == "token" else math.ceil(run_minutes * 60 / PROGRESS_EVERY_S)
    )
    lines = [
        (
            f"per experiment: {billable:.2f} requests that count (304s apart), {creating:.2f} content-creating; "
            f"plus {progress:.0f} {'status' if report['auth'] == 'token' else 'check'} updates while a "
            f"{run_minutes:g}-minute candidate run trains (content-creating)"
        )
    ]
    for extra, what in ((0.0, "as measured"), (progress, f"with {run_minutes:g}-minute runs")):
        if what != "as measured" and not progress:
            continue
        per_hour = min(SECONDARY_PER_HOUR, SECONDARY_PER_MINUTE * 60) / (creating + extra)
        per_minute = SECONDARY_PER_MINUTE / (creating + extra)
        lines.append(
            f"secondary limit ({what}): {per_hour:.1f} experiments an hour "
            f"(500 content-creating an hour / {creating + extra:.2f}); a burst of {per_minute:.1f} a minute"
        )
        for name, limit in list(PRIMARY.items())[: 1 if report["auth"] == "token" else None]:
            lines.append(
                f"primary limit, {name} ({limit:,}/h, {what}): {limit / (billable + extra):.0f} experiments an hour"
            )
    lines.append(
        "idle, per hour (not per experiment): main's head read every 30 s idle tick: 120 conditional "
        "GETs, 304 while main stands still (free); poll mode only: 2 + 1 per open pull request every 60 s, "
        "120 + 60 per open PR conditional GETs, free while nothing changed; research log: at most 12 edits "
        "(one per 300 s) besides one per kept change"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=6)
    parser.add_argument("--token", action="store_true")
    parser.add_argument(
        "--run-minutes",
        type=float,
        default=5.0,
        help="a candidate run's length, for the check updates while it trains (default 5: autoresearch's budget)",
    )
    args = parser.parse_args()
    report = run(args.experiments, args.token)
    n = report["experiments"]
    print(
        f"{n} experiments {report['statuses']} ({report['auth']}): {report['requests']} requests "
        f"({report['requests'] / n:.1f} per experiment), {report['creating']} created content "
        f"({report['creating'] / n:.1f} per experiment), {report['not_modified']} answered 304 (free), "
        f"in {report['seconds']} s"
    )
    print(f"{'endpoint':64} {'calls':>6} {'/exp':>6} {'creating':>8} {'304':>5}")
    for name, (count, made, unchanged) in report["by_endpoint"].items():
        print(f"{name:64} {count:6d} {count / n:6.2f} {made:8d} {unchanged:5d}")
    for line in sustainable(report, args.run_minutes):
        print(line)
    print(json.dumps({k: v for k, v in report.items() if k != "by_endpoint"}))


if __name__ == "__main__":
    main()
