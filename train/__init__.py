"""The harness: a decoder LM around any zoo block, data (MQAR, low-rank Markov, byte-level
text), Lightning training, the CLI.

Importing `train` stays light (no Lightning): `train.module`, `train.callbacks`,
`train.fit` and the stages above it (`train.run`, `train.finetune`) import Lightning when
they are imported themselves.
"""

from .config import Experiment, load_experiment, parse_experiment
from .data import MarkovSpec, MQARSpec, TextSpec, make_loaders, make_mqar, mqar_loaders
from .model import DecoderLM

__all__ = ["DecoderLM", "Experiment", "MQARSpec", "MarkovSpec", "TextSpec", "load_experiment",
           "make_loaders", "make_mqar", "mqar_loaders", "parse_experiment"]
