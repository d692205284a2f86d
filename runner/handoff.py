"""The model's way out of the training sandbox: a torch.export graph, and the checks on the way in.

The training process exports train.py's model as an ExportedProgram: a graph of PyTorch
operators and its weights, with none of train.py's Python in it. The scoring process loads it
and refuses anything but a pure function of its input:
- weights are read with `weights_only` forced (torch.export.load would otherwise fall back to
  unpickling arbitrary objects, which runs code);
- every operator must be one of PyTorch's own (aten, prims) or a plain Python helper the
  exporter emits (getitem, arithmetic on sizes) or a higher-order op that only wraps such a graph
  (autocast, grad mode); a custom or unknown operator is refused;
- no random operator (a seeded nondeterministic one: rand, dropout in training mode...): the
  same input must give the same logits, or noise could hide a leak from the causality probe;
- the graph may not mutate its buffers or its input, nor call any in-place operator (an export
  under no_grad keeps `buffer.add_(1)` as such), so it cannot keep state between calls and
  behave one way under the causality probe and another when scored.
The graph is exported for the shape the evaluation uses ([eval_batch_size, seq_len]); the scorer
pads a short last batch to that shape.
"""

from __future__ import annotations

import contextlib
import operator
import os
from pathlib import Path
from typing import Any

import torch

ALLOWED_NAMESPACES = ("aten", "prims")
ALLOWED_PYTHON = {
    operator.getitem,
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.truediv,
    operator.mod,
    operator.neg,
    operator.pow,
}
ALLOWED_HIGHER_ORDER = {"wrap_with_autocast", "wrap_with_set_grad_enabled"}


class ModelRefused(RuntimeError):
    """The exported model is not a plain graph of PyTorch operators."""


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def export_model(
    model: torch.nn.Module, path: Path, *, batch_size: int, seq_len: int, vocab_size: int, device: torch.device
) -> None:
    """Export `model` (called as model(idx) -> logits) for [batch_size, seq_len] token batches."""
    example = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast_for(device):
            program = torch.export.export(model, (example,))
    except Exception as error:  # noqa: BLE001 - any failure to export is train.py's
        raise RuntimeError(
            f"the model could not be exported for scoring ({type(error).__name__}: {str(error)[:500]}). The "
            "harness scores the model in a separate process from a torch.export graph: forward(idx) must "
            "be traceable (no Python branching on tensor values, no I/O, no global state)."
        ) from error
    finally:
        model.train(was_training)
    torch.export.save(program, str(path))


def load_model(path: Path) -> torch.nn.Module:
    """Load an exported model for scoring; ModelRefused if it is anything but a pure operator graph."""
    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        program = torch.export.load(str(path))
    except Exception as error:  # noqa: BLE001 - a file the training side wrote: anything can be wrong
        raise ModelRefused(
            f"the exported model could not be loaded ({type(error).__name__}: {str(error)[:300]})"
        ) from None
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous
    check_program(program)
    return program.module()


def check_program(program: torch.export.ExportedProgram) -> None:
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise ModelRefused(
            "the model changes its own buffers or its input when called: a scored model must "
            "be a pure function of its input (keep state out of forward())"
        )
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.op != "call_function":
                continue
            if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                raise ModelRefused(
                    f"the model changes a tensor in place ({node.target}) when called: a scored "
                    "model must be a pure function of its input (keep state out of forward())"
                )
            if isinstance(node.target, torch._ops.OpOverload) and _draws_random_numbers(node):
                raise ModelRefused(
                    f"the model draws random numbers ({node.target}) when called: a scored model must "
                    "give the same logits for the same input (no dropout or noise at evaluation)"
                )
            if not _allowed(node.target):
                raise ModelRefused(
                    f"the model calls {node.target!r}, which is not a PyTorch operator the "
                    "scorer runs; use torch's own operations in forward()"
                )


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """A seeded nondeterministic operator, except attention whose dropout probability is zero
    (scaled_dot_product_attention carries the tag for its dropout argument)."""
    op = node.target
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    names = [argument.name for argument in op._schema.arguments]
    if "dropout_p" not in names:
        return True
    index = names.index("dropout_p")
    if "dropout_p" in node.kwargs:
        dropout = node.kwargs["dropout_p"]
    elif index < len(node.args):
        dropout = node.args[index]
    else:
        dropout = op._schema.arguments[index].default_value
    return not (isinstance(dropout, (int, float)) and dropout == 0)


def _allowed(target: Any) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in ALLOWED_NAMESPACES
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name() in ALLOWED_HIGHER_ORDER
    return target in ALLOWED_PYTHON
