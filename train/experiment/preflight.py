"""Before the first fit: the sizes an experiment asks for, bounded before any work starts.

    notes = preflight(exp)          # raises ValueError naming the variant and the estimate

- warnings for settings that are legal but almost certainly not meant (`size_warnings`):
  warmup that never ends, a batch larger than the training set, a probe larger than the
  validation set; returned as notes for stderr and the run's notes (NOTES_FILE);
- a memory estimate per variant (`MemoryEstimate`) checked against the memory available
  on the device the run will use, so that a seq_len of 100,000 is an error that shows the
  estimate rather than a run that swaps or hangs;
- each variant's model run forward on a few tokens (at most PREFLIGHT_TOKENS, whatever
  data.seq_len is, so this check's cost is bounded): a kernel backend that cannot serve
  here fails up front, and autograd's saved tensors give the activation bytes per token
  that the estimate scales to batch_size x seq_len.

The estimate, per training process (`MemoryEstimate.describe` prints each term):
  weights      P x b                     (P parameters, b bytes per parameter: 4, or 2 / 8
                                          for 16-/64-bit "true" precision)
  gradients    P x b
  optimizer    P x b x s                 (s state tensors per parameter: AdamW 2, Lion 1,
                                          Muon <= 2)
  activations  B x (a T + c T^2) x r     (a, c: saved bytes per token, and per token per
                                          token, measured at 64 tokens, c only where a
                                          block runs a reference kernel; B = batch_size,
                                          T = seq_len; r = 1/2 for 16-bit "true"
                                          precision, 2 for 64-bit, else 1)
  data         16 x (train_size + val_size) x T    (tokens and labels, int64)
  probe        3 x 4 x P_b x H x T_p x m  (the monitor's mixing matrices in fp32, a centered
                                          copy and the SVD's workspace: P_b = min(probe_size,
                                          val_size) sequences of T_p = min(T, probe_len)
                                          tokens, H heads, m = T_p below the matrix-free
                                          length MATFREE_FROM, else K_MAX)
A fine-tune (the `finetune` section) is estimated the same way at its own data and train
sections, for the largest r: the whole base model's weights, but gradients and optimizer
state only for the adapters' A and B (counted on the model with adapters attached), and
the base's activations per token scaled to the fine-tune's batch and length.
On the CPU, every process of a multi-device run holds all of it, so the total is multiplied
by the number of processes; on a GPU, data stays on the host and the rest is compared with
the device's free memory. It is an estimate: peak memory in backward adds transients of
about one layer, and the matrix-free probe of a block with no matrix-free form (MoE's
routing) materializes T_p x T_p matrices after all.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import budgets
from budgets.rank.matfree import K_MAX
from zoo.ops.registry import BackendUnavailable

from ..config import Experiment, variant_targets
from ..data import make_splits
from ..lm.decoder import block_specs, build_model, max_heads
from ..lm.lora import attach_lora
from ..rundir.files import write_text
from ..sizing.match import count_params, default_d_mlp

NOTES_FILE = "notes.txt"  # runs/<experiment>/notes.txt: the warnings of the run's preflight
# The longest sequence preflight runs a model on. Chunked kernels pad to chunks of 64: at a
# whole chunk the cost per token measured is at or above the long-sequence figure.
PREFLIGHT_TOKENS = 64
OPTIMIZER_STATES = {"adamw": 2, "lion": 1, "muon": 2}  # Muon: momentum, AdamW on the rest


def preflight(exp: Experiment, available: dict[str, int | None] | None = None) -> list[str]:
    """Warnings for `exp` (also printed by the caller), after checking that every variant
    fits in memory and that its kernel backends serve here. `available` (device kind ->
    bytes, None: unknown) replaces the machine's own figures, for tests."""
    if exp.data.task in ("text", "tokens"):  # a bad corpus or shard fails here, not mid-run
        make_splits(exp.data.spec(), 1, 1, exp.seed)
    kind = device_kind(exp.train.accelerator)
    free = (available if available is not None else {kind: available_memory(kind)}).get(kind)
    for estimate in memory_estimates(exp, before_build=lambda e: check_memory(e, free, kind)):
        check_memory(estimate, free, kind)
    return size_warnings(exp)


