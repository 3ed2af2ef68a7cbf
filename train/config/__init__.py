"""Experiment configs: YAML plus `key=value` overrides, strictly validated.

An experiment is one data task, one model spec and several variants that differ only in
their block. Every section is a frozen zoo.config.StrictConfig that rejects unknown keys
with a suggestion, and each variant's block config is built (without weights) while
loading, so a bad config fails before any training starts.

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
    sweep: {...}                          # optional: a grid of optimizer x lr x seed
    finetune: {...}                       # optional: a LoRA stage after training

Modules, each importing only those above it: yaml_parse (YAML text with located errors),
sections (data, model, train, monitor, match), stage_sections (the sweep and finetune
sections), experiment (Experiment, Variant), targets (a variant's LoRA targets), parse
(dict -> Experiment), load (YAML files and overrides). Of the rest of train/, the package
reads only the leaf packages data, lm and sizing.
"""

from .experiment import SECTIONS, Experiment, Variant
from .load import apply_override, load_experiment, yaml_load
from .parse import expand_sweep, parse_experiment
from .sections import (
    DataConfig,
    MatchConfig,
    ModelConfig,
    MonitorConfig,
    TrainConfig,
    check_data_keys,
    parse_section,
)
from .stage_sections import (
    SELECT_MODES,
    SWEEP_AXES,
    FinetuneConfig,
    SweepConfig,
    lora_name,
    run_name,
)
from .targets import linear_names, variant_targets

__all__ = ["SECTIONS", "SELECT_MODES", "SWEEP_AXES", "DataConfig", "Experiment",
           "FinetuneConfig", "MatchConfig", "ModelConfig", "MonitorConfig", "SweepConfig",
           "TrainConfig", "Variant", "apply_override", "check_data_keys", "expand_sweep",
           "linear_names", "load_experiment", "lora_name", "parse_experiment",
           "parse_section", "run_name", "variant_targets", "yaml_load"]
