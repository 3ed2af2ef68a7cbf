"""Zoo models' caches, per block family: what each caches, and how compress projects it.

    target = ZooTarget(model, keys="auto")     # a DecoderLM of one block family
    target.slots                               # train/commands/compress/lowrank.py Slots: what is cached
    with target.projected(P): target.evaluate(tokens, labels, batch_size)

What is projected, per family (each a row of BLOCKS; a new block is one row there):
  softmax, sliding_window, moe   keys before RoPE (W_K -> P W_K per KV head, bias too; the
                 model rotates the rebuilt keys) or, keys=post-rope, the rotated keys (in
                 the block's projection), and values (W_V -> P W_V); keys of a block
                 without RoPE are projected as they are cached
  mla            the latent cache c: kv_up(c) -> kv_up(P c), i.e. W_up -> W_up P
  linear         the state S = sum phi(k) [v, 1]^T over its F feature rows: phi(k) -> P phi(k)
  ssm            the state h = sum x B^T over its N rows, per B/C group: B -> P B (the conv
                 state is kept in full)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .lowrank import Slot, project_heads
from .readout import (
    Weight,
    head_gram,
    query_weight,
    readout_sensitivity,
    value_spread,
    value_weight,
)
from zoo.block import split_heads

from ...sizing.families import CACHE_KINDS
from .options import key_label, resolve_keys
from .surgery import Surgery, project_linear, projected


class KVCache:
    """softmax and sliding_window: keys and values per KV head [B, G, T, K]."""

    one_scale = True  # weights in squared output error per token (train/commands/compress/readout.py)

    def heads(self, c) -> int:
        return c.kv_heads

    def slots(self, i: int, c) -> list[Slot]:
        G, W = self.heads(c), getattr(c, "window", None)
        return [Slot(i, "k", G, c.k_dim, window=W), Slot(i, "v", G, c.k_dim, window=W)]

    def describe(self, kind: str, n: int, c, keys: str) -> str:
        return (f"{kind}: {n} layers x {self.heads(c)} KV heads x (K {c.k_dim} + V "
                f"{c.k_dim}); {keys}")

    def rotated(self, block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, k, v = block.project(x)  # rotated keys, [B, G, T, K]
        return k, v

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        k_post, v = self.rotated(block, x)
        k_pre = split_heads(block.k_proj, x, self.heads(block.config))
        return {(i, "k"): k_pre if target.keys == "pre-rope" else k_post, (i, "v"): v}

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The keys' and values' weights on one scale (train/commands/compress/readout.py): the queries
        and the attention reading each KV head, and W_O."""
        c = block.config
        q, _, v = block.project(x)  # [B, H, T, K], [B, G, T, K]; pair energies ignore RoPE
        P = block.mixing_matrices(x)  # [B, H, T, T]
        v_h = v.repeat_interleave(c.n_heads // self.heads(c), dim=1)  # [B, H, T, K]
        M = head_gram(block.o_proj.weight, c.n_heads)  # [H, K, K]
        rho, kappa = readout_sensitivity(P, v_h, M)
        G, scale = self.heads(c), 1 / c.k_dim  # the logits' 1/sqrt(K), squared
        return {(i, "k"): Weight(query_weight(q, G, target.rope, rho * scale)),
                (i, "v"): Weight(value_weight(block.o_proj.weight, c.n_heads, G),
                                 value_spread(kappa, M, G))}

    def project_rotated(self, surgery: Surgery, block, Pk: torch.Tensor) -> None:
        project = block.project
        surgery.patch(block, "project", lambda x, offset=0: (
            lambda q, k, v: (q, project_heads(k, Pk), v))(*project(x, offset)))

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        Pk, Pv = P[(i, "k")], P[(i, "v")]
        if target.keys == "pre-rope" or not target.rope:
            project_linear(surgery, block.k_proj.weight, block.k_proj.bias, Pk)
        else:
            self.project_rotated(surgery, block, Pk)
        project_linear(surgery, block.v_proj.weight, block.v_proj.bias, Pv)

    def unsaveable(self, target: ZooTarget) -> str | None:
        if target.keys == "post-rope" and target.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None


class SharedKVCache(KVCache):
    """moe: one KV head shared by its experts."""

    def heads(self, c) -> int:
        return 1

    def rotated(self, block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return block.shared_kv(x)  # [B, 1, T, K]

    one_scale = False

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {}  # queries and outputs go through the routed experts: energy bases

    def project_rotated(self, surgery: Surgery, block, Pk: torch.Tensor) -> None:
        shared = block.shared_kv
        surgery.patch(block, "shared_kv", lambda x, offset=0: (
            lambda k, v: (project_heads(k, Pk), v))(*shared(x, offset)))


class LatentCache:
    """mla: the latent c [B, 1, T, R]; its RoPE key is cached in full."""

    holds = "latent"
    one_scale = True

    def slots(self, i: int, c) -> list[Slot]:
        return [Slot(i, "latent", 1, c.latent, fixed_per_token=c.rope_dim)]

    def describe(self, kind: str, n: int, c, keys: str) -> str:
        return f"mla: {n} layers x latent R {c.latent} (+ RoPE key {c.rope_dim}, kept)"

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "latent"): block.latents(x, 0)[0][:, None]}  # [B, 1, T, R]

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        w = block.kv_up.weight  # [H*(dn+dv), R]: kv_up(P c) = (W P) c
        surgery.overwrite(w, (w.double() @ P[(i, "latent")][0].to(w.device)).to(w.dtype))

    def unsaveable(self, target: ZooTarget) -> str | None:
        return None

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The latent's weight [1, R, R] on the keys' and values' scale: what its nope
        keys cost through the queries (k_h = W_UK,h c) plus what its values cost through
        W_O (v_h = W_UV,h c), summed over heads."""
        c = block.config
        q, _, v = block.project(x)  # [B, H, T, dn + dr], [B, H, T, dv]
        P = block.mixing_matrices(x)  # [B, H, T, T]
        M = head_gram(block.o_proj.weight, c.n_heads)  # [H, dv, dv]
        rho, kappa = readout_sensitivity(P, v, M)
        q_nope = q[..., :c.nope_dim]  # the rope part reads the RoPE key, kept in full
        W_q = query_weight(q_nope, c.n_heads, False, rho * block.scale ** 2)  # [H, dn, dn]
        M = M * kappa.mean((0, 2))[:, None, None]  # values' fluctuations, as independent
        w_uk, w_uv = block.absorbed_weights(torch.float64)  # [H, dn, R], [H, dv, R]
        w_uk, w_uv = w_uk.cpu(), w_uv.cpu()
        latent = (torch.einsum("hdr,hde,hes->rs", w_uk, W_q, w_uk)
                  + torch.einsum("hdr,hde,hes->rs", w_uv, M.cpu(), w_uv))
        return {(i, "latent"): Weight(latent[None])}

class StateCache:
    """A recurrent state, projected inside the block's forward pass (no weight to save)."""

    holds = "recurrent state"
    one_scale = False  # its rows are weighed by their readout, not yet by W_O: shares

    def unsaveable(self, target: ZooTarget) -> str | None:
        return (f"{target.block_kind}'s state is projected inside its forward pass, not "
                f"through a weight")


