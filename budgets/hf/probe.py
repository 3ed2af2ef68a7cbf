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

against caps declared from the layer's kind (AttentionCall.kind: its window, RoPE, sinks,
experts) through attention_budget, the formula zoo's softmax and sliding_window blocks declare
through as well. The entries have probe_model's format, so build_report, to_json,
verdicts and advice work unchanged. Loading a model and cutting the probe batch from a
text are the caller's business (train/hf/__init__.py); tensors are measured on the device
they are on.

What is Hugging Face's own lives here: loading aside, the model's sources (its attention
interface, budgets/hf/capture.py; its Mamba scans, budgets/hf/scans.py; its delta rules'
chunk functions, budgets/hf/delta.py; the mixers read from their forwards,
budgets/hf/hooked.py),
its forward (checked against the model's own: budgets/probe/faithful.py), its output
embeddings, the entry builders per call kind (an attention
layer's projections from budgets/capture/projections.py, found by watching a short forward
rather than from a table per model type; its cache rows) and the eager fallback for
models outside the interface. The measuring itself is budgets/probe/calls.py's
probe_calls, which knows no model library. Inside the interface the function the model
attends through computes P itself, with the layer's scaling, mask, soft-cap and sinks,
and returns P V, so the forward continues as eager attention would. Two ways to measure
P, chosen by the probe length T as probe_model chooses them:

- exact (T < matfree_from): each layer's P [B, H, T, T] is formed and decomposed.
- matrix-free (T >= matfree_from): no [T, T] tensor is formed; the layer is measured from
  its queries and keys (budgets.rank.matfree) and P V is computed a block of rows at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..capture.projections import DISCOVERY_TOKENS, LayerMap, discover
from ..capture.scan import ScanCall
from ..probe.blocks import (
    MATFREE_FROM,
    ProbeProgress,
    final_hidden_metrics,
)
from ..probe.calls import CallProbe, check_layers, probe_calls
from ..probe.entries import attention_entry
from ..probe.faithful import first_change, loss_check, replaying, rng_state
from ..probe.mixing_entry import mixing_entry
from ..probe.places import Running, layer_at_call, mixer_places
from ..probe.streams import MASSIVE_RATIO
from ..rank.matfree import K_MAX
from ..rank.metrics import check_eps
from ..report.captured import captured_report
from .capture import capture
from .delta import capture_delta
from .eager import probe_eager
from .hooked import capture_hooked
from .scans import capture_scans
from .unmeasured import unmeasured_mixers, unmeasured_text


class NoMixers(ValueError):
    """The model shows no attention call and no SSD scan to the capture."""


def _call_probe(model, ids: torch.Tensor, eps: float, asked, with_spectra: bool, k_max: int,
                progress, massive_ratio: float) -> tuple[CallProbe, list[dict]]:
    """The probe of `model`'s attention and SSD mixers (found by a short forward over ids),
    and the decoder layers mixing by anything else; NoMixers when it has neither."""
    model_type = getattr(model.config, "model_type", type(model).__name__)
    maps, at_call = _mixers(model, ids)
    places = mixer_places(model, maps, at_call)
    # layers mixing by anything no source reads (xLSTM's mLSTM, ...)
    unmeasured = unmeasured_mixers(model, [p.name for p in places])
    if not maps:
        mixers = f" (its mixers: {unmeasured_text(unmeasured)})" if unmeasured else ""
        raise NoMixers(f"{model_type}: no layer attends through transformers' attention "
                       f"interface or mixes by a Mamba scan{mixers}, and the model returns "
                       f"no attention probabilities, so the probe cannot read it")
    p = CallProbe(model, maps, eps, BUILDERS, model_type, asked, with_spectra, k_max, progress,
                  massive_ratio, places)
    return p, unmeasured


@dataclass
class SSMMap:
    """One Mamba-2-family mixer, as its scan call showed it."""

    module: nn.Module
    name: str


def hf_layer_maps(model: nn.Module, ids: torch.Tensor) -> list[LayerMap]:
    """Per attention call of `model` on ids [B, T], in order, its layer's projections,
    watched through transformers' attention interface on the first DISCOVERY_TOKENS."""
    return discover(model, lambda: model(input_ids=ids[:, :DISCOVERY_TOKENS], use_cache=False),
                    capture)


def _mixers(model: nn.Module, ids: torch.Tensor
            ) -> tuple[list[LayerMap | SSMMap], list[Running]]:
    """The attention layers (budgets/capture/projections.py) and SSD mixers of `model`, one per
    call, in the order the forward calls them: a block shared by several layers (zamba's
    one attention block) is a mixer at each layer that calls it; beside them, the layer-list
    items running at each call (budgets/probe/places.py: the layer it is made in)."""
    attention: dict[nn.Module, list[LayerMap]] = {}
    for m in hf_layer_maps(model, ids):  # one LayerMap per call, in call order
        attention.setdefault(m.module, []).append(m)
    names = {m: n for n, m in model.named_modules()}
    called: list = []
    with torch.no_grad(), layer_at_call(model) as now:
        def seen(call) -> None:
            called.append((call, now()))
        with (capture(model, seen), capture_scans(model, seen), capture_delta(model, seen),
              capture_hooked(model, seen)):
            model(input_ids=ids[:, :DISCOVERY_TOKENS], use_cache=False)
    found = {"attention": lambda m: attention[m].pop(0) if attention.get(m) else None,
             "scan": lambda m: SSMMap(m, names[m]) if m in names else None,
             # mixers known by their module alone, as an SSD mixer is
             **dict.fromkeys(MIXING_ONLY, lambda m: SSMMap(m, names[m]) if m in names else None)}
    maps = ((found[call.kind_name](call.module), running) for call, running in called)
    kept = [(m, running) for m, running in maps if m is not None]
    return [m for m, _ in kept], [running for _, running in kept]


def _ssm_entry(p: CallProbe, i: int, layer: SSMMap, mixing: dict, x: torch.Tensor,
               call: ScanCall, streams: dict, extras: dict, moe: bool) -> dict:
    """An SSD mixer's entry: its mixing M alone, capped by its state N."""
    extras["kind"] = call.kind(moe)
    params = sum(q.numel() for q in layer.module.parameters())
    extras["not_measured"] = ["the SSD state and the mixer's projections (an SSM layer: its "
                              "mixing alone is measured)"]
    return {
        "layer": i, "name": layer.name, "block": p.block,
        "budget": call.caps(x.shape[1], x.shape[-1], params, p.block).to_dict(),
        "quantities": {q: m for q, (m, _) in mixing.items()},
        **extras,
        "spectra": {q: s for q, (_, s) in mixing.items() if s.numel()},
    }


# call kinds whose layers report their mixing alone (budgets/probe/mixing_entry.py): the
# delta rule, short convolutions, diagonal recurrences, lightning attention
MIXING_ONLY = ("delta", "conv", "recurrence", "lightning")
# per call kind (Mixer.kind_name): the entry of a layer making such calls
BUILDERS = {"attention": attention_entry, "scan": _ssm_entry,
            **dict.fromkeys(MIXING_ONLY, mixing_entry)}


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    logits = logits.float()  # [B, T, vocab]
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten()))


