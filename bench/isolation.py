"""What the isolated run costs per run: sandbox set-up, start-up, export, scoring and the causality
probe, against the bare training process that evaluates in place (runner.launch: what `python
train.py` does).

    .venv/bin/python bench/isolation.py [--profile cpu] [--repeats 2] [--drop-caches]

For each way of running (bare; isolated without the sandbox; isolated in the sandbox, cold; the
same from a warm worker, prepared and ready before the job is handed over, whose wall time counts
from the hand-over, as the local runner and the Modal app use it) it runs the
repository's train.py `--repeats` times, in turn, so that a busy machine weighs on all alike, and
prints the overhead of each run: everything but the training budget itself. The first run of each
kind after --drop-caches (root only: the page cache is emptied before it) is the cold one.
Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner import launch  # noqa: E402
from runner.isolated import Supervisor, run_job  # noqa: E402
from runner.prepare import prepare  # noqa: E402
from runner.profiles import get_profile  # noqa: E402
from runner.protocol import JobSpec  # noqa: E402


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def bare(profile: str, out: Path) -> dict[str, float]:
    started = time.time()
    result = launch.run(ROOT / "train.py", profile, out, threads=0)
    wall = time.time() - started
    assert result["status"] == "ok", result.get("error")
    return {
        "wall": wall,
        "startup": result["startup_seconds"],
        "evaluation": result["eval_seconds"],
        "probe": 0.0,
        "sandbox_setup": 0.0,
        "export": 0.0,
        "training_wall": result["training_wall_seconds"],
    }


def isolated(profile: str, out: Path, sandboxed: bool, warm: bool = False) -> dict[str, float]:
    job = JobSpec(run_id=0, asset=(ROOT / "train.py").read_text(), profile=profile, seed=0)
    if warm:
        worker = Supervisor(out, profile)
        worker.prepare()
        assert worker.wait_ready(600), "the warm worker never got ready"
        started = time.time()
        result = worker.run(job, received_at=started)
        assert result.metrics["warm"] is True
    else:
        started = time.time()
        result = run_job(job, out, use_sandbox=None if sandboxed else False)
    wall = time.time() - started
    assert result.status == "ok", result.error
    assert result.sandboxed == sandboxed, "bubblewrap is not usable here" if sandboxed else "unexpected sandbox"
    t = result.timings
    return {
        "wall": wall,
        "startup": t.startup,
        "evaluation": t.evaluation,
        "probe": t.probe,
        "sandbox_setup": t.sandbox_setup,
        "export": t.export,
        "training_wall": float(result.metrics.get("training_wall_seconds") or 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drop-caches", action="store_true")
    args = parser.parse_args()
    prepare(args.profile, None, progress=False)
    budget = get_profile(args.profile).time_budget_s
    kinds = {
        "bare (in-process eval)": lambda out: bare(args.profile, out),
        "isolated, no sandbox": lambda out: isolated(args.profile, out, False),
        "isolated, sandboxed": lambda out: isolated(args.profile, out, True),
        "isolated, sandboxed, warm": lambda out: isolated(args.profile, out, True, warm=True),
    }
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, run in kinds.items():
                cold = i == 0 and args.drop_caches and drop_caches()
                row = run(Path(tmp) / f"{name.replace(',', '').replace(' ', '-')}-{i}")
                row["cold"] = float(cold)
                rows[name].append(row)
                print(json.dumps({"kind": name, "repeat": i, **{k: round(v, 2) for k, v in row.items()}}), flush=True)
    print(
        f"\nprofile {args.profile}, budget {budget:.0f} s; seconds per run, median of {args.repeats} "
        "(overhead = wall - the training loop's own wall time)"
    )
    print(
        f"{'kind':28} {'wall':>6} {'overhead':>8} {'setup':>6} {'start-up':>8} {'export':>6} {'scoring':>7} {'probe':>6}"
    )
    for name, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        overhead = statistics.median(r["wall"] - r["training_wall"] for r in runs)
        print(
            f"{name:28} {med['wall']:6.1f} {overhead:8.1f} {med['sandbox_setup']:6.2f} {med['startup']:8.1f} "
            f"{med['export']:6.1f} {med['evaluation']:7.1f} {med['probe']:6.2f}"
        )


if __name__ == "__main__":
    main()
