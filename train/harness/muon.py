"""Muon whose Newton-Schulz runs in the dtype the device computes fastest, batched by shape.

torch.optim.Muon orthogonalizes every update in bf16. On a CPU without native bf16 matmul
(no AVX512-BF16 or AMX, e.g. AMD Zen 2) bf16 matmul is emulated and ~8x slower than fp32,
and the orthogonalization dominated a training step. This Muon keeps torch's semantics
(momentum with Nesterov, the same quintic coefficients and steps, decoupled weight decay,
the same lr adjustment) and its state dict (it subclasses torch's Muon: same group keys
and a "momentum_buffer" per parameter, so checkpoints load either way), but runs
Newton-Schulz in bf16 on CUDA and, on a CPU, in whichever of bf16 and fp32 a timed probe
of the iteration finds faster for that shape: fp32 wherever bf16 matmul is emulated, and
on native bf16 (AVX512-BF16, AMX) fp32 at toy widths, bf16 at a model's. Matrices of one
shape go through one batched call.
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict

import torch
from torch import Tensor

# On a CPU, bf16 is chosen only where its Newton-Schulz takes under this share of fp32's:
# a clear win, so that load noise does not flip the choice from one process to the next.
# Measured on 2 cores with AMX: bf16 2.1x fp32's time at 64 x 64, 1.4x at 256 x 64, 0.17x
# at 576 x 1536; with bf16 emulated (Zen 2) 7.8x at 256 x 64.
BF16_MAX_SHARE = 0.75
PROBE_REPEATS = 2  # timed calls per dtype after a warm-up; the fastest counts
PROBE_COEFFS = (3.4445, -4.7750, 2.0315)  # torch's defaults: the values do not change the time


def _ns_seconds(m: int, k: int, dtype: torch.dtype) -> float:
    grad = torch.randn(1, m, k)  # [1, m, k]: one matrix; a stack of them scales alike
    zeropower_batched(grad, PROBE_COEFFS, 5, 1e-7, dtype)  # warm-up: dispatch, allocation
    best = float("inf")
    for _ in range(PROBE_REPEATS):  # the minimum: the least disturbed by other load
        start = time.perf_counter()
        zeropower_batched(grad, PROBE_COEFFS, 5, 1e-7, dtype)
        best = min(best, time.perf_counter() - start)
    return best


# torch.optim.Muon's `adjust_lr_fn` rules, (rows A, columns B) -> the lr's factor: the
# original (Keller Jordan's sqrt(max(1, A/B))) and Moonshot's match to AdamW's update RMS
LR_RULES = {None: lambda A, B: math.sqrt(max(1, A / B)),
            "original": lambda A, B: math.sqrt(max(1, A / B)),
            "match_rms_adamw": lambda A, B: 0.2 * math.sqrt(max(A, B))}


def adjusted_lr(lr: float, rule: str | None, shape: torch.Size) -> float:
    """The learning rate a matrix of `shape` steps with under Muon's `rule` (another rule
    name leaves it as is, as torch's Muon does)."""
    return lr * LR_RULES.get(rule, lambda A, B: 1.0)(*shape[:2])


def closure_loss(closure):
    """An optimizer step's closure evaluated with gradients on (None without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


@functools.cache
def cpu_ortho_dtype(m: int, k: int) -> torch.dtype:
    """The dtype Newton-Schulz on an m x k matrix runs fastest in on this CPU, by timing
    the iteration in both (once per shape and process; a few calls, ~0.1 s at 576 x 1536):
    timing, not /proc/cpuinfo flags, since oneDNN may or may not use them, and whether
    native bf16 wins depends on the shape."""
    bf16, fp32 = _ns_seconds(m, k, torch.bfloat16), _ns_seconds(m, k, torch.float32)
    return torch.bfloat16 if bf16 < BF16_MAX_SHARE * fp32 else torch.float32


def ortho_dtype(device: torch.device, shape: tuple[int, ...]) -> torch.dtype:
    """The dtype Newton-Schulz runs in for matrices of `shape` (..., m, k) on `device`:
    bf16 on an accelerator, as torch's Muon; on a CPU the faster of bf16 and fp32."""
    if device.type == "cpu":
        return cpu_ortho_dtype(*shape[-2:])
    return torch.bfloat16


