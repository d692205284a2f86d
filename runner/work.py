"""The work a training step does, counted in floating-point operations: the CPU profile's quiet clock.

On a CPU the time a step takes moves with the machine's load (caches and memory bandwidth shared
with other work, threads waking each other), so a budget of CPU time fits a different number of
steps from run to run, and on the `cpu` profile one step more or less moves val_bpb by more than
the changes a loop looks for (docs/benchmarks.md, "The CPU profile's noise"). The work a step does
does not move: `FlopCount` counts the operations of the matrix products and attention that run in
this thread while it is entered (torch's own formulas, `torch.utils.flop_counter`, plus the CPU's
attention kernels, which those formulas do not cover), forward, backward and optimizer alike.
runner.harness charges each step its operations at the profile's `flops_per_second`: a step that
does twice the work costs twice the budget, so speed (in operations) still buys steps, and two runs
of one train.py train the same number of steps whatever the load.

What the count leaves out (element-wise work, Python, data movement) and work done in other
threads is priced by the CPU-time clock alone, which stays the hard limit: the work clock can only
end training earlier. Leaving this mode, or doing work it does not see, buys nothing beyond it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count


def _cpu_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward(
    grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


_CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


class FlopCount(TorchDispatchMode):
    """Counts the operations of matrix products and attention dispatched in this thread while entered."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in _CPU_ATTENTION:
            self.flops += _CPU_ATTENTION[packet](*args, **kwargs)
        elif packet in flop_registry:
            self.flops += flop_registry[packet](*args, **kwargs, out_val=out)
        return out
