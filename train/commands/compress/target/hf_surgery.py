"""Hugging Face causal LMs' KV caches: their keys and values, and how compress projects them.

    target = HFTarget(model, keys="auto")      # layers found by budgets/capture/projections.py
    with target.projected(P): target.evaluate(ids)

Keys before RoPE are projected through the rows of W_K that give them (W_K -> P W_K per KV
head, bias too; a fused q/k/v projection's rows wherever they sit), or by a hook on the
per-head k_norm of models that normalize them; keys after RoPE (keys=post-rope) inside
the attention, through transformers' AttentionInterface (budgets/hf/capture.py
transformed); values through W_V's rows.

HFTarget implements the Target protocol (protocol.py): every Hugging Face model's cache is
keys and values (family "kv"); a saved one is loaded by save_pretrained's rules and
decodes through a transformers Cache of codes (hf_cache.py).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from budgets.cache import Keys
from budgets.capture.attention import AttentionCall, probabilities, row_blocks
from budgets.capture.out_proj import projection_weight
from budgets.capture.projections import Rows
from budgets.hf.capture import capture, transformed
from budgets.hf.geometry import Geometry
from budgets.hf.probe import hf_layer_maps

from ..bases.lowrank import Slot, project_heads, project_rows
from ..bases.readout import Weight, readout_weights
from ..bases.windows import head_mask, window_effects
from ..options import resolve_keys
from .cache import kv_only
from .hf_layers import attention_numbers, kept_mixers, kept_text, kept_verb, spans
from .protocol import PerSequence
from .surgery import Surgery, projected, watching

DISCOVERY_SEED = 0  # the random tokens the layers are found with


def _discovery_ids(model: nn.Module) -> torch.Tensor:
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(DISCOVERY_SEED)
    return torch.randint(vocab, (1, 32), generator=g).to(next(model.parameters()).device)


class HFTarget:
    """A Hugging Face causal LM attending through transformers' attention interface: per
    layer the keys and values of its KV heads; evaluation by next-token loss and
    perplexity."""

    kind = "hf"
    family = "kv"
    caches_kv = True

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.g = Geometry.from_config(model.config)
        ids = _discovery_ids(model)
        with torch.no_grad():
            self.layers = hf_layer_maps(model, ids)
        self.rope = any(layer.rope for layer in self.layers)
        self.keys = resolve_keys(keys, self.rope, f"the {self.g.model_type} model")
        self._check()
        # every layer by the model's own number (its index in the layer list), never by
        # its place among the attention layers: a hybrid's attention is layer 3 of 4
        self.numbers = attention_numbers(model, self.layers)
        self.at = dict(zip(self.numbers, self.layers, strict=True))
        self.index = {layer.module: n for n, layer in self.at.items()}
        # the other mixers (a hybrid's delta rule, SSM, short convolution): kept in full
        self.kept = kept_mixers(model, ids, self.layers)
        # layers whose KV heads may be read through a window: those without one of their own
        self.window_layers = [n for n, layer in self.at.items() if layer.window is None]
        self.slots = [s for n, layer in self.at.items()
                      for s in (Slot(n, "k", layer.shape[1], layer.shape[2], window=layer.window,
                                     fixed_per_sequence=self._kept_elements(n)),
                                Slot(n, "v", layer.shape[1], layer.shape[3], window=layer.window))]

    def _kept_elements(self, n: int) -> int:
        """The kept states' elements per sequence, carried by the first layer's keys (the
        cache's size counts them once; a slot's share of it is no figure of its own)."""
        counted = self.kept_counted
        return sum(k.elements for k in self.kept) if counted and n == self.numbers[0] else 0

    @property
    def kept_counted(self) -> bool:
        """Whether every kept state's size is known, and so counted in B/token."""
        return all(k.elements is not None for k in self.kept)

    def _check(self) -> None:
        """A clear error for a layer whose cache cannot be projected through its weights."""
        if not self.layers:
            raise ValueError(f"the {self.g.model_type} model has no attention layer: compress "
                             f"projects KV caches (an SSM's state is not compressed here)")
        for layer in self.layers:
            need = ({"W_K": layer.k} if self.keys is Keys.PRE_ROPE else {}) | {"W_V": layer.v}
            missing = [name for name, rows in need.items() if rows is None]
            if missing:
                raise ValueError(f"the {self.g.model_type} model's attention {layer.name}: "
                                 f"no linear of its input gives {', '.join(missing)} (a "
                                 f"latent cache, as MLA keeps); compress cannot project it")
        shapes = {layer.shape for layer in self.layers}
        if len(shapes) != 1:
            raise ValueError(f"the {self.g.model_type} model: compress reads models whose "
                             f"attention layers all attend with one shape; found "
                             f"{len(self.layers)} attention layers of shapes {sorted(shapes)}")

    @property
    def normed_keys(self) -> bool:
        """Keys before RoPE come out of a per-head norm (k_norm), not a linear map."""
        return self.keys is Keys.PRE_ROPE and any(layer.k.through is not None
                                                  for layer in self.layers)

    @property
    def saveable(self) -> str | None:
        if self.normed_keys:
            return (f"the {self.g.model_type} model normalizes its keys (k_norm) before "
                    f"RoPE, so their projection is not a change of W_K")
        if self.rotated:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return self._hybrid_unserved() if self.kept else None

    def _hybrid_unserved(self) -> str | None:
        """Why a saved hybrid would not decode through the low-rank cache (its own cache of
        another kind, a RoPE it cannot turn back): refused before any work rather than
        written and then not decoded."""
        from .hf_cache import unserved_hybrid, unserved_rotary  # transformers 4.56

        K = self.layers[0].shape[2]
        return ((unserved_rotary(self.model, K) if self.rope else None)
                or unserved_hybrid(self.model, _discovery_ids(self.model)[:, :4], self.numbers))

    @property
    def rotated(self) -> bool:
        """The keys projected are RoPE's output: inside the attention, not through W_K."""
        return self.keys is Keys.POST_ROPE and self.rope

    def describe(self) -> str:
        H, G, K, V = self.layers[0].shape
        if not self.kept and self.numbers == list(range(self.g.n_layers)):
            return (f"{self.g.model_type}: {len(self.layers)} layers x {G} KV heads x (K {K} + "
                    f"V {V}); {self.keys.label_for(self.rope)}")
        return (f"{self.g.model_type}: {len(self.layers)} of {self.g.n_layers} layers attend "
                f"(layer{'s' if len(self.numbers) > 1 else ''} {spans(self.numbers)}, "
                f"{type(self.layers[0].module).__name__}) x {G} KV heads x (K {K} + V {V}), "
                f"{'their KV caches' if len(self.layers) > 1 else 'its KV cache'} "
                f"compressed; {self._kept_text()}; "
                f"{self.keys.label_for(self.rope)}")

    def _kept_text(self) -> str:
        """What the other mixers keep, and whether B/token counts it."""
        if not self.kept:
            return "no other mixer holds a state"
        total = sum(k.elements or 0 for k in self.kept)
        counted = (f"{total:,} elements per sequence, counted in B/token at T"
                   if self.kept_counted else "not counted in B/token")
        return f"{kept_text(self.kept)} {kept_verb(self.kept)} state in full ({counted})"

    # weights in squared output error per token (bases/readout.py)
    one_scale = True

    @torch.no_grad()
    def activations(self, ids: torch.Tensor, weights: dict | None = None,
                    residual: dict | None = None) -> dict[tuple[int, str], torch.Tensor]:
        """Keys (before RoPE, else as cached) and values of every token, per layer
        [B, G, T, K], read from each layer's attention call; the keys' and values' weights
        into `weights` when it is a dict (none for a layer whose W_O was not found); per
        layer the mean squared norm of the residual stream entering it, into `residual`."""
        acts = {}

        def on_call(call):
            i = self.index[call.module]
            # every token's keys and values, a window layer's too: the projection acts on
            # all of them in the prefill, not only on the W - 1 its cache keeps after it
            pre = self.keys is Keys.PRE_ROPE
            if pre and call.rotated and call.key_pre is None:
                raise ValueError(f"{self.g.model_type} layer {i}: its keys are rotated, and "
                                 f"their values before RoPE were not recovered; --keys "
                                 f"post-rope compresses them as cached")
            # a layer that does not rotate (llama4's NoPE layers) caches its keys as computed:
            # they are its keys before RoPE too
            acts[(i, "k")] = call.key_pre if pre and call.key_pre is not None else call.key
            acts[(i, "v")] = call.value
            if weights is not None:
                weights.update(self.weights(i, call))

        with capture(self.model, on_call):
            out = self.model(input_ids=ids, use_cache=False,
                             output_hidden_states=residual is not None)
        if residual is not None:
            # hidden_states[n] enters layer n: read at each attention layer's own number
            residual.update({n: float(out.hidden_states[n].double().square().sum(-1).mean())
                             for n in self.numbers})
        return acts

    def weights(self, i: int, call: AttentionCall) -> dict[tuple[int, str], Weight]:
        """Layer i's keys' and values' weights on one scale (readout_weights), from its
        attention, a block of query rows at a time; none without its W_O."""
        layer = self.at[i]
        w_o = None if layer.out is None else projection_weight(layer.out)
        H, _, _, V = layer.shape
        # signed mixing (differential attention): W_O reads head pairs' normed difference
        if w_o is None or w_o.shape[1] != H * V or getattr(call, "signed", False):
            return {}
        probs = (probabilities(call, rows) for rows in row_blocks(call))  # [B, H, r, T]
        keys, values = readout_weights(call.query, call.value, probs, w_o,
                                       call.scaling ** 2, self.rope)
        return {(i, "k"): keys, (i, "v"): values}

    def apply(self, surgery: Surgery, P: dict, windows: dict | None = None) -> None:
        """The projections, and the KV heads of `windows` ({(layer, g): (W, s)}) read
        through their window, applied to the model through `surgery`."""
        for i, layer in self.at.items():
            Pk, Pv = P[(i, "k")], P[(i, "v")]
            if self.normed_keys:
                _project_norm(surgery, layer.k.through, Pk)
            elif not self.rotated:
                project_rows_at(surgery, layer.k, Pk)
            project_rows_at(surgery, layer.v, Pv)
        if windows:
            bad = sorted({i for i, _ in windows} - set(self.window_layers))
            if bad:
                raise ValueError(f"layers {bad} of the {self.g.model_type} model have a window "
                                 f"of their own: compress offers them no other")
        if self.rotated or windows:
            fn = self._rotated_keys_projected(P) if self.rotated else _unchanged
            surgery.enter(transformed(self.model, fn, "compress --hf (projected keys or windows)",
                                      masks=self._window_masks(windows) if windows else None))

    def _rotated_keys_projected(self, P: dict):
        """fn(module, key, value) for `transformed`: each layer's rotated keys [B, G, T, K]
        projected by its P [G, K, K]; other modules' attention untouched."""
        def fn(module, key, value):
            i = self.index.get(module)
            return (key, value) if i is None else (project_heads(key, P[(i, "k")]), value)
        return fn

    def projected(self, P: dict, windows: dict | None = None):
        return projected(self, P, windows)

    def _window_masks(self, windows: dict):
        """masks(module, query, mask) for `transformed`: the layer's mask with the windowed
        KV heads' query heads reading their window and sinks alone, [B, H, T, Tk]."""
        per_layer: dict[int, dict] = {}
        for (i, g), w in windows.items():
            per_layer.setdefault(i, {})[g] = w

        def masks(module, query, mask):
            heads = per_layer.get(self.index.get(module))
            if not heads:
                return mask
            B, H, T, _ = query.shape
            Tk = T if mask is None else mask.shape[-1]
            allowed = _allowed(mask, T, Tk, query.device)  # [B or 1, 1, T, Tk]
            G = self.at[self.index[module]].shape[1]
            both = allowed & head_mask(T, H, G, heads, query.device, Tk)[None]
            if mask is None or mask.dtype == torch.bool:
                return both
            return torch.zeros(both.shape, dtype=mask.dtype, device=mask.device).masked_fill(
                ~both, torch.finfo(mask.dtype).min)
        return masks

    def watched(self, record):
        """Inside, a forward pass records the live keys and values (where they are
        projected) and, record.grid, each window layer's attention output and window
        effects (allocation/sensitivity.py); the model attends through the capture meanwhile."""
        return watching(self, record, self._watch)

    def _watch(self, surgery: Surgery, record) -> None:
        if self.keys is Keys.PRE_ROPE:
            for i, layer in self.at.items():
                _watch_keys(surgery, record, i, layer)

        def on_call(call: AttentionCall) -> None:
            i = self.index.get(call.module)
            if i is None:
                return
            if self.keys is not Keys.PRE_ROPE:
                record.slot((i, "k"), call.key, _same)
            record.slot((i, "v"), call.value, _same)
            if record.grid and i in self.window_layers:
                record.output(i, call.output, lambda t: t.transpose(1, 2))  # [B, H, T, V]
                H, G = call.query.shape[1], call.value.shape[1]
                with torch.no_grad():
                    P = torch.cat([probabilities(call, rows) for rows in row_blocks(call)], -2)
                    v = call.value.repeat_interleave(H // G, dim=1)  # [B, H, T, V]
                    record.effects[i] = (window_effects(P, v, record.grid), G)

        surgery.enter(capture(self.model, on_call))

    def query_heads(self, i: int) -> int:
        """H: the query heads of layer i (a KV head serves H / G of them)."""
        return self.at[i].shape[0]

    def loss_logits(self, ids: torch.Tensor, labels=None) -> torch.Tensor:
        """The logits [n, vocab] of every position that predicts a next token."""
        return self.model(input_ids=ids, use_cache=False).logits[:, :-1].flatten(0, 1)

    @torch.no_grad()
    def evaluate(self, ids: torch.Tensor, labels=None, batch_size: int = 1) -> dict:
        """Mean next-token cross-entropy over every position, and its perplexity; per
        sequence, its summed loss and positions (for a change's standard error)."""
        where = next(self.model.parameters()).device
        loss, count, sums = 0.0, 0, []
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size].to(where)
            logits = self.model(input_ids=chunk, use_cache=False).logits.float()
            losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), chunk[:, 1:],
                                     reduction="none")  # [b, T - 1]
            loss += float(F.cross_entropy(logits[:, :-1].flatten(0, 1), chunk[:, 1:].flatten(),
                                          reduction="sum"))
            count += chunk[:, 1:].numel()
            sums += losses.sum(-1).tolist()
        return {"loss": loss / count, "perplexity": math.exp(loss / count), "tokens": count,
                "per_sequence": PerSequence(sums, [ids.shape[1] - 1] * len(sums))}

    def adapter_sites(self, P: dict) -> dict[nn.Module, list]:
        """{linear: rows it must project} over every attention layer's W_Q, W_K, W_V, W_O
        (a fused projection once, with each of its projected heads' rows)."""
        weight_keys = not (self.normed_keys or self.rotated)  # compress projects W_K's rows
        sites: dict[nn.Module, list] = {}
        for i, layer in self.at.items():
            for rows, key in ((layer.q, None), (layer.k, (i, "k") if weight_keys else None),
                              (layer.v, (i, "v"))):
                if rows is not None:
                    sites.setdefault(rows.linear, []).extend(
                        [] if key is None else [(rows.index, P[key])])
            if layer.out is not None:
                sites.setdefault(layer.out, [])
        return sites

    # ------------------------------------------------------------ a saved Hugging Face model

    @staticmethod
    def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits  # [B, T, vocab]

    @staticmethod
    def load_model(path: Path) -> nn.Module:
        """A save_pretrained directory (saved/save.py save_hf)."""
        from ....hf import load_model

        return load_model(path)[0]

    @staticmethod
    def unserved(info: dict) -> str | None:
        return kv_only(info)

    @staticmethod
    def lowrank_cache(model: nn.Module, codes: dict, dtype: torch.dtype, info: dict,
                      batch: int, max_len: int | None):
        """A transformers Cache of codes, grown as tokens come (batch and max_len unused);
        its keys turned back by RoPE's angles where their bases live before RoPE."""
        from .hf_cache import lowrank_cache  # needs transformers 4.56: imported when used

        return lowrank_cache(model, codes, dtype, info.get("rope", False))

    @staticmethod
    def step(model: nn.Module, ids: torch.Tensor, cache) -> torch.Tensor:
        return model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache}).logits


