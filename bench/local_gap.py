"""Benchmark: how long a local runner's slot sits idle between two runs, from a work directory's
run directories alone (what a runner-side queue-ahead, the slot's warm worker holding its next job,
could save at most).

For each slot (job.json's `slot`), the gap between one run's result.json being written (its
modification time: the supervisor's last act) and the next run's submission (job.json's
`submitted_at`): the conductor noticing the end, collecting, dispatching, and the runner handing
the job over. A run's own start-up after the hand-over (train.py's first step) is not in it.

    .venv/bin/python bench/local_gap.py WORKDIR/runs [WORKDIR/runs ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def runs_of(runs_dir: Path) -> list[dict[str, Any]]:
    """Each finished run's slot, submission time, end time (result.json written) and whether warm."""
    found = []
    for out in runs_dir.iterdir():
        if not out.name.isdigit() or not (out / "job.json").exists() or not (out / "result.json").exists():
            continue
        job = json.loads((out / "job.json").read_text())
        found.append(
            {
                "slot": job.get("slot", 0),
                "submitted": job["submitted_at"],
                "ended": (out / "result.json").stat().st_mtime,
                "warm": bool(job.get("warm")),
            }
        )
    return found


def gaps_of(runs: list[dict[str, Any]]) -> list[float]:
    """A slot's idle time between consecutive runs (never negative: overlapping runs are skipped)."""
    gaps = []
    for slot in {r["slot"] for r in runs}:
        seq = sorted((r for r in runs if r["slot"] == slot), key=lambda r: r["submitted"])
        gaps += [b["submitted"] - a["ended"] for a, b in zip(seq, seq[1:], strict=False) if b["submitted"] > a["ended"]]
    return sorted(gaps)


def main() -> None:
    for arg in sys.argv[1:]:
        runs = runs_of(Path(arg))
        gaps = gaps_of(runs)
        if not gaps:
            print(f"{arg}: {len(runs)} finished runs, no gap between two of one slot")
            continue
        p90 = gaps[round(0.9 * (len(gaps) - 1))]
        print(
            f"{arg}: {len(runs)} runs ({sum(r['warm'] for r in runs)} warm), {len(gaps)} gaps: median "
            f"{statistics.median(gaps):.3f} s, p90 {p90:.3f} s, max {gaps[-1]:.3f} s"
        )


if __name__ == "__main__":
    main()
