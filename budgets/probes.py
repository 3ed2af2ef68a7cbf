"""Probes: measure the rank each block of a model really uses, on one fixed batch.

budgets knows nothing of zoo: a *probeable block* is any submodule that offers the probe
methods of the block contract (zoo/block.py), found by duck typing. The probe runs the
model once to capture each block's input, then asks each block for the matrices whose
rank it declared a budget for:

    mixing_matrices(x)        [B, H, T, T]    -> mixing, mixing_centered, past_future
    weight_matrices()         {name: [..., m, n]}            -> e.g. qk, value
    inference_state(cache)    {name: [B, ..., m, n]}         -> inference.<name>

Metrics are computed per sample and averaged over the batch afterwards: an SVD of the
batch-averaged matrix would measure a blurred pattern no sample ever used (and usually
reads lower rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .adapters import adapter_ranks
from .matfree import K_MAX, CenteredOperator, block_metrics
from .metrics import check_eps, singular_values, spectrum_metrics

# From this probe length on, mixing is measured matrix-free (budgets/matfree.py) for blocks
# that offer `mixing_operator(x)`: a [B, H, T, T] tensor at T = 2048 is 16 MiB per head and
# its exact spectra cost T^3 each. Override with probe_model(..., matfree_from=...).
MATFREE_FROM = 2048


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


def measure(A: torch.Tensor, eps: float, center: bool = False, batch_dims: int = 0):
    """Metrics (lists of floats) and mean spectrum [n, k] of A, averaged over `batch_dims`.

    The leading dims after the averaged ones are flattened, so one 2-D matrix gives lists
    of length 1 and [B, H, T, T] with batch_dims=1 gives lists of length H.
    """
    s = singular_values(A, center=center)  # [..., k], the one SVD per quantity
    return summarize_spectrum(s, tuple(A.shape[-2:]), eps, batch_dims)


def summarize_spectrum(s: torch.Tensor, shape: tuple[int, int], eps: float,
                       batch_dims: int = 0):
    """What measure() returns, from singular values s [..., k] of matrices of `shape` (m, n)."""
    metrics = spectrum_metrics(s, shape, eps)
    dims = tuple(range(batch_dims))
    if dims:
        metrics = {k: v.mean(dims) for k, v in metrics.items()}
        s = s.mean(dims)
    values = {k: [float(x) for x in v.reshape(-1).cpu()] for k, v in metrics.items()}
    return values, s.reshape(-1, s.shape[-1]).cpu()


FINAL = "<final>"  # _capture_inputs' key for the input of the model's output head
HEAD_NAMES = ("head", "lm_head")  # where a language model keeps its output projection


def output_head(model: nn.Module) -> nn.Module | None:
    """The model's output head (`head` or `lm_head`), whose input is the final hidden state."""
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    return None


def _capture_inputs(model: nn.Module, blocks, batch) -> dict[str, torch.Tensor]:
    """Run model(batch) once, recording each block's first input x [B, T, D], and the
    output head's input under FINAL when the model has one."""
    inputs: dict[str, torch.Tensor] = {}

    def hook_for(name):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("x")
            if name not in inputs and isinstance(x, torch.Tensor):
                inputs[name] = x.detach().clone()  # clone: the model may update x in place
        return hook

    head = output_head(model)
    watched = [*blocks, *([(FINAL, head)] if head is not None else [])]
    handles = [m.register_forward_pre_hook(hook_for(n), with_kwargs=True) for n, m in watched]
    try:
        model(batch)
    finally:
        for h in handles:
            h.remove()
    missing = [n for n, _ in blocks if n not in inputs]
    if missing:
        raise ValueError(f"{type(model).__name__}(batch) never called the probeable blocks "
                         f"{missing} with a tensor input")
    return inputs


def _mixing_quantities(block, x: torch.Tensor, eps: float, matfree_from: int | None,
                       k_max: int) -> dict:
    if (matfree_from is not None and x.shape[1] >= matfree_from
            and callable(getattr(block, "mixing_operator", None))):
        mixing = block.mixing_operator(x)
        if mixing is not None:  # else the block has no matrix-free form (MoE's routing)
            return measure_mixing_matfree(mixing, eps, k_max)
    P = block.mixing_matrices(x)
    B, T = x.shape[0], x.shape[1]
    if P.dim() != 4 or P.shape[0] != B or P.shape[-2:] != (T, T):
        raise ValueError(f"{type(block).__name__}.mixing_matrices(x) must return [B, H, T, T] = "
                         f"[{B}, H, {T}, {T}], got {tuple(P.shape)}")
    return measure_mixing(P, eps)


def measure_mixing(P: torch.Tensor, eps: float) -> dict:
    """Raw, centered and past->future metrics of mixing matrices P [B, H, T, T], per head."""
    h = P.shape[-1] // 2  # the past->future block M[T/2:, :T/2] that the mixing budget caps
    return {
        "mixing": measure(P, eps, batch_dims=1),
        "mixing_centered": measure(P, eps, center=True, batch_dims=1),
        "past_future": measure(P[..., h:, :h], eps, batch_dims=1),
    }


