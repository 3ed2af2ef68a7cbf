"""`RankzooForCausalLM`: zoo/lm.py's `DecoderLM` as a Hugging Face causal LM, so that
`from_pretrained`, `generate()` and lm-evaluation-harness read an exported variant.

Its logits are the DecoderLM's own (the module is the one the harness trains, weights
under `model.`). Decoding goes through each block's own `init_cache` (`ZooCache`: one
cache per layer, of that layer's block type: a KV cache, a sliding window's ring, MLA's
latent, linear-attention, SSM and delta-rule states with their conv states; a hybrid
mixes them), not transformers' DynamicCache.

Padding: an attention mask with zeros runs the batch row by row, each row's masked tokens
left out and each row with a cache of its own, so a left-padded batch gives every row
exactly what it gives alone, for every block family (a recurrent state never takes a pad
in). Unpadded batches run batched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..lm import DecoderLM
from .config import RankzooConfig

IGNORE = -100  # transformers' label that takes no loss


class ZooCache:
    """The decoding state `generate` carries between steps: a DecoderLM cache (one per
    layer, each block's own type) for the whole batch, or one per row for a padded batch."""

    def __init__(self, lm: DecoderLM, batch: int, max_len: int, per_row: bool):
        self.per_row = per_row
        self.layers = None if per_row else lm.init_cache(batch, max_len)
        self.rows = [lm.init_cache(1, max_len) for _ in range(batch)] if per_row else None
        self.seen = 0  # positions taken in, pads included: what generate slices inputs by

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen


class RankzooForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = RankzooConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Layer"]
    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}  # when tie_embeddings

    def __init__(self, config: RankzooConfig):
        super().__init__(config)
        self.model = DecoderLM(**config.lm_kwargs())  # [B, T] -> [B, T, vocab]
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: DecoderLM and its blocks initialize themselves (zoo/lm.py), and a
        loaded model takes every weight from its file."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # forward builds a ZooCache from the blocks' own init_cache

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.model.head = value

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: ZooCache | None = None,
                use_cache: bool | None = None, labels: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any
                ) -> CausalLMOutputWithPast:
        """Logits [B, T, vocab] for input_ids [B, T]. `attention_mask` [B, past + T] (1:
        a token, 0: padding); `cache` continues the sequences it holds (`past_key_values`,
        transformers' former name, is taken too); position_ids are ignored: each block
        counts positions in its own cache, and pads are never counted."""
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("RankzooForCausalLM takes input_ids; inputs_embeds "
                             f"({None if inputs_embeds is None else tuple(inputs_embeds.shape)}) "
                             "is not supported")
        if cache is not None and not isinstance(cache, ZooCache):
            raise ValueError(f"RankzooForCausalLM decodes through its own ZooCache, got "
                             f"{type(cache).__name__}; pass none and generate() builds it")
        B, T = input_ids.shape
        mask = None if attention_mask is None else attention_mask[:, -T:].bool()  # [B, T]
        padded = mask is not None and not bool(mask.all())
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = ZooCache(self.model, B, self.config.max_len, per_row=padded)
        if cache is not None and not cache.per_row and padded:
            raise ValueError("RankzooForCausalLM: padding after an unpadded first call "
                             "(its cache runs the batch as one); pad the prompt instead")
        if padded or (cache is not None and cache.per_row):
            rows = None if cache is None else cache.rows
            logits = self._rows(input_ids, mask, rows)  # [B, T, vocab]
        else:
            logits = self.model(input_ids, None if cache is None else cache.layers)
        if cache is not None:
            cache.seen += T
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten(), ignore_index=IGNORE)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      cache=cache if use_cache else None)

    def _rows(self, input_ids: torch.Tensor, mask: torch.Tensor | None,
              rows: list[list[Any]] | None) -> torch.Tensor:
        """Each row alone, its masked tokens left out (with its own cache where decoding);
        the logits at masked positions are zeros."""
        B, T = input_ids.shape
        logits = input_ids.new_zeros(B, T, self.config.vocab_size, dtype=torch.float32)
        for b in range(B):
            keep = torch.ones(T, dtype=torch.bool) if mask is None else mask[b]  # [T]
            if not bool(keep.any()):
                continue
            out = self.model(input_ids[b, keep][None], None if rows is None else rows[b])
            logits[b, keep] = out[0].to(logits.dtype)  # [T_b, vocab]
        return logits
