"""Hugging Face models and texts from disk, for the rank-budget probe (budgets/hf.py).

    name, entry = probe_hf("models/tiny-llama", "corpus.txt", seq_len=128, probe_size=4)
    report = budgets.hf.build_hf_report(name, entry)      # or hf_report(...) for both

Loading reads a save_pretrained directory (the model, its tokenizer if one was saved, a
PEFT adapter if asked) with local_files_only, so nothing is downloaded, and the eager
attention path, the only one that returns the softmax probabilities (the matrix-free
probe switches it for its forward pass). The model is loaded in the dtype asked for and
moved to the device; budgets measures there. The probe batch is cut from the start of a
text file. transformers and peft are imported lazily.

Errors name the parameters (model_dir=..., seq_len=...); the CLI shows them as its flags.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from budgets.hf import ProbeProgress, build_hf_report, probe_hf_model
from budgets.hf_layouts import Geometry, layout_of
from budgets.probes import MATFREE_FROM
from budgets.schema import Int, MapOf, Maybe, Number, Record, read_json

INSTALL_HINT = "pip install 'rankzoo[hf]'"
# The fields of a model's config.json and an adapter's adapter_config.json that rankzoo
# reads (budgets/hf_layouts.py's Geometry, the LoRA caps), checked before anything loads.
HF_SIZES = ("num_attention_heads", "hidden_size", "num_hidden_layers", "num_key_value_heads",
            "head_dim", "vocab_size", "max_position_embeddings", "n_head", "n_embd", "n_layer",
            "n_positions")
HF_CONFIG = Record({"model_type": str}, {k: Maybe(Int(1)) for k in HF_SIZES})
ADAPTER_CONFIG = Record({}, {"peft_type": Maybe(str), "r": Int(1), "lora_alpha": Number(),
                             "rank_pattern": Maybe(MapOf(Int(1))),
                             "alpha_pattern": Maybe(MapOf(float))})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("cpu", "cuda", "auto")


# ---------------------------------------------------------------- transformers, offline

@contextlib.contextmanager
def offline():
    """HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE set to 1 inside, restored on the way out.

    The hub client reads them when first imported, so transformers is imported inside;
    local_files_only on every from_pretrained is what keeps a later load local as well.
    """
    saved = {name: os.environ.get(name) for name in OFFLINE_ENV}
    os.environ.update(dict.fromkeys(OFFLINE_ENV, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def import_transformers():
    """transformers, or a clear error naming the extra that installs it."""
    try:
        import transformers
    except ImportError as e:
        raise ValueError(f"reading Hugging Face models needs transformers, which is not "
                         f"installed ({e}): {INSTALL_HINT}") from None
    return transformers


@contextlib.contextmanager
def quiet(transformers):
    """transformers' progress bars and warnings silenced inside, restored afterwards."""
    log = transformers.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


# ---------------------------------------------------------------- the model

def model_type_of(model_dir: Path) -> str:
    """model_type from model_dir/config.json, checking the directory before transformers loads."""
    if not model_dir.exists():
        raise FileNotFoundError(f"model_dir={model_dir}: model directory not found")
    if not model_dir.is_dir():
        raise ValueError(f"model_dir={model_dir}: not a directory (expected one written by "
                         f"save_pretrained)")
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model_dir={model_dir}: no config.json in it (expected a "
                                f"directory written by save_pretrained)")
    return read_json(config_file, HF_CONFIG)["model_type"]


def load_model(model_dir, dtype: str = "float32") -> tuple[nn.Module, object | None]:
    """(model in eval mode, tokenizer or None) from a save_pretrained directory, its
    weights in `dtype` (a DTYPES name)."""
    model_dir = Path(model_dir)
    torch_dtype = dtype_of(dtype)
    model_type = model_type_of(model_dir)
    layout_of(model_type, model_dir)  # unsupported: fail before loading any weights
    with offline():
        transformers = import_transformers()
        with quiet(transformers):
            model = _from_pretrained(transformers, model_dir, model_type, torch_dtype)
            tokenizer = _load_tokenizer(transformers, model_dir)
    # fp32 by default: bf16 singular values below ~1e-2 s_1 are noise (docs/METRICS.md).
    return (model.float() if torch_dtype == torch.float32 else model).eval(), tokenizer


