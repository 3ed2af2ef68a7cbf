"""Experiment configs: YAML plus `key=value` overrides, strictly validated.

An experiment is one data task, one model spec and several variants that differ only in
their block. Every section is a frozen dataclass that rejects unknown keys with a
suggestion, and each variant's block config is built (without weights) while loading, so
a bad config fails before any training starts.

    name: quick
    seed: 0
    data: {task: mqar, vocab_size: 128, seq_len: 64, num_kv_pairs: 8, ...}
    model: {d_model: 64, n_layers: 2, mlp_ratio: 4.0}
    block_defaults: {n_heads: 4}          # merged under every variant's block kwargs
    variants:
      mha: {block: softmax}
      mqa: {block: softmax, n_kv_heads: 1}
    train: {max_steps: 600, lr: 3.0e-3, ...}
    monitor: {every_n_steps: 100, eps: 0.1, probe_size: 16}
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

import zoo
from zoo.config import StrictConfig, is_instance, unknown_key_error

from .data import BYTE_VOCAB, MarkovSpec, MQARSpec, TextSpec
from .model import NORMS
from .plan import matched_states, matched_widths

OPTIMIZERS = ("adamw", "muon", "lion")

class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as a float (YAML 1.2) rather than a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")



def _positive(section: str, **values: Any) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"{section}.{name} must be > 0, got {value!r}")


# Keys every task reads, then each task's own: a key another task reads is rejected, so
# a config never carries a setting that silently does nothing.
COMMON_DATA_KEYS = ("task", "seq_len", "train_size", "val_size", "batch_size")
TASK_KEYS = {
    "mqar": ("vocab_size", "num_kv_pairs", "power_a", "random_non_queries", "val_kv_pairs",
             "permute_seed"),
    "markov": ("vocab_size", "rank", "temperature"),
    "text": ("paths", "max_bytes", "val_fraction", "pattern"),
}
TASKS = tuple(TASK_KEYS)
DEFAULT_VOCAB = {"mqar": 128, "markov": 64, "text": BYTE_VOCAB}


@dataclass(frozen=True)
class DataConfig(StrictConfig):
    owner: ClassVar[str] = 'data'

    task: str = "mqar"
    vocab_size: int | None = None  # mqar 128, markov 64; text is bytes (256, not settable)
    seq_len: int = 64
    num_kv_pairs: int = 8
    train_size: int = 20000
    val_size: int = 512
    batch_size: int = 64
    power_a: float = 0.01  # MQAR's query gap distribution: p(gap) ~ gap^(power_a - 1)
    random_non_queries: bool = True
    val_kv_pairs: list | None = None  # mqar: pair counts mixed in validation (num_kv_pairs)
    permute_seed: int | None = None  # mqar: relabel tokens by a seeded permutation (new vocab)
    rank: int = 8  # markov: rank of the transition logits, the data's intrinsic rank
    temperature: float = 1.0  # markov: logits are (A B^T) / temperature
    paths: list | None = None  # text: files, directories, globs, or "stdlib"
    max_bytes: int = 2_000_000  # text: read at most this many bytes in all
    val_fraction: float = 0.1  # text: the last fraction of the bytes is validation
    pattern: str = "*"  # text: files taken from a named directory

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"data.task must be one of {list(TASKS)}, got {self.task!r}")
        if self.vocab_size is None:  # frozen: the task's default is resolved once, here
            object.__setattr__(self, "vocab_size", DEFAULT_VOCAB[self.task])
        _positive("data", train_size=self.train_size, val_size=self.val_size,
                  batch_size=self.batch_size, seq_len=self.seq_len)
        self.spec()  # names the bad values
        if self.task == "mqar" and self.val_kv_pairs is not None \
                and self.val_size < len(self.val_kv_pairs):
            raise ValueError(f"data.val_size ({self.val_size}) must be >= the number of "
                             f"data.val_kv_pairs values ({list(self.val_kv_pairs)})")

    def spec(self) -> MQARSpec | MarkovSpec | TextSpec:
        """The task's own validated spec (MQARSpec, MarkovSpec or TextSpec)."""
        if self.task == "markov":
            return MarkovSpec(self.vocab_size, self.seq_len, self.rank, self.temperature)
        if self.task == "text":
            return TextSpec(tuple(self.paths or ()), self.seq_len, self.max_bytes,
                            self.val_fraction, self.pattern)
        return self.mqar_spec()

    def mqar_spec(self) -> MQARSpec:
        pairs = self.val_kv_pairs
        return MQARSpec(self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a,
                        self.random_non_queries,
                        tuple(pairs) if isinstance(pairs, list) else pairs,
                        self.permute_seed)

    @property
    def intrinsic_rank(self) -> int | None:
        """The rank of the data's next-token logits when it is known (markov), else None."""
        return self.rank if self.task == "markov" else None

    @property
    def chance_accuracy(self) -> float:
        if self.task == "mqar":
            return self.mqar_spec().chance_accuracy
        return 1.0 / self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        """Only the keys this task reads (so a resolved config loads back)."""
        keys = (*COMMON_DATA_KEYS, *TASK_KEYS[self.task])
        out = {k: getattr(self, k) for k in keys}
        for key in ("val_kv_pairs", "permute_seed"):
            if out.get(key, 0) is None:  # unset: resolved configs stay as they were
                del out[key]
        return out


