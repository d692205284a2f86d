"""The harness session: what train.py may use, and the only place where a run is measured.

train.py gets its session with `h = harness.session()` and from it the profile constants, the
device, the tokenizer and the training batches. It calls `h.step_done(loss)` once per optimizer
step and trains while `not h.time_up()`; `h.progress()` is the fraction of the budget used, for
schedules. At the end it hands its model to `h.finish(model)`: the harness evaluates val_bpb
itself and writes the machine-readable result (result.json). Nothing train.py prints is read.

The clock is the harness's: the first `profile.warmup_steps` steps (compilation, allocator
warm-up) are not counted, as in the reference; the budget counts every later step in full.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner import dataloader, files
from runner.data import Dataset, load_dataset
from runner.evaluate import evaluate_bpb
from runner.profiles import Profile, get_profile, harness_hash
from runner.tokenizer import Tokenizer, load_tokenizer

# bf16 dense peak of the accelerators we know, for MFU (FLOP/s)
PEAK_FLOPS = {"H100": 989.5e12, "H200": 989.5e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


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
    tokens_per_second: float
    profile: str
    harness_hash: str
    data_fingerprint: str
    asset_sha256: str
    seed: int
    device: str
    extra: dict[str, Any] = field(default_factory=dict)

    def summary_block(self) -> str:
        """The reference's summary block."""
        lines = [
            "---",
            f"val_bpb:          {self.val_bpb:.6f}",
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

    def __init__(self, profile: Profile, dataset: Dataset, tokenizer: Tokenizer, *, out_dir: Path,
                 seed: int = 0, asset_sha256: str = "", started_at: float | None = None,
                 device: torch.device | None = None) -> None:
        self.profile = profile
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.out_dir = out_dir
        self.seed = seed
        self.asset_sha256 = asset_sha256
        self.device = device or pick_device(profile)
        self.started_at = started_at if started_at is not None else time.time()
        self.step = 0
        self.training_seconds = 0.0
        self.tokens_served = 0
        self.first_step_at: float | None = None
        self.last_loss = math.nan
        self.result: Result | None = None
        self._last_mark = time.time()
        self._last_report = 0.0
        self._untimed_tokens = 0  # tokens of the warm-up steps, which the clock does not count
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
        for x, y, _epoch in dataloader.batches(self.tokenizer, self.dataset, "train", batch_size,
                                               self.seq_len, self.device):
            self.tokens_served += x.numel()
            yield x, y

    def progress(self) -> float:
        """Fraction of the training budget used so far, in [0, 1]."""
        return min(1.0, self.training_seconds / self.profile.time_budget_s)

    def time_up(self) -> bool:
        return self.training_seconds >= self.profile.time_budget_s

    def step_done(self, loss: float | torch.Tensor) -> None:
        """Mark the end of one optimizer step; fails fast on a NaN or infinite loss."""
        value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.time()
        if self.first_step_at is None:
            self.first_step_at = now
        self.step += 1
        if self.step > self.profile.warmup_steps:
            self.training_seconds += now - self._last_mark
        else:
            self._untimed_tokens = self.tokens_served
        self._last_mark = now
        self.last_loss = value
        if not math.isfinite(value):
            raise TrainingDiverged(f"training loss is {value} at step {self.step}: the run diverged. "
                                   "Lower the learning rates or add warmup in train.py.")
        if now - self._last_report >= 1.0 or self.time_up():
            self._report(now)

    # --- the measurement ------------------------------------------------------------------------
    def finish(self, model: torch.nn.Module, *, flops_per_token: float | None = None,
               extra: dict[str, Any] | None = None) -> Result:
        """Evaluate the model on the fixed validation tokens and write result.json."""
        if self.result is not None:
            raise RuntimeError("finish() was already called for this run")
        eval_started = time.time()
        evaluation = evaluate_bpb(model, self.tokenizer, self.dataset, seq_len=self.seq_len,
                                  eval_tokens=self.profile.eval_tokens,
                                  batch_size=self.profile.eval_batch_size, device=self.device)
        now = time.time()
        params = sum(p.numel() for p in model.parameters())
        self.result = Result(
            status="ok",
            val_bpb=evaluation.val_bpb,
            training_seconds=self.training_seconds,
            total_seconds=now - self.started_at,
            startup_seconds=(self.first_step_at or now) - self.started_at,
            eval_seconds=now - eval_started,
            peak_vram_mb=peak_memory_mb(self.device),
            mfu_percent=self._mfu(flops_per_token),
            total_tokens_M=self.tokens_served / 1e6,
            num_steps=self.step,
            num_params_M=params / 1e6,
            tokens_per_second=(self.tokens_served - self._untimed_tokens) / max(1e-9, self.training_seconds),
            profile=self.profile.name,
            harness_hash=harness_hash(),
            data_fingerprint=self.dataset.fingerprint,
            asset_sha256=self.asset_sha256,
            seed=self.seed,
            device=str(self.device),
            extra=dict(extra or {}, eval_tokens=evaluation.tokens, eval_bytes=evaluation.bytes),
        )
        write_json(self.out_dir / "result.json", asdict(self.result))
        return self.result

    # --- internals ------------------------------------------------------------------------------
    def _mfu(self, flops_per_token: float | None) -> float:
        if not flops_per_token or self.device.type != "cuda" or self.training_seconds <= 0:
            return 0.0
        name = torch.cuda.get_device_name(self.device)
        peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
        if peak is None:
            return 0.0
        timed_tokens = self.tokens_served - self._untimed_tokens
        return 100.0 * flops_per_token * timed_tokens / self.training_seconds / peak

    def _report(self, now: float) -> None:
        self._last_report = now
        line = {"step": self.step, "loss": round(self.last_loss, 5), "progress": round(self.progress(), 4),
                "training_seconds": round(self.training_seconds, 2),
                "remaining_seconds": round(max(0.0, self.profile.time_budget_s - self.training_seconds), 2),
                "tokens": self.tokens_served}
        self._progress_file.write(json.dumps(line) + "\n")
        print(f"step {self.step:05d} | loss {self.last_loss:.4f} | {100 * self.progress():5.1f}% "
              f"| {line['remaining_seconds']:.1f}s left", flush=True)


def pick_device(profile: Profile) -> torch.device:
    if profile.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"profile {profile.name} needs a CUDA GPU and none is visible here; "
                               "use --profile cpu (or smoke) on this machine")
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


def open_session(profile_name: str, *, data: str | None = None, out_dir: Path, seed: int = 0,
                 asset_sha256: str = "", started_at: float | None = None) -> Session:
    """Build the session for a run: loads prepared data and tokenizer (never prepares them)."""
    global _current
    profile = get_profile(profile_name)
    dataset = load_dataset(data or profile.data, profile.name)
    tokenizer = load_tokenizer(dataset, profile.vocab_size, profile.name)
    torch.manual_seed(seed)
    _current = Session(profile, dataset, tokenizer, out_dir=out_dir, seed=seed,
                       asset_sha256=asset_sha256, started_at=started_at)
    return _current


def session() -> Session:
    """The session of the current run. Run through `autoresearch train`, or directly with
    AUTORESEARCH_PROFILE set (default cpu)."""
    if _current is None:
        profile = os.environ.get("AUTORESEARCH_PROFILE", "cpu")
        out_dir = Path(os.environ.get("AUTORESEARCH_OUT", f"runs/direct-{profile}"))
        return open_session(profile, data=os.environ.get("AUTORESEARCH_DATA"), out_dir=out_dir)
    return _current
