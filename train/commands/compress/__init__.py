"""`rankzoo compress`: shrink a model's cache to low rank and measure what that costs.

    doc = compress_run("runs/quick/mha", CompressOptions(ratios=(1.5, 2, 4)))
    doc = compress_hf("models/tiny", "calib.txt", "eval.txt", CompressOptions(), seq_len=128)

The report (budgets/verdicts.py) advises a low-rank KV cache from ranks it measured per
sequence. This module checks that advice with a number: it fits a basis per layer and KV
head on calibration activations (budgets/lowrank.py), evaluates the model with every
cached matrix projected onto its top r directions, exactly what a cache of r-dimensional
codes would give back, on data the bases were not fitted on, and states the loss change
at each cache size:

  zoo run        RUN_DIR/<variant>: config.yaml and checkpoints/last.ckpt; calibration on
                 the first sequences of the run's training split, evaluation on its
                 validation split (loss, accuracy), both rebuilt from config.yaml and its
                 seed as training built them (train/data/__init__.py make_splits)
  Hugging Face   --hf DIR --text CALIB --eval-text EVAL: calibration on the start of CALIB,
                 evaluation on EVAL (loss, perplexity); the same file for both is read
                 after the calibration tokens

What is projected, per family (model surgery, each undone after its evaluation):
  softmax, sliding_window, moe, HF   keys before RoPE (W_K -> P W_K per KV head, bias too;
                 the model rotates the rebuilt keys) or, --keys post-rope, the rotated keys
                 (inside the attention), and values (W_V -> P W_V); keys of a model
                 without RoPE are projected as they are cached
  mla            the latent cache c: kv_up(c) -> kv_up(P c), i.e. W_up -> W_up P
  linear         the state S = sum phi(k) [v, 1]^T over its F feature rows: phi(k) -> P phi(k)
  ssm            the state h = sum x B^T over its N rows, per B/C group: B -> P B (the conv
                 state is kept in full)

Settings evaluated: the report's advised ranks (per KV head, rank_eps_max rounded up: the
ratio the report predicts), and per target ratio a uniform r and a greedy allocation by
energy, and per --eps the per-layer rank_eps. The verdict: *verified* when the loss change
at the advised ranks is within the tolerance, else *refuted*, naming the largest measured
ratio that is. Nothing is written except --plot DIR and --save DIR (each new or empty).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from rich import box
from rich.table import Table
from torch import nn

from budgets.hf import ROPE_LAYOUTS, kv_pairs, pre_rope_module
from budgets.hf_layouts import EXTRACTORS, KV_BIASES, Geometry, layout_of
from budgets.lowrank import (
    Slot,
    SlotStats,
    cache_bytes,
    dtype_bytes,
    eps_ranks,
    full_ranks,
    greedy_ranks,
    project_heads,
    project_rows,
    projectors,
    retained_energy,
    uniform_ranks,
)
from budgets.verdicts import KEY_LABEL, VerdictThresholds, kv_option
from zoo.block import split_heads

from ...rundir.files import write_json, write_yaml
from ...sizing.units import DTYPE_LONG, dtype_name

SCHEMA = "rankzoo.compress"
SCHEMA_VERSION = 1
KEYS = ("auto", "pre-rope", "post-rope")
ALLOCATIONS = ("uniform", "greedy")
FAMILIES = {"softmax": "kv", "sliding_window": "kv", "moe": "kv", "mla": "mla",
            "linear": "linear", "ssm": "ssm"}
# the report's inference row whose rank a state family's implied ranks come from
STATE_ROWS = {"mla": "inference.latent", "linear": "inference.state", "ssm": "inference.state"}
DEFAULT_RATIOS = (1.5, 2.0, 4.0, 8.0)
DEFAULT_TOLERANCE = 0.02  # nats per token: exp(0.02) = 2% perplexity
MIN_COMPRESSION = VerdictThresholds().min_compression  # the report's per-layer advice floor
ZOO_CALIBRATION = 64  # sequences of the training split
HF_ATTENTION = "rankzoo_compress"  # the attention implementation that projects rotated keys


def cache_dtype(text: str) -> str:
    """A cache dtype as budgets/verdicts.py names it (bf16 and bfloat16 -> bfloat16), parsed
    as `rankzoo pick` parses it."""
    return DTYPE_LONG[dtype_name(text)]


@dataclass(frozen=True)
class CompressOptions:
    """What to measure; errors name the parameter (the CLI shows them as its flags)."""

    ratios: tuple[float, ...] = DEFAULT_RATIOS
    eps: tuple[float, ...] = ()
    allocations: tuple[str, ...] = ALLOCATIONS
    keys: str = "auto"  # pre-rope (RoPE models' default), post-rope (the cached keys)
    cache_dtype: str = "bfloat16"
    length: int | None = None  # T the bases are amortized at; None: the report's probe T
    tolerance: float = DEFAULT_TOLERANCE  # on the eval loss change, nats per token
    advice_eps: float = 0.1  # HF: the eps of the report whose advice is checked
    calib_size: int | None = None  # calibration sequences (zoo: 64; HF: 4)
    eval_size: int | None = None  # evaluation sequences (zoo: the validation split; HF: 4)
    overlap: bool = False  # let calibration and evaluation share data
    batch_size: int | None = None  # sequences per forward pass (zoo: the run's; HF: 1)
    save: str | None = None  # write the compressed model here (a new or empty directory)

    def __post_init__(self) -> None:
        for r in self.ratios:
            if not r > 1.0:
                raise ValueError(f"ratios={','.join(f'{x:g}' for x in self.ratios)}: each "
                                 f"ratio must be > 1 (a cache that many times smaller than "
                                 f"the full one), got {r:g}")
        for e in self.eps:
            if not 0.0 < e < 1.0:
                raise ValueError(f"eps={','.join(f'{x:g}' for x in self.eps)}: each eps must "
                                 f"lie in (0, 1), got {e:g}")
        if not 0.0 < self.advice_eps < 1.0:
            raise ValueError(f"advice_eps={self.advice_eps:g}: expected 0 < eps < 1")
        if not self.ratios and not self.eps:
            raise ValueError("ratios= and eps= are both empty: nothing to measure")
        unknown = set(self.allocations) - set(ALLOCATIONS)
        if unknown or not self.allocations:
            raise ValueError(f"alloc={','.join(self.allocations)}: expected a list of "
                             f"{', '.join(ALLOCATIONS)}")
        if self.keys not in KEYS:
            raise ValueError(f"keys={self.keys}: one of {', '.join(KEYS)}")
        cache_dtype(self.cache_dtype)
        if not self.tolerance >= 0:
            raise ValueError(f"tolerance={self.tolerance:g}: expected >= 0")
        for name in ("length", "calib_size", "eval_size", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: expected a positive int")

    @property
    def nbytes(self) -> int:
        return dtype_bytes(cache_dtype(self.cache_dtype))


def resolve_keys(keys: str, rope: bool, what: str) -> str:
    """pre-rope or post-rope: which keys get a basis (auto: before RoPE where there is RoPE;
    a model without RoPE caches its keys as computed, called post-rope here)."""
    if keys == "auto":
        return "pre-rope" if rope else "post-rope"
    if keys == "pre-rope" and not rope:
        raise ValueError(f"keys=pre-rope: {what} has no RoPE, so there are no keys before "
                         f"RoPE: its cache holds the keys as computed (keys=auto)")
    return keys


def key_label(keys: str, rope: bool) -> str:
    return KEY_LABEL["k_pre_rope" if keys == "pre-rope" else "k"] if rope else "keys"


# ---------------------------------------------------------------- model surgery

class Surgery:
    """Changes to a model that are undone in reverse order: parameters overwritten in
    place, methods patched on an instance, forward hooks."""

    def __init__(self):
        self.undo: list[Callable[[], None]] = []

    def overwrite(self, param: torch.Tensor, value: torch.Tensor) -> None:
        """param's storage (a parameter or a view of one, e.g. GPT-2's fused k/v slice)
        takes value; detached, so autograd's view rules do not apply."""
        target = param.detach()
        saved = target.clone()
        target.copy_(value)
        self.undo.append(lambda: target.copy_(saved))

    def patch(self, obj: nn.Module, name: str, fn: Callable) -> None:
        setattr(obj, name, fn)  # an instance attribute shadows the class's method
        self.undo.append(lambda: delattr(obj, name))

    def hook(self, module: nn.Module, fn: Callable) -> None:
        self.undo.append(module.register_forward_hook(fn).remove)

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()


