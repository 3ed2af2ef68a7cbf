"""The harness: a decoder LM around any zoo block, data (MQAR, low-rank Markov, byte-level
text), Lightning training, the CLI.

Importing `train` stays light (no Lightning): `train.harness.module`, `train.harness.callbacks`,
`train.harness.fit` and the stages above it (`train.experiment.stages`, `train.experiment.finetune`) import Lightning when
they are imported themselves.
"""

from .config import Experiment, load_experiment, parse_experiment
from .data import MarkovSpec, MQARSpec, TextSpec, make_loaders, make_mqar, mqar_loaders
from .lm.decoder import DecoderLM

__all__ = ["DecoderLM", "Experiment", "MQARSpec", "MarkovSpec", "TextSpec", "load_experiment",
           "make_loaders", "make_mqar", "mqar_loaders", "parse_experiment"]
