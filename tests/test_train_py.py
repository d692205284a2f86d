"""train.py itself, run through the harness on the smoke profile (seq_len 128): a width that is
not a whole number of heads trains, a batch that does not split into whole forward passes fails
before any work, and a blown-up loss stops the run at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from runner import launch

ROOT = Path(__file__).resolve().parents[1]
TRAIN_PY = (ROOT / "train.py").read_text()


def set_constant(text: str, name: str, value: str) -> str:
    new, count = re.subn(rf"^{name} = [^#\n]*?(\s*#|$)", rf"{name} = {value}\1", text, count=1, flags=re.M)
    assert count == 1, f"train.py has no constant {name}"
    return new


def run(tmp_path: Path, source: str) -> dict[str, Any]:
    asset = tmp_path / "asset" / "train.py"
    asset.parent.mkdir(parents=True)
    asset.write_text(source)
    return launch.run(asset, "smoke", tmp_path / "run")


def steps_reported(tmp_path: Path) -> str:
    return (tmp_path / "run" / "progress.jsonl").read_text().strip()


@pytest.mark.slow
def test_a_width_that_is_not_whole_heads_is_rounded_up_and_trains(smoke_prepared, tmp_path):
    """Slow tier: what is under test is that the rounded model trains and scores, a whole smoke run
    (the two checks below end the run before or at its first step)."""
    # 3 * 20 = 60 is not a multiple of CPU_HEAD_DIM 32: the model is built 64 wide (2 heads)
    source = set_constant(set_constant(TRAIN_PY, "CPU_DEPTH", "3"), "CPU_ASPECT_RATIO", "20")
    result = run(tmp_path, source)
    assert result["status"] == "ok", result.get("error") or result.get("log_tail")
    assert result["num_steps"] > 1 and result["val_bpb"] > 0
    assert result["extra"]["depth"] == 3
    assert "depth 3, dim 64," in (tmp_path / "run" / "log.txt").read_text()


def test_a_batch_that_does_not_split_into_whole_passes_fails_before_training(smoke_prepared, tmp_path):
    # smoke: one forward pass is 16 sequences * 128 tokens = 2048 tokens, more than the whole batch
    result = run(tmp_path, set_constant(TRAIN_PY, "CPU_TOTAL_BATCH_SIZE", "2**10"))
    assert result["status"] == "crash"
    error = result["error"].splitlines()[-1]
    assert error.startswith(
        "ValueError: CPU_TOTAL_BATCH_SIZE = 1024 tokens is not a positive multiple of "
        "CPU_DEVICE_BATCH_SIZE * seq_len = 16 * 128 = 2048 (profile smoke)."
    ), error
    assert "Set CPU_TOTAL_BATCH_SIZE to a multiple of 2048, such as 2048" in error
    assert "or CPU_DEVICE_BATCH_SIZE to a divisor of 8, such as 8" in error
    assert not steps_reported(tmp_path), "no step ran"


def test_a_loss_above_the_limit_stops_the_run_at_the_first_step(smoke_prepared, tmp_path):
    # The first loss is about ln(1024) = 6.9: a limit of 1 is crossed at once, deterministically.
    result = run(tmp_path, set_constant(TRAIN_PY, "LOSS_LIMIT", "1.0"))
    assert result["status"] == "crash"
    error = result["error"].splitlines()[-1]
    assert re.match(
        r"RuntimeError: training loss [\d.]+ at step 1 is above LOSS_LIMIT = 1.0: the run blew up", error
    ), error
    assert "Lower the learning rates" in error
