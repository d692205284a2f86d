"""Benchmark: does a short run predict a full one (issue 20, screening)?

    nice -n 10 .venv/bin/python bench/screening.py measure --out FILE.jsonl [--proposals 24]
        [--fraction 0.2] [--main-every 6] [--repeat-every 3] [--minutes 50] [--profile cpu] [--jobs 1]
    .venv/bin/python bench/screening.py read FILE.jsonl [--bootstrap 2000]

`measure` takes a few dozen real proposals of the offline explorer (bot/agent/explorer.py), made
from main's train.py as the demo's first experiments are (each explorer seed proposes with the
earlier proposals as its history, so none repeats), and runs each through the isolated path
(runner.execute: the harness's clock, budget and evaluation, evaluated in the training process, as
`python train.py` is, to spare a loaded machine the sandbox's and the scorer's start-ups) at
`--fraction` of the profile's budget (seed 0) and at the full budget (seed 1: the two share no
initialisation). Main runs at both budgets every `--main-every` proposals (seeds 0, 1, ...), and
every `--repeat-every`-th proposal gets a second full run (seed 2), so that the
full budget's own rank reliability is known: a short run cannot predict a full run better than a
full run predicts itself. One JSON line per run goes to FILE as it ends; a run already in FILE is
not run again, so a measurement stopped by `--minutes` resumes where it stopped.

`read` reports each proposal's delta (its value minus the mean of main's runs at the same budget),
main's run-to-run standard deviation at each budget, and the Spearman and Kendall rank
correlations, with bootstrap intervals over proposals (2.5-97.5%), of short against full deltas
and of full against full (the repeated proposals; short against full on that subset beside it).

The CPU-time budget makes each run fair under load, only slower: run it niced. Each run is allotted
`--threads` (1): the budget is CPU seconds divided by the threads, so one thread's run costs half
the CPU time of two threads' and a loaded machine gets through twice the runs. `--jobs` runs that
many at once, in the plan's order (on a quiet machine, one 1-thread run per core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.agent.explorer import OfflineExplorer  # noqa: E402
from bot.core.records import HistoryEntry, ProposalContext, code_hash  # noqa: E402

MAIN_LABEL = "main"


@dataclass(frozen=True)
class Planned:
    """One run of the measurement: an asset under a label, at a budget fraction and a seed."""

    label: str
    title: str
    asset: str
    fraction: float
    seed: int

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.label, self.fraction, self.seed)


def explorer_proposals(count: int, profile: str) -> list[tuple[str, str]]:
    """(title, train.py) of `count` distinct first proposals of the offline explorer on main."""
    main = (ROOT / "train.py").read_text()
    program = (ROOT / "program.md").read_text()
    history: list[HistoryEntry] = []
    seen = {code_hash(main)}
    proposals = []
    for seed in range(count):
        ctx = ProposalContext(
            program_md=program,
            asset=main,
            main_val_bpb=None,
            history=list(history),
            seen_hashes=set(seen),
            profile=profile,
            device_kind="cuda" if profile == "h100" else "cpu",
        )
        proposal = OfflineExplorer(seed=seed).propose(ctx)
        digest = code_hash(proposal.asset)
        seen.add(digest)
        history.append(
            HistoryEntry(
                id=seed + 1,
                title=proposal.title,
                hypothesis=proposal.hypothesis,
                status="discard",
                val_bpb=None,
                delta=None,
                code_hash=digest,
                meta=proposal.meta,
            )
        )
        proposals.append((proposal.title, proposal.asset))
    return proposals


def plan(proposals: list[tuple[str, str]], fraction: float, main_every: int, repeat_every: int) -> list[Planned]:
    """The runs in the order they go: main at both budgets before each block of `main_every`
    proposals, each proposal short then full, every `repeat_every`-th a second full run at the end
    of its block. Interleaved so that a measurement stopped early is still balanced."""
    main = (ROOT / "train.py").read_text()
    order: list[Planned] = []
    for start in range(0, len(proposals), main_every):
        block = start // main_every
        order += [Planned(MAIN_LABEL, "main", main, f, block) for f in (fraction, 1.0)]
        repeats = []
        for index in range(start, min(start + main_every, len(proposals))):
            title, asset = proposals[index]
            label = f"p{index:02d}"
            order += [Planned(label, title, asset, fraction, 0), Planned(label, title, asset, 1.0, 1)]
            if index % repeat_every == 0:
                repeats.append(Planned(label, title, asset, 1.0, 2))
        order += repeats
    return order


def measure(args: argparse.Namespace) -> None:
    done = {(row["label"], row["fraction"], row["seed"]) for row in read_rows(args.out)}
    order = plan(explorer_proposals(args.proposals, args.profile), args.fraction, args.main_every, args.repeat_every)
    stop_at = time.monotonic() + 60 * args.minutes
    print(f"{len(order)} runs planned, {len(done)} already in {args.out}; load {os.getloadavg()}", flush=True)
    sink_lock = threading.Lock()

    def one(number: int, run: Planned) -> None:
        if time.monotonic() > stop_at:
            return  # --minutes reached: said once, below
        started, load = time.monotonic(), os.getloadavg()[0]
        row = {"label": run.label, "title": run.title, "fraction": run.fraction, "seed": run.seed}
        row |= run_once(run, args.profile, args.threads)
        row |= {"wall_s": round(time.monotonic() - started, 1), "load": round(load, 2)}
        with sink_lock:
            with open(args.out, "a") as sink:
                sink.write(json.dumps(row) + "\n")
            print(
                f"[{number + 1}/{len(order)}] {run.label} {run.title[:40]:40} f={run.fraction:g} seed={run.seed} "
                f"{row['status']} {row['value']} ({row['wall_s']} s, load {load:.1f})",
                flush=True,
            )

    todo = [(number, run) for number, run in enumerate(order) if run.key not in done]
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        for future in [pool.submit(one, number, run) for number, run in todo]:
            future.result()
    except BaseException:  # Ctrl-C, or a run that failed to run: the queued runs are not started
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    if time.monotonic() > stop_at:
        print(f"--minutes {args.minutes} reached: the runs not yet started were left for the next call", flush=True)


def run_once(run: Planned, profile: str, threads: int) -> dict[str, Any]:
    """One run under the harness (runner.execute, evaluated in its own process: the isolated path's
    clock, budget and evaluation, without the sandbox and the separate scorer, whose start-up would
    double the CPU time of a short run on a loaded machine), allotted `threads`; what it measured."""
    with tempfile.TemporaryDirectory(prefix="S-screening-") as work:
        asset, out = Path(work) / "train.py", Path(work) / "run"
        asset.write_text(run.asset)
        command = [sys.executable, "-m", "runner.execute", "--asset", str(asset), "--profile", profile]
        command += ["--out", str(out), "--seed", str(run.seed), "--threads", str(threads)]
        command += ["--budget-fraction", str(run.fraction)]
        finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        try:
            result = json.loads((out / "result.json").read_text())
        except (OSError, ValueError):
            result = {"status": "crash", "error": finished.stderr[-300:]}
    ok = result.get("status") == "ok"
    return {
        "status": result.get("status"),
        "value": result.get("val_bpb") if ok else None,
        "error": "" if ok else str(result.get("error", ""))[-200:],
        "steps": result.get("num_steps"),
        "training_s": result.get("training_seconds"),
        "cpu_share": result.get("cpu_share"),
    }


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Measurement:
    """What a measurement file says: main's runs and each proposal's deltas at both budgets."""

    fraction: float
    main: dict[float, list[float]]  # budget fraction -> main's values
    short: dict[str, float]  # proposal -> short delta (against main's mean at the short budget)
    full: dict[str, float]  # proposal -> full delta, seed 1
    full_again: dict[str, float]  # proposal -> its second full run's delta, seed 2
    titles: dict[str, str]
    failed: list[str]  # runs that were not ok: "label f=F seed=S: status"

    def main_sd(self, fraction: float) -> float:
        values = self.main.get(fraction, [])
        return statistics.stdev(values) if len(values) > 1 else math.nan


def load(path: Path) -> Measurement:
    rows = read_rows(path)
    fractions = sorted({row["fraction"] for row in rows})
    short_fraction = fractions[0] if fractions and fractions[0] < 1.0 else math.nan
    main: dict[float, list[float]] = {}
    failed = []
    for row in rows:
        if row["status"] != "ok":
            failed.append(f"{row['label']} f={row['fraction']:g} seed={row['seed']}: {row['status']} {row['error']}")
        elif row["label"] == MAIN_LABEL:
            main.setdefault(row["fraction"], []).append(row["value"])
    means = {fraction: statistics.fmean(values) for fraction, values in main.items()}
    found = Measurement(short_fraction, main, {}, {}, {}, {}, failed)
    for row in rows:
        if row["label"] == MAIN_LABEL or row["status"] != "ok" or row["fraction"] not in means:
            continue
        delta = row["value"] - means[row["fraction"]]
        found.titles[row["label"]] = row["title"]
        if row["fraction"] < 1.0:
            found.short[row["label"]] = delta
        elif row["seed"] == 1:
            found.full[row["label"]] = delta
        else:
            found.full_again[row["label"]] = delta
    return found


def rank_correlations(
    x: list[float], y: list[float], bootstrap: int, rng: np.random.Generator
) -> dict[str, tuple[float, float, float]]:
    """Spearman's rho and Kendall's tau of (x, y), each with its bootstrap 2.5-97.5% interval over
    the pairs (resampled with replacement)."""
    xs, ys = np.asarray(x), np.asarray(y)
    found = {}
    for name, statistic in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau)):
        point = float(statistic(xs, ys).statistic)
        draws = []
        for _ in range(bootstrap):
            pick = rng.integers(0, len(xs), len(xs))
            value = float(statistic(xs[pick], ys[pick]).statistic)
            if math.isfinite(value):
                draws.append(value)
        low, high = np.percentile(draws, [2.5, 97.5]) if draws else (math.nan, math.nan)
        found[name] = (point, float(low), float(high))
    return found


def read(args: argparse.Namespace) -> dict[str, Any]:
    found = load(args.file)
    rng = np.random.default_rng(args.seed)
    both = sorted(set(found.short) & set(found.full))
    again = sorted(set(found.full) & set(found.full_again))
    print(f"# screening measurement: {args.file}")
    for fraction, values in sorted(found.main.items()):
        print(
            f"main at {fraction:g} of the budget: {len(values)} runs, mean {statistics.fmean(values):.5f}, "
            f"sd {found.main_sd(fraction):.5f}"
        )
    print(f"runs not ok: {len(found.failed)}")
    for line in found.failed:
        print(f"  {line}")
    print("\n| proposal | short delta | full delta | second full delta |")
    print("|---|---:|---:|---:|")
    for label in both:
        second = f"{found.full_again[label]:+.5f}" if label in found.full_again else ""
        print(f"| {found.titles[label]} | {found.short[label]:+.5f} | {found.full[label]:+.5f} | {second} |")
    rows = {
        f"short vs full ({len(both)} proposals)": ([found.short[k] for k in both], [found.full[k] for k in both]),
        f"full vs full ({len(again)} proposals)": (
            [found.full[k] for k in again],
            [found.full_again[k] for k in again],
        ),
        f"short vs full, the same {len(again)}": ([found.short[k] for k in again], [found.full[k] for k in again]),
    }
    print("\n| pairs | Spearman [95% bootstrap] | Kendall [95% bootstrap] | Pearson |")
    print("|---|---|---|---:|")
    figures: dict[str, Any] = {}
    for name, (x, y) in rows.items():
        if len(x) < 3:
            continue
        found_corr = rank_correlations(x, y, args.bootstrap, rng)
        pearson = float(np.corrcoef(x, y)[0, 1])
        figures[name] = dict(found_corr, pearson=pearson)
        cells = [f"{p:+.2f} [{lo:+.2f}, {hi:+.2f}]" for p, lo, hi in found_corr.values()]
        print(f"| {name} | {cells[0]} | {cells[1]} | {pearson:+.2f} |")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="run the proposals and main at both budgets")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--profile", default="cpu")
    run.add_argument("--proposals", type=int, default=24)
    run.add_argument("--fraction", type=float, default=0.2)
    run.add_argument("--main-every", type=int, default=6)
    run.add_argument("--repeat-every", type=int, default=3)
    run.add_argument("--minutes", type=float, default=50.0)
    run.add_argument(
        "--threads", type=int, default=1, help="CPU threads allotted to each run (the CPU clock's divisor)"
    )
    run.add_argument("--jobs", type=int, default=1, help="runs at once (one 1-thread run per free core)")
    report = commands.add_parser("read", help="the rank correlations of a measurement")
    report.add_argument("file", type=Path)
    report.add_argument("--bootstrap", type=int, default=2000)
    report.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "measure":
        measure(args)
    else:
        read(args)


if __name__ == "__main__":
    main()
