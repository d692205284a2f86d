"""The harness session: what train.py may use, and the only place where a run is measured.

train.py gets its session with `h = harness.session()` and from it the profile constants, the
device, the tokenizer and the training batches. It calls `h.step_done(loss)` once per optimizer
step and trains while `not h.time_up()`; `h.progress()` is the fraction of the budget used, for
schedules. At the end it hands its model to `h.finish(model)`. Nothing train.py prints is read.

What finish() does depends on how the run was started:
- through the isolated path (`runner.isolated`: the bot's runners and `autoresearch train`), the
  session exports the model as a torch.export graph and writes what train.py claims about its run
  (steps, tokens, memory) to claims.json; a separate process that never ran train.py scores the
  graph (runner.score), and the supervisor measures the training time from outside the sandbox.
  Nothing in this process, which train.py can change at will, decides the number;
- run directly (`python train.py`), it evaluates val_bpb in this process and writes result.json:
  convenient for a person at their own machine, and never used to judge an experiment.

The clock is the supervisor's, read here with the same origin: the hand-over of the job (runner.execute
passes its readings), or the session's opening in a direct run. Everything the process does from
then on counts, start-up, compilation and warm-up steps, training, the export: that is what the
supervisor (runner.isolated) measures from outside, and it ends the process at the profile's cap,
budget + allowance (`Profile.cap_s`), rejecting the run. `time_up()` is true once the next step,
as long as the longest of the last few, would end past the cap less the export margin, the room
kept for the export and the exit, so that an honest train.py always finishes inside the cap. With the
allowance sized to an honest run's overheads (see profiles.py), it trains about the budget, as in
the reference, where the budget counts from the end of the first steps. `progress()` runs from 0
at the end of the first `profile.warmup_steps` steps to 1 at that end of training; the
`training_seconds` reported (train.py's own claim in an isolated run) counts the steps after the
warm-up ones. Replacing time_up() or the clock in this process changes nothing the supervisor
sees: a train.py that ignores the harness is stopped at the cap, its run rejected. What a second
costs depends on the profile's clock:
- "wall" (GPU profiles): wall time;
- "cpu" (CPU profiles): the CPU time the process spent, all its threads together
  (`time.process_time`), divided by the threads the run was allotted, fixed when the session
  opens. Other work on the machine then slows a run down without giving it less training, and
  threads beyond the allotment burn the budget faster instead of buying more of it; train.py
  changing torch's thread count ends the run (ThreadsChanged). runner.execute makes OpenMP
  threads sleep rather than spin while they wait, which would burn CPU time for nothing. The wall
  time of the timed steps is recorded beside it, and `cpu_share` (CPU time / (wall time *
  threads)) says how much of its cores the run had: well below what the same train.py gets on a
  quiet machine, the machine was busy (a run's serial parts keep it below 1 even when quiet).
CPU time spent in child processes is not counted here, but the supervisor counts the whole process
tree: a train.py that trains in a child only reaches the cap sooner.

A CPU profile with a work clock (`profile.flops_per_second`; none shipped, runner.profiles says why) charges each
step after the warm-up ones the operations it was counted doing (runner.work, counting from the
session's opening to finish()), at that rate: time_up() is also true once another step charged as
much as the most of the last few would take the charges past the budget, and progress() is the
further on of the two clocks. The charges do not move with the machine's load, so where they end
training first, every run of one train.py trains the same steps on the same schedule. The result's
extra records `work_seconds` and `flops_per_step`.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from runner import dataloader, files
from runner.data import Dataset, load_dataset, verify_dataset
from runner.evaluate import evaluate_bpb
from runner.files import MODEL_FILE
from runner.handoff import export_model
from runner.profiles import Profile, get_profile, harness_hash
from runner.tokenizer import Tokenizer, load_tokenizer
from runner.work import FlopCount

# bf16 dense peak of the accelerators we know, for MFU (FLOP/s)
PEAK_FLOPS = {"H100": 989.5e12, "H200": 989.5e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}
RECENT_STEPS = 4  # time_up() expects the next step as long as the longest of these last ones


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class ThreadsChanged(RuntimeError):
    """train.py changed torch's CPU thread count on a profile whose budget is CPU time."""


