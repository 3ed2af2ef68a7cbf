"""The two entry points of `rankzoo compress`: a trained zoo variant, a Hugging Face model.

    doc = compress_run("runs/quick/mha", CompressOptions(ratios=(1.5, 2, 4)))
    doc = compress_hf("models/tiny", "calib.txt", "eval.txt", CompressOptions(), seq_len=128)

Each loads the model and its data as its target (target/), fits the bases
(bases/calibrate.py), reads the advice to check (prediction.py), measures every setting
(measure.py) and returns the compress document; nothing is written except --save DIR
(saved/save.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from torch import nn

from budgets.cache import CostModel

from ...rundir.lock import in_progress_note
from .bases.calibrate import Calibration, calibrate, hf_data, zoo_data
from .bases.lowrank import cache_bytes
from .heal import HEAL_BATCH, ModelData, check_heal, heal, hf_heal_data, zoo_heal_data
from .measure import COST_MODEL, bases_used, extras, measure, verdict
from .options import SCHEMA, SCHEMA_VERSION, CompressOptions, cache_dtype
from .prediction import hf_prediction, zoo_prediction
from .saved.save import check_save_dir, save_compressed, save_hf, save_zoo
from .target.hf_surgery import HFTarget
from .target.protocol import Target
from .target.zoo_surgery import ZooTarget

COST_TEXT = ("one basis per slot and head, fitted on the calibration data and shared by "
             "every sequence: a weight, its bytes (basis_bytes) paid once per model; "
             "bytes_per_token and ratio count the codes per token alone")


def load_variant(vdir: Path) -> tuple[nn.Module, dict, int | None]:
    """(DecoderLM with the run's last weights, its config.yaml, the checkpoint's step) of a
    variant directory (read without Lightning)."""
    from ...rundir.read import is_variant_dir, run_config, trained_model, variant_dirs

    if not vdir.exists():
        raise FileNotFoundError(f"run directory not found: {vdir}")
    if not vdir.is_dir():
        raise ValueError(f"not a run directory: {vdir} is a file")
    if not is_variant_dir(vdir):
        names = [p.name for p in variant_dirs(vdir)]
        raise ValueError(f"{vdir}: name one variant directory, RUN_DIR/<variant>"
                         + (f" (here: {', '.join(names)})" if names else ""))
    config = run_config(vdir)
    if config.get("layers"):  # the KV advice and the bases are per family, for now
        raise ValueError(f"{vdir}: a layer pattern ({', '.join(config.get('pattern') or [])}); "
                         f"compress takes a model of one block family")
    if not config.get("block") or not config.get("data"):
        raise ValueError(f"{vdir}/config.yaml: no block or data section to rebuild the model")
    if config.get("finetune"):
        raise ValueError(f"{vdir}: a LoRA fine-tune; compress its base variant "
                         f"({config['finetune'].get('base_variant')})")
    model, step = trained_model(vdir, config)
    return model, config, step


def document(source: dict, target: Target, cal: Calibration, options: CompressOptions, T: int,
             prediction: dict | None, rows: list[dict], evaluation: dict,
             notes: list[str], seconds: float) -> dict:
    """The compress document (schema rankzoo.compress) of one measured model."""
    nbytes = options.nbytes
    pred = None
    if prediction is not None:
        # the report's cost model: a shared basis (a weight), or on an older probe a
        # basis per sequence at its T
        model = CostModel(prediction.get("cost_model", CostModel.PER_SEQUENCE))
        size = cache_bytes(target.slots, prediction["ranks"], nbytes, prediction["seq_len"],
                           shared=model == CostModel.SHARED)
        pred = {"ratio": size["ratio"], "bytes_per_token": size["bytes_per_token"],
                "cost_model": model, "seq_len": prediction["seq_len"],
                "advised": prediction["advised"], "withheld": prediction["withheld"],
                "source": prediction["source"]}
    return {
        "schema": SCHEMA, "version": SCHEMA_VERSION, "source": source,
        "model": target.describe(), "family": target.family,
        # the model's own layer numbers: the layers compressed (the rows' ranks in this
        # order), and a hybrid's others, their state kept in full
        "layers": sorted({s.layer for s in target.slots}),
        "kept": [asdict(k) for k in target.kept],
        "keys": target.keys if target.caches_kv else None,
        "rope": bool(target.rope),
        "cache_dtype": cache_dtype(options.cache_dtype), "bytes_per_element": nbytes,
        "bases": {"asked": options.bases, "used": bases_used(target.slots, cal)},
        "cost_model": {"name": COST_MODEL, "text": COST_TEXT},
        "length": T, "tolerance": options.tolerance,
        "calibration": {"sequences": cal.sequences, "tokens": cal.tokens,
                        "seconds": cal.seconds},
        "evaluation": evaluation, "prediction": pred,
        "rows": rows, "verdict": verdict(rows, prediction, options.tolerance),
        **extras(rows, cal),
        "notes": list(notes), "seconds": seconds,
    }


def compress_run(run_dir, options: CompressOptions | None = None,
                 notes: list[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> dict:
    """The compress document of a trained zoo variant (RUN_DIR/<variant>)."""
    began = time.perf_counter()
    options = options or CompressOptions()
    notes = notes if notes is not None else []
    vdir = Path(run_dir)
    check_save_dir(options.save)
    model, config, step = load_variant(vdir)
    writing = in_progress_note(vdir)
    if writing is not None:
        notes.append(writing)
    target = ZooTarget(model, options.keys)
    check_save_dir(options.save, target.saveable)
    check_heal(target, options)
    calib, calib_y, eval_x, eval_y = zoo_data(config, options, notes, labels=True)
    batch = options.batch_size or int(config["data"].get("batch_size", 32))
    prediction = zoo_prediction(vdir, target, options.nbytes, notes)
    T = options.length or (prediction["seq_len"] if prediction else int(calib.shape[1]))
    if prediction is not None and prediction["seq_len"] != T:
        notes.append(f"bases amortized at length={T}, the report's at T = "
                     f"{prediction['seq_len']}: the advised ratio reads differently here")
    cal = calibrate(target, calib, batch, options.bases, labels=calib_y)
    rows, chosen, baseline = measure(target, cal,
                                     lambda: target.evaluate(eval_x, eval_y, batch),
                                     options, T, prediction, notes, progress)
    evaluation = {"sequences": len(eval_x), "tokens": int(eval_x.numel()),
                  "labelled": baseline["tokens"], "split": "validation",
                  "calibration_split": "validation" if options.overlap else "training"}
    source = {"run": str(vdir), "variant": config.get("variant", vdir.name),
              "block": target.block_kind, "step": step}
    return finish(document(source, target, cal, options, T, prediction, rows, evaluation,
                           notes, time.perf_counter() - began),
                  target, cal, chosen, options, notes, lambda d: save_zoo(d, model, config),
                  ModelData(lambda: zoo_heal_data(config),
                            lambda: target.evaluate(eval_x, eval_y, batch), eval_x, batch,
                            progress))


def compress_hf(model_dir, text, eval_text, options: CompressOptions | None = None, *,
                seq_len: int = 128, device: str = "cpu", dtype: str = "float32",
                notes: list[str] | None = None,
                progress: Callable[[str], None] | None = None, bos: bool = True) -> dict:
    """The compress document of a Hugging Face causal LM saved in model_dir; its sequences
    start with the tokenizer's BOS where it adds one, unless not `bos`."""
    from ...hf import bos_of, bos_text, device_of, dtype_of, read_text

    began = time.perf_counter()
    options = options or CompressOptions()
    notes = notes if notes is not None else []
    if eval_text is None:
        raise ValueError("eval_text=None: the loss is measured on text the bases were not "
                         "fitted on: name one (the calibration file itself is read after "
                         "its calibration tokens)")
    calib_data, eval_data = read_text(text), _read_eval(eval_text)
    where = device_of(device)
    dtype_of(dtype)
    model_dir = Path(model_dir)
    target, tokenizer = _hf_target(model_dir, options, where, dtype, seq_len)
    calib_size, eval_size = options.calib_size or 4, options.eval_size or 4
    first = bos_of(tokenizer) if bos and tokenizer is not None else None
    vocab = int(target.model.config.vocab_size)
    calib, evals = hf_data(calib_data, eval_data, tokenizer, vocab,
                           seq_len, calib_size, eval_size, options.overlap, str(text),
                           str(eval_text), notes, first)
    batch = options.batch_size or 1
    T = options.length or seq_len
    cal = calibrate(target, calib, batch, options.bases)
    command = (f"rankzoo report --hf {model_dir} --text {text} --seq-len {seq_len} "
               f"--probe-size {calib_size} --eps {options.advice_eps:g}")
    prediction = hf_prediction(target, cal, options.advice_eps, options.nbytes, seq_len,
                               command)
    rows, chosen, _ = measure(target, cal, lambda: target.evaluate(evals, batch_size=batch),
                              options, T, prediction, notes, progress)
    evaluation = {"sequences": len(evals), "tokens": int(evals.numel()),
                  "text": str(eval_text)}
    source = {"hf": str(model_dir), "model_type": target.g.model_type, "text": str(text),
              "eval_text": str(eval_text), "seq_len": seq_len, "device": str(where),
              "dtype": dtype, "tokens": "tokenizer" if tokenizer is not None
              else "bytes % vocab_size", "bos": bos_text(tokenizer, bos)}
    return finish(document(source, target, cal, options, T, prediction, rows, evaluation,
                           notes, time.perf_counter() - began),
                  target, cal, chosen, options, notes, lambda d: save_hf(d, target, tokenizer),
                  ModelData(lambda: hf_heal_data(calib_data, eval_data, tokenizer, vocab,
                                                 seq_len, calib_size, options.overlap,
                                                 str(text), first, notes),
                            lambda: target.evaluate(evals, batch_size=batch), evals,
                            options.batch_size or HEAL_BATCH, progress))


