"""`rankzoo report --hf MODEL_DIR --text FILE --emit FILE --d-model D --n-heads H`: the
model's layer pattern as a zoo experiment at the user's sizes, beside each of its kinds in
every layer, matched in parameters.

    sizes = MirrorSizes(d_model=64, n_heads=4, seq_len=64)
    raw, notes = emit_mirror(entry, "mirror.yaml", sizes)   # probe_hf's entry; loaded first

Each kind maps to the zoo block that declares the same caps (train/hf/probe.py zoo_blocks:
global and chunked -> softmax, sliding -> sliding_window, ssm -> ssm, dsa -> sparse, and
delta -> the block whose facts mirror it), with the checkpoint's knobs where the user's
sizes allow them:

- a window keeps the checkpoint's W (`--window` replaces it): what a local layer learns is
  local structure in tokens, which does not shrink with the context, and at the same W the
  run's local layers declare the checkpoint's caps (past->future W - 1), so the two reports
  compare per kind as they stand. A W not below the experiment's length would make the
  local layers global, and is refused with the flags that fix it; Llama 4's chunks of C
  likewise (softmax's `chunk`);
- NoPE layers keep no RoPE, learned sinks their sinks (softmax's `rope`, `sinks`);
- a DSA layer (an indexer's top-k over its keys) is the sparse family's token selection
  with the checkpoint's indexer heads; its top-k kept where it bites at the experiment's
  length, else a quarter of that length, said in a note (DSA's 2048 of 128k tokens
  selects a sixty-fourth; at 64 tokens the same k would select everything);
- KV heads keep the checkpoint's share of the query heads (G / H), at the nearest divisor of
  `--n-heads` where that share is no whole number of heads;
- an SSM keeps the checkpoint's state N, up to the largest N the zoo's ssm sizes at
  `--d-model` (its sizing's range), and its heads' sharing of B and C (n_groups) likewise;
- a delta rule (Gated DeltaNet, KDA) keeps its gate (scalar or per key channel) with the
  output gate of its family, its key width K within the same range, and its value heads
  per query/key head (n_v_heads = --n-heads times that share).

The experiment's data is MQAR at the experiment's length and its train settings those of
`rankzoo pick --emit`, so that both flows train alike. The file is written through pick's
writer: loaded before it is written, and an existing file kept unless forced.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import zoo
from budgets.report.kinds import mirror_kind
from zoo.facts import divisors

from ...config.sections import MAX_LAYERS
from ...hf import zoo_blocks
from ...sizing.costs import block_cost
from ..pick.emit import check_target, experiment_name, experiment_sections, write_experiment
from .pattern import LayerKind, decoder_kinds, ranges, runs_text, unit_length

PATTERN = "pattern"  # the hybrid variant's name; its uniform counterparts take their kind's
# a sub-block's name by its attention kind (a second kind of the same attention: local_2)
SUB_BLOCK_NAMES = {"sliding": "local", "global": "global", "chunked": "chunked", "ssm": "ssm",
                   "delta": "delta", "dsa": "dsa"}
MAX_PAIRS = 16  # MQAR's key-value pairs, at most; 4 tokens a pair (pick's rule)
MIN_SEQ_LEN = 8  # two pairs, their queries and the gaps between them


@dataclass(frozen=True)
class MirrorSizes:
    """The sizes the user gives: `--d-model`, `--n-heads`, the experiment's length
    (`--train-seq-len`), and optionally `--n-layers` and `--window`."""

    d_model: int
    n_heads: int
    seq_len: int
    n_layers: int | None = None
    window: int | None = None

    def check(self) -> None:
        """The checks that need no model: a ValueError naming the flag and its value."""
        D, H, T, W = self.d_model, self.n_heads, self.seq_len, self.window
        if D % H:
            raise ValueError(f"--n-heads {H}: must divide --d-model {D}")
        if T < MIN_SEQ_LEN:
            raise ValueError(f"--train-seq-len {T}: MQAR needs at least {MIN_SEQ_LEN} tokens "
                             f"(4 a key-value pair, two pairs at least)")
        if W is not None and not 2 <= W < T:
            raise ValueError(f"--window {W}: expected 2 <= W < --train-seq-len {T} (one key "
                             f"carries nothing, and a window of T keys is global)")
        if self.n_layers is not None and self.n_layers > MAX_LAYERS:
            raise ValueError(f"--n-layers {self.n_layers}: at most {MAX_LAYERS}")


@dataclass
class Mirror:
    """The experiment and what the file and the user are told about it."""

    raw: dict[str, Any]
    unit: list[LayerKind]
    n_checkpoint: int  # the checkpoint's layers
    comments: dict[str, str] = field(default_factory=dict)  # variant / sub-block -> comment
    notes: list[str] = field(default_factory=list)
    not_mirrored: list[str] = field(default_factory=list)


def check_emit(path: str | Path, sizes: MirrorSizes, force: bool = False) -> Path:
    """The checks that need no model, run before the probe: the sizes, and `path` a .yaml
    file that may be written (new unless `force`)."""
    sizes.check()
    return check_target(path, force)


def emit_mirror(entry: dict[str, Any], path: str | Path, sizes: MirrorSizes,
                force: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Write the mirrored experiment of probe_hf's `entry` to `path` (.yaml); (the
    experiment, notes for the user)."""
    path = check_emit(path, sizes, force)
    mirror = mirror_experiment(entry, sizes, experiment_name(path, "mirror"))
    write_experiment(path, mirror_yaml(mirror, entry["source"], path), force)
    return mirror.raw, mirror.notes