@dataclass
class Result:
    """The harness's measurement of one run; written to result.json."""

    status: str
    val_bpb: float
    training_seconds: float
    total_seconds: float
    startup_seconds: float
    eval_seconds: float
    peak_vram_mb: float
    mfu_percent: float
    total_tokens_M: float
    num_steps: int
    num_params_M: float
    tokens_per_second: float  # per second of the budget's clock
    tokens_per_wall_second: float
    clock: str  # the profile's: "wall" or "cpu"
    training_wall_seconds: float  # wall time of the timed steps
    cpu_seconds: float  # process CPU time over the timed steps
    threads: int  # CPU threads the run was allotted
    cpu_share: float  # cpu_seconds / (training_wall_seconds * threads): 1.0, all threads busy throughout
    profile: str
    harness_hash: str
    data_fingerprint: str
    asset_sha256: str
    seed: int
    device: str
    extra: dict[str, Any] = field(default_factory=dict)

    def summary_block(self) -> str:
        """The reference's summary block. In an isolated run (status exported) it has no val_bpb
        line: the model is scored afterwards by another process, and the supervisor writes the
        block with the number then (runner.protocol.ResultSpec.summary_block)."""
        lines = [
            "---",
            *([f"val_bpb:          {self.val_bpb:.6f}"] if self.status == "ok" else []),
            f"training_seconds: {self.training_seconds:.1f}",
            f"total_seconds:    {self.total_seconds:.1f}",
            f"peak_vram_mb:     {self.peak_vram_mb:.1f}",
            f"mfu_percent:      {self.mfu_percent:.2f}",
            f"total_tokens_M:   {self.total_tokens_M:.1f}",
            f"num_steps:        {self.num_steps}",
            f"num_params_M:     {self.num_params_M:.1f}",
        ]
        if "depth" in self.extra:
            lines.append(f"depth:            {self.extra['depth']}")
        return "\n".join(lines)


