"""Zoo models' caches, by the kind each block declares: what is cached, and how compress
projects it.

    target = ZooTarget(model, keys="auto")     # a DecoderLM of one block family
    target.slots                               # what is cached: Slots (lowrank.py)
    with target.projected(P): target.evaluate(tokens, labels, batch_size)

A block's facts name its cache kind (zoo/facts.py Facts.cache) and the block answers what
compress asks of a cache of that kind (zoo/block.py: cache_slots, and the kind's own
members), so compress holds one projection per kind, not per block, and a new block of a
known kind needs no edit here:
  kv       keys before RoPE (W_K -> P W_K per KV head, bias too; the model rotates the
           rebuilt keys) or, keys=post-rope, the rotated keys (wrapping the block's
           keys_values), and values (W_V -> P W_V); keys of a block without RoPE are
           projected as they are cached (softmax, sliding_window, moe)
  latent   the latent cache c: its reader kv_up(c) -> kv_up(P c), i.e. W_up -> W_up P (mla)
  state    the state's rows, by projecting what writes them (wrapping the block's
           write_rows): linear attention's S = sum phi(k) [v, 1]^T over its F feature
           rows, phi(k) -> P phi(k); an SSM's h = sum x B^T over its N rows per B/C group,
           B -> P B (its conv state kept in full)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from budgets.cache import Keys
from budgets.probe.inputs import module_inputs
from zoo.block import CacheSlot, split_heads
from zoo.ops.attention.reference import causal_band, expand_kv

from .agreement import PerSequence
from .lowrank import Slot, project_heads
from .options import resolve_keys
from .readout import Weight, query_weight, readout_weights
from .surgery import Surgery, project_linear, projected, watching
from .windows import head_mask, window_effects


def next_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """Labels [B, T] of next-token prediction: tokens shifted left, the last ignored."""
    from ...data import IGNORE

    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], IGNORE)], dim=1)


def slot_of(layer: int, slot: CacheSlot) -> Slot:
    """compress's Slot of a block's CacheSlot at `layer`."""
    return Slot(layer, slot.name, slot.heads, slot.width, columns=slot.columns,
                fixed_per_token=slot.fixed_per_token,
                fixed_per_sequence=slot.fixed_per_sequence, window=slot.window)


class KVProjection:
    """A KV cache (kv): keys and values per KV head [B, G, T, K]."""

    names = ("k", "v")
    # weights in squared output error per token (train/commands/compress/readout.py)
    one_scale = True

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        k, v = block.keys_values(x)  # rotated keys [B, G, T, K], values [B, G, T, V]
        if target.keys is Keys.PRE_ROPE:
            k = split_heads(block.k_proj, x, k.shape[1])  # the projection's output
        return {(i, "k"): k, (i, "v"): v}

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The keys' and values' weights on one scale (readout_weights): the queries and
        the attention reading each KV head, and W_O; none where no one W_O reads the
        cache (MoE's experts: energy bases)."""
        read = block.cache_readout(x)
        if read is None:
            return {}
        keys, values = readout_weights(read.queries, read.values, [read.probs], read.w_o,
                                       read.scale2, read.rope)
        return {(i, "k"): keys, (i, "v"): values}

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        Pk, Pv = P[(i, "k")], P[(i, "v")]
        if target.keys is Keys.PRE_ROPE or not target.rope:
            project_linear(surgery, block.k_proj.weight, block.k_proj.bias, Pk)
        else:
            surgery.patch(block, "keys_values", _rotated_keys_projected(block.keys_values, Pk))
        project_linear(surgery, block.v_proj.weight, block.v_proj.bias, Pv)

    def unsaveable(self, target: ZooTarget) -> str | None:
        if target.keys is Keys.POST_ROPE and target.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None

    def watch(self, target: ZooTarget, surgery: Surgery, i: int, block, record) -> None:
        """The live keys (where they are projected) and values of layer i into record."""
        G = target.by_key[(i, "k")].heads
        if target.keys is Keys.PRE_ROPE or not target.rope:
            surgery.hook(block.k_proj, _recording(record, (i, "k"), G))
        else:
            surgery.patch(block, "keys_values", _keys_recorded(block.keys_values, record, i))
        surgery.hook(block.v_proj, _recording(record, (i, "v"), G))

    def windowable(self, block) -> bool:
        """A block of the softmax family's explicit form (queries, keys and values from
        `project`, read through `o_proj`) without a window of its own."""
        return (callable(getattr(block, "project", None)) and hasattr(block, "o_proj")
                and getattr(block, "window", None) is None)


def _recording(record, key, heads: int):
    """A forward hook putting a projection's output [B, T, G*K] into record."""
    def hook(module, args, out):
        record.slot(key, out, lambda t: t.view(t.shape[0], t.shape[1], heads, -1)
                    .transpose(1, 2))
    return hook


def _keys_recorded(keys_values, record, i: int):
    """A block's keys_values putting its rotated keys [B, G, T, K] into record."""
    def recorded(x: torch.Tensor, offset: int = 0):
        k, v = keys_values(x, offset)
        record.slot((i, "k"), k, lambda t: t)
        return k, v
    return recorded


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
    each window would change in it (windows.py window_effects)."""
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


def _rotated_keys_projected(keys_values, Pk: torch.Tensor):
    """A block's keys_values with its rotated keys [B, G, T, K] projected by Pk [G, K, K]."""
    def projected_keys(x: torch.Tensor, offset: int = 0):
        k, v = keys_values(x, offset)
        return project_heads(k, Pk), v
    return projected_keys


