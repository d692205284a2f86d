"""Benchmark: the `cpu` profile's figures on this machine, and where its noise comes from.

Default: runs the top-level train.py under the `cpu` profile N times (default 3) one after the other
and prints tokens/s, val_bpb (median), start-up seconds (process start to first step) and evaluation
seconds, as JSON and as a Markdown table row for docs/benchmarks.md.

    .venv/bin/python bench/cpu_profile.py --runs 3

`--noise`: main's train.py and one explorer move (WARMDOWN_RATIO 0.5 -> 0.4) under each of `--seeds`,
each run in a fresh process that opens the harness session itself (unsandboxed, evaluated in the
process: the numbers the scorer would give), under each of `--clocks`:
    cpu       the CPU-time clock alone (the profile as shipped): steps vary with the load
    work      the work clock (runner.work, at profiles.CPU_WORK_RATE) and the CPU clock, the first to end
    steps:N   exactly N steps, the schedule on step / N: no clock at all, what a seed alone does
Each run is also scored on half as many validation tokens again (`val_bpb_more`), which says how
much of a seed's effect is the evaluation's sample of text. One JSON line per run goes to
`--results` as it ends (a second call runs only what is missing); `--report` prints the table:
per clock and variant the seeds' mean, sd and steps, and the paired difference (change - main
under one seed).

    .venv/bin/python bench/cpu_profile.py --noise --seeds 1-4 --clocks cpu,work,steps:38 \
        --results docs/data/cpu-noise.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runner import launch
from runner.execute import CPU_CLOCK_ENV
from runner.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("main", "warmdown-0.4")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--noise", action="store_true", help="seeds x clocks x (main, one change): see the docstring")
    parser.add_argument("--seeds", default="1-4")
    parser.add_argument("--clocks", default="cpu,work,steps:38")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, default=Path("/tmp/cpu-noise.jsonl"))
    parser.add_argument("--report", action="store_true", help="only print the --noise table of --results")
    parser.add_argument("--one", nargs=3, metavar=("SEED", "VARIANT", "CLOCK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_run(int(args.one[0]), args.one[1], args.one[2], args.threads)), flush=True)
    elif args.noise or args.report:
        if not args.report:
            noise(args)
        report([json.loads(line) for line in args.results.read_text().splitlines() if line.strip()])
    else:
        figures(args)


# --- where the noise comes from ---------------------------------------------------------------


def variant_source(variant: str, clock: str) -> str:
    source = (ROOT / "train.py").read_text()
    if variant == "warmdown-0.4":
        source = replace_once(source, re.compile(r"^WARMDOWN_RATIO = 0\.5", re.M), "WARMDOWN_RATIO = 0.4")
    elif variant != "main":
        raise ValueError(f"unknown variant {variant!r}: one of {VARIANTS}")
    if clock.startswith("steps:"):
        steps = int(clock.split(":", 1)[1])
        source = replace_once(source, re.compile(r"while not h\.time_up\(\):"), f"while h.step < {steps}:")
        source = replace_once(source, re.compile(r"progress = h\.progress\(\)"), f"progress = h.step / {steps}")
    return source


def replace_once(source: str, pattern: re.Pattern[str], new: str) -> str:
    if len(pattern.findall(source)) != 1:
        raise ValueError(f"train.py matches {pattern.pattern!r} other than once: the variant needs updating")
    return pattern.sub(new, source)


def one_run(seed: int, variant: str, clock: str, threads: int) -> dict[str, Any]:
    """One run in this process: the harness session, train.py's code, and a second evaluation."""
    import torch

    from runner import harness, profiles
    from runner.evaluate import evaluate_bpb

    torch.set_num_threads(threads)
    if clock == "work":  # the work clock beside the CPU clock (no shipped profile has it: runner/profiles.py)
        profiles.PROFILES["cpu"] = dataclasses.replace(
            profiles.PROFILES["cpu"], flops_per_second=profiles.CPU_WORK_RATE
        )
    source = variant_source(variant, clock)
    with tempfile.TemporaryDirectory() as tmp:
        session = harness.open_session("cpu", out_dir=Path(tmp), seed=seed, threads=threads)
        namespace: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(source, "train.py", "exec"), namespace)
        result = session.result
        assert result is not None, "train.py did not call h.finish"
        more = evaluate_bpb(
            namespace["model"],
            session.tokenizer,
            session.dataset,
            seq_len=session.seq_len,
            eval_tokens=session.profile.eval_tokens * 3 // 2,
            batch_size=session.profile.eval_batch_size,
            device=session.device,
        )
    return {
        "seed": seed,
        "variant": variant,
        "clock": clock,
        "val_bpb": result.val_bpb,
        "val_bpb_more": more.val_bpb,
        "steps": result.num_steps,
        "training_seconds": round(result.training_seconds, 3),
        "work_seconds": result.extra.get("work_seconds"),
        "cpu_share": round(result.cpu_share, 3),
        "threads": threads,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def noise(args: argparse.Namespace) -> None:
    prepare("cpu")
    done = set()
    if args.results.exists():
        done = {(r["seed"], r["variant"], r["clock"]) for r in map(json.loads, args.results.read_text().splitlines())}
    seeds = parse_seeds(args.seeds)
    for seed in seeds:
        for clock in args.clocks.split(","):
            for variant in VARIANTS:
                if (seed, variant, clock) in done:
                    continue
                command = [sys.executable, __file__, "--one", str(seed), variant, clock, "--threads", str(args.threads)]
                load = Path("/proc/loadavg").read_text().split()[0]
                env = dict(os.environ, **CPU_CLOCK_ENV)  # OpenMP threads that sleep, as runner.execute's
                out = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"seed {seed} {variant} {clock} failed:\n{out.stderr[-2000:]}")
                record = dict(json.loads(line[len("RESULT ") :]), load_at_start=float(load))
                with args.results.open("a") as sink:
                    sink.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += [s for s in range(int(low), int(high or low) + 1) if s not in seeds]
    return seeds