def _rows(surgery: Surgery, weight: torch.Tensor, bias: torch.Tensor | None,
          P: torch.Tensor) -> None:
    """W -> P W and b -> P b per head (rows of nn.Linear's [out, in] weight)."""
    surgery.overwrite(weight, project_rows(weight, P))
    if bias is not None:
        surgery.overwrite(bias, project_rows(bias[:, None], P)[:, 0])


@contextlib.contextmanager
def projected(target, P: dict):
    """target.model with target.apply(surgery, P) in force; every change undone on exit."""
    surgery = Surgery()
    try:
        target.apply(surgery, P)
        yield target.model
    finally:
        surgery.restore()


# ---------------------------------------------------------------- zoo targets

class ZooTarget:
    """A DecoderLM whose blocks are one zoo family: its cache slots, their calibration
    activations, their projection, its evaluation (loss and accuracy at labelled
    positions)."""

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.blocks = list(model.blocks)
        kinds = sorted({b.kind for b in self.blocks})
        if len(kinds) != 1 or kinds[0] not in FAMILIES:
            raise ValueError(f"compress supports models of one block family among "
                             f"{', '.join(FAMILIES)}; this one has {', '.join(kinds)}")
        self.block_kind = kinds[0]
        self.family = FAMILIES[self.block_kind]
        c = self.blocks[0].config
        self.rope = self.family == "kv" and bool(c.rope)
        if self.family == "kv":
            self.keys = resolve_keys(keys, self.rope, f"the {self.block_kind} block "
                                                      f"(rope: false)")
        elif keys != "auto":
            raise ValueError(f"keys={keys}: only attention with a KV cache has keys to choose "
                             f"(softmax, sliding_window, moe); {self.block_kind} caches a "
                             f"{'latent' if self.family == 'mla' else 'recurrent state'}")
        else:
            self.keys = "auto"
        self.slots = [slot for i, b in enumerate(self.blocks) for slot in self._slots(i, b)]

    def _slots(self, i: int, block) -> list[Slot]:
        c = block.config
        if self.family == "kv":
            G = 1 if self.block_kind == "moe" else c.kv_heads
            return [Slot(i, "k", G, c.k_dim), Slot(i, "v", G, c.k_dim)]
        if self.family == "mla":
            return [Slot(i, "latent", 1, c.latent, fixed_per_token=c.rope_dim)]
        if self.family == "linear":
            return [Slot(i, "state", c.n_heads, c.f_dim, columns=c.head_dim + int(c.normalize))]
        heads_per_group = c.n_heads // c.n_groups  # ssm: B is shared by a group's heads
        return [Slot(i, "state", c.n_groups, c.d_state, columns=heads_per_group * c.head_dim,
                     fixed_per_sequence=c.conv_dim * (c.d_conv - 1))]

    @property
    def saveable(self) -> str | None:
        """Why the compression is not a change of weights (None: it is)."""
        if self.family in ("linear", "ssm"):
            return (f"{self.block_kind}'s state is projected inside its forward pass, not "
                    f"through a weight")
        if self.family == "kv" and self.keys == "post-rope" and self.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None

    def describe(self) -> str:
        c = self.blocks[0].config
        if self.family == "kv":
            G = 1 if self.block_kind == "moe" else c.kv_heads
            return (f"{self.block_kind}: {len(self.blocks)} layers x {G} KV heads x (K "
                    f"{c.k_dim} + V {c.k_dim}); {key_label(self.keys, self.rope)}")
        if self.family == "mla":
            return (f"mla: {len(self.blocks)} layers x latent R {c.latent} (+ RoPE key "
                    f"{c.rope_dim}, kept)")
        if self.family == "linear":
            return (f"linear: {len(self.blocks)} layers x {c.n_heads} heads x state F "
                    f"{c.f_dim} x {c.head_dim + int(c.normalize)}")
        return (f"ssm: {len(self.blocks)} layers x {c.n_groups} groups x state N "
                f"{c.d_state} (x {c.n_heads // c.n_groups} heads x P {c.head_dim}), conv "
                f"state kept")

    @torch.no_grad()
    def activations(self, tokens: torch.Tensor) -> dict[tuple[int, str], torch.Tensor]:
        """Per slot, what the cache would hold for tokens [B, T]: [B, G, T, K]."""
        inputs: dict[int, torch.Tensor] = {}
        handles = [b.register_forward_pre_hook(
            lambda m, args, i=i: inputs.__setitem__(i, args[0].detach()))
            for i, b in enumerate(self.blocks)]
        try:
            self.model(tokens)
        finally:
            for h in handles:
                h.remove()
        out = {}
        for i, block in enumerate(self.blocks):
            x = inputs[i].float()
            out.update(self._block_activations(i, block, x))
        return out

    def _block_activations(self, i: int, block, x: torch.Tensor) -> dict:
        if self.family == "kv":
            if self.block_kind == "moe":
                k_post, v = block.shared_kv(x)  # [B, 1, T, K]
                k_pre = split_heads(block.k_proj, x, 1)
            else:
                _, k_post, v = block.project(x)  # rotated keys, [B, G, T, K]
                k_pre = split_heads(block.k_proj, x, block.config.kv_heads)
            return {(i, "k"): k_pre if self.keys == "pre-rope" else k_post, (i, "v"): v}
        if self.family == "mla":
            return {(i, "latent"): block.latents(x, 0)[0][:, None]}  # [B, 1, T, R]
        if self.family == "linear":
            return {(i, "state"): block.features(x)[1]}  # phi(k) [B, H, T, F]
        return {(i, "state"): block.project(x)[4].transpose(1, 2)}  # B [B, G, T, N]

    def apply(self, surgery: Surgery, P: dict[tuple[int, str], torch.Tensor]) -> None:
        """Every slot projected by its P [G, K, K], through `surgery`."""
        for i, block in enumerate(self.blocks):
            self._project_block(surgery, i, block, P)

    def projected(self, P: dict[tuple[int, str], torch.Tensor]):
        """The model with every slot projected by its P [G, K, K]; undone on exit."""
        return projected(self, P)

    def _project_block(self, surgery: Surgery, i: int, block, P: dict) -> None:
        if self.family == "kv":
            Pk, Pv = P[(i, "k")], P[(i, "v")]
            if self.keys == "pre-rope" or not self.rope:
                _rows(surgery, block.k_proj.weight, block.k_proj.bias, Pk)
            elif self.block_kind == "moe":
                shared = block.shared_kv
                surgery.patch(block, "shared_kv", lambda x, offset=0: (
                    lambda k, v: (project_heads(k, Pk), v))(*shared(x, offset)))
            else:
                project = block.project
                surgery.patch(block, "project", lambda x, offset=0: (
                    lambda q, k, v: (q, project_heads(k, Pk), v))(*project(x, offset)))
            _rows(surgery, block.v_proj.weight, block.v_proj.bias, Pv)
        elif self.family == "mla":
            w = block.kv_up.weight  # [H*(dn+dv), R]: kv_up(P c) = (W P) c
            surgery.overwrite(w, (w.double() @ P[(i, "latent")][0].to(w.device)).to(w.dtype))
        elif self.family == "linear":
            features, Ps = block.features, P[(i, "state")]
            surgery.patch(block, "features", lambda x: (
                lambda q, k, v: (q, project_heads(k, Ps), v))(*features(x)))
        else:
            project, Ps = block.project, P[(i, "state")]

            def ssm_project(x, cache=None, _project=project, _P=Ps):
                z, xs, dt, A, B, C, conv_state = _project(x, cache)
                return z, xs, dt, A, project_heads(B, _P, head_dim=-2), C, conv_state
            surgery.patch(block, "project", ssm_project)

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


