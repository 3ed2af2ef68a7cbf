"""Rank-budget probes of Hugging Face causal LMs: a loaded model, token ids in, a probe out.

    probe, loss = probe_hf_model(model, ids)       # ids: [B, T] token ids
    report = build_hf_report(name, entry)         # entry: {"probe", "step", "params", ...}

One forward pass over the probe batch [B, T] gives, per attention layer, what a zoo
block's probe methods give:

  attention       P [B, H, T, T]  -> mixing, mixing_centered, past_future   (per head),
                                    past_future_lengths, heads
  attention input [B, T, D]      -> hidden_centered  (what the layer's attention reads)
  layer input     [B, T, D]      -> residual  (the residual stream, massive activations)
  keys, values    [B, G, T, K]   -> inference.k, inference.v  (joint over KV heads, [B, T, G*K]);
                                    kv_heads (per KV head; keys before RoPE too)
  weights         W_Q^h W_K^h^T [D, D] per head -> qk; W_V^T [D, G*V] -> value; W_O -> out

against caps declared from the layer's kind (kind_of: its window, RoPE, sinks, experts)
through attention_budget, the formula zoo's softmax and sliding_window blocks declare
through as well. The entries have probe_model's format, so build_report, to_json,
verdicts and advice work unchanged. Loading a model and cutting the probe batch from a
text are the caller's business (train/hf/__init__.py); tensors are measured on the device
they are on.

Every layer is read through transformers' attention interface (budgets/hf/capture.py):
the function the model attends through computes P itself, with the layer's scaling,
mask, soft-cap and sinks, and returns P V, so the forward continues as eager attention
would; the projections come from budgets/hf/projections.py, found by watching a short
forward rather than from a table per model type. Two ways to measure P, chosen by the
probe length T as probe_model chooses them:

- exact (T < matfree_from): each layer's P [B, H, T, T] is formed and decomposed.
- matrix-free (T >= matfree_from): no [T, T] tensor is formed; the layer is measured from
  its queries and keys (budgets.rank.matfree) and P V is computed a block of rows at a time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..budget import attention_budget
from ..capture.attention import AttentionCall
from ..capture.out_proj import projection_weight
from ..probe.blocks import (
    MATFREE_FROM,
    ProbeProgress,
    add_adapters,
    final_hidden_metrics,
    matrix_figures,
    mixing_figures,
    mixing_figures_matfree,
    residual_owner,
    stream_figures,
    summarize_spectrum,
)
from ..probe.inputs import module_inputs
from ..probe.streams import MASSIVE_RATIO, kv_head_figures
from ..rank.adapters import lowrank_singular_values
from ..rank.matfree import K_MAX, AttentionMixing
from ..rank.metrics import check_eps
from ..report.document import build_report
from ..report.kinds import kind_summary
from .cache_rows import as_cached, cache_rows, latent_budget
from .capture import capture
from .eager import probe_eager
from .projections import DISCOVERY_TOKENS, LayerMap, discover
from .scans import ScanCall, capture_scans, factored_mixing, ssd_budget, ssd_kind, ssd_mixing
from .unmeasured import unmeasured_mixers, unmeasured_text

ERANK_QUANTITIES = ("mixing", "mixing_centered", "past_future", "hidden_centered")


def weight_quantities(layer: LayerMap, eps: float) -> dict:
    """qk, value and out of one layer, each where its projections were found."""
    H, G, K, _ = layer.shape
    out = {}
    if layer.q is not None and layer.k is not None:
        wq = layer.q.weight().float()  # [H*K, D]
        D = wq.shape[-1]
        wq = wq.view(H, K, D)
        # query head h reads KV head h // (H / G), as HF's repeat_kv arranges them
        wk = layer.k.weight().float().view(G, K, D).repeat_interleave(H // G, dim=0)
        # W_Q^h W_K^h^T is D x D of rank <= K: its singular values are those of a K x K core
        s = lowrank_singular_values(wq.transpose(1, 2), wk)  # [H, K]
        out["qk"] = summarize_spectrum(s, (D, D), eps)
    if layer.v is not None:
        out["value"] = matrix_figures(layer.v.weight().float().T, eps)  # [D, G*V]
    if layer.out is not None:
        out["out"] = matrix_figures(projection_weight(layer.out).detach().float(), eps)  # [D, H*V]
    return out


def check_layers(layers, n_layers: int, model_type: str) -> list[int]:
    """The layer indices to measure, sorted (None: all), each checked against the model."""
    if layers is None:
        return list(range(n_layers))
    if not layers:
        raise ValueError("layers=[]: no layer to measure")
    for i in layers:
        if not 0 <= i < n_layers:
            raise ValueError(f"layers={i}: out of range; the {model_type} model has "
                             f"{n_layers} layers (0-{n_layers - 1})")
    return sorted(set(layers))


def _experts(module: nn.Module) -> bool:
    """Whether a decoder layer routes its tokens to experts (a mixture of experts)."""
    return any("expert" in name.rsplit(".", 1)[-1] for name, _ in module.named_modules())


def kind_of(call: AttentionCall, moe: bool) -> dict:
    """One attention layer's kind, from what its attention call declared: sliding window W
    or global; RoPE or not; soft-capped logits; sinks; experts after it."""
    kind = {"attention": "sliding" if call.window else "global", "window": call.window,
            "rope": call.rope, "softcap": call.softcap, "sinks": call.sinks is not None,
            "moe": moe}
    # no RoPE: NoPE layers, or learned absolute positions added before the first layer
    kind["label"] = (f"sliding W={call.window}" if call.window else "global") + (
        "" if call.rope else " no RoPE")
    return kind


class NoMixers(ValueError):
    """The model shows no attention call and no SSD scan to the capture."""


@dataclass
class _Probe:
    """One probe's settings and the layer entries measured so far."""

    model: nn.Module
    ids: torch.Tensor  # [B, T] (its start finds the projections)
    eps: float
    asked: list[int] | None = None  # layer indices to measure; None: all
    with_spectra: bool = False
    k_max: int = K_MAX
    progress: Callable[[ProbeProgress], None] | None = None
    massive_ratio: float = MASSIVE_RATIO
    layers: dict[int, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model_type = getattr(self.model.config, "model_type", type(self.model).__name__)
        self.maps = _mixers(self.model, self.ids)
        # layers mixing by anything else (short convolutions, Gated DeltaNet, RG-LRU, ...)
        self.unmeasured = unmeasured_mixers(self.model, [m.name for m in self.maps])
        if not self.maps:
            mixers = f" (its mixers: {unmeasured_text(self.unmeasured)})" \
                if self.unmeasured else ""
            raise NoMixers(f"{self.model_type}: no layer attends through transformers' "
                           f"attention interface or mixes by a Mamba scan{mixers}, "
                           f"and the model returns no attention probabilities, so the "
                           f"probe cannot read it")
        self.wanted = check_layers(self.asked, len(self.maps), self.model_type)
        # module -> its mixer indices, one per call (several for a shared block)
        self.index: dict[nn.Module, list[int]] = {}
        for i, m in enumerate(self.maps):
            self.index.setdefault(m.module, []).append(i)
        self.calls: dict[nn.Module, int] = {}  # calls seen so far in the probe's forward
        self.sharing = _weight_groups(self.maps)
        self.start = time.perf_counter()

    def mixer_of(self, module: nn.Module) -> int | None:
        """The mixer index of this call of `module` (its k-th call: its k-th index)."""
        indices = self.index.get(module)
        if indices is None:
            return None
        k = self.calls.get(module, 0)
        self.calls[module] = k + 1
        return indices[k % len(indices)]

    def shared(self, i: int) -> dict | None:
        """{"module", "mixers"} when mixer i's weights serve other mixers too (one module
        called several times, or tied weights), else None: the report says so."""
        group = self.sharing.get(i)
        return None if group is None else {"module": self.maps[group[0]].name,
                                           "mixers": list(group)}

    def record(self, i: int, figures: tuple[dict, dict], x: torch.Tensor,
               call: AttentionCall | ScanCall, streams: dict[str, dict[int, torch.Tensor]]
               ) -> None:
        """Layer i's entry from its mixing figures (mixing_figures), its input x [B, T, D],
        its attention or scan call and what _layer_streams caught of it (taken out of
        `streams`); then the progress callback."""
        layer_map = self.maps[i]
        quantities, extras = figures
        quantities["hidden_centered"], residual = stream_figures(
            x, streams["residual"].pop(i, None), self.eps, self.massive_ratio)
        if self.shared(i) is not None:
            extras["shared"] = self.shared(i)
        if residual is not None:
            extras["residual"] = residual
        owner = residual_owner(self.model, layer_map.name)
        moe = _experts(self.model.get_submodule(owner) if owner else layer_map.module)
        if isinstance(call, ScanCall):
            extras["kind"] = ssd_kind(call, moe)
            layer = _ssm_entry(i, layer_map, self.model_type, quantities, x, call, extras)
        else:
            k, v = as_cached(call.key, call.value, call.window)
            heads = {"k": k, "v": v}
            if call.key_pre is not None:  # the tokens the cache keeps (a window's last W - 1)
                heads["k_pre_rope"] = call.key_pre[..., call.key_pre.shape[-2] - k.shape[-2]:, :]
            extras["kv_heads"] = kv_head_figures(heads, self.eps)
            extras["kind"] = kind_of(call, moe)
            layer = _layer_entry(i, layer_map, self.model_type, quantities, x, call,
                                 streams["latent"].pop(i, None), self.eps, extras)
        # LoRA pairs anywhere in the decoder layer (attention or MLP), if an adapter
        # was loaded; rows are named relative to the layer (self_attn.q_proj, ...)
        add_adapters(layer, self.model.get_submodule(layer_map.name.rpartition(".")[0]),
                     self.eps)
        if not self.with_spectra:
            del layer["spectra"]
        self.layers[i] = layer
        if self.progress is not None:
            self.progress(ProbeProgress(i, len(self.layers), len(self.wanted),
                                        time.perf_counter() - self.start))


def _weight_groups(maps: list) -> dict[int, list[int]]:
    """Mixer index -> every mixer index with the same weights, for mixers whose weights
    serve several: one module called more than once (zamba's Mamba heads, a block reused
    by several layers) or modules whose parameters are tied (zamba's shared attention)."""
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(maps):
        first = next(m.module.parameters(), None)
        key = first.data_ptr() if first is not None else id(m.module)
        groups.setdefault(key, []).append(i)
    return {i: g for g in groups.values() if len(g) > 1 for i in g}


@dataclass
class SSMMap:
    """One Mamba-2-family mixer, as its scan call showed it."""

    module: nn.Module
    name: str


def _mixers(model: nn.Module, ids: torch.Tensor) -> list[LayerMap | SSMMap]:
    """The attention layers (budgets/hf/projections.py) and SSD mixers of `model`, one per
    call, in the order the forward calls them: a block shared by several layers (zamba's
    one attention block) is a mixer at each layer that calls it."""
    attention: dict[nn.Module, list[LayerMap]] = {}
    for m in discover(model, ids):  # one LayerMap per call, in call order
        attention.setdefault(m.module, []).append(m)
    names = {m: n for n, m in model.named_modules()}
    called: list[tuple[str, nn.Module]] = []
    with (torch.no_grad(), capture(model, lambda call: called.append(("attn", call.module))),
          capture_scans(model, lambda call: called.append(("scan", call.module)))):
        model(input_ids=ids[:, :DISCOVERY_TOKENS], use_cache=False)
    out: list[LayerMap | SSMMap] = []
    for what, module in called:
        if what == "attn" and attention.get(module):
            out.append(attention[module].pop(0))
        elif what == "scan" and module in names:
            out.append(SSMMap(module, names[module]))
    return out


def _ssm_entry(i: int, layer: SSMMap, block: str, mixing: dict, x: torch.Tensor,
               call: ScanCall, extras: dict) -> dict:
    params = sum(p.numel() for p in layer.module.parameters())
    extras["not_measured"] = ["the SSD state and the mixer's projections (an SSM layer: its "
                              "mixing alone is measured)"]
    return {
        "layer": i, "name": layer.name, "block": block,
        "budget": ssd_budget(call, x.shape[1], x.shape[-1], params, block).to_dict(),
        "quantities": {q: m for q, (m, _) in mixing.items()},
        **extras,
        "spectra": {q: s for q, (_, s) in mixing.items() if s.numel()},
    }


def declared_caps(layer: LayerMap, seq_len: int, d_model: int, window: int | None,
                  params: int, block: str):
    """The caps of one layer, as zoo's softmax / sliding_window blocks declare them."""
    H, G, K, _ = layer.shape
    return attention_budget(block, seq_len, n_heads=H, n_kv_heads=G, head_dim=K,
                            d_model=d_model, window=window, params=params)


def _layer_entry(i: int, layer: LayerMap, block: str, mixing: dict, x: torch.Tensor,
                 call: AttentionCall, latent: torch.Tensor | None, eps: float,
                 extras: dict) -> dict:
    """An attention layer's entry; `latent`: the latent it caches (MLA), else None."""
    measured = dict(mixing)  # mixing, mixing_centered, past_future, hidden_centered
    measured.update(weight_quantities(layer, eps))
    measured.update(cache_rows(call, latent, eps))  # inference.k/v, or the latent's rows
    params = sum(p.numel() for p in layer.module.parameters())
    budget = declared_caps(layer, x.shape[1], x.shape[-1], call.window, params, block)
    missing = layer.missing()
    if missing:
        extras["not_measured"] = [f"{', '.join(missing)}: no linear of the layer's input "
                                  f"gives them (their rows are not measured)"]
    return {
        "layer": i, "name": layer.name, "block": block,
        "budget": (latent_budget(budget, latent, call) if latent is not None
                   else budget).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        **extras,  # past_future_lengths, heads, residual, kv_heads, kind
        # matrix-free quantities have no spectrum (an empty one): nothing to keep or plot
        "spectra": {q: s for q, (_, s) in measured.items() if s.numel()},
    }


@contextlib.contextmanager
def _layer_streams(p: _Probe):
    """Collect, by layer index for the wanted layers, {"residual": the decoder layer's
    input [B, T, D] (the residual stream; probes.residual_owner), "latent": the latent an
    MLA layer caches, its expanding linear's input (budgets/hf/cache_rows.py)}."""
    # a shared block's module path names only its first layer: its later calls get no
    # residual stream rather than that layer's
    owners = {i: residual_owner(p.model, p.maps[i].name) for i in p.wanted
              if p.index[p.maps[i].module][0] == i}
    layers = {i: p.model.get_submodule(o) for i, o in owners.items() if o is not None}
    latents = {i: p.maps[i].latent for i in p.wanted if getattr(p.maps[i], "latent", None)}
    with module_inputs(layers) as residual, module_inputs(latents) as latent:
        yield {"residual": residual, "latent": latent}


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    logits = logits.float()  # [B, T, vocab]
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten()))


