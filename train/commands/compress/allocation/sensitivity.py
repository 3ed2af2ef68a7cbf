"""The loss each choice is predicted to cost, from backward passes on the calibration tokens.

    sens = sensitivity(target, cal, batch_size, grid)   # after calibrate()
    sens.rank_losses((layer, "k"))     # [G, K + 1] predicted loss change per head and rank
    sens.window_losses(layer, W)       # [G] of a window of W keys + the sinks per KV head
    sens.predict(ranks, windows)       # of a whole setting, cross terms included

What is predicted: the expected change of the mean next-token loss when the model's own
predictions are the truth, KL(p || p'), to second order: 1/2 d^T F d, F the Fisher
information of the perturbation d a choice makes (a cache projected to rank r, a head
read through a window). Its Monte-Carlo estimate needs one backward pass per label
sample: labels y_n drawn from the model's own softmax at every position n of a calibration
sequence give gradients whose cross terms between positions have mean zero, so

    E_y[(sum_n grad l_n(y_n) . d)^2] = sum_n E_y[(grad l_n . d)^2] = N d^T F d

and the first-order change X = grad (sum_n l_n) . d of the sequence's summed loss, squared
and averaged over sequences and samples, estimates it without assuming tokens independent.
Each choice's X is linear in its perturbation, so one gradient prices them all:

  low rank r   d = (P_r - I) a per token of a slot's head (a the cached activation, P_r =
               U_r E_r its output-aware projector): with the codes c = E a and h = U^T g
               (g the gradient at a), X(r) = -sum_t sum_{k >= r} h_k c_k, every r at once
  window W     d = P' v - P v per query of each query head of the KV head's group (the
               attention output before W_O, bases/windows.py), X = sum_t g_o . d

A setting's predicted change is mean(X_total^2) / (2 N) with X_total the sum of its
heads' X, so cross terms between heads and layers count; the allocator (allocate.py)
adds the heads' own terms. The prediction is what the measurement is compared with
(agreement.py): it is second order in the perturbation, blind to what a large one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..target.protocol import Target

SAMPLES = 4  # label samples per calibration sequence: backward passes per batch
SEED = 0  # of the label samples


@dataclass
class Record:
    """What one forward pass of the sensitivity pass watched: live tensors (in the
    autograd graph) with the function giving their per-head view [B, G, T, K] (slots) or
    [B, H, T, V] (attention outputs), and the window effects computed beside them."""

    grid: tuple[int, ...] = ()
    slots: dict = field(default_factory=dict)  # slot key -> [(tensor, to_heads)]
    outputs: dict = field(default_factory=dict)  # layer -> (tensor, to_heads)
    effects: dict = field(default_factory=dict)  # layer -> (windows.window_effects, G)

    def slot(self, key, tensor: torch.Tensor, to_heads) -> None:
        if tensor.requires_grad:  # a no-grad recomputation (the window watch) is no use
            self.slots.setdefault(key, []).append((tensor, to_heads))

    def output(self, layer: int, tensor: torch.Tensor, to_heads) -> None:
        if tensor.requires_grad:
            self.outputs[layer] = (tensor, to_heads)

    def live(self) -> list[torch.Tensor]:
        tensors = [t for entries in self.slots.values() for t, _ in entries]
        tensors += [t for t, _ in self.outputs.values()]
        return list({id(t): t for t in tensors}.values())


@dataclass
class Sensitivity:
    """X per (calibration sequence, label sample) row of every choice, and what the
    windows were chosen from."""

    lowrank: dict  # slot key -> [n, G, K + 1]: X at rank r (r = K: 0)
    windows: dict  # (layer, W) -> [n, G]
    kept: dict  # layer -> {W: [H] the attention share the window keeps}
    stats: dict  # layer -> budgets/probe/heads.py head_stats, per query head
    tokens: int  # positions whose loss is predicted (N)
    samples: int
    sequences: int
    seconds: float = 0.0

    @property
    def scale(self) -> float:
        return 1.0 / (2.0 * self.tokens * self.samples)

    def rank_losses(self, key) -> torch.Tensor:
        """[G, K + 1]: each head's own predicted loss change at every rank."""
        return self.lowrank[key].square().sum(0) * self.scale

    def window_losses(self, layer: int, W: int) -> torch.Tensor:
        """[G]: each KV head's own predicted loss change read through a window of W."""
        return self.windows[(layer, W)].square().sum(0) * self.scale

    def predict(self, ranks: dict, windows: dict | None = None) -> float:
        """The predicted loss change of a setting: every slot at its ranks ({key: [r per
        head]}; a windowed head at full width), the windows ({(layer, g): (W, s)}) beside."""
        rows = next(iter(self.lowrank.values())).shape[0]
        total = torch.zeros(rows, dtype=torch.float64)
        for key, X in self.lowrank.items():
            for g, r in enumerate(ranks[key]):
                total += X[:, g, min(r, X.shape[-1] - 1)]
        for (layer, g), (W, _) in (windows or {}).items():
            total += self.windows[(layer, W)][:, g]
        return float(total.square().sum()) * self.scale

    def summary(self) -> dict:
        return {"tokens": self.tokens, "samples": self.samples, "sequences": self.sequences,
                "seconds": self.seconds,
                "what": "KL(p || p') to second order, from the Fisher information of each "
                        "choice's perturbation: labels drawn from the model's own softmax, "
                        "one backward pass per sample"}


