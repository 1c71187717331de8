"""FSDP on CPU processes (gloo), for the tests: accelerate enables FSDP only on accelerator
devices (on a CPU group it silently runs DDP, see ``dropped_fsdp_message``), but torch's
FSDP2 (``fully_shard``) runs on CPU tensors over gloo. ``FSDPOnCPUTrainer`` creates a real
Accelerator with an FSDP plugin and then sets accelerate's process state to FSDP, so that
accelerate's own FSDP code paths (``prepare``, ``clip_grad_norm_``, ``get_state_dict``,
``save_fsdp_model`` / ``load_fsdp_model``) run for real on sharded DTensor parameters.

Only the engine type is set by hand: everything else is accelerate's and torch's code.
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from pytorch_accelerated import Trainer
from pytorch_accelerated._internal.process_group import accelerator_with_collective_timeout


def fsdp_plugin(state_dict_type: str = "SHARDED_STATE_DICT", **kwargs: Any) -> FullyShardedDataParallelPlugin:
    """An FSDP2 plugin for CPU runs (no CPU RAM efficient loading: it needs a meta device init)."""
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        state_dict_type=state_dict_type,
        cpu_ram_efficient_loading=False,
        reshard_after_forward=True,
        **kwargs,
    )


def fsdp_accelerator_on_cpu(
    plugin: FullyShardedDataParallelPlugin | None = None, **kwargs: Any
) -> Accelerator:
    """A real Accelerator whose engine is FSDP, on the CPU group this process belongs to."""
    plugin = plugin or fsdp_plugin()
    accelerator = accelerator_with_collective_timeout(cpu=True, fsdp_plugin=plugin, **kwargs)
    # AcceleratorState copies PartialState's fields whenever it is built again: set both.
    PartialState().distributed_type = DistributedType.FSDP
    state = AcceleratorState()
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    assert accelerator.is_fsdp2, "the Accelerator did not take FSDP2"
    return accelerator


class FSDPOnCPUTrainer(Trainer):
    """A Trainer that trains under FSDP2 on CPU processes (see the module docstring)."""

    state_dict_type = "SHARDED_STATE_DICT"

    def _create_accelerator(self) -> Accelerator:
        return fsdp_accelerator_on_cpu(fsdp_plugin(self.state_dict_type))