def check_data_keys(raw: dict[str, Any]) -> None:
    """Reject keys that exist but belong to another task, naming the task's keys."""
    task = raw.get("task", "mqar")
    if task not in TASK_KEYS:
        return  # DataConfig.validate names the bad task
    allowed = [*COMMON_DATA_KEYS, *TASK_KEYS[task]]
    for key in raw:
        if key not in allowed:
            raise unknown_key_error(f"{task} data", f"data.{key}",
                                    [f"data.{k}" for k in allowed])


@dataclass(frozen=True)
class MatchConfig(StrictConfig):
    """Matching against the first (reference) variant, each within `tolerance`:
    state: size each variant's state knob (train/plan.py STATE_KNOBS: n_kv_heads, window,
    feature_dim, d_state, kv_lora_rank, head_dim) so its cached elements per sequence at
    data.seq_len match; the matched value overrides one written in the variant.
    params: then size each variant's MLP so its total parameter count matches."""

    owner: ClassVar[str] = 'match'

    params: bool = False
    state: bool = False
    tolerance: float = 0.05

    def validate(self) -> None:
        if not 0 < self.tolerance < 1:
            raise ValueError(f"match.tolerance must be in (0, 1), got {self.tolerance!r}")


@dataclass(frozen=True)
class ModelConfig(StrictConfig):
    owner: ClassVar[str] = 'model'

    d_model: int = 64
    n_layers: int = 2
    mlp_ratio: float = 4.0
    d_mlp: int | None = None  # overrides mlp_ratio when set
    norm: str = "rmsnorm"
    tie_embeddings: bool = False

    def validate(self) -> None:
        _positive("model", d_model=self.d_model, n_layers=self.n_layers,
                  mlp_ratio=self.mlp_ratio, d_mlp=self.d_mlp)
        if self.norm not in NORMS:
            raise ValueError(f"model.norm must be one of {list(NORMS)}, got {self.norm!r}")


@dataclass(frozen=True)
class TrainConfig(StrictConfig):
    owner: ClassVar[str] = 'train'

    max_steps: int = 600
    optimizer: str = "adamw"  # adamw | muon (hidden matrices; AdamW on the rest) | lion
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at max_steps
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    warmup_steps: int = 50
    grad_clip: float | None = 1.0
    precision: str = "32-true"
    accelerator: str = "cpu"
    devices: int | str = 1
    strategy: str = "auto"
    val_every_n_steps: int = 100
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 100

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"train.optimizer must be one of {list(OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        _positive("train", max_steps=self.max_steps, lr=self.lr, grad_clip=self.grad_clip,
                  val_every_n_steps=self.val_every_n_steps,
                  log_every_n_steps=self.log_every_n_steps,
                  checkpoint_every_n_steps=self.checkpoint_every_n_steps)
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"train.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class MonitorConfig(StrictConfig):
    owner: ClassVar[str] = 'monitor'

    every_n_steps: int = 100
    eps: float = 0.1
    probe_size: int = 8  # validation examples in the fixed probe batch
    histograms: bool = True

    def validate(self) -> None:
        _positive("monitor", every_n_steps=self.every_n_steps, probe_size=self.probe_size)
        if not 0 < self.eps < 1:
            raise ValueError(f"monitor.eps must be in (0, 1), got {self.eps}")


