"""`--heal TOKENS`: fine-tune a compressed setting with its projections in place, and trace the
eval loss against the healing tokens.

    healed = heal(doc, target, cal, chosen, options, inputs, notes)   # doc["heal"]: the curve
    healed.merge(surgery)          # --save: the adapters folded into the projected weights

The setting healed is the best measured allocation (lowest eval loss) at the target ratio
`heal_at`, by default the largest of `ratios`: healing is for a setting beyond the
training-free tolerance (the verdict's setting is within it, so it has at most the
tolerance to recover). With --save, the healed setting is the one saved.

What is trained: LoRA adapters (rank LORA_RANK, alpha LORA_ALPHA) on every attention
projection, W_Q, W_K, W_V and W_O of every layer (the target names them:
target/protocol.py Target.adapter_sites), each a pair A [r, in], B [out, r] (B zero:
healing starts at the compressed model) added to the projection's output by a forward
hook; every weight of the model stays frozen, and stays as it was. The cache's
projections stay in force while healing: W_K and W_V are the projected P W of the
setting, and the adapters' rows that give keys and values are projected too (B -> P B
per KV head, where compress projected the weight; keys after RoPE or through a k_norm
are projected downstream of the adapter, as before), so the healed keys and values still
lie in the span of the setting's bases: what is healed is what a rank-r cache serves, and
merged into the weights (merge) the healed model saves with the same bases. A setting
that reads KV heads through a window and sinks heals with those masks in force too (but
--save refuses it: a mask is not a weight).

What it is trained on: the calibration text (Hugging Face: the whole --text file, or when
--eval-text is the same file only its calibration tokens; a run: its training split), in
sequences of the calibration length, cycled when the tokens asked exceed it; evaluated on
the evaluation data the rows were measured on, at CURVE_POINTS points (0, then doubling
steps up to the last).

Objective (`heal_loss`, HEAL_LOSSES): `distill` (the default), the KL divergence from
the uncompressed model's next-token distribution to the healed one's at every position,
or `lm`, next-token cross-entropy on the text. Distillation is the default because the
goal is the uncompressed model, not a better fit of the calibration text: its target is
dense (a distribution per token rather than one label), it pulls every position back
towards what the full cache gave, and a healed loss change near 0 then means recovered,
not adapted to the healing text (docs/METRICS.md, "Healing a compressed cache"). The
uncompressed model is a frozen copy taken before the projections: twice the model's
memory while healing.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from budgets.capture.out_proj import projection_weight

from ...render.compress import setting_name
from .bases.calibrate import Calibration, cut
from .bases.lowrank import projectors
from .target.protocol import Target
from .target.surgery import Surgery

LORA_RANK = 8
LORA_ALPHA = 16.0
HEAL_LR = 1e-3  # AdamW on the adapters alone, after a short linear warmup
WARMUP_STEPS = 10
HEAL_BATCH = 4  # Hugging Face sequences per healing step unless batch_size is given
CURVE_POINTS = 6  # evaluations: before healing, then at doubling steps up to the last
NOT_AT_A_RATIO = ("full", "advised", "eps")  # rows whose target is not a ratio


@dataclass
class ModelData:
    """What the stages after measuring need from the entry point: the healing sequences
    (x [N, T], and labels [N, T] for a run's task, None for a text), the evaluation, its
    tokens [N, T] (--save decodes them through the saved cache), the batch size."""

    heal_data: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]
    evaluate: Callable[[], dict]
    eval_tokens: torch.Tensor
    batch_size: int
    progress: Callable[[str], None] | None = None


HEAL_SEED = 0  # the adapters' initialization: healing is repeatable


class Adapter(nn.Module):
    """One projection's LoRA pair; `rows`: (row index [C], P [G, K, K]) of the heads whose
    outputs the cache projects, so the adapter's rows there are projected the same way."""

    def __init__(self, linear: nn.Module, rows: list, r: int = LORA_RANK,
                 alpha: float = LORA_ALPHA):
        super().__init__()
        w = projection_weight(linear)  # [out, in]
        self.site = (linear,)  # not a submodule: its weights are not the adapter's
        self.rows, self.scaling = rows, alpha / r
        self.A = nn.Parameter(torch.empty(r, w.shape[1], dtype=torch.float32, device=w.device))
        self.B = nn.Parameter(torch.zeros(w.shape[0], r, dtype=torch.float32, device=w.device))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as nn.Linear's, and LoRA's

    @property
    def linear(self) -> nn.Module:
        return self.site[0]

    def up(self) -> torch.Tensor:
        """B [out, r] with the projected heads' rows replaced by P_g B_g."""
        B = self.B
        for index, P in self.rows:
            G, K, _ = P.shape
            rows = B[index].view(G, K, -1)  # [G, K, r]
            B = B.index_copy(0, index, (P.to(B) @ rows).reshape(G * K, -1))
        return B

    def hook(self, module, args, out: torch.Tensor) -> torch.Tensor:
        x = args[0]  # [..., in]
        delta = (x @ self.A.T.to(x.dtype)) @ self.up().T.to(x.dtype)  # [..., out]
        return out + self.scaling * delta

    def merge(self, surgery: Surgery) -> None:
        """The weight W -> W + scaling * B' A (B' = up()), through `surgery` (undone)."""
        w = projection_weight(self.linear)
        with torch.no_grad():
            new = w.double() + self.scaling * (self.up().double() @ self.A.double())
        surgery.overwrite(w, new.to(w.dtype))


@dataclass
class Healed:
    """The adapters of a healed setting: the row healed and its ranks."""

    row: int
    ranks: dict
    adapters: list[Adapter] = field(default_factory=list)

    def merge(self, surgery: Surgery) -> None:
        for adapter in self.adapters:
            adapter.merge(surgery)


def check_heal(target: Target, options) -> None:
    """Refuse --heal on a cache it does not adapt (a latent, a state), before any work."""
    if options.heal is None or target.caches_kv:
        return
    raise ValueError(f"heal={options.heal}: healing adapts the attention projections of a KV "
                     f"cache (softmax, sliding_window, moe, Hugging Face); this model caches "
                     f"a {target.family} state")


# ---------------------------------------------------------------- objectives

def _distill(student: torch.Tensor, teacher: torch.Tensor, x, y) -> torch.Tensor:
    """KL(full || healed) per token, over every position."""
    s = F.log_softmax(student.float().flatten(0, 1), -1)
    t = F.log_softmax(teacher.float().flatten(0, 1), -1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def _next_token(student: torch.Tensor, teacher, x: torch.Tensor, y) -> torch.Tensor:
    """Cross-entropy on the labels (a run's task) or the next token (a text)."""
    from ...data import IGNORE

    if y is None:
        return F.cross_entropy(student[:, :-1].float().flatten(0, 1), x[:, 1:].flatten())
    return F.cross_entropy(student.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)


HEAL_LOSSES = {"distill": _distill, "lm": _next_token}


# ---------------------------------------------------------------- healing

def row_windows(row: dict) -> dict:
    """{(layer, g): (W, s)}: the KV heads a row reads through a window (none: {})."""
    return {(w["layer"], w["kv_head"]): (w["window"], w["sinks"])
            for w in row.get("windows") or []}


def heal_row(doc: dict, heal_at: float | None) -> int:
    """The index of the row healed: the lowest eval loss among the allocations measured at
    the target ratio heal_at (by default the largest one measured)."""
    rows = [(i, r) for i, r in enumerate(doc["rows"])
            if r["allocation"] not in NOT_AT_A_RATIO]
    if not rows:
        raise ValueError("heal: no setting at a target ratio was measured (every ratio out "
                         "of reach?); nothing to heal")
    at = heal_at if heal_at is not None else max(r["target"] for _, r in rows)
    found = [(r["loss"], i) for i, r in rows if r["target"] == at]
    if not found:
        measured = sorted({r["target"] for _, r in rows})
        raise ValueError(f"heal_at={at:g}: no setting was measured at that ratio (measured: "
                         f"{', '.join(f'{t:g}' for t in measured)})")
    return min(found)[1]


def schedule(steps: int) -> list[int]:
    """The steps after which the eval loss is measured: 0, then doubling up to `steps`."""
    points = {0, steps}
    for k in range(1, CURVE_POINTS - 1):
        points.add(max(1, steps >> k))
    return sorted(points)


def heal(doc: dict, target: Target, cal: Calibration, chosen: dict, options, inputs: ModelData,
         notes: list[str]) -> Healed:
    """Heal the setting heal_row picks for options.heal tokens; doc["heal"] gets the curve.
    The model is left as it was (every weight unchanged, no hook); the adapters are kept
    in the returned Healed for --save to merge."""
    began = time.perf_counter()
    index = heal_row(doc, options.heal_at)
    ranks, windows = chosen[index], row_windows(doc["rows"][index])
    x, y = inputs.heal_data()
    T, batch = x.shape[1], min(inputs.batch_size, len(x))
    steps = max(1, math.ceil(options.heal / (batch * T)))
    if steps * batch > len(x):
        notes.append(f"heal={options.heal}: the healing text holds {len(x)} sequences of {T} "
                     f"tokens; it is read {steps * batch / len(x):.1f} times")
    P = {key: projectors(cal.bases[key], ranks[key], cal.encoders.get(key)) for key in ranks}
    teacher = copy.deepcopy(target.model).eval().requires_grad_(False)
    frozen = {p: p.requires_grad for p in target.model.parameters()}
    surgery = Surgery()
    try:
        target.model.requires_grad_(False)
        target.apply(surgery, P, windows)  # the windowed heads masked, as measured
        with torch.random.fork_rng(devices=[]):  # the same adapters whatever ran before
            torch.manual_seed(HEAL_SEED)
            adapters = [Adapter(linear, rows) for linear, rows in target.adapter_sites(P).items()]
        for a in adapters:
            surgery.hook(a.linear, a.hook)
        curve = _train(adapters, target.logits, target.model, teacher,
                       (x, y), steps, batch, HEAL_LOSSES[options.heal_loss], inputs)
    finally:
        surgery.restore()
        for p, flag in frozen.items():
            p.requires_grad_(flag)
    doc["heal"] = _document(doc, index, options, adapters, curve, (len(x), T, batch, steps),
                            time.perf_counter() - began)
    return Healed(index, ranks, adapters)


def _batches(x: torch.Tensor, y, batch: int, where):
    """Consecutive batches of the healing sequences, cycled."""
    start = 0
    while True:
        rows = torch.arange(start, start + batch) % len(x)
        start += batch
        yield x[rows].to(where), None if y is None else y[rows].to(where)


def _train(adapters: list[Adapter], logits: Callable, model: nn.Module, teacher: nn.Module,
           data: tuple, steps: int, batch: int, objective: Callable,
           inputs: ModelData) -> list[dict]:
    """AdamW on the adapters for `steps` steps; the eval loss at each scheduled step."""
    params = [p for a in adapters for p in a.parameters()]
    opt = torch.optim.AdamW(params, lr=HEAL_LR, weight_decay=0.0)
    where = next(model.parameters()).device
    stream = _batches(*data, batch, where)
    points, T = schedule(steps), data[0].shape[1]
    curve = [_point(0, batch * T, None, inputs.evaluate())]
    seen: list[float] = []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = HEAL_LR * min(1.0, step / WARMUP_STEPS)
        ids, labels = next(stream)
        with torch.no_grad():
            target_logits = logits(teacher, ids)
        loss = objective(logits(model, ids), target_logits, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen.append(loss.item())
        if step in points:
            curve.append(_point(step, batch * T, sum(seen) / len(seen), inputs.evaluate()))
            seen = []
            if inputs.progress is not None:
                inputs.progress(f"heal: {step}/{steps} steps · eval loss "
                                f"{curve[-1]['loss']:.4f}")
    return curve


def _point(step: int, per_step: int, train_loss, metrics: dict) -> dict:
    return {"step": step, "tokens": step * per_step, "train_loss": train_loss,
            **{k: v for k, v in metrics.items() if k not in ("tokens", "per_sequence")}}


def _document(doc: dict, index: int, options, adapters: list[Adapter], curve: list[dict],
              sizes: tuple, seconds: float) -> dict:
    """doc["heal"]: the setting healed, how, and the curve (each point's loss change
    against the full cache's loss)."""
    row, base = doc["rows"][index], doc["rows"][0]["loss"]
    n, T, batch, steps = sizes
    for point in curve:
        point["delta_loss"] = point["loss"] - base
    return {"row": index, "setting": setting_name(row), "ratio": row["ratio"],
            "objective": options.heal_loss, "asked_tokens": options.heal,
            "tokens": steps * batch * T, "steps": steps, "batch_size": batch, "seq_len": T,
            "sequences": n, "lr": HEAL_LR,
            "adapters": {"rank": LORA_RANK, "alpha": LORA_ALPHA, "projections": len(adapters),
                         "params": sum(p.numel() for a in adapters for p in a.parameters())},
            "full_loss": base, "tolerance": doc["tolerance"], "curve": curve,
            "seconds": seconds}


# ---------------------------------------------------------------- healing data

def hf_heal_data(calib_data: bytes, eval_data: bytes, tokenizer, vocab: int, seq_len: int,
                 calib_size: int, overlap: bool, text: str, bos: int | None,
                 notes: list[str]) -> tuple[torch.Tensor, None]:
    """Every whole sequence of the calibration text ([N, seq_len]); only its calibration
    tokens when the evaluation reads the same file after them."""
    from ...hf import token_ids

    ids = token_ids(calib_data, tokenizer, vocab, f"text={text}")
    body = seq_len - (bos is not None)
    if eval_data == calib_data and not overlap:
        ids = ids[:calib_size * body]
        notes.append(f"heal: on the calibration's {len(ids)} tokens of text={text} alone "
                     f"(what follows them is evaluated)")
    return cut(ids, seq_len, len(ids) // body, "heal", f"text={text}", bos=bos), None


def zoo_heal_data(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A run's training split (inputs, labels), rebuilt from config.yaml as training built
    it: the calibration's source."""
    from ...config.sections import DataConfig, parse_section
    from ...data import make_splits

    data = parse_section(config["data"], DataConfig, "data")
    (train_x, train_y), _ = make_splits(data.spec(), data.train_size, data.val_size,
                                        int(config["seed"]))
    return train_x, train_y
