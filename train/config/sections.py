"""The experiment's plain sections: data, model, train, monitor, match.

Each is a zoo.config.StrictConfig (types checked from the annotations, then `validate`
names bad values); `parse_section` builds one from its YAML mapping, naming unknown keys
with the section's prefix (`data.vocab_sise` -> did you mean `data.vocab_size`?).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from zoo.config import StrictConfig, require, seed_value, unknown_key_error

from ..data import (
    BYTE_VOCAB,
    MarkovSpec,
    ModAddSpec,
    MQARSpec,
    TextSpec,
    TokensSpec,
    tokenizer_vocab_size,
)
from ..lm.decoder import MLPS, NORMS

OPTIMIZERS = ("adamw", "muon", "lion")
MAX_LAYERS = 1024  # deeper than any trained decoder; bounds what a dry run builds
# widths past any model's; a square matrix of 2**31 rows overflows torch's storage size
MAX_WIDTH, MAX_MLP = 2 ** 20, 2 ** 24
MAX_VOCAB = 2 ** 24  # past any tokenizer's (256k); an embedding table's rows are an int64


def greater_than_zero(section: str, **values: Any) -> None:
    """Each value > 0 (None skipped: an optional field left unset)."""
    for name, value in values.items():
        require(value is None or value > 0, f"{section}.{name} must be > 0, got {value!r}")


# Keys every task reads, then each task's own: a key another task reads is rejected, so
# a config never carries a setting that silently does nothing.
COMMON_DATA_KEYS = ("task", "seq_len", "train_size", "val_size", "batch_size")
TASK_KEYS = {
    "mqar": ("vocab_size", "num_kv_pairs", "power_a", "random_non_queries", "val_kv_pairs",
             "train_kv_pairs", "permute_seed"),
    "markov": ("vocab_size", "rank", "temperature"),
    "modadd": ("vocab_size", "modulus"),
    "text": ("paths", "max_bytes", "val_fraction", "pattern", "tokenizer"),
    "tokens": ("paths", "val_paths", "val_fraction", "pattern", "format", "vocab_size",
               "tokenizer"),
}
TASKS = tuple(TASK_KEYS)
DEFAULT_VOCAB = {"mqar": 128, "markov": 64, "text": BYTE_VOCAB}  # tokens: none, it is asked
# keys a task reads only beside data.tokenizer: bytes have 256 ids, a tokenizer sets its own
WITH_TOKENIZER = {"text": ("vocab_size",)}
# optional keys left out of a resolved config while unset, so that it stays as it was
# before they existed
UNSET_LEFT_OUT = ("val_kv_pairs", "train_kv_pairs", "permute_seed", "tokenizer", "val_paths",
                  "pattern", "val_fraction")


@dataclass(frozen=True)
class DataConfig(StrictConfig):
    owner: ClassVar[str] = "data"

    task: str = "mqar"
    vocab_size: int | None = None  # mqar 128, markov 64; text: bytes (256) or its tokenizer's
    seq_len: int = 64
    num_kv_pairs: int = 8
    train_size: int = 20000
    val_size: int = 512
    batch_size: int = 64
    power_a: float = 0.01  # MQAR's query gap distribution: p(gap) ~ gap^(power_a - 1)
    random_non_queries: bool = True
    val_kv_pairs: list | None = None  # mqar: pair counts mixed in validation (num_kv_pairs)
    train_kv_pairs: list | None = None  # mqar: pair counts mixed in training (num_kv_pairs)
    permute_seed: int | None = None  # mqar: relabel tokens by a seeded permutation (new vocab)
    rank: int = 8  # markov: rank of the transition logits, the data's intrinsic rank
    temperature: float = 1.0  # markov: logits are (A B^T) / temperature
    modulus: int = 97  # modadd: a b = -> (a + b) mod modulus; vocabulary modulus + 1
    paths: list | None = None  # text: files, directories, globs, "stdlib"; tokens: shards
    max_bytes: int = 2_000_000  # text: read at most this many bytes in all
    val_fraction: float | None = None  # text, tokens: the last fraction validates (0.1)
    pattern: str | None = None  # text ("*"), tokens (.bin, .npy): files taken from a directory
    tokenizer: str | None = None  # text, tokens: a tokenizer.json, a model directory, bpe:N
    val_paths: list | None = None  # tokens: the validation shards (else the last fraction)
    format: str = "auto"  # tokens: auto | bin | modded | npy (train/data/shards.py)

    def validate(self) -> None:
        require(self.task in TASKS, f"data.task must be one of {list(TASKS)}, got {self.task!r}")
        self._resolve_defaults()
        greater_than_zero("data", train_size=self.train_size, val_size=self.val_size,
                          batch_size=self.batch_size, seq_len=self.seq_len)
        require(self.vocab_size <= MAX_VOCAB,
                f"data.vocab_size must be <= {MAX_VOCAB}, got {self.vocab_size}")
        seed_value("data.permute_seed", self.permute_seed, optional=True)
        self.spec()  # names the bad values
        for split, size in (("val", self.val_size), ("train", self.train_size)):
            pairs = getattr(self, f"{split}_kv_pairs") if self.task == "mqar" else None
            require(pairs is None or size >= len(pairs),
                    f"data.{split}_size ({size}) must be >= the number of "
                    f"data.{split}_kv_pairs values ({pairs})")

    def _resolve_defaults(self) -> None:
        """The defaults that depend on the task or the tokenizer, resolved once, here (the
        config is frozen): the vocabulary, text's pattern and validation fraction."""
        resolve = object.__setattr__
        require(self.val_paths is None or self.val_fraction is None,
                "data.val_paths and data.val_fraction both set: validation is the named "
                "shards or the last fraction of data.paths, not both")
        if self.task in ("text", "tokens") and self.val_fraction is None and not self.val_paths:
            resolve(self, "val_fraction", 0.1)
        if self.task == "text" and self.pattern is None:
            resolve(self, "pattern", "*")
        require(self.tokenizer is None or isinstance(self.tokenizer, str) and self.tokenizer,
                f"data.tokenizer must be a path or bpe:N, got {self.tokenizer!r}")
        if self.task == "modadd" and self.vocab_size is None:  # the residues and `=`
            resolve(self, "vocab_size", self.modulus + 1)
        resolve(self, "vocab_size", self._vocab())

    def _vocab(self) -> int:
        """data.vocab_size, else the tokenizer's vocabulary, else the task's default; one
        smaller than the tokenizer's is an error naming both."""
        tokenizer = None if self.tokenizer is None else tokenizer_vocab_size(self.tokenizer)
        if self.vocab_size is None:
            require(tokenizer is not None or self.task in DEFAULT_VOCAB,
                    f"data.vocab_size is missing: task {self.task} needs the vocabulary its "
                    f"token ids index (shards do not record it); set data.vocab_size, or "
                    f"data.tokenizer to take its vocabulary")
            return tokenizer if tokenizer is not None else DEFAULT_VOCAB[self.task]
        require(tokenizer is None or self.vocab_size >= tokenizer,
                f"data.vocab_size {self.vocab_size} is smaller than the vocabulary of "
                f"data.tokenizer {self.tokenizer!r} ({tokenizer} tokens): set data.vocab_size "
                f">= {tokenizer}, or leave it out to take the tokenizer's")
        return self.vocab_size

    def spec(self) -> MQARSpec | MarkovSpec | TextSpec | TokensSpec:
        """The task's own validated spec (MQARSpec, MarkovSpec, TextSpec or TokensSpec)."""
        return SPECS[self.task](self)

    def mqar_spec(self) -> MQARSpec:
        def counts(pairs):
            return tuple(pairs) if isinstance(pairs, list) else pairs

        return MQARSpec(self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a,
                        self.random_non_queries, counts(self.val_kv_pairs),
                        self.permute_seed, counts(self.train_kv_pairs))

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
        keys = task_keys(self.task, self.tokenizer is not None)
        out = {k: getattr(self, k) for k in keys}
        for key in UNSET_LEFT_OUT:
            if out.get(key, 0) is None:  # unset: resolved configs stay as they were
                del out[key]
        return out