# ---------------------------------------------------------------- Hugging Face targets

class HFTarget:
    """A Hugging Face causal LM (budgets/hf_layouts.py's layouts): per layer the keys and
    values of its KV heads; evaluation by next-token loss and perplexity."""

    family = "kv"

    def __init__(self, model: nn.Module, keys: str = "auto"):
        self.model = model.eval()
        self.g = Geometry.from_config(model.config)
        self.layout = layout_of(self.g.model_type, type(model).__name__)
        self.rope = self.layout in ROPE_LAYOUTS
        self.keys = resolve_keys(keys, self.rope, f"the {self.g.model_type} model")
        self.attention = EXTRACTORS[self.layout](model)
        for i, (_, w) in enumerate(self.attention):
            self.g.check(i, w)
        # (W_K, b_K, W_V, b_V) per layer, detached views of the parameters' storage taken
        # before anything is written (GPT-2's are slices of its fused c_attn: autograd
        # forbids in-place writes through views that chunk() returned)
        self.kv = [(w.wk.detach(), _detached(bk), w.wv.detach(), _detached(bv))
                   for (m, w) in self.attention
                   for bk, bv in [KV_BIASES[self.layout](m)]]
        self.index = {m: i for i, (m, _) in enumerate(self.attention)}
        self.key_modules = [pre_rope_module(m) if self.rope else None
                            for m, _ in self.attention]
        G, K = self.g.n_kv_heads, self.g.head_dim
        self.slots = [s for i in range(self.g.n_layers)
                      for s in (Slot(i, "k", G, K), Slot(i, "v", G, K))]

    @property
    def normed_keys(self) -> bool:
        """Keys before RoPE come out of a per-head norm (k_norm), not a linear map."""
        return self.keys == "pre-rope" and any(
            m is not None and m is not getattr(a, "k_proj", None)
            for m, (a, _) in zip(self.key_modules, self.attention, strict=True))

    @property
    def saveable(self) -> str | None:
        if self.normed_keys:
            return (f"the {self.g.model_type} model normalizes its keys (k_norm) before "
                    f"RoPE, so their projection is not a change of W_K")
        if self.keys == "post-rope" and self.rope:
            return "keys after RoPE are projected inside the attention, not through a weight"
        return None

    def describe(self) -> str:
        g = self.g
        return (f"{g.model_type}: {g.n_layers} layers x {g.n_kv_heads} KV heads x (K "
                f"{g.head_dim} + V {g.head_dim}); {key_label(self.keys, self.rope)}")

    def _heads(self, out: torch.Tensor) -> torch.Tensor:
        """[B, T, G*K] (k_proj) or [B, T, G, K] (a per-head k_norm) -> [B, G, T, K]."""
        B, T = out.shape[:2]
        return out.reshape(B, T, self.g.n_kv_heads, self.g.head_dim).transpose(1, 2)

    @torch.no_grad()
    def activations(self, ids: torch.Tensor) -> dict[tuple[int, str], torch.Tensor]:
        """Keys (before RoPE from the key projection or k_norm, else as cached) and values
        as the cache holds them, per layer [B, G, T, K]."""
        pre: dict[int, torch.Tensor] = {}
        handles = []
        if self.keys == "pre-rope":
            for i, m in enumerate(self.key_modules):
                handles.append(m.register_forward_hook(
                    lambda mod, args, out, i=i: pre.__setitem__(i, self._heads(out.detach()))))
        try:
            out = self.model(input_ids=ids, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        pairs = kv_pairs(out)
        acts = {}
        for i, (k, v) in enumerate(pairs):
            acts[(i, "k")] = pre[i] if self.keys == "pre-rope" else k
            acts[(i, "v")] = v
        return acts

    def apply(self, surgery: Surgery, P: dict) -> None:
        """The projections, applied to the model through `surgery`."""
        rotated = self.keys == "post-rope" and self.rope
        for i, (wk, bk, wv, bv) in enumerate(self.kv):
            Pk, Pv = P[(i, "k")], P[(i, "v")]
            if self.normed_keys:
                surgery.hook(self.key_modules[i], lambda mod, args, out, _P=Pk: project_heads(
                    out.reshape(*out.shape[:2], self.g.n_kv_heads, self.g.head_dim), _P,
                    head_dim=-2).reshape(out.shape))
            elif not rotated:
                _rows(surgery, wk, bk, Pk)
            _rows(surgery, wv, bv, Pv)
        if rotated:
            _attention_with_projected_keys(self.model, surgery, self.index,
                                           {i: P[(i, "k")] for i in range(self.g.n_layers)})

    def projected(self, P: dict):
        return projected(self, P)

    @torch.no_grad()
    def evaluate(self, ids: torch.Tensor, labels=None, batch_size: int = 1) -> dict:
        """Mean next-token cross-entropy over every position, and its perplexity."""
        where = next(self.model.parameters()).device
        loss, count = 0.0, 0
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size].to(where)
            logits = self.model(input_ids=chunk, use_cache=False).logits.float()
            loss += float(F.cross_entropy(logits[:, :-1].flatten(0, 1), chunk[:, 1:].flatten(),
                                          reduction="sum"))
            count += chunk[:, 1:].numel()
        return {"loss": loss / count, "perplexity": math.exp(loss / count), "tokens": count}


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _attention_with_projected_keys(model, surgery: Surgery, index: dict, Pk: dict) -> None:
    """The model attending through a function that projects each layer's rotated keys
    [B, G, T, K] by its P before the model's own attention (transformers'
    AttentionInterface, >= 5); the implementation is restored by `surgery`."""
    try:
        from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        raise ValueError(f"keys=post-rope on a RoPE model needs transformers' "
                         f"AttentionInterface (transformers >= 5), not available here ({e})"
                         ) from None
    before = model.config._attn_implementation

    def inner(module):
        if before in ALL_ATTENTION_FUNCTIONS:
            return ALL_ATTENTION_FUNCTIONS[before]
        return sys.modules[type(module).__module__].eager_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        i = index.get(module)
        if i is not None:
            key = project_heads(key, Pk[i])
        return inner(module)(module, query, key, value, attention_mask, **kwargs)

    AttentionMaskInterface.register(HF_ATTENTION, sdpa_mask if before == "sdpa" else eager_mask)
    ALL_ATTENTION_FUNCTIONS[HF_ATTENTION] = attention
    model.set_attn_implementation(HF_ATTENTION)

    def restore():
        model.set_attn_implementation(before)
        del ALL_ATTENTION_FUNCTIONS[HF_ATTENTION]
    surgery.undo.append(restore)


