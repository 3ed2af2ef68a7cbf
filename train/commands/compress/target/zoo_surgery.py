"""Zoo models as compress's target: a DecoderLM of one block family, its cache projected by
the kind each block declares (zoo_projections.py: kv, latent, state).

    target = ZooTarget(model, keys="auto")     # a DecoderLM of one block family
    target.slots                               # what is cached: Slots (bases/lowrank.py)
    with target.projected(P): target.evaluate(tokens, labels, batch_size)
    model = ZooTarget.load_model(saved_dir)    # a saved one (saved/load.py), as a run's

ZooTarget implements the Target protocol (protocol.py): its family is "kv" for every KV
cache, else the block's (mla, linear, ssm), and only a KV cache is healed, windowed or
served by the low-rank cache (cache.py zoo_caches). A KV head is read through a window by
its block's forward, patched to attend under a mask (bases/windows.py head_mask).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from budgets.cache import Keys
from budgets.probe.inputs import module_inputs
from zoo.block import CacheSlot
from zoo.ops.attention.reference import causal_band, expand_kv

from ..bases.lowrank import Slot
from ..bases.windows import head_mask, window_effects
from ..options import resolve_keys
from .cache import kv_only, zoo_caches
from .protocol import PerSequence
from .surgery import Surgery, projected, watching
from .zoo_projections import PROJECTIONS


def next_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """Labels [B, T] of next-token prediction: tokens shifted left, the last ignored."""
    from ....data import IGNORE

    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], IGNORE)], dim=1)


def slot_of(layer: int, slot: CacheSlot) -> Slot:
    """compress's Slot of a block's CacheSlot at `layer`."""
    return Slot(layer, slot.name, slot.heads, slot.width, columns=slot.columns,
                fixed_per_token=slot.fixed_per_token,
                fixed_per_sequence=slot.fixed_per_sequence, window=slot.window)


def _windowed_forward(block, heads: dict[int, tuple[int, int]]):
    """The block's forward without a cache, the KV heads of `heads` ({g: (W, s)}) reading
    their window and sinks alone: softmax attention under a mask per query head."""
    def forward(x: torch.Tensor, cache=None) -> torch.Tensor:
        if cache is not None:
            raise ValueError("a windowed head is measured on whole sequences, not decoded")
        B, T, _ = x.shape
        q, k, v = block.project(x)  # [B, H, T, K], [B, G, T, K], [B, G, T, V]
        H, G = q.shape[1], k.shape[1]
        allowed = head_mask(T, H, G, heads, x.device) & causal_band(T, T, block.window,
                                                                     x.device)
        o = F.scaled_dot_product_attention(q, expand_kv(k, H), expand_kv(v, H),
                                           attn_mask=allowed[None],
                                           scale=1 / math.sqrt(q.shape[-1]))
        return block.o_proj(o.transpose(1, 2).reshape(B, T, -1))  # [B, T, D]
    return forward


def _watch_attention(surgery: Surgery, i: int, block, record) -> None:
    """Layer i's attention output (live, [B, T, H*V] into W_O) and, from its input, what
    each window would change in it (bases/windows.py window_effects)."""
    H = block.config.n_heads

    def before(module, args):
        x = args[0]
        with torch.no_grad():
            P = block.mixing_matrices(x)  # [B, H, T, T] fp32
            v = block.value_heads(x)  # [B, H, T, V]
        G = block.cache_slots()[0].heads
        record.effects[i] = (window_effects(P, v, record.grid), G)

    def read(module, args):
        record.output(i, args[0], lambda t: t.view(t.shape[0], t.shape[1], H, -1)
                      .transpose(1, 2))
    surgery.pre_hook(block, before)
    surgery.pre_hook(block.o_proj, read)


def blocks_of_kind(*kinds: str) -> list[str]:
    """The registered blocks whose cache is of one of `kinds`, in registration order."""
    return [name for name in zoo.families() if zoo.facts_of(name).cache in kinds]


class ZooTarget:
    """A DecoderLM whose blocks are one zoo family: its cache slots, their calibration
    activations, their projection, its evaluation (loss and accuracy at labelled
    positions)."""

    kind = "zoo"
    kept = ()  # one block family: every layer's cache is compressed

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.blocks = list(model.blocks)
        kinds = sorted({b.kind for b in self.blocks})
        known = blocks_of_kind(*PROJECTIONS)
        if len(kinds) != 1 or kinds[0] not in known:
            raise ValueError(f"compress supports models of one block family among "
                             f"{', '.join(known)}; this one has {', '.join(kinds)}")
        self.block_kind = kinds[0]
        self.cache_kind = zoo.facts_of(self.block_kind).cache
        self.cache = PROJECTIONS[self.cache_kind]
        self.caches_kv = self.cache_kind == "kv"
        # the document's family: kv for every KV cache, else the block (mla, linear, ssm)
        self.family = "kv" if self.caches_kv else self.block_kind
        self.rope = self.caches_kv and bool(self.blocks[0].config.rope)
        self.keys = self._keys(keys)
        self.slots = [slot_of(i, s) for i, b in enumerate(self.blocks)
                      for s in self._cache_slots(b)]
        self.by_key = {s.key: s for s in self.slots}
        # layers whose KV heads may be read through a window (bases/windows.py)
        self.window_layers = [i for i, b in enumerate(self.blocks) if self.cache.windowable(b)]

    def _cache_slots(self, block) -> tuple[CacheSlot, ...]:
        slots = block.cache_slots()
        if tuple(s.name for s in slots) != self.cache.names:
            raise ValueError(f"{self.block_kind}.cache_slots() declares "
                             f"{[s.name for s in slots]}; a {self.cache_kind} cache holds "
                             f"{list(self.cache.names)}")
        return slots

    def _keys(self, keys: str) -> Keys | str:
        if self.caches_kv:
            return resolve_keys(keys, self.rope, f"the {self.block_kind} block (rope: false)")
        if keys != "auto":
            raise ValueError(f"keys={keys}: only attention with a KV cache has keys to choose "
                             f"({', '.join(blocks_of_kind('kv'))}); {self.block_kind} caches "
                             f"a {self.cache.holds}")
        return "auto"

    @property
    def saveable(self) -> str | None:
        """Why the compression is not a change of weights (None: it is)."""
        return self.cache.unsaveable(self)

    def describe(self) -> str:
        text = (f"{self.block_kind}: {len(self.blocks)} layers x "
                f"{self.blocks[0].describe_cache()}")
        return text + (f"; {self.keys.label_for(self.rope)}" if self.caches_kv else "")

    @property
    def one_scale(self) -> bool:
        """Whether the slots' weights share one scale (squared output error per token)."""
        return self.cache.one_scale

    @torch.no_grad()
    def activations(self, tokens: torch.Tensor, weights: dict | None = None,
                    residual: dict | None = None) -> dict[tuple[int, str], torch.Tensor]:
        """Per slot, what the cache would hold for tokens [B, T]: [B, G, T, K]; the
        weights of the slots that have one, into `weights` when it is a dict; per layer the
        mean squared norm of the residual stream entering it, into `residual`."""
        layers = dict(enumerate(getattr(self.model, "layers", [])))
        with (module_inputs(dict(enumerate(self.blocks))) as inputs,
              module_inputs(layers) as streams):
            self.model(tokens)
        out = {}
        for i, block in enumerate(self.blocks):
            out.update(self.cache.activations(self, i, block, inputs[i].float()))
            if weights is not None:
                weights.update(self.cache.weights(self, i, block, inputs[i].float()))
        if residual is not None:
            residual.update({i: float(h.double().square().sum(-1).mean())
                             for i, h in streams.items()})
        return out

    def apply(self, surgery: Surgery, P: dict[tuple[int, str], torch.Tensor],
              windows: dict | None = None) -> None:
        """Every slot projected by its P [G, K, K], and the KV heads of `windows`
        ({(layer, g): (W, s)}) read through their window, through `surgery`."""
        for i, block in enumerate(self.blocks):
            self.cache.project(self, surgery, i, block, P)
        for i in sorted({layer for layer, _ in windows or {}}):
            if i not in self.window_layers:
                raise ValueError(f"layer {i} ({self.block_kind}) takes no window of compress's")
            heads = {g: w for (layer, g), w in windows.items() if layer == i}
            surgery.patch(self.blocks[i], "_forward", _windowed_forward(self.blocks[i], heads))

    def projected(self, P: dict[tuple[int, str], torch.Tensor], windows: dict | None = None):
        """The model with every slot projected by its P [G, K, K] (and `windows`); undone
        on exit."""
        return projected(self, P, windows)

    def watched(self, record):
        """Inside, a forward pass records its live cache activations and (record.grid)
        the window layers' attention outputs and window effects (allocation/sensitivity.py)."""
        def watch(surgery: Surgery, record) -> None:
            for i, block in enumerate(self.blocks):
                self.cache.watch(self, surgery, i, block, record)
                if record.grid and i in self.window_layers:
                    _watch_attention(surgery, i, block, record)
        return watching(self, record, watch)

    def query_heads(self, i: int) -> int:
        """H: the query heads of layer i (a KV head serves H / G of them)."""
        return int(self.blocks[i].config.n_heads)

    def loss_logits(self, tokens: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The logits [n, vocab] of the positions whose loss counts (labelled ones; without
        labels, every position that predicts a next token)."""
        from ....data import IGNORE

        logits = self.model(tokens)  # [B, T, vocab]
        labels = next_tokens(tokens) if labels is None else labels
        return logits[labels.to(logits.device) != IGNORE]

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor | None,
                 batch_size: int) -> dict:
        """Mean cross-entropy and accuracy over the labelled positions (labels None: every
        next token)."""
        from ....data import IGNORE

        labels = next_tokens(tokens) if labels is None else labels
        loss, correct, count, sums, positions = 0.0, 0, 0, [], []
        for start in range(0, len(tokens), batch_size):
            t, y = tokens[start:start + batch_size], labels[start:start + batch_size]
            logits = self.model(t).float()  # [B, T, vocab]
            loss += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                          ignore_index=IGNORE, reduction="sum"))
            mask = y != IGNORE
            correct += int(((logits.argmax(-1) == y) & mask).sum())
            count += int(mask.sum())
            sums += F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE,
                                    reduction="none").sum(-1).tolist()  # per sequence
            positions += mask.sum(-1).tolist()
        if not count:
            raise ValueError("the evaluation data has no labelled positions")
        return {"loss": loss / count, "accuracy": correct / count, "tokens": count,
                "per_sequence": PerSequence(sums, positions)}

    def adapter_sites(self, P: dict) -> dict[nn.Module, list]:
        """{linear: rows} over every block's q_proj, k_proj, v_proj, o_proj (those it has);
        k_proj's rows projected where compress projects W_K."""
        weight_keys = self.keys is Keys.PRE_ROPE or not self.rope
        sites: dict[nn.Module, list] = {}
        for i, block in enumerate(self.blocks):
            for name, key in (("q_proj", None), ("k_proj", (i, "k") if weight_keys else None),
                              ("v_proj", (i, "v")), ("o_proj", None)):
                linear = getattr(block, name, None)
                if isinstance(linear, nn.Linear):
                    index = torch.arange(linear.out_features, device=linear.weight.device)
                    sites[linear] = [] if key is None else [(index, P[key])]
        return sites

    # ------------------------------------------------------------ a saved zoo model

    @staticmethod
    def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return model(ids)  # [B, T, vocab]

    @staticmethod
    def load_model(path: Path) -> nn.Module:
        """A checkpoint laid out like a run's variant (saved/save.py save_zoo)."""
        from ....lm.decoder import build_model
        from ....rundir.layout import VariantFiles
        from ....rundir.read import MODEL_PREFIX, check_shapes, load_checkpoint, run_config

        ckpt = VariantFiles(path).checkpoint
        checkpoint, model = load_checkpoint(ckpt), build_model(run_config(path))
        check_shapes(model, checkpoint.state_dict, ckpt, prefix=MODEL_PREFIX)  # one line
        model.load_state_dict(checkpoint.model_state)
        return model.eval()

    @staticmethod
    def unserved(info: dict) -> str | None:
        return kv_only(info)  # a latent's or a state's family is not served

    @staticmethod
    def lowrank_cache(model: nn.Module, codes: dict, dtype: torch.dtype, info: dict,
                      batch: int, max_len: int | None):
        """One LowRankKVCache per layer, preallocated for max_len tokens (the model's
        max_len by default)."""
        return zoo_caches(model, codes, batch, max_len or model.max_len, dtype)

    @staticmethod
    def step(model: nn.Module, ids: torch.Tensor, cache) -> torch.Tensor:
        return model(ids, cache)
