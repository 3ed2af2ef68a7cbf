"""Helpers shared by the train tests."""

import json
from pathlib import Path

import torch

import budgets
from train.config import parse_experiment
from train.lm.decoder import build_model
from train.rundir.files import write_json, write_yaml


def tiny_markov(name: str, checkpoint_every: int) -> dict:
    """A one-variant Markov experiment that trains 6 steps in about a second."""
    return {
        "name": name, "seed": 0,
        "data": {"task": "markov", "vocab_size": 16, "seq_len": 16, "rank": 2,
                 "train_size": 32, "val_size": 8, "batch_size": 8},
        "model": {"d_model": 16, "n_layers": 1},
        "block_defaults": {"n_heads": 2},
        "variants": {"mha": {"block": "softmax"}},
        "train": {"max_steps": 6, "warmup_steps": 1, "val_every_n_steps": 3,
                  "checkpoint_every_n_steps": checkpoint_every, "log_every_n_steps": 3},
        "monitor": {"every_n_steps": 3, "probe_size": 2, "histograms": False},
    }


def write_run(root: Path, raw: dict, steps: tuple[int, ...] = (5, 10), spectra: bool = False,
              sweep: bool = False) -> Path:
    """runs/<name>/ as a finished run leaves what `report` reads: experiment.yaml (and
    sweep.json, written but never read back, when `sweep`), and per variant config.yaml,
    ranks.jsonl (one record per step of `steps`) and report.json. A probe of the untrained
    model stands in for training; `spectra` keeps the first variant's spectra, as lists,
    the way --plot reads them back."""
    exp = parse_experiment(raw)
    exp_dir = root / exp.name
    exp_dir.mkdir(parents=True)
    write_yaml(exp_dir / "experiment.yaml", exp.to_dict())
    if sweep:
        write_json(exp_dir / "sweep.json", {"experiment": exp.name, "groups": []})
    tokens = torch.randint(0, exp.data.vocab_size, (2, exp.data.seq_len),
                           generator=torch.Generator().manual_seed(0))
    for i, name in enumerate(exp.variants):
        write_variant(exp, name, exp_dir / name, tokens, steps, spectra and i == 0)
    return exp_dir


def write_variant(exp, name: str, vdir: Path, tokens, steps, spectra: bool) -> None:
    vdir.mkdir()
    model = build_model(exp.variant_config(name))
    probe = budgets.probe_model(model, tokens, eps=0.1, with_spectra=spectra)
    for layer in probe["layers"]:
        layer.get("spectra", {}).update(
            (q, s.tolist()) for q, s in layer.get("spectra", {}).items())
    (vdir / "ranks.jsonl").write_text("".join(json.dumps({"step": s, **probe}) + "\n"
                                              for s in steps))
    entry = {"probe": probe, "step": steps[-1], "params": model.param_count(),
             "metrics": {"val/accuracy": 0.5, "val/loss": 2.0}}
    report = budgets.build_report({name: entry}, experiment=exp.name)
    (vdir / "report.json").write_text(budgets.to_json(report) + "\n")
    write_yaml(vdir / "config.yaml", {**exp.variant_config(name), "params": model.param_count()})