# The sweep's selection metrics and which way is better.
SELECT_MODES = {"val/loss": "min", "val/accuracy": "max"}
SWEEP_AXES = ("optimizer", "lr", "seed")


@dataclass(frozen=True)
class SweepConfig(StrictConfig):
    """A grid: every variant runs at every listed optimizer x lr x seed (an axis left out
    keeps the train section's value and the experiment's seed). The best lr per variant
    and optimizer is the one with the best `select` averaged over seeds, as Zoology picks
    it; a run whose loss diverges counts as the worst."""

    owner: ClassVar[str] = 'sweep'

    optimizer: list | None = None
    lr: list | None = None
    seed: list | None = None
    select: str = "val/loss"  # val/loss (lower is better) or val/accuracy (higher)

    def validate(self) -> None:
        if self.select not in SELECT_MODES:
            raise ValueError(f"sweep.select must be one of {list(SELECT_MODES)}, "
                             f"got {self.select!r}")
        if not self.axes:
            raise ValueError(f"sweep needs at least one of {list(SWEEP_AXES)} as a list")
        for axis, values in self.axes.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(f"sweep.{axis} must be a non-empty list without repeats, "
                                 f"got {values!r}")
            for value in values:
                _check_sweep_value(axis, value)

    @property
    def axes(self) -> dict[str, list]:
        """The swept axes, in SWEEP_AXES order."""
        return {a: getattr(self, a) for a in SWEEP_AXES if getattr(self, a) is not None}

    def points(self) -> list[dict[str, Any]]:
        """Every grid point, e.g. {"optimizer": "muon", "lr": 0.003, "seed": 1}."""
        axes = self.axes
        grid = itertools.product(*axes.values())
        return [dict(zip(axes, values, strict=True)) for values in grid]


def _check_sweep_value(axis: str, value: Any) -> None:
    if axis == "optimizer" and value not in OPTIMIZERS:
        raise ValueError(f"sweep.optimizer values must be in {list(OPTIMIZERS)}, got {value!r}")
    if axis == "lr" and not (is_instance(value, float) and value > 0):
        raise ValueError(f"sweep.lr values must be numbers > 0, got {value!r}")
    if axis == "seed" and not (is_instance(value, int) and value >= 0):
        raise ValueError(f"sweep.seed values must be non-negative ints, got {value!r}")


def run_name(variant: str, point: dict[str, Any]) -> str:
    """A sweep run's directory name: mha_muon_lr0.003_s1 (only the swept axes appear)."""
    tags = {"optimizer": str, "lr": lambda v: f"lr{v:g}", "seed": lambda v: f"s{v}"}
    return "_".join([variant, *(tags[a](point[a]) for a in SWEEP_AXES if a in point)])


@dataclass(frozen=True)
class Variant:
    """One variant: a zoo block name and its kwargs (block_defaults merged in). In a sweep,
    each grid point is a Variant of its own whose `base` names the configured variant and
    whose `point` holds its optimizer, lr and seed."""

    name: str
    block: str
    block_kwargs: dict[str, Any]
    base: str = ""
    point: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, **self.block_kwargs}


SECTIONS: dict[str, type[StrictConfig]] = {
    "data": DataConfig, "model": ModelConfig, "train": TrainConfig, "monitor": MonitorConfig,
    "match": MatchConfig,
}
TOP_LEVEL = ["name", "seed", *SECTIONS, "block_defaults", "variants", "sweep", "finetune"]