def _measuring(p: _Probe, inputs: dict[int, torch.Tensor], streams: dict, matfree: bool):
    """The captures' callback: each wanted layer measured from its call, exactly from P (or
    an SSD mixer's M) or matrix-free from its queries and keys (its factors); P, queries,
    keys and values freed as soon as it is measured (the capture keeps every layer's call:
    at 1 x 8192 they held 1.7 GiB)."""

    def on_call(call: AttentionCall | ScanCall) -> None:
        i = p.mixer_of(call.module)
        if i is None:
            return
        x = inputs.pop(i)
        if i in p.wanted:
            p.record(i, _figures(p, call, matfree), x, call, streams)
        if isinstance(call, AttentionCall):  # measured: the capture keeps the call, not these
            call.probs = call.query = call.key = call.value = None
            call.query_pre = call.key_pre = None

    return on_call


def _figures(p: _Probe, call: AttentionCall | ScanCall, matfree: bool) -> tuple[dict, dict]:
    if isinstance(call, ScanCall):
        if matfree:
            return mixing_figures_matfree(factored_mixing(call), p.eps, p.k_max)
        return mixing_figures(ssd_mixing(call).float(), p.eps)
    if matfree:
        mixing = AttentionMixing(call.query, call.key, call.scaling, call.window,
                                 call.softcap, call.sinks)
        return mixing_figures_matfree(mixing, p.eps, p.k_max)
    return mixing_figures(call.probs.float(), p.eps)


