"""The job/result protocol every runner speaks: the local subprocess, GitHub Actions, Modal.

A `JobSpec` goes to a runner and a `ResultSpec` comes back, as JSON, with a version field: a
runner on another machine may run another release. The run itself always goes through
`runner.isolated` (sandboxed training, evaluation in a process that never ran train.py), so
every backend measures the same way; a backend only carries the two documents.

`check_result` is what the bot does with an answer before it believes it: the result must name
the job's run id, the sha256 of the job's train.py and the harness the bot runs, or it is
refused (`ResultRefused`), whatever number it carries.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROTOCOL_VERSION = 1
STATUSES = ("ok", "crash", "timeout", "rejected", "lost")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResultRefused(ValueError):
    """A result that does not answer its job (another run, another train.py, another harness)."""


class JobSpec(BaseModel):
    """One time-boxed run of one train.py under one profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = PROTOCOL_VERSION
    experiment_id: int | None = None  # None for a baseline run of main
    run_id: int = Field(ge=0)
    repository: str = ""  # owner/name, or "" for a local work directory
    commit: str = ""  # the commit the asset was read from
    asset: str  # the train.py text
    asset_sha256: str = ""  # filled in from the asset when left empty
    profile: str
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _hash_asset(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("asset_sha256") and isinstance(data.get("asset"), str):
            data = dict(data, asset_sha256=sha256_text(data["asset"]))
        return data

    @model_validator(mode="after")
    def _asset_matches(self) -> JobSpec:
        if sha256_text(self.asset) != self.asset_sha256:
            raise ValueError("asset_sha256 is not the sha256 of asset: the job was changed in transit")
        return self


class Timings(BaseModel):
    """Seconds, measured by the supervisor outside the sandbox (never by train.py)."""

    model_config = ConfigDict(extra="forbid")

    queued: float | None = None  # dispatch to start: the backend's queue (Actions, Modal), when known
    sandbox_setup: float = 0.0  # supervisor start to the training process's first instruction
    startup: float = 0.0  # training process start to its first timed step (imports, data, compile)
    training: float = 0.0  # the training process on the profile's clock (wall, or CPU / threads)
    training_wall: float = 0.0  # the training process, wall clock
    export: float = 0.0  # serialising the model, inside the training process (its own claim)
    evaluation: float = 0.0  # the scoring process, wall clock: load, causality probe, val_bpb
    probe: float = 0.0  # of which the causality probe
    total: float = 0.0  # supervisor start to result


class Hashes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    asset: str  # sha256 of the train.py that ran
    harness: str  # runner.profiles.harness_hash() of the code that measured
    data: str  # the prepared data's fingerprint ("" when the run never got to the data)


class RunnerIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str  # local | actions | modal | manual
    host: str = ""
    device: str = ""  # cpu, or the GPU's name
    sandbox: str = "none"  # "bubblewrap 0.8.0", or "none" (see sandboxed)
    detail: str = ""  # a backend's own reference: an Actions run URL, a Modal call id


class ResultSpec(BaseModel):
    """What a run produced. Only `val_bpb` from a result whose status is ok ever decides a merge."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = PROTOCOL_VERSION
    run_id: int
    experiment_id: int | None = None
    # lost: killed from outside the run (not by its code or its limits): it runs again, not charged to train.py
    status: Literal["ok", "crash", "timeout", "rejected", "lost"]
    val_bpb: float | None = None
    error: str | None = None  # why, for anything but ok
    metrics: dict[str, Any] = Field(default_factory=dict)  # steps, tokens, MFU, memory... (train.py's claims)
    log_tail: str = ""
    timings: Timings = Field(default_factory=Timings)
    hashes: Hashes
    runner: RunnerIdentity
    sandboxed: bool = False
    profile: str = ""
    seed: int = 0

    def summary_block(self) -> str:
        """The reference's summary block, written after scoring: `grep "^val_bpb:" run.log` finds
        the scorer's number, and finds nothing when the run was not measured (as the reference's
        does after a crash). Training time is the supervisor's measurement; steps, tokens, memory
        and MFU are what train.py claims."""
        claims = self.metrics
        lines = ["---"]
        if self.status == "ok" and self.val_bpb is not None:
            lines.append(f"val_bpb:          {self.val_bpb:.6f}")
        else:
            lines.append(
                f"status:           {self.status} ({(self.error or '').splitlines()[0][:200] if self.error else ''})"
            )
        lines += [
            f"training_seconds: {float(claims.get('training_seconds') or self.timings.training):.1f}",
            f"total_seconds:    {self.timings.total:.1f}",
        ]
        for key, label, digits in (
            ("peak_vram_mb", "peak_vram_mb:    ", 1),
            ("mfu_percent", "mfu_percent:     ", 2),
            ("total_tokens_M", "total_tokens_M:  ", 1),
            ("num_steps", "num_steps:       ", 0),
            ("num_params_M", "num_params_M:    ", 1),
        ):
            value = claims.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"{label} {value:.{digits}f}")
        depth = (claims.get("extra") or {}).get("depth") if isinstance(claims.get("extra"), dict) else None
        if depth is not None:
            lines.append(f"depth:            {depth}")
        return "\n".join(lines)

    @model_validator(mode="after")
    def _number_only_when_ok(self) -> ResultSpec:
        if self.status == "ok" and self.val_bpb is None:
            raise ValueError("an ok result must carry val_bpb")
        if self.status != "ok" and not self.error:
            raise ValueError(f"a {self.status} result must say why (error)")
        return self


def check_result(job: JobSpec, result: ResultSpec, *, harness: str) -> None:
    """Raise ResultRefused unless `result` answers `job`, measured by the harness `harness`."""
    if result.run_id != job.run_id:
        raise ResultRefused(f"the result is for run {result.run_id}, not run {job.run_id}")
    if result.hashes.asset != job.asset_sha256:
        raise ResultRefused(
            f"run {job.run_id}: the result measured another train.py (asset sha256 "
            f"{result.hashes.asset[:12]}, the job's is {job.asset_sha256[:12]})"
        )
    if result.hashes.harness != harness:
        raise ResultRefused(
            f"run {job.run_id}: the result was measured by harness {result.hashes.harness}, "
            f"not this bot's {harness}: update the runner to the bot's version"
        )
    if result.profile and result.profile != job.profile:
        raise ResultRefused(f"run {job.run_id}: the result ran profile {result.profile}, not {job.profile}")
