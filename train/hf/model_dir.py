"""Hugging Face models from disk, offline: the model, its tokenizer, a PEFT adapter.

    model, tokenizer = load_model("models/tiny-llama", dtype="float32")
    model, tokenizer = load_model("models/tiny-llama.Q8_0.gguf")    # a GGUF file
    model = load_adapter(model, "adapters/r8")

Loading reads a save_pretrained directory (the model, its tokenizer if one was saved, a
PEFT adapter if asked) with local_files_only, so nothing is downloaded, and with eager
attention. The probe reads the softmax probabilities P mainly through transformers'
attention interface: for its forward pass the model attends through a function of
budgets/hf/capture.py, then switches back. Eager attention is the fallback's source, for
model types without that interface: their output_attentions, which only the eager path
returns (budgets/hf/eager.py). The model is loaded in the dtype asked for; transformers
and peft are imported lazily. The config files are checked against their schemas before
anything loads.

A GGUF file (llama.cpp's format) loads through transformers' GGUF support, its weights
dequantized to `dtype` and its tokenizer read from the file; gguf_quantization names the
storage types of its tensors (the `gguf` package, in the `hf` extra, reads them).

Errors name the parameters (model_dir=..., dtype=...); the CLI shows them as its flags.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from budgets.schema import Int, MapOf, Maybe, Number, Record, read_json

INSTALL_HINT = "pip install 'rankzoo[hf]'"
GGUF_SUFFIX = ".gguf"
# The fields of a model's config.json and an adapter's adapter_config.json that rankzoo
# reads (budgets/hf/geometry.py's Geometry, the LoRA caps), checked before anything loads.
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

def is_gguf(path) -> bool:
    return Path(path).suffix.lower() == GGUF_SUFFIX


def model_type_of(model_dir: Path) -> str:
    """model_type from model_dir/config.json, checking the directory before transformers
    loads (a GGUF file: from its metadata)."""
    if not model_dir.exists():
        raise FileNotFoundError(f"model_dir={model_dir}: model directory not found")
    if is_gguf(model_dir) and model_dir.is_file():
        return _gguf_config(model_dir).model_type
    if not model_dir.is_dir():
        raise ValueError(f"model_dir={model_dir}: not a directory (expected one written by "
                         f"save_pretrained, or a {GGUF_SUFFIX} file)")
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
    with offline():
        transformers = import_transformers()
        causal_lm_type(transformers, model_type, model_dir)  # before loading any weights
        with quiet(transformers):
            if is_gguf(model_dir):
                model, tokenizer = _load_gguf(transformers, model_dir, model_type, torch_dtype)
            else:
                model = _from_pretrained(transformers, model_dir, model_type, torch_dtype)
                tokenizer = _load_tokenizer(transformers, model_dir)
    # fp32 by default: bf16 singular values below ~1e-2 s_1 are noise (docs/METRICS.md).
    # a GGUF model is dequantized into `dtype` at load and refuses .float()
    as_fp32 = torch_dtype == torch.float32 and not is_gguf(model_dir)
    return (model.float() if as_fp32 else model).eval(), tokenizer


def causal_lm_type(transformers, model_type: str, where) -> None:
    """A clear error unless transformers has a causal LM class for `model_type`: its own,
    or one registered with AutoModelForCausalLM (rankzoo's own, zoo/hf/)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    registered = (model_type in CONFIG_MAPPING
                  and CONFIG_MAPPING[model_type] in MODEL_FOR_CAUSAL_LM_MAPPING)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not registered:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported: transformers "
                         f"{transformers.__version__} has no causal LM of that type")


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


def _gguf_module():
    try:
        import gguf
    except ImportError as e:
        raise ValueError(f"reading a GGUF file needs the gguf package, which is not installed "
                         f"({e}): {INSTALL_HINT}") from None
    return gguf


def _gguf_config(path: Path):
    """The config transformers reads from a GGUF file's metadata, or a clear error."""
    _gguf_module()
    with offline():
        transformers = import_transformers()
        try:
            with quiet(transformers):
                return transformers.AutoConfig.from_pretrained(
                    path.parent, gguf_file=path.name, local_files_only=True)
        except Exception as e:  # a corrupt file or an architecture transformers cannot map
            raise ValueError(f"model_dir={path}: the GGUF file does not load "
                             f"({type(e).__name__}: {e})") from None


def _load_gguf(transformers, path: Path, model_type: str, dtype: torch.dtype):
    """(model, tokenizer) from a GGUF file: weights dequantized to `dtype`, the tokenizer
    the file describes."""
    where = dict(gguf_file=path.name, local_files_only=True)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, attn_implementation="eager", dtype=dtype, **where)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **where)
    except Exception as e:  # as for a directory: any failure means the file does not load
        raise ValueError(f"model_dir={path}: the {model_type} GGUF file does not load "
                         f"({type(e).__name__}: {e})") from None
    return model, tokenizer


def gguf_quantization(path) -> dict[str, int]:
    """{storage type (F32, Q8_0, Q4_K, ...): number of tensors} of a GGUF file."""
    reader = _gguf_module().GGUFReader(Path(path))
    return dict(Counter(t.tensor_type.name for t in reader.tensors))


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


