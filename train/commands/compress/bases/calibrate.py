"""Calibration and evaluation data, and the bases fitted on the calibration activations.

    calib, eval_x, eval_y = zoo_data(config, options, notes)   # a run's splits
    calib, evals = hf_data(calib_bytes, eval_bytes, tokenizer, vocab, seq_len, ...)
    cal = calibrate(target, calib, batch_size, "output")        # per slot: stats, bases

A zoo run calibrates on the first sequences of its training split and is evaluated on its
validation split, both rebuilt from config.yaml and its seed as training built them
(train/data/loaders.py make_splits). A Hugging Face model calibrates on the start of one
text and is evaluated on another, or on what follows the calibration tokens of the same.
Evaluation sequences equal to a calibration sequence are left out unless overlap is asked.

Bases: "energy" keeps each slot's top directions by energy; "output" (the default) weighs
each slot's error as its reader sees it where the target supplies a weight (keys: the
queries and the attention, values: W_O and the attention, a state's rows: what reads
them; readout.py), and keeps energy bases for the slots it supplies none for (cal.used
says which). Output-aware gains are squared output errors per token, divided by
the mean squared norm of the residual stream entering the layer (what the next norm
divides by): one scale over slots and layers (cal.one_scale), which the greedy-scaled
allocation compares as they are; the greedy allocation compares each gain as a share of
its head's total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..options import ZOO_CALIBRATION, CompressOptions
from .lowrank import SlotStats


def disjoint_rows(calib: torch.Tensor, evals: torch.Tensor) -> torch.Tensor:
    """The indices of the evaluation sequences that are not calibration sequences."""
    seen = {tuple(row) for row in calib.tolist()}
    return torch.tensor([i for i, row in enumerate(evals.tolist()) if tuple(row) not in seen],
                        dtype=torch.long)


def zoo_data(config: dict, options: CompressOptions, notes: list[str], labels: bool = False):
    """(calibration tokens [Nc, T], evaluation tokens and labels [Ne, T]) of a run: the
    first calib_size sequences of its training split and its validation split, rebuilt
    from config.yaml's data section and seed as training built them; `labels`: the
    calibration's labels too, second: (calib, calib labels, eval, eval labels)."""
    from ....config.sections import DataConfig, parse_section
    from ....data import make_splits

    data = parse_section(config["data"], DataConfig, "data")
    (train_x, train_y), (val_x, val_y) = make_splits(data.spec(), data.train_size,
                                                     data.val_size, int(config["seed"]))
    n = options.calib_size or min(ZOO_CALIBRATION, len(train_x))
    source, source_y = (val_x, val_y) if options.overlap else (train_x, train_y)
    if n > len(source):
        raise ValueError(f"calib_size={n}: the {'validation' if options.overlap else 'training'}"
                         f" split holds {len(source)} sequences")
    calib = source[:n]
    if labels:
        return (calib, source_y[:n], *_zoo_eval(calib, val_x, val_y, options, notes, n))
    return (calib, *_zoo_eval(calib, val_x, val_y, options, notes, n))


def _zoo_eval(calib, val_x, val_y, options: CompressOptions, notes: list[str], n: int):
    """(evaluation tokens, labels): the validation split, less the calibration's
    sequences unless overlap."""
    m = options.eval_size or len(val_x)
    if m > len(val_x):
        raise ValueError(f"eval_size={m}: the validation split holds {len(val_x)} sequences")
    eval_x, eval_y = val_x[:m], val_y[:m]
    if options.overlap:
        notes.append(f"calibration on the validation split (overlap asked): the bases are "
                     f"fitted on {n} of the sequences evaluated")
        return eval_x, eval_y
    keep = disjoint_rows(calib, eval_x)
    if len(keep) < m:
        notes.append(f"{m - len(keep)} validation sequences equal calibration sequences "
                     f"and are left out of the evaluation")
    if not len(keep):
        raise ValueError("every evaluation sequence is a calibration sequence")
    return eval_x[keep], eval_y[keep]


def cut(ids: torch.Tensor, seq_len: int, size: int, flag: str, where: str,
        start: int = 0, bos: int | None = None) -> torch.Tensor:
    """size sequences of seq_len tokens from ids[start:], [size, seq_len]; each a BOS
    and seq_len - 1 tokens when `bos` is an id."""
    from ....hf import with_bos

    body = seq_len - (bos is not None)
    need = size * body
    if ids.numel() - start < need:
        after = f" after the first {start} (the calibration's)" if start else ""
        raise ValueError(f"{where}: too short: {max(ids.numel() - start, 0)} tokens{after}, but "
                         f"{flag}={size} x seq_len={seq_len} needs {need}")
    return with_bos(ids[start:start + need].view(size, body), bos)