def _sources(matfree: bool) -> list:
    """transformers' attention interface, the Mamba scans, the delta rule's chunk functions
    and the mixers read from their forwards, as probe_calls' sources."""
    return [lambda model, on_call: capture(model, on_call, keep_probs=not matfree,
                                           matfree=matfree),
            capture_scans, capture_delta, capture_hooked]


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
            p, unmeasured = _call_probe(model, ids, eps, layers, with_spectra, k_max,
                                        progress, massive_ratio)
        except NoMixers as e:  # no interface: P from the eager path, if it gives it
            return _probe_eager(model, ids, eps, layers, with_spectra, massive_ratio, e)
        state = rng_state()  # the plain forward replays the captured one's random draws
        final, logits = probe_calls(
            p, lambda: model(input_ids=ids, use_cache=False)["logits"], _sources(matfree),
            model.get_output_embeddings(), matfree)
        loss = _next_token_loss(logits, ids)
        first = {m.module: m.name for m in reversed(p.maps)}  # a module once, first name
        check = _loss_check(model, ids, loss, {n: m for m, n in first.items()},
                            _captured_run(model, ids, matfree, state), state, matfree)
    probe = {"seq_len": T, "eps": float(eps), "batch_size": int(ids.shape[0]),
             "layers": [p.layers[i] for i in p.wanted],
             "final_hidden": final_hidden_metrics(final, eps)}
    if matfree:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    if unmeasured:
        probe["unmeasured_mixers"] = unmeasured
    probe["loss_check"] = check
    return probe, loss