class Session:
    """One run: the profile, data, tokenizer, clock and progress of a single training job."""

    def __init__(
        self,
        profile: Profile,
        dataset: Dataset,
        tokenizer: Tokenizer,
        *,
        out_dir: Path,
        seed: int = 0,
        asset_sha256: str = "",
        started_at: float | None = None,
        handed_over: tuple[float, float] | None = None,
        device: torch.device | None = None,
        threads: int = 0,
        export: bool = False,
        wall_clock: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        """`threads`: the CPU threads the run was allotted (0: torch's thread count now).
        `started_at`: the zero of start-up accounting (default: now). `handed_over`: the wall and
        process CPU clocks' readings at the hand-over of the job, the zero of the run's clock
        (default: now). `export`: finish() exports the model for the scoring process instead of
        evaluating it."""
        self.profile = profile
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.out_dir = out_dir
        self.seed = seed
        self.asset_sha256 = asset_sha256
        self.export = export
        self.device = device or pick_device(profile)
        self.threads = threads if threads > 0 else torch.get_num_threads()
        self._torch_threads = torch.get_num_threads()  # at open; a CPU-time run must keep it
        self._wall_clock = wall_clock
        self._cpu_clock = cpu_clock
        self.started_at = started_at if started_at is not None else wall_clock()
        self._origin_wall, self._origin_cpu = handed_over if handed_over is not None else (wall_clock(), cpu_clock())
        self.step = 0
        self.training_seconds = 0.0  # on the profile's clock: what the budget counts
        self.training_wall_seconds = 0.0
        self.cpu_seconds = 0.0
        self.tokens_served = 0
        self.first_step_at: float | None = None
        self.last_loss = math.nan
        self.result: Result | None = None
        self._last_wall = wall_clock()
        self._last_cpu = cpu_clock()
        self._last_report = 0.0
        self._untimed_tokens = 0  # tokens of the warm-up steps, which the clock does not count
        self._recent_steps: deque[float] = deque(maxlen=RECENT_STEPS)  # their lengths on the run's clock
        self._progress_seen = 0.0  # the largest progress() answered: it never goes back
        # The work clock (profile.flops_per_second > 0): each timed step charged its counted operations
        self.work_seconds = 0.0  # the timed steps' charges so far
        self._recent_work: deque[float] = deque(maxlen=RECENT_STEPS)  # the last few steps' charges
        self._work: FlopCount | None = FlopCount() if profile.flops_per_second > 0 else None
        self._flops_seen = 0
        if self._work is not None:
            self._work.__enter__()  # left in finish(), before the export
        self._last_elapsed = self.elapsed()
        self._warm_at = self._last_elapsed  # the run's clock at the end of the warm-up steps: progress() starts there
        out_dir.mkdir(parents=True, exist_ok=True)
        self._progress_file = open(out_dir / "progress.jsonl", "a", buffering=1)

    # --- what train.py reads --------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.profile.seq_len

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def train_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless (inputs, targets) batches of [batch_size, seq_len] on the session's device."""
        for x, y, _epoch in dataloader.batches(
            self.tokenizer, self.dataset, "train", batch_size, self.seq_len, self.device
        ):
            self.tokens_served += x.numel()
            yield x, y

    @property
    def ends_at(self) -> float:
        """Where training must end on the run's clock: the cap less the room for the export."""
        return self.profile.training_ends_s(self.threads)

    def elapsed(self) -> float:
        """Seconds on the profile's clock since the hand-over: what the supervisor counts."""
        if self.profile.clock == "cpu":
            return (self._cpu_clock() - self._origin_cpu) / self.threads
        return self._wall_clock() - self._origin_wall

    def progress(self) -> float:
        """Fraction of the training time used so far, in [0, 1]: 0 until the warm-up steps end, and
        1 exactly when time_up() turns true. Training ends one step-guard before `ends_at`, so the
        window ends there too: a schedule on progress (the warmdown) then runs to its end. The
        guard moves with the step times, so the fraction never goes back."""
        if self.step < self.profile.warmup_steps:
            return 0.0
        window = self.ends_at - max(self._recent_steps, default=0.0) - self._warm_at
        fraction = 1.0 if window <= 0 else min(1.0, max(0.0, (self.elapsed() - self._warm_at) / window))
        if self._work is not None:  # whichever clock is further on: the one that ends training
            work_window = self.profile.time_budget_s - max(self._recent_work, default=0.0)
            fraction = max(fraction, 1.0 if work_window <= 0 else min(1.0, self.work_seconds / work_window))
        self._progress_seen = max(self._progress_seen, fraction)
        return self._progress_seen

    def time_up(self) -> bool:
        """True when another step as long as the longest of the last few would end past `ends_at`;
        with a work clock, also when another step charged as much as the most of the last few would
        end past the budget."""
        if self.elapsed() + max(self._recent_steps, default=0.0) >= self.ends_at:
            return True
        return self._work is not None and self.work_seconds + max(self._recent_work, default=0.0) >= (
            self.profile.time_budget_s
        )

    def stop_counting(self) -> None:
        """Leave the work clock's operation count (finish() does, before the export)."""
        if self._work is not None and _get_current_dispatch_mode() is self._work:
            self._work.__exit__(None, None, None)
        self._work = None  # one that train.py left (or buried under its own) counts no more

    def step_done(self, loss: float | torch.Tensor) -> None:
        """Mark the end of one optimizer step; fails fast on a NaN or infinite loss."""
        value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now, cpu_now = self._wall_clock(), self._cpu_clock()
        if self.profile.clock == "cpu" and torch.get_num_threads() != self._torch_threads:
            # Fewer threads than allotted would stretch the same CPU budget over more wall time,
            # where threads waste less of it waiting for each other.
            raise ThreadsChanged(
                f"train.py changed torch's thread count from {self._torch_threads} to "
                f"{torch.get_num_threads()} (step {self.step + 1}); the harness allots "
                f"the threads of a {self.profile.name} run. Remove the "
                "torch.set_num_threads call from train.py."
            )
        if self.first_step_at is None:
            self.first_step_at = now
        self.step += 1
        elapsed = self.elapsed()
        if self.step > 1:  # the first also holds the start-up: no measure of a step
            self._recent_steps.append(max(0.0, elapsed - self._last_elapsed))
        self._last_elapsed = elapsed
        if self.step <= self.profile.warmup_steps:
            self._warm_at = elapsed
        if self._work is not None:
            flops, self._flops_seen = self._work.flops - self._flops_seen, self._work.flops
            if self.step > self.profile.warmup_steps:
                charge = flops / self.profile.flops_per_second
                self.work_seconds += charge
                self._recent_work.append(charge)
        if self.step > self.profile.warmup_steps:
            wall, cpu = now - self._last_wall, cpu_now - self._last_cpu
            self.training_wall_seconds += wall
            self.cpu_seconds += cpu
            self.training_seconds += cpu / self.threads if self.profile.clock == "cpu" else wall
        else:
            self._untimed_tokens = self.tokens_served
        self._last_wall, self._last_cpu = now, cpu_now
        self.last_loss = value
        if not math.isfinite(value):
            raise TrainingDiverged(
                f"training loss is {value} at step {self.step}: the run diverged. "
                "Lower the learning rates or add warmup in train.py."
            )
        if now - self._last_report >= 1.0 or self.time_up():
            self._report(now)

    # --- the measurement ------------------------------------------------------------------------
    def finish(
        self, model: torch.nn.Module, *, flops_per_token: float | None = None, extra: dict[str, Any] | None = None
    ) -> Result:
        """Evaluate the model on the fixed validation tokens and write result.json; or, in an
        isolated run, export it for the scoring process and write claims.json."""
        if self.result is not None:
            raise RuntimeError("finish() was already called for this run")
        work = self._work_claims()
        self.stop_counting()
        eval_started = self._wall_clock()
        if self.export:
            export_model(
                model,
                self.out_dir / MODEL_FILE,
                batch_size=self.profile.eval_batch_size,
                seq_len=self.seq_len,
                vocab_size=self.vocab_size,
                device=self.device,
            )
            val_bpb, scored = math.nan, {}
        else:
            evaluation = evaluate_bpb(
                model,
                self.tokenizer,
                self.dataset,
                seq_len=self.seq_len,
                eval_tokens=self.profile.eval_tokens,
                batch_size=self.profile.eval_batch_size,
                device=self.device,
            )
            val_bpb, scored = evaluation.val_bpb, {"eval_tokens": evaluation.tokens, "eval_bytes": evaluation.bytes}
        now = self._wall_clock()
        timed_tokens = self.tokens_served - self._untimed_tokens
        params = sum(p.numel() for p in model.parameters())
        self.result = Result(
            status="exported" if self.export else "ok",
            val_bpb=val_bpb,
            training_seconds=self.training_seconds,
            total_seconds=now - self.started_at,
            startup_seconds=(self.first_step_at or now) - self.started_at,
            eval_seconds=now - eval_started,
            peak_vram_mb=peak_memory_mb(self.device),
            mfu_percent=self._mfu(flops_per_token),
            total_tokens_M=self.tokens_served / 1e6,
            num_steps=self.step,
            num_params_M=params / 1e6,
            tokens_per_second=timed_tokens / max(1e-9, self.training_seconds),
            tokens_per_wall_second=timed_tokens / max(1e-9, self.training_wall_seconds),
            clock=self.profile.clock,
            training_wall_seconds=self.training_wall_seconds,
            cpu_seconds=self.cpu_seconds,
            threads=self.threads,
            cpu_share=self.cpu_share(),
            profile=self.profile.name,
            harness_hash=harness_hash(),
            data_fingerprint=self.dataset.fingerprint,
            asset_sha256=self.asset_sha256,
            seed=self.seed,
            device=str(self.device),
            extra=dict(extra or {}, **scored, **work),
        )
        write_json(self.out_dir / ("claims.json" if self.export else "result.json"), asdict(self.result))
        return self.result

    def cpu_share(self) -> float:
        """CPU time over the timed steps / (their wall time * allotted threads); 0 before any."""
        if self.training_wall_seconds <= 0:
            return 0.0
        return self.cpu_seconds / (self.training_wall_seconds * self.threads)

    # --- internals ------------------------------------------------------------------------------
    def _work_claims(self) -> dict[str, Any]:
        """The work clock's reading for the result's extra: its charged seconds, the counted
        operations per timed step, and whether its charges ended training (`ended_by_work`: then
        the steps did not depend on how busy the machine was); none without a work clock."""
        if self._work is None:
            return {}
        last = max(self._recent_work, default=0.0)
        return {
            "work_seconds": round(self.work_seconds, 4),
            "flops_per_step": last * self.profile.flops_per_second,
            "ended_by_work": self.work_seconds + last >= self.profile.time_budget_s,
        }

    def _mfu(self, flops_per_token: float | None) -> float:
        if not flops_per_token or self.device.type != "cuda" or self.training_wall_seconds <= 0:
            return 0.0
        name = torch.cuda.get_device_name(self.device)
        peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
        if peak is None:
            return 0.0
        timed_tokens = self.tokens_served - self._untimed_tokens
        return 100.0 * flops_per_token * timed_tokens / self.training_wall_seconds / peak

    def _report(self, now: float) -> None:
        self._last_report = now
        elapsed = self.elapsed()
        line = {
            "step": self.step,
            "loss": round(self.last_loss, 5),
            "progress": round(self.progress(), 4),
            "training_seconds": round(self.training_seconds, 2),
            "remaining_seconds": round(max(0.0, self.ends_at - elapsed), 2),
            "elapsed_seconds": round(elapsed, 2),
            "time_up": self.time_up(),
            "tokens": self.tokens_served,
            "clock": self.profile.clock,
            "training_wall_seconds": round(self.training_wall_seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "threads": self.threads,
            "cpu_share": round(self.cpu_share(), 3),
            "work_seconds": round(self.work_seconds, 3),
        }
        self._progress_file.write(json.dumps(line) + "\n")
        share = f" | cpu share {line['cpu_share']:.2f}" if self.profile.clock == "cpu" else ""
        print(
            f"step {self.step:05d} | loss {self.last_loss:.4f} | {100 * self.progress():5.1f}% "
            f"| {line['remaining_seconds']:.1f}s left{share}",
            flush=True,
        )


def pick_device(profile: Profile) -> torch.device:
    if profile.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"profile {profile.name} needs a CUDA GPU and none is visible here; "
                "use --profile cpu (or smoke) on this machine"
            )
        return torch.device("cuda")
    return torch.device("cpu")


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory on CUDA; peak resident memory of the process on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_json(path: Path, data: dict[str, Any]) -> None:
    files.write_text(path, json.dumps(data, indent=2))


_current: Session | None = None


def open_session(
    profile_name: str,
    *,
    data: str | None = None,
    out_dir: Path,
    seed: int = 0,
    asset_sha256: str = "",
    started_at: float | None = None,
    handed_over: tuple[float, float] | None = None,
    threads: int = 0,
    export: bool = False,
    budget_fraction: float = 1.0,
) -> Session:
    """Build the session for a run: loads prepared data (its fingerprint checked against the
    files) and tokenizer, never prepares them. `threads`: the CPU threads allotted (0: torch's).
    `handed_over`: the (wall, process CPU) readings at the job's hand-over, the run clock's zero.
    `export`: an isolated run, whose sandbox holds the training split only: the supervisor has
    checked the fingerprint, and finish() exports the model instead of evaluating it.
    `budget_fraction`: the share of the profile's time budget a screening run trains (the cap and
    the time_up() window scale with it; runner.protocol.JobSpec)."""
    global _current
    profile = get_profile(profile_name)
    profile = replace(profile, time_budget_s=profile.time_budget_s * budget_fraction)
    dataset = load_dataset(data or profile.data, profile.name)
    if not export:
        verify_dataset(dataset, profile.name)
    tokenizer = load_tokenizer(dataset, profile.vocab_size, profile.name)
    torch.manual_seed(seed)
    _current = Session(
        profile,
        dataset,
        tokenizer,
        out_dir=out_dir,
        seed=seed,
        asset_sha256=asset_sha256,
        started_at=started_at,
        handed_over=handed_over,
        threads=threads,
        export=export,
    )
    return _current


def session() -> Session:
    """The session of the current run. Run through `autoresearch train`, or directly with
    AUTORESEARCH_PROFILE set (default cpu)."""
    if _current is None:
        profile = os.environ.get("AUTORESEARCH_PROFILE", "cpu")
        out_dir = Path(os.environ.get("AUTORESEARCH_OUT", f"runs/direct-{profile}"))
        return open_session(profile, data=os.environ.get("AUTORESEARCH_DATA"), out_dir=out_dir)
    return _current
