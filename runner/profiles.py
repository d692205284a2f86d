"""Profiles: the harness constants that make runs comparable.

A profile is chosen by whoever runs the job (the runner), never by train.py. Results compare only
when profile, harness version (a hash of this package's source) and data fingerprint all match.

The budget is counted on the profile's clock. On a GPU it is wall time (the GPU is the resource).
On the CPU it is the training process's CPU time divided by the threads the run was allotted, so
that other work on the machine slows a run down without shortening it: a run that gets half the
cores for a minute has had 30 s of budget.

Everything the training process does from the hand-over of its job counts on that clock: start-up
(the session, train.py building its model), compilation and warm-up steps, training, the export.
The supervisor ends it at the cap, budget + allowance (`cap_s`), and rejects the run; the harness
ends training the export margin before the cap. The allowance is an honest run's overheads as
measured (docs/benchmarks.md, "The budget"), so that the default train.py trains about
`time_budget_s` after its start-up and warm-up steps, as the reference does; a train.py that
ignores the harness can gain no more than what the export margin holds beyond its own export,
and the rest of its last step. On a CPU clock the allowance and the margin are CPU seconds, of
mostly serial work (loading, building, tracing the export), so a run's share of them is divided by
its threads like the rest of its CPU time: 3 CPU seconds for the export are 1.5 s of a 2-thread
run's clock, and a 16-thread run gets no 48 CPU seconds of slack.

A CPU profile may also count the budget in work (`flops_per_second`, runner.work): each step after
the warm-up ones is charged the operations it was counted doing, at that rate, and training ends
when those charges reach the budget or when the CPU clock ends it, whichever comes first. The CPU
time a step takes moves with the machine's load, its operations do not: where a step's charge is
above its CPU time (a quiet machine), every run of one train.py trains the same steps. The cap
and the supervisor do not change, so the work clock can only end training earlier.

No shipped profile has one yet. The count is made inside the training process, which train.py
owns: a train.py that leaves it (or does its work where it does not look) trains on the CPU clock
alone, up to its end, while main and every honest candidate stop at the charges, earlier on a
quiet machine: about 2.5 s of 30, 3 to 5 steps of the `cpu` profile, more than the margin of the
changes a loop looks for. Until the work is counted where train.py cannot reach (the scorer, the
supervisor), it stays a measurement (bench/cpu_profile.py --noise, at CPU_WORK_RATE).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from runner.tasks import DEFAULT_TASK, get_task


@dataclass(frozen=True)
class Profile:
    name: str
    device: str  # "cuda" or "cpu": where the run is meant to happen
    seq_len: int  # tokens per training and evaluation row
    vocab_size: int  # tokenizer size, special tokens included
    time_budget_s: float  # seconds of training on `clock` after start-up and warm-up steps, as in the reference
    clock: str  # "wall": wall time; "cpu": process CPU time / allotted threads (see harness.py)
    warmup_steps: int  # first steps (compilation, allocator warm-up): progress() and training_seconds start after them
    eval_tokens: int  # validation tokens scored for val_bpb
    eval_batch_size: int  # rows per evaluation forward pass
    data: str  # default data source: "builtin", or a base URL of parquet shards
    train_shards: int  # parquet shards to download when data is a URL
    tokenizer_chars: int  # characters of training text the tokenizer is trained on
    max_total_s: float  # hard wall-clock limit for the whole run, start-up and evaluation included
    # An honest run's overheads on `clock`, as measured: start-up from the hand-over (data, model
    # build), the warm-up steps (compilation), the export and the exit. The supervisor ends a
    # training process at the cap, budget + allowance, measured from outside its sandbox, and
    # rejects its run: it trained past its budget.
    # On a CPU clock both are CPU seconds (see above and `overheads`).
    allowance_s: float
    export_margin_s: float  # of the allowance, the room time_up() leaves after training: the export, the exit
    score_limit_s: float  # wall-clock limit of the scoring process (load, causality probe, val_bpb)
    # The work clock of a CPU profile (0: none): each step after the warm-up ones is charged its
    # counted operations (runner.work) at this rate, and training also ends when the charges reach
    # time_budget_s. See the module docstring.
    flops_per_second: float = 0.0

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"profile {self.name}: clock must be one of {CLOCKS}, not {self.clock!r}")
        if self.flops_per_second < 0 or (self.flops_per_second > 0 and self.clock != "cpu"):
            raise ValueError(f"profile {self.name}: a work clock (flops_per_second) is for a cpu clock only")
        if not 0 < self.export_margin_s < self.allowance_s:
            raise ValueError(f"profile {self.name}: the export margin must be positive and part of the allowance")

    def overheads(self, threads: int) -> tuple[float, float]:
        """(allowance, export margin) on `clock` for a run allotted `threads`."""
        share = max(1, threads) if self.clock == "cpu" else 1
        return self.allowance_s / share, self.export_margin_s / share

    def cap_s(self, threads: int) -> float:
        """The most a training process allotted `threads` may use on `clock`, from the hand-over
        of its job to its end."""
        return self.time_budget_s + self.overheads(threads)[0]

    def training_ends_s(self, threads: int) -> float:
        """Where the harness ends training on `clock`: the cap less the export margin."""
        allowance, margin = self.overheads(threads)
        return self.time_budget_s + allowance - margin


CLOCKS = ("wall", "cpu")

# The work clock's rate measured for the `cpu` profile (not shipped: see the module docstring). It
# charges the default train.py's step (27.6 GFLOP counted) 0.79 s: 38 steps after the warm-up one,
# the same in every run where a step takes under about 0.78 s of the CPU clock (0.70-0.75 quiet,
# 0.8-1.0 at load 10-20 on the 2-core development machine: docs/benchmarks.md, "The CPU profile's noise").
CPU_WORK_RATE = 35e9


# The reference's data: parquet shards with one `text` column, the last shard pinned for validation.
REFERENCE_DATA_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
REFERENCE_VAL_SHARD = 6542

PROFILES: dict[str, Profile] = {
    # The reference's constants (karpathy/autoresearch prepare.py) on one H100-class GPU.
    "h100": Profile(
        name="h100",
        device="cuda",
        seq_len=2048,
        vocab_size=8192,
        time_budget_s=300.0,
        clock="wall",
        warmup_steps=10,
        eval_tokens=40 * 524288,
        eval_batch_size=64,
        data=REFERENCE_DATA_URL,
        train_shards=10,
        tokenizer_chars=1_000_000_000,
        max_total_s=900.0,
        allowance_s=45.0,
        export_margin_s=15.0,
        score_limit_s=300.0,
    ),
    # 30 s of training on 2 CPU cores (60 CPU seconds) and a few seconds of evaluation. On a
    # machine busy with other work (cpu_share 0.31, about 3x slower) a run took 112 s in all; an
    # isolated run on a machine at load 5-8 trained for 239 s of wall time: the hard limit is 300 s.
    "cpu": Profile(
        name="cpu",
        device="cpu",
        seq_len=256,
        vocab_size=4096,
        time_budget_s=30.0,
        clock="cpu",
        warmup_steps=1,
        eval_tokens=2**16,
        eval_batch_size=32,
        data="builtin",
        train_shards=0,
        tokenizer_chars=5_000_000,
        max_total_s=300.0,
        allowance_s=5.5,
        export_margin_s=3.0,
        score_limit_s=120.0,
    ),
    # A few seconds in all, for tests (25 s in all at cpu_share 0.2; the limit is for hangs).
    "smoke": Profile(
        name="smoke",
        device="cpu",
        seq_len=128,
        vocab_size=1024,
        time_budget_s=3.0,
        clock="cpu",
        warmup_steps=1,
        eval_tokens=2**13,
        eval_batch_size=16,
        data="builtin",
        train_shards=0,
        tokenizer_chars=5_000_000,
        max_total_s=120.0,
        allowance_s=4.5,
        export_margin_s=3.0,
        score_limit_s=120.0,
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}: choose one of {known}") from None


def task_profiles(task: str) -> tuple[str, ...]:
    """The profiles `task` measures under: every one for training, its evaluator's PROFILES for
    another (its package's constants import without the evaluator's parts)."""
    if task == DEFAULT_TASK:
        return tuple(PROFILES)
    return tuple(importlib.import_module(get_task(task).evaluator).PROFILES)


def check_task_profile(task: str, profile: str) -> None:
    """ValueError, naming the profiles the task has, when `task` cannot be measured under `profile`
    (query-latency on h100, say: the GPU profiles are training's)."""
    get_profile(profile)
    known = task_profiles(task)
    if profile not in known:
        raise ValueError(
            f"the {task} task has no {profile} profile (that one is {DEFAULT_TASK}'s): it measures under "
            f"{' or '.join(known)}; choose one with --profile (AUTORESEARCH_PROFILE for the service)"
        )


# The harness files that decide a measurement; fixing a download or a launcher keeps baselines valid.
MEASURING_FILES = (
    "profiles.py",
    "data.py",
    "tokenizer.py",
    "dataloader.py",
    "evaluate.py",
    "harness.py",
    "work.py",
    "execute.py",
    "isolated.py",
    "handoff.py",
    "probe.py",
    "score.py",
)


def harness_hash(task: str = DEFAULT_TASK) -> str:
    """sha256 over the measuring harness of `task` (`harness_files`): a change to the measurement
    changes it, and nothing else does. Each file counts by its path under runner/ (or under its
    evaluator's package) and its bytes."""
    digest = hashlib.sha256()
    for name, path in harness_files(task):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# In an evaluator's package, the kinds of file that measure: its code and its reference queries
# (what pyproject ships besides texts and data). Not harness: the starting asset (the task's asset
# by name, at the package's top), program.md (a text) and the vendored inputs, which the data
# fingerprint covers. A change to these starts no new baseline; a stray file (an editor's backup)
# changes no hash.
MEASURING_SUFFIXES = (".py", ".sql")
VENDORED_INPUTS = "sample"


def harness_files(task: str = DEFAULT_TASK) -> list[tuple[str, Path]]:
    """(name, path) of each file that decides `task`'s measurement. Training's are MEASURING_FILES.
    Another task's are training's, runner/tasks/'s own (the task spec, its run) and its evaluator's
    (`evaluator_files`), so that a change to one task's evaluator leaves the others' baselines
    valid, and a new starter leaves its own valid."""
    here = Path(__file__).parent
    paths = [(name, here / name) for name in MEASURING_FILES]
    if task != DEFAULT_TASK:
        spec = get_task(task)
        paths += [("tasks/__init__.py", here / "tasks" / "__init__.py"), ("tasks/run.py", here / "tasks" / "run.py")]
        paths += evaluator_files(_evaluator_origin(spec.evaluator), spec.asset)
    return paths


def evaluator_files(origin: Path, asset: str) -> list[tuple[str, Path]]:
    """The measuring files of the evaluator whose module file is `origin`: its one module, or its
    package's MEASURING_SUFFIXES files, sorted, less the starter `asset` at its top and
    VENDORED_INPUTS."""
    if origin.name != "__init__.py":
        return [(origin.name, origin)]
    root = origin.parent
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.suffix not in MEASURING_SUFFIXES or not path.is_file():
            continue
        if relative.as_posix() == asset or relative.parts[0] == VENDORED_INPUTS:
            continue
        found.append((f"{root.name}/{relative.as_posix()}", path))
    return found


def _evaluator_origin(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"the evaluator module {module} cannot be found")
    return Path(spec.origin)