def _captured_run(model, ids: torch.Tensor, matfree: bool, state: dict
                  ) -> Callable[[], object]:
    """The probe's forward under its sources, measuring nothing (first_change's), from
    the random `state` the probe's forward started from."""
    def run():
        with replaying(state), contextlib.ExitStack() as stack:
            for source in _sources(matfree):
                stack.enter_context(source(model, lambda call: None))
            return model(input_ids=ids, use_cache=False)
    return run


def _loss_check(model, ids: torch.Tensor, captured: float, mixers: dict[str, nn.Module],
                run_captured: Callable[[], object], state: dict, long: bool = False) -> dict:
    """budgets/probe/faithful.py's check of the captured loss against the model's own on
    ids (one more forward), `mixers` (name -> module) watched to name a change. `long` (a
    matrix-free probe): the plain forward through transformers' SDPA where the model
    offers it, not the eager path it was loaded with, whose [B, H, T, T] weights are what
    the matrix-free probe exists to avoid."""
    def run_plain():
        with replaying(state), _own_sdpa(model, long):
            return model(input_ids=ids, use_cache=False)

    plain = _next_token_loss(run_plain()["logits"], ids)
    dtype = next(model.parameters()).dtype
    return loss_check(captured, plain, dtype,
                      lambda: first_change(mixers, run_plain, run_captured, dtype))


def _probe_eager(model, ids: torch.Tensor, eps: float, layers, with_spectra: bool,
                 massive_ratio: float, why: NoMixers) -> tuple[dict, float]:
    """probe_hf_model's answer from budgets/hf/eager.py, exact whatever the length."""
    model_type = model.config.model_type
    wanted = check_layers(layers, int(model.config.num_hidden_layers), model_type)
    state = rng_state()  # the plain forward replays the probed one's random draws
    found = probe_eager(model, ids, eps, wanted, massive_ratio)
    if found is None:
        raise why
    entries, final, loss = found
    # no capture ran, but output_attentions may switch what computes: the same check
    def run_probed():
        with replaying(state):
            return model(input_ids=ids, output_attentions=True, use_cache=False)
    check = _loss_check(model, ids, loss, _decoder_layers(model), run_probed, state)
    for layer in entries if not with_spectra else ():
        del layer["spectra"]
    return {"seq_len": int(ids.shape[1]), "eps": float(eps), "batch_size": int(ids.shape[0]),
            "layers": entries, "final_hidden": final_hidden_metrics(final, eps),
            "loss_check": check}, loss


@contextlib.contextmanager
def _own_sdpa(model, wanted: bool):
    """Inside, `model` attends through transformers' SDPA when `wanted` and it was loaded
    eager and supports SDPA (gemma2 and gpt_oss do not: their soft-caps and sinks); its
    implementation restored afterwards."""
    before = model.config._attn_implementation
    if not wanted or before != "eager" or not getattr(model, "_supports_sdpa", False):
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def _decoder_layers(model) -> dict[str, nn.Module]:
    """The items of the model's decoder layer list (its ModuleList of num_hidden_layers
    items), by path."""
    n = getattr(model.config, "num_hidden_layers", None)
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n:
            return {f"{name}.{i}": item for i, item in enumerate(m)}
    return {}


def build_hf_report(name: str, entry: dict, thresholds=None,
                    zoo_blocks: Mapping[str, str] | None = None) -> dict:
    """The report of one HF model's probe entry (budgets/report/kinds.py captured_report),
    titled by its model type."""
    return captured_report(name, entry, f"{name} ({entry['source']['model_type']})",
                           thresholds, zoo_blocks)
