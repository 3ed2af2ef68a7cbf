"""A trained variant as a Hugging Face model directory (`rankzoo export`).

    summary = export_variant("runs/quick/mha", "models/quick-mha")
    model = AutoModelForCausalLM.from_pretrained("models/quick-mha")   # after `import zoo`

The directory holds config.json (model_type "rankzoo": the run's DecoderLM sizes and one
block spec per layer, so every family and every layer pattern exports alike),
model.safetensors (the checkpoint's weights under `model.`), generation_config.json and,
when the run read its text through a tokenizer (data.tokenizer: a tokenizer.json, a
model directory holding one, or a bpe:N, the one its corpus trained), that tokenizer. It
is written beside the target under a temporary name and renamed into place: a directory
is complete or absent. A non-empty target is refused; nothing is overwritten.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..lm.decoder import block_specs
from ..rundir.read import is_variant_dir, run_config, trained_model, variant_dirs
from .model_dir import import_transformers, quiet

TOKENIZER_FILE = "tokenizer.json"
# what a model directory's tokenizer is, beside its tokenizer.json
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")


def trained_lm(vdir: Path):
    """(the DecoderLM with the run's last weights, its config.yaml, the checkpoint's step)."""
    vdir = Path(vdir)
    if not vdir.is_dir():
        raise ValueError(f"run directory not found: {vdir}")
    if not is_variant_dir(vdir):
        names = [p.name for p in variant_dirs(vdir)]
        raise ValueError(f"{vdir}: name one variant directory, RUN_DIR/<variant>"
                         + (f" (here: {', '.join(names)})" if names else ""))
    config = run_config(vdir)
    if not config.get("model") or not config.get("data"):
        raise ValueError(f"{vdir}/config.yaml: no model or data section to rebuild the model")
    if config.get("finetune"):
        raise ValueError(f"{vdir}: a LoRA fine-tune, whose adapters the exported model has "
                         f"no place for; export its base variant "
                         f"({config['finetune'].get('base_variant')})")
    model, step = trained_model(vdir, config)
    return model, config, step


def hf_config(lm, config: dict[str, Any], max_len: int | None = None, **extra: Any):
    """The RankzooConfig of a DecoderLM built from run config `config`; `max_len` the
    longest sequence (prompt and generated tokens) and the caches' length, the run's by
    default (no weight depends on it)."""
    from zoo.hf.config import RankzooConfig

    model = config["model"]
    layers = [{"name": name, **kwargs} for name, kwargs in block_specs(config)]
    return RankzooConfig(
        vocab_size=lm.vocab_size, d_model=lm.d_model, n_layers=len(layers), layers=layers,
        mlp_ratio=model["mlp_ratio"], d_mlp=lm.d_mlp, max_len=max_len or lm.max_len,
        norm=model["norm"], tie_embeddings=model["tie_embeddings"], mlp=lm.mlp_name,
        architectures=["RankzooForCausalLM"], **extra)


def check_out(out: Path) -> None:
    """--out: a new or empty directory; anything else is refused in one line."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "not empty"
        raise ValueError(f"--out {out} is {what}; export writes a new or empty directory "
                         f"and overwrites nothing")


def tokenizer_files(config: dict[str, Any]) -> tuple[list[tuple[Path, str]], str | None]:
    """([(source, name in the model directory)], a note where the run has none to give)."""
    spec = (config.get("data") or {}).get("tokenizer")
    if not spec:
        task = (config.get("data") or {}).get("task", "mqar")
        return [], f"no tokenizer: the run's data ({task}) are token ids or bytes"
    path = Path(spec)
    if path.is_file():
        return [(path, TOKENIZER_FILE)], None
    if path.is_dir() and (path / TOKENIZER_FILE).is_file():
        return [(path / name, name) for name in (TOKENIZER_FILE, *TOKENIZER_EXTRAS)
                if (path / name).is_file()], None
    trained = trained_bpe_file(config["data"])
    if trained is not None:
        return [(trained, TOKENIZER_FILE)], None
    return [], (f"no tokenizer: data.tokenizer {spec!r} is not a tokenizer.json on disk here, "
                "nor a bpe:N whose training text is")


def trained_bpe_file(data: dict[str, Any]) -> Path | None:
    """The tokenizer.json of a text run's bpe:N, the one its corpus trained (from the
    cache, or trained again on the same text: the same file); None where the corpus is
    not on disk here."""
    from ..data.text import TextSpec, tokenizer_json
    from ..data.tokenizer import bpe_size

    if data.get("task") != "text" or bpe_size(str(data.get("tokenizer"))) is None:
        return None
    keys = ("paths", "seq_len", "max_bytes", "val_fraction", "pattern", "tokenizer")
    try:
        return tokenizer_json(TextSpec.from_dict({k: data[k] for k in keys if k in data}))
    except (OSError, ValueError):  # the corpus moved or is gone
        return None


def write_tokenizer(files: list[tuple[Path, str]], out: Path, max_len: int) -> None:
    for source, name in files:
        shutil.copyfile(source, out / name)
    if not (out / "tokenizer_config.json").is_file():  # a bare tokenizer.json: a fast one
        transformers = import_transformers()
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / TOKENIZER_FILE),
                                                   model_max_length=max_len)
        tok.save_pretrained(out)


def export_variant(vdir: str | Path, out: str | Path, max_len: int | None = None) -> dict:
    """Write the variant `vdir` (runs/<experiment>/<variant>) as a Hugging Face model
    directory `out`; returns what was written: {out, files, step, layers, notes}."""
    transformers = import_transformers()
    from zoo.hf.modeling import RankzooForCausalLM

    vdir, out = Path(vdir), Path(out)
    check_out(out)
    lm, config, step = trained_lm(vdir)
    tokenizer, note = tokenizer_files(config)
    hf = RankzooForCausalLM(hf_config(lm, config, max_len, rankzoo_source={
        "run": str(vdir), "step": step}))
    hf.model.load_state_dict(lm.state_dict())
    tmp = out.with_name(f".{out.name}.export-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with quiet(transformers):  # config.json, model.safetensors, generation_config.json
            hf.save_pretrained(tmp)
        if tokenizer:
            write_tokenizer(tokenizer, tmp, hf.config.max_len)
        if out.exists():
            out.rmdir()  # empty (check_out); a race that filled it fails here, not silently
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir()), "step": step,
            "layers": [s["name"] for s in hf.config.layers], "max_len": hf.config.max_len,
            "notes": [note] if note else []}
