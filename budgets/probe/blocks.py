"""Probes: measure the rank each block of a model really uses, on one fixed batch.

budgets knows nothing of zoo: a *probeable block* is any submodule that offers the probe
methods of the block contract (zoo/block.py), found by duck typing. The probe runs the
model once to capture each block's input, then asks each block for the matrices whose
rank it declared a budget for:

    mixing_matrices(x)        [B, H, T, T]    -> mixing, mixing_centered, past_future,
                                                 past_future_lengths, heads
    weight_matrices()         {name: [..., m, n]}            -> e.g. qk, value
    inference_state(cache)    {name: [B, ..., m, n]}         -> inference.<name>
    key_value_heads(x)        optional: {"k", "v", "k_pre_rope"} [B, G, T, K] -> kv_heads

Metrics are computed per sample and averaged over the batch afterwards: an SVD of the
batch-averaged matrix would measure a blurred pattern no sample ever used (and usually
reads lower rank); rank_eps_max keeps the largest sample's value beside the mean. The
residual stream entering each layer (the input of the nn.ModuleList item holding the
block) is measured too, with its massive-activation tokens (budgets/probe/streams.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..rank.adapters import adapter_ranks
from ..rank.attention_ranks import attention_metrics
from ..rank.matfree import K_MAX, AttentionMixing, CenteredOperator, block_metrics
from ..rank.metrics import (
    METRICS,
    check_eps,
    singular_value_pair,
    singular_values,
    spectrum_metrics,
)
from .heads import energy_share, head_stats, head_stats_operator, undefined_head_stats
from .inputs import module_inputs
from .streams import MASSIVE_RATIO, kv_head_figures, residual_figures

# From this probe length on, mixing is measured matrix-free (budgets/rank/matfree.py) for blocks
# that offer `mixing_operator(x)`: a [B, H, T, T] tensor at T = 2048 is 16 MiB per head and
# its exact spectra cost T^3 each. Override with probe_model(..., matfree_from=...).
MATFREE_FROM = 2048
# past_future_lengths: the prefixes T/4, T/2, T measured, those shorter than this left out
# (a past->future block of 4 x 4 says nothing about growth with T)
PREFIX_FROM = 8


@dataclass(frozen=True)
class ProbeProgress:
    """Where a probe stands, given to its `progress` callback after each measured layer."""

    layer: int  # the layer just measured (index into the model's layers)
    done: int  # layers measured so far
    total: int  # layers this probe measures
    elapsed: float  # seconds since the probe started (the forward pass included)

    @property
    def eta(self) -> float:
        """Seconds left, at the mean pace so far."""
        return self.elapsed / self.done * (self.total - self.done)


PROBE_METHODS = ("budget", "mixing_matrices", "weight_matrices", "init_cache", "inference_state")


def is_probeable(module) -> bool:
    return all(callable(getattr(module, name, None)) for name in PROBE_METHODS)


def probeable_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Probeable submodules in named_modules() order, not descending into a block's children."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name == p or name.startswith(p + ".") or p == "" for p, _ in found):
            continue  # inside a block already found (a block may be built of blocks)
        if is_probeable(module):
            found.append((name, module))
    return found


def matrix_figures(A: torch.Tensor, eps: float, center: bool = False, batch_dims: int = 0):
    """The rank metrics (lists of floats) and mean spectrum [n, k] of matrices A [..., m, n]
    (centered over rows with `center`), averaged over `batch_dims`.

    The leading dims after the averaged ones are flattened, so one 2-D matrix gives lists
    of length 1 and [B, H, T, T] with batch_dims=1 gives lists of length H.
    """
    s = singular_values(A, center=center)  # [..., k], the one SVD per quantity
    return summarize_spectrum(s, tuple(A.shape[-2:]), eps, batch_dims)


def summarize_spectrum(s: torch.Tensor, shape: tuple[int, int], eps: float,
                       batch_dims: int = 0):
    """What matrix_figures() returns, from singular values s [..., k] of matrices of
    `shape` (m, n):
    METRICS averaged over the batch dims, "rank_eps_max" (the largest sample's rank_eps)
    and "shape" [m, n]."""
    metrics = spectrum_metrics(s, shape, eps)
    dims = tuple(range(batch_dims))
    rank_max = metrics["rank_eps"]
    if dims:
        rank_max = rank_max.amax(dims)
        metrics = {k: v.mean(dims) for k, v in metrics.items()}
        s = s.mean(dims)
    metrics["rank_eps_max"] = rank_max
    values = {k: [float(x) for x in v.reshape(-1).cpu()] for k, v in metrics.items()}
    values["shape"] = [int(shape[0]), int(shape[1])]
    return values, s.reshape(-1, s.shape[-1]).cpu()


FINAL = "<final>"  # _capture_inputs' key for the input of the model's output head
HEAD_NAMES = ("head", "lm_head")  # where a language model keeps its output projection


def output_head(model: nn.Module) -> nn.Module | None:
    """The model's output head (`head` or `lm_head`), whose input is the final hidden state."""
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    return None


def residual_owner(model: nn.Module, name: str) -> str | None:
    """The name of the module whose input is the residual stream entering the block `name`:
    the nearest of the block and its ancestors that is an item of an nn.ModuleList (a
    decoder's layer: norm -> block -> add); None when there is none."""
    parts = name.split(".") if name else []
    for n in range(len(parts), 0, -1):
        if isinstance(model.get_submodule(".".join(parts[:n - 1])), nn.ModuleList):
            return ".".join(parts[:n])
    return None


def _capture_inputs(model: nn.Module, blocks, batch) -> dict[str, torch.Tensor]:
    """Run model(batch) once, recording the first input x [B, T, D] of each block, of each
    block's residual owner (residual_owner), and the output head's under FINAL when the
    model has one."""
    head = output_head(model)
    names = {n for n, _ in blocks}
    owners = sorted({residual_owner(model, n) for n in names} - names - {None})
    watched = {**dict(blocks), **{o: model.get_submodule(o) for o in owners},
               **({FINAL: head} if head is not None else {})}
    # clone: the model may update x in place
    with module_inputs(watched, first=True, clone=True) as inputs:
        model(batch)
    missing = [n for n, _ in blocks if n not in inputs]
    if missing:
        raise ValueError(f"{type(model).__name__}(batch) never called the probeable blocks "
                         f"{missing} with a tensor input")
    return inputs


def _mixing_quantities(block, x: torch.Tensor, eps: float, matfree_from: int | None,
                       k_max: int) -> tuple[dict, dict]:
    """(mixing quantities, the layer's past_future_lengths and heads) of one block."""
    if (matfree_from is not None and x.shape[1] >= matfree_from
            and callable(getattr(block, "mixing_operator", None))):
        mixing = block.mixing_operator(x)
        if mixing is not None:  # else the block has no matrix-free form (MoE's routing)
            # the prefix's operator from the block itself: a causal block's mixing on the
            # first t tokens is its whole matrix's corner, for factored blocks too
            return mixing_figures_matfree(mixing, eps, k_max,
                                          prefix=lambda t: block.mixing_operator(x[:, :t]))
    P = block.mixing_matrices(x)
    B, T = x.shape[0], x.shape[1]
    if P.dim() != 4 or P.shape[0] != B or P.shape[-2:] != (T, T):
        raise ValueError(f"{type(block).__name__}.mixing_matrices(x) must return [B, H, T, T] = "
                         f"[{B}, H, {T}, {T}], got {tuple(P.shape)}")
    return mixing_figures(P, eps)


def _measure_mixing(P: torch.Tensor, eps: float) -> tuple[dict, torch.Tensor]:
    """(the raw, centered and past->future metrics of mixing matrices P [B, H, T, T], per
    head; the centered energy share [B, H] from the same spectra: ||P_c||_F^2 / ||P||_F^2
    = sum s_c^2 / sum s^2, at no extra cost)."""
    T = P.shape[-1]
    h = T // 2  # the past->future block M[T/2:, :T/2] that the mixing budget caps
    s, s_c = singular_value_pair(P)  # [B, H, T] each, from one Gram and one eigensolver batch
    quantities = {
        "mixing": summarize_spectrum(s, (T, T), eps, batch_dims=1),
        "mixing_centered": summarize_spectrum(s_c, (T, T), eps, batch_dims=1),
        "past_future": matrix_figures(P[..., h:, :h], eps, batch_dims=1),
    }
    return quantities, energy_share(s_c.double().square().sum(-1), s.double().square().sum(-1))


def prefix_lengths(T: int) -> list[int]:
    """The prefix lengths past_future_lengths measures: T/4, T/2 and T, from PREFIX_FROM."""
    return sorted({t for t in (T // 4, T // 2, T) if t >= PREFIX_FROM})


def _length_entry(t: int, values: dict) -> dict:
    return {"seq_len": t, "rank_eps": values["rank_eps"], "rank_eps_max": values["rank_eps_max"],
            "lower_bound": any(values.get("rank_eps_bound") or ())}


def mixing_figures(P: torch.Tensor, eps: float, signed: bool = False) -> tuple[dict, dict]:
    """(the raw, centered and past->future metrics per head, {"past_future_lengths",
    "heads"}) of mixing matrices P [B, H, T, T]. A causal block's mixing on the prefix of
    length t is P's top-left t x t corner, so the past->future block at t is
    P[t/2:t, :t/2]: no second forward. `signed` (entries of either sign, rows not summing
    to 1: differential attention): the raw and past->future metrics alone, the heads'
    masses null (budgets/probe/signed.py)."""
    if signed:  # no centering: it removes the all-ones direction of rows summing to 1
        h, centered_energy = P.shape[-1] // 2, None
        quantities = {q: matrix_figures(A, eps, batch_dims=1)
                      for q, A in (("mixing", P), ("past_future", P[..., h:, :h]))}
    else:
        quantities, centered_energy = _measure_mixing(P, eps)
    T = P.shape[-1]
    lengths = []
    for t in prefix_lengths(T):
        values = quantities["past_future"][0] if t == T else matrix_figures(
            P[..., t // 2:t, :t // 2], eps, batch_dims=1)[0]
        lengths.append(_length_entry(t, values))
    stats = undefined_head_stats(P.shape[1]) if signed else head_stats(P, centered_energy)
    heads = {**stats, "raw_erank": quantities["mixing"][0]["erank"]}
    return quantities, {"past_future_lengths": lengths, "heads": heads}


def _per_head(metrics: dict[str, torch.Tensor], shape: tuple[int, int]):
    """Matrix-free metrics [B, H] -> (per-head lists averaged over the batch, NaN -> None;
    an undecided rank_eps reads as its lower bound + 1 and is flagged in `rank_eps_bound`;
    rank_eps_max is the largest sample's, bounds included)."""
    above = metrics.pop("rank_eps_above")
    bound = ~above.isnan()
    metrics["rank_eps"] = torch.where(bound, above + 1, metrics["rank_eps"])
    metrics["rank_eps_bound"] = bound.double()
    metrics["rank_eps_max"] = metrics["rank_eps"].double().amax(0, keepdim=True)  # [1, H]
    values = {}
    for name, v in metrics.items():
        mean = v.double().mean(0)  # NaN in any sample: not measured for that head
        values[name] = [None if x != x else float(x) for x in mean.cpu()]
    values["shape"] = [int(shape[0]), int(shape[1])]
    return values


def _matfree_quantity(block, eps: float, k_max: int) -> tuple[dict, torch.Tensor]:
    return _matfree_values(block_metrics(block, eps, k_max), block.shape)


def _matfree_values(m: dict[str, torch.Tensor], shape) -> tuple[dict, torch.Tensor]:
    # matrix-free quantities keep no spectrum (an empty one)
    return _per_head(m, shape), m["sigma_1"].new_zeros(0, 1).cpu()


def _measure_matfree(mixing, eps: float, k_max: int, lengths: list[int]):
    """(quantities, {t: past_future values at prefix length t < T}, the whole matrix's
    operator or None, its centered form or None). Softmax mixing: every block from shared
    passes over its scores (attention_metrics); factored mixing: its past->future block."""
    if not isinstance(mixing, AttentionMixing):
        return {"past_future": _matfree_quantity(mixing.past_future(), eps, k_max)}, {}, \
            None, None
    m = attention_metrics(mixing, eps, k_max, tuple(lengths))
    full, T = mixing.full(), mixing.seq_len  # the operator attention_metrics made
    quantities = {q: _matfree_values(m[q], s) for q, s in (
        ("past_future", (T - T // 2, T // 2)), ("mixing", full.shape),
        ("mixing_centered", full.shape))}
    at = {t: _per_head(v, (t - t // 2, t // 2)) for t, v in m["lengths"].items()}
    return quantities, at, full, CenteredOperator(full)


def mixing_figures_matfree(mixing, eps: float, k_max: int = K_MAX,
                           prefix: Callable[[int], object] | None = None
                           ) -> tuple[dict, dict]:
    """mixing_figures without a [T, T] tensor, for an AttentionMixing or FactoredMixing:
    past_future always, mixing and mixing_centered when the whole matrix is an operator.

    past_future_lengths: at t < T the past->future block of the mixing of the first t
    tokens: for softmax mixing the corner of its one matrix (causal: the same as `prefix`
    would give); else of `prefix(t)` (lengths with no prefix are left out); "lower_bound"
    when a head's rank_eps there is undecided. heads from the operator
    (budgets/probe/heads.py); null for factored mixing, known only by its past->future
    factors; raw_erank null wherever the subspace missed part of the energy."""
    T = mixing.seq_len
    shorter = [t for t in prefix_lengths(T) if t < T]
    quantities, at, full, centered = _measure_matfree(mixing, eps, k_max, shorter)
    prefix = prefix or getattr(mixing, "prefix", None)
    lengths = []
    for t in prefix_lengths(T):
        if t == T:
            values = quantities["past_future"][0]
        elif t in at:
            values = at[t]
        elif prefix is not None:
            values = _matfree_quantity(prefix(t).past_future(), eps, k_max)[0]
        else:
            continue
        lengths.append(_length_entry(t, values))
    n_heads = len(quantities["past_future"][0]["rank_eps"])
    if full is None:
        heads = {**undefined_head_stats(n_heads), "raw_erank": [None] * n_heads}
    else:
        heads = {**head_stats_operator(full, centered),
                 "raw_erank": quantities["mixing"][0]["erank"]}
    return quantities, {"past_future_lengths": lengths, "heads": heads}


def _inference_quantities(block, x: torch.Tensor, eps: float) -> dict:
    # A fresh cache filled by one prefill of the probe batch: the state at length T.
    cache = block.init_cache(x.shape[0], x.shape[1])
    block(x, cache=cache)
    out = {}
    for name, S in block.inference_state(cache).items():
        if S.dim() < 3:
            raise ValueError(f"{type(block).__name__}.inference_state()[{name!r}] must be "
                             f"[B, ..., m, n], got {tuple(S.shape)}")
        out[f"inference.{name}"] = matrix_figures(S, eps, batch_dims=1)
    return out


def stream_figures(x: torch.Tensor, residual: torch.Tensor | None, eps: float,
                   ratio: float = MASSIVE_RATIO) -> tuple[tuple, dict | None]:
    """(hidden_centered of a block's input x [B, T, D], residual_figures of the stream
    entering its layer or None): both spectra in one call, so that on the CPU the two
    matrices of a one-sample probe run on two threads."""
    if residual is not None and residual.dim() > 3:  # n residual streams (hyper-connections)
        residual = residual.flatten(2)  # [B, T, n * D]: a token's norm over all its streams
    if residual is None or residual.shape != x.shape:
        hidden = matrix_figures(x.float(), eps, center=True, batch_dims=1)
        return hidden, None if residual is None else residual_figures(residual, eps, ratio)
    s = singular_values(torch.stack([x.float(), residual.float()]), center=True)  # [2, B, k]
    hidden = summarize_spectrum(s[0], tuple(x.shape[-2:]), eps, batch_dims=1)
    return hidden, residual_figures(residual, eps, ratio, centered_values=s[1])


def kv_heads_of(block, x: torch.Tensor, eps: float) -> dict | None:
    """kv_head_figures of the block's optional `key_value_heads(x)`; None without one."""
    if not callable(getattr(block, "key_value_heads", None)):
        return None
    return kv_head_figures(block.key_value_heads(x), eps)


def _probe_block(name: str, block, x: torch.Tensor, eps: float, matfree_from: int | None = None,
                 k_max: int = K_MAX, residual: torch.Tensor | None = None,
                 massive_ratio: float = MASSIVE_RATIO) -> dict:
    measured, extras = _mixing_quantities(block, x, eps, matfree_from, k_max)
    for wname, W in block.weight_matrices().items():
        if wname in measured:
            raise ValueError(f"{type(block).__name__}.weight_matrices() uses the reserved "
                             f"name {wname!r}")
        measured[wname] = matrix_figures(W, eps)  # no batch dim: one entry per leading index
    measured.update(_inference_quantities(block, x, eps))
    # the hidden states the block reads (its layer's pre-norm applied), centered over
    # tokens: their erank falling toward 1 with depth is token collapse (Dong et al.
    # 2021); info-only, no cap. Beside them the residual stream they were normed from.
    measured["hidden_centered"], stream = stream_figures(x, residual, eps, massive_ratio)
    layer = {
        "name": name,
        "block": getattr(block, "kind", "") or type(block).__name__,
        "budget": block.budget(int(x.shape[1])).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        **extras,
    }
    if stream is not None:
        layer["residual"] = stream
    kv = kv_heads_of(block, x, eps)
    if kv is not None:
        layer["kv_heads"] = kv
    layer["spectra"] = {q: s for q, (_, s) in measured.items()}
    add_adapters(layer, block, eps)  # LoRA pairs on the block's projections, if any
    return layer


def add_adapters(layer: dict, module: nn.Module, eps: float) -> None:
    """Account the LoRA pairs found in `module` on a layer entry (probe format): one row
    each, capped by its own r, and the layer's adapter cap the sum of them (a block's
    config knows no adapters; the pairs attached to it declare them)."""
    adapters = adapter_ranks(module, eps)
    if not adapters:
        return
    layer["budget"]["adapter"] = max(layer["budget"].get("adapter", 0),
                                     sum(a["declared"] for a in adapters))
    layer["adapters"] = [{k: v for k, v in a.items() if k != "spectrum"} for a in adapters]
    layer["spectra"].update({f"adapter.{a['module']}.{a['adapter']}":
                             torch.tensor([a["spectrum"]]) for a in adapters})


def probe_model(model: nn.Module, batch, eps: float = 0.1, with_spectra: bool = False,
                matfree_from: int | None = MATFREE_FROM, k_max: int = K_MAX,
                progress: Callable[[ProbeProgress], None] | None = None,
                massive_ratio: float = MASSIVE_RATIO) -> dict:
    """Realized ranks of every probeable block of `model` on `batch` (see module docstring).

    Returns {"seq_len": T, "eps": eps, "batch_size": B, "layers": [{"layer", "name",
    "block", "budget", "quantities": {quantity: {metric: [float per head], "rank_eps_max",
    "shape"}}, "past_future_lengths", "heads", "residual" (when the block sits in an
    nn.ModuleList), "kv_heads" (blocks with key_value_heads)}]} (docs/METRICS.md),
    JSON-serializable unless with_spectra=True adds "spectra": {quantity: mean singular
    values [heads, k]} per layer. Massive activations: residual tokens with norm above
    massive_ratio x the layer's median.
    The model runs in eval mode under no_grad; every module's training flag is restored.
    From T >= matfree_from (None: never) blocks with `mixing_operator(x)` are measured
    matrix-free (mixing_figures_matfree; rank_eps decided up to k_max values) and the probe
    says so in "matfree": {"from": matfree_from, "k_max": k_max}. `progress` is called
    with a ProbeProgress after each block.
    """
    check_eps(eps)  # before the forward pass, so a bad eps costs nothing
    blocks = probeable_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no probeable blocks (submodules with "
                         f"{', '.join(PROBE_METHODS)})")
    start = time.perf_counter()
    modes = {m: m.training for m in model.modules()}
    model.eval()  # no dropout: the probe must measure the deterministic function
    try:
        with torch.no_grad():
            inputs = _capture_inputs(model, blocks, batch)
            layers = []
            for i, (name, block) in enumerate(blocks):
                owner = residual_owner(model, name)
                residual = None if owner is None else inputs.get(owner)
                layer = {"layer": i, **_probe_block(name, block, inputs[name], eps,
                                                    matfree_from, k_max, residual,
                                                    massive_ratio)}
                if progress is not None:
                    progress(ProbeProgress(i, i + 1, len(blocks), time.perf_counter() - start))
                if not with_spectra:
                    del layer["spectra"]
                layers.append(layer)
    finally:
        for m, mode in modes.items():
            m.training = mode
    B, T = (int(n) for n in inputs[blocks[0][0]].shape[:2])
    probe = {"seq_len": T, "eps": float(eps), "batch_size": B, "layers": layers}
    if matfree_from is not None and matfree_from <= T:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    if FINAL in inputs:
        probe["final_hidden"] = final_hidden_metrics(inputs[FINAL], eps)
    return probe


def final_hidden_metrics(h: torch.Tensor, eps: float) -> dict[str, float]:
    """Metrics of the final hidden states h [B, T, D] pooled over all B*T tokens and
    centered: the rank of the representation the output head reads (on data of low
    intrinsic rank, such as train's Markov language, a trained model keeps it low)."""
    values, _ = matrix_figures(h.reshape(-1, h.shape[-1]).float(), eps, center=True)  # [B*T, D]
    return {k: values[k][0] for k in METRICS}
