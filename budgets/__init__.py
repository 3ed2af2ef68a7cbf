"""Rank-budget accounting: declared budgets, effective-rank metrics, probes and reports.

budgets knows nothing of zoo or Lightning: the probes read any model whose blocks offer
`budget`, `mixing_matrices`, `weight_matrices`, `init_cache` and `inference_state`
(optionally `key_value_heads`; budgets.hf.probe probes a loaded Hugging Face model the same
way, and probe_torch_model any model that attends through F.scaled_dot_product_attention).
budgets measures and returns data; loading files and rendering tables are the CLI's
(train/hf/__init__.py, train/render/__init__.py).
"""

from .advice.annotate import annotate
from .advice.verdicts import VERDICTS, VerdictThresholds
from .budget import AXES, AXIS_OF_QUANTITY, RankBudget, attention_budget, past_future_cap
from .capture.sdpa import capture_sdpa
from .probe.blocks import MATFREE_FROM, ProbeProgress, is_probeable, probe_model, probeable_blocks
from .probe.heads import head_stats
from .probe.own import probe_torch_model, report_of_model
from .probe.streams import MASSIVE_RATIO, kv_head_figures, residual_figures
from .rank.adapters import adapter_ranks, lowrank_singular_values
from .rank.matfree import AttentionMixing, FactoredMixing, operator_metrics
from .rank.metrics import METRICS, rank_metrics, singular_values, spectrum_metrics
from .rank.spectra import product_spectrum, spectrum
from .report.document import REPORT_SCHEMA_VERSION, build_report, load_report, to_json

__all__ = [
    "AXES",
    "AXIS_OF_QUANTITY",
    "AttentionMixing",
    "FactoredMixing",
    "MASSIVE_RATIO",
    "MATFREE_FROM",
    "METRICS",
    "ProbeProgress",
    "REPORT_SCHEMA_VERSION",
    "RankBudget",
    "VERDICTS",
    "VerdictThresholds",
    "annotate",
    "attention_budget",
    "past_future_cap",
    "adapter_ranks",
    "build_report",
    "capture_sdpa",
    "head_stats",
    "is_probeable",
    "kv_head_figures",
    "load_report",
    "operator_metrics",
    "lowrank_singular_values",
    "probe_model",
    "probe_torch_model",
    "probeable_blocks",
    "product_spectrum",
    "rank_metrics",
    "report_of_model",
    "residual_figures",
    "singular_values",
    "spectrum",
    "spectrum_metrics",
    "to_json",
]