def _probe(p: _Probe, ids: torch.Tensor, matfree: bool) -> tuple[torch.Tensor, float]:
    """Each wanted layer measured inside its attention call; returns (final hidden states
    [B, T, D]: the input of the output embeddings, after the final norm; loss). The
    hidden states each mixer reads (after its layer's pre-norm, as zoo probes it) are
    held until its call is measured; no per-layer hidden states or cache are kept."""
    mixers = {i: module for module, indices in p.index.items() for i in indices}
    head = {"head": p.model.get_output_embeddings()}
    with (module_inputs(mixers) as inputs, _layer_streams(p) as streams,
          module_inputs(head) as final):
        on_call = _measuring(p, inputs, streams, matfree)
        with (capture(p.model, on_call, keep_probs=not matfree, matfree=matfree),
              capture_scans(p.model, on_call)):
            out = p.model(input_ids=ids, use_cache=False)
    return final["head"], _next_token_loss(out["logits"], ids)


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
    with torch.no_grad():
        try:
            p = _Probe(model, ids, eps, layers, with_spectra, k_max, progress, massive_ratio)
        except NoMixers as e:  # no interface: P from the eager path, if it gives it
            return _probe_eager(model, ids, eps, layers, with_spectra, massive_ratio, e)
        final, loss = _probe(p, ids, matfree)
    probe = {"seq_len": T, "eps": float(eps), "batch_size": int(ids.shape[0]),
             "layers": [p.layers[i] for i in p.wanted],
             "final_hidden": final_hidden_metrics(final, eps)}
    if matfree:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    if p.unmeasured:
        probe["unmeasured_mixers"] = p.unmeasured
    return probe, loss


