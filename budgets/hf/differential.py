"""Differential attention as transformers' diffllama computes it, its two calls of the
attention interface read into one DifferentialCall (budgets/capture/differential.py).

    pairs = DifferentialPairs()
    call = pairs.join(call)   # another module's call: itself; a differential module's
                              # first call: None (held); its second: the pair's one call

DiffLlamaAttention.forward, after RoPE: q [B, H, T, K], k and V [B, G, T, V]; V's KV heads
split in halves, each repeated to G heads (v1 = V[:G/2] twice, v2 = V[G/2:] twice); two
interface calls with the same q, k, mask and scaling, on v1 and on v2, whose outputs
o = cat(o1, o2) [B, T, H, 2V] it splits along heads into halves a1, a2 [B, T, H/2, 2V];
lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, one per
layer; d = a1 - lambda a2; its W_O reads (1 - lambda_init) groupnorm(d).

So output head j mixes by M_j = P_j - lambda P_{j+H/2} the values [V_g, V_{g+G/2}] of
g = j // (H/G): KV head g of v1 and of v2, which head j + H/2 reads as well (its KV head
g + G/2 holds the same halves, repeated). A pair whose calls do not have that layout is
refused in one line. A module is recognized by the attributes it computes lambda from
(DIFFERENTIAL); nothing here imports transformers.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from ..capture.attention import AttentionCall
from ..capture.differential import DifferentialCall

# what a differential attention module holds: lambda's vectors and initial value, the norm
# of its difference
DIFFERENTIAL = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "lambda_init", "groupnorm")


def is_differential(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in DIFFERENTIAL)


def module_lambda(module: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The layer's lambda as its forward computes it (exp of fp32 dot products, cast to
    the queries' dtype), a 0-dim tensor."""
    def term(q, k):
        return torch.exp(torch.sum(q * k, dim=-1, dtype=torch.float32)).to(dtype)
    return (term(module.lambda_q1, module.lambda_k1) - term(module.lambda_q2, module.lambda_k2)
            + module.lambda_init).detach()


def _refused(module: nn.Module, why: str) -> ValueError:
    return ValueError(f"{type(module).__name__}: its two attention calls are not differential "
                      f"attention as rankzoo reads it ({why}); its mixing is not measured")


def differential_call(first: AttentionCall, second: AttentionCall) -> DifferentialCall:
    """The one call of a differential module's two (module docstring), with P kept from
    the first where it was, M's values and lambda, and `output` what its W_O reads."""
    m, q, k = first.module, first.query, first.key
    H, G = q.shape[1], k.shape[1]
    v1, v2, half = first.value, second.value, G // 2
    if G % 2 or H % G:
        raise _refused(m, f"{H} query heads over {G} KV heads do not split in pairs")
    if not (torch.equal(second.query, q) and torch.equal(second.key, k)):
        raise _refused(m, "the second call's queries or keys differ from the first's")
    if not (torch.equal(v1[:, :half], v1[:, half:]) and torch.equal(v2[:, :half], v2[:, half:])):
        raise _refused(m, "each call's values are not one half of the KV heads, repeated")
    lam = module_lambda(m, q.dtype)
    a1, a2 = torch.chunk(torch.cat([first.output, second.output], dim=-1), 2, dim=2)
    mixed = a1 - lam * a2  # [B, T, H/2, 2V] as the module forms it, before its norm

    def norm(d: torch.Tensor) -> torch.Tensor:  # what W_O reads, from the difference
        return (1 - m.lambda_init) * m.groupnorm(d)

    # the first call's fields (queries, keys, mask, window, RoPE, P where kept), but for
    # the layer's values as cached [B, G, T, V] and what its W_O reads (its input, found by
    # out_projections: budgets/capture/out_proj.py)
    shared = {f.name: getattr(first, f.name) for f in fields(AttentionCall)}
    shared.update(value=torch.cat([v1[:, :half], v2[:, :half]], dim=1), output=norm(mixed))
    return DifferentialCall(
        **shared, lam=lam.expand(H // 2).clone(),
        # output head j reads KV head j // (H / G) of v1 and of v2, side by side
        pair_values=torch.cat([v1, v2], dim=-1).repeat_interleave(H // G, dim=1)[:, :H // 2],
        mixed=mixed, norm=norm)


class DifferentialPairs:
    """The capture's pairing of a differential module's two calls (module docstring)."""

    def __init__(self) -> None:
        self.held: dict[nn.Module, AttentionCall] = {}

    def join(self, call: AttentionCall) -> AttentionCall | None:
        if not is_differential(call.module):
            return call
        first = self.held.pop(call.module, None)
        if first is None:
            self.held[call.module] = call
            return None
        return differential_call(first, call)
