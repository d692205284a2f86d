"""Benchmark: a long local run with the bot killed by SIGKILL at random times, then checked.

Runs `autoresearch demo` (smoke profile, 2 slots, the offline explorer, no dashboard) in a work
directory, kills the bot process with SIGKILL after a random (seeded) time in [MIN, MAX] seconds,
restarts it at once, and repeats until the demo ends by itself with its N experiments done. Only
the bot process is killed: its training runs go on as orphans, as after a real crash, and the
restarted bot adopts them or finds them lost.

Recorded per life of the bot (one JSON line each): how long it lived, the memory (VmRSS) of the
bot process at its start and at its end, the store's size (state.db plus its WAL) and its counts
at the end, and the cost of an idle tick on a snapshot of the store taken at that moment (the
method of bench/tick_cost.py: the real Conductor.tick() with a runner whose runs never end and an
agent with nothing to propose, so the figure is the cost of reading the store, not of acting).

At the end it checks that nothing was lost or duplicated: every experiment id once and done, at
most one branch per experiment and no branch without its experiment, every run accounted for
(done, or set aside as lost/refused/disturbed/cancelled with a reason; none left queued or
running), one run directory per started run, at most one decision per experiment, every kept
experiment's commit on main, and results.tsv and `autoresearch results --json` agreeing with the
store.

    .venv/bin/python bench/soak.py [--experiments 200] [--kill-every MIN MAX] [--seed 0] [--quick]

With --experiments 200 and kills every 3 to 6 minutes (the defaults) it takes about two to three
hours on 2 cores; with fewer experiments the interval is scaled down in proportion (at least
15-30 s) unless --kill-every is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the project first: tests/bot/... (directories, no packages) must not shadow bot/...
sys.path.append(str(ROOT / "tests"))  # the tests' fake runner, for the tick's cost
AUTORESEARCH = Path(sys.executable).parent / "autoresearch"
SET_ASIDE = ("lost", "refused", "disturbed", "cancelled")
DECISIONS = ("keep", "discard", "crash", "rejected", "failed", "cancelled")


def rss_kib(pid: int) -> int | None:
    """VmRSS of a live process in KiB, None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def store_bytes(workdir: Path) -> int:
    """state.db with its WAL and shared-memory files (the WAL shrinks at each checkpoint)."""
    return sum(p.stat().st_size for p in workdir.glob("state.db*") if p.is_file())


