"""How compress reads and projects each kind of zoo cache: one projection per kind a block
declares (zoo/facts.py Facts.cache), not one per block.

    projection = PROJECTIONS[zoo.facts_of(block.kind).cache]
    projection.activations(target, i, block, x)    # {slot key: [B, G, T, K]}
    projection.project(target, surgery, i, block, P)

The block answers what compress asks of a cache of its kind (zoo/block.py: cache_slots, and
the kind's own members), so a new block of a known kind needs no edit here:
  kv       keys before RoPE (W_K -> P W_K per KV head, bias too; the model rotates the
           rebuilt keys) or, keys=post-rope, the rotated keys (wrapping the block's
           keys_values), and values (W_V -> P W_V); keys of a block without RoPE are
           projected as they are cached (softmax, sliding_window, moe)
  latent   the latent cache c: its reader kv_up(c) -> kv_up(P c), i.e. W_up -> W_up P (mla)
  state    the state's rows, by projecting what writes them (wrapping the block's
           write_rows): linear attention's S = sum phi(k) [v, 1]^T over its F feature
           rows, phi(k) -> P phi(k); an SSM's h = sum x B^T over its N rows per B/C group,
           B -> P B (its conv state kept in full); the delta rule's S over its K rows per
           key head, k -> P k after its L2 norm (each update subtracts along k and adds
           along k, so S stays in span(P) exactly; its conv state kept in full)

Each method takes the ZooTarget (zoo_surgery.py) whose block it reads: its keys, its RoPE,
its slots.
"""

from __future__ import annotations

import torch

from budgets.cache import Keys
from zoo.block import split_heads

from ..bases.lowrank import project_heads
from ..bases.readout import Weight, query_weight, readout_weights
from .surgery import Surgery, project_linear


class KVProjection:
    """A KV cache (kv): keys and values per KV head [B, G, T, K]."""

    names = ("k", "v")
    # weights in squared output error per token (bases/readout.py)
    one_scale = True

    def activations(self, target, i: int, block, x: torch.Tensor) -> dict:
        k, v = block.keys_values(x)  # rotated keys [B, G, T, K], values [B, G, T, V]
        if target.keys is Keys.PRE_ROPE:
            k = split_heads(block.k_proj, x, k.shape[1])  # the projection's output
        return {(i, "k"): k, (i, "v"): v}

    def weights(self, target, i: int, block, x: torch.Tensor) -> dict:
        """The keys' and values' weights on one scale (readout_weights): the queries and
        the attention reading each KV head, and W_O; none where no one W_O reads the
        cache (MoE's experts: energy bases)."""
        read = block.cache_readout(x)
        if read is None:
            return {}
        keys, values = readout_weights(read.queries, read.values, [read.probs], read.w_o,
                                       read.scale2, read.rope)
        return {(i, "k"): keys, (i, "v"): values}

    def project(self, target, surgery: Surgery, i: int, block, P: dict) -> None:
        Pk, Pv = P[(i, "k")], P[(i, "v")]
        if target.keys is Keys.PRE_ROPE or not target.rope:
            project_linear(surgery, block.k_proj.weight, block.k_proj.bias, Pk)
        else:
            surgery.patch(block, "keys_values", _rotated_keys_projected(block.keys_values, Pk))
        project_linear(surgery, block.v_proj.weight, block.v_proj.bias, Pv)

    def unsaveable(self, target) -> str | None:
        if target.keys is Keys.POST_ROPE and target.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None

    def watch(self, target, surgery: Surgery, i: int, block, record) -> None:
        """The live keys (where they are projected) and values of layer i into record."""
        G = target.by_key[(i, "k")].heads
        if target.keys is Keys.PRE_ROPE or not target.rope:
            surgery.hook(block.k_proj, _recording(record, (i, "k"), G))
        else:
            surgery.patch(block, "keys_values", _keys_recorded(block.keys_values, record, i))
        surgery.hook(block.v_proj, _recording(record, (i, "v"), G))

    def windowable(self, block) -> bool:
        """A block of the softmax family's explicit form (queries, keys and values from
        `project`, read through `o_proj`) without a window of its own, nor sinks, an output
        gate or chunks, which the windowed forward (zoo_surgery.py) does not take."""
        c = getattr(block, "config", None)
        options = (getattr(c, "sinks", False) or getattr(c, "output_gate", "none") != "none"
                   or getattr(c, "chunk", None) is not None)
        return (callable(getattr(block, "project", None)) and hasattr(block, "o_proj")
                and getattr(block, "window", None) is None and not options)


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

    def activations(self, target, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "latent"): block.latents(x, 0)[0][:, None]}  # [B, 1, T, R]

    def weights(self, target, i: int, block, x: torch.Tensor) -> dict:
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

    def project(self, target, surgery: Surgery, i: int, block, P: dict) -> None:
        w = block.kv_up.weight  # [H*(dn+dv), R]: kv_up(P c) = (W P) c
        surgery.overwrite(w, (w.double() @ P[(i, "latent")][0].to(w.device)).to(w.dtype))

    def unsaveable(self, target) -> str | None:
        return None

    def watch(self, target, surgery: Surgery, i: int, block, record) -> None:
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

    def activations(self, target, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "state"): block.state_rows(x)[0]}  # [B, G, T, N]

    def weights(self, target, i: int, block, x: torch.Tensor) -> dict:
        """The state's rows are read by what state_rows gives second: its second moment
        per head or group."""
        reads = block.state_rows(x)[1]  # [B, G, T, N]
        return {(i, "state"): Weight(query_weight(reads, reads.shape[1], rope=False))}

    def project(self, target, surgery: Surgery, i: int, block, P: dict) -> None:
        Ps = P[(i, "state")]
        surgery.patch(block, "write_rows", lambda rows: project_heads(rows, Ps))

    def unsaveable(self, target) -> str | None:
        return (f"{target.block_kind}'s state is projected inside its forward pass, not "
                f"through a weight")

    def watch(self, target, surgery: Surgery, i: int, block, record) -> None:
        """The live rows the state is written with [B, G, T, N]."""
        def rows_recorded(rows: torch.Tensor) -> torch.Tensor:
            record.slot((i, "state"), rows, lambda t: t)
            return rows
        surgery.patch(block, "write_rows", rows_recorded)

    def windowable(self, block) -> bool:
        return False


# cache kind (zoo/facts.py CACHE_KINDS) -> how compress reads and projects it
PROJECTIONS = {"kv": KVProjection(), "latent": LatentProjection(), "state": StateProjection()}
