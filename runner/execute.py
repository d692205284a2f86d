"""Run one train.py under the harness, in this process: `python -m runner.execute ...`.

Opens the session (profile, prepared data, tokenizer), executes the asset as `__main__`, and makes
sure a record exists at the end: the harness's measurement when train.py called `h.finish(model)`,
otherwise a crash record with the traceback tail. Exit code 0 only on success. With `--export` it
is the training process of an isolated run (runner.isolated, inside the sandbox): finish() exports
the model and the record is claims.json, which only the supervisor reads, as train.py's claims.

With `--wait` (what the supervisor always passes) it gets ready first, before it knows its job:
torch imported, and torch._dynamo, which torch.export and torch.compile need and which takes
seconds to import. It then reads one line from stdin, `{"seed": N, "started_at": T}` (and
`"budget_fraction": F` for a short run, runner.protocol), and only
then reads train.py, which the supervisor has written meanwhile. A supervisor prepared ahead of
its job (a warm worker) so takes the imports off the run's critical path; started_at, the run's
zero for start-up, is when the job was handed over. The run's clock (runner.harness) starts there
too, as the supervisor's does: the wall time of the hand-over, and this process's CPU time when it
read the line (its imports before are not the run's). With --export and no --threads, the run is
allotted the CPUs it may use, the supervisor's divisor too; and the process ends right after its
record is written, without the interpreter's teardown, which its clock would count. End of input instead of a line: the worker
was not needed, and it exits 0 having run nothing.

For a profile whose budget is CPU time it first fixes two things in the environment, before torch
is loaded and long before train.py runs: no GPU is visible (one would do the work at almost no CPU
time), and OpenMP threads sleep rather than spin while they wait (OMP_WAIT_POLICY=PASSIVE).
Spinning burns CPU time without doing work, and far more of it when neighbours hold the cores: in
a smoke run on a loaded 2-core machine a step cost 2-7 CPU seconds spinning, 0.36 passive.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

STARTED_AT = time.time()  # before torch is imported: start-up time includes the imports
STARTED_IN = os.getcwd()  # a warm worker's directory may be renamed while it waits (runner.workdir)

from runner import files, workdir  # noqa: E402
from runner.profiles import get_profile  # noqa: E402

# For CPU-time profiles: read by the CUDA driver and the OpenMP runtime when they start.
CPU_CLOCK_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_WAIT_POLICY": "PASSIVE"}

TRACEBACK_LINES = 40


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.execute")
    parser.add_argument("--asset", type=Path, required=True, help="the train.py to run")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--out", type=Path, required=True, help="run directory for result.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="data source (default: the profile's)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads allotted to the run, the CPU clock's divisor (0: torch's count)",
    )
    parser.add_argument(
        "--budget-fraction",
        type=float,
        default=1.0,
        help="the share of the profile's time budget to train (a screening run; the job line may say it)",
    )
    parser.add_argument(
        "--started-at", type=float, default=None, help="launch time (epoch seconds) for start-up accounting"
    )
    parser.add_argument(
        "--export", action="store_true", help="export the model for a separate scoring process (runner.isolated)"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help='get ready, then read {"seed": N, "started_at": T} from stdin before running the asset',
    )
    args = parser.parse_args(argv)
    try:
        profile = get_profile(args.profile)
    except ValueError:
        profile = None  # reported below, by open_session
    counts_cpu_time = profile is not None and profile.clock == "cpu"
    if counts_cpu_time:
        os.environ.update(CPU_CLOCK_ENV)

    import torch

    from runner import harness
    from runner.data import DataMissing

    if counts_cpu_time:
        torch.cuda.device_count()  # CUDA reads the (empty) device list now, before train.py could change it
    if args.export and args.threads <= 0:  # the supervisor's rule, so that both clocks divide alike
        args.threads = len(os.sched_getaffinity(0))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    handed_over = None  # the run's clock starts at the hand-over (wall, process CPU); else at the session's opening
    if args.wait:
        go = _wait_for_job(profile)
        if go is None:
            return 0  # not needed: nothing was run
        args.seed, args.started_at = int(go.get("seed", args.seed)), float(go.get("started_at", time.time()))
        args.budget_fraction = float(go.get("budget_fraction", args.budget_fraction))
        handed_over = (args.started_at, time.process_time())
    workdir.follow(STARTED_IN)
    args.asset, args.out = Path(os.path.abspath(args.asset)), Path(os.path.abspath(args.out))
    if profile is not None:  # a last resort that needs no parent: a hung run ends even if its conductor is gone
        signal.alarm(int(profile.max_total_s) + 60)
    args.out.mkdir(parents=True, exist_ok=True)
    started_at = args.started_at or STARTED_AT
    try:
        source = args.asset.read_text(encoding="utf-8")
        session = harness.open_session(
            args.profile,
            data=args.data,
            out_dir=args.out,
            seed=args.seed,
            started_at=started_at,
            handed_over=handed_over,
            asset_sha256=hashlib.sha256(source.encode()).hexdigest(),
            threads=args.threads,
            export=args.export,
            budget_fraction=args.budget_fraction,
        )
    except (DataMissing, ValueError, OSError, RuntimeError) as error:
        return _crash(args.out, f"{type(error).__name__}: {error}", started_at, args.export)

    sys.argv = [str(args.asset)]
    try:
        runpy.run_path(str(args.asset), run_name="__main__")
    except BaseException as error:  # noqa: BLE001 - every failure of the asset is a crash record
        if isinstance(error, SystemExit) and error.code in (0, None) and session.result is not None:
            return 0
        tail = "".join(traceback.format_exception(error)).splitlines()[-TRACEBACK_LINES:]
        return _crash(args.out, "\n".join(tail), started_at, args.export)
    if session.result is None:
        return _crash(
            args.out,
            "train.py ended without calling h.finish(model): the harness has "
            "nothing to measure. End train.py with `h.finish(model)`.",
            started_at,
            args.export,
        )
    if args.export:  # its clock runs until it ends: skip the interpreter's teardown (half a CPU second on smoke)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _wait_for_job(profile: object) -> dict[str, object] | None:
    """Import what every run needs, say so, and read the job's line; None at end of input."""
    import torch._dynamo  # torch.export (finish) and torch.compile import it: seconds

    if getattr(profile, "device", "") == "cuda":
        import torch._inductor.compile_fx  # noqa: F401 - torch.compile's back end, seconds more
    print("[harness] ready: waiting for the job", flush=True)
    line = sys.stdin.readline()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # nothing else comes this way: train.py reads no pipe of ours
    if not line.strip():
        return None
    go = json.loads(line)
    if not isinstance(go, dict):
        raise SystemExit(f"the job line must be a JSON object, not {line[:80]!r}")
    return go


def _crash(out: Path, error: str, started_at: float, export: bool = False) -> int:
    print(error, file=sys.stderr, flush=True)
    files.write_text(
        out / ("claims.json" if export else "result.json"),
        json.dumps({"status": "crash", "error": error, "total_seconds": time.time() - started_at}, indent=2),
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
