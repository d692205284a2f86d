"""What a train.py that ignores its harness can still gain over the honest one: the budget's residual.

    .venv/bin/python bench/budget.py --profile smoke --threads 1 --tails 2.0 1.5 1.0 [--repeats 1]

Runs the repository's train.py through the isolated path from a warm worker (as the local runner
and the Modal app do), then a greedy copy of it once per `--tails` value: the same file with its
loop's `h.time_up()` replaced by its own rule, which knows the supervisor's cap and trains until
one more step would end past the cap less TAIL seconds of the profile's clock, the room it keeps
for its own export and exit. The smallest tail that still ends `ok` is the most such a train.py
can take; its gain over the honest run is the residual. For each run it prints the status, the
supervisor's reading (seconds on the profile's clock from the hand-over to the end of the
process, measured outside the training process), the clock's reading at the last training step
(from the progress lines), and the seconds of training after the warm-up step (the harness's
count of the timed steps: the greedy copy does not tamper with it). Figures go to
docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.isolated import Supervisor  # noqa: E402
from runner.prepare import prepare  # noqa: E402
from runner.profiles import get_profile  # noqa: E402
from runner.protocol import JobSpec  # noqa: E402

LOOP = "while not h.time_up():"


def greedy(source: str, tail: float) -> str:
    """train.py, training until the next step would end `tail` seconds before the supervisor's cap."""
    assert source.count(LOOP) == 1, "train.py's loop is not where this bench expects it"
    rule = (
        f"_steps = []\n"
        f"def _greedy_time_up():\n"
        f"    _steps.append(h.elapsed())\n"
        f"    step = max((b - a for a, b in zip(_steps[-5:], _steps[-4:])), default=0.0)\n"
        f"    return h.elapsed() + step >= h.profile.cap_s(h.threads) - {tail}\n"
    )
    return source.replace(LOOP, rule + "while not _greedy_time_up():")


def run(profile: str, threads: int, asset: str, out: Path) -> dict[str, Any]:
    lines: list[dict[str, Any]] = []
    worker = Supervisor(out, profile, threads=threads, on_progress=lines.append)
    worker.prepare()
    assert worker.wait_ready(600), "the warm worker never got ready"
    started = time.time()
    result = worker.run(JobSpec(run_id=0, asset=asset, profile=profile, seed=0))
    last = lines[-1] if lines else {}
    return {
        "status": result.status,
        "supervisor_s": result.metrics.get("training_seconds"),
        "last_step_at_s": last.get("elapsed_seconds"),
        "trained_s": last.get("training_seconds"),
        "steps": last.get("step"),
        "val_bpb": result.val_bpb,
        "wall_s": round(time.time() - started, 1),
        "error": (result.error or "")[:160],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tails", type=float, nargs="+", default=[2.0, 1.5, 1.0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    profile = get_profile(args.profile)
    prepare(profile.name)
    print(
        f"profile {profile.name}, {args.threads} thread(s): cap {profile.cap_s(args.threads):.2f} s, training "
        f"ends by {profile.training_ends_s(args.threads):.2f} s on the {profile.clock} clock",
        flush=True,
    )
    source = (ROOT / "train.py").read_text()
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as scratch:
        for repeat in range(args.repeats):
            for label, asset in [("honest", source)] + [(f"greedy tail {t}", greedy(source, t)) for t in args.tails]:
                row = run(profile.name, args.threads, asset, Path(scratch) / f"{repeat}-{label.replace(' ', '-')}")
                print(json.dumps({"run": label, **row}), flush=True)


if __name__ == "__main__":
    main()
