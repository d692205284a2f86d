"""train.py's GPU path without a GPU: which attention it picks (Flash Attention 3 on Hopper when the
kernel loads, SDPA otherwise) with the device's capability faked, and its Muon step, which a GPU
compiles whole (fullgraph, no recompilation as the learning rate moves) and the CPU runs eager with
the same numbers. The functions are train.py's own, read from its text."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TRAIN_PY = (ROOT / "train.py").read_text()


def train_py_part(*names: str, **namespace: Any) -> dict[str, Any]:
    """train.py's top-level definitions `names` (functions and constants), run in `namespace`."""
    tree = ast.parse(TRAIN_PY)
    chosen = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in names)
        or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets))
    ]
    assert {getattr(n, "name", None) or n.targets[0].id for n in chosen} == set(names), "train.py lost a definition"
    scope = {"torch": torch, "F": torch.nn.functional, **namespace}
    exec(compile(ast.Module(body=chosen, type_ignores=[]), "train.py", "exec"), scope)
    return scope


class FakeKernels(ModuleType):
    """The `kernels` package as train.py calls it: get_kernel(repo, version=...) -> a module."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__("kernels")
        self.failure, self.asked = failure, []

    def get_kernel(self, repo: str, **version: Any) -> SimpleNamespace:
        self.asked.append((repo, version))
        if self.failure is not None:
            raise self.failure
        return SimpleNamespace(flash_attn_interface="the fa3 interface")


def load_flash_attention(monkeypatch: pytest.MonkeyPatch, fake: FakeKernels, capability: Any) -> tuple[Any, str]:
    monkeypatch.setitem(sys.modules, "kernels", fake)
    h = SimpleNamespace(profile=SimpleNamespace(name="h100"))
    return train_py_part("load_flash_attention", h=h)["load_flash_attention"](capability)


def test_hopper_gets_flash_attention_3_when_the_kernel_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKernels()
    assert load_flash_attention(monkeypatch, fake, (9, 0)) == ("the fa3 interface", "Flash Attention 3")
    assert fake.asked == [("varunneal/flash-attention-3", {"version": 1})]


def test_hopper_falls_back_to_sdpa_saying_why_and_what_fetches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKernels(
        ValueError("Version 1 of 'varunneal/flash-attention-3' is not available in the local cache\nmore")
    )
    kernel, said = load_flash_attention(monkeypatch, fake, (9, 0))
    assert kernel is None
    assert said == (
        "SDPA (Flash Attention 3 did not load: ValueError: Version 1 of 'varunneal/flash-attention-3' is not "
        "available in the local cache; `autoresearch prepare --profile h100` fetches it)"
    )


@pytest.mark.parametrize(
    ("capability", "said"),
    [((8, 0), "SDPA (Flash Attention 3 needs a Hopper GPU; this one is sm_80)"), (None, "SDPA (CPU)")],
)
def test_other_devices_use_sdpa_without_asking_for_the_kernel(monkeypatch, capability, said) -> None:
    fake = FakeKernels()
    assert load_flash_attention(monkeypatch, fake, capability) == (None, said)
    assert fake.asked == []


def muon_inputs(seed: int, shape: tuple[int, int, int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    n, rows, cols = shape
    moment = (n, rows, 1) if rows >= cols else (n, 1, cols)
    return [
        torch.randn(shape, generator=generator),  # grad
        torch.randn(shape, generator=generator),  # W
        torch.randn(shape, generator=generator),  # momentum buffer
        torch.rand(moment, generator=generator),  # second moment
    ]


@pytest.mark.parametrize("shape", [(3, 16, 8), (2, 8, 24)])  # a tall and a wide stack
def test_the_muon_step_compiles_whole_and_matches_the_eager_step(shape: tuple[int, int, int]) -> None:
    """The compiled form as train.py builds it on a GPU (dynamic=False, fullgraph=True: a graph
    break fails here), traced by a backend that runs the graph as it is (no C++ compiler needed)
    and counts the graphs it was given."""
    part = train_py_part("POLAR_EXPRESS", "orthogonalize", "normalize_neurons", "muon_update")
    eager, graphs = part["muon_update"], []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(eager, dynamic=False, fullgraph=True, backend=counting_backend)
    held = [torch.zeros(()) for _ in range(4)]  # as Muon.step keeps them: refilled, never new constants
    for step, lr in enumerate([0.04, 0.02, 0.01]):
        hyper = (0.85 + step * 0.05, lr, 0.2 * (1 - step / 3), 0.95)
        for tensor, value in zip(held, hyper, strict=True):
            tensor.fill_(value)
        expected, actual = muon_inputs(step, shape), muon_inputs(step, shape)
        eager(*expected, *hyper)
        compiled(*actual, *held)
        for want, got in zip(expected, actual, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(graphs) == 1, f"compiled {len(graphs)} times: new hyperparameters recompiled the step"


def test_the_cpu_keeps_the_step_eager_and_says_so() -> None:
    tree = ast.parse(TRAIN_PY)
    branch = next(
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "on_gpu" and node.orelse
    )
    scope: dict[str, Any] = {"torch": SimpleNamespace(compile=None), "muon_update": "eager step"}
    exec(compile(ast.Module(body=branch.orelse, type_ignores=[]), "train.py", "exec"), scope)
    assert scope["muon_step"] == "eager step"
    assert scope["optimizer_step"] == "eager (CPU: compiling costs more of a short run than it saves)"
