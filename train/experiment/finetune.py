"""The LoRA fine-tuning stage: adapt pretrained variants to a second task, sweeping r.

The `finetune` section (train/config/stage_sections.py) names the variants, the ranks r, the
targets and the second task. After the variants train, each base checkpoint
runs/<exp>/<variant>/checkpoints/last.ckpt is loaded, adapters are attached
(train/lm/lora.py) and only they train, on the new task, through train/harness/fit.py's fit_run.
Each fine-tune is a variant-like directory runs/<exp>/<variant>.lora-r<r>/ (config.yaml,
checkpoints/, ranks.jsonl with the adapter axis, report.json), so `rankzoo report` shows it
beside the pretrained variants. runs/<exp>/finetune.json sums the sweep up per variant:
r vs the adapter rank realized (mean over adapted modules), and validation metrics, so it
shows where the realized rank stops growing with r.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console

import budgets

from ..config import Experiment, lora_name, variant_targets
from ..data import IGNORE, accuracy
from ..harness.fit import RunSpec, fit_run, is_global_zero
from ..harness.module import LMModule
from ..lm.lora import attach_lora
from ..render.finetune import finetune_table
from ..rundir.files import read_yaml, write_json
from ..rundir.layout import VariantFiles
from ..rundir.read import finite_metrics, last_record, load_checkpoint

SUMMARY_FILE = "finetune.json"
__all__ = ["SUMMARY_FILE", "finetune_experiment", "finetune_variant", "lora_name",
           "summarize"]


def finetune_experiment(exp: Experiment, exp_dir: Path, resume: bool = False,
                        console: Console | None = None,
                        sources: dict[str, str] | None = None) -> dict[str, dict]:
    """Every fine-tune of `exp.finetune`; returns their report entries by directory name
    (empty on a non-zero rank) and, on rank zero, writes and prints the summary.
    `sources` maps a variant to the run it starts from (a sweep's best run)."""
    console = console or Console(stderr=True)
    entries = {}
    runs = [(v, r) for v in exp.finetune_variants() for r in exp.finetune.ranks]
    for i, (variant, r) in enumerate(runs, 1):
        name = lora_name(variant, r)
        console.rule(f"fine-tune {i}/{len(runs)}: {name}")
        if sources is not None and variant not in sources:
            console.print(f"{name}: no finished run of {variant} to start from; skipped")
            continue
        entry = finetune_variant(exp, variant, r, Path(exp_dir), console, resume=resume,
                                 source=(sources or {}).get(variant))
        if entry is not None:
            entries[name] = entry
    if is_global_zero():
        summary = summarize(exp, Path(exp_dir))
        write_json(Path(exp_dir) / SUMMARY_FILE, summary)
        console.print(finetune_table(summary))
    return entries


def finetune_variant(exp: Experiment, variant: str, r: int, exp_dir: Path,
                     console: Console, resume: bool = False,
                     source: str | None = None) -> dict | None:
    """Fine-tune the adapters of one pretrained variant at rank r, starting from the run
    `source` (default: the variant's own directory; in a sweep, its best run); return its
    report entry (None on a non-zero rank of a distributed run, which trains alongside,
    writing nothing)."""
    name, exp_dir = lora_name(variant, r), Path(exp_dir)
    base_ckpt = base_checkpoint(exp_dir, name, variant, source, resume)
    base, state, base_step = load_base(base_ckpt)
    config = finetune_config(exp, variant, r, base, base_ckpt, base_step)
    if resume:  # first: a finished fine-tune of another config is not this one's result
        _check_same_config(exp_dir / name, config)
    build = functools.partial(adapted_module, config, state, r)
    return fit_run(RunSpec(name, exp.finetune_view(), config, build), exp_dir, resume, console)


def base_checkpoint(exp_dir: Path, name: str, variant: str, source: str | None,
                    resume: bool) -> Path:
    """The pretrained checkpoint a fine-tune starts from, after the checks that nothing is
    missing and nothing already written would be overwritten."""
    base_ckpt = VariantFiles(Path(exp_dir) / (source or variant)).checkpoint
    if not base_ckpt.is_file():
        raise FileNotFoundError(f"fine-tune {name}: no pretrained checkpoint {base_ckpt} "
                                f"(train variant {variant!r} first)")
    if (Path(exp_dir) / name).exists() and not resume:
        raise FileExistsError(f"fine-tune directory {Path(exp_dir) / name} already exists; "
                              "pass --resume to continue it or --overwrite to redo the run")
    return base_ckpt


def load_base(path: Path) -> tuple[dict, dict, int]:
    """(resolved variant config, model state dict, step) of a pretrained checkpoint."""
    ckpt = load_checkpoint(path)
    if ckpt.config is None:
        raise ValueError(f"{path}: holds no config (hyper_parameters): not the checkpoint "
                         "of a rankzoo run")
    return dict(ckpt.config), ckpt.model_state, ckpt.step or 0


def finetune_config(exp: Experiment, variant: str, r: int, base: dict, base_ckpt: Path,
                    base_step: int) -> dict:
    """The fine-tune's resolved config: the base model, the new data and train sections,
    and what it was adapted from."""
    ft, view = exp.finetune, exp.finetune_view()
    config = {**base, "variant": lora_name(variant, r),
              "data": {**ft.data.to_dict(), "vocab_size": ft.data.vocab_size},
              # the base model's sizes: the new task may use fewer tokens or positions
              "model": {**base["model"], "vocab_size": base["data"]["vocab_size"],
                        "max_len": base["data"]["seq_len"]},
              "train": view.train.to_dict()}
    config.pop("data_intrinsic_rank", None)
    if ft.data.intrinsic_rank is not None:
        config["data_intrinsic_rank"] = ft.data.intrinsic_rank
    alpha = ft.alpha_for(r)
    config["finetune"] = {"base_variant": variant, "base_checkpoint": str(base_ckpt),
                          "base_step": base_step, "r": r, "alpha": alpha,
                          "scaling": alpha / r,
                          "targets": variant_targets(exp, variant, ft.targets)}
    return config


def _check_same_config(vdir: Path, config: dict) -> None:
    """A resumed fine-tune must continue the same one, not a changed r, data or train."""
    path = VariantFiles(vdir).config
    if not path.is_file():
        return
    old = read_yaml(path) or {}
    for key in ("data", "train", "finetune"):
        mine = {k: v for k, v in config.get(key, {}).items() if k != "base_checkpoint"}
        theirs = {k: v for k, v in (old.get(key) or {}).items()
                  if k not in ("base_checkpoint", "adapted", "trainable_params", "zero_shot")}
        if mine != theirs:
            raise FileExistsError(f"{vdir} holds a fine-tune with a different {key} section "
                                  f"({theirs} != {mine}); pass --overwrite to redo the run")


def adapted_module(config: dict, state: dict, r: int, val_loader) -> LMModule:
    """The pretrained model with LoRA adapters of rank r attached, base frozen; records in
    config["finetune"] what was adapted, how much trains, and the zero-shot metrics."""
    module = LMModule(config)
    module.model.load_state_dict(state)
    f = config["finetune"]
    f["adapted"] = attach_lora(module.model, f["targets"], r, f["alpha"])
    f["trainable_params"] = sum(p.numel() for p in module.parameters() if p.requires_grad)
    f["zero_shot"] = evaluate(module, val_loader)
    return module


@torch.no_grad()
def evaluate(module: LMModule, loader) -> dict[str, float]:
    """Loss and accuracy at the labelled positions (the zero-shot figures, before any
    adapter step: B = 0, so the adapted model is the pretrained one)."""
    was_training, loss_sum, correct, count = module.training, 0.0, 0.0, 0
    module.eval()
    for tokens, labels in loader:
        logits = module(tokens)  # [B, T, vocab]
        loss_sum += float(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                          ignore_index=IGNORE, reduction="sum"))
        acc, n = accuracy(logits, labels)
        correct, count = correct + float(acc) * n, count + n
    module.train(was_training)
    return {"val/loss": loss_sum / max(count, 1), "val/accuracy": correct / max(count, 1)}


