"""The data tasks, seeded, one module each: train/data/mqar.py (multi-query associative
recall), train/data/markov.py (a low-rank Markov language), train/data/text.py (byte-level
text); train/data/conventions.py holds what their examples share (IGNORE, accuracy, the
validation seed) and train/data/loaders.py any task's splits, DataLoaders and resumable
train order. The names are re-exported here, where the rest of train imports them from.
"""

from .conventions import IGNORE, VAL_SEED_OFFSET, accuracy
from .loaders import EpochBatches, make_loaders, make_splits, mqar_loaders, world
from .markov import (
    MarkovSpec,
    entropy,
    make_markov,
    markov_baselines,
    markov_transitions,
    stationary_distribution,
)
from .mqar import (
    MQARSpec,
    accuracy_by_kv_pairs,
    make_mqar,
    make_mqar_mix,
    make_mqar_val,
    permute_tokens,
)
from .text import BYTE_VOCAB, STDLIB, TextSpec, read_text_bytes, text_splits

__all__ = [
    "BYTE_VOCAB", "IGNORE", "STDLIB", "VAL_SEED_OFFSET", "EpochBatches", "MQARSpec", "MarkovSpec",
    "TextSpec", "accuracy", "accuracy_by_kv_pairs", "entropy", "make_loaders", "make_markov",
    "make_mqar", "make_mqar_mix", "make_mqar_val", "make_splits", "markov_baselines",
    "markov_transitions", "mqar_loaders", "permute_tokens", "read_text_bytes",
    "stationary_distribution", "text_splits", "world",
]
