"""Rank-budget probes of Hugging Face causal LMs: a loaded model, token ids in, a probe out.

    probe, loss = probe_hf_model(model, ids)       # ids: [B, T] token ids
    report = build_hf_report(name, entry)         # entry: {"probe", "step", "params", ...}

One forward pass over the probe batch [B, T] gives, per layer, what a zoo block's probe
methods give:

  attention       softmax(q k^T) -> mixing, mixing_centered, past_future   (per head),
                                    past_future_lengths, heads
  attention input [B, T, D]      -> hidden_centered  (what the layer's attention reads)
  layer input     [B, T, D]      -> residual  (the residual stream, massive activations)
  keys, values    [B, G, T, K]   -> inference.k, inference.v  (joint over KV heads, [B, T, G*K]);
                                    kv_heads (per KV head; keys before RoPE from k_proj,
                                    or k_norm where the model normalizes its keys)
  weights         W_Q^h W_K^h^T [D, D] per head -> qk; W_V^T [D, G*V] -> value; W_O -> out

against caps declared from the config alone (budgets/hf_layouts.py), exactly as zoo's
softmax block declares them. The entries have probe_model's format, so build_report,
to_json, verdicts and advice work unchanged. Loading a model and cutting the probe batch
from a text are the caller's business (train/hf/__init__.py); tensors are measured on the
device they are on.

Two paths, chosen by the probe length T as probe_model chooses them:

- exact (T < matfree_from): the eager attention path returns every layer's probabilities
  [B, H, T, T] (output_attentions) and each is decomposed. The model must run 'eager'.
- matrix-free (T >= matfree_from): no [T, T] tensor is formed. For the forward pass the
  model's attention implementation is switched to one registered in transformers'
  AttentionInterface, which receives each layer's rotated queries [B, H, T, K] and keys
  [B, G, T, K] with its scaling, sliding window and logit soft-cap, measures the layer
  there (budgets.matfree) and returns SDPA's output, so memory stays flat in the number
  of layers and the forward continues unchanged. The implementation is restored after.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .adapters import lowrank_singular_values
from .hf_layouts import EXTRACTORS, AttnWeights, Geometry, declared_budget, layout_of, window_of
from .matfree import K_MAX, AttentionMixing
from .metrics import check_eps
from .probes import (
    MATFREE_FROM,
    ProbeProgress,
    add_adapters,
    final_hidden_metrics,
    first_tensor,
    measure,
    mixing_figures,
    mixing_figures_matfree,
    residual_owner,
    stream_figures,
    summarize_spectrum,
)
from .report import build_report
from .streams import MASSIVE_RATIO, kv_head_figures

ERANK_QUANTITIES = ("mixing", "mixing_centered", "past_future", "hidden_centered")
# layouts whose attention rotates keys by RoPE (every supported model type but GPT-2's
# learned absolute positions): their kv_heads measure keys before RoPE too
ROPE_LAYOUTS = ("llama",)
# the name the matrix-free probe registers its attention function under in transformers
MATFREE_ATTENTION = "rankzoo_matfree"


def kv_pairs(out) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v) [B, G, T, K] from the forward's cache, across transformers versions."""
    cache = out.get("cache")  # transformers 5 renamed past_key_values to cache
    if cache is None:
        cache = out.get("past_key_values")
    if hasattr(cache, "layers"):  # DynamicCache, transformers >= 4.54
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # DynamicCache before that
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(kv[0], kv[1]) for kv in cache]  # the legacy tuple of (k, v) per layer


