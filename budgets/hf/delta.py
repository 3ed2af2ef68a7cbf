"""The delta-rule layers of Hugging Face hybrids (Gated DeltaNet: qwen3_next, qwen3_5,
olmo_hybrid; KDA: kimi_linear, bailing_hybrid), captured at their chunk functions.

    with capture_delta(model, on_call):       # on_call(call) sees each DeltaCall
        model(input_ids=ids, use_cache=False)

Each modeling module calls its own `torch_chunk_gated_delta_rule` or
`chunk_kimi_delta_attention(query, key, value, g, beta, chunk_size, initial_state,
output_final_state, use_qk_l2norm_in_kernel)` on a prefill, after the layer's short
convolution: query and key [B, T, Hk, K], value [B, T, Hv, V], g the log decay [B, T, Hv]
(GDN) or [B, T, H, K] (KDA), beta [B, T, Hv]. Inside `capture_delta` the function is wrapped
for the duration, and its call held as the recurrence reads it: query and key repeated to
the value heads (Hv / Hk each), L2-normalized where `use_qk_l2norm_in_kernel` asks
(x / sqrt(|x|^2 + 1e-6), as both kernels do), query scaled by `scale` or K^-1/2, all in
fp64. Those kernels compute in fp32, so M reproduces their output to fp32's precision.

The layer's short convolution is not part of M (q, k, v are taken after it); its cache
counts in the caps' cached elements. A call from a cached state (`initial_state`) or that
builds a graph is not read. The
one-token recurrent functions serve decoding only, so they are not wrapped. Nothing here
imports transformers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ..capture.delta import DeltaCall
from ..capture.running import running, wrapped_functions

CHUNK_NAMES = ("torch_chunk_gated_delta_rule", "chunk_kimi_delta_attention")
ARGS = ("query", "key", "value", "g", "beta", "chunk_size", "initial_state",
        "output_final_state", "use_qk_l2norm_in_kernel")
L2_EPS = 1e-6  # the eps both kernels add under the square root


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _heads(x: torch.Tensor, rep: int) -> torch.Tensor:
    """[B, T, Hk, *] -> [B, Hv, T, *] in fp64, each head repeated for its value heads."""
    return x.detach().double().repeat_interleave(rep, dim=2).transpose(1, 2)


def delta_call(module: nn.Module | None, args: tuple, kwargs: dict) -> DeltaCall:
    """A chunk function's arguments as the recurrence reads them (module docstring)."""
    got = dict(zip(ARGS, args, strict=False)) | kwargs
    value = got["value"]  # [B, T, Hv, V]
    rep = value.shape[2] // got["key"].shape[2]  # value heads per query/key head
    q, k = _heads(got["query"], rep), _heads(got["key"], rep)  # [B, Hv, T, K]
    if got.get("use_qk_l2norm_in_kernel", False):
        q, k = _l2norm(q), _l2norm(k)
    scale = got.get("scale")
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    g = got["g"].detach().double().transpose(1, 2)  # [B, Hv, T] or [B, H, T, K]
    beta = got["beta"].detach().double().transpose(1, 2)  # [B, Hv, T]
    return DeltaCall(module, q, k, value.detach().transpose(1, 2), beta, g,
                     conv_state=conv_state(module), sharing=rep)


def conv_state(module: nn.Module | None) -> int:
    """Elements the layer's short convolution before q, k, v caches per sequence (its last
    L - 1 inputs of every channel): its `conv1d`, as every such modeling module names it;
    0 where it has none."""
    conv = getattr(module, "conv1d", None)
    if not isinstance(conv, nn.Conv1d):
        return 0
    return conv.in_channels * (conv.kernel_size[0] - 1)


@contextlib.contextmanager
def capture_delta(model: nn.Module, on_call: Callable[[DeltaCall], None]):
    """Inside, every chunk function of `model`'s modeling modules runs as before, its
    DeltaCall (output included) passed to on_call; yields the list of calls made. The
    originals are restored after."""
    calls: list[DeltaCall] = []
    stack: list[nn.Module] = []

    def wrap(fn, attr: str):
        def chunk(*args, **kwargs):
            out = fn(*args, **kwargs)
            got = dict(zip(ARGS, args, strict=False)) | kwargs
            if got.get("initial_state") is not None or got["value"].requires_grad:
                return out  # a cached state or training: not a prefill from zero
            call = delta_call(stack[-1] if stack else None, args, kwargs)
            call.output = (out[0] if isinstance(out, tuple) else out).detach()
            calls.append(call)
            on_call(call)
            return out
        return chunk

    with running(model, stack), wrapped_functions(model, CHUNK_NAMES, wrap):
        yield calls