@dataclass(frozen=True)
class Experiment:
    name: str
    variants: dict[str, Variant]
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    match: MatchConfig = field(default_factory=MatchConfig)
    block_defaults: dict[str, Any] = field(default_factory=dict)
    # MLP width per variant chosen by `match` (derived, so not in to_dict: reloading
    # the resolved config recomputes the same widths)
    d_mlp: dict[str, int] = field(default_factory=dict)
    # state knob per variant chosen by match.state, e.g. {"window": 32} (derived, likewise)
    state: dict[str, dict[str, int]] = field(default_factory=dict)
    sweep: SweepConfig | None = None  # when set, `variants` holds one Variant per grid point
    finetune: Any = None  # FinetuneConfig (train/finetune.py): a LoRA stage after training

    def to_dict(self) -> dict[str, Any]:
        """The resolved config, as YAML would hold it (loads back to an equal Experiment)."""
        out = {
            "name": self.name, "seed": self.seed,
            **{s: getattr(self, s).to_dict() for s in SECTIONS},
            "block_defaults": dict(self.block_defaults),
            # a sweep's grid points collapse back to the variants they were expanded from
            "variants": {v.base or n: v.to_dict() for n, v in self.variants.items()},
        }
        if self.sweep is not None:
            out["sweep"] = self.sweep.to_dict()
        if self.finetune is not None:
            out["finetune"] = self.finetune.to_dict()
        return out

    def variant_config(self, variant: str) -> dict[str, Any]:
        """Everything one variant's run depends on, as a plain nested dict."""
        v = self.variants[variant]
        model = self.model.to_dict()
        if variant in self.d_mlp:
            model["d_mlp"] = self.d_mlp[variant]
        train = {**self.train.to_dict(),
                 **{k: v.point[k] for k in ("optimizer", "lr") if k in v.point}}
        config = {
            "experiment": self.name, "variant": variant, "seed": v.point.get("seed", self.seed),
            "data": {**self.data.to_dict(), "vocab_size": self.data.vocab_size},
            "model": model,
            "block": {"name": v.block, **v.block_kwargs, **self.state.get(variant, {})},
            "train": train, "monitor": self.monitor.to_dict(),
            "match": self.match.to_dict(),
        }
        if v.point:
            config["sweep"] = {"variant": v.base, **v.point}
        if self.data.intrinsic_rank is not None:
            config["data_intrinsic_rank"] = self.data.intrinsic_rank
        return config


def _section(raw: Any, cls: type[StrictConfig], section: str) -> StrictConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{section} must be a mapping of keys to values, got {raw!r}")
    known = [f.name for f in fields(cls) if f.init]
    for key in raw:
        if key not in known:
            raise unknown_key_error("experiment", f"{section}.{key}",
                                    [f"{section}.{k}" for k in known])
    if cls is DataConfig:
        check_data_keys(raw)
    try:
        return cls(**raw)
    except TypeError as e:  # e.g. a missing required field
        raise ValueError(f"{section}: {e}") from e


def _variant(name: Any, raw: Any, defaults: dict[str, Any], d_model: int) -> Variant:
    where = f"variants.{name}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"variant name {name!r} must be letters, digits, '_', '.' or '-' "
                         "(it names a directory)")
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping with at least 'block', got {raw!r}")
    raw = dict(raw)
    block = raw.pop("block", None)
    if block is None:
        raise ValueError(f"{where}.block is missing; one of {zoo.names()}")
    try:
        cls = zoo.block_class(block)
    except ValueError as e:
        raise ValueError(f"{where}.block: {e}") from None
    kwargs = {**defaults, **raw}
    if "d_model" in kwargs:
        raise ValueError(f"{where}: set model.d_model ({d_model}), not the block's d_model")
    known = [f.name for f in fields(cls.Config) if f.init]
    for key in kwargs:
        if key not in known:
            owner = where if key in raw else "block_defaults"
            raise unknown_key_error(f"{block} block", f"{owner}.{key}",
                                    [f"{owner}.{k}" for k in known])
    try:
        cls.Config.from_dict(kwargs, d_model=d_model)  # validates every value
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
    return Variant(name, block, kwargs)


