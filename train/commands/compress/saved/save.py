"""`--save DIR`: the model compressed at the verdict's setting (or the healed one), with its bases.

    check_save_dir(options.save, target.saveable)    # before any work
    save_compressed(doc, target, cal, chosen, options, notes, write, healed, data)

The setting saved is the largest measured ratio within the tolerance, or with --heal the
setting healed, its adapters merged into the projected weights
(train/commands/compress/heal.py); a zoo model is written as a run's variant
(checkpoints/last.ckpt, config.yaml), a Hugging Face model with save_pretrained; beside
it bases.pt (the bases and ranks per slot) and compress.json. The directory is then
loaded back (load.py) and one evaluation sequence of `length` tokens decoded through the
low-rank cache (train/commands/compress/target/cache.py): doc["saved"]["cache"] holds the
bytes that cache held against the row's bytes_per_token x tokens, and its logits' largest
difference from the measured model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ....render.compress import setting_name
from ....rundir.files import atomic_path, write_json, write_yaml
from ....rundir.layout import VariantFiles
from ..bases.calibrate import Calibration
from ..bases.lowrank import projectors
from ..heal import Healed, ModelData, row_windows
from ..options import CompressOptions
from ..target.protocol import Target
from ..target.surgery import Surgery

# the document's fields compress.json repeats beside the saved row
SAVED_FIELDS = ("schema", "version", "source", "model", "layers", "kept", "family", "keys",
                "rope", "cache_dtype", "bytes_per_element", "length")


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


def save_compressed(doc: dict, target: Target, cal: Calibration, chosen: dict,
                    options: CompressOptions, notes: list[str],
                    write: Callable[[Path], None], healed: Healed | None = None,
                    data: ModelData | None = None) -> None:
    """The model at the verdict's setting (the largest measured ratio within the
    tolerance), or the healed one with its adapters merged, written into options.save with
    its bases; nothing, and a note, when there is none. With `data`, the saved directory is
    loaded back and decoded through the low-rank cache (doc["saved"]["cache"])."""
    index = healed.row if healed is not None else _verdict_row(doc, options, notes)
    if index is not None and row_windows(doc["rows"][index]):
        notes.append(f"save={options.save}: nothing written: {setting_name(doc['rows'][index])} "
                     f"reads {len(row_windows(doc['rows'][index]))} KV heads through a window "
                     f"and sinks, a mask rather than a change of weights, which neither the "
                     f"saved weights nor the low-rank cache hold")
        index = None
    if index is None:
        doc["saved"] = None
        return
    ranks = chosen[index]
    out = Path(options.save)
    out.mkdir(parents=True, exist_ok=True)
    P = {key: projectors(cal.bases[key], ranks[key], cal.encoders.get(key)) for key in ranks}
    surgery = Surgery()
    try:
        target.apply(surgery, P)
        if healed is not None:
            healed.merge(surgery)
        write(out)
        sample = None if data is None else _sample(doc, target, data)
        reference = None if sample is None else served_logits(target, sample)
    finally:
        surgery.restore()
    with atomic_path(out / "bases.pt") as tmp:  # whole or not at all
        torch.save(_bases(target, cal, ranks), tmp)
    row = doc["rows"][index]
    doc["saved"] = {"dir": str(out), "row": index, "ratio": row["ratio"],
                    "setting": setting_name(row), "bases": str(out / "bases.pt"),
                    "healed": None if healed is None else doc["heal"]["curve"][-1]}
    info = {k: doc[k] for k in SAVED_FIELDS} | {"row": row, "saved": doc["saved"]}
    if sample is not None:
        doc["saved"]["cache"] = _check_cache(out, info, sample, reference, notes)
    write_json(out / "compress.json", info)


def _verdict_row(doc: dict, options: CompressOptions, notes: list[str]) -> int | None:
    """The row of the largest measured ratio within the tolerance; None, and a note, when
    there is none or it keeps a cache no smaller than the full one."""
    v = doc["verdict"]
    best = v["largest_ratio_within"]
    if best is not None and best <= 1:  # a cache no smaller than the full one: no saving
        notes.append(f"save={options.save}: nothing written: the settings within the "
                     f"tolerance of {options.tolerance:g} keep a cache no smaller than the "
                     f"full one (at best {best:.2f}x, {v['largest_within']})")
        return None
    within = [(r["ratio"], -i) for i, r in enumerate(doc["rows"])
              if i and r["allocation"] != "full" and r["delta_loss"] <= options.tolerance
              and r["ratio"] > 1 and not row_windows(r)]  # what a cache of codes holds
    windowed = (f"{v['largest_within']} reads KV heads through windows and sinks, a mask "
                f"that neither the saved weights nor the low-rank cache hold")
    if not within:
        why = (f"{windowed}, and no low-rank setting is within the tolerance of "
               f"{options.tolerance:g}" if best is not None else
               f"no measured setting keeps the loss within the tolerance of "
               f"{options.tolerance:g}")
        notes.append(f"save={options.save}: nothing written: {why}")
        return None
    index = -max(within)[1]
    if doc["rows"][index]["ratio"] < best:
        notes.append(f"save={options.save}: {windowed}: saved the largest low-rank setting "
                     f"within the tolerance instead")
    return index


def _sample(doc: dict, target: Target, data: ModelData) -> torch.Tensor:
    """One sequence [1, n] of the evaluation tokens, n = the document's length (fewer when
    the evaluation or a zoo model's max_len holds fewer)."""
    flat = data.eval_tokens.flatten()
    n = min(int(doc["length"]), flat.numel(), getattr(target.model, "max_len", flat.numel()))
    return flat[:n][None]


def served_logits(target: Target, ids: torch.Tensor) -> torch.Tensor:
    """The logits [1, n, vocab] of the model as compress measured it (surgery in force),
    in one parallel forward pass without a cache."""
    with torch.no_grad():
        return target.logits(target.model,
                             ids.to(next(target.model.parameters()).device)).float()


def _check_cache(out: Path, info: dict, sample: torch.Tensor, reference: torch.Tensor,
                 notes: list[str]) -> dict | None:
    """The saved model loaded back and the sample decoded through its low-rank cache: the
    bytes it holds against the row's bytes_per_token x tokens, and the logits against the
    measured model's; None, and a note, where the cache does not serve the model."""
    from .load import load_saved, measure_saved

    try:
        saved = load_saved(out, info, str(reference.device))
        check = measure_saved(saved, sample, reference)  # a partial RoPE fails at decoding
    except ValueError as e:
        notes.append(f"save={out}: written, but not decoded through the low-rank cache: {e}")
        return None
    if check["held_bytes"] != check["reported_bytes"]:
        why = ("; a hybrid's kept states are held at the model's dtype, counted at the "
               "cache dtype" if info.get("kept") else "")
        notes.append(f"save={out}: the low-rank cache held {check['held_bytes']} B for "
                     f"{check['tokens']} tokens, the row counts {check['reported_bytes']:g}"
                     f"{why}")
    return check


def _bases(target: Target, cal: Calibration, ranks: dict) -> dict:
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


def save_hf(out: Path, target: Target, tokenizer) -> None:
    """The Hugging Face model (its weights now projected) and its tokenizer."""
    target.model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