def hf_data(calib_data: bytes, eval_data: bytes, tokenizer, vocab: int, seq_len: int,
            calib_size: int, eval_size: int, overlap: bool, text: str, eval_text: str,
            notes: list[str], bos: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration ids [Nc, T], evaluation ids [Ne, T]): the start of the calibration
    text; the start of the evaluation text, or, when it is the same text, what follows the
    calibration tokens (overlap: its start). Evaluation sequences equal to a calibration
    sequence are left out unless overlap. Each sequence starts with `bos` when it is an id."""
    from ....hf import token_ids

    calib_ids = token_ids(calib_data, tokenizer, vocab, f"text={text}", notes)
    calib = cut(calib_ids, seq_len, calib_size, "calib_size", f"text={text}", bos=bos)
    same = eval_data == calib_data
    eval_ids = calib_ids if same else token_ids(eval_data, tokenizer, vocab,
                                                f"eval_text={eval_text}")
    start = calib_size * (seq_len - (bos is not None)) if same and not overlap else 0
    if same:
        notes.append(f"eval_text={eval_text} holds the calibration text: " + (
            "evaluation on its first tokens, as asked (overlap)" if overlap else
            f"evaluation starts after its first {start} tokens (the calibration's)"))
    evals = cut(eval_ids, seq_len, eval_size, "eval_size", f"eval_text={eval_text}", start,
                bos)
    if overlap:
        return calib, evals
    keep = disjoint_rows(calib, evals)
    if len(keep) < len(evals):
        notes.append(f"{len(evals) - len(keep)} evaluation sequences equal calibration "
                     f"sequences and are left out")
    if not len(keep):
        raise ValueError(f"eval_text={eval_text}: every evaluation sequence is a "
                         f"calibration sequence (pass overlap to measure on them)")
    return calib, evals[keep]


@dataclass
class Calibration:
    """Per slot its statistics, bases and gains; the calibration's size and time."""

    stats: dict
    bases: dict = field(default_factory=dict)
    energy: dict = field(default_factory=dict)  # the gain per direction the greedy weighs
    encoders: dict = field(default_factory=dict)  # output bases: E [G, K, K]; energy: None
    used: dict = field(default_factory=dict)  # slot key -> "output" | "energy"
    residual: dict = field(default_factory=dict)  # layer -> mean ||h||^2 entering it
    one_scale: bool = False  # every gain in squared output error per token (greedy-scaled)
    data: torch.Tensor | None = None  # the calibration tokens [N, T] (allocation/sensitivity.py)
    labels: torch.Tensor | None = None  # their labels (zoo), None: every next token (HF)
    batch_size: int = 1
    sensitivity: object = None  # allocation/sensitivity.py's, once measure() ran
    grid: tuple = ()  # the windows it priced (windows.py window_grid)
    sequences: int = 0
    tokens: int = 0
    seconds: float = 0.0


def calibrate(target, tokens: torch.Tensor, batch_size: int, bases: str = "energy",
              labels: torch.Tensor | None = None) -> Calibration:
    """The statistics of every slot of `target` (a ZooTarget or an HFTarget) over tokens
    [N, T], in batches, and the basis and gains each gives (bases: energy or output); the
    tokens and `labels` (a zoo run's: the positions whose loss counts) are kept for the
    sensitivity pass and the calibration check."""
    start = time.perf_counter()
    stats = {s.key: SlotStats(s) for s in target.slots}
    where = next(target.model.parameters()).device
    output = bases == "output"
    residual: dict[int, list[float]] = {}
    for i in range(0, len(tokens), batch_size):
        batch = tokens[i:i + batch_size]
        weights: dict | None = {} if output else None
        energies: dict[int, float] = {}
        for key, a in target.activations(batch.to(where), weights, energies).items():
            stats[key].add(a)
        for key, w in (weights or {}).items():  # readout.py Weight
            stats[key].add_weight(w.matrix, batch.numel(), w.spread)
        for layer, e in energies.items():
            acc = residual.setdefault(layer, [0.0, 0])
            acc[0], acc[1] = acc[0] + e * batch.numel(), acc[1] + batch.numel()
    cal = Calibration(stats, sequences=len(tokens), tokens=tokens.numel(), data=tokens,
                      labels=labels, batch_size=batch_size,
                      residual={layer: total / n for layer, (total, n) in residual.items()})
    for key, st in stats.items():
        fit_basis(cal, key, st)
    cal.one_scale = target.one_scale and all(
        used == "output" for used in cal.used.values())
    cal.seconds = time.perf_counter() - start
    return cal


def fit_basis(cal: Calibration, key: tuple[int, str], st: SlotStats) -> None:
    """The slot's basis, encoders and gains into cal: output-aware where it has a weight
    (gains over the residual stream's mean squared norm at its layer), else by energy."""
    if st.weight is None:
        (cal.bases[key], cal.energy[key]), cal.encoders[key] = st.basis(), None
        cal.used[key] = "energy"
        return
    cal.bases[key], cal.encoders[key], gain = st.output_basis()
    stream = cal.residual.get(key[0])
    cal.energy[key] = gain / stream if stream else gain
    cal.used[key] = "output"