# ---------------------------------------------------------------- data

def disjoint_rows(calib: torch.Tensor, evals: torch.Tensor) -> torch.Tensor:
    """The indices of the evaluation sequences that are not calibration sequences."""
    seen = {tuple(row) for row in calib.tolist()}
    return torch.tensor([i for i, row in enumerate(evals.tolist()) if tuple(row) not in seen],
                        dtype=torch.long)


def zoo_data(config: dict, options: CompressOptions, notes: list[str]):
    """(calibration tokens [Nc, T], evaluation tokens and labels [Ne, T]) of a run: the
    first calib_size sequences of its training split and its validation split, rebuilt
    from config.yaml's data section and seed as training built them."""
    from ...config.sections import DataConfig, parse_section
    from ...data import make_splits

    data = parse_section(config["data"], DataConfig, "data")
    (train_x, _), (val_x, val_y) = make_splits(data.spec(), data.train_size, data.val_size,
                                               int(config["seed"]))
    n = options.calib_size or min(ZOO_CALIBRATION, len(train_x))
    source = val_x if options.overlap else train_x
    if n > len(source):
        raise ValueError(f"calib_size={n}: the {'validation' if options.overlap else 'training'}"
                         f" split holds {len(source)} sequences")
    calib = source[:n]
    m = options.eval_size or len(val_x)
    if m > len(val_x):
        raise ValueError(f"eval_size={m}: the validation split holds {len(val_x)} sequences")
    eval_x, eval_y = val_x[:m], val_y[:m]
    if options.overlap:
        notes.append(f"calibration on the validation split (overlap asked): the bases are "
                     f"fitted on {n} of the sequences evaluated")
    else:
        keep = disjoint_rows(calib, eval_x)
        if len(keep) < m:
            notes.append(f"{m - len(keep)} validation sequences equal calibration sequences "
                         f"and are left out of the evaluation")
        if not len(keep):
            raise ValueError("every evaluation sequence is a calibration sequence")
        eval_x, eval_y = eval_x[keep], eval_y[keep]
    return calib, eval_x, eval_y


def cut(ids: torch.Tensor, seq_len: int, size: int, flag: str, where: str,
        start: int = 0) -> torch.Tensor:
    """size sequences of seq_len tokens from ids[start:], [size, seq_len]."""
    need = size * seq_len
    if ids.numel() - start < need:
        after = f" after the first {start} (the calibration's)" if start else ""
        raise ValueError(f"{where}: too short: {max(ids.numel() - start, 0)} tokens{after}, but "
                         f"{flag}={size} x seq_len={seq_len} needs {need}")
    return ids[start:start + need].view(size, seq_len)


def hf_data(calib_data: bytes, eval_data: bytes, tokenizer, vocab: int, seq_len: int,
            calib_size: int, eval_size: int, overlap: bool, text: str, eval_text: str,
            notes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration ids [Nc, T], evaluation ids [Ne, T]): the start of the calibration
    text; the start of the evaluation text, or, when it is the same text, what follows the
    calibration tokens (overlap: its start). Evaluation sequences equal to a calibration
    sequence are left out unless overlap."""
    from ...hf import token_ids

    calib_ids = token_ids(calib_data, tokenizer, vocab, f"text={text}", notes)
    calib = cut(calib_ids, seq_len, calib_size, "calib_size", f"text={text}")
    same = eval_data == calib_data
    eval_ids = calib_ids if same else token_ids(eval_data, tokenizer, vocab,
                                                f"eval_text={eval_text}")
    start = calib.numel() if same and not overlap else 0
    if same:
        notes.append(f"eval_text={eval_text} holds the calibration text: " + (
            "evaluation on its first tokens, as asked (overlap)" if overlap else
            f"evaluation starts after its first {start} tokens (the calibration's)"))
    evals = cut(eval_ids, seq_len, eval_size, "eval_size", f"eval_text={eval_text}", start)
    if not overlap:
        keep = disjoint_rows(calib, evals)
        if len(keep) < len(evals):
            notes.append(f"{len(evals) - len(keep)} evaluation sequences equal calibration "
                         f"sequences and are left out")
        if not len(keep):
            raise ValueError(f"eval_text={eval_text}: every evaluation sequence is a "
                             f"calibration sequence (pass overlap to measure on them)")
        evals = evals[keep]
    return calib, evals


# ---------------------------------------------------------------- calibration

@dataclass
class Calibration:
    """Per slot its statistics, bases and energies; the calibration's size and time."""

    stats: dict
    bases: dict = field(default_factory=dict)
    energy: dict = field(default_factory=dict)
    sequences: int = 0
    tokens: int = 0
    seconds: float = 0.0


