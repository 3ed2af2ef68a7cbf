"""The LoRA fine-tuning stage: adapt pretrained variants to a second task, sweeping r.

    finetune:
      from_variants: [mha, ssm]          # default: every variant
      ranks: [1, 2, 4, 8]                # one fine-tune per r
      alpha: null                        # null: alpha = r, so scaling = 1 at every r
      targets: [v_proj, o_proj, in_proj] # PEFT-like names; per variant, those it has
      data: {task: mqar, permute_seed: 1, ...}   # the second task (a full data section)
      train: {max_steps: 200, lr: 1.0e-2}        # overrides of the experiment's train

After the variants train, each base checkpoint runs/<exp>/<variant>/checkpoints/last.ckpt
is loaded, adapters are attached (train/lora.py) and only they train, on the new task.
Each fine-tune is a variant-like directory runs/<exp>/<variant>.lora-r<r>/ (config.yaml,
checkpoints/, ranks.jsonl with the adapter axis, report.json), so `rankzoo report` shows it
beside the pretrained variants. runs/<exp>/finetune.json sums the sweep up per variant:
r vs the adapter rank realized (mean over adapted modules), and validation metrics, so it
shows where the realized rank stops growing with r.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
import yaml
from rich.console import Console
from rich.table import Table

import budgets
from zoo.config import StrictConfig, unknown_key_error

from .data import IGNORE, accuracy, make_loaders
from .experiment import DataConfig, Experiment, TrainConfig, _section, check_data_keys
from .lora import attach_lora, target_matches
from .module import LMModule, build_model
from .results import finished_entry, finite_metrics, last_record

SUMMARY_FILE = "finetune.json"


def lora_name(variant: str, r: int) -> str:
    """The fine-tune's directory name beside its base variant's."""
    return f"{variant}.lora-r{r}"


def _positive_ints(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value))


def _names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v
                                                           for v in value)


@dataclass(frozen=True)
class FinetuneConfig(StrictConfig):
    """The `finetune` section; built by parse_finetune, which also checks it against the
    experiment (variants, vocabulary, targets)."""

    owner: ClassVar[str] = 'finetune'

    data: DataConfig
    from_variants: list | None = None  # None: every variant
    ranks: list = field(default_factory=lambda: [4])
    alpha: float | None = None  # None: alpha = r (scaling 1 for every r of the sweep)
    targets: list = field(default_factory=lambda: ["v_proj"])
    train: dict = field(default_factory=dict)  # overrides of the experiment's train section

    def validate(self) -> None:
        if not _positive_ints(self.ranks) or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"finetune.ranks must be a non-empty list of distinct ints "
                             f">= 1, got {self.ranks!r}")
        if self.alpha is not None and (isinstance(self.alpha, bool)
                                       or not isinstance(self.alpha, (int, float))
                                       or not self.alpha > 0):
            raise ValueError(f"finetune.alpha must be a number > 0 or null, got {self.alpha!r}")
        if not _names(self.targets):
            raise ValueError(f"finetune.targets must be a non-empty list of projection "
                             f"names (e.g. [q_proj, v_proj]), got {self.targets!r}")
        if self.from_variants is not None and not _names(self.from_variants):
            raise ValueError(f"finetune.from_variants must be a non-empty list of variant "
                             f"names or null, got {self.from_variants!r}")

    def alpha_for(self, r: int) -> float:
        return float(r if self.alpha is None else self.alpha)

    def variants(self, exp: Experiment) -> list[str]:
        return list(self.from_variants or base_variants(exp))

    def train_config(self, base: TrainConfig) -> TrainConfig:
        return TrainConfig(**{**base.to_dict(), **self.train})

    def to_dict(self) -> dict[str, Any]:
        return {"from_variants": self.from_variants, "ranks": list(self.ranks),
                "alpha": self.alpha, "targets": list(self.targets),
                "data": self.data.to_dict(), "train": dict(self.train)}


FINETUNE_KEYS = [f.name for f in dataclasses.fields(FinetuneConfig)]


def base_variants(exp: Experiment) -> dict[str, str]:
    """Configured variant -> one of its runs (itself, or in a sweep its first grid point,
    which builds the same model): what `from_variants` names."""
    out: dict[str, str] = {}
    for name, v in exp.variants.items():
        out.setdefault(v.base or name, name)
    return out


# ---------------------------------------------------------------- parsing

def _prefixed(e: ValueError, section: str) -> ValueError:
    """An error of the data or train section, named under finetune."""
    msg = str(e)
    return ValueError(f"finetune.{msg}" if msg.startswith(section + ".")
                      else f"finetune.{section}: {msg}")


def _parse_data(raw: Any) -> DataConfig:
    if raw is None:
        raise ValueError("finetune.data is missing: the second task's data section "
                         "(e.g. {task: mqar, permute_seed: 1})")
    try:
        if isinstance(raw, dict):
            check_data_keys(raw)
        return _section(raw, DataConfig, "data")
    except ValueError as e:
        raise _prefixed(e, "data") from None


def _parse_train(raw: Any, base: TrainConfig) -> dict:
    overrides = dict(raw or {}) if isinstance(raw, dict) or raw is None else raw
    try:
        _section(overrides, TrainConfig, "train")  # unknown keys, types
        TrainConfig(**{**base.to_dict(), **overrides})  # the merged values
    except ValueError as e:
        raise _prefixed(e, "train") from None
    return overrides


def parse_finetune(raw: Any, exp: Experiment) -> FinetuneConfig:
    """The `finetune` section of `exp`, validated, including against the experiment."""
    if not isinstance(raw, dict):
        raise ValueError(f"finetune must be a mapping of keys to values, got {raw!r}")
    for key in raw:
        if key not in FINETUNE_KEYS:
            raise unknown_key_error("experiment", f"finetune.{key}",
                                    [f"finetune.{k}" for k in FINETUNE_KEYS])
    kwargs = {**raw, "data": _parse_data(raw.get("data")),
              "train": _parse_train(raw.get("train"), exp.train)}
    ft = FinetuneConfig(**kwargs)
    _check_against(ft, exp)
    return ft


def _check_against(ft: FinetuneConfig, exp: Experiment) -> None:
    if exp.sweep is not None and exp.train.devices not in (1, "1"):
        # the best run is chosen on rank zero from the written reports; other ranks of a
        # distributed run could not know it
        raise ValueError(f"finetune after a sweep runs on one device, got train.devices "
                         f"{exp.train.devices!r}")
    bases = base_variants(exp)
    unknown = [v for v in ft.from_variants or () if v not in bases]
    if unknown:
        raise ValueError(f"finetune.from_variants {unknown} are not variants of this "
                         f"experiment: {list(bases)}")
    d, base = ft.data, exp.data
    if d.vocab_size > base.vocab_size:
        raise ValueError(f"finetune.data.vocab_size ({d.vocab_size}) exceeds the pretrained "
                         f"models' embedding (data.vocab_size {base.vocab_size})")
    if d.seq_len > base.seq_len:
        raise ValueError(f"finetune.data.seq_len ({d.seq_len}) exceeds the pretrained "
                         f"models' max length (data.seq_len {base.seq_len})")
    for variant in ft.variants(exp):
        clash = [lora_name(variant, r) for r in ft.ranks if lora_name(variant, r) in exp.variants]
        if clash:
            raise ValueError(f"finetune: directory names {clash} are taken by variants")
        if not variant_targets(exp, variant, ft.targets):
            raise ValueError(f"finetune.targets {ft.targets} match no nn.Linear of variant "
                             f"{variant!r}; its Linear names: {linear_names(exp, variant)}")


def linear_names(exp: Experiment, variant: str) -> list[str]:
    """Dotted names of a variant's nn.Linear modules, from a weightless (meta) build."""
    with torch.device("meta"):
        model = build_model(exp.variant_config(base_variants(exp).get(variant, variant)))
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def variant_targets(exp: Experiment, variant: str, targets: list[str]) -> list[str]:
    """The targets a variant has: an experiment mixes blocks (q_proj in attention,
    in_proj in the SSM), so each variant adapts the projections it has."""
    names = linear_names(exp, variant)
    return [t for t in targets if any(target_matches(n, t) for n in names)]


