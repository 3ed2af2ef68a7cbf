"""The data tasks, seeded, one module each: train/data/mqar.py (multi-query associative
recall), train/data/markov.py (a low-rank Markov language), train/data/text.py (text, as
bytes or through a tokenizer), train/data/tokens.py (pre-tokenized shards);
train/data/conventions.py holds what their examples share (IGNORE, accuracy, the
validation seed) and train/data/loaders.py any task's splits, DataLoaders and resumable
train order. Beside them: train/data/tokenizer.py (tokenizers loaded offline, a BPE
trained, text encoded), train/data/token_cache.py (text tokenized once),
train/data/shards.py (the shard formats, read and written), train/data/windows.py (seeded
windows of token arrays). The names are re-exported here, where the rest of train imports
them from.
"""

from .conventions import IGNORE, VAL_SEED_OFFSET, accuracy
from .loaders import EpochBatches, check_divides, make_loaders, make_splits, mqar_loaders, world
from .markov import (
    MarkovSpec,
    entropy,
    make_markov,
    markov_baselines,
    markov_transitions,
    stationary_distribution,
)
from .modadd import ModAddSpec
from .mqar import (
    MQARSpec,
    accuracy_by_kv_pairs,
    make_mqar,
    make_mqar_mix,
    make_mqar_val,
    permute_tokens,
)
from .shards import FORMATS as SHARD_FORMATS
from .shards import SUFFIX as SHARD_SUFFIX
from .shards import open_shard, token_dtype, write_shard
from .text import BYTE_VOCAB, STDLIB, TextSpec, expand_paths, read_text_bytes, text_splits
from .tokenizer import (
    Tokenizer,
    bpe_size,
    cache_root,
    encode_text,
    load_tokenizer,
    tokenizer_vocab_size,
    trained_bpe,
)
from .tokens import TokensSpec, tokens_splits

__all__ = [
    "BYTE_VOCAB", "IGNORE", "SHARD_FORMATS", "SHARD_SUFFIX", "STDLIB", "VAL_SEED_OFFSET",
    "EpochBatches", "MQARSpec", "MarkovSpec", "ModAddSpec", "TextSpec", "Tokenizer",
    "TokensSpec", "accuracy", "check_divides",
    "accuracy_by_kv_pairs", "bpe_size", "cache_root", "encode_text", "entropy", "expand_paths",
    "load_tokenizer", "make_loaders", "make_markov", "make_mqar", "make_mqar_mix",
    "make_mqar_val", "make_splits", "markov_baselines", "markov_transitions", "mqar_loaders",
    "open_shard", "permute_tokens", "read_text_bytes", "stationary_distribution",
    "text_splits", "token_dtype", "tokenizer_vocab_size", "tokens_splits", "trained_bpe",
    "world", "write_shard",
]
