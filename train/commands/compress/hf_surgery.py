"""Hugging Face causal LMs' KV caches: their keys and values, and how compress projects them.

    target = HFTarget(model, keys="auto")      # a layout of budgets/hf_layouts.py
    with target.projected(P): target.evaluate(ids)

Keys before RoPE are projected through W_K (W_K -> P W_K per KV head, bias too), or by a
hook on the per-head k_norm of models that normalize them; keys after RoPE (keys=post-rope)
inside the attention, through transformers' AttentionInterface; values through W_V.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from budgets.hf import ROPE_LAYOUTS, kv_pairs, pre_rope_module
from budgets.hf_layouts import EXTRACTORS, KV_BIASES, Geometry, layout_of
from budgets.lowrank import Slot, project_heads

from .options import key_label, resolve_keys
from .surgery import Surgery, project_linear, projected

HF_ATTENTION = "rankzoo_compress"  # the attention implementation that projects rotated keys


class HFTarget:
    """A Hugging Face causal LM (budgets/hf_layouts.py's layouts): per layer the keys and
    values of its KV heads; evaluation by next-token loss and perplexity."""

    family = "kv"

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.g = Geometry.from_config(model.config)
        self.layout = layout_of(self.g.model_type, type(model).__name__)
        self.rope = self.layout in ROPE_LAYOUTS
        self.keys = resolve_keys(keys, self.rope, f"the {self.g.model_type} model")
        self.attention = EXTRACTORS[self.layout](model)
        for i, (_, w) in enumerate(self.attention):
            self.g.check(i, w)
        # (W_K, b_K, W_V, b_V) per layer, detached views of the parameters' storage taken
        # before anything is written (GPT-2's are slices of its fused c_attn: autograd
        # forbids in-place writes through views that chunk() returned)
        self.kv = [(w.wk.detach(), _detached(bk), w.wv.detach(), _detached(bv))
                   for (m, w) in self.attention
                   for bk, bv in [KV_BIASES[self.layout](m)]]
        self.index = {m: i for i, (m, _) in enumerate(self.attention)}
        self.key_modules = [pre_rope_module(m) if self.rope else None
                            for m, _ in self.attention]
        G, K = self.g.n_kv_heads, self.g.head_dim
        self.slots = [s for i in range(self.g.n_layers)
                      for s in (Slot(i, "k", G, K), Slot(i, "v", G, K))]

    @property
    def normed_keys(self) -> bool:
        """Keys before RoPE come out of a per-head norm (k_norm), not a linear map."""
        return self.keys == "pre-rope" and any(
            m is not None and m is not getattr(a, "k_proj", None)
            for m, (a, _) in zip(self.key_modules, self.attention, strict=True))

    @property
    def saveable(self) -> str | None:
        if self.normed_keys:
            return (f"the {self.g.model_type} model normalizes its keys (k_norm) before "
                    f"RoPE, so their projection is not a change of W_K")
        if self.keys == "post-rope" and self.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None

    def describe(self) -> str:
        g = self.g
        return (f"{g.model_type}: {g.n_layers} layers x {g.n_kv_heads} KV heads x (K "
                f"{g.head_dim} + V {g.head_dim}); {key_label(self.keys, self.rope)}")

    def _heads(self, out: torch.Tensor) -> torch.Tensor:
        """[B, T, G*K] (k_proj) or [B, T, G, K] (a per-head k_norm) -> [B, G, T, K]."""
        B, T = out.shape[:2]
        return out.reshape(B, T, self.g.n_kv_heads, self.g.head_dim).transpose(1, 2)

    @torch.no_grad()
    def activations(self, ids: torch.Tensor) -> dict[tuple[int, str], torch.Tensor]:
        """Keys (before RoPE from the key projection or k_norm, else as cached) and values
        as the cache holds them, per layer [B, G, T, K]."""
        pre: dict[int, torch.Tensor] = {}
        handles = []
        if self.keys == "pre-rope":
            for i, m in enumerate(self.key_modules):
                handles.append(m.register_forward_hook(
                    lambda mod, args, out, i=i: pre.__setitem__(i, self._heads(out.detach()))))
        try:
            out = self.model(input_ids=ids, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        pairs = kv_pairs(out)
        acts = {}
        for i, (k, v) in enumerate(pairs):
            acts[(i, "k")] = pre[i] if self.keys == "pre-rope" else k
            acts[(i, "v")] = v
        return acts

    def apply(self, surgery: Surgery, P: dict) -> None:
        """The projections, applied to the model through `surgery`."""
        rotated = self.keys == "post-rope" and self.rope
        for i, (wk, bk, wv, bv) in enumerate(self.kv):
            Pk, Pv = P[(i, "k")], P[(i, "v")]
            if self.normed_keys:
                surgery.hook(self.key_modules[i], lambda mod, args, out, _P=Pk: project_heads(
                    out.reshape(*out.shape[:2], self.g.n_kv_heads, self.g.head_dim), _P,
                    head_dim=-2).reshape(out.shape))
            elif not rotated:
                project_linear(surgery, wk, bk, Pk)
            project_linear(surgery, wv, bv, Pv)
        if rotated:
            attention_with_projected_keys(self.model, surgery, self.index,
                                          {i: P[(i, "k")] for i in range(self.g.n_layers)})

    def projected(self, P: dict):
        return projected(self, P)

    @torch.no_grad()
    def evaluate(self, ids: torch.Tensor, labels=None, batch_size: int = 1) -> dict:
        """Mean next-token cross-entropy over every position, and its perplexity."""
        where = next(self.model.parameters()).device
        loss, count = 0.0, 0
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size].to(where)
            logits = self.model(input_ids=chunk, use_cache=False).logits.float()
            loss += float(F.cross_entropy(logits[:, :-1].flatten(0, 1), chunk[:, 1:].flatten(),
                                          reduction="sum"))
            count += chunk[:, 1:].numel()
        return {"loss": loss / count, "perplexity": math.exp(loss / count), "tokens": count}


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def attention_with_projected_keys(model, surgery: Surgery, index: dict, Pk: dict) -> None:
    """The model attending through a function that projects each layer's rotated keys
    [B, G, T, K] by its P before the model's own attention (transformers'
    AttentionInterface, >= 5); the implementation is restored by `surgery`."""
    try:
        from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        raise ValueError(f"keys=post-rope on a RoPE model needs transformers' "
                         f"AttentionInterface (transformers >= 5), not available here ({e})"
                         ) from None
    before = model.config._attn_implementation

    def inner(module):
        if before in ALL_ATTENTION_FUNCTIONS:
            return ALL_ATTENTION_FUNCTIONS[before]
        return sys.modules[type(module).__module__].eager_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        i = index.get(module)
        if i is not None:
            key = project_heads(key, Pk[i])
        return inner(module)(module, query, key, value, attention_mask, **kwargs)

    AttentionMaskInterface.register(HF_ATTENTION, sdpa_mask if before == "sdpa" else eager_mask)
    ALL_ATTENTION_FUNCTIONS[HF_ATTENTION] = attention
    model.set_attn_implementation(HF_ATTENTION)

    def restore():
        model.set_attn_implementation(before)
        del ALL_ATTENTION_FUNCTIONS[HF_ATTENTION]
    surgery.undo.append(restore)
