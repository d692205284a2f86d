"""Benchmark: the `cpu` profile's figures on this machine.

Runs the top-level train.py under the `cpu` profile N times (default 3) one after the other and
prints tokens/s, val_bpb (median), start-up seconds (process start to first step) and evaluation
seconds, as JSON and as a Markdown table row for docs/benchmarks.md.

    .venv/bin/python bench/cpu_profile.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from runner import launch
from runner.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
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
    figures = {
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
    print(json.dumps(figures, indent=2))
    print(
        f"| {figures['date']} | {args.profile} | {figures['tokens_per_second_median']:.0f} | "
        f"{figures['val_bpb_median']:.4f} ({', '.join(map(str, figures['val_bpb_all']))}) | "
        f"{figures['startup_seconds_median']:.1f} | {figures['eval_seconds_median']:.1f} | "
        f"{figures['num_steps_median']:.0f} | {figures['total_seconds_median']:.1f} |"
    )


if __name__ == "__main__":
    main()
