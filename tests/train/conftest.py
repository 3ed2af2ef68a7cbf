"""Helpers shared by the train tests: the one tiny experiment they run, and a finished run
written without training."""

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

import budgets
from train.config import parse_experiment
from train.lm.decoder import build_model
from train.rundir.files import write_json, write_yaml

MQA = {"block": "softmax", "n_kv_heads": 1}  # the variant most tests set beside "mha"
TINY_DATA = {  # each task's own keys; tiny_experiment adds the sizes, 4 batches an epoch
    "mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
    "markov": {"task": "markov", "vocab_size": 16, "seq_len": 16, "rank": 2},
}


def tiny_experiment(task: str = "mqar", **sections) -> dict:
    """The tiny experiment of the train tests, a fresh dict on every call: one layer of
    d_model 16, one "mha" variant, 6 steps (about a second), on MQAR or the Markov
    language (`task`). Each keyword changes one top-level key, as merged() does."""
    return merged({
        "name": "tiny", "seed": 0,
        "data": {**TINY_DATA[task], "train_size": 32, "val_size": 8, "batch_size": 8},
        "model": {"d_model": 16, "n_layers": 1},
        "block_defaults": {"n_heads": 2},
        "variants": {"mha": {"block": "softmax"}},
        "train": {"max_steps": 6, "warmup_steps": 1, "val_every_n_steps": 3,
                  "checkpoint_every_n_steps": 3, "log_every_n_steps": 1},
        "monitor": {"every_n_steps": 3, "probe_size": 2, "histograms": False},
    }, **sections)


def merged(raw: dict, **sections) -> dict:
    """A deep copy of `raw` with each keyword's top-level key changed: a dict is merged
    into the section of that name (a key set to None is dropped, so its default applies),
    anything else replaces it, and None drops the key itself."""
    out = dict(raw)
    for key, value in sections.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in {**out[key], **value}.items() if v is not None}
        else:
            out[key] = value
    return copy.deepcopy(out)


def tiny_markov(name: str, checkpoint_every: int) -> dict:
    """The tiny experiment on the Markov language, logging every 3 steps."""
    return tiny_experiment("markov", name=name, train={
        "checkpoint_every_n_steps": checkpoint_every, "log_every_n_steps": 3})


@pytest.fixture
def tiny_yaml(tmp_path):
    """tiny_yaml(raw=None, file="exp.yaml", **sections) writes tmp_path/file and returns
    its path: `raw` (tiny_experiment() when None) changed by `sections` as merged() does."""
    def write(raw: dict | None = None, file: str = "exp.yaml", **sections) -> Path:
        path = tmp_path / file
        doc = tiny_experiment(**sections) if raw is None else merged(raw, **sections)
        path.write_text(yaml.safe_dump(doc))
        return path
    return write


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