def calibrate(target, tokens: torch.Tensor, batch_size: int) -> Calibration:
    start = time.perf_counter()
    stats = {s.key: SlotStats(s) for s in target.slots}
    where = next(target.model.parameters()).device
    for i in range(0, len(tokens), batch_size):
        for key, a in target.activations(tokens[i:i + batch_size].to(where)).items():
            stats[key].add(a)
    cal = Calibration(stats, sequences=len(tokens), tokens=tokens.numel())
    for key, st in stats.items():
        cal.bases[key], cal.energy[key] = st.basis()
    cal.seconds = time.perf_counter() - start
    return cal


# ---------------------------------------------------------------- the report's advice

def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # rank_eps is an integer; guard float noise (as verdicts)


def zoo_prediction(vdir: Path, target: ZooTarget, nbytes: int, notes: list[str]) -> dict | None:
    """The ranks the run's report advises per slot and head (the KV advice's rank_eps_max
    per KV head, rounded up; for MLA, linear attention and SSMs, which get no KV advice,
    the ranks their inference row measured), with the report's T; None when the report
    lacks the figures (said in notes)."""
    from ...rundir.read import load_run

    try:
        report = load_run(vdir)
    except (ValueError, FileNotFoundError) as e:
        notes.append(f"no report to check: {e}")
        return None
    variant = report["variants"][0]
    T = int(variant["seq_len"])
    withheld = next((a["text"] for a in report.get("advice", [])
                     if a["kind"] == "no_advice" and a.get("variant") == variant["variant"]),
                    None)
    ranks = {}
    if target.family == "kv":
        key = "k_pre_rope" if target.keys == "pre-rope" else "k"
        for layer in variant["layers"]:
            kv = layer.get("kv_heads")
            opt = kv_option(kv, key, nbytes, T) if kv and key in kv else None
            if opt is None:
                why = ("moe blocks offer no per-KV-head figures" if target.block_kind == "moe"
                       else "a probe from an older rankzoo? re-probe")
                notes.append(f"the report has no per-KV-head maxima of "
                             f"{KEY_LABEL.get(key, key)} for layer {layer['layer']} ({why}): "
                             f"no advice to check")
                return None
            ranks[(layer["layer"], "k")] = opt["rank_k"]
            ranks[(layer["layer"], "v")] = opt["rank_v"]
        advised = any(a["kind"] == "kv_cache_summary" for a in report.get("advice", []))
        source = (f"the report's KV advice ({key_label(target.keys, target.rope)} + values: "
                  f"rank_eps_max per KV head at eps {variant['eps']:g}, "
                  f"{variant.get('batch_size') or '?'} probe sequences of T = {T})")
    else:
        quantity = STATE_ROWS[target.family]
        slots = {s.layer: s for s in target.slots}
        for layer in variant["layers"]:
            row = next((r for r in layer["axes"] if r["quantity"] == quantity), None)
            m = None if row is None else row.get("realized_max_sample")
            if m is None or row.get("lower_bound"):
                notes.append(f"the report has no decided {quantity} rank for layer "
                             f"{layer['layer']}: no ranks to check")
                return None
            s = slots[layer["layer"]]
            ranks[s.key] = [min(max(1, _ceil(m)), s.width)] * s.heads
        advised = False
        source = (f"the report's {quantity} rank (rank_eps max over samples and heads at eps "
                  f"{variant['eps']:g}, T = {T}); the report gives no low-rank advice for "
                  f"{target.block_kind}: the ranks its figures imply")
    if set(ranks) != {s.key for s in target.slots}:
        notes.append("the report's layers do not match the model's: no advice to check")
        return None
    return {"ranks": ranks, "seq_len": T, "advised": advised, "withheld": withheld,
            "source": source}


def hf_prediction(target: HFTarget, cal: Calibration, eps: float, nbytes: int, T: int,
                  command: str) -> dict:
    """The ranks `rankzoo report --hf` advises on the calibration batch (the same figures:
    rank_eps_max per KV head over its sequences at eps, rounded up, by kv_option)."""
    key = "k_pre_rope" if target.keys == "pre-rope" else "k"
    ranks = {}
    for i in range(target.g.n_layers):
        kv = {"n_kv_heads": target.g.n_kv_heads, "head_dim": target.g.head_dim,
              "v_head_dim": target.g.head_dim, "rope": target.rope,
              key: {"rank_eps_max": cal.stats[(i, "k")].rank_eps_max(eps)},
              "v": {"rank_eps_max": cal.stats[(i, "v")].rank_eps_max(eps)}}
        opt = kv_option(kv, key, nbytes, T)
        ranks[(i, "k")], ranks[(i, "v")] = opt["rank_k"], opt["rank_v"]
    return {"ranks": ranks, "seq_len": T, "advised": True, "withheld": None,
            "source": f"the KV advice of `{command}` ({key_label(target.keys, target.rope)} "
                      f"+ values: rank_eps_max per KV head at eps {eps:g} over the "
                      f"{cal.sequences} calibration sequences)"}


# ---------------------------------------------------------------- settings and rows

def settings(target, cal: Calibration, options: CompressOptions, T: int,
             prediction: dict | None, notes: list[str]) -> list[tuple[str, float | None, dict]]:
    """(allocation, target ratio or eps, ranks) to evaluate: the report's advice first."""
    out = []
    if prediction is not None:
        out.append(("advised", None, prediction["ranks"]))
    nbytes, slots = options.nbytes, target.slots
    for ratio in options.ratios:
        for alloc in options.allocations:
            ranks = (uniform_ranks(slots, ratio, nbytes, T) if alloc == "uniform"
                     else greedy_ranks(slots, cal.energy, ratio, nbytes, T))
            if ranks is None:
                floor = cache_bytes(slots, {s.key: [1] * s.heads for s in slots}, nbytes, T)
                notes.append(f"{alloc} {ratio:g}x: out of reach: at r = 1 everywhere the cache "
                             f"is {floor['ratio']:.2f}x smaller")
                continue
            out.append((alloc, ratio, ranks))
    for eps in options.eps:
        out.append(("eps", eps, eps_ranks(cal.stats, eps)))
    return out


def ranks_by_kind(slots: list[Slot], ranks: dict) -> dict[str, list[list[int]]]:
    """{kind: [per layer: [r per head]]}, layers in order."""
    out: dict[str, list[list[int]]] = {}
    for s in slots:
        out.setdefault(s.kind, []).append(list(ranks[s.key]))
    return out


def ranks_summary(by_kind: dict[str, list[list[int]]]) -> str:
    """`k 3-8 (5.2) · v 4-8 (6.0)`: per kind, min-max over layers and heads (mean)."""
    parts = []
    for kind, layers in by_kind.items():
        flat = [r for layer in layers for r in layer]
        lo, hi, mean = min(flat), max(flat), sum(flat) / len(flat)
        span = str(lo) if lo == hi else f"{lo}-{hi}"
        parts.append(f"{kind} {span}" + ("" if lo == hi else f" ({mean:.1f})"))
    return " · ".join(parts)