class LatentProjection:
    """A latent cache (latent): c [B, 1, T, R] per token; a RoPE key beside it is cached
    in full."""

    names = ("latent",)
    holds = "latent"
    one_scale = True

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "latent"): block.latents(x, 0)[0][:, None]}  # [B, 1, T, R]

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The latent's weight [1, R, R] on the keys' and values' scale: what its nope
        keys cost through the queries (k_h = W_UK,h c) plus what its values cost through
        W_O (v_h = W_UV,h c, their fluctuations taken as independent), summed over heads."""
        read = block.cache_readout(x)
        keys, values = readout_weights(read.queries, read.values, [read.probs], read.w_o,
                                       read.scale2, read.rope)  # [H, dn, dn], [H, dv, dv]
        W_v = values.matrix * values.spread[:, None, None]
        w_uk, w_uv = (w.cpu() for w in block.absorbed_weights(torch.float64))  # [H, d, R]
        latent = (torch.einsum("hdr,hde,hes->rs", w_uk, keys.matrix, w_uk)
                  + torch.einsum("hdr,hde,hes->rs", w_uv, W_v, w_uv))
        return {(i, "latent"): Weight(latent[None])}

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        w = block.kv_up.weight  # [H*(dn+dv), R]: kv_up(P c) = (W P) c
        surgery.overwrite(w, (w.double() @ P[(i, "latent")][0].to(w.device)).to(w.dtype))

    def unsaveable(self, target: ZooTarget) -> str | None:
        return None

    def watch(self, target: ZooTarget, surgery: Surgery, i: int, block, record) -> None:
        """The live latent [B, T, R] as kv_up reads it."""
        surgery.pre_hook(block.kv_up, lambda module, args: record.slot(
            (i, "latent"), args[0], lambda t: t[:, None]))

    def windowable(self, block) -> bool:
        return False


class StateProjection:
    """A recurrent state (state), projected inside the block's forward pass (no weight to
    save): its rows per head or group, written by what block.state_rows gives first."""

    names = ("state",)
    holds = "recurrent state"
    one_scale = False  # its rows are weighed by their readout, not yet by W_O: shares

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "state"): block.state_rows(x)[0]}  # [B, G, T, N]

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The state's rows are read by what state_rows gives second: its second moment
        per head or group."""
        reads = block.state_rows(x)[1]  # [B, G, T, N]
        return {(i, "state"): Weight(query_weight(reads, reads.shape[1], rope=False))}

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        Ps = P[(i, "state")]
        surgery.patch(block, "write_rows", lambda rows: project_heads(rows, Ps))

    def unsaveable(self, target: ZooTarget) -> str | None:
        return (f"{target.block_kind}'s state is projected inside its forward pass, not "
                f"through a weight")

    def watch(self, target: ZooTarget, surgery: Surgery, i: int, block, record) -> None:
        """The live rows the state is written with [B, G, T, N]."""
        def rows_recorded(rows: torch.Tensor) -> torch.Tensor:
            record.slot((i, "state"), rows, lambda t: t)
            return rows
        surgery.patch(block, "write_rows", rows_recorded)

    def windowable(self, block) -> bool:
        return False


# cache kind (zoo/facts.py CACHE_KINDS) -> how compress reads and projects it
PROJECTIONS = {"kv": KVProjection(), "latent": LatentProjection(), "state": StateProjection()}


def blocks_of_kind(*kinds: str) -> list[str]:
    """The registered blocks whose cache is of one of `kinds`, in registration order."""
    return [name for name in zoo.families() if zoo.facts_of(name).cache in kinds]


class ZooTarget:
    """A DecoderLM whose blocks are one zoo family: its cache slots, their calibration
    activations, their projection, its evaluation (loss and accuracy at labelled
    positions)."""

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
        # the document's family: kv for every KV cache, else the block (mla, linear, ssm)
        self.family = "kv" if self.cache_kind == "kv" else self.block_kind
        self.rope = self.cache_kind == "kv" and bool(self.blocks[0].config.rope)
        self.keys = self._keys(keys)
        self.slots = [slot_of(i, s) for i, b in enumerate(self.blocks)
                      for s in self._cache_slots(b)]
        self.by_key = {s.key: s for s in self.slots}
        # layers whose KV heads may be read through a window (windows.py)
        self.window_layers = [i for i, b in enumerate(self.blocks) if self.cache.windowable(b)]

    def _cache_slots(self, block) -> tuple[CacheSlot, ...]:
        slots = block.cache_slots()
        if tuple(s.name for s in slots) != self.cache.names:
            raise ValueError(f"{self.block_kind}.cache_slots() declares "
                             f"{[s.name for s in slots]}; a {self.cache_kind} cache holds "
                             f"{list(self.cache.names)}")
        return slots

    def _keys(self, keys: str) -> Keys | str:
        if self.cache_kind == "kv":
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
        return text + (f"; {self.keys.label_for(self.rope)}" if self.cache_kind == "kv" else "")

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
        the window layers' attention outputs and window effects (sensitivity.py)."""
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
        from ...data import IGNORE

        logits = self.model(tokens)  # [B, T, vocab]
        labels = next_tokens(tokens) if labels is None else labels
        return logits[labels.to(logits.device) != IGNORE]

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor | None,
                 batch_size: int) -> dict:
        """Mean cross-entropy and accuracy over the labelled positions (labels None: every
        next token)."""
        from ...data import IGNORE

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