def mirror_experiment(entry: dict[str, Any], sizes: MirrorSizes, name: str) -> Mirror:
    """The experiment: the pattern variant (when the model is a hybrid) and one uniform
    variant per kind of its unit, the one with the most parameters first."""
    layers = decoder_kinds(entry)
    model = entry["source"]["model_type"]
    refuse_unmirrored(layers, model)
    p = unit_length([k.label for k in layers])
    unit = layers[:p]
    n_layers, notes = layer_count(sizes.n_layers, unit, len(layers), model)
    mirror = Mirror({}, unit, len(layers), notes=notes, not_mirrored=not_mirrored(layers))
    if sizes.window is not None and not any(k.kind["window"] for k in unit):
        mirror.notes.append(f"--window {sizes.window}: {model} has no sliding layers; "
                            f"ignored")
    names = sub_block_names(unit)
    blocks: dict[str, dict[str, Any]] = {}
    for k in unit:
        if names[k.label] not in blocks:
            spec, comment, more = mirrored_block(k, sizes, model)
            blocks[names[k.label]] = spec
            mirror.comments[names[k.label]] = comment
            mirror.notes += more
    variants: dict[str, Any] = {}
    if len(blocks) > 1:
        variants[PATTERN] = {"pattern": [names[k.label] for k in unit], "blocks": blocks}
        mirror.comments[PATTERN] = f"{model}'s unit: {runs_text([names[k.label] for k in unit])}"
    else:
        mirror.notes.append(f"{model} is not a hybrid: its {len(layers)} layers are all "
                            f"{unit[0].label}; the experiment trains its uniform model alone")
    variants.update(blocks)
    mirror.raw = experiment(name, sizes, n_layers, by_params(variants, sizes))
    if mirror.not_mirrored:
        mirror.notes.append(f"not mirrored (no zoo block has them): "
                            f"{'; '.join(mirror.not_mirrored)}")
    return mirror


def layer_count(asked: int | None, unit: list[LayerKind], n_checkpoint: int,
                model: str) -> tuple[int, list[str]]:
    """(layers of the experiment, notes): `--n-layers`, a multiple of the unit; by default
    the checkpoint's count, or the nearest multiple of the unit when its last repeat stops
    short (a zoo pattern fills the model with whole units)."""
    p, text = len(unit), runs_text([k.label for k in unit])
    if asked is not None:
        if asked % p:
            raise ValueError(f"--n-layers {asked}: {model}'s unit is {p} layers ({text}); "
                             f"give a multiple of {p}")
        return asked, []
    if n_checkpoint % p == 0:
        return n_checkpoint, []
    n, whole = max(p, p * round(n_checkpoint / p)), n_checkpoint // p
    return n, [f"{model}'s {n_checkpoint} layers are {whole} unit{'s' if whole > 1 else ''} "
               f"of {p} ({text}) and {n_checkpoint % p} more; the experiment has {n} layers, "
               f"whole units (--n-layers N, a multiple of {p}, to choose)"]