def finish(doc: dict, target: Target, cal: Calibration, chosen: dict, options: CompressOptions,
           notes: list[str], save: Callable[[Path], None], data: ModelData) -> dict:
    """The document with --heal and --save done (`save` writes the model into a
    directory; heal.py and saved/save.py say what `data` serves) and the notes after them."""
    healed = heal(doc, target, cal, chosen, options, data, notes) if options.heal else None
    if options.save:
        save_compressed(doc, target, cal, chosen, options, notes, save, healed, data)
    doc["notes"] = list(notes)
    return doc


def _hf_target(model_dir: Path, options: CompressOptions, where, dtype: str,
               seq_len: int) -> tuple[HFTarget, object]:
    """(the model on `where` as an HFTarget, its tokenizer or None); --save refused before
    the model is loaded, and again when the compression would be no change of weights."""
    from ...hf import load_model

    check_save_dir(options.save)
    model, tokenizer = load_model(model_dir, dtype)
    target = HFTarget(model.to(where), options.keys)
    check_save_dir(options.save, target.saveable)
    check_heal(target, options)
    target.g.check_seq_len(seq_len)
    return target, tokenizer


def _read_eval(eval_text) -> bytes:
    """The evaluation text, its errors naming eval_text rather than text."""
    from ...hf import read_text

    try:
        return read_text(eval_text)
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(str(e).replace("text=", "eval_text=", 1)) from None