def counts(workdir: Path) -> dict[str, Any]:
    """Experiments by state/status and runs by state, read-only."""
    db = sqlite3.connect(f"file:{workdir / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        exps = dict(db.execute("SELECT COALESCE(status, state), COUNT(*) FROM experiments GROUP BY 1").fetchall())
        runs = dict(db.execute("SELECT state, COUNT(*) FROM runs GROUP BY 1").fetchall())
    finally:
        db.close()
    return {"experiments": exps, "runs": runs, "done": sum(v for k, v in exps.items() if k in DECISIONS)}


def snapshot(workdir: Path) -> Path:
    """A consistent copy of the store (sqlite's backup API) and the research repository."""
    snap = Path(tempfile.mkdtemp(prefix="soak-snap-"))
    src = sqlite3.connect(workdir / "state.db", timeout=30)
    dst = sqlite3.connect(snap / "state.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    shutil.copytree(workdir / "repo", snap / "repo", symlinks=True)
    return snap


def tick_cost(snap: Path, ticks: int = 30) -> dict[str, Any]:
    """The idle tick's cost on a snapshot, measured as bench/tick_cost.py does (its time_ticks); the
    snapshot is removed."""
    from fakes import FakeRunner  # the tests' runner: submitted runs never end

    from bench.tick_cost import time_ticks
    from bot.agent.scripted import ScriptedAgent
    from bot.forge.local import LocalForge
    from bot.loop.conductor import Conductor, ConductorConfig
    from bot.store import Store

    store = Store(snap / "state.db")
    try:
        n = store.experiments.count()
        identity = store.state.identity
        loop = Conductor(
            store,
            LocalForge(snap / "repo"),
            FakeRunner(slots=2, auto=False),
            ScriptedAgent([]),
            ConductorConfig(
                profile=identity.get("profile", "smoke"), identity=identity, max_experiments=max(1, n), lookahead=0
            ),
        )
        loop.start()
        for _ in range(10):  # settle: runs of the killed bot are found lost and queued again on the fake
            loop.tick()
        walls, cpus, statements = time_ticks(loop, store, ticks)
        return {
            "tick_experiments": n,
            "tick_wall_ms_median": round(1000 * statistics.median(walls), 2),
            "tick_cpu_ms_median": round(1000 * statistics.median(cpus), 2),
            "tick_sql_per_tick": statements / ticks,
        }
    except Exception as error:  # noqa: BLE001 (a measurement, not a check: say why and go on)
        return {"tick_error": f"{type(error).__name__}: {error}"}
    finally:
        store.close()
        shutil.rmtree(snap, ignore_errors=True)


def run_soak(args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    rng = random.Random(args.seed)
    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(AUTORESEARCH),
        "demo",
        "--workdir",
        str(workdir),
        "--profile",
        args.profile,
        "--slots",
        str(args.slots),
        "--experiments",
        str(args.experiments),
        "--seed",
        str(args.seed),
        "--no-dashboard",
    ]
    lives: list[dict[str, Any]] = []
    kills = 0
    started = time.time()
    proc: subprocess.Popen[bytes] | None = None
    born = started
    with open(workdir / "soak-demo.log", "ab") as log, open(args.out, "w") as out:

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        while True:
            if proc is None:
                proc, born = start(), time.time()
            life = {"life": len(lives) + 1, "started": round(born - started, 1)}
            kill_at = born + rng.uniform(*args.kill_every)
            first = last = None
            while proc.poll() is None and time.time() < kill_at:
                rss = rss_kib(proc.pid)
                if rss is not None:
                    last = rss
                    if first is None and time.time() - born >= args.rss_after:
                        first = rss
                time.sleep(0.5)
            code = proc.poll()
            if code is None:
                last = rss_kib(proc.pid) or last
                os.kill(proc.pid, signal.SIGKILL)  # the bot only: its runs live on, as after a real crash
                proc.wait()
                kills += 1
                life["ended"] = "SIGKILL"
            else:
                life["ended"] = f"exit {code}"
            life.update(
                lived_s=round(time.time() - born, 1),
                rss_start_kib=first,
                rss_end_kib=last,
                store_bytes=store_bytes(workdir) if (workdir / "state.db").exists() else 0,
                db_bytes=(workdir / "state.db").stat().st_size if (workdir / "state.db").exists() else 0,
            )
            snap = snapshot(workdir) if (workdir / "state.db").exists() else None
            if snap is not None:
                life.update(counts(workdir))
            if code != 0:  # restart at once; the snapshot is measured while the next life runs
                proc, born = start(), time.time()
            if snap is not None:
                life.update(tick_cost(snap, args.ticks))
            lives.append(life)
            out.write(json.dumps(life) + "\n")
            out.flush()
            print(
                f"life {life['life']:3d}: {life['ended']:8s} after {life['lived_s']:6.1f}s  done "
                f"{life.get('done', 0):3d}/{args.experiments}  store {life['store_bytes'] / 1024:7.0f} KiB  "
                f"RSS {fmt_kib(first)} -> {fmt_kib(last)}  tick {life.get('tick_cpu_ms_median', '-')} ms CPU",
                flush=True,
            )
            if code == 0:
                return lives, kills
            if time.time() - started > args.max_hours * 3600:  # stop here; the check says what is unfinished
                print(f"soak: not done after {args.max_hours} h; stopping the bot and checking", flush=True)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return lives, kills
            if code is not None and len(lives) >= 3 and all(x["ended"] != "SIGKILL" for x in lives[-3:]):
                raise SystemExit(f"soak: the bot exited {code} three times in a row; see {workdir / 'soak-demo.log'}")


def fmt_kib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f} MiB"


def check(workdir: Path, experiments: int) -> dict[str, Any]:
    """Everything that must hold after the soak; each problem is one line in `problems`."""
    problems: list[str] = []
    db = sqlite3.connect(f"file:{workdir / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    exps = db.execute("SELECT * FROM experiments ORDER BY id").fetchall()
    runs = db.execute("SELECT * FROM runs ORDER BY id").fetchall()
    events = db.execute("SELECT experiment_id, kind FROM events WHERE experiment_id IS NOT NULL").fetchall()
    db.close()

    ids = [e["id"] for e in exps]
    if len(ids) != len(set(ids)):
        problems.append("an experiment id appears twice")
    active = [e["id"] for e in exps if e["state"] != "done"]
    if active:
        problems.append(f"experiments not done: {active}")
    if len([e for e in exps if e["state"] == "done"]) < experiments:
        problems.append(f"only {len(exps) - len(active)} of {experiments} experiments done")
    codes = [e["code_hash"] for e in exps if e["code_hash"]]
    dup_codes = len(codes) - len(set(codes))
    if dup_codes:
        problems.append(f"{dup_codes} experiments share their train.py with another")
    decided: dict[int, int] = {}
    for ev in events:
        if ev["kind"] == "done":  # the event of an experiment's decision
            decided[ev["experiment_id"]] = decided.get(ev["experiment_id"], 0) + 1
    twice = {k: v for k, v in decided.items() if v > 1}
    if twice:
        problems.append(f"experiments decided more than once (events): {twice}")

    git = ["git", "-C", str(workdir / "repo")]
    branches = subprocess.run(
        [*git, "for-each-ref", "--format=%(refname:short)", "refs/heads/autoresearch/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    by_exp: dict[int, list[str]] = {}
    for branch in branches:
        number = branch.split("/", 1)[1].split("-", 1)[0]
        by_exp.setdefault(int(number) if number.isdigit() else -1, []).append(branch)
    stray = [b for k, bs in by_exp.items() if k not in set(ids) for b in bs]
    if stray:
        problems.append(f"branches without an experiment: {stray}")
    many = {k: v for k, v in by_exp.items() if len(v) > 1}
    if many:
        problems.append(f"experiments with more than one branch: {many}")
    missing = [e["id"] for e in exps if e["branch"] and e["branch"] not in branches]
    if missing:
        problems.append(f"experiments whose branch is missing: {missing}")
    for e in exps:
        if e["status"] == "keep" and (
            not e["merged_sha"]
            or subprocess.run([*git, "merge-base", "--is-ancestor", e["merged_sha"], "main"], check=False).returncode
            != 0
        ):
            problems.append(f"kept experiment {e['id']} is not on main")

    run_states: dict[str, int] = {}
    rerun_of = {r["rerun_of"] for r in runs if r["rerun_of"] is not None}
    for r in runs:
        run_states[r["state"]] = run_states.get(r["state"], 0) + 1
        if r["state"] in ("queued", "running"):
            problems.append(f"run {r['id']} left {r['state']}")
        elif r["state"] in SET_ASIDE and not (r["note"] or "").strip():
            problems.append(f"run {r['id']} set aside ({r['state']}) without a reason")
        elif r["state"] in ("lost", "refused", "disturbed") and r["id"] not in rerun_of:
            problems.append(f"run {r['id']} set aside ({r['state']}) and never run again")
        elif r["state"] == "done" and r["status"] not in ("ok", "crash", "timeout", "rejected"):
            problems.append(f"run {r['id']} done without a status")
    run_ids = {r["id"] for r in runs}
    dirs = (
        {int(p.name) for p in (workdir / "runs").iterdir() if p.name.isdigit()}
        if (workdir / "runs").is_dir()
        else set()
    )
    if dirs - run_ids:
        problems.append(f"run directories without a run: {sorted(dirs - run_ids)}")
    started = {r["id"] for r in runs if r["run_dir"]}
    if started - dirs:
        problems.append(f"started runs without a directory: {sorted(started - dirs)}")
    dirs_named = [r["run_dir"] for r in runs if r["run_dir"]]
    if len(dirs_named) != len(set(dirs_named)):
        problems.append("two runs share a run directory")

    finished = [e for e in exps if e["state"] == "done"]
    tsv = (workdir / "results.tsv").read_text().splitlines() if (workdir / "results.tsv").exists() else []
    as_json = json.loads(
        subprocess.run(
            [str(AUTORESEARCH), "results", "--workdir", str(workdir), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    json_ids = [row["id"] for row in as_json if row["id"] != 0]
    if sorted(json_ids) != sorted(e["id"] for e in finished) or len(json_ids) != len(set(json_ids)):
        problems.append(f"results --json lists experiments {json_ids}, the store {[e['id'] for e in finished]}")
    if len(tsv) - 1 != len(as_json):  # header + one line per row
        problems.append(f"results.tsv has {len(tsv) - 1} rows, results --json {len(as_json)}")
    statuses = [line.split("\t")[3] for line in tsv[1:]]
    if statuses != [row["status"] for row in as_json]:
        problems.append("results.tsv's statuses differ from results --json")
    by_status: dict[str, int] = {}
    for e in finished:
        by_status[e["status"]] = by_status.get(e["status"], 0) + 1
    return {
        "experiments": len(exps),
        "by_status": by_status,
        "runs": len(runs),
        "run_states": run_states,
        "branches": len(branches),
        "duplicate_code": dup_codes,
        "tsv_rows": len(tsv) - 1,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=200)
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=None,
        help="seconds between kills (default 180 360, scaled to --experiments / 200, at least 15 30)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill times and the explorer")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new directory under /tmp")
    parser.add_argument("--out", type=Path, default=Path("soak.jsonl"), help="one JSON line per life, then the check")
    parser.add_argument("--ticks", type=int, default=30, help="idle ticks measured per snapshot")
    parser.add_argument("--rss-after", type=float, default=5.0, help="the start RSS is read this many s into a life")
    parser.add_argument("--max-hours", type=float, default=12.0, help="then stop, and check what is there")
    parser.add_argument("--quick", action="store_true", help="4 experiments, kills every 20-40 s (a test)")
    args = parser.parse_args()
    if args.quick:
        args.experiments = min(args.experiments, 4)
        args.kill_every = args.kill_every or [20.0, 40.0]
    if args.kill_every is None:
        scale = min(1.0, args.experiments / 200)
        args.kill_every = [max(15.0, 180 * scale), max(30.0, 360 * scale)]
    if not 0 < args.kill_every[0] <= args.kill_every[1]:
        parser.error("--kill-every needs 0 < MIN <= MAX")
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))).resolve()
    print(
        f"# {' '.join(sys.argv)}  |  {time.strftime('%Y-%m-%d %H:%M')}  |  {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}  |  work directory {args.workdir}",
        flush=True,
    )
    print(
        f"# {args.experiments} experiments, profile {args.profile}, {args.slots} slots, SIGKILL every "
        f"{args.kill_every[0]:.0f}-{args.kill_every[1]:.0f} s (seed {args.seed})",
        flush=True,
    )
    started = time.time()
    lives, kills = run_soak(args)
    result = check(args.workdir, args.experiments)
    first, last = lives[0], lives[-1]
    rss_end = [x["rss_end_kib"] for x in lives if x.get("rss_end_kib")]
    ticks = [x for x in lives if "tick_cpu_ms_median" in x]
    summary = {
        "summary": True,
        "wall_s": round(time.time() - started),
        "lives": len(lives),
        "kills": kills,
        "restarts": len(lives) - 1,
        "store_bytes_first": first["store_bytes"],
        "store_bytes_last": last["store_bytes"],
        "rss_start_kib": [x["rss_start_kib"] for x in lives],
        "rss_end_kib": [x["rss_end_kib"] for x in lives],
        "rss_end_max_kib": max(rss_end) if rss_end else None,
        "tick_cpu_ms": [(x["tick_experiments"], x["tick_cpu_ms_median"]) for x in ticks],
        "tick_wall_ms": [(x["tick_experiments"], x["tick_wall_ms_median"]) for x in ticks],
        "tick_errors": [x["tick_error"] for x in lives if "tick_error" in x],
        **result,
    }
    with open(args.out, "a") as out:
        out.write(json.dumps(summary) + "\n")
    for key, value in summary.items():
        print(f"{key}: {json.dumps(value)}")
    print(
        f"soak: {result['experiments']} experiments, {kills} kills, {len(lives) - 1} restarts, "
        f"{len(result['problems'])} problems; lives in {args.out}"
    )
    sys.exit(1 if result["problems"] else 0)


if __name__ == "__main__":
    main()