def weight_quantities(w: AttnWeights, g: Geometry, eps: float) -> dict:
    H, G, K, D = g.n_heads, g.n_kv_heads, g.head_dim, g.d_model
    wq = w.wq.detach().float().view(H, K, D)  # [H, K, D]
    # query head h reads KV head h // (H / G), as HF's repeat_kv arranges them
    wk = w.wk.detach().float().view(G, K, D).repeat_interleave(H // G, dim=0)  # [H, K, D]
    # W_Q^h W_K^h^T is D x D of rank <= K: its singular values are those of a K x K core
    s = lowrank_singular_values(wq.transpose(1, 2), wk)  # [H, K]
    return {
        "qk": summarize_spectrum(s, (D, D), eps),
        "value": measure(w.wv.detach().float().T, eps),  # [D, G*V]
        "out": measure(w.wo.detach().float(), eps),  # [D, H*V]
    }


def _joint(kv: torch.Tensor) -> torch.Tensor:
    B, G, T, K = kv.shape
    return kv.float().transpose(1, 2).reshape(B, T, G * K)  # [B, T, G*K], as zoo caches it


def check_layers(layers, g: Geometry) -> list[int]:
    """The layer indices to measure, sorted (None: all), each checked against the model."""
    if layers is None:
        return list(range(g.n_layers))
    if not layers:
        raise ValueError("layers=[]: no layer to measure")
    for i in layers:
        if not 0 <= i < g.n_layers:
            raise ValueError(f"layers={i}: out of range; the {g.model_type} model has "
                             f"{g.n_layers} layers (0-{g.n_layers - 1})")
    return sorted(set(layers))


@dataclass
class _Probe:
    """One probe's settings and the layer entries measured so far (both paths fill it)."""

    model: nn.Module
    eps: float
    asked: list[int] | None = None  # layer indices to measure; None: all
    with_spectra: bool = False
    k_max: int = K_MAX
    progress: Callable[[ProbeProgress], None] | None = None
    massive_ratio: float = MASSIVE_RATIO
    layers: dict[int, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.g = Geometry.from_config(self.model.config)
        layout = layout_of(self.g.model_type, type(self.model).__name__)
        self.rope = layout in ROPE_LAYOUTS
        self.attention = EXTRACTORS[layout](self.model)
        if len(self.attention) != self.g.n_layers:
            raise ValueError(f"{self.g.model_type}: found {len(self.attention)} attention "
                             f"layers, but the config declares num_hidden_layers="
                             f"{self.g.n_layers}")
        self.wanted = check_layers(self.asked, self.g)
        self.index = {module: i for i, (module, _) in enumerate(self.attention)}
        self.names = {m: n for n, m in self.model.named_modules()}
        self.start = time.perf_counter()

    def record(self, i: int, figures: tuple[dict, dict], x: torch.Tensor, kv,
               streams: dict[str, dict[int, torch.Tensor]]) -> None:
        """Layer i's entry from its mixing figures (mixing_figures), its input x [B, T, D],
        its keys and values [B, G, T, K] and what _layer_streams caught of it (taken out
        of `streams`); then the progress callback."""
        module, w = self.attention[i]
        name = self.names[module]
        quantities, extras = figures
        quantities["hidden_centered"], residual = stream_figures(
            x, streams["residual"].pop(i, None), self.eps, self.massive_ratio)
        if residual is not None:
            extras["residual"] = residual
        heads = {"k": kv[0], "v": kv[1]}
        k_pre = streams["k_pre_rope"].pop(i, None)
        if k_pre is not None:  # the tokens the cache keeps (a window's last W - 1)
            heads["k_pre_rope"] = k_pre[..., k_pre.shape[-2] - kv[0].shape[-2]:, :]
        extras["kv_heads"] = kv_head_figures(heads, self.eps)
        layer = _layer_entry(i, name, self.g, self.model.config, w, module, quantities, x, kv,
                             self.eps, extras)
        # LoRA pairs anywhere in the decoder layer (attention or MLP), if an adapter
        # was loaded; rows are named relative to the layer (self_attn.q_proj, ...)
        add_adapters(layer, self.model.get_submodule(name.rpartition(".")[0]), self.eps)
        if not self.with_spectra:
            del layer["spectra"]
        self.layers[i] = layer
        if self.progress is not None:
            self.progress(ProbeProgress(i, len(self.layers), len(self.wanted),
                                        time.perf_counter() - self.start))


def _layer_entry(i: int, name: str, g: Geometry, config, w: AttnWeights, module: nn.Module,
                 mixing: dict, x: torch.Tensor, kv, eps: float, extras: dict) -> dict:
    g.check(i, w)
    T = x.shape[1]
    measured = dict(mixing)  # mixing, mixing_centered, past_future, hidden_centered
    measured.update(weight_quantities(w, g, eps))
    measured["inference.k"] = measure(_joint(kv[0]), eps, batch_dims=1)
    measured["inference.v"] = measure(_joint(kv[1]), eps, batch_dims=1)
    params = sum(p.numel() for p in module.parameters())
    return {
        "layer": i, "name": name, "block": g.model_type,
        "budget": declared_budget(g, T, window_of(config, i), params).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        **extras,  # past_future_lengths, heads, residual, kv_heads
        # matrix-free quantities have no spectrum (an empty one): nothing to keep or plot
        "spectra": {q: s for q, (_, s) in measured.items() if s.numel()},
    }


@contextlib.contextmanager
def _attention_inputs(modules: dict[nn.Module, int]):
    """Collect, by layer index, the hidden states [B, T, D] each attention module is
    called with (after its layer's pre-norm: what the attention reads, as zoo probes it)."""
    seen: dict[int, torch.Tensor] = {}

    def hook(module, args, kwargs):
        seen[modules[module]] = (args[0] if args else kwargs["hidden_states"]).detach()

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def pre_rope_module(attention: nn.Module) -> nn.Module | None:
    """The module whose output is the keys RoPE rotates: k_norm where the model normalizes
    its keys per head (Qwen3, Gemma 3, OLMo 2), else the k projection."""
    for name in ("k_norm", "k_proj"):
        if isinstance(getattr(attention, name, None), nn.Module):
            return getattr(attention, name)
    return None


@contextlib.contextmanager
def _layer_streams(p: _Probe):
    """Collect, by layer index for the wanted layers, {"residual": the decoder layer's
    input [B, T, D] (the residual stream; probes.residual_owner), "k_pre_rope": the keys
    before RoPE [B, G, T, K] (RoPE layouts only)}."""
    seen: dict[str, dict[int, torch.Tensor]] = {"residual": {}, "k_pre_rope": {}}
    G, K = p.g.n_kv_heads, p.g.head_dim

    def residual_hook(i):
        def hook(module, args, kwargs):
            x = first_tensor(args, kwargs)
            if x is not None:
                seen["residual"][i] = x.detach()
        return hook

    def key_hook(i):
        def hook(module, args, out):
            B, T = out.shape[:2]  # [B, T, G*K] from k_proj, [B, T, G, K] from k_norm
            seen["k_pre_rope"][i] = out.detach().reshape(B, T, G, K).transpose(1, 2)
        return hook

    handles = []
    for i in p.wanted:
        module = p.attention[i][0]
        owner = residual_owner(p.model, p.names[module])
        if owner is not None:
            handles.append(p.model.get_submodule(owner).register_forward_pre_hook(
                residual_hook(i), with_kwargs=True))
        keys = pre_rope_module(module) if p.rope else None
        if keys is not None:
            handles.append(keys.register_forward_hook(key_hook(i)))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    logits = logits.float()  # [B, T, vocab]
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten()))


