"""Profiles: the harness constants that make runs comparable.

A profile is chosen by whoever runs the job (the runner), never by train.py. Results compare only
when profile, harness version (a hash of this package's source) and data fingerprint all match.

The budget is counted on the profile's clock. On a GPU it is wall time (the GPU is the resource).
On the CPU it is the training process's CPU time divided by the threads the run was allotted, so
that other work on the machine slows a run down without shortening it: a run that gets half the
cores for a minute has had 30 s of budget.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Profile:
    name: str
    device: str  # "cuda" or "cpu": where the run is meant to happen
    seq_len: int  # tokens per training and evaluation row
    vocab_size: int  # tokenizer size, special tokens included
    time_budget_s: float  # seconds of timed training on `clock` (warm-up steps excluded)
    clock: str  # "wall": wall time; "cpu": process CPU time / allotted threads (see harness.py)
    warmup_steps: int  # first steps (compilation, allocator warm-up) not counted against the budget
    eval_tokens: int  # validation tokens scored for val_bpb
    eval_batch_size: int  # rows per evaluation forward pass
    data: str  # default data source: "builtin", or a base URL of parquet shards
    train_shards: int  # parquet shards to download when data is a URL
    tokenizer_chars: int  # characters of training text the tokenizer is trained on
    max_total_s: float  # hard wall-clock limit for the whole run, start-up and evaluation included
    # What an isolated run's training process may spend beyond the budget, on the profile's clock,
    # measured from outside its sandbox: imports, data, compilation, warm-up steps, the export. A
    # training process that used more trained past its budget (a patched clock) and is rejected.
    startup_allowance_s: float
    score_limit_s: float  # wall-clock limit of the scoring process (load, causality probe, val_bpb)

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"profile {self.name}: clock must be one of {CLOCKS}, not {self.clock!r}")


CLOCKS = ("wall", "cpu")


# The reference's data: parquet shards with one `text` column, the last shard pinned for validation.
REFERENCE_DATA_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
REFERENCE_VAL_SHARD = 6542

PROFILES: dict[str, Profile] = {
    # The reference's constants (karpathy/autoresearch prepare.py) on one H100-class GPU.
    "h100": Profile(
        name="h100", device="cuda", seq_len=2048, vocab_size=8192, time_budget_s=300.0, clock="wall",
        warmup_steps=10, eval_tokens=40 * 524288, eval_batch_size=64, data=REFERENCE_DATA_URL,
        train_shards=10, tokenizer_chars=1_000_000_000, max_total_s=900.0, startup_allowance_s=90.0,
        score_limit_s=300.0,
    ),
    # 30 s of training on 2 CPU cores (60 CPU seconds) and a few seconds of evaluation. On a
    # machine busy with other work (cpu_share 0.31, about 3x slower) a run took 112 s in all; an
    # isolated run on a machine at load 5-8 trained for 239 s of wall time: the hard limit is 300 s.
    "cpu": Profile(
        name="cpu", device="cpu", seq_len=256, vocab_size=4096, time_budget_s=30.0, clock="cpu",
        warmup_steps=1, eval_tokens=2**16, eval_batch_size=32, data="builtin",
        train_shards=0, tokenizer_chars=5_000_000, max_total_s=300.0, startup_allowance_s=20.0,
        score_limit_s=120.0,
    ),
    # A few seconds in all, for tests (25 s in all at cpu_share 0.2; the limit is for hangs).
    "smoke": Profile(
        name="smoke", device="cpu", seq_len=128, vocab_size=1024, time_budget_s=3.0, clock="cpu",
        warmup_steps=1, eval_tokens=2**13, eval_batch_size=16, data="builtin",
        train_shards=0, tokenizer_chars=5_000_000, max_total_s=120.0, startup_allowance_s=20.0,
        score_limit_s=120.0,
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}: choose one of {known}") from None


# The harness files that decide a measurement; fixing a download or a launcher keeps baselines valid.
MEASURING_FILES = ("profiles.py", "data.py", "tokenizer.py", "dataloader.py", "evaluate.py", "harness.py",
                   "execute.py", "isolated.py", "handoff.py", "probe.py", "score.py")


def harness_hash() -> str:
    """sha256 over the source of the measuring harness: a change to the measurement changes it."""
    digest = hashlib.sha256()
    for path in (Path(__file__).parent / name for name in MEASURING_FILES):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