def sub_block_names(unit: list[LayerKind]) -> dict[str, str]:
    """Kind label -> sub-block name (local, global, ssm; local_2 for a second window)."""
    names: dict[str, str] = {}
    for k in unit:
        if k.label in names:
            continue
        base = SUB_BLOCK_NAMES.get(mirror_kind(k.kind), mirror_kind(k.kind))
        taken = sum(n == base or n.startswith(f"{base}_") for n in names.values())
        names[k.label] = base if not taken else f"{base}_{taken + 1}"
    return names


# ---------------------------------------------------------------- one kind -> one block

def refuse_unmirrored(layers: list[LayerKind], model: str) -> None:
    """A ValueError naming, in one line, every kind no zoo block mirrors (chunked
    attention, short convolutions, ...) with its layers, rather than a nearest block."""
    blocks, missing = zoo_blocks(), {}
    for k in layers:
        if mirror_kind(k.kind) not in blocks:
            missing.setdefault(k.label, []).append(k.layer)
    if missing:
        what = "; ".join(f"layer{'s' if len(at) > 1 else ''} {ranges(at)} ({label!r})"
                         for label, at in missing.items())
        several = len(missing) > 1 or len(next(iter(missing.values()))) > 1
        raise ValueError(f"--emit: {model}'s {what} {'are' if several else 'is'} of a kind "
                         f"no zoo block mirrors yet (they mirror {sorted(blocks)}); nothing "
                         f"was written")


def mirrored_block(k: LayerKind, sizes: MirrorSizes, model: str
                   ) -> tuple[dict[str, Any], str, list[str]]:
    """(block spec, its comment in the file, notes) of one kind at the user's sizes."""
    blocks = zoo_blocks()
    block = blocks.get(mirror_kind(k.kind))
    if block is None:
        raise ValueError(f"--emit: {model}'s layer {k.layer} ({k.label!r}) is of a kind no "
                         f"zoo block mirrors (they mirror {sorted(blocks)}); nothing was "
                         f"written")
    if k.kind["attention"] == "ssm":
        return _ssm(k, block, sizes)
    if k.kind["attention"] == "delta":
        return _delta(k, block, sizes)
    if mirror_kind(k.kind) == "dsa":
        return _dsa(k, block, sizes)
    return _attention(k, block, sizes, model)


def _attention(k: LayerKind, block: str, sizes: MirrorSizes, model: str
               ) -> tuple[dict[str, Any], str, list[str]]:
    H, T = sizes.n_heads, sizes.seq_len
    spec: dict[str, Any] = {"block": block}
    if k.kind["window"] is not None:
        W = sizes.window or int(k.kind["window"])
        if W >= T:
            raise ValueError(f"--emit: {model}'s window W={W} (layer {k.layer}) is not below "
                             f"--train-seq-len {T}: its sliding layers would see every token, "
                             f"as global ones do; pass --window W below {T} (e.g. {T // 4}) "
                             f"or a --train-seq-len above {W}")
        spec["window"] = W
    if k.kind.get("chunk"):
        C = int(k.kind["chunk"])
        if C >= T:
            raise ValueError(f"--emit: {model}'s chunks of C={C} (layer {k.layer}) are not "
                             f"shorter than --train-seq-len {T}: its chunked layers would see "
                             f"every token, as global ones do; pass a --train-seq-len above "
                             f"{C}")
        spec["chunk"] = C
    G, notes = kv_heads(k, H)
    spec["n_kv_heads"] = G
    if k.kind.get("rope") is False:  # NoPE layers, or learned positions (gpt2): no RoPE
        spec["rope"] = False
    if k.kind.get("sinks"):  # learned per-head sinks (gpt-oss)
        spec["sinks"] = True
    comment = f"{k.label}: G={G} of H={H} (the checkpoint: {k.kv_heads} of {k.heads})"
    return spec, comment, notes


def _dsa(k: LayerKind, block: str, sizes: MirrorSizes) -> tuple[dict[str, Any], str, list[str]]:
    """The sparse family's token selection (DSA's MQA beneath, one KV head); its top-k the
    checkpoint's where it bites at the experiment's length, else a quarter of it."""
    T, topk = sizes.seq_len, int(k.kind["topk"])
    top_k = topk if topk < T // 2 else max(1, T // 4)
    spec = {"block": block, "selection": "token", "top_k": top_k, "n_kv_heads": 1}
    if k.kind.get("rope") is False:
        spec["rope"] = False
    notes = [] if top_k == topk else [
        f"{k.label}: the checkpoint's top-k {topk} would select (nearly) every key at "
        f"--train-seq-len {T}; mirrored with top_k={top_k}, a quarter of it"]
    return spec, f"{k.label}: top_k={top_k} of T={T} (the checkpoint: {topk})", notes


