"""What one step costs in operations: ATen operations (kernel launches), host
synchronisations and GFLOP, counted below autograd."""

from __future__ import annotations

from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# Ops that make the host wait for the device on CUDA: .item() and data-dependent shapes.
SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero")


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations run below autograd (forward and backward), views and
    profiler marks excluded: each is at least one kernel launch on a GPU. ``syncs`` counts
    those in ``SYNCING_OPS`` outside optimiser steps (there they read the optimiser's
    step counter, on the host unless ``capturable``: no wait for a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0
        self._in_optimizer = False

    def __enter__(self):
        def flag(value):
            return lambda *_: setattr(self, "_in_optimizer", value)

        self._hooks = [
            register_optimizer_step_pre_hook(flag(True)),
            register_optimizer_step_post_hook(flag(False)),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.namespace != "profiler":  # profiler marks: no kernel
            self.ops += 1
        if func.name().split(".")[0] in SYNCING_OPS and not self._in_optimizer:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


def count_ops(step, flops: bool = True) -> dict:
    """ATen operations, host synchronisations and (``flops``) GFLOP of one call of ``step``:
    ``torch.utils.flop_counter``'s count of the convolutions and matrix products. Not for
    a sweep: that counter counts vmap's grouped convolutions K times over."""
    with OpCounter() as counter:
        step()
    result = {"ops_per_step": counter.ops, "host_syncs_per_step": counter.syncs}
    if flops:
        with FlopCounterMode(display=False) as flop_counter:
            step()
        result["gflop_per_step"] = flop_counter.get_total_flops() / 1e9
    return result