def _from_pretrained(transformers, model_dir: Path, model_type: str,
                     dtype: torch.dtype) -> nn.Module:
    try:
        # dtype at load, not model.to(dtype) after: buffers such as RoPE's inverse
        # frequencies stay fp32, as transformers keeps them
        return transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, attn_implementation="eager", dtype=dtype)
    # transformers raises OSError, ValueError, safetensors' own errors and more for
    # corrupt or missing files: every one of them means "this directory does not load".
    except Exception as e:
        raise ValueError(f"model_dir={model_dir}: the {model_type} model does not load "
                         f"({type(e).__name__}: {e})") from None


def _load_tokenizer(transformers, model_dir: Path):
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # as above: any failure means the saved tokenizer is unusable
        raise ValueError(f"model_dir={model_dir}: the tokenizer saved there does not load "
                         f"({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------- a PEFT adapter

def adapter_dir(adapter) -> Path:
    """`adapter` as a Path, checked to hold a saved PEFT adapter."""
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"adapter={adapter}: no adapter_config.json there (a "
                                "directory written by a PEFT model's save_pretrained)")
    try:
        read_json(adapter / "adapter_config.json", ADAPTER_CONFIG)
    except ValueError as e:  # before PEFT reads it, which fails far from the cause
        raise ValueError(f"adapter={adapter}: the adapter does not load ({e})") from None
    return adapter


def load_adapter(model: nn.Module, adapter, dtype: str = "float32") -> nn.Module:
    """The model with a PEFT LoRA adapter saved in `adapter` applied (layers wrapped in
    place; the returned module is the transformers model, so everything else reads it as
    before). The adapter's ranks go on the report's adapter axis."""
    adapter = adapter_dir(adapter)
    try:
        import peft
    except ImportError:
        raise ValueError(f"adapter={adapter} needs PEFT: pip install 'rankzoo[peft]'") from None
    try:
        with offline(), warnings.catch_warnings():
            # library deprecation chatter, not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.PeftModel.from_pretrained(model, adapter, is_trainable=False)
    except Exception as e:  # as for the model: any failure means it does not load here
        raise ValueError(f"adapter={adapter}: the adapter does not load onto the model "
                         f"({type(e).__name__}: {e})") from None
    model = wrapped.get_base_model()
    # below fp32, PEFT keeps the adapter's own weights in fp32 (autocast_adapter_dtype)
    return (model.float() if dtype_of(dtype) == torch.float32 else model).eval()


# ---------------------------------------------------------------- device and dtype

def dtype_of(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype}: not a forward-pass dtype; one of "
                         f"{', '.join(DTYPES)}")
    return DTYPES[dtype]


def device_of(device: str) -> torch.device:
    """cpu, cuda, or auto (cuda when available, else cpu) as a torch.device."""
    if device not in DEVICES:
        raise ValueError(f"device={device}: not a device; one of {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device}: CUDA is not available here (torch "
                         f"{torch.__version__}, {torch.cuda.device_count()} devices)")
    return torch.device(device)


# ---------------------------------------------------------------- the probe batch