def zeropower_batched(grads: Tensor, ns_coefficients: tuple[float, float, float],
                      ns_steps: int, eps: float, dtype: torch.dtype) -> Tensor:
    """torch's `_zeropower_via_newtonschulz` on a stack [n, m, k] of matrices at once,
    in `dtype`; returns [n, m, k] in `dtype`."""
    if grads.dim() != 3:
        raise ValueError(f"zeropower_batched needs a stack [n, m, k]; "
                         f"got shape {tuple(grads.shape)}")
    a, b, c = ns_coefficients
    x = grads.to(dtype)
    tall = grads.size(1) > grads.size(2)
    if tall:  # iterate on the wide side: the Gram matrix is the smaller one
        x = x.mT  # [n, k, m]
    # each matrix scaled to Frobenius norm 1, so its spectral norm is at most 1
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.mT  # [n, r, r]
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, update, x, beta=a)  # a X + (b A + c A^2) X
    return x.mT if tall else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon with the orthogonalization in `ortho_dtype` and batched by shape.
    torch's constructor, validation and state dict; the keyword `dtype` fixes the
    orthogonalization's dtype (benchmarks, tests) and is not saved: None chooses by device.
    The CPU probe's verdict per shape is saved in the state dict ("ortho_dtypes", which
    torch's Muon ignores), so that a resumed run computes what the uninterrupted one did
    even where a new probe on a loaded machine would choose otherwise."""

    def __init__(self, params, *args, dtype: torch.dtype | None = None, **kwargs):
        super().__init__(params, *args, **kwargs)
        self.dtype = dtype
        self.chosen: dict[tuple[int, int], torch.dtype] = {}  # (m, k) -> the CPU verdict

    def state_dict(self) -> dict:
        out = super().state_dict()
        if self.chosen:  # strings, not dtypes: checkpoints load with weights_only
            out["ortho_dtypes"] = {f"{m}x{k}": str(d).removeprefix("torch.")
                                   for (m, k), d in self.chosen.items()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("ortho_dtypes", {})
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "ortho_dtypes"})
        self.chosen = {tuple(int(n) for n in shape.split("x")): getattr(torch, name)
                       for shape, name in saved.items()}

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict) -> None:
        by_shape: dict[tuple, list[Tensor]] = defaultdict(list)
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"Muon does not support sparse gradients; "
                                   f"got one for a {tuple(p.shape)} parameter")
            by_shape[(p.shape, p.device, p.dtype)].append(p)
        for params in by_shape.values():
            self._step_same_shape(params, group)

    def _step_same_shape(self, params: list[Tensor], group: dict) -> None:
        grads = [p.grad for p in params]
        bufs = [self._momentum_buffer(p) for p in params]
        momentum = group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        ortho = zeropower_batched(torch.stack(updates), group["ns_coefficients"],  # [n, m, k]
                                  group["ns_steps"], group["eps"], self._dtype(params[0]))
        lr = float(group["lr"])
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        adjusted = adjusted_lr(lr, group["adjust_lr_fn"], params[0].shape)
        torch._foreach_add_(params, list(ortho.to(params[0].dtype).unbind(0)), alpha=-adjusted)

    def _dtype(self, p: Tensor) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        if p.device.type != "cpu":
            return ortho_dtype(p.device, p.shape)
        shape = (p.shape[-2], p.shape[-1])
        if shape not in self.chosen:
            self.chosen[shape] = ortho_dtype(p.device, shape)
        return self.chosen[shape]

    def _momentum_buffer(self, p: Tensor) -> Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        return state["momentum_buffer"]
