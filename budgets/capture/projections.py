"""Where a model keeps each attention layer's projections, found by watching one short
forward pass through a capture source rather than by a table per model type.

    layers = discover(model, run, source)   # per attention call: its module, W_Q/W_K/W_V rows, W_O

`run()` is the short forward (a Hugging Face model's first DISCOVERY_TOKENS tokens); the
source is transformers' attention interface (budgets/hf/capture.py) or any other that
yields its calls by module (budgets/capture/sdpa.py).

A layer's keys before RoPE (or as cached, without RoPE) [B, G, T, K] are the output of a
linear applied to the layer's input, or of a per-head norm (k_norm) applied to one: the
linear and the rows of its weight that give each head's columns are found by matching
columns (a fused q/k/v projection, interleaved per head or not, gives a row index). The
queries and values likewise. W_O is the linear whose input is the attention output.
What matches nothing (MLA's latent projections) is None, and the figures that need it are
named as not measured.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from .attention import AttentionCall
from .out_proj import out_projections, projection_weight

# tokens of the discovery pass: enough columns to tell projections apart, cheap on any model
DISCOVERY_TOKENS = 32


@dataclass
class Rows:
    """The rows of a linear's weight [out, in] giving some heads' vectors, head-major."""

    linear: nn.Module
    index: torch.Tensor  # [C] C = heads * width
    through: nn.Module | None = None  # a norm between the linear and the heads (k_norm)

    def weight(self) -> torch.Tensor:
        return projection_weight(self.linear).detach()[self.index]  # [C, D]

    def bias(self) -> torch.Tensor | None:
        b = getattr(self.linear, "bias", None)
        return None if b is None else b.detach()[self.index]  # [C]


@dataclass
class LayerMap:
    """One attention layer as its forward showed it."""

    module: nn.Module
    name: str
    shape: tuple[int, int, int, int]  # H, G, K, V
    rope: bool
    window: int | None = None  # keys s > t - W seen by query t: the cache holds W
    q: Rows | None = None
    k: Rows | None = None
    v: Rows | None = None
    out: nn.Module | None = None  # the linear holding W_O
    latent: nn.Module | None = None  # MLA: the linear expanding the cached latent into K, V

    def missing(self) -> list[str]:
        """The projections no linear of the layer's input gave, by name."""
        names = {"W_Q": self.q, "W_K": self.k, "W_V": self.v, "W_O": self.out}
        return [n for n, found in names.items() if found is None]


def _columns(a: torch.Tensor, T: int) -> torch.Tensor | None:
    """[B, N, T, C] (heads second) or [B, T, ...] (tokens second) -> [B*T, F] token rows,
    columns head-major; None for any other layout."""
    if a.dim() == 4 and a.shape[2] == T and a.shape[1] != T:
        a = a.transpose(1, 2)
    elif a.dim() < 3 or a.shape[1] != T:
        return None
    return a.reshape(a.shape[0] * T, -1).float()


def match_columns(target: torch.Tensor, found: torch.Tensor) -> torch.Tensor | None:
    """The index of `found`'s columns [N, F] equal to each of `target`'s [N, C], or None."""
    if found is None or target.shape[0] != found.shape[0] or found.shape[1] < target.shape[1]:
        return None
    r = torch.randn(target.shape[0], generator=torch.Generator().manual_seed(0),
                    dtype=found.dtype).to(found.device)
    idx = ((r @ found)[None, :] - (r @ target)[:, None]).abs().argmin(dim=1)  # [C]
    scale = target.abs().max().clamp_min(1e-12)
    ok = torch.allclose(found[:, idx], target, rtol=1e-4, atol=1e-5 * float(scale))
    return idx if ok else None