def make_row(target, cal: Calibration, alloc: str, goal, ranks: dict, nbytes: int, T: int,
             metrics: dict, baseline: dict) -> dict:
    size = cache_bytes(target.slots, ranks, nbytes, T)
    kept = [x for s in target.slots for x in retained_energy(cal.energy[s.key], ranks[s.key])]
    by_kind = ranks_by_kind(target.slots, ranks)
    row = {"allocation": alloc, "target": goal, "ratio": size["ratio"],
           "bytes_per_token": size["bytes_per_token"],
           "code_bytes_per_token": size["code_bytes_per_token"],
           "basis_bytes": size["basis_bytes"], "ranks": by_kind,
           "ranks_per_layer": {k: [sum(ly) / len(ly) for ly in v] for k, v in by_kind.items()},
           "ranks_summary": ranks_summary(by_kind),
           "retained_energy": sum(kept) / len(kept),
           "loss": metrics["loss"], "delta_loss": metrics["loss"] - baseline["loss"]}
    for name in ("accuracy", "perplexity"):
        if name in metrics:
            row[name] = metrics[name]
    if "accuracy" in metrics:
        row["delta_accuracy"] = metrics["accuracy"] - baseline["accuracy"]
    return row


def verdict(rows: list[dict], prediction: dict | None, tolerance: float) -> dict:
    """verified / refuted (or null: nothing advised to check) with the text that says so,
    and the largest measured ratio whose loss change stays within the tolerance."""
    measured = [r for r in rows if r["allocation"] != "full"]
    within = [r for r in measured if r["delta_loss"] <= tolerance]
    best = max(within, key=lambda r: r["ratio"], default=None)
    largest = ("no measured setting stays within it" if best is None else
               f"the largest measured ratio within it is {best['ratio']:.2f}x "
               f"({_setting(best)}: loss {best['delta_loss']:+.4f})")
    advised = next((r for r in measured if r["allocation"] == "advised"), None)
    out = {"tolerance": tolerance, "largest_ratio_within": None if best is None else
           best["ratio"], "largest_within": None if best is None else _setting(best)}
    if advised is None or prediction is None:
        return {**out, "verdict": None, "advised_ratio": None,
                "text": f"no advice to check; at a tolerance of {tolerance:g} nats per "
                        f"token, {largest}"}
    ok = advised["delta_loss"] <= tolerance
    kind = "advice" if prediction["advised"] else "implied ratio"
    text = (f"{'verified' if ok else 'refuted'}: at the report's {kind} of "
            f"{advised['ratio']:.2f}x ({advised['bytes_per_token']:.1f} B/token) the eval loss "
            f"changes by {advised['delta_loss']:+.4f} nats per token, "
            f"{'within' if ok else 'beyond'} the tolerance of {tolerance:g}")
    text += f"; {largest}"
    if advised["ratio"] < MIN_COMPRESSION:
        text += (f"; at {advised['ratio']:.2f}x the advised ranks save little or nothing (the "
                 f"report advises a low-rank cache per layer only from {MIN_COMPRESSION:g}x)")
    if prediction.get("withheld"):
        why = prediction["withheld"].partition("no architecture advice: ")[2]
        text += f" (the report itself withheld its advice: {why or prediction['withheld']})"
    return {**out, "verdict": "verified" if ok else "refuted",
            "advised_ratio": advised["ratio"], "advised_delta_loss": advised["delta_loss"],
            "text": text}


def _setting(row: dict) -> str:
    if row["allocation"] == "advised":
        return "the advised ranks"
    if row["allocation"] == "eps":
        return f"rank_eps at eps {row['target']:g}"
    return f"{row['allocation']} for {row['target']:g}x"


def measure(target, cal: Calibration, evaluate: Callable[[], dict], options: CompressOptions,
            T: int, prediction: dict | None, notes: list[str],
            progress: Callable[[str], None] | None = None) -> tuple[list[dict], dict, dict]:
    """(rows: the full cache first, then each setting; the ranks of each row by index;
    the full model's evaluation)."""
    nbytes = options.nbytes
    began = time.perf_counter()
    baseline = evaluate()
    full = cache_bytes(target.slots, full_ranks(target.slots), nbytes, T)
    rows = [{"allocation": "full", "target": None, "ratio": 1.0,
             "bytes_per_token": full["full_bytes_per_token"],
             "code_bytes_per_token": full["full_bytes_per_token"], "basis_bytes": 0,
             "ranks": ranks_by_kind(target.slots, full_ranks(target.slots)),
             "ranks_summary": "full", "retained_energy": 1.0, "delta_loss": 0.0,
             **{k: v for k, v in baseline.items() if k != "tokens"},
             **({"delta_accuracy": 0.0} if "accuracy" in baseline else {})}]
    chosen = {0: None}
    todo = settings(target, cal, options, T, prediction, notes)
    seen: dict[tuple, dict] = {}
    for n, (alloc, goal, ranks) in enumerate(todo, 1):
        signature = tuple((k, tuple(v)) for k, v in sorted(ranks.items()))
        if signature not in seen:
            P = {key: projectors(cal.bases[key], ranks[key]) for key in ranks}
            with target.projected(P):
                seen[signature] = evaluate()
        rows.append(make_row(target, cal, alloc, goal, ranks, nbytes, T, seen[signature],
                             baseline))
        chosen[len(rows) - 1] = ranks
        if progress is not None:
            progress(f"{n}/{len(todo)} settings measured · {time.perf_counter() - began:.1f} s")
    return rows, chosen, baseline


# ---------------------------------------------------------------- the two entry points

def check_save_dir(save: str | None, saveable: str | None = None) -> None:
    """Refuse a --save DIR that is a file or a non-empty directory, or a compression that
    is no change of weights, before any work."""
    if save is None:
        return
    path = Path(save)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"save={save}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        raise FileExistsError(f"save={save}: directory is not empty; name a new or empty "
                              f"directory (nothing was written)")
    if saveable is not None:
        raise ValueError(f"save={save}: {saveable}; there is no compressed model to save "
                         f"(the bases are in --format json)")