def parse_experiment(raw: Any, source: str = "<config>") -> Experiment:
    """Build a validated Experiment from a nested dict; errors are prefixed by `source`."""
    try:
        exp = _parse(raw)
        if raw.get("finetune") is not None:  # checked against the variants parsed above
            from .finetune import parse_finetune
            exp = dataclasses.replace(exp, finetune=parse_finetune(raw["finetune"], exp))
        return exp
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _parse(raw: Any) -> Experiment:
    if not isinstance(raw, dict):
        raise ValueError(f"an experiment must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in TOP_LEVEL:
            raise unknown_key_error("experiment", str(key), TOP_LEVEL)
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"name must be letters, digits, '_', '.' or '-' (it names the run "
                         f"directory), got {name!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    sections = {s: _section(raw.get(s), cls, s) for s, cls in SECTIONS.items()}
    defaults = raw.get("block_defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"block_defaults must be a mapping, got {defaults!r}")
    variants_raw = raw.get("variants")
    if not isinstance(variants_raw, dict) or not variants_raw:
        raise ValueError("variants must be a non-empty mapping of name -> {block: ..., ...}")
    d_model = sections["model"].d_model
    variants = {n: _variant(n, v, defaults, d_model) for n, v in variants_raw.items()}
    # state first: the matched knob changes the block's parameters, which params then match
    state = _matched_states(sections, variants) if sections["match"].state else {}
    d_mlp = _matched_widths(sections, variants, state) if sections["match"].params else {}
    sweep = None
    if raw.get("sweep") is not None:
        sweep = _section(raw["sweep"], SweepConfig, "sweep")
        variants, d_mlp = expand_sweep(sweep, variants, d_mlp)
        state = {run: state[v.base] for run, v in variants.items() if v.base in state}
    return Experiment(name=name, seed=seed, variants=variants, block_defaults=dict(defaults),
                      d_mlp=d_mlp, state=state, sweep=sweep, **sections)


def expand_sweep(sweep: SweepConfig, variants: dict[str, Variant],
                 d_mlp: dict[str, int]) -> tuple[dict[str, Variant], dict[str, int]]:
    """One Variant per variant x grid point, each keeping its variant's matched width."""
    names = [run_name("", p) for p in sweep.points()]
    if len(set(names)) < len(names):
        raise ValueError(f"sweep: two grid points share a run name (lr values equal to 6 "
                         f"significant digits?): {sorted(n for n in names if names.count(n) > 1)}")
    runs: dict[str, Variant] = {}
    for v in variants.values():
        for point in sweep.points():
            name = run_name(v.name, point)
            if name in runs or (name in variants and name != v.name):
                raise ValueError(f"sweep: run name {name!r} is taken twice; rename variant "
                                 f"{v.name!r}")
            runs[name] = Variant(name, v.block, v.block_kwargs, base=v.name, point=point)
    widths = {run: d_mlp[r.base] for run, r in runs.items() if r.base in d_mlp}
    return runs, widths


def _matched_states(sections: dict[str, Any],
                    variants: dict[str, Variant]) -> dict[str, dict[str, int]]:
    return matched_states({n: (v.block, v.block_kwargs) for n, v in variants.items()},
                          sections["model"].d_model, sections["model"].n_layers,
                          sections["data"].seq_len, sections["match"].tolerance)


def _matched_widths(sections: dict[str, Any], variants: dict[str, Variant],
                    state: dict[str, dict[str, int]]) -> dict[str, int]:
    data, model = sections["data"], sections["model"]
    sizes = {**model.to_dict(), "vocab_size": data.vocab_size, "seq_len": data.seq_len}
    blocks = {n: (v.block, {**v.block_kwargs, **state.get(n, {})}) for n, v in variants.items()}
    return matched_widths(sizes, blocks, sections["match"].tolerance)


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override in place; value is parsed as a YAML scalar."""
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or any(not p for p in parts):
        raise ValueError(f"bad override {override!r}: expected key=value with a dotted key, "
                         "e.g. train.max_steps=100")
    try:
        value = yaml_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ValueError(f"bad override {override!r}: value is not valid YAML ({e})") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ValueError(f"bad override {override!r}: {'.'.join(parts[:i + 1])} is "
                             f"{child!r}, not a mapping")
        node = child
    node[parts[-1]] = value


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read a YAML experiment, apply `key=value` overrides, validate everything."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"experiment config {path} is a directory, not a YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"experiment config not found: {path}")
    try:
        raw = yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if raw is None:
        raise ValueError(f"{path}: the experiment config is empty")
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: an experiment must be a mapping, got {type(raw).__name__}")
    for override in overrides:
        apply_override(raw, override)
    return parse_experiment(raw, source=str(path))