def _rows(target: torch.Tensor, x: torch.Tensor, seen: dict) -> Rows | None:
    """Rows of a linear of x [B, T, D] giving target [B, N, T, C], directly or through a
    module (a per-head norm) whose output gives them."""
    T = x.shape[1]
    want = _columns(target, T)
    linears = [(m, _columns(o, T)) for m, (i, o) in seen.items()
               if projection_weight(m) is not None and i.shape == x.shape and torch.equal(i, x)]
    for m, out in linears:
        idx = match_columns(want, out)
        if idx is not None:
            return Rows(m, idx)
    for norm, (i, o) in seen.items():
        inputs, outputs = _columns(i, T), _columns(o, T)
        if projection_weight(norm) is not None or inputs is None or outputs is None:
            continue
        idx = match_columns(want, outputs)
        for m, out in linears if idx is not None else ():
            inner = match_columns(inputs[:, idx], out)
            if inner is not None:
                return Rows(m, inner, through=norm)
    return None


@contextlib.contextmanager
def _leaf_io(attention: nn.Module, seen: dict):
    """(input, output) of every leaf module below `attention` with a tensor input."""
    def hook(module, args, out):
        if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            seen[module] = (args[0].detach(), out.detach())

    handles = [m.register_forward_hook(hook) for m in attention.modules()
               if m is not attention and not list(m.children())]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _layer_map(call: AttentionCall, name: str, x: torch.Tensor, seen: dict) -> LayerMap:
    H, G = call.query.shape[1], call.key.shape[1]
    layer = LayerMap(call.module, name, (H, G, call.key.shape[-1], call.value.shape[-1]),
                     call.rope, window=call.window, out=call.out_proj)
    q = call.query_pre if call.query_pre is not None else call.query
    k = call.key_pre if call.key_pre is not None else call.key
    layer.q, layer.k, layer.v = (_rows(t, x, seen) for t in (q, k, call.value))
    if layer.k is None:
        layer.latent = _latent_linear(call, seen)
    return layer


def _latent_linear(call: AttentionCall, seen: dict) -> nn.Module | None:
    """The linear below the attention module whose output gives the keys' unrotated
    columns, when its input is not the layer's input: MLA's expansion of a cached latent
    (deepseek_v3's kv_b_proj)."""
    T = call.key.shape[-2]
    plain = call.key if call.key_pre is None else call.key[..., (call.key == call.key_pre)
                                                               .flatten(0, -2).all(dim=0)]
    want = _columns(plain, T) if plain.shape[-1] else None
    for m, (_, out) in seen.items() if want is not None else ():
        if projection_weight(m) is not None and match_columns(want, _columns(out, T)) \
                is not None:
            return m
    return None


@contextlib.contextmanager
def _inputs(modules: list[nn.Module], seen: dict):
    def hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor):
            seen[module] = x.detach()

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _calls_by_module(calls) -> dict:
    """A source's yielded record as a live {module: its latest call} (transformers'
    capture yields that dict itself; the SDPA capture holds it as `by_module`)."""
    return calls if isinstance(calls, dict) else calls.by_module


def discover(model: nn.Module, run, source) -> list[LayerMap]:
    """Per attention call of `run()` (in call order), its layer's projections, from two
    passes of that short forward under `source(model, on_call)`: one finds the attention
    modules, the next watches their leaves and inputs."""
    first: list[AttentionCall] = []
    with torch.no_grad(), source(model, first.append):
        run()
    modules = list(dict.fromkeys(c.module for c in first))
    names = {m: n for n, m in model.named_modules()}
    leaves = {m: {} for m in modules}
    inputs: dict[nn.Module, torch.Tensor] = {}
    calls: list[AttentionCall] = []
    with contextlib.ExitStack() as stack:
        for m in modules:
            stack.enter_context(_leaf_io(m, leaves[m]))
        stack.enter_context(_inputs(modules, inputs))
        stack.enter_context(torch.no_grad())
        found = _calls_by_module(stack.enter_context(source(model, calls.append)))
        stack.enter_context(out_projections(found, modules))
        run()
    return [_layer_map(c, names[c.module], inputs[c.module], leaves[c.module]) for c in calls]