def lowrank_changes(a: torch.Tensor, g: torch.Tensor, U: torch.Tensor,
                    E: torch.Tensor | None) -> torch.Tensor:
    """X at every rank [B, G, K + 1] from activations a and their gradients g [B, G, T, K]
    and a basis U (columns) with encoder rows E [G, K, K] (None: U^T)."""
    a64, g64 = a.detach().double().cpu(), g.detach().double().cpu()
    U = U.double()
    E = U.transpose(-1, -2) if E is None else E.double()
    c = torch.einsum("gkj,bgtj->bgtk", E, a64)  # codes
    h = torch.einsum("bgtj,gjk->bgtk", g64, U)  # the gradient along each rebuilt direction
    z = (h * c).sum(2)  # [B, G, K]
    left_out = z.flip(-1).cumsum(-1).flip(-1)  # [B, G, K]: sum over k >= r
    return -torch.cat([left_out, torch.zeros_like(left_out[..., :1])], dim=-1)


def _window_changes(go: torch.Tensor, effects: dict, G: int) -> dict[int, torch.Tensor]:
    """{W: [B, G]} X of each KV head's window from the attention output's gradient
    go [B, H, T, V]: summed over the query heads of its group."""
    go = go.double().cpu()
    B, H = go.shape[:2]
    return {W: (go * d.double().cpu()).sum((2, 3)).view(B, G, H // G).sum(-1)
            for W, d in effects["delta"].items()}


class _Sums:
    """Rows of X and the window statistics, gathered over batches."""

    def __init__(self):
        self.lowrank: dict = {}
        self.windows: dict = {}
        self.kept: dict = {}
        self.stats: dict = {}
        self.weight: dict = {}

    def add_effects(self, record: Record, B: int) -> None:
        """The batch's window statistics, weighted by its B sequences."""
        for layer, (effects, _) in record.effects.items():
            self.weight[layer] = self.weight.get(layer, 0) + B
            kept = self.kept.setdefault(layer, {})
            for W, share in effects["kept"].items():
                kept[W] = kept.get(W, 0) + share * B
            stats = self.stats.setdefault(layer, {})
            for k, v in effects["stats"].items():
                stats[k] = [a + x * B for a, x in
                            zip(stats.get(k, [0.0] * len(v)), v, strict=True)]

    def means(self) -> tuple[dict, dict]:
        """(kept, stats): the statistics' means over the calibration sequences."""
        kept = {layer: {W: s / self.weight[layer] for W, s in v.items()}
                for layer, v in self.kept.items()}
        stats = {layer: {k: [x / self.weight[layer] for x in xs] for k, xs in v.items()}
                 for layer, v in self.stats.items()}
        return kept, stats


def sensitivity(target: Target, cal, batch_size: int, grid: tuple[int, ...] = (),
                samples: int = SAMPLES, seed: int = SEED) -> Sensitivity:
    """X of every slot's ranks and (grid) every KV head's windows, over cal's calibration
    tokens (and labels: the positions whose loss counts), `samples` label draws each."""
    began = time.perf_counter()
    tokens, labels = cal.data, cal.labels
    if tokens is None:
        raise ValueError("the calibration keeps no tokens: calibrate() first")
    where = next(target.model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    sums, N = _Sums(), 0
    for start in range(0, len(tokens), batch_size):
        t = tokens[start:start + batch_size].to(where)
        y = None if labels is None else labels[start:start + batch_size].to(where)
        record = Record(grid)
        with torch.enable_grad(), target.watched(record):
            logits = target.loss_logits(t, y)  # [n, vocab]
        N += logits.shape[0]
        sums.add_effects(record, t.shape[0])
        live = record.live()
        probs = torch.softmax(logits.detach().float(), -1).cpu()
        for s in range(samples):
            draw = torch.multinomial(probs, 1, generator=gen)[:, 0].to(logits.device)
            loss = F.cross_entropy(logits.float(), draw, reduction="sum")
            grads = torch.autograd.grad(loss, live, retain_graph=s + 1 < samples,
                                        allow_unused=True) if live else ()
            _gather(sums, record, cal, {id(x): g for x, g in zip(live, grads, strict=True)})
    missing = [f"{k[1]} of layer {k[0]}" for k in cal.bases if k not in sums.lowrank]
    if missing:
        raise ValueError(f"the sensitivity pass saw no gradient at {', '.join(missing)}: "
                         f"the model's forward did not go where compress watches it")
    kept, stats = sums.means()
    return Sensitivity(
        lowrank={k: torch.cat(v) for k, v in sums.lowrank.items()},
        windows={k: torch.cat(v) for k, v in sums.windows.items()}, kept=kept,
        stats=stats, tokens=N, samples=samples, sequences=len(tokens),
        seconds=time.perf_counter() - began)


def _gather(sums: _Sums, record: Record, cal, grad_of: dict) -> None:
    """One sample's X of every slot and window into sums."""
    for key, entries in record.slots.items():
        X = 0
        for tensor, to_heads in entries:
            g = grad_of.get(id(tensor))
            g = torch.zeros_like(tensor) if g is None else g
            X = X + lowrank_changes(to_heads(tensor), to_heads(g), cal.bases[key],
                                    cal.encoders.get(key))
        sums.lowrank.setdefault(key, []).append(X)
    for layer, (effects, G) in record.effects.items():
        if layer not in record.outputs:
            continue
        tensor, to_heads = record.outputs[layer]
        g = grad_of.get(id(tensor))
        g = torch.zeros_like(tensor) if g is None else g
        for W, X in _window_changes(to_heads(g), effects, G).items():
            sums.windows.setdefault((layer, W), []).append(X)
