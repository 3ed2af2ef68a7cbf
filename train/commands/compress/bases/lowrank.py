"""Low-rank caches fitted on calibration activations: bases, projections, bytes, allocation.

    stats = SlotStats(slot); stats.add(a)        # a [B, G, T, K]: what one cache slot holds
    U, energy = stats.basis()                     # [G, K, K] columns by energy, [G, K]
    P = projectors(U, ranks)                      # [G, K, K]: U_r U_r^T per head
    project_rows(W, P)                            # W [G*K, D] -> per head P_g W_g
    cache_bytes(slots, ranks, nbytes, T)          # the cache at those ranks, per token at T
    uniform_ranks / greedy_ranks / eps_ranks      # ranks for a target ratio, or an eps
    stats.add_weight(w); U, E, gain = stats.output_basis()   # output-aware: P = U_r E_r

A *slot* is one cached matrix kind of one layer, held per head: the keys or the values of
each KV head (width K, V), MLA's latent (one head of width R), the recurrent state of
linear attention (per head, its F feature rows) or of an SSM (per B/C group, its N rows).
Its basis per head is the top right singular vectors of the calibration activations
stacked over every token [sum T, K], *uncentered*: a cache stores the activation itself,
not its deviation from a mean. They come from the Gram matrix A^T A accumulated in fp64
(K x K per head), whose eigenvectors they are and whose eigenvalues are the energies the
greedy allocation weighs.

Projecting the activation a onto the top r directions, a -> U_r U_r^T a, is exactly what
a cache storing the r codes U_r^T a per token and rebuilding U_r codes produces. Where the
activation is linear in the weights (a = W x + b), projecting W and b does the same:
W -> U_r U_r^T W, b -> U_r U_r^T b, per head (project_rows). For keys with RoPE the
projection acts on the keys before the rotation, which the model then applies to the
rebuilt keys.

Output-aware bases (the default of `rankzoo compress`) weigh the error as its reader sees
it: a slot with a weight W [G, K, K] (readout.py: keys by the
queries that read them, values by W_O and the attention, each scaled to the squared error
it adds to the layer's output per token) keeps the rank-r projector minimizing the weighted error
tr(W (I - P) C (I - P)^T), C the activations' second moment per token: with S = W^(1/2),
the top eigenvectors Q of S C S give U = S^-1 Q (rebuilt directions) and E = Q^T S
(encoder rows), P = U_r E_r, and the eigenvalues (gain) are the output error each
direction removes (docs/METRICS.md).

Bytes follow the KV advice (budgets/cache.py lowrank_cache_bytes, one formula): per
token, the r codes of every head of every slot at the cache dtype, plus each basis
(width x r) once per sequence, amortized at a stated length T; a full cache holds every
width. A sliding window's slot holds min(W, T) tokens of a sequence of T, so its bytes per
token at T are that share of a full slot's. A state slot (a fixed-size recurrent state,
not one entry per token) keeps per sequence `columns` elements per kept direction plus
its basis; its bytes per token at T are those of one sequence of T tokens divided by T.
Ratio = full / low-rank, both at T.

Two cost models (`shared`): a per-sequence basis (an online basis fitted on each
sequence, the report's KV advice) is paid once per sequence, amortized at T; a shared basis
fitted once on calibration data (`rankzoo compress`) is a weight: its bytes are paid once
per model, beside the cache, and the cache per token holds the codes alone.

Allocations (each returns {slot key: [r per head]}):
  uniform_ranks(slots, target)   the largest one r for every head and slot (capped at
                                 each width) whose ratio reaches the target
  greedy_ranks(slots, gains, target, shares)
                                 every head from r = 1 up, one direction at a time, the
                                 one that adds the most gain per byte while the bytes fit
                                 full / target: each gain as a share of its head's total
                                 (shares=True, compress's greedy), or as it is
                                 (shares=False, greedy-scaled: output-aware gains on one
                                 scale over slots and layers)
  eps_ranks(stats, eps)          per slot and head, rank_eps_pooled at eps (the report's
                                 advised figure: every calibration sequence stacked)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from budgets.cache import CostModel, cache_per_token, full_cache_bytes, lowrank_cache_bytes
from budgets.rank.metrics import check_eps, gram_rank_eps, singular_values, spectrum_metrics

from .readout import weighted_basis


@dataclass(frozen=True)
class Slot:
    """One cached matrix kind of one layer, per head."""

    layer: int
    kind: str  # "k" (keys, before RoPE where there is RoPE), "v", "latent", "state"
    heads: int  # G: matrices that each get a basis of their own
    width: int  # K: the dimension a basis lives in
    # state slots: elements one kept direction holds per sequence (linear attention: V + 1
    # columns of the state; an SSM group: P columns of each of its heads); None: a slot
    # that caches one code per token and kept direction
    columns: int | None = None
    fixed_per_token: int = 0  # elements cached in full beside, per token (MLA's RoPE key)
    # ... per sequence (an SSM's conv state; beside a hybrid's KV slot, its other mixers'
    # states)
    fixed_per_sequence: int = 0
    window: int | None = None  # a sliding window's W: the cache holds min(W, T) tokens

    def __post_init__(self) -> None:
        if self.heads < 1 or self.width < 1:
            raise ValueError(f"slot {self.kind} of layer {self.layer}: heads ({self.heads}) "
                             f"and width ({self.width}) must be >= 1")

    @property
    def key(self) -> tuple[int, str]:
        return (self.layer, self.kind)


# ---------------------------------------------------------------- calibration

class SlotStats:
    """The calibration activations of one slot, as their Gram matrix per head (for the
    bases) and each sequence's singular values per head (for rank_eps at any eps)."""

    def __init__(self, slot: Slot):
        self.slot = slot
        self.gram = torch.zeros(slot.heads, slot.width, slot.width, dtype=torch.float64)
        self.spectra: list[torch.Tensor] = []  # [B, G, min(T, K)] per batch added
        self.shapes: list[tuple[int, int]] = []
        self.tokens = 0
        self.weight: torch.Tensor | None = None  # [G, K, K] how the reader weighs errors
        self.weight_tokens = 0
        self.total = torch.zeros(slot.heads, slot.width, dtype=torch.float64)  # sum of a
        self.spread = torch.zeros(slot.heads, dtype=torch.float64)
        self.spread_tokens = 0

    def add_weight(self, w: torch.Tensor, tokens: int = 1,
                   spread: torch.Tensor | None = None) -> None:
        """A reader's weight on this slot's errors [G, K, K] (symmetric PSD, budgets/
        readout.py), measured over `tokens` positions: the weights of every batch are
        averaged, each counted by its positions. spread [G]: the reader sees the
        activations' fluctuation around their mean scaled by it (values: value_spread)."""
        s = self.slot
        if tuple(w.shape) != (s.heads, s.width, s.width):
            raise ValueError(f"slot {s.kind} of layer {s.layer}: expected a weight "
                             f"[{s.heads}, {s.width}, {s.width}], got {tuple(w.shape)}")
        w64 = w.detach().cpu().double() * tokens
        self.weight = w64 if self.weight is None else self.weight + w64
        self.weight_tokens += tokens
        if spread is not None:
            self.spread = self.spread + spread.detach().cpu().double() * tokens
            self.spread_tokens += tokens

    def moment(self) -> torch.Tensor:
        """The second moment per token [G, K, K] the reader sees: E[a a^T], or with a
        spread m m^T + spread (E[a a^T] - m m^T), m the mean."""
        C = self.gram / self.tokens
        if not self.spread_tokens:
            return C
        m = self.total / self.tokens  # [G, K]
        mm = m[:, :, None] * m[:, None, :]
        s = (self.spread / self.spread_tokens)[:, None, None]
        return mm + s * (C - mm)

    def output_basis(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U [G, K, K], E [G, K, K], gain [G, K]) of weighted_basis(moment, mean weight):
        the gains are the squared output error per token each direction removes."""
        if self.weight is None or not self.tokens:
            raise ValueError(f"slot {self.slot.kind} of layer {self.slot.layer}: no weight or "
                             f"no activations for an output-aware basis")
        return weighted_basis(self.moment(), self.weight / self.weight_tokens)

    def add(self, a: torch.Tensor) -> None:
        """Activations a [B, G, T, K] of one calibration batch."""
        s = self.slot
        if a.dim() != 4 or a.shape[1] != s.heads or a.shape[-1] != s.width:
            raise ValueError(f"slot {s.kind} of layer {s.layer}: expected activations "
                             f"[B, {s.heads}, T, {s.width}], got {tuple(a.shape)}")
        a = a.detach().cpu()
        a64 = a.double()
        self.gram += torch.einsum("bgtk,bgtl->gkl", a64, a64)
        self.total += a64.sum((0, 2))
        self.spectra.append(singular_values(a.float()))  # [B, G, k]
        self.shapes.append((a.shape[2], a.shape[3]))
        self.tokens += a.shape[0] * a.shape[2]

    def basis(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(U [G, K, K], energy [G, K]): the eigenvectors of the Gram matrix per head as
        columns, by descending eigenvalue (the squared singular values of the stacked
        activations), in fp64."""
        if not self.tokens:
            raise ValueError(f"slot {self.slot.kind} of layer {self.slot.layer}: no "
                             f"calibration activations were added")
        energy, vectors = torch.linalg.eigh(self.gram)  # ascending
        return vectors.flip(-1), energy.flip(-1).clamp(min=0.0)

    def rank_eps_pooled(self, eps: float) -> list[int]:
        """Per head, rank_eps of every calibration token stacked, [sum T, K]: the rank a
        basis shared by all the sequences needs (the report's rank_eps_pooled)."""
        check_eps(eps)
        if not self.tokens:
            raise ValueError(f"slot {self.slot.kind} of layer {self.slot.layer}: no "
                             f"calibration activations were added")
        return [int(r) for r in gram_rank_eps(self.gram, self.tokens, eps).tolist()]

    def rank_eps_max(self, eps: float) -> list[int]:
        """Per head, the largest rank_eps at eps over the calibration sequences (each
        sequence's [T, K] matrix, as the report's kv_heads figure measures it)."""
        check_eps(eps)
        if not self.spectra:
            raise ValueError(f"slot {self.slot.kind} of layer {self.slot.layer}: no "
                             f"calibration activations were added")
        maxima = torch.zeros(self.slot.heads, dtype=torch.float64)
        for s, shape in zip(self.spectra, self.shapes, strict=True):
            ranks = spectrum_metrics(s, shape, eps)["rank_eps"].double()  # [B, G]
            maxima = torch.maximum(maxima, ranks.amax(0))
        return [int(r) for r in maxima.tolist()]