def _text_spec(data: DataConfig) -> TextSpec:
    return TextSpec(tuple(data.paths or ()), data.seq_len, data.max_bytes, data.val_fraction,
                    data.pattern, data.tokenizer)


def _tokens_spec(data: DataConfig) -> TokensSpec:
    return TokensSpec(tuple(data.paths or ()), data.seq_len, data.vocab_size,
                      None if data.val_paths is None else tuple(data.val_paths),
                      data.val_fraction, data.pattern, data.format)


SPECS = {
    "mqar": DataConfig.mqar_spec,
    "markov": lambda d: MarkovSpec(d.vocab_size, d.seq_len, d.rank, d.temperature),
    "text": _text_spec,
    "tokens": _tokens_spec,
    "modadd": lambda d: ModAddSpec(d.modulus, d.vocab_size, d.seq_len),
}


def task_keys(task: str, tokenizer: bool) -> list[str]:
    """The data keys task `task` reads (with data.tokenizer set, when `tokenizer`)."""
    extra = WITH_TOKENIZER.get(task, ()) if tokenizer else ()
    return [*COMMON_DATA_KEYS, *TASK_KEYS[task], *extra]


def check_data_keys(raw: dict[str, Any]) -> None:
    """Reject keys that exist but belong to another task, naming the task's keys."""
    task = raw.get("task", "mqar")
    if not isinstance(task, str) or task not in TASK_KEYS:
        return  # DataConfig names the bad task (a list would not even hash)
    allowed = task_keys(task, raw.get("tokenizer") is not None)
    for key in raw:
        if key not in allowed:
            raise unknown_key_error(f"{task} data", f"data.{key}",
                                    [f"data.{k}" for k in allowed])