def read_text(text) -> bytes:
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"text={path}: file not found")
    if not path.is_file():
        raise ValueError(f"text={path}: not a file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"text={path}: the file is empty")
    return data


def token_ids(data: bytes, tokenizer, vocab_size: int, where: str = "",
              notes: list[str] | None = None) -> torch.Tensor:
    """Token ids [N] of the text: the model's tokenizer, else bytes modulo the vocab size
    (said so in `notes`)."""
    if tokenizer is None:
        if notes is not None:
            notes.append(f"{where}: no tokenizer saved with the model; using raw bytes modulo "
                         f"the vocab size ({vocab_size}) as token ids")
        return torch.tensor(list(data), dtype=torch.long) % vocab_size  # [N]
    text = data.decode("utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"{where}: the tokenizer gives id {int(ids.max())}, outside the "
                         f"model's vocab of {vocab_size}")
    return ids  # [N]


def probe_batch(ids: torch.Tensor, seq_len: int, probe_size: int, where: str = ""
                ) -> torch.Tensor:
    """The first probe_size * seq_len tokens as [B, T] (contiguous, non-overlapping)."""
    need = probe_size * seq_len
    if ids.numel() < need:
        raise ValueError(f"text={where}: too short for the probe batch: {ids.numel()} "
                         f"tokens, but probe_size={probe_size} x seq_len={seq_len} "
                         f"needs {need}")
    return ids[:need].view(probe_size, seq_len)  # [B, T]


# ---------------------------------------------------------------- the probe

def load_for_probe(model_dir, text, adapter=None, device: str = "cpu", dtype: str = "float32"
                   ) -> tuple[nn.Module, object | None, bytes]:
    """(model on `device` in `dtype`, tokenizer or None, the text's bytes), the cheap checks
    first: a bad text, adapter directory, device or dtype costs no model load."""
    data = read_text(text)
    if adapter is not None:
        adapter_dir(adapter)
    where, _ = device_of(device), dtype_of(dtype)
    model, tokenizer = load_model(model_dir, dtype)
    if adapter is not None:
        model = load_adapter(model, adapter, dtype)
    return model.to(where), tokenizer, data


def probe_hf(model_dir, text, seq_len: int = 128, probe_size: int = 4, eps: float = 0.1,
             with_spectra: bool = False, adapter=None, notes: list[str] | None = None, *,
             device: str = "cpu", dtype: str = "float32", layers: list[int] | None = None,
             matfree_from: int | None = MATFREE_FROM, k_max: int = 256,
             progress: Callable[[ProbeProgress], None] | None = None) -> tuple[str, dict]:
    """(variant name, build_report entry) of the model saved in `model_dir` (with the PEFT
    adapter saved in `adapter` applied, if given), probed on the start of the file `text`,
    on `device` ("cpu", "cuda", "auto") with the forward pass in `dtype` (a DTYPES name).
    `layers`, `matfree_from`, `k_max` and `progress` are budgets.hf.probe_hf_model's.
    Lines for the user (e.g. no tokenizer saved) are appended to `notes`."""
    model_dir = Path(model_dir)
    model, tokenizer, data = load_for_probe(model_dir, text, adapter, device, dtype)
    g = Geometry.from_config(model.config)
    g.check_seq_len(seq_len)
    ids = token_ids(data, tokenizer, int(model.config.vocab_size), str(text), notes)
    batch = probe_batch(ids, seq_len, probe_size, str(text))  # [B, T]
    where = next(model.parameters()).device
    probe, loss = probe_hf_model(model, batch.to(where), eps, with_spectra, layers=layers,
                                 matfree_from=matfree_from, k_max=k_max, progress=progress)
    source = {"hf": str(model_dir), "model_type": g.model_type, "text": str(text),
              "tokens": "tokenizer" if tokenizer is not None else "bytes % vocab_size",
              "probe_size": probe_size, "seq_len": seq_len, "device": str(where),
              "dtype": dtype, "n_layers": g.n_layers,
              **({"layers": [ly["layer"] for ly in probe["layers"]]} if layers else {}),
              **({"adapter": str(Path(adapter))} if adapter is not None else {})}
    if notes is not None:
        notes.extend(probe_notes(probe, dtype, g.n_layers))
    entry = {"probe": probe, "step": 0, "params": sum(p.numel() for p in model.parameters()),
             "metrics": {"probe/loss": loss}, "source": source}
    return model_dir.resolve().name or g.model_type, entry


def probe_notes(probe: dict, dtype: str, n_layers: int) -> list[str]:
    """What the user should know about how the probe measured: a subset of layers, a
    half-precision forward pass, the matrix-free mode."""
    notes = []
    if len(probe["layers"]) < n_layers:
        notes.append(f"measured {len(probe['layers'])} of the model's {n_layers} layers: "
                     f"{', '.join(str(ly['layer']) for ly in probe['layers'])}")
    if dtype != "float32":
        notes.append(f"forward pass in {dtype}: singular values below ~1e-2 s_1 are noise "
                     f"at that precision (docs/METRICS.md); metrics are computed in fp32")
    if "matfree" in probe:
        m = probe["matfree"]
        notes.append(f"attention measured matrix-free (probe length {probe['seq_len']} >= "
                     f"{m['from']}): rank_eps decided up to {m['k_max']} values, erank only "
                     f"where those hold the whole spectrum")
    return notes


def hf_report(model_dir, text, seq_len: int = 128, probe_size: int = 4, eps: float = 0.1,
              thresholds=None, adapter=None, notes: list[str] | None = None,
              **options) -> dict:
    """The rank-budget report (schema rankzoo.report) of a saved HF causal LM on a text,
    with a PEFT LoRA adapter applied if `adapter` names one; `options` are probe_hf's
    keyword-only ones (device, dtype, layers, matfree_from, k_max, progress)."""
    name, entry = probe_hf(model_dir, text, seq_len, probe_size, eps, adapter=adapter,
                           notes=notes, **options)
    return build_hf_report(name, entry, thresholds)