# ---------------------------------------------------------------- exact

def _forward(model, ids: torch.Tensor, g: Geometry) -> tuple[dict, float]:
    """The model's outputs on ids [B, T] (attentions, hidden states, cache), and its mean
    next-token loss."""
    out = model(input_ids=ids, output_attentions=True, output_hidden_states=True,
                use_cache=True)
    if out.get("attentions") is None or any(a is None for a in out["attentions"]):
        raise ValueError(f"{g.model_type}: the model returned no attention probabilities "
                         f"(attn_implementation={model.config._attn_implementation!r}, "
                         f"need 'eager')")
    return out, _next_token_loss(out["logits"], ids)


def _probe_exact(p: _Probe, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Every layer's probabilities [B, H, T, T] from the eager path, decomposed; returns
    (final hidden states [B, T, D], loss)."""
    with _attention_inputs(p.index) as inputs, _layer_streams(p) as streams:
        out, loss = _forward(p.model, ids, p.g)
    kv = kv_pairs(out)
    for i in p.wanted:
        p.record(i, mixing_figures(out["attentions"][i].float(), p.eps), inputs[i], kv[i],
                 streams)
    # the last entry is the final norm's output, what the LM head reads
    return out["hidden_states"][-1], loss


# ---------------------------------------------------------------- matrix-free

def _transformers_attention():
    """(ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask, sdpa_attention_forward).

    transformers is the optional `hf` extra, not a dependency of budgets: it is imported
    here, when a matrix-free probe of a transformers model runs, never by `import budgets`.
    """
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        raise ValueError(f"the matrix-free probe needs transformers' AttentionInterface "
                         f"(transformers >= 5), not available here ({e}); measure exactly "
                         f"with matfree_from=None") from None
    return ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask, sdpa_attention_forward


def _softcapped_output(mixing: AttentionMixing, value: torch.Tensor) -> torch.Tensor:
    """softmax(softcap * tanh(q k^T * scale / softcap)) @ v, [B, T, H, V], a chunk of rows
    at a time (SDPA has no logit soft-capping). The probe batch has no padding, so the
    causal (and window) mask the operator applies is the whole mask."""
    H, G = mixing.q.shape[1], value.shape[1]
    v = value.float().repeat_interleave(H // G, dim=1)  # [B, H, T, V]
    return mixing.full().matmul(v).transpose(1, 2).to(value.dtype)  # [B, T, H, V]


def _as_cached(key: torch.Tensor, value: torch.Tensor, window: int | None):
    """Keys and values [B, G, T, K] as the exact path's cache holds them after the prefill:
    a windowed layer's cache keeps the last W - 1 (the next query brings the W-th)."""
    if window is None:
        return key, value
    start = max(key.shape[-2] - max(window - 1, 1), 0)
    return key[..., start:, :], value[..., start:, :]


def _scale(kwargs: dict, query: torch.Tensor) -> float:
    scaling = kwargs.get("scaling")
    return query.shape[-1] ** -0.5 if scaling is None else float(scaling)  # SDPA's default


def _measuring_attention(p: _Probe, inputs: dict[int, torch.Tensor], streams: dict,
                         sdpa: Callable):
    """An attention function (transformers' interface) that measures each wanted layer from
    its queries [B, H, T, K] and keys [B, G, T, K], then attends as SDPA does."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        i = p.index[module]
        x = inputs.pop(i)  # freed as soon as the layer is measured
        softcap = kwargs.get("softcap")
        if i in p.wanted or softcap is not None:
            # the window as the layer declares it to its attention (keys s > t - W, the
            # query included), which is the mask transformers builds for it too
            mixing = AttentionMixing(query, key, _scale(kwargs, query),
                                     kwargs.get("sliding_window"), softcap)
        if i in p.wanted:
            kv = _as_cached(key, value, kwargs.get("sliding_window"))
            p.record(i, mixing_figures_matfree(mixing, p.eps, p.k_max), x, kv, streams)
        if softcap is not None:
            return _softcapped_output(mixing, value), None
        return sdpa(module, query, key, value, attention_mask, **kwargs)

    return attention


@contextlib.contextmanager
def _attention_implementation(model, attention: Callable):
    """The model attending through `attention` inside, its own implementation restored
    afterwards (on an exception too)."""
    functions, masks, sdpa_mask, _ = _transformers_attention()
    if not callable(getattr(model, "set_attn_implementation", None)):
        raise ValueError(f"{type(model).__name__} cannot switch its attention implementation "
                         f"(transformers >= 5 needed); measure exactly with matfree_from=None")
    # masks as SDPA takes them (a registry keyed by name; registering again is harmless)
    masks.register(MATFREE_ATTENTION, sdpa_mask)
    functions[MATFREE_ATTENTION] = attention  # the shared interface's local mapping
    before = model.config._attn_implementation
    try:
        model.set_attn_implementation(MATFREE_ATTENTION)
        yield
    finally:
        model.set_attn_implementation(before)
        del functions[MATFREE_ATTENTION]


@contextlib.contextmanager
def _head_input(model):
    """The input [B, T, D] of the model's output embeddings (the final norm's output)."""
    seen: list[torch.Tensor] = []
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        handle.remove()


def _probe_matfree(p: _Probe, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Each wanted layer measured inside its attention call, matrix-free; returns (final
    hidden states [B, T, D], loss). No attention probabilities, no cache, no per-layer
    hidden states are kept."""
    sdpa = _transformers_attention()[3]
    with (_attention_inputs(p.index) as inputs, _layer_streams(p) as streams,
          _head_input(p.model) as head,
          _attention_implementation(p.model, _measuring_attention(p, inputs, streams, sdpa))):
        out = p.model(input_ids=ids, use_cache=False)
    missing = [i for i in p.wanted if i not in p.layers]
    if missing:
        raise ValueError(f"{p.g.model_type}: layers {missing} never called the attention "
                         f"interface, so they cannot be measured matrix-free; measure "
                         f"exactly with matfree_from=None")
    return head[-1], _next_token_loss(out["logits"], ids)


