"""Benchmark: a bundled task's offline demo from the CLI (issue 19): its cost, main's noise, what it
kept, and whether each merge is a measured gain.

    .venv/bin/python bench/task_demo.py --task ticket-routing [--profile cpu] [--experiments 6] [--workdir DIR]
    .venv/bin/python bench/task_demo.py --read DIR

Runs `autoresearch demo --task T --profile P --experiments N --workdir DIR --no-dashboard` as a user
would (the task's inputs prepared beforehand with `autoresearch prepare --task T --profile P`; the
output is plain when it is not a terminal), then `autoresearch plot` (DIR/progress.png), and reads
the work directory. `--read DIR` only reads a finished demo's work directory. It prints, on the
task's own scale:

- the wall time and the load average before and after (with --read: the loop's wall time of the
  work directory's last demo command, from the store);
- the runs by purpose and per experiment, crashed and rejected ones included;
- main's noise: for each main measured, its runs by seed, their mean and standard deviation;
- each experiment: its runs, mean, change against main, the judge's margin and decision;
- each experiment's change against main seed by seed (the runs that share a seed: the same split for
  ticket routing; for query latency a seed shares no timing, so these say little); each keep's new main's
  fresh runs beside the candidate's runs under the same seeds (an evaluator that is deterministic
  per seed repeats them exactly, so the re-measured change is then no new evidence);
- each merge on main's first-parent history: the experiment it merges and whether its change is
  a gain larger than its margin (a keep for simplicity may be neither);
- results.tsv's rows.

Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.store import Store  # noqa: E402
from runner.tasks import DEFAULT_TASK, Metric, get_task  # noqa: E402

PURPOSES = ("baseline", "candidate", "confirm", "remeasure")


def run_demo(task: str, profile: str, experiments: int, workdir: Path) -> float:
    """`autoresearch demo` in a subprocess, its output passed through; its wall seconds."""
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bot.app.cli",
            "demo",
            "--task",
            task,
            "--profile",
            profile,
            "--experiments",
            str(experiments),
            "--workdir",
            str(workdir),
            "--no-dashboard",
        ],
        check=True,
        cwd=ROOT,
    )
    return time.monotonic() - started


def plot(workdir: Path) -> None:
    subprocess.run([sys.executable, "-m", "bot.app.cli", "plot", "--workdir", str(workdir)], check=True, cwd=ROOT)


def merges(repo: Path) -> list[str]:
    """The full shas on main's first-parent history, oldest first, the initial commit left out."""
    out = subprocess.run(
        ["git", "-C", str(repo), "log", "--first-parent", "--reverse", "--format=%H", "main"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return out[1:]


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"n {len(values)}"
    mean, sd = statistics.mean(values), statistics.stdev(values)
    return f"n {len(values)}, mean {mean:.6g}, sd {sd:.4g} ({sd / abs(mean):.2%} of the mean)"


def report(workdir: Path) -> dict[str, Any]:
    """What the demo in `workdir` ran and decided, on its task's scale (values, and changes signed
    so that a positive change is a gain whatever the direction)."""
    store = Store(workdir / "state.db")
    try:
        task = get_task(store.state.identity.get("task", DEFAULT_TASK))
        finished = [r for r in store.runs.all() if r.state == "done"]
        done = store.experiments.finished()
        loop = store.state.driver_last_run
    finally:
        store.close()
    runs = [r for r in finished if r.val_bpb is not None]  # those with a value: not crashed nor rejected
    metric = task.metric
    value = metric.value  # the store keeps the judge's loss scale (the metric, negated, or its logarithm)

    def gain(loss_delta: float | None) -> float | None:
        return None if loss_delta is None else -loss_delta  # loss down is a gain, on the loss scale

    mains: dict[str, dict[int, float]] = defaultdict(dict)
    for run in runs:
        if run.experiment_id is None:
            mains[run.commit_sha][run.seed] = value(run.val_bpb)
    by_experiment: dict[int, dict[int, float]] = defaultdict(dict)
    for run in runs:
        if run.experiment_id is not None:
            by_experiment[run.experiment_id][run.seed] = value(run.val_bpb)
    experiments = []
    for exp in done:
        own = by_experiment.get(exp.id, {})
        main = mains.get(exp.base_sha, {})
        entry: dict[str, Any] = {
            "id": exp.id,
            "title": exp.title,
            "status": exp.status,
            "runs": own,
            "mean": statistics.mean(own.values()) if own else None,
            "gain": gain(exp.delta),
            "margin": exp.margin,
            "reason": exp.reason,
            "paired_gains": {
                seed: metric.loss(main[seed]) - metric.loss(v) for seed, v in sorted(own.items()) if seed in main
            },
        }
        if exp.merged_sha:
            fresh = mains.get(exp.merged_sha, {})
            entry["merged_sha"] = exp.merged_sha
            entry["remeasured_gain"] = gain(exp.remeasured_delta)
            entry["fresh_runs_repeat_candidate"] = {
                seed: fresh[seed] == own[seed] for seed in sorted(fresh) if seed in own
            }
        experiments.append(entry)
    merged = {e["merged_sha"]: e for e in experiments if e.get("merged_sha")}
    main_history = merges(workdir / "repo")
    return {
        "task": task.name,
        "metric": metric,
        "loop_wall_s": loop.get("wall_seconds"),
        "runs_by_purpose": {p: sum(r.purpose == p for r in finished) for p in PURPOSES},
        "runs": len(finished),
        "runs_without_value": len(finished) - len(runs),
        "experiments": experiments,
        "mains": {sha: dict(sorted(values.items())) for sha, values in mains.items()},
        "merges": [
            {
                "sha": sha,
                "experiment": merged[sha]["id"] if sha in merged else None,
                "measured_gain": sha in merged
                and merged[sha]["status"] == "keep"
                and (merged[sha]["gain"] or 0.0) > (merged[sha]["margin"] or 0.0),
            }
            for sha in main_history
        ],
        "results_tsv": (workdir / "results.tsv").read_text(encoding="utf-8"),
    }


def render(found: dict[str, Any]) -> str:
    """The report as text: values on the metric's scale; gains (a loss-scale decrease: positive is better)
    and margins in the metric's units, or for a log-scale metric as the relative change they mean."""
    metric: Metric = found["metric"]
    fmt, n = metric.format, metric.digits + 2

    def shown_gain(gain: float) -> str:
        if not metric.relative:
            return f"{gain:+.{n}f}"
        return f"{math.copysign(100 * abs(metric.change(-gain)), gain):+.1f}%"

    experiments = found["experiments"]
    lines = [
        f"task {found['task']}: {metric.name} ({metric.unit}, {metric.direction} is better); "
        f"loop wall {found['loop_wall_s']} s",
        f"runs {found['runs']} ({found['runs_without_value']} without a value): {found['runs_by_purpose']}; "
        f"{found['runs'] / max(1, len(experiments)):.2f} per "
        f"experiment ({len(experiments)} experiments)",
    ]
    for sha, values in found["mains"].items():
        lines.append(
            f"main {sha[:7]}: {spread(list(values.values()))}; by seed "
            + ", ".join(f"{seed}: {fmt(v)}" for seed, v in values.items())
        )
    for e in experiments:
        gain = "-" if e["gain"] is None else shown_gain(e["gain"])
        margin = "-" if e["margin"] is None else metric.format_margin(e["margin"], n)
        mean = "-" if e["mean"] is None else fmt(e["mean"])
        lines.append(
            f"#{e['id']} {e['status']}: {e['title']}: {len(e['runs'])} run(s), mean {mean}, gain {gain}, margin "
            f"{margin}; paired gains by seed {', '.join(f'{s}: {shown_gain(g)}' for s, g in e['paired_gains'].items())}"
        )
        lines.append(f"    {e['reason']}")
        if "merged_sha" in e:
            lines.append(
                f"    merged as {e['merged_sha'][:7]}; re-measured gain {shown_gain(e['remeasured_gain'])}; the new main's fresh "
                f"runs repeat the candidate's under the same seed: {e['fresh_runs_repeat_candidate']}"
            )
    for m in found["merges"]:
        lines.append(
            f"merge {m['sha'][:7]}: experiment {m['experiment']}, a gain beyond its margin: {m['measured_gain']}"
        )
    lines.append("results.tsv:\n" + found["results_tsv"].rstrip())
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="ticket-routing")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--experiments", type=int, default=6)
    parser.add_argument("--workdir", type=Path, help="the demo's work directory (default: a fresh one)")
    parser.add_argument("--read", type=Path, metavar="DIR", help="only read a finished demo's work directory")
    args = parser.parse_args()
    if args.read:
        print(render(report(args.read)))
        return 0
    workdir = args.workdir or Path(f"/tmp/task-demo-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    wall = run_demo(args.task, args.profile, args.experiments, workdir)
    load_after = [round(x, 2) for x in os.getloadavg()]
    plot(workdir)
    print(render(report(workdir)))
    print(
        f"demo wall {wall:.1f} s; load average (1, 5, 15 min) before {load_before}, after {load_after}; "
        f"work directory {workdir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
