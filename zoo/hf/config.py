"""`RankzooConfig`: a DecoderLM's sizes and its blocks, one spec per layer, as a Hugging
Face config (model_type "rankzoo"). `lm_kwargs()` gives zoo/lm.py's `DecoderLM` its
arguments back, so the exported model is built exactly as the harness built the trained one.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class RankzooConfig(PretrainedConfig):
    model_type = "rankzoo"
    # the names generic tools read (lm-eval's max length, accelerate's layer count)
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers",
                     "max_position_embeddings": "max_len"}

    def __init__(self, vocab_size: int = 256, d_model: int = 64, n_layers: int = 1,
                 layers: list[dict[str, Any]] | None = None, mlp_ratio: float = 4.0,
                 d_mlp: int | None = None, max_len: int = 2048, norm: str = "rmsnorm",
                 tie_embeddings: bool = False, mlp: str = "gelu", use_cache: bool = True,
                 **kwargs: Any):
        self.vocab_size, self.d_model, self.n_layers = vocab_size, d_model, n_layers
        # one {"name": block, **its kwargs} per layer (a hybrid mixes families)
        self.layers = [dict(spec) for spec in (layers or [{"name": "softmax"}] * n_layers)]
        self.mlp_ratio, self.d_mlp, self.max_len = mlp_ratio, d_mlp, max_len
        self.norm, self.tie_embeddings, self.mlp = norm, tie_embeddings, mlp
        self.use_cache = use_cache  # generate() decodes through the blocks' own caches
        kwargs["tie_word_embeddings"] = tie_embeddings
        super().__init__(**kwargs)

    def lm_kwargs(self) -> dict[str, Any]:
        """DecoderLM's keyword arguments (zoo/lm.py)."""
        layers = [(s["name"], {k: v for k, v in s.items() if k != "name"}) for s in self.layers]
        return dict(vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers,
                    layers=layers, mlp_ratio=self.mlp_ratio, d_mlp=self.d_mlp,
                    max_len=self.max_len, norm=self.norm, tie_embeddings=self.tie_embeddings,
                    mlp=self.mlp)