def memory_estimates(exp: Experiment, before_build: Callable[[MemoryEstimate], None]
                     = lambda estimate: None) -> Iterator[MemoryEstimate]:
    """Every run's estimate with its activations measured, then (stage "finetune") the
    fine-tune's of its variant. `before_build` sees the estimates of a model's runs without
    activations first: weights and optimizer state are checked before the model is built,
    which happens only if they fit. train/experiment/parallel.py reads them too: how many
    workers fit side by side."""
    for base, first in exp.base_variants().items():  # a sweep's grid points share a model
        runs = [static_estimate(exp, run, base) for run, v in exp.variants.items()
                if (v.base or run) == base]
        for estimate in runs:
            before_build(estimate)
        model = build_model(bounded_config(exp, first))
        a, c = activation_bytes(model, base, exp.data.seq_len, exp.train.accelerator)
        yield from (estimate.with_activations(a, c) for estimate in runs)
        if exp.finetune is not None and base in exp.finetune_variants():
            yield finetune_estimate(exp, base, first, model).with_activations(a, c)


# ---------------------------------------------------------------- warnings

def size_warnings(exp: Experiment) -> list[str]:
    """Settings that pass validation but defeat their purpose; also for the fine-tune
    stage's data and train sections (named under finetune.)."""
    notes = section_warnings(exp.data, exp.train, exp.monitor, "")
    if exp.finetune is not None:
        ft = exp.finetune_view()
        notes += section_warnings(ft.data, ft.train, None, "finetune.")
    return notes


def section_warnings(data, train, monitor, prefix: str) -> list[str]:
    notes = []
    if train.warmup_steps >= train.max_steps:
        notes.append(f"{prefix}train.warmup_steps ({train.warmup_steps}) >= "
                     f"{prefix}train.max_steps ({train.max_steps}): the learning rate never "
                     "leaves warmup")
    if data.batch_size > data.train_size:
        notes.append(f"{prefix}data.batch_size ({data.batch_size}) > {prefix}data.train_size "
                     f"({data.train_size}): every batch is the whole training set of "
                     f"{data.train_size} examples")
    if monitor is not None and monitor.probe_size > data.val_size:
        notes.append(f"monitor.probe_size ({monitor.probe_size}) > data.val_size "
                     f"({data.val_size}): the probe batch holds the {data.val_size} "
                     "validation examples there are")
    return notes


def write_notes(exp_dir: Path, notes: list[str]) -> None:
    """Append the preflight's warnings to the run's notes (nothing when there are none),
    rewriting the file whole (train/rundir/files.py write_text)."""
    if notes:
        path = Path(exp_dir) / NOTES_FILE
        before = path.read_text() if path.is_file() else ""
        write_text(path, before + "".join(f"warning: {note}\n" for note in notes))


# ---------------------------------------------------------------- the estimate