def kv_heads(k: LayerKind, n_heads: int) -> tuple[int, list[str]]:
    """G at `n_heads` query heads: the checkpoint's share G / H, at the nearest divisor of
    n_heads (in ratio) when it is no whole number of heads."""
    G = nearest_divisor(n_heads, n_heads * k.kv_heads / k.heads)
    if G * k.heads == n_heads * k.kv_heads:
        return G, []
    return G, [f"{k.label}: the checkpoint's {k.kv_heads} KV heads of {k.heads} query heads "
               f"are no whole share of --n-heads {n_heads}; mirrored with G={G}"]


def _ssm(k: LayerKind, block: str, sizes: MirrorSizes) -> tuple[dict[str, Any], str, list[str]]:
    D, H, T = sizes.d_model, sizes.n_heads, sizes.seq_len
    N = int(k.kind["state"])
    largest = max(zoo.facts_of(block).sizing.values({"n_heads": H}, D, T))
    d_state = min(N, largest)
    sharing = int(k.kind.get("heads_sharing") or k.heads)  # heads per B, C group
    groups = nearest_divisor(H, H / sharing)
    notes = [] if d_state == N else [
        f"{k.label}: the checkpoint's state N={N} is above the largest the zoo's {block} "
        f"sizes at --d-model {D} ({largest}); mirrored with N={d_state}"]
    spec = {"block": block, "d_state": d_state, "n_groups": groups}
    return spec, f"{k.label}: N={d_state}, {H // groups} heads per B, C group", notes


# a delta rule's variant (budgets/capture/delta.py) -> the zoo delta block's gate and the
# gate on its normed output, as each family has it (Gated DeltaNet: silu, KDA: sigmoid)
DELTA_GATES = {"DeltaNet": ("none", "silu"), "GDN": ("scalar", "silu"),
               "KDA": ("channel", "sigmoid")}


def _delta(k: LayerKind, block: str, sizes: MirrorSizes
           ) -> tuple[dict[str, Any], str, list[str]]:
    """The checkpoint's gate and key width K (up to the largest the zoo's block sizes at
    --d-model), and its value heads per query/key head."""
    D, H, T = sizes.d_model, sizes.n_heads, sizes.seq_len
    K = int(k.kind["state"])
    largest = max(zoo.facts_of(block).sizing.values({"n_heads": H}, D, T))
    key_dim = min(K, largest)
    gate, output_gate = DELTA_GATES[k.kind["variant"]]
    sharing = int(k.kind.get("heads_sharing") or 1)
    spec = {"block": block, "gate": gate, "output_gate": output_gate, "key_dim": key_dim}
    if sharing > 1:
        spec["n_v_heads"] = H * sharing
    notes = [] if key_dim == K else [
        f"{k.label}: the checkpoint's key width K={K} is above the largest the zoo's {block} "
        f"sizes at --d-model {D} ({largest}); mirrored with K={key_dim}"]
    return spec, f"{k.label}: gate {gate}, K={key_dim}, {sharing} value heads per head", notes


def nearest_divisor(n: int, target: float) -> int:
    """The divisor of n nearest `target` in ratio (ties: the larger one)."""
    target = max(target, 1e-9)
    return min(reversed(divisors(n)), key=lambda d: abs(math.log(d / target)))


def not_mirrored(layers: list[LayerKind]) -> list[str]:
    """What the checkpoint's layers do that no zoo block's knob says."""
    has = {
        "soft-capped attention logits": any(k.kind.get("softcap") for k in layers),
        "experts after the mixer (the zoo's MLP is dense)": any(k.kind.get("moe")
                                                               for k in layers),
        "MLA's latent cache (mirrored with full keys and values)": any(k.latent
                                                                        for k in layers),
        "Mamba-1's A per channel (the zoo's ssm is Mamba-2's, one A per head)": any(
            k.label.endswith("per channel") for k in layers),
    }
    return [what for what, found in has.items() if found]


