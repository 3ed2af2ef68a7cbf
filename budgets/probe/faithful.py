"""A capture observes; it never changes what the model computes. The check every probe of
captured calls makes before its report is believed.

    check = loss_check(captured, plain, dtype, diagnose)
    # {"captured": 4.8523, "uncaptured": 4.8523, "tolerance": 1e-4}, or Unfaithful raised

The probe's forward runs under the capture (its attention computed by the capture's own
engine, or watched where the model calls torch); its next-token loss is compared with the
model's own on the same batch, one more forward with no capture. Where the two differ by
more than LOSS_TOLERANCE of the forward's dtype, the capture has changed the model (a
keyword it dropped, a mask it misread) and whatever it measured is not the model's
attention: the probe refuses, and one more pair of forwards (only then) finds the first
mixer whose output differs, watched by forward hooks (first_change), for the error to name.
Every forward replays the random draws the captured one started from (rng_state,
replaying): a model in training mode drops the same units in each.

The tolerances, measured on every tiny type of tests/hf_tiny.py at 2 x 64 tokens: fp32
forwards agree to 5e-7 in the loss (eager vs the capture's engine, both its exact and its
SDPA path), bf16 ones to 4e-4 (rows attended in blocks round differently; experts routed
on near-ties); the capture that dropped DSA's top-k selection moved the loss of the tiny
DSA models by 5e-4 (glm_moe_dsa) and 6e-3 (deepseek_v32) in fp32, their logits by 0.31.
A bf16 forward is checked at 1e-2, 25 x its tiny spread, for the spread of deep models.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

# |captured loss - uncaptured loss| allowed, per dtype of the forward (nats)
LOSS_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1e-2,
                  torch.float16: 5e-3}
# a mixer's output differs when max |captured - uncaptured| exceeds this share of the
# uncaptured output's largest entry
OUTPUT_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2,
                    torch.float16: 5e-3}


def rng_state() -> dict:
    """torch's random state now (CPU, and each CUDA device once initialized): taken before
    the captured forward, replayed for the plain one, so that a model drawing random numbers
    (dropout in training mode) draws the same in both."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if cuda else None}


@contextlib.contextmanager
def replaying(state: dict):
    """Inside, torch's random draws start where `state` (rng_state) stood; afterwards they
    go on as if nothing had run."""
    devices = list(range(len(state["cuda"]))) if state["cuda"] is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state["cpu"])
        if state["cuda"] is not None:
            torch.cuda.set_rng_state_all(state["cuda"])
        yield


class Unfaithful(ValueError):
    """The captured forward's loss differs from the model's own."""


def tolerance(dtype: torch.dtype, table: dict = LOSS_TOLERANCE) -> float:
    return table.get(dtype, table[torch.float32])


def loss_check(captured: float, plain: float, dtype: torch.dtype,
               diagnose: Callable[[], str]) -> dict:
    """{"captured", "uncaptured", "tolerance"}, or Unfaithful where the losses differ by
    more than the tolerance of `dtype` (NaN too), its message ending with diagnose()'s
    sentence: the first mixer whose output differs."""
    tol = tolerance(dtype)
    check = {"captured": float(captured), "uncaptured": float(plain), "tolerance": tol}
    if abs(captured - plain) <= tol:
        return check
    raise Unfaithful(f"the capture changed the model's forward: next-token loss {captured:.6g} "
                     f"captured vs {plain:.6g} uncaptured (|difference| "
                     f"{abs(captured - plain):.3g} > tolerance {tol:g} in "
                     f"{str(dtype).removeprefix('torch.')}); {diagnose()}; nothing reported")


def _tensor(out) -> torch.Tensor | None:
    """A module's output tensor: itself, or the first of a tuple (attention, weights)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return getattr(out, "last_hidden_state", None)


@contextlib.contextmanager
def _watched(modules: dict[str, nn.Module], on_output: Callable[[str, torch.Tensor], None]):
    handles = []
    for name, m in modules.items():
        def hook(module, args, out, name=name):
            t = _tensor(out)
            if t is not None:
                on_output(name, t.detach())
        handles.append(m.register_forward_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class _Found(Exception):
    pass


def first_change(modules: dict[str, nn.Module], run_plain: Callable[[], object],
                 run_captured: Callable[[], object], dtype: torch.dtype) -> str:
    """'first differing output: NAME (max |difference| d, relative r)': the first of
    `modules` (name -> module, watched in call order) whose output under the capture
    differs from its plain output by more than OUTPUT_TOLERANCE, else the one that differs
    most. Two forwards, no gradients; the plain outputs are kept until compared."""
    kept: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), _watched(modules, lambda n, t: kept.setdefault(n, []).append(t)):
        run_plain()
    tol, worst, seen = tolerance(dtype, OUTPUT_TOLERANCE), None, {}

    def compare(name: str, out: torch.Tensor) -> None:
        nonlocal worst
        k = seen[name] = seen.get(name, 0) + 1
        plain = kept.get(name, [])
        if k > len(plain) or plain[k - 1].shape != out.shape:
            worst = (name, float("inf"), float("inf"))
            raise _Found
        diff = float((out.double() - plain[k - 1].double()).abs().max())
        rel = diff / max(float(plain[k - 1].double().abs().max()), 1e-30)
        if worst is None or rel > worst[2]:
            worst = (name, diff, rel)
        if rel > tol:
            worst = (name, diff, rel)
            raise _Found

    with torch.no_grad(), contextlib.suppress(_Found), _watched(modules, compare):
        run_captured()
    if worst is None:
        return "no watched layer's output differs"
    name, diff, rel = worst
    if diff == float("inf"):
        return f"first differing output: {name} (called differently under the capture)"
    which = "first differing output" if rel > tol else "largest output difference"
    return f"{which}: {name} (max |difference| {diff:.3g}, relative {rel:.3g})"