def cache_kwarg(model: nn.Module) -> str:
    """The name a Hugging Face model's forward and generate take a cache by (`cache` since
    transformers 5, `past_key_values` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _unchanged(module, key, value):
    return key, value


def _allowed(mask: torch.Tensor | None, T: int, Tk: int, device) -> torch.Tensor:
    """The keys a layer's own mask lets each query read, boolean [B or 1, 1, T, Tk]: SDPA's
    boolean mask, eager's additive one (hidden where it is far below 0), or causal."""
    if mask is None:
        return torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)[None, None]
    if mask.dtype == torch.bool:
        return mask[..., :T, :Tk]
    return mask[..., :T, :Tk] > torch.finfo(mask.dtype).min / 2


def _watch_keys(surgery: Surgery, record, i: int, layer) -> None:
    """Layer i's live keys before RoPE: the output of the per-head norm that gives them,
    or the rows of the linear that does."""
    G, K = layer.shape[1], layer.shape[2]
    if layer.k.through is not None:
        def normed(t: torch.Tensor) -> torch.Tensor:
            tokens_first = t.shape[-2] == G and t.shape[1] != G
            return t.transpose(1, 2) if tokens_first else t  # [B, G, T, K]
        surgery.hook(layer.k.through, lambda m, a, out: record.slot((i, "k"), out, normed))
        return
    index = layer.k.index

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t[..., index.to(t.device)].view(t.shape[0], t.shape[1], G, K).transpose(1, 2)
    surgery.hook(layer.k.linear, lambda m, a, out: record.slot((i, "k"), out, rows))


def project_rows_at(surgery: Surgery, rows: Rows, P: torch.Tensor) -> None:
    """W -> P W and b -> P b per head on the rows of the linear that give the heads (a
    fused projection's rows, wherever they sit); undone by `surgery`."""
    bias = getattr(rows.linear, "bias", None)
    for t in (projection_weight(rows.linear), bias):
        if t is None:
            continue
        t = t.detach()  # a view of the parameter's storage (Conv1D's transpose too)
        saved = t[rows.index].clone()
        flat = saved if saved.dim() == 2 else saved[:, None]
        new = project_rows(flat, P)
        t[rows.index] = new if saved.dim() == 2 else new[:, 0]
        surgery.undo.append(lambda t=t, saved=saved, idx=rows.index: t.__setitem__(idx, saved))


def _project_norm(surgery: Surgery, norm: nn.Module, P: torch.Tensor) -> None:
    """A hook projecting a per-head norm's output, [B, T, G, K] or [B, G, T, K]."""
    G = P.shape[0]

    def hook(module, args, out):
        tokens_first = out.shape[-2] == G and out.shape[1] != G
        return project_heads(out, P, head_dim=-2 if tokens_first else -3)
    surgery.hook(norm, hook)