@dataclass(frozen=True)
class MatchConfig(StrictConfig):
    """Matching against the first (reference) variant, each within `tolerance`:
    state: size each variant's state knob (the one its block declares, zoo/facts.py:
    n_kv_heads, window, feature_dim, d_state, kv_lora_rank, head_dim) so its cached elements
    per sequence at data.seq_len match; the matched value overrides one written in the variant.
    params: then size each variant's MLP so its total parameter count matches."""

    owner: ClassVar[str] = "match"

    params: bool = False
    state: bool = False
    tolerance: float = 0.05

    def validate(self) -> None:
        require(0 < self.tolerance < 1,
                f"match.tolerance must be in (0, 1), got {self.tolerance!r}")


@dataclass(frozen=True)
class ModelConfig(StrictConfig):
    owner: ClassVar[str] = "model"

    d_model: int = 64
    n_layers: int = 2
    mlp_ratio: float = 4.0
    d_mlp: int | None = None  # overrides mlp_ratio when set
    norm: str = "rmsnorm"
    tie_embeddings: bool = False
    mlp: str = "gelu"  # gelu (2 matrices) | swiglu (3; at a ratio, 2/3 of gelu's width)

    def validate(self) -> None:
        greater_than_zero("model", d_model=self.d_model, n_layers=self.n_layers,
                          mlp_ratio=self.mlp_ratio, d_mlp=self.d_mlp)
        require(self.norm in NORMS, f"model.norm must be one of {list(NORMS)}, got {self.norm!r}")
        check_mlp("model.mlp", self.mlp)
        # every layer is built (on the meta device) to count and match parameters: a few
        # seconds at this bound, minutes and gigabytes at 100000
        require(self.n_layers <= MAX_LAYERS,
                f"model.n_layers must be <= {MAX_LAYERS}, got {self.n_layers}")
        require(self.d_model <= MAX_WIDTH,
                f"model.d_model must be <= {MAX_WIDTH}, got {self.d_model}")
        d_mlp = self.d_mlp if self.d_mlp is not None else self.mlp_ratio * self.d_model
        require(d_mlp <= MAX_MLP, f"model's MLP width must be <= {MAX_MLP}, got {d_mlp:g} "
                                  f"(model.d_mlp, or model.mlp_ratio x model.d_model)")


def check_mlp(where: str, mlp: Any) -> None:
    require(isinstance(mlp, str) and mlp in MLPS,
            f"{where} must be one of {list(MLPS)}, got {mlp!r}")


# What Lightning's Trainer accepts (tests/train/harness/test_settings.py checks these against its
# registries); listed here so that a config is checked without importing Lightning.
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true",
              "transformer-engine", "transformer-engine-float16", "64", "32", "16", "bf16")
STRATEGIES = (
    "auto", "single_device", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook",
    *(f"{s}_find_unused_parameters_{b}" for s in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")
      for b in ("false", "true")),
    "fsdp", "fsdp_cpu_offload", "deepspeed", "deepspeed_stage_1", "deepspeed_stage_2",
    "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme", "xla", "xla_debug", "single_xla", "single_tpu",
)


