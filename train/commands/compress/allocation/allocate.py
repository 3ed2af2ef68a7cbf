"""A byte budget spent where the predicted loss is lowest: one choice per unit, within bytes.

    units = [[Option(bytes, loss, payload), ...], ...]   # per unit (a head, a slot's head)
    picks = allocate(units, budget, start)                # an option index per unit

Each unit (a KV head, or one slot's head) offers options, each with its bytes per token and
the loss change it is predicted to cost (sensitivity.py); the
predicted loss of a whole setting is taken as the sum of its units' (cross terms between
heads are left to the measurement). allocate minimizes that sum within `budget`:

  1. the Lagrangian solution: for a price lambda per byte each unit takes its option of
     least loss + lambda bytes, lambda bisected to the cheapest price that fits the budget
     (points on each unit's lower convex hull), the bytes left then spent greedily;
  2. `start` (the uniform ranks) moved onto each unit's front (its cheapest option of no
     more loss), the bytes left spent greedily;
  3. each polished by exchanges: one unit one step down its front, another one step up,
     while the predicted sum falls and the bytes fit;

and the better of the two is returned, `start` on a tie. The result therefore never
predicts a larger loss than `start`: an allocation can always reach the uniform point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SLACK = 1e-9  # relative: bytes that fit the budget up to float rounding
BISECTIONS = 80  # lambda bisected on a log scale: far below one option's bytes


@dataclass(frozen=True)
class Option:
    """One choice of one unit: its bytes per token, its predicted loss change, what it is."""

    bytes: float
    loss: float
    payload: Any = None


def front(options: list[Option]) -> list[int]:
    """The indices of the options no cheaper-or-equal option beats on loss, by bytes:
    each next one costs more bytes and predicts strictly less loss."""
    order = sorted(range(len(options)), key=lambda i: (options[i].bytes, options[i].loss))
    out, best = [], float("inf")
    for i in order:
        if options[i].loss < best:
            out.append(i)
            best = options[i].loss
    return out


def _fits(spent: float, budget: float) -> bool:
    return spent <= budget * (1 + SLACK) + SLACK


class Fronts:
    """Every unit's front, and a position on it per unit (the state the search moves)."""

    def __init__(self, units: list[list[Option]]):
        if any(not u for u in units):
            raise ValueError("every unit needs at least one option")
        self.units = units
        self.fronts = [front(u) for u in units]

    def bytes(self, pos: list[int]) -> float:
        return sum(self.option(u, p).bytes for u, p in enumerate(pos))

    def loss(self, pos: list[int]) -> float:
        return sum(self.option(u, p).loss for u, p in enumerate(pos))

    def option(self, u: int, p: int) -> Option:
        return self.units[u][self.fronts[u][p]]

    def onto(self, picks: list[int]) -> list[int]:
        """Option indices -> positions: each unit's costliest front option within the
        option's bytes (it predicts no more loss than the option)."""
        pos = []
        for u, i in enumerate(picks):
            b = self.units[u][i].bytes
            p = max(k for k, j in enumerate(self.fronts[u])
                    if self.units[u][j].bytes <= b or k == 0)
            pos.append(p)
        return pos

    def picks(self, pos: list[int]) -> list[int]:
        return [self.fronts[u][p] for u, p in enumerate(pos)]


def lagrangian(f: Fronts, budget: float) -> list[int] | None:
    """Positions minimizing loss + lambda bytes per unit at the cheapest lambda whose
    bytes fit; None when even every unit's cheapest option does not."""
    def at(lam: float) -> list[int]:
        return [min(range(len(fr)), key=lambda p: (f.option(u, p).loss
                                                   + lam * f.option(u, p).bytes, -p))
                for u, fr in enumerate(f.fronts)]

    cheapest = [0] * len(f.fronts)
    if not _fits(f.bytes(cheapest), budget):
        return None
    if _fits(f.bytes(at(0.0)), budget):
        return at(0.0)
    lo, hi = 1e-30, 1.0
    while not _fits(f.bytes(at(hi)), budget) and hi < 1e300:
        hi *= 1e3
    for _ in range(BISECTIONS):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if _fits(f.bytes(at(mid)), budget) else (mid, hi)
    return at(hi)


def fill(f: Fronts, pos: list[int], budget: float) -> list[int]:
    """The bytes left spent one step up a front at a time, the step of most loss saved
    per byte that still fits."""
    pos, spent = list(pos), f.bytes(pos)
    while True:
        best, gain = None, 0.0
        for u, p in enumerate(pos):
            if p + 1 == len(f.fronts[u]):
                continue
            now, up = f.option(u, p), f.option(u, p + 1)
            extra = up.bytes - now.bytes
            if _fits(spent + extra, budget) and (now.loss - up.loss) / max(extra, 1e-300) > gain:
                best, gain = u, (now.loss - up.loss) / max(extra, 1e-300)
        if best is None:
            return pos
        spent += f.option(best, pos[best] + 1).bytes - f.option(best, pos[best]).bytes
        pos[best] += 1


def polish(f: Fronts, pos: list[int], budget: float, rounds: int | None = None) -> list[int]:
    """Exchanges while they help: unit a one step down its front, unit b one step up, the
    pair of the largest fall of the predicted sum whose bytes fit; then the bytes freed
    are spent (fill). Every accepted move lowers the sum, so it ends."""
    pos = fill(f, pos, budget)
    n = len(pos)
    for _ in range(rounds if rounds is not None else 20 * n + 20):
        spent = f.bytes(pos)
        down_b, down_l, up_b, up_l = (torch.full((n,), float("nan"), dtype=torch.float64)
                                      for _ in range(4))
        for u, p in enumerate(pos):
            now = f.option(u, p)
            if p > 0:
                lower = f.option(u, p - 1)
                down_b[u], down_l[u] = now.bytes - lower.bytes, lower.loss - now.loss
            if p + 1 < len(f.fronts[u]):
                upper = f.option(u, p + 1)
                up_b[u], up_l[u] = upper.bytes - now.bytes, now.loss - upper.loss
        net = down_l[:, None] - up_l[None, :]  # [a, b] the change of the predicted sum
        room = spent - down_b[:, None] + up_b[None, :]
        ok = ~torch.isnan(net) & (room <= budget * (1 + SLACK) + SLACK)
        ok &= ~torch.eye(n, dtype=torch.bool)
        net = torch.where(ok, net, torch.full_like(net, float("inf")))
        k = int(net.argmin())
        a, b = divmod(k, n)
        if not net[a, b] < -1e-15 * max(1.0, abs(f.loss(pos))):
            return pos
        pos[a] -= 1
        pos[b] += 1
        pos = fill(f, pos, budget)
    return pos


def allocate(units: list[list[Option]], budget: float,
             start: list[int] | None = None) -> list[int] | None:
    """An option index per unit whose bytes fit `budget` and whose summed predicted loss
    is the least found (module docstring), never above `start`'s (option indices that fit
    the budget, e.g. the uniform ranks); None when nothing fits."""
    f = Fronts(units)
    found = lagrangian(f, budget)
    if found is None:
        return None
    tries = [polish(f, found, budget)]
    if start is not None:
        if not _fits(sum(units[u][i].bytes for u, i in enumerate(start)), budget):
            raise ValueError("the start allocation does not fit the budget")
        tries.insert(0, polish(f, f.onto(start), budget))
    best = min(tries, key=f.loss)  # the first on a tie: start's
    if start is not None and f.loss(best) >= sum(units[u][i].loss
                                                  for u, i in enumerate(start)):
        return list(start)
    return f.picks(best)