def _probe_eager(model, ids: torch.Tensor, eps: float, layers, with_spectra: bool,
                 massive_ratio: float, why: NoMixers) -> tuple[dict, float]:
    """probe_hf_model's answer from budgets/hf/eager.py, exact whatever the length."""
    model_type = model.config.model_type
    wanted = check_layers(layers, int(model.config.num_hidden_layers), model_type)
    found = probe_eager(model, ids, eps, wanted, massive_ratio)
    if found is None:
        raise why
    entries, final, loss = found
    for layer in entries if not with_spectra else ():
        del layer["spectra"]
    return {"seq_len": int(ids.shape[1]), "eps": float(eps), "batch_size": int(ids.shape[0]),
            "layers": entries, "final_hidden": final_hidden_metrics(final, eps)}, loss


def build_hf_report(name: str, entry: dict, thresholds=None,
                    zoo_blocks: Mapping[str, str] | None = None) -> dict:
    """build_report of one HF variant, plus per-head eranks, the probe's source (with
    the matrix-free settings, when the probe used them) and the per-kind summary, each
    kind beside the zoo block `zoo_blocks` names for its attention kind."""
    source, probe = entry["source"], entry["probe"]
    report = build_report({name: entry}, experiment=f"{name} ({source['model_type']})",
                          thresholds=thresholds)
    report["source"] = {**source, **({"matfree": probe["matfree"]} if "matfree" in probe
                                     else {})}
    for layer, probed in zip(report["variants"][0]["layers"], probe["layers"], strict=True):
        # matrix-free SSM layers have no whole-mixing figures: empty lists there
        eranks = {q: probed["quantities"].get(q, {}).get("erank", []) for q in ERANK_QUANTITIES}
        layer["erank"] = eranks  # per head (hidden_centered: one value per layer)
        for key in ("kind", "not_measured"):
            if key in probed:
                layer[key] = probed[key]
    report["kinds"] = kind_summary(report["variants"][0]["layers"], zoo_blocks)
    if probe.get("unmeasured_mixers"):  # decoder layers mixing by what no capture reads
        report["unmeasured_mixers"] = probe["unmeasured_mixers"]
    return report