def device_request(devices: int | str) -> int | tuple[int, ...] | str:
    """train.devices read the way Lightning reads it: a count (int >= 1), "all" (-1 or
    "-1": every device), "auto", or device indices ("0,2"; "1," is the one index 1)."""
    text = str(devices).strip()
    if text in ("-1", "auto"):
        return "all" if text == "-1" else "auto"
    if "," in text:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        require(bool(parts) and all(p.isdigit() for p in parts),
                f"train.devices: expected device indices like '0,2', got {devices!r}")
        require(len(set(parts)) == len(parts),
                f"train.devices: device index repeated in {devices!r}")
        return tuple(int(p) for p in parts)
    require(text.isdigit() and int(text) >= 1,
            f"train.devices must be a count >= 1, -1 or 'auto' (all), or device indices "
            f"like '0,2', got {devices!r}")
    return int(text)


@dataclass(frozen=True)
class TrainConfig(StrictConfig):
    owner: ClassVar[str] = "train"

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
    devices: int | str = 1  # a count, -1 or "auto" (all), or GPU indices "0,2"
    strategy: str = "auto"  # fsdp: FSDP2 (train/harness/sharding.py), on CPUs as on GPUs
    num_nodes: int = 1
    accumulate_grad_batches: int = 1  # forward/backward passes per step; same global batch
    activation_checkpointing: bool = False  # recompute each layer in the backward
    val_every_n_steps: int = 100
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 100

    def validate(self) -> None:
        require(self.optimizer in OPTIMIZERS, f"train.optimizer must be one of "
                                              f"{list(OPTIMIZERS)}, got {self.optimizer!r}")
        greater_than_zero("train", max_steps=self.max_steps, lr=self.lr, grad_clip=self.grad_clip,
                          val_every_n_steps=self.val_every_n_steps,
                          log_every_n_steps=self.log_every_n_steps,
                          checkpoint_every_n_steps=self.checkpoint_every_n_steps,
                          accumulate_grad_batches=self.accumulate_grad_batches)
        require(isinstance(self.activation_checkpointing, bool),
                f"train.activation_checkpointing must be true or false, got "
                f"{self.activation_checkpointing!r}")
        require(self.warmup_steps >= 0,
                f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        require(self.weight_decay >= 0,
                f"train.weight_decay must be >= 0, got {self.weight_decay}")
        require(0 <= self.min_lr_ratio <= 1,
                f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            require(0 <= value < 1, f"train.{name} must be in [0, 1), got {value}")
        self._check_trainer_settings()

    def _check_trainer_settings(self) -> None:
        """The settings passed to Lightning's Trainer, against the values it accepts (this
        machine is checked by train/harness/devices.py: a config stays loadable elsewhere)."""
        for name, allowed in (("accelerator", ACCELERATORS), ("precision", PRECISIONS),
                              ("strategy", STRATEGIES)):
            value = getattr(self, name)
            require(value in allowed,
                    f"train.{name} must be one of {list(allowed)}, got {value!r}")
        device_request(self.devices)
        require(self.num_nodes >= 1, f"train.num_nodes must be >= 1, got {self.num_nodes}")


@dataclass(frozen=True)
class MonitorConfig(StrictConfig):
    owner: ClassVar[str] = "monitor"

    every_n_steps: int = 100
    eps: float = 0.1
    probe_size: int = 8  # validation examples in the fixed probe batch
    # their first tokens, at most: exact spectra cost T^3 per head (a step ~T), so at
    # width 512 x 8 layers x T = 1024 a probe of 512 tokens took 21% of the training time
    # and one of 256 keeps it under the monitor's 5% (docs/CONFIG.md, "monitor")
    probe_len: int = 256
    histograms: bool = True

    def validate(self) -> None:
        greater_than_zero("monitor", every_n_steps=self.every_n_steps,
                          probe_size=self.probe_size, probe_len=self.probe_len)
        require(0 < self.eps < 1, f"monitor.eps must be in (0, 1), got {self.eps}")


def parse_section(raw: Any, cls: type[StrictConfig], section: str) -> StrictConfig:
    """One section from its YAML mapping (None: all defaults); unknown keys are named as
    `section.key`, with a suggestion when one is close."""
    if raw is None:
        raw = {}
    require(isinstance(raw, dict),
            f"{section} must be a mapping of keys to values, got {raw!r}")
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