def report(records: list[dict[str, Any]]) -> None:
    print(
        "| clock | variant | seeds | val_bpb mean | sd over seeds | steps (min-max) | sd of val_bpb_more "
        "| sd of (val_bpb - val_bpb_more) | paired d mean | sd d |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for clock in dict.fromkeys(r["clock"] for r in records):
        by_variant = {v: {r["seed"]: r for r in records if r["clock"] == clock and r["variant"] == v} for v in VARIANTS}
        for variant, runs in by_variant.items():
            if len(runs) < 2:
                continue
            values = [r["val_bpb"] for r in runs.values()]
            steps = [r["steps"] for r in runs.values()]
            more = [r["val_bpb_more"] for r in runs.values()]
            shift = [r["val_bpb"] - r["val_bpb_more"] for r in runs.values()]
            paired = "| |"
            if variant != "main":
                d = [
                    r["val_bpb"] - by_variant["main"][s]["val_bpb"] for s, r in runs.items() if s in by_variant["main"]
                ]
                paired = f"| {statistics.mean(d):+.4f} | {statistics.stdev(d):.4f} |" if len(d) > 1 else "| |"
            print(
                f"| {clock} | {variant} | {len(runs)} | {statistics.mean(values):.4f} | {statistics.stdev(values):.4f} "
                f"| {min(steps)}-{max(steps)} | {statistics.stdev(more):.4f} | {statistics.stdev(shift):.4f} {paired}"
            )


# --- the profile's figures ----------------------------------------------------------------------


def figures(args: argparse.Namespace) -> None:
    prepare(args.profile)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            result = launch.run(ROOT / "train.py", args.profile, Path(tmp) / str(i), seed=i)
            if result["status"] != "ok":
                raise SystemExit(f"run {i} failed: {result.get('error')}")
            results.append(result)
            print(
                f"run {i}: val_bpb {result['val_bpb']:.4f}, {result['tokens_per_second']:.0f} tok/s, "
                f"{result['num_steps']} steps",
                flush=True,
            )
    summary = {
        "profile": args.profile,
        "runs": args.runs,
        "val_bpb_median": statistics.median(r["val_bpb"] for r in results),
        "val_bpb_all": [round(r["val_bpb"], 4) for r in results],
        "tokens_per_second_median": statistics.median(r["tokens_per_second"] for r in results),
        "startup_seconds_median": statistics.median(r["startup_seconds"] for r in results),
        "eval_seconds_median": statistics.median(r["eval_seconds"] for r in results),
        "training_seconds_median": statistics.median(r["training_seconds"] for r in results),
        "total_seconds_median": statistics.median(r["total_seconds"] for r in results),
        "num_steps_median": statistics.median(r["num_steps"] for r in results),
        "num_params_M": results[0]["num_params_M"],
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(summary, indent=2))
    print(
        f"| {summary['date']} | {args.profile} | {summary['tokens_per_second_median']:.0f} | "
        f"{summary['val_bpb_median']:.4f} ({', '.join(map(str, summary['val_bpb_all']))}) | "
        f"{summary['startup_seconds_median']:.1f} | {summary['eval_seconds_median']:.1f} | "
        f"{summary['num_steps_median']:.0f} | {summary['total_seconds_median']:.1f} |"
    )


if __name__ == "__main__":
    main()