def _per_head(metrics: dict[str, torch.Tensor]):
    """Matrix-free metrics [B, H] -> (per-head lists averaged over the batch, NaN -> None;
    an undecided rank_eps reads as its lower bound + 1 and is flagged in `rank_eps_bound`)."""
    above = metrics.pop("rank_eps_above")
    bound = ~above.isnan()
    metrics["rank_eps"] = torch.where(bound, above + 1, metrics["rank_eps"])
    metrics["rank_eps_bound"] = bound.double()
    values = {}
    for name, v in metrics.items():
        mean = v.double().mean(0)  # NaN in any sample: not measured for that head
        values[name] = [None if x != x else float(x) for x in mean.cpu()]
    return values


def measure_mixing_matfree(mixing, eps: float, k_max: int = K_MAX) -> dict:
    """The quantities of measure_mixing, without a [T, T] tensor: past_future always,
    mixing and mixing_centered when the block's whole matrix is an operator."""
    blocks = {"past_future": mixing.past_future()}
    full = mixing.full()
    if full is not None:
        blocks.update(mixing=full, mixing_centered=CenteredOperator(full))
    out = {}
    for quantity, block in blocks.items():
        m = block_metrics(block, eps, k_max)
        out[quantity] = (_per_head(m), m["sigma_1"].new_zeros(0, 1).cpu())
    return out


def _inference_quantities(block, x: torch.Tensor, eps: float) -> dict:
    # A fresh cache filled by one prefill of the probe batch: the state at length T.
    cache = block.init_cache(x.shape[0], x.shape[1])
    block(x, cache=cache)
    out = {}
    for name, S in block.inference_state(cache).items():
        if S.dim() < 3:
            raise ValueError(f"{type(block).__name__}.inference_state()[{name!r}] must be "
                             f"[B, ..., m, n], got {tuple(S.shape)}")
        out[f"inference.{name}"] = measure(S, eps, batch_dims=1)
    return out


def _probe_block(name: str, block, x: torch.Tensor, eps: float, matfree_from: int | None = None,
                 k_max: int = K_MAX) -> dict:
    measured = _mixing_quantities(block, x, eps, matfree_from, k_max)
    for wname, W in block.weight_matrices().items():
        if wname in measured:
            raise ValueError(f"{type(block).__name__}.weight_matrices() uses the reserved "
                             f"name {wname!r}")
        measured[wname] = measure(W, eps)  # no batch dim: one entry per leading index
    measured.update(_inference_quantities(block, x, eps))
    # the hidden states the block reads (its layer's pre-norm applied), centered over
    # tokens: their erank falling toward 1 with depth is token collapse (Dong et al.
    # 2021); info-only, no cap
    measured["hidden_centered"] = measure(x.float(), eps, center=True, batch_dims=1)
    layer = {
        "name": name,
        "block": getattr(block, "kind", "") or type(block).__name__,
        "budget": block.budget(int(x.shape[1])).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        "spectra": {q: s for q, (_, s) in measured.items()},
    }
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
                progress: Callable[[ProbeProgress], None] | None = None) -> dict:
    """Realized ranks of every probeable block of `model` on `batch` (see module docstring).

    Returns {"seq_len": T, "eps": eps, "layers": [{"layer", "name", "block", "budget",
    "quantities": {quantity: {metric: [float per head]}}}]}, JSON-serializable unless
    with_spectra=True adds "spectra": {quantity: mean singular values [heads, k]} per layer.
    The model runs in eval mode under no_grad; every module's training flag is restored.
    From T >= matfree_from (None: never) blocks with `mixing_operator(x)` are measured
    matrix-free (measure_mixing_matfree; rank_eps decided up to k_max values) and the probe
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
                layer = {"layer": i, **_probe_block(name, block, inputs[name], eps,
                                                    matfree_from, k_max)}
                if progress is not None:
                    progress(ProbeProgress(i, i + 1, len(blocks), time.perf_counter() - start))
                if not with_spectra:
                    del layer["spectra"]
                layers.append(layer)
    finally:
        for m, mode in modes.items():
            m.training = mode
    T = int(inputs[blocks[0][0]].shape[1])
    probe = {"seq_len": T, "eps": float(eps), "layers": layers}
    if matfree_from is not None and matfree_from <= T:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    if FINAL in inputs:
        probe["final_hidden"] = final_hidden_metrics(inputs[FINAL], eps)
    return probe


def final_hidden_metrics(h: torch.Tensor, eps: float) -> dict[str, float]:
    """Metrics of the final hidden states h [B, T, D] pooled over all B*T tokens and
    centered: the rank of the representation the output head reads (on data of low
    intrinsic rank, such as train's Markov language, a trained model keeps it low)."""
    values, _ = measure(h.reshape(-1, h.shape[-1]).float(), eps, center=True)  # [B*T, D]
    return {k: v[0] for k, v in values.items()}