class LinearState(StateCache):
    """linear: the state's F feature rows per head, phi(k) [B, H, T, F]."""


    def slots(self, i: int, c) -> list[Slot]:
        return [Slot(i, "state", c.n_heads, c.f_dim, columns=c.head_dim + int(c.normalize))]

    def describe(self, kind: str, n: int, c, keys: str) -> str:
        return (f"linear: {n} layers x {c.n_heads} heads x state F {c.f_dim} x "
                f"{c.head_dim + int(c.normalize)}")

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "state"): block.features(x)[1]}  # phi(k) [B, H, T, F]

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The state's rows are read by phi(q): their second moment per head."""
        phi_q = block.features(x)[0]  # [B, H, T, F]
        return {(i, "state"): Weight(query_weight(phi_q, phi_q.shape[1], rope=False))}

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        features, Ps = block.features, P[(i, "state")]
        surgery.patch(block, "features", lambda x: (
            lambda q, k, v: (q, project_heads(k, Ps), v))(*features(x)))


class SSMState(StateCache):
    """ssm: the state's N rows per B/C group, B [B, G, T, N]; the conv state kept."""


    def slots(self, i: int, c) -> list[Slot]:
        heads_per_group = c.n_heads // c.n_groups  # B is shared by a group's heads
        return [Slot(i, "state", c.n_groups, c.d_state, columns=heads_per_group * c.head_dim,
                     fixed_per_sequence=c.conv_dim * (c.d_conv - 1))]

    def describe(self, kind: str, n: int, c, keys: str) -> str:
        return (f"ssm: {n} layers x {c.n_groups} groups x state N {c.d_state} (x "
                f"{c.n_heads // c.n_groups} heads x P {c.head_dim}), conv state kept")

    def activations(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        return {(i, "state"): block.project(x)[4].transpose(1, 2)}  # B [B, G, T, N]

    def weights(self, target: ZooTarget, i: int, block, x: torch.Tensor) -> dict:
        """The state's rows are read by C: its second moment per B/C group."""
        C = block.project(x)[5].transpose(1, 2)  # [B, G, T, N]
        return {(i, "state"): Weight(query_weight(C, C.shape[1], rope=False))}

    def project(self, target: ZooTarget, surgery: Surgery, i: int, block, P: dict) -> None:
        project, Ps = block.project, P[(i, "state")]

        def ssm_project(x, cache=None, _project=project, _P=Ps):
            z, xs, dt, A, B, C, conv_state = _project(x, cache)
            return z, xs, dt, A, project_heads(B, _P, head_dim=-2), C, conv_state
        surgery.patch(block, "project", ssm_project)


# block kind -> how its cache is read and projected
BLOCKS = {"softmax": KVCache(), "sliding_window": KVCache(), "moe": SharedKVCache(),
          "mla": LatentCache(), "linear": LinearState(), "ssm": SSMState()}
FAMILIES = {kind: CACHE_KINDS[kind] for kind in BLOCKS}  # the family table's cache kinds


class ZooTarget:
    """A DecoderLM whose blocks are one zoo family: its cache slots, their calibration
    activations, their projection, its evaluation (loss and accuracy at labelled
    positions)."""

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.blocks = list(model.blocks)
        kinds = sorted({b.kind for b in self.blocks})
        if len(kinds) != 1 or kinds[0] not in BLOCKS:
            raise ValueError(f"compress supports models of one block family among "
                             f"{', '.join(BLOCKS)}; this one has {', '.join(kinds)}")
        self.block_kind = kinds[0]
        self.cache = BLOCKS[self.block_kind]
        self.family = FAMILIES[self.block_kind]
        self.rope = self.family == "kv" and bool(self.blocks[0].config.rope)
        self.keys = self._keys(keys)
        self.slots = [slot for i, b in enumerate(self.blocks)
                      for slot in self.cache.slots(i, b.config)]

    def _keys(self, keys: str) -> str:
        if self.family == "kv":
            return resolve_keys(keys, self.rope, f"the {self.block_kind} block (rope: false)")
        if keys != "auto":
            raise ValueError(f"keys={keys}: only attention with a KV cache has keys to choose "
                             f"(softmax, sliding_window, moe); {self.block_kind} caches a "
                             f"{self.cache.holds}")
        return "auto"

    @property
    def saveable(self) -> str | None:
        """Why the compression is not a change of weights (None: it is)."""
        return self.cache.unsaveable(self)

    def describe(self) -> str:
        return self.cache.describe(self.block_kind, len(self.blocks), self.blocks[0].config,
                                   key_label(self.keys, self.rope))

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
        inputs: dict[int, torch.Tensor] = {}
        streams: dict[int, torch.Tensor] = {}
        handles = [b.register_forward_pre_hook(
            lambda m, args, i=i: inputs.__setitem__(i, args[0].detach()))
            for i, b in enumerate(self.blocks)]
        handles += [layer.register_forward_pre_hook(
            lambda m, args, i=i: streams.__setitem__(i, args[0].detach()))
            for i, layer in enumerate(getattr(self.model, "layers", []))]
        try:
            self.model(tokens)
        finally:
            for h in handles:
                h.remove()
        out = {}
        for i, block in enumerate(self.blocks):
            out.update(self.cache.activations(self, i, block, inputs[i].float()))
            if weights is not None:
                weights.update(self.cache.weights(self, i, block, inputs[i].float()))
        if residual is not None:
            residual.update({i: float(h.double().square().sum(-1).mean())
                             for i, h in streams.items()})
        return out

    def apply(self, surgery: Surgery, P: dict[tuple[int, str], torch.Tensor]) -> None:
        """Every slot projected by its P [G, K, K], through `surgery`."""
        for i, block in enumerate(self.blocks):
            self.cache.project(self, surgery, i, block, P)

    def projected(self, P: dict[tuple[int, str], torch.Tensor]):
        """The model with every slot projected by its P [G, K, K]; undone on exit."""
        return projected(self, P)

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor, batch_size: int) -> dict:
        """Mean cross-entropy and accuracy over the labelled positions."""
        from ...data import IGNORE

        loss, correct, count = 0.0, 0, 0
        for start in range(0, len(tokens), batch_size):
            t, y = tokens[start:start + batch_size], labels[start:start + batch_size]
            logits = self.model(t).float()  # [B, T, vocab]
            loss += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                          ignore_index=IGNORE, reduction="sum"))
            mask = y != IGNORE
            correct += int(((logits.argmax(-1) == y) & mask).sum())
            count += int(mask.sum())
        if not count:
            raise ValueError("the evaluation data has no labelled positions")
        return {"loss": loss / count, "accuracy": correct / count, "tokens": count}
