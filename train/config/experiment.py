"""The parsed experiment: its sections, its variants (a sweep's grid points expanded), and
the resolved config of each run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from zoo.config import StrictConfig

from ..lm.decoder import mlp_width
from .layers import LayerSpec, expand, unit_to_dict
from .sections import DataConfig, MatchConfig, ModelConfig, MonitorConfig, TrainConfig
from .stage_sections import FinetuneConfig, SweepConfig


@dataclass(frozen=True)
class Variant:
    """One variant: a zoo block name and its kwargs (block_defaults merged in), or a layer
    pattern (block "hybrid", its repeating `unit` of LayerSpecs, train/config/layers.py).
    In a sweep, each grid point is a Variant of its own whose `base` names the configured
    variant and whose `point` holds its optimizer, lr and seed."""

    name: str
    block: str
    block_kwargs: dict[str, Any]
    base: str = ""
    point: dict[str, Any] = field(default_factory=dict)
    # this variant's own optimizer settings over the train section's (VARIANT_TRAIN_KEYS):
    # block families are often trained at their own learning rate
    train: dict[str, Any] = field(default_factory=dict)
    # what this variant checks: {of, advice, state} (parse.py CHECK_KEYS), a suggestion the
    # report made for variant `of`; `rankzoo report` reads it back from config.yaml
    check: dict[str, Any] = field(default_factory=dict)
    unit: tuple[LayerSpec, ...] = ()  # a layer pattern's repeating unit; () for one block
    # this variant's own model settings over the model section's (parse.py
    # VARIANT_MODEL_KEYS: its MLP's kind, e.g. {"mlp": "swiglu"})
    model: dict[str, Any] = field(default_factory=dict)

    def layer_specs(self, n_layers: int) -> list[LayerSpec]:
        """One spec per layer: the unit repeated, or the one block in every layer."""
        if self.unit:
            return expand(self.unit, n_layers)
        return [LayerSpec(self.block, self.block, self.block_kwargs)] * n_layers

    def to_dict(self) -> dict[str, Any]:
        blocks = unit_to_dict(self.unit) if self.unit else {"block": self.block,
                                                            **self.block_kwargs}
        return {**blocks,
                **({"train": dict(self.train)} if self.train else {}),
                **({"model": dict(self.model)} if self.model else {}),
                **({"check": dict(self.check)} if self.check else {})}


SECTIONS: dict[str, type[StrictConfig]] = {
    "data": DataConfig, "model": ModelConfig, "train": TrainConfig, "monitor": MonitorConfig,
    "match": MatchConfig,
}


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
    finetune: FinetuneConfig | None = None  # a LoRA stage after training

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
        model = {**self.model.to_dict(), **v.model}
        if variant in self.d_mlp:
            model["d_mlp"] = self.d_mlp[variant]
        elif model["mlp"] != "gelu" and model["d_mlp"] is None:
            # written out: a reader that sizes the MLP from mlp_ratio alone sizes GELU's
            model["d_mlp"] = mlp_width(model["d_model"], model["mlp_ratio"], None, model["mlp"])
        train = {**self.train.to_dict(), **v.train,
                 **{k: v.point[k] for k in ("optimizer", "lr") if k in v.point}}
        config = {
            "experiment": self.name, "variant": variant, "seed": v.point.get("seed", self.seed),
            "data": {**self.data.to_dict(), "vocab_size": self.data.vocab_size},
            "model": model, **self._blocks(v, variant),
            "train": train, "monitor": self.monitor.to_dict(),
            "match": self.match.to_dict(),
        }
        if v.point:
            config["sweep"] = {"variant": v.base, **v.point}
        if v.check:
            config["check"] = dict(v.check)
        if self.data.intrinsic_rank is not None:
            config["data_intrinsic_rank"] = self.data.intrinsic_rank
        return config

    def _blocks(self, v: Variant, variant: str) -> dict[str, Any]:
        """A run config's blocks: `block` (name and kwargs) for one block in every layer;
        for a layer pattern, `layers` (one {name, **kwargs} per layer) and `pattern` (each
        layer's label)."""
        if not v.unit:
            return {"block": {"name": v.block, **v.block_kwargs, **self.state.get(variant, {})}}
        specs = v.layer_specs(self.model.n_layers)
        return {"layers": [{"name": s.block, **s.kwargs} for s in specs],
                "pattern": [s.label for s in specs]}

    def base_variants(self) -> dict[str, str]:
        """Configured variant -> the run that stands for it: itself, or in a sweep its
        first grid point (a sweep's grid points share a model)."""
        out: dict[str, str] = {}
        for name, v in self.variants.items():
            out.setdefault(v.base or name, name)
        return out

    def finetune_variants(self) -> list[str]:
        """The configured variants the fine-tune stage adapts (finetune.from_variants)."""
        return list(self.finetune.from_variants or self.base_variants())

    def finetune_view(self) -> Experiment:
        """The experiment as a fine-tune sees it: the second task's data, the merged train."""
        ft = self.finetune
        return dataclasses.replace(self, data=ft.data, train=ft.train_config(self.train))
