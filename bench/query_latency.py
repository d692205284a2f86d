"""The query-latency task on one machine: preparation, the starting query.sql, a good rewrite, and
the noise of main's metric.

    .venv/bin/python bench/query_latency.py [--profile cpu] [--repeats 5] [--cache DIR]

Prepares the profile's database in a fresh cache (or DIR, where a second run finds it prepared)
and reports how long that took and the database's size; then evaluates the starting query.sql
(runner/tasks/query_latency/query.sql) and GOOD (the reference's join with three covering
indexes, tests/runner/tasks/indexed_query.sql) `--repeats` times each, in turn, so that a busy machine weighs on both alike, with seeds
0, 1, 2...: p95_ms of each evaluation, their mean and standard deviation (the noise of main's
metric when main is the starter), index build time and each evaluation's wall time. Figures go to
docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner import sandbox  # noqa: E402
from runner.tasks import query_latency  # noqa: E402
from runner.tasks.query_latency import database  # noqa: E402

# the reference's join with the indexes its plan wants, shared with the task's tests
GOOD = (ROOT / "tests" / "runner" / "tasks" / "indexed_query.sql").read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path, help="the cache to prepare in (default: a fresh one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="query-latency-bench-") as scratch:
        os.environ["AUTORESEARCH_CACHE"] = str(args.cache or Path(scratch) / "cache")
        started = time.monotonic()
        fingerprint = query_latency.prepare(args.profile, progress=True)
        prepare_s = time.monotonic() - started
        prepared = database.load(args.profile)
        print(
            f"prepare: {prepare_s:.1f} s, {sum(prepared.table_rows.values()):,} rows "
            f"({', '.join(f'{name} {rows:,}' for name, rows in prepared.table_rows.items())}), "
            f"{prepared.db_bytes / 1e6:.0f} MB, fingerprint {fingerprint}; sandbox: {sandbox.available()[1]}"
        )
        assets = {"starter": query_latency.STARTER.read_text(), "good": GOOD}
        found: dict[str, list[float]] = {name: [] for name in assets}
        for seed in range(args.repeats):
            for name, text in assets.items():
                result = query_latency.evaluate(text, args.profile, seed, Path(scratch) / f"{name}-{seed}")
                if result.status != "ok":
                    print(f"{name} seed {seed}: {result.status}: {result.error}")
                    return 1
                found[name].append(float(result.value or 0.0))
                m = result.metrics
                print(
                    f"{name:8s} seed {seed}: p95 {m['p95_ms']:9.2f} ms  p50 {m['p50_ms']:9.2f}  p99 {m['p99_ms']:9.2f}  "
                    f"{m['executions']} executions  index build {m['index_build_s']:.2f} s  "
                    f"wall {result.setup_s + result.evaluation_s:.1f} s",
                    flush=True,
                )
        for name, values in found.items():
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            print(
                f"{name}: p95 mean {statistics.fmean(values):.2f} ms, sd {sd:.2f} ms "
                f"({100 * sd / statistics.fmean(values):.1f}%) over {len(values)} evaluations"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