# ---------------------------------------------------------------- one fine-tune

def finetune_view(exp: Experiment) -> Experiment:
    """The experiment as a fine-tune sees it: the second task's data, the merged train."""
    ft = exp.finetune
    return dataclasses.replace(exp, data=ft.data, train=ft.train_config(exp.train))


def load_base(path: Path) -> tuple[dict, dict, int]:
    """(resolved variant config, model state dict, step) of a pretrained checkpoint."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    config = dict(ckpt["hyper_parameters"]["config"])
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    return config, state, int(ckpt.get("global_step", 0))


def finetune_config(exp: Experiment, variant: str, r: int, base: dict, base_ckpt: Path,
                    base_step: int) -> dict:
    """The fine-tune's resolved config: the base model, the new data and train sections,
    and what it was adapted from."""
    ft, view = exp.finetune, finetune_view(exp)
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


def _check_same_config(vdir: Path, config: dict) -> None:
    """A resumed fine-tune must continue the same one, not a changed r, data or train."""
    path = vdir / "config.yaml"
    if not path.is_file():
        return
    old = yaml.safe_load(path.read_text()) or {}
    for key in ("data", "train", "finetune"):
        mine = {k: v for k, v in config.get(key, {}).items() if k != "base_checkpoint"}
        theirs = {k: v for k, v in (old.get(key) or {}).items()
                  if k not in ("base_checkpoint", "adapted", "trainable_params", "zero_shot")}
        if mine != theirs:
            raise FileExistsError(f"{vdir} holds a fine-tune with a different {key} section "
                                  f"({theirs} != {mine}); pass --overwrite to redo the run")


def base_checkpoint(exp_dir: Path, name: str, variant: str, source: str | None,
                    resume: bool) -> Path:
    """The pretrained checkpoint a fine-tune starts from, after the checks that nothing is
    missing and nothing already written would be overwritten."""
    base_ckpt = Path(exp_dir) / (source or variant) / "checkpoints" / "last.ckpt"
    if not base_ckpt.is_file():
        raise FileNotFoundError(f"fine-tune {name}: no pretrained checkpoint {base_ckpt} "
                                f"(train variant {variant!r} first)")
    if (Path(exp_dir) / name).exists() and not resume:
        raise FileExistsError(f"fine-tune directory {Path(exp_dir) / name} already exists; "
                              "pass --resume to continue it or --overwrite to redo the run")
    return base_ckpt


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


def finetune_variant(exp: Experiment, variant: str, r: int, exp_dir: Path,
                     console: Console, resume: bool = False,
                     source: str | None = None) -> dict | None:
    """Fine-tune the adapters of one pretrained variant at rank r, starting from the run
    `source` (default: the variant's own directory; in a sweep, its best run); return its
    report entry (None on a non-zero rank of a distributed run, which trains alongside,
    writing nothing)."""
    from .run import _write_yaml, fit, is_global_zero, make_trainer, write_variant_report

    name, view = lora_name(variant, r), finetune_view(exp)
    vdir = Path(exp_dir) / name
    base_ckpt = base_checkpoint(exp_dir, name, variant, source, resume)
    base, state, base_step = load_base(base_ckpt)
    config = finetune_config(exp, variant, r, base, base_ckpt, base_step)
    if resume:  # first: a finished fine-tune of another config is not this one's result
        _check_same_config(vdir, config)
    done = finished_entry(vdir, view.train.max_steps) if resume else None
    if done is not None:
        console.print(f"{name}: finished at step {done['step']}; skipped")
        return done
    L.seed_everything(config["seed"], workers=True, verbose=False)
    train_loader, val_loader = make_loaders(view.data.spec(), view.data.train_size,
                                            view.data.val_size, view.data.batch_size,
                                            seed=config["seed"])
    probe_batch = val_loader.dataset.tensors[0][:exp.monitor.probe_size]  # [P, T], fixed
    module = adapted_module(config, state, r, val_loader)
    params, f = module.model.param_count(), config["finetune"]
    if is_global_zero():
        vdir.mkdir(parents=True, exist_ok=True)
        _write_yaml(vdir / "config.yaml", {**config, "params": params})

    last_ckpt = vdir / "checkpoints" / "last.ckpt"
    ckpt_path = str(last_ckpt) if resume and last_ckpt.is_file() else None
    console.print(f"[bold]{name}[/]: LoRA r={r} alpha={f['alpha']:g} on {len(f['adapted'])} "
                  f"projections ({', '.join(f['targets'])}) of {variant} (step {base_step}), "
                  f"{f['trainable_params']:,} trainable of {params:,} parameters"
                  + (f", resuming from {last_ckpt}" if ckpt_path else ""))
    trainer = make_trainer(view, name, Path(exp_dir), probe_batch, console)
    start = time.perf_counter()
    final = fit(trainer, module, train_loader, val_loader, ckpt_path, view)
    seconds = time.perf_counter() - start
    if not trainer.is_global_zero:
        return None
    console.print(f"{name}: step {trainer.global_step}, val/accuracy "
                  f"{float(final['val/accuracy']):.3f} (zero-shot "
                  f"{f['zero_shot']['val/accuracy']:.3f}), val/loss "
                  f"{float(final['val/loss']):.3f} ({seconds:.0f} s)")
    return write_variant_report(view, name, vdir, params, final, seconds)


# ---------------------------------------------------------------- the stage and its summary

def finetune_experiment(exp: Experiment, exp_dir: Path, resume: bool = False,
                        console: Console | None = None,
                        sources: dict[str, str] | None = None) -> dict[str, dict]:
    """Every fine-tune of `exp.finetune`; returns their report entries by directory name
    (empty on a non-zero rank) and, on rank zero, writes and prints the summary.
    `sources` maps a variant to the run it starts from (a sweep's best run)."""
    from .run import is_global_zero

    console = console or Console(stderr=True)
    ft, entries = exp.finetune, {}
    runs = [(v, r) for v in ft.variants(exp) for r in ft.ranks]
    for i, (variant, r) in enumerate(runs, 1):
        console.rule(f"fine-tune {i}/{len(runs)}: {lora_name(variant, r)}")
        if sources is not None and variant not in sources:
            console.print(f"{lora_name(variant, r)}: no finished run of {variant} to start "
                          "from; skipped")
            continue
        entry = finetune_variant(exp, variant, r, Path(exp_dir), console, resume=resume,
                                 source=(sources or {}).get(variant))
        if entry is not None:
            entries[lora_name(variant, r)] = entry
    if is_global_zero():
        summary = summarize(exp, Path(exp_dir))
        (Path(exp_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        console.print(summary_table(summary))
    return entries


def _adapter_rows(record: dict) -> list[dict]:
    return [a for layer in record["layers"] for a in layer.get("adapters", [])]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summary_row(vdir: Path) -> dict:
    """r vs the adapter rank realized (mean and max over adapted modules) and metrics."""
    config = yaml.safe_load((vdir / "config.yaml").read_text()) or {}
    f, record = config["finetune"], last_record(vdir / "ranks.jsonl")
    rows = _adapter_rows(record)
    metric = {m: [a["metrics"][m] for a in rows] for m in ("erank", "numerical_rank",
                                                            "rank_eps")}
    report = budgets.load_report(vdir / "report.json")["variants"][0]
    return {"run": vdir.name, "r": f["r"], "alpha": f["alpha"], "step": record["step"],
            "adapted": len(rows), "trainable_params": f.get("trainable_params"),
            "erank_mean": _mean(metric["erank"]),
            "numerical_rank_mean": _mean(metric["numerical_rank"]),
            "numerical_rank_max": max(metric["numerical_rank"], default=None),
            "rank_eps_mean": _mean(metric["rank_eps"]),
            "zero_shot": f.get("zero_shot", {}),
            "metrics": finite_metrics({k: v for k, v in report["metrics"].items()
                                       if k in ("val/accuracy", "val/loss")})}


def summarize(exp: Experiment, exp_dir: Path) -> dict:
    """finetune.json: per base variant, one row per r (those with a report so far)."""
    ft, out = exp.finetune, {}
    for variant in ft.variants(exp):
        vdirs = [exp_dir / lora_name(variant, r) for r in ft.ranks]
        out[variant] = [summary_row(v) for v in vdirs if (v / "report.json").is_file()]
    return {"experiment": exp.name, "eps": exp.monitor.eps, "finetune": ft.to_dict(),
            "variants": out}


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def summary_table(summary: dict) -> Table:
    table = Table(title=f"LoRA fine-tunes: {summary['experiment']} (adapter rank: mean over "
                        f"adapted modules; rank_eps at eps {summary['eps']:g})")
    for col in ("variant", "r", "modules", "numerical rank", "max", "erank", "rank_eps",
                "zero-shot acc", "val/accuracy", "val/loss"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for variant, rows in summary["variants"].items():
        for row in rows:
            m = row["metrics"]
            table.add_row(variant, str(row["r"]), str(row["adapted"]),
                          _fmt(row["numerical_rank_mean"]), _fmt(row["numerical_rank_max"], "g"),
                          _fmt(row["erank_mean"]), _fmt(row["rank_eps_mean"]),
                          _fmt(row["zero_shot"].get("val/accuracy")),
                          _fmt(m.get("val/accuracy")), _fmt(m.get("val/loss")))
    return table