@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per training process (see the module docstring for each term)."""

    variant: str
    params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int | None  # None: not measured yet (the model is built only if the rest fits)
    data: int
    probe: int
    batch_size: int
    seq_len: int
    processes: int = 1
    activation_scale: float = 1.0
    stage: str = ""  # "finetune": the estimate of the fine-tune stage's run of `variant`

    def with_activations(self, per_token: float, per_token2: float = 0.0) -> MemoryEstimate:
        """The estimate with its activations: batch x (a T + c T^2), scaled to the dtype."""
        T = self.seq_len
        acts = self.batch_size * (per_token * T + per_token2 * T * T) * self.activation_scale
        return dataclasses.replace(self, activations=math.ceil(acts))

    def on_device(self, kind: str) -> int:
        """Bytes that must fit on one device of `kind` (a GPU holds no data), all
        processes together on the CPU."""
        model = (self.weights + self.gradients + self.optimizer + (self.activations or 0)
                 + self.probe)
        return model * self.processes + self.data * self.processes if kind == "cpu" else model

    def describe(self, kind: str) -> str:
        at = f"{self.stage}." if self.stage else ""  # the section the sizes come from
        acts = ("not measured yet" if self.activations is None
                else gib(self.activations))
        terms = [f"weights {gib(self.weights)} ({self.params:,} parameters)",
                 f"gradients {gib(self.gradients)}", f"optimizer state {gib(self.optimizer)}",
                 f"activations at {at}data.batch_size {self.batch_size} x {at}data.seq_len "
                 f"{self.seq_len}: {acts}", f"monitor probe {gib(self.probe)}"]
        if kind == "cpu":
            terms.append(f"data {gib(self.data)}")
        per = f" per process, x {self.processes} processes" if self.processes > 1 else ""
        return ", ".join(terms) + per


def gib(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def param_bytes(precision: str) -> int:
    """Bytes per parameter: fp32 master weights unless the precision is 'true' 16/64-bit."""
    if precision in ("16-true", "bf16-true"):
        return 2
    return 8 if precision in ("64-true", "64") else 4


def static_estimate(exp: Experiment, run: str, variant: str) -> MemoryEstimate:
    """The estimate of one run of `variant` (a sweep's grid point, or the variant itself)
    from the config alone; the activations are added once measured (with_activations)."""
    config = exp.variant_config(run)
    data, model, train = exp.data, config["model"], config["train"]
    specs = block_specs(config)
    mlp = model.get("mlp", "gelu")
    d_mlp = model["d_mlp"] or default_d_mlp(model["d_model"], model["mlp_ratio"], None, mlp)
    params = count_params(data.vocab_size, model["d_model"], model["n_layers"], None, None,
                          d_mlp, data.seq_len, model["norm"], model["tie_embeddings"],
                          layers=specs, mlp=mlp)
    b = param_bytes(train["precision"])
    return MemoryEstimate(
        variant=variant, params=params, weights=params * b, gradients=params * b,
        optimizer=params * b * OPTIMIZER_STATES.get(train["optimizer"], 2),
        activations=None, data=16 * (data.train_size + data.val_size) * data.seq_len,
        probe=probe_bytes(exp, max_heads(config)), batch_size=data.batch_size,
        seq_len=data.seq_len, processes=processes(exp),
        # activations were measured in fp32: "true" 16- or 64-bit precision scales them
        activation_scale=b / 4 if "true" in train["precision"] or b == 8 else 1.0)


def finetune_estimate(exp: Experiment, variant: str, run: str,
                      model: torch.nn.Module) -> MemoryEstimate:
    """The fine-tune of `variant` at its largest r: the base's weights, the adapters'
    gradients and optimizer state, at the fine-tune's data and train sections. `model`
    (the base, as built for its activations) gets the adapters attached to count them."""
    ft = exp.finetune
    view, r = exp.finetune_view(), max(ft.ranks)
    params = count_params_of(model)
    targets = variant_targets(exp, variant, ft.targets)
    if targets:  # none: the stage itself names the targets that match nothing
        attach_lora(model, targets, r, ft.alpha_for(r))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if targets else 0
    params += trainable
    train, data = view.train, view.data
    b = param_bytes(train.precision)
    n_heads = max_heads(exp.variant_config(run))
    return MemoryEstimate(
        variant=variant, params=params, weights=params * b, gradients=trainable * b,
        optimizer=trainable * b * OPTIMIZER_STATES.get(train.optimizer, 2),
        activations=None, data=16 * (data.train_size + data.val_size) * data.seq_len,
        probe=probe_bytes(view, n_heads), batch_size=data.batch_size, seq_len=data.seq_len,
        processes=processes(view), stage="finetune",
        activation_scale=b / 4 if "true" in train.precision or b == 8 else 1.0)


def count_params_of(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def probe_bytes(exp: Experiment, n_heads: int) -> int:
    """The monitor's mixing matrices, their centered copy and the SVD's workspace."""
    m = exp.monitor
    P, T = min(m.probe_size, exp.data.val_size), min(exp.data.seq_len, m.probe_len)
    width = T if T < budgets.MATFREE_FROM else min(T, K_MAX)
    return 3 * 4 * P * n_heads * T * width


def processes(exp: Experiment) -> int:
    """Training processes on this host for a CPU run (each holds a full copy)."""
    if device_kind(exp.train.accelerator) != "cpu":
        return 1
    devices = str(exp.train.devices).strip()
    if devices.isdigit():
        return max(1, int(devices))
    return len([d for d in devices.split(",") if d.strip()]) if "," in devices else 1


# ---------------------------------------------------------------- measured activations

def bounded_config(exp: Experiment, variant: str) -> dict:
    """The variant's config with the model's max length cut to PREFLIGHT_TOKENS: nothing
    built here grows with data.seq_len."""
    config = exp.variant_config(variant)
    length = min(exp.data.seq_len, PREFLIGHT_TOKENS)
    return {**config, "model": {**config["model"], "max_len": length}}


def saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes autograd keeps for backward in one training forward on `tokens` [B, T] (the
    loss included), each storage counted once. No backward runs: what is kept is known
    by then, and preflight's cost stays one short forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)  # [B, T, vocab]
        F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
    return sum(seen.values())


def activation_bytes(model: torch.nn.Module, variant: str, seq_len: int,
                     accelerator: str) -> tuple[float, float]:
    """(a, c): saved bytes per token, and per token squared. One short sequence gives a;
    only a model with a block on a reference kernel (which forms T x T scores) is measured
    at three lengths, for b(T) = k + a T + c T^2: chunked kernels pad short sequences, and
    a fit across lengths would read their padding as a quadratic term. Backend failures
    name the variant; on an accelerator the backends resolve per device, so only the
    CPU's are checked."""
    T = min(seq_len, PREFLIGHT_TOKENS)
    try:
        saved = saved_bytes(model, torch.zeros(1, T, dtype=torch.long))
        if T < 4 or not quadratic(model):
            return saved / T, 0.0
        lengths = (T // 4, T // 2, T)
        sizes = [*(saved_bytes(model, torch.zeros(1, t, dtype=torch.long))
                   for t in lengths[:2]), saved]
    except BackendUnavailable as e:
        if device_kind(accelerator) != "cpu":
            return 0.0, 0.0  # the first step on the device tells
        raise BackendUnavailable(f"variants.{variant}: {e}") from e
    powers = torch.tensor([[1.0, t, t * t] for t in lengths], dtype=torch.float64)
    _, a, c = torch.linalg.solve(powers, torch.tensor(sizes, dtype=torch.float64)).tolist()
    c = max(0.0, c)
    return max(a, (saved - c * T * T) / T), c


def quadratic(model: torch.nn.Module) -> bool:
    """Whether a block ran a reference kernel in the last forward (an SSM's backend reads
    'scan+conv')."""
    return any("reference" in str(getattr(block, "backend", "")).split("+")
               for block in getattr(model, "blocks", []))


# ---------------------------------------------------------------- what is available

def device_kind(accelerator: str) -> str:
    """'cpu', 'cuda' (gpu, cuda, or auto with CUDA here), or the accelerator's name."""
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu" if accelerator == "auto" else accelerator


def available_memory(kind: str) -> int | None:
    """Free bytes on the device kind the run uses; None where it is not known (then
    nothing is checked)."""
    if kind == "cuda":
        if not torch.cuda.is_available():
            return None
        return min(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    if kind != "cpu":
        return None
    known = [n for n in (meminfo_available(), cgroup_available()) if n is not None]
    return min(known) if known else None


def meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_available(root: str = "/sys/fs/cgroup") -> int | None:
    """A container's memory limit minus its usage (cgroup v2), when it has one."""
    try:
        limit = Path(root, "memory.max").read_text().strip()
        used = int(Path(root, "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def check_memory(estimate: MemoryEstimate, available: int | None, kind: str) -> None:
    """Raise a ValueError showing the estimate when it does not fit in `available`."""
    need = estimate.on_device(kind)
    if available is None or need <= available:
        return
    where, p = ((f"the fine-tune of {estimate.variant}", "finetune.") if estimate.stage
                else (f"variants.{estimate.variant}", ""))
    raise ValueError(
        f"{where}: needs about {gib(need)} of {kind} memory, but "
        f"{gib(available)} is available ({estimate.describe(kind)}); lower {p}data.seq_len, "
        f"{p}data.batch_size, {p}data.train_size or the model's size")
