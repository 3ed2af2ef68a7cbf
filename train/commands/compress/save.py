"""`--save DIR`: the model compressed at the verdict's setting, with its bases.

    check_save_dir(options.save, target.saveable)    # before any work
    save_compressed(doc, target, cal, chosen, options, notes, write)

The setting saved is the largest measured ratio within the tolerance; a zoo model is
written as a run's variant (checkpoints/last.ckpt, config.yaml), a Hugging Face model with
save_pretrained; beside it bases.pt (the bases and ranks per slot) and compress.json.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ...render.compress import setting_name
from ...rundir.files import atomic_path, write_json, write_yaml
from ...rundir.layout import VariantFiles
from .calibrate import Calibration
from .lowrank import projectors
from .options import CompressOptions
from .surgery import Surgery

# the document's fields compress.json repeats beside the saved row
SAVED_FIELDS = ("schema", "version", "source", "model", "cache_dtype", "length")


def check_save_dir(save: str | None, saveable: str | None = None) -> None:
    """Refuse a --save DIR that is a file or a non-empty directory, or a compression that
    is no change of weights, before any work."""
    if save is None:
        return
    path = Path(save)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"save={save}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        raise FileExistsError(f"save={save}: directory is not empty; name a new or empty "
                              f"directory (nothing was written)")
    if saveable is not None:
        raise ValueError(f"save={save}: {saveable}; there is no compressed model to save "
                         f"(the bases are in --format json)")


def save_compressed(doc: dict, target, cal: Calibration, chosen: dict,
                    options: CompressOptions, notes: list[str],
                    write: Callable[[Path], None]) -> None:
    """The model at the verdict's setting (the largest measured ratio within the
    tolerance) written into options.save with its bases; nothing, and a note, when none."""
    v = doc["verdict"]
    best = v["largest_ratio_within"]
    if best is not None and best <= 1:  # a cache no smaller than the full one: no saving
        doc["saved"] = None
        notes.append(f"save={options.save}: nothing written: the settings within the "
                     f"tolerance of {options.tolerance:g} keep a cache no smaller than the "
                     f"full one (at best {best:.2f}x, {v['largest_within']})")
        return
    index = next((i for i, r in enumerate(doc["rows"])
                  if i and r["allocation"] != "full"
                  and r["ratio"] == v["largest_ratio_within"]), None)
    if index is None:
        doc["saved"] = None
        notes.append(f"save={options.save}: nothing written: no measured setting keeps the "
                     f"loss within the tolerance of {options.tolerance:g}")
        return
    ranks = chosen[index]
    out = Path(options.save)
    out.mkdir(parents=True, exist_ok=True)
    P = {key: projectors(cal.bases[key], ranks[key], cal.encoders.get(key)) for key in ranks}
    surgery = Surgery()
    try:
        target.apply(surgery, P)
        write(out)
    finally:
        surgery.restore()
    with atomic_path(out / "bases.pt") as tmp:  # whole or not at all
        torch.save(_bases(target, cal, ranks), tmp)
    row = doc["rows"][index]
    doc["saved"] = {"dir": str(out), "row": index, "ratio": row["ratio"],
                    "setting": setting_name(row), "bases": str(out / "bases.pt")}
    write_json(out / "compress.json", {k: doc[k] for k in SAVED_FIELDS}
               | {"row": row, "saved": doc["saved"]})


def _bases(target, cal: Calibration, ranks: dict) -> dict:
    """bases.pt: the slots, and per slot ("layer.kind") its ranks and each head's kept
    basis [K, r]."""
    return {"slots": [asdict(s) for s in target.slots],
            "ranks": {f"{k[0]}.{k[1]}": list(r) for k, r in ranks.items()},
            "bases": {f"{k[0]}.{k[1]}": [cal.bases[k][g, :, :r].float().contiguous()
                                         for g, r in enumerate(ranks[k])]
                      for k in ranks},
            # output bases: the encoder rows E_r [r, K] giving the codes (energy: U_r^T)
            "encoders": {f"{k[0]}.{k[1]}": None if cal.encoders.get(k) is None else
                         [cal.encoders[k][g, :r].float().contiguous()
                          for g, r in enumerate(ranks[k])] for k in ranks}}


def save_zoo(out: Path, model: nn.Module, config: dict) -> None:
    """A checkpoint laid out like a run's (checkpoints/last.ckpt: state_dict under
    "model.", the config under hyper_parameters) and its config.yaml."""
    files = VariantFiles(out)
    files.checkpoint.parent.mkdir(exist_ok=True)
    with atomic_path(files.checkpoint) as tmp:
        torch.save({"state_dict": {f"model.{k}": v.detach().clone()
                                   for k, v in model.state_dict().items()},
                    "hyper_parameters": {"config": config}, "global_step": 0}, tmp)
    write_yaml(files.config, config)


def save_hf(out: Path, target, tokenizer) -> None:
    """The Hugging Face model (its weights now projected) and its tokenizer."""
    target.model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