# ---------------------------------------------------------------- projections

def projectors(vectors: torch.Tensor, ranks: list[int],
               encoders: torch.Tensor | None = None) -> torch.Tensor:
    """U_r E_r per head [G, K, K] from bases [G, K, K] (columns by gain), ranks [G]
    (0 <= r <= K; r = K gives the identity up to rounding) and encoder rows E (None: the
    orthonormal basis's own, U^T)."""
    G, K, _ = vectors.shape
    if len(ranks) != G:
        raise ValueError(f"{len(ranks)} ranks for {G} heads")
    out = torch.zeros_like(vectors)
    for g, r in enumerate(ranks):
        if not 0 <= r <= K:
            raise ValueError(f"rank {r} of head {g} outside [0, {K}]")
        U = vectors[g, :, :r]
        E = U.T if encoders is None else encoders[g, :r]
        out[g] = U @ E
    return out


def project_rows(w: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """W [G*K, D] (nn.Linear's [out, in], rows grouped by head) -> per head P_g W_g, in
    W's dtype; a bias [G*K] likewise."""
    G, K, _ = P.shape
    if w.shape[0] != G * K:
        raise ValueError(f"weight with {w.shape[0]} rows for {G} heads of width {K}")
    w64 = w.detach().to(torch.float64)
    out = P.to(w.device, torch.float64) @ w64.reshape(G, K, -1)  # [G, K, D]
    return out.reshape(w.shape).to(w.dtype)


def project_heads(a: torch.Tensor, P: torch.Tensor, head_dim: int = -3) -> torch.Tensor:
    """Activations with heads at `head_dim` and the width last, e.g. [B, G, T, K] or
    [B, T, G, K] (head_dim=-2), each head's vectors projected by its P_g, in a's dtype."""
    G = P.shape[0]
    if a.shape[head_dim] != G or a.shape[-1] != P.shape[-1]:
        raise ValueError(f"activations {tuple(a.shape)} do not match {G} heads of width "
                         f"{P.shape[-1]}")
    moved = a.movedim(head_dim, -2)  # [..., G, K]
    Pt = P.transpose(-1, -2).to(a.device, a.dtype)  # row vectors: (P a)^T = a^T P^T
    out = (moved.unsqueeze(-2) @ Pt).squeeze(-2)
    return out.movedim(-2, head_dim)


def retained_energy(energy: torch.Tensor, ranks: list[int]) -> list[float]:
    """Per head, the share of its calibration energy the top r directions keep."""
    out = []
    for e, r in zip(energy, ranks, strict=True):
        total = float(e.sum())
        out.append(float(e[:r].sum()) / total if total > 0 else 1.0)
    return out


# ---------------------------------------------------------------- bytes

def slot_bytes(slot: Slot, ranks: list[int], nbytes: int, T: int,
               shared: bool = False) -> dict:
    """{"full", "low", "codes", "basis"}: bytes per token at T of the slot's full cache and
    at `ranks` (codes and bases apart), by lowrank_cache_bytes; low holds the basis
    amortized at T, or, shared, the codes alone (the basis is a weight)."""
    if len(ranks) != slot.heads:
        raise ValueError(f"slot {slot.kind} of layer {slot.layer}: {len(ranks)} ranks for "
                         f"{slot.heads} heads")
    low = lowrank_cache_bytes([slot.width] * slot.heads, ranks, nbytes, T)
    basis = low["basis_bytes"]
    model = CostModel.SHARED if shared else CostModel.PER_SEQUENCE
    if slot.columns is None:  # one code per token kept and kept direction
        held = 1.0 if slot.window is None else min(slot.window, T) / T  # of the T tokens
        # beside, per sequence: a hybrid's other mixers' states, kept in full
        fixed = slot.fixed_per_sequence * nbytes / T
        codes = (low["bytes_per_token"] + slot.fixed_per_token * nbytes) * held + fixed
        full = full_cache_bytes([slot.width] * slot.heads + [slot.fixed_per_token],
                                nbytes) * held + fixed
    else:  # a state: per sequence `columns` elements per kept direction, plus the basis
        codes = (slot.columns * low["bytes_per_token"] + slot.fixed_per_sequence * nbytes) / T
        full = full_cache_bytes([slot.width * slot.columns] * slot.heads
                                + [slot.fixed_per_sequence], nbytes) / T
    return {"full": full, "low": cache_per_token(codes, basis, T, model), "codes": codes,
            "basis": basis}


def cache_bytes(slots: list[Slot], ranks: dict, nbytes: int, T: int,
                shared: bool = False) -> dict:
    """The whole cache at `ranks` ({slot key: [r per head]}): full_bytes_per_token,
    bytes_per_token (codes + bases amortized at T; shared: the codes alone),
    code_bytes_per_token, basis_bytes (per sequence; shared: per model), ratio = full /
    low-rank."""
    if T < 1:
        raise ValueError(f"the length bases are amortized at must be >= 1, got {T}")
    parts = [slot_bytes(s, list(ranks[s.key]), nbytes, T, shared) for s in slots]
    full, low = sum(p["full"] for p in parts), sum(p["low"] for p in parts)
    return {"full_bytes_per_token": full, "bytes_per_token": low,
            "code_bytes_per_token": sum(p["codes"] for p in parts),
            "basis_bytes": sum(p["basis"] for p in parts),
            "ratio": full / low if low else float("inf")}


def full_ranks(slots: list[Slot]) -> dict:
    return {s.key: [s.width] * s.heads for s in slots}


# ---------------------------------------------------------------- allocation

def check_ratio(ratio: float) -> None:
    if not ratio > 1.0:
        raise ValueError(f"a target ratio must be > 1 (a cache smaller than the full one), "
                         f"got {ratio:g}")


def uniform_ranks(slots: list[Slot], target: float, nbytes: int, T: int,
                  shared: bool = False) -> dict | None:
    """The largest single r (capped at each slot's width) whose cache ratio at T reaches
    `target`; None when even r = 1 does not."""
    check_ratio(target)
    for r in range(max(s.width for s in slots), 0, -1):
        ranks = {s.key: [min(r, s.width)] * s.heads for s in slots}
        if cache_bytes(slots, ranks, nbytes, T, shared)["ratio"] >= target:
            return ranks
    return None


def greedy_ranks(slots: list[Slot], gains: dict, target: float, nbytes: int, T: int,
                 shared: bool = False, shares: bool = True) -> dict | None:
    """Ranks within the bytes full / target: every head starts at r = 1, then the
    direction with the largest gain per byte it costs is added, one at a time, while the
    bytes fit. None when r = 1 everywhere already exceeds them. `gains`: {slot key:
    [G, K] descending}; shares: each gain divided by its head's total (energies, or
    output-aware gains, whose one scale does not follow the loss across layers), else
    compared as they are (greedy-scaled)."""
    check_ratio(target)
    ranks = {s.key: [1] * s.heads for s in slots}
    now = cache_bytes(slots, ranks, nbytes, T, shared)
    budget = now["full_bytes_per_token"] / target
    spent = now["bytes_per_token"]
    if spent > budget * (1 + 1e-12):
        return None
    cost = {s.key: direction_bytes(s, nbytes, T, shared) for s in slots}
    value = {s.key: _scores(gains[s.key], shares) for s in slots}
    heap = [(-value[s.key][g][1] / cost[s.key], s.key, g)
            for s in slots if s.width > 1 for g in range(s.heads)]
    heapq.heapify(heap)
    by_key = {s.key: s for s in slots}
    while heap:
        _, key, g = heapq.heappop(heap)
        c = cost[key]
        if spent + c > budget * (1 + 1e-12):
            continue  # this slot's directions no longer fit; cheaper ones still may
        ranks[key][g] += 1
        spent += c
        r = ranks[key][g]
        if r < by_key[key].width:
            heapq.heappush(heap, (-value[key][g][r] / c, key, g))
    return ranks


def direction_bytes(s: Slot, nbytes: int, T: int, shared: bool) -> float:
    """Bytes per token one more kept direction of one head of slot s costs."""
    one = slot_bytes(s, [1] + [0] * (s.heads - 1), nbytes, T, shared)["low"]
    return one - slot_bytes(s, [0] * s.heads, nbytes, T, shared)["low"]


def _scores(gain: torch.Tensor, shares: bool) -> list[list[float]]:
    """Per head and direction [G][K]: the gains, or each over its head's total."""
    g = gain.double().clamp(min=0.0)
    if shares:
        total = g.sum(-1, keepdim=True)
        g = torch.where(total > 0, g / total.clamp(min=1e-300), torch.zeros_like(g))
    return g.tolist()


def eps_ranks(stats: dict, eps: float) -> dict:
    """Per slot and head, r = rank_eps_pooled at eps (at least 1): the report's advised
    figure, the rank of every calibration sequence stacked that one shared basis needs."""
    check_eps(eps)
    return {key: [max(1, r) for r in st.rank_eps_pooled(eps)] for key, st in stats.items()}
