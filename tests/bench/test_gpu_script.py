"""bench/gpu.py end to end on the CPU: the smoke profile through the same code the GPU takes
(the stand-in data served over local HTTP, the isolated runs, the report), and the h100 profile on
a machine without a GPU, which stops at once saying so."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_script_runs_the_smoke_profile_end_to_end_and_writes_its_report(
    autoresearch_cache: Path, tmp_path: Path
) -> None:
    """Slow tier: the benchmark's whole path is under test: stand-in data served over HTTP and
    prepared in a fresh cache, an isolated run of the real train.py, the report."""
    out = tmp_path / "bench-gpu.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu.py"),
            "--profile",
            "smoke",
            "--runs",
            "1",
            "--no-warm",
            "--no-unsandboxed",
            "--stand-in",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "STAND-IN DATA" in done.stdout  # said loudly
    report = json.loads(out.read_text())
    for key in ("date", "machine", "data", "runs", "reference", "summary"):
        assert key in report
    assert report["data"]["stand_in"] is True
    labels = [run["label"] for run in report["runs"]]
    assert labels == ["run 1"]  # the warm and unsandboxed runs take the same path (skipped here for time)
    for run in report["runs"]:
        assert run["status"] == "ok"
        assert isinstance(run["val_bpb"], float) and math.isfinite(run["val_bpb"])
        for key in ("num_steps", "startup_s", "evaluation_s", "sandbox_setup_s", "overhead_s", "total_s"):
            assert key in run
        assert run["attention"] == "SDPA (CPU)" and run["optimizer_step"].startswith("eager (CPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_cuda_profile_without_a_gpu_stops_at_once_saying_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--profile", "h100", "--runs-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("gpu bench: the h100 profile needs an NVIDIA GPU that torch can use, and this machine has none")
    )
    assert not (tmp_path / "runs").exists()  # nothing prepared, nothing made
