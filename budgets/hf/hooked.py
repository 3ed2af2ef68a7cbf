"""Token mixers of Hugging Face hybrids read from their modules' forwards: lfm2's gated
short convolution, recurrent_gemma's RG-LRU and MiniMax's lightning attention.

    with capture_hooked(model, on_call):      # on_call sees each ConvCall, RecurrenceCall,
        model(input_ids=ids, use_cache=False) # LightningCall, in call order

These mixers call no shared function a capture could wrap (the convolution, the scan and
the blocks of lightning attention are written inline in their forwards), so a forward hook
on each mixer module recomputes, from its input and its own weights, the gates and
activations its forward computed, and hands them on with what it returned (the call's
`output`), against which the tests rebuild it from M. Mixers are found by class name
(`HOOKED`), with the attributes each reader needs checked. A forward that continues from
a cached state (a cache passed, an RG-LRU state that is not zero) is not a prefill from
zero, and a forward that builds a graph is training: neither is read. Nothing here imports
transformers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..capture.channels import ConvCall, RecurrenceCall
from ..capture.lightning import LightningCall
from ..probe.inputs import first_tensor


def _padded(h: torch.Tensor, mask) -> torch.Tensor:
    """The input with padding tokens zeroed, as the modules' apply_mask_to_padding_states
    does for a 2-D mask [B, T] (other masks are not theirs to apply)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return h * mask[:, :, None].to(h.dtype)
    return h


def conv_call(module: nn.Module, owner: nn.Module, args, kwargs, out) -> ConvCall:
    """lfm2's Lfm2ShortConv: B, C, x = in_proj(h) split in three along channels."""
    h = _padded(first_tensor(args, kwargs), kwargs.get("attention_mask"))  # [B, T, D]
    b, c, x = module.in_proj(h).transpose(-1, -2).chunk(3, dim=-2)  # [B, Ch, T] each
    return ConvCall(owner, b, c, x, module.conv.weight.detach(), _detached(module.conv.bias),
                    output=out, out_proj=module.out_proj)


def rglru_call(module: nn.Module, owner: nn.Module, args, kwargs, out) -> RecurrenceCall:
    """recurrent_gemma's RG-LRU: a_t = exp(-8 r_t softplus(Lambda)), b_t = i_t sqrt(1 -
    a_t^2), with a reset (a = 0, b = i) where position_ids is 0."""
    x = first_tensor(args, kwargs)  # [B, T, W]
    positions = args[1] if len(args) > 1 else kwargs["position_ids"]  # [B, T]
    B, T, W = x.shape
    heads = x.reshape(B * T, module.num_attention_heads, -1).permute(1, 0, 2)  # [Hb, BT, w]

    def gate(weight, bias):  # the block-diagonal gate of each head, [B, T, W]
        res = torch.baddbmm(bias[:, None, :], heads, weight)
        return torch.sigmoid(res.transpose(0, 1).reshape(B, T, W)).double()

    i = gate(module.input_gate_weight, module.input_gate_bias)
    r = gate(module.recurrent_gate_weight, module.recurrent_gate_bias)
    log_a = -8.0 * r * F.softplus(module.recurrent_param.double())
    reset = (positions == 0)[:, :, None]  # [B, T, 1]
    scale = torch.where(reset, 1.0, torch.sqrt(1 - torch.exp(2 * log_a)))
    log_a = log_a.masked_fill(reset, float("-inf"))  # a reset cuts the state
    return RecurrenceCall(owner, log_a.transpose(1, 2), (i * scale).transpose(1, 2),
                          x.transpose(1, 2), name="RG-LRU", output=out)


def lightning_call(module: nn.Module, owner: nn.Module, args, kwargs, out) -> LightningCall:
    """MiniMax's lightning attention: q, k, v = act(qkv_proj(h)) split per head; decay
    exp(-slope) per head and token."""
    h = first_tensor(args, kwargs)  # [B, T, D]
    B, T, _ = h.shape
    qkv = _padded(module.act_fn(module.qkv_proj(h)), kwargs.get("attention_mask"))
    qkv = qkv.reshape(B, T, module.num_attention_heads, 3 * module.head_dim)
    q, k, v = (t.transpose(1, 2) for t in qkv.split(module.head_dim, dim=3))  # [B, H, T, K]
    return LightningCall(owner, q, k, v, module.slope_rate.detach().reshape(-1), hidden=h,
                         output=out, layer=module)


def _no_cache(module: nn.Module, kwargs: dict) -> bool:
    return kwargs.get("cache") is None and kwargs.get("past_key_values") is None


def _zero_state(module: nn.Module, kwargs: dict) -> bool:
    state = getattr(module, "recurrent_states", None)
    return state is None or not bool(state.any())


# class-name suffix -> (the attributes its reader uses, whether a call starts from zero
# (checked before the forward), the reader); the owner is the module the layer's input
# enters: the mixer itself, or for the RG-LRU its recurrent block
HOOKED = {
    "ShortConv": (("in_proj", "conv", "out_proj"), _no_cache, conv_call),
    "Rglru": (("input_gate_weight", "recurrent_gate_weight", "recurrent_param"), _zero_state,
              rglru_call),
    "LightningAttention": (("qkv_proj", "slope_rate", "norm", "output_gate", "out_proj"),
                           _no_cache, lightning_call),
}
OWNED_BY_PARENT = ("Rglru",)


def hooked_mixers(model: nn.Module) -> list[tuple[nn.Module, nn.Module, tuple]]:
    """(mixer, owner, its HOOKED row) for every module of `model` a reader knows."""
    found = []
    for name, m in model.named_modules():
        suffix = next((s for s in HOOKED if type(m).__name__.endswith(s)), None)
        if suffix is None or not all(hasattr(m, a) for a in HOOKED[suffix][0]):
            continue
        parent = name.rpartition(".")[0]
        owner = model.get_submodule(parent) if suffix in OWNED_BY_PARENT else m
        found.append((m, owner, HOOKED[suffix]))
    return found


@contextlib.contextmanager
def capture_hooked(model: nn.Module, on_call: Callable):
    """Inside, each known mixer's forward (hooked_mixers) runs as before and its call is
    passed to on_call after it returns; yields the list of calls made."""
    calls: list = []
    fresh: dict[nn.Module, bool] = {}

    def pre(fresh_from_zero):
        def hook(module, args, kwargs):
            fresh[module] = fresh_from_zero(module, kwargs)
        return hook

    def post(owner, read):
        def hook(module, args, kwargs, out):
            result = out[0] if isinstance(out, tuple) else out
            if not fresh.pop(module, False) or result.requires_grad:
                return
            with torch.no_grad():
                call = read(module, owner, args, kwargs, result.detach())
            calls.append(call)
            on_call(call)
        return hook

    handles = []
    for m, owner, (_, fresh_from_zero, read) in hooked_mixers(model):
        handles.append(m.register_forward_pre_hook(pre(fresh_from_zero), with_kwargs=True))
        handles.append(m.register_forward_hook(post(owner, read), with_kwargs=True))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else None