def load_variant(vdir: Path) -> tuple[nn.Module, dict, int | None]:
    """(DecoderLM with the run's last weights, its config.yaml, the checkpoint's step) of a
    variant directory (read without Lightning)."""
    from ...lm.decoder import build_model
    from ...rundir.read import is_variant_dir, run_config, variant_dirs

    if not vdir.exists():
        raise FileNotFoundError(f"run directory not found: {vdir}")
    if not vdir.is_dir():
        raise ValueError(f"not a run directory: {vdir} is a file")
    if not is_variant_dir(vdir):
        names = [p.name for p in variant_dirs(vdir)]
        raise ValueError(f"{vdir}: name one variant directory, RUN_DIR/<variant>"
                         + (f" (here: {', '.join(names)})" if names else ""))
    config = run_config(vdir)
    if not config.get("block") or not config.get("data"):
        raise ValueError(f"{vdir}/config.yaml: no block or data section to rebuild the model")
    if config.get("finetune"):
        raise ValueError(f"{vdir}: a LoRA fine-tune; compress its base variant "
                         f"({config['finetune'].get('base_variant')})")
    ckpt = vdir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise FileNotFoundError(f"{vdir}: no checkpoints/last.ckpt to load the weights from")
    try:
        checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
        state, step = checkpoint["state_dict"], checkpoint.get("global_step")
    except Exception as e:  # torch raises several types for a bad file
        raise ValueError(f"{ckpt}: not a readable checkpoint ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]})") from None
    model = build_model(config)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return model.eval(), config, None if step is None else int(step)


def _document(source: dict, target, cal: Calibration, options: CompressOptions, T: int,
              prediction: dict | None, rows: list[dict], evaluation: dict,
              notes: list[str], seconds: float) -> dict:
    nbytes = options.nbytes
    pred = None
    if prediction is not None:
        size = cache_bytes(target.slots, prediction["ranks"], nbytes, prediction["seq_len"])
        pred = {"ratio": size["ratio"], "bytes_per_token": size["bytes_per_token"],
                "seq_len": prediction["seq_len"], "advised": prediction["advised"],
                "withheld": prediction["withheld"], "source": prediction["source"]}
    return {
        "schema": SCHEMA, "version": SCHEMA_VERSION, "source": source,
        "model": target.describe(), "family": target.family,
        "keys": target.keys if target.family == "kv" else None,
        "rope": bool(getattr(target, "rope", False)),
        "cache_dtype": cache_dtype(options.cache_dtype), "bytes_per_element": nbytes,
        "length": T, "tolerance": options.tolerance,
        "calibration": {"sequences": cal.sequences, "tokens": cal.tokens,
                        "seconds": cal.seconds},
        "evaluation": evaluation, "prediction": pred,
        "rows": rows, "verdict": verdict(rows, prediction, options.tolerance),
        "notes": list(notes), "seconds": seconds,
    }


