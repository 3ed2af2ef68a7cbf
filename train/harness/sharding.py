"""FSDP2: `train.strategy: fsdp`, each layer's parameters sharded across the processes.

Lightning's ModelParallelStrategy runs it (it has no string name, so fit.py passes an
instance): its device mesh has one data-parallel dimension as wide as all processes of all
nodes (tensor_parallel_size=1; its "auto" sizes would mean tensor parallelism within a
node), gloo on CPUs and NCCL on GPUs. LMModule.configure_model calls shard(): every layer
(norms, block, MLP) becomes one FSDP unit, gathered for its forward and backward and freed
after; the embedding, final norm and head are the root's. Checkpoints are one file holding
the full, unsharded state (save_distributed_checkpoint=False), so `rankzoo report`, export
and a resume read them in one process as any other checkpoint. The rank monitor probes an
unsharded replica (train/harness/callbacks.py), since a forward of the sharded model is a
collective every rank would have to join.

train.activation_checkpointing (any strategy): recompute_layers keeps each layer's input
alone and recomputes its activations in the backward (torch.utils.checkpoint,
non-reentrant), inside the layer's FSDP unit, which is gathered for the backward anyway.

Precision: bf16-mixed keeps fp32 master weights, computes in bf16 (FSDP casts each unit's
gathered parameters) and reduces gradients in fp32; Lightning's autocast stays on around it.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import TrainConfig
from .devices import processes

# train.precision -> (param_dtype, reduce_dtype) of FSDP's MixedPrecisionPolicy; the
# precisions not listed keep the parameters' own dtype (32-true, or bf16-true and 16-true,
# which Lightning converts the module to before it is sharded). Lightning's
# ModelParallelStrategy refuses 16-mixed (fit.check_trainer says so in one line).
POLICIES = {"bf16-mixed": (torch.bfloat16, torch.float32)}


def fsdp_strategy(train: TrainConfig):
    """Lightning's ModelParallelStrategy as pure FSDP2 over every process of every node."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return ModelParallelStrategy(data_parallel_size=processes(train) * train.num_nodes,
                                 tensor_parallel_size=1, save_distributed_checkpoint=False)


def mixed_precision(precision: str):
    """FSDP's MixedPrecisionPolicy for train.precision, or None for the parameters' dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in POLICIES:
        return None
    param_dtype, reduce_dtype = POLICIES[precision]
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def is_sharded(model: nn.Module) -> bool:
    """Whether fully_shard has been applied to `model` (its parameters are DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: nn.Module, mesh, precision: str) -> None:
    """fully_shard each of model.layers, then the root (embedding, final norm, head), on
    the 1-D data-parallel `mesh`; each layer's parameters become DTensors sharded on their
    first dimension. Idempotent: a validation after the fit sets the model up again."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(model):
        return
    policy = mixed_precision(precision)
    kwargs = {"mesh": mesh, **({} if policy is None else {"mp_policy": policy})}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict of a sharded model, on CPU, on global rank zero (empty on
    the others). A collective: every rank must call it, in the same order."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def recompute_layers(model: nn.Module) -> None:
    """Make each of model.layers recompute its activations in the backward instead of
    keeping them: the layer's own forward, called through torch.utils.checkpoint. The
    parameter names stay as they are (a wrapper module would rename them in every state
    dict). Idempotent."""
    for layer in model.layers:
        if "forward" not in vars(layer):  # not yet: an instance attribute once done
            layer.forward = functools.partial(_recomputed, layer.forward)


def _recomputed(forward, x: torch.Tensor, cache=None) -> torch.Tensor:  # x: [B, T, D]
    if cache is not None or not torch.is_grad_enabled():  # decoding, or no backward
        return forward(x, cache)
    return checkpoint(forward, x, use_reentrant=False)  # [B, T, D]
