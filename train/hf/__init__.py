"""Hugging Face causal LMs read from disk (train/hf/model_dir.py) and probed on a text for the
rank-budget report (train/hf/probe.py)."""

from .model_dir import (
    ADAPTER_CONFIG,
    DEVICES,
    DTYPES,
    HF_CONFIG,
    INSTALL_HINT,
    adapter_dir,
    device_of,
    dtype_of,
    gguf_quantization,
    import_transformers,
    is_gguf,
    load_adapter,
    load_model,
    model_type_of,
    offline,
    quiet,
)
from .probe import (
    bos_of,
    bos_text,
    load_for_probe,
    probe_batch,
    probe_hf,
    probe_notes,
    read_text,
    token_ids,
    with_bos,
    zoo_blocks,
)

__all__ = ["ADAPTER_CONFIG", "DEVICES", "DTYPES", "HF_CONFIG", "INSTALL_HINT", "adapter_dir",
           "bos_of", "bos_text", "with_bos",
           "device_of", "dtype_of", "gguf_quantization", "is_gguf",
           "import_transformers", "load_adapter",
           "load_for_probe", "load_model", "model_type_of", "offline", "probe_batch", "probe_hf",
           "probe_notes", "quiet", "read_text", "token_ids", "zoo_blocks"]
