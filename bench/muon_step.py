"""Benchmark: train.py's Muon step eager and compiled (torch.compile, dynamic=False, fullgraph, as a
GPU runs it) at the shapes of a profile's default model, on this machine's CPU: what compiling
costs once and saves per step, so that a 30 s `cpu` run can be priced.

    .venv/bin/python bench/muon_step.py [--steps 20] [--threads 2]

The functions are train.py's own (read from its text); the shapes are those of the CPU_* constants
(depth, aspect ratio, head size) with train.py's rounding to whole heads and its value embeddings.
"""

from __future__ import annotations

import argparse
import ast
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

import torch

TRAIN_PY = (ROOT / "train.py").read_text()


def train_py(*names: str) -> dict[str, Any]:
    """train.py's top-level definitions and constants `names`, run on their own."""
    body = [
        node
        for node in ast.parse(TRAIN_PY).body
        if (isinstance(node, ast.FunctionDef) and node.name in names)
        or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets))
    ]
    scope: dict[str, Any] = {"torch": torch, "F": torch.nn.functional}
    exec(compile(ast.Module(body=body, type_ignores=[]), "train.py", "exec"), scope)
    return scope


def cpu_shapes() -> list[tuple[int, int, int]]:
    """(count, rows, cols) of each group of Muon's matrices in train.py's CPU model."""
    c = train_py("CPU_DEPTH", "CPU_ASPECT_RATIO", "CPU_HEAD_DIM", "has_value_embedding")
    depth, head = c["CPU_DEPTH"], c["CPU_HEAD_DIM"]
    dim = math.ceil(depth * c["CPU_ASPECT_RATIO"] / head) * head
    gates = sum(c["has_value_embedding"](i, depth) for i in range(depth))
    shapes = [(4 * depth, dim, dim), (depth, 4 * dim, dim), (depth, dim, 4 * dim)]
    return shapes + ([(gates, dim // head, min(32, dim))] if gates else [])


def step_inputs(shape: tuple[int, int, int]) -> list[torch.Tensor]:
    n, rows, cols = shape
    moment = (n, rows, 1) if rows >= cols else (n, 1, cols)
    return [torch.randn(shape), torch.randn(shape), torch.zeros(shape), torch.zeros(moment)]


def timed_steps(update: Any, shapes: list[tuple[int, int, int]], scalars: list[Any], steps: int) -> list[float]:
    """Seconds per optimizer step (every group once), `steps` times; the first includes compilation."""
    inputs = [step_inputs(shape) for shape in shapes]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        for group in inputs:
            update(group[0].clone(), *group[1:], *scalars)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    muon_update = train_py("POLAR_EXPRESS", "orthogonalize", "normalize_neurons", "muon_update")["muon_update"]
    shapes = cpu_shapes()
    eager = timed_steps(muon_update, shapes, [0.95, 0.04, 0.2, 0.95], args.steps)
    compiled_update = torch.compile(muon_update, dynamic=False, fullgraph=True)
    held = [torch.tensor(v) for v in (0.95, 0.04, 0.2, 0.95)]
    compiled = timed_steps(compiled_update, shapes, held, args.steps)
    eager_ms, compiled_ms = statistics.median(eager[1:]) * 1e3, statistics.median(compiled[1:]) * 1e3
    saved = eager_ms - compiled_ms
    print(f"torch {torch.__version__}, {args.threads} threads, shapes (count, rows, cols): {shapes}")
    print(f"eager step: {eager_ms:.2f} ms (median of {args.steps - 1})")
    print(f"compiled step: {compiled_ms:.2f} ms (median of {args.steps - 1}); first call {compiled[0]:.1f} s")
    if saved > 0:
        print(f"compiling pays back after {compiled[0] / (saved / 1e3):,.0f} steps")
    else:
        print("compiling saves nothing per step here")


if __name__ == "__main__":
    main()