# ---------------------------------------------------------------- the probe

def probe_hf_model(model, ids: torch.Tensor, eps: float = 0.1, with_spectra: bool = False,
                   *, layers: list[int] | None = None, matfree_from: int | None = MATFREE_FROM,
                   k_max: int = K_MAX, progress: Callable[[ProbeProgress], None] | None = None,
                   massive_ratio: float = MASSIVE_RATIO) -> tuple[dict, float]:
    """(probe in probe_model's format, mean next-token loss) of a loaded HF model on ids [B, T].

    `layers`: the indices to measure (None: all); the others run but are not measured.
    `massive_ratio`: a residual token is massive above this multiple of the median norm.
    From T >= matfree_from (None: never) attention ranks are measured matrix-free (module
    docstring; rank_eps decided up to k_max values) and the probe says so in "matfree".
    `progress` is called with a ProbeProgress after each measured layer.
    """
    check_eps(eps)  # before the forward pass, so a bad eps costs nothing
    T = int(ids.shape[1])
    matfree = matfree_from is not None and matfree_from <= T
    p = _Probe(model, eps, layers, with_spectra, k_max, progress, massive_ratio)  # checks layers
    with torch.no_grad():
        final, loss = (_probe_matfree if matfree else _probe_exact)(p, ids)
    probe = {"seq_len": T, "eps": float(eps), "batch_size": int(ids.shape[0]),
             "layers": [p.layers[i] for i in p.wanted],
             "final_hidden": final_hidden_metrics(final, eps)}
    if matfree:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    return probe, loss


def build_hf_report(name: str, entry: dict, thresholds=None) -> dict:
    """build_report of one HF variant, plus per-head eranks and the probe's source (with
    the matrix-free settings, when the probe used them)."""
    source, probe = entry["source"], entry["probe"]
    report = build_report({name: entry}, experiment=f"{name} ({source['model_type']})",
                          thresholds=thresholds)
    report["source"] = {**source, **({"matfree": probe["matfree"]} if "matfree" in probe
                                     else {})}
    for layer, probed in zip(report["variants"][0]["layers"], probe["layers"], strict=True):
        eranks = {q: probed["quantities"][q]["erank"] for q in ERANK_QUANTITIES}
        layer["erank"] = eranks  # per head (hidden_centered: one value per layer)
    return report