# ---------------------------------------------------------------- the stage's summary

def summarize(exp: Experiment, exp_dir: Path) -> dict:
    """finetune.json: per base variant, one row per r (those with a report so far)."""
    ft, out = exp.finetune, {}
    for variant in exp.finetune_variants():
        vdirs = [exp_dir / lora_name(variant, r) for r in ft.ranks]
        out[variant] = [summary_row(v) for v in vdirs if VariantFiles(v).report.is_file()]
    return {"experiment": exp.name, "eps": exp.monitor.eps, "finetune": ft.to_dict(),
            "variants": out}


def summary_row(vdir: Path) -> dict:
    """r vs the adapter rank realized (mean and max over adapted modules) and metrics."""
    files = VariantFiles(vdir)
    config = read_yaml(files.config) or {}
    f, record = config["finetune"], last_record(files.ranks)
    rows = [a for layer in record["layers"] for a in layer.get("adapters", [])]
    metric = {m: [a["metrics"][m] for a in rows] for m in ("erank", "numerical_rank",
                                                            "rank_eps")}
    report = budgets.load_report(files.report)["variants"][0]
    return {"run": vdir.name, "r": f["r"], "alpha": f["alpha"], "step": record["step"],
            "adapted": len(rows), "trainable_params": f.get("trainable_params"),
            "erank_mean": _mean(metric["erank"]),
            "numerical_rank_mean": _mean(metric["numerical_rank"]),
            "numerical_rank_max": max(metric["numerical_rank"], default=None),
            "rank_eps_mean": _mean(metric["rank_eps"]),
            "zero_shot": f.get("zero_shot", {}),
            "metrics": finite_metrics({k: v for k, v in report["metrics"].items()
                                       if k in ("val/accuracy", "val/loss")})}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
