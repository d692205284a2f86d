"""Benchmark: where the default demo's wall time goes.

Runs `autoresearch demo` with its defaults (cpu profile, 6 experiments, 1 slot) in a fresh work
directory, then reads the store: wall time, experiments per hour, the fraction of wall time spent
in timed training, and the overhead per run split into process start-up (to the first step),
evaluation, the rest of the training process (first steps not counted, teardown) and the loop's
own work between runs (proposing, git, judging, bookkeeping), and the conductor process's own CPU
seconds (recorded by the driver; the training children not included).

    .venv/bin/python bench/demo_overhead.py [--experiments 6] [--profile cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bot.store import Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experiments", type=int, default=6)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="demo-bench-"))
    started = time.time()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bot.app.cli",
            "demo",
            "--workdir",
            str(workdir),
            "--profile",
            args.profile,
            "--experiments",
            str(args.experiments),
        ],
        check=True,
    )
    wall = time.time() - started

    store = Store(workdir / "state.db")
    runs = [r for r in store.runs.all() if r.state == "done"]
    done = store.experiments.finished()
    training = sum(r.metrics.get("training_seconds", 0.0) for r in runs)
    startup = sum(r.metrics.get("startup_seconds", 0.0) for r in runs)
    evaluation = sum(r.metrics.get("eval_seconds", 0.0) for r in runs)
    in_process = sum((r.finished_at or 0) - (r.started_at or 0) for r in runs)
    other_in_run = in_process - training - startup - evaluation
    loop_work = wall - in_process
    driver = store.state.driver_last_run
    figures = {
        "profile": args.profile,
        "experiments": len(done),
        "runs": len(runs),
        "runs_by_purpose": {
            p: sum(r.purpose == p for r in runs) for p in ("baseline", "candidate", "confirm", "remeasure")
        },
        "kept": sum(e.status == "keep" for e in done),
        "wall_seconds": round(wall, 1),
        "experiments_per_hour": round(len(done) / wall * 3600, 1),
        "timed_training_fraction": round(training / wall, 3),
        "per_run_seconds": {
            "startup": round(startup / len(runs), 2),
            "evaluation": round(evaluation / len(runs), 2),
            "other_in_process": round(other_in_run / len(runs), 2),
            "loop_between_runs": round(loop_work / len(runs), 2),
        },
        "per_experiment_overhead_seconds": round((wall - training) / max(1, len(done)), 1),
        "conductor_cpu_seconds": driver.get("cpu_seconds"),
        "conductor_cpu_seconds_per_experiment": round(driver.get("cpu_seconds", 0.0) / max(1, len(done)), 3),
        "ticks": driver.get("ticks"),
        "workdir": str(workdir),
        "date": time.strftime("%Y-%m-%d"),
    }
    store.close()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