def compress_run(run_dir, options: CompressOptions | None = None,
                 notes: list[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> dict:
    """The compress document of a trained zoo variant (RUN_DIR/<variant>)."""
    began = time.perf_counter()
    options = options or CompressOptions()
    notes = notes if notes is not None else []
    vdir = Path(run_dir)
    check_save_dir(options.save)
    model, config, step = load_variant(vdir)
    target = ZooTarget(model, options.keys)
    check_save_dir(options.save, target.saveable)
    calib, eval_x, eval_y = zoo_data(config, options, notes)
    batch = options.batch_size or int(config["data"].get("batch_size", 32))
    prediction = zoo_prediction(vdir, target, options.nbytes, notes)
    T = options.length or (prediction["seq_len"] if prediction else int(calib.shape[1]))
    if prediction is not None and prediction["seq_len"] != T:
        notes.append(f"bases amortized at length={T}, the report's at T = "
                     f"{prediction['seq_len']}: the advised ratio reads differently here")
    cal = calibrate(target, calib, batch)
    rows, chosen, baseline = measure(target, cal,
                                     lambda: target.evaluate(eval_x, eval_y, batch),
                                     options, T, prediction, notes, progress)
    evaluation = {"sequences": len(eval_x), "tokens": int(eval_x.numel()),
                  "labelled": baseline["tokens"], "split": "validation",
                  "calibration_split": "validation" if options.overlap else "training"}
    source = {"run": str(vdir), "variant": config.get("variant", vdir.name),
              "block": target.block_kind, "step": step}
    doc = _document(source, target, cal, options, T, prediction, rows, evaluation, notes,
                    time.perf_counter() - began)
    if options.save:
        _save(doc, target, cal, chosen, options, notes, lambda d: _save_zoo(d, model, config))
    doc["notes"] = list(notes)
    return doc


def compress_hf(model_dir, text, eval_text, options: CompressOptions | None = None, *,
                seq_len: int = 128, device: str = "cpu", dtype: str = "float32",
                notes: list[str] | None = None,
                progress: Callable[[str], None] | None = None) -> dict:
    """The compress document of a Hugging Face causal LM saved in model_dir."""
    from ...hf import device_of, dtype_of, load_model, read_text

    began = time.perf_counter()
    options = options or CompressOptions()
    notes = notes if notes is not None else []
    if eval_text is None:
        raise ValueError("eval_text=None: the loss is measured on text the bases were not "
                         "fitted on: name one (the calibration file itself is read after "
                         "its calibration tokens)")
    calib_data, eval_data = read_text(text), _read_eval(eval_text)
    where = device_of(device)
    dtype_of(dtype)
    check_save_dir(options.save)
    model_dir = Path(model_dir)
    model, tokenizer = load_model(model_dir, dtype)
    model = model.to(where)
    target = HFTarget(model, options.keys)
    check_save_dir(options.save, target.saveable)
    target.g.check_seq_len(seq_len)
    calib_size, eval_size = options.calib_size or 4, options.eval_size or 4
    calib, evals = hf_data(calib_data, eval_data, tokenizer, int(model.config.vocab_size),
                           seq_len, calib_size, eval_size, options.overlap, str(text),
                           str(eval_text), notes)
    batch = options.batch_size or 1
    T = options.length or seq_len
    cal = calibrate(target, calib, batch)
    command = (f"rankzoo report --hf {model_dir} --text {text} --seq-len {seq_len} "
               f"--probe-size {calib_size} --eps {options.advice_eps:g}")
    prediction = hf_prediction(target, cal, options.advice_eps, options.nbytes, seq_len,
                               command)
    rows, chosen, _ = measure(target, cal, lambda: target.evaluate(evals, batch_size=batch),
                              options, T, prediction, notes, progress)
    evaluation = {"sequences": len(evals), "tokens": int(evals.numel()),
                  "text": str(eval_text)}
    source = {"hf": str(model_dir), "model_type": target.g.model_type, "text": str(text),
              "eval_text": str(eval_text), "seq_len": seq_len, "device": str(where),
              "dtype": dtype, "tokens": "tokenizer" if tokenizer is not None
              else "bytes % vocab_size"}
    doc = _document(source, target, cal, options, T, prediction, rows, evaluation, notes,
                    time.perf_counter() - began)
    if options.save:
        _save(doc, target, cal, chosen, options, notes,
              lambda d: _save_hf(d, target, tokenizer))
    doc["notes"] = list(notes)
    return doc


def _read_eval(eval_text) -> bytes:
    from ...hf import read_text

    try:
        return read_text(eval_text)
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(str(e).replace("text=", "eval_text=", 1)) from None


# ---------------------------------------------------------------- --save

def _save(doc: dict, target, cal: Calibration, chosen: dict, options: CompressOptions,
          notes: list[str], write: Callable[[Path], None]) -> None:
    """The model at the verdict's setting (the largest measured ratio within the
    tolerance) written into options.save with its bases; nothing, and a note, when none."""
    v = doc["verdict"]
    index = next((i for i, r in enumerate(doc["rows"])
                  if i and r["allocation"] != "full"
                  and r["ratio"] == v["largest_ratio_within"]), None)
    if index is None:
        doc["saved"] = None
        notes.append(f"save={options.save}: nothing written: no measured setting keeps the "
                     f"loss within the tolerance of {options.tolerance:g}")
        return
    ranks = chosen[index]
    out = Path(options.save)
    out.mkdir(parents=True, exist_ok=True)
    P = {key: projectors(cal.bases[key], ranks[key]) for key in ranks}
    surgery = Surgery()
    try:
        target.apply(surgery, P)
        write(out)
    finally:
        surgery.restore()
    torch.save({"slots": [asdict(s) for s in target.slots],
                "ranks": {f"{k[0]}.{k[1]}": list(r) for k, r in ranks.items()},
                "bases": {f"{k[0]}.{k[1]}": [cal.bases[k][g, :, :r].float().contiguous()
                                             for g, r in enumerate(ranks[k])]
                          for k in ranks}}, out / "bases.pt")
    row = doc["rows"][index]
    doc["saved"] = {"dir": str(out), "row": index, "ratio": row["ratio"],
                    "setting": _setting(row), "bases": str(out / "bases.pt")}
    write_json(out / "compress.json", {k: doc[k] for k in ("schema", "version", "source",
                                                           "model", "cache_dtype", "length")}
               | {"row": row, "saved": doc["saved"]})


def _save_zoo(out: Path, model: nn.Module, config: dict) -> None:
    """A checkpoint laid out like a run's (checkpoints/last.ckpt: state_dict under
    "model.", the config under hyper_parameters) and its config.yaml."""
    (out / "checkpoints").mkdir(exist_ok=True)
    torch.save({"state_dict": {f"model.{k}": v.detach().clone()
                               for k, v in model.state_dict().items()},
                "hyper_parameters": {"config": config}, "global_step": 0},
               out / "checkpoints" / "last.ckpt")
    write_yaml(out / "config.yaml", config)


def _save_hf(out: Path, target: HFTarget, tokenizer) -> None:
    target.model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


# ---------------------------------------------------------------- rendering

COLUMNS = ("setting", "ratio", "B/token", "r per layer", "energy kept", "eval loss",
           "Δ loss")


def _metric_name(doc: dict) -> str:
    return "accuracy" if any("accuracy" in r for r in doc["rows"]) else "perplexity"


def row_cells(row: dict, metric: str) -> list[str]:
    name = "full cache" if row["allocation"] == "full" else _setting(row)
    cells = [name, f"{row['ratio']:.2f}x", f"{row['bytes_per_token']:.1f}",
             row["ranks_summary"], f"{row['retained_energy']:.4f}", f"{row['loss']:.4f}",
             f"{row['delta_loss']:+.4f}"]
    value = row.get(metric)
    cells.append("-" if value is None else (f"{value:.4f}" if metric == "accuracy"
                                            else f"{value:.3f}"))
    return cells


def header(doc: dict) -> str:
    src = doc["source"]
    name = src.get("variant") or src.get("hf")
    cal, ev = doc["calibration"], doc["evaluation"]
    return (f"compress {name}: {doc['model']}; cache at {doc['cache_dtype']} "
            f"({doc['bytes_per_element']} B/element), bases amortized at T = {doc['length']}; "
            f"calibration {cal['sequences']} sequences ({cal['tokens']} tokens), evaluation "
            f"{ev['sequences']} sequences ({ev['tokens']} tokens)")


def compress_table(doc: dict) -> Table:
    metric = _metric_name(doc)
    table = Table(title=header(doc), box=box.SIMPLE_HEAD, title_justify="left",
                  caption=f"verdict: {doc['verdict']['text']}", caption_justify="left")
    for col in (*COLUMNS, metric):
        table.add_column(col, justify="left" if col in ("setting", "r per layer") else "right",
                         overflow="fold")
    for row in doc["rows"]:
        table.add_row(*row_cells(row, metric))
    return table


def compress_markdown(doc: dict) -> str:
    metric = _metric_name(doc)
    cols = (*COLUMNS, metric)
    lines = [f"# {header(doc)}", "", "| " + " | ".join(cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(row_cells(r, metric)) + " |" for r in doc["rows"]]
    lines += ["", f"**Verdict**: {doc['verdict']['text']}"]
    if doc.get("prediction"):
        lines += ["", f"Advice checked: {doc['prediction']['source']}."]
    lines += [f"- {n}" for n in doc.get("notes", [])]
    return "\n".join(lines) + "\n"


def compress_figure(doc: dict):
    """Δ loss vs bytes per token at T, one line per allocation, the report's predicted
    size marked, the tolerance drawn."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    rows = doc["rows"]
    for alloc, marker in (("uniform", "o"), ("greedy", "s"), ("eps", "^")):
        pts = sorted((r["bytes_per_token"], r["delta_loss"]) for r in rows
                     if r["allocation"] == alloc)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=alloc)
    full = rows[0]
    ax.plot([full["bytes_per_token"]], [0.0], "k*", markersize=10, label="full cache")
    for r in rows:
        if r["allocation"] == "advised":
            ax.plot([r["bytes_per_token"]], [r["delta_loss"]], "rD", markersize=8,
                    label=f"advised ({r['ratio']:.2f}x)")
    pred = doc.get("prediction")
    if pred is not None:
        ax.axvline(full["bytes_per_token"] / pred["ratio"], color="red", linestyle="--",
                   linewidth=1, label=f"report: {pred['ratio']:.2f}x")
    ax.axhline(doc["tolerance"], color="grey", linestyle=":", linewidth=1,
               label=f"tolerance {doc['tolerance']:g}")
    # symlog: linear within the tolerance (where the verdict is decided), log beyond it
    linear = max(doc["tolerance"], 1e-3)
    ax.set_yscale("symlog", linthresh=linear)
    deltas = [r["delta_loss"] for r in rows]
    ax.set_ylim(min(1.5 * min(deltas), -0.5 * linear), max(2 * max(deltas), 2 * linear))
    ax.set_xlim(left=0)
    ax.set_xlabel(f"cache bytes per token at T = {doc['length']} ({doc['cache_dtype']})")
    ax.set_ylabel("Δ eval loss (nats per token)")
    name = doc["source"].get("variant") or Path(doc["source"].get("hf", "")).name
    ax.set_title(f"{name}: loss vs cache size", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def write_plot(doc: dict, out_dir) -> Path:
    from ...render.plots import save_figure

    return save_figure(compress_figure(doc), Path(out_dir) / "compress.png")
