"""Evaluate one query.sql: a private copy of the database, the measuring process in a sandbox, a
time box, and the percentiles of what it timed.

In order: the asset's shape is checked (asset.parse: a bad one is `rejected` before anything is
copied); the prepared database is copied into `workdir` (its sha256 checked on the way: index
builds write to the copy, never to the cache) with the asset and the plan (the parameter sets, the
reference's rows, and the timed passes' order, shuffled by the run's seed: the parameter sets are
the task's, the seed only orders them); then runner.tasks.query_latency.measure runs in a sandbox
(runner.sandbox) that sees `workdir` and nothing else of the host, with the run's limits
(runner.limits). Where bubblewrap is missing it runs unsandboxed, marked so, with a warning in its
log: the authorizer (guard.py) still refuses all that reaches outside the copy.

The time box is the measuring process's whole life: start-up, index builds, the correctness pass
and the timed passes. A process still running at its end is killed and the run is `timeout`.
The metric is p95_ms, the 95th percentile (linear between order statistics) of the timed
executions' latencies; index build time is reported (index_build_s) but is no part of it.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runner import limits, sandbox
from runner.tasks import Evaluation
from runner.tasks.query_latency import database
from runner.tasks.query_latency.asset import AssetRefused, parse
from runner.tasks.query_latency.measure import ASSET_FILE, DB_FILE, PLAN_FILE, RESULT_PREFIX

LOG_TAIL_CHARS = 4000
# The measuring process's program. Not `-m runner.tasks.query_latency.measure`: this package's
# __init__ imports this module, which imports measure, and runpy warns about a module run as
# __main__ that is already imported.
MEASURE = "import sys; from runner.tasks.query_latency.measure import main; sys.exit(main(sys.argv[1:]))"


def evaluate(
    asset: str,
    profile: str,
    seed: int,
    workdir: Path,
    *,
    time_box_s: float | None = None,
    use_sandbox: bool | None = None,
) -> Evaluation:
    """Measure `asset` (query.sql's text) on the profile's prepared database (see the module
    docstring). `time_box_s`: the scale's by default; `use_sandbox`: False runs unsandboxed."""
    scale = database.get_scale(profile)
    prepared = database.load(profile)  # DataMissing: a machine that was not prepared
    box_s = scale.time_box_s if time_box_s is None else time_box_s
    started = time.monotonic()
    try:
        parsed = parse(asset)
    except AssetRefused as error:
        return Evaluation("rejected", error=str(error), metrics=_plan_metrics(prepared, scale.measured_passes))
    workdir.mkdir(parents=True, exist_ok=True)
    database.copy_database(prepared, workdir / DB_FILE)
    (workdir / ASSET_FILE).write_text(asset, encoding="utf-8")
    (workdir / PLAN_FILE).write_text(json.dumps(_plan(prepared, scale.measured_passes, seed)))
    sandboxed, why = sandbox.available() if use_sandbox is not False else (False, "turned off by the caller")
    warning = (
        ""
        if sandboxed
        else f"WARNING: measuring query.sql WITHOUT a sandbox: {why}. Only the SQLite authorizer keeps it inside "
        "its copy of the database; the result is marked unsandboxed.\n"
    )
    proc = _start(workdir, sandboxed)
    setup_s = time.monotonic() - started
    try:
        out, err = proc.communicate(timeout=box_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:  # its session: the measuring process, or bubblewrap, whose sandbox dies with it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just now
            pass
        out, err = proc.communicate()
        timed_out = True
    evaluation_s = time.monotonic() - started - setup_s
    found = _answer(out)
    common: dict[str, Any] = {
        "setup_s": setup_s,
        "evaluation_s": evaluation_s,
        "sandboxed": sandboxed,
        "log_tail": (warning + err)[-LOG_TAIL_CHARS:],
    }
    metrics = _plan_metrics(prepared, scale.measured_passes) | {"indexes": parsed.indexes, "time_box_s": box_s}
    if timed_out:
        return Evaluation(
            "timeout",
            error=(
                f"query.sql did not finish within its time box of {box_s:g} s (its index builds, the correctness "
                "pass and the timed executions together) and was stopped"
            ),
            metrics=metrics,
            **common,
        )
    if found is None:
        return Evaluation(
            "crash",
            error=(
                f"the measuring process ended (exit code {proc.returncode}) without an answer: SQLite or the "
                "process itself failed (the end of its log says how)"
            ),
            metrics=metrics,
            **common,
        )
    if found["status"] != "ok":
        return Evaluation(found["status"], error=str(found["error"]), metrics=metrics, **common)
    latencies = [float(x) for x in found["latencies_ms"]]
    percentiles = statistics.quantiles(latencies, n=100, method="inclusive")
    metrics |= {
        "p50_ms": statistics.median(latencies),
        "p95_ms": percentiles[94],
        "p99_ms": percentiles[98],
        "mean_ms": statistics.fmean(latencies),
        "max_ms": max(latencies),
        "executions": len(latencies),
        "index_build_s": float(found["index_build_s"]),
        "rows": int(found["rows"]),
    }
    return Evaluation("ok", value=metrics["p95_ms"], metrics=metrics, **common)


def _plan(prepared: database.Prepared, passes: int, seed: int) -> dict[str, Any]:
    """What the measuring process runs: the task's parameter sets and their reference rows, and the
    timed passes, each every parameter set once in an order drawn from the run's seed."""
    rng = random.Random(seed)
    orders = []
    for _ in range(passes):
        order = list(range(len(prepared.parameters)))
        rng.shuffle(order)
        orders.append(order)
    return {"parameters": prepared.parameters, "reference_rows": prepared.reference_rows, "passes": orders}


def _plan_metrics(prepared: database.Prepared, passes: int) -> dict[str, Any]:
    return {
        "scale": prepared.scale,
        "parameter_sets": len(prepared.parameters),
        "timed_passes": passes,
        "database_rows": sum(prepared.table_rows.values()),
    }


def _start(workdir: Path, sandboxed: bool) -> subprocess.Popen[str]:
    """The measuring process, in its own session, sandboxed when `sandboxed`, with the run's limits."""
    cmd = [sys.executable, "-c", MEASURE, str(workdir)]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": "/tmp" if sandboxed else str(workdir),  # SQLite's temporary files, if a sort spills
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    box = sandbox.Sandbox(write=[workdir], env=env, cwd=workdir)
    rlimits = limits.child_rlimits(limits.from_env(), cuda=False)

    def child_setup() -> None:  # between fork and exec: system calls only
        for which, value in rlimits:
            resource.setrlimit(which, (value, value))

    return subprocess.Popen(
        sandbox.wrap(cmd, box) if sandboxed else cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=workdir,
        start_new_session=True,
        preexec_fn=child_setup,
    )


def _answer(out: str) -> dict[str, Any] | None:
    """The measuring process's result line, or None when it printed none that reads."""
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                found = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError:
                return None
            if isinstance(found, dict) and found.get("status") in ("ok", "crash", "rejected"):
                return found
            return None
    return None
