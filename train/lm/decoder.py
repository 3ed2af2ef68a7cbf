"""The harness's decoder LM, built from a resolved run config.

The model itself (norms, MLPs, layers, `DecoderLM`) lives in zoo/lm.py, beside the blocks,
so that an exported Hugging Face model (zoo/hf/modeling.py) wraps the very module the
harness trains; this module reads a run config into it: `block_specs` (one block per layer),
`max_heads`, `build_model`.
"""

from __future__ import annotations

from typing import Any

from zoo.lm import (
    MLP,
    MLPS,
    NORMS,
    DecoderLM,
    Layer,
    SwiGLU,
    layer_specs,
    make_norm,
    mlp_kind,
    mlp_matrices,
    mlp_width,
)

__all__ = ["MLP", "MLPS", "NORMS", "DecoderLM", "Layer", "SwiGLU", "block_specs", "build_model",
           "layer_specs", "make_norm", "max_heads", "mlp_kind", "mlp_matrices", "mlp_width"]


def block_specs(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One (block name, kwargs) per layer of a resolved run config: its `block` in every
    layer, or its `layers` (a layer pattern, train/config/layers.py)."""
    if "layers" in config:
        specs = config["layers"]
    else:
        specs = [config["block"]] * config["model"]["n_layers"]
    return [(s["name"], {k: v for k, v in s.items() if k != "name"}) for s in specs]


def max_heads(config: dict[str, Any]) -> int:
    """The most heads any layer of a resolved run config has (1 where a block sets none):
    what the probe's per-head figures and logs are sized by."""
    return max(kwargs.get("n_heads", 1) for _, kwargs in block_specs(config))


def build_model(config: dict[str, Any]) -> DecoderLM:
    """The DecoderLM of one resolved variant config (Experiment.variant_config)."""
    data, model = config["data"], config["model"]
    return DecoderLM(
        # a fine-tune (train/experiment/finetune.py) keeps its base model's sizes in the
        # model section
        vocab_size=model.get("vocab_size", data["vocab_size"]), d_model=model["d_model"],
        n_layers=model["n_layers"], layers=block_specs(config),
        mlp_ratio=model["mlp_ratio"], d_mlp=model["d_mlp"],
        max_len=model.get("max_len", data["seq_len"]), norm=model["norm"],
        tie_embeddings=model["tie_embeddings"],
        mlp=model.get("mlp", "gelu"),  # configs written before SwiGLU existed are GELU
    )