def by_params(variants: dict[str, Any], sizes: MirrorSizes) -> dict[str, Any]:
    """The variants, the one with the most parameters per unit of layers first, so that
    `match: {params: true}` widens the others' MLPs (a narrower one could fall below its
    floor); ties keep their order (the pattern first)."""
    def layer_params(spec: dict[str, Any]) -> int:
        kwargs = {"n_heads": sizes.n_heads, **{k: v for k, v in spec.items() if k != "block"}}
        return block_cost(spec["block"], kwargs, sizes.d_model, sizes.seq_len).layer_base

    def params(raw: dict[str, Any]) -> float:
        if "pattern" not in raw:
            return layer_params(raw)
        return sum(layer_params(raw["blocks"][n]) for n in raw["pattern"]) / len(raw["pattern"])

    order = sorted(variants, key=lambda name: -params(variants[name]))
    return {name: variants[name] for name in order}


# ---------------------------------------------------------------- the experiment

def experiment(name: str, sizes: MirrorSizes, n_layers: int,
               variants: dict[str, Any]) -> dict[str, Any]:
    """The experiment's sections: MQAR at the experiment's length, pick --emit's train
    settings (the same flow's start, to adjust with overrides)."""
    return experiment_sections(name, sizes.d_model, sizes.n_heads, n_layers, sizes.seq_len,
                              min(MAX_PAIRS, sizes.seq_len // 4), variants)


def mirror_yaml(mirror: Mirror, source: dict[str, Any], path: Path) -> str:
    """The experiment in configs/quick.yaml's layout, a header saying what was mirrored and
    what to run, each block's kind beside it."""
    raw = mirror.raw

    def section(key: str) -> str:
        return yaml.safe_dump({key: raw[key]}, sort_keys=False,
                              default_flow_style=False).rstrip()

    lines = [header(mirror, source, path), f"name: {raw['name']}", f"seed: {raw['seed']}",
             *(section(key) for key in ("data", "model", "match", "block_defaults")),
             "variants:"]
    for name, spec in raw["variants"].items():
        lines += variant_lines(name, spec, mirror.comments)
    lines += [section("train"), section("monitor")]
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False,
                          width=10 ** 6).strip()


def variant_lines(name: str, spec: dict[str, Any], comments: dict[str, str]) -> list[str]:
    """A variant's lines under `variants:`: a uniform one on one line, the pattern as its
    unit and its sub-blocks, one a line; each with its comment."""
    if "pattern" not in spec:
        return [f"  {name}: {_flow(spec)}   # every layer {comments[name]}"]
    width = max(len(n) for n in spec["blocks"])
    return [f"  {name}:   # {comments[name]}", f"    pattern: {_flow(spec['pattern'])}",
            "    blocks:",
            *(f"      {n + ':':<{width + 1}} {_flow(s)}   # {comments[n]}"
              for n, s in spec["blocks"].items())]


def header(mirror: Mirror, source: dict[str, Any], path: Path) -> str:
    """The file's comment lines: which model's pattern, at which sizes, and what to run."""
    raw, unit = mirror.raw, mirror.unit
    m, d, model = raw["model"], raw["data"], source["model_type"]
    labels = runs_text([k.label for k in unit])
    hybrid = len(raw["variants"]) > 1
    read = (f"its {mirror.n_checkpoint} layers repeat a unit of {len(unit)} ({labels})"
            if hybrid else f"its {mirror.n_checkpoint} layers are all {labels}, so it is no "
            f"hybrid and its uniform model is trained alone")
    text = (f"Written by rankzoo report --hf: the layer pattern of {model} ({source['hf']}), "
            f"read from the probe's kinds in layer order: {read}. Mirrored at "
            f"d_model={m['d_model']}, n_heads={raw['block_defaults']['n_heads']}, "
            f"n_layers={m['n_layers']}, seq_len={d['seq_len']}"
            + (", beside each of its kinds in every layer, matched in parameters (the "
               "variant with the most parameters first)" if hybrid else "")
            + f", on MQAR with {d['num_kv_pairs']} key-value pairs."
            + (f" Not mirrored: {'; '.join(mirror.not_mirrored)}." if mirror.not_mirrored
               else ""))
    lines = textwrap.wrap(text, width=96, initial_indent="# ", subsequent_indent="# ",
                          break_on_hyphens=False)
    lines += [f"#   rankzoo train {path}",
              f"#   rankzoo report runs/{raw['name']}"
              + ("     # per kind: the pattern's layers against the same kind in every layer"
                 if hybrid else "")]
    return "\n".join(lines)
