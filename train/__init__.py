"""The harness: a decoder LM around any zoo block, data (MQAR, low-rank Markov, byte-level
text), Lightning training, the verbs behind the CLI, one subpackage per job (the map is in
docs/ARCHITECTURE.md).

Importing `train` stays light (no Lightning): only train/harness/ imports Lightning, and
only when its modules (or the stages that run them, train/experiment/stages.py and
train/experiment/finetune.py) are imported themselves.
"""

from .config import Experiment, load_experiment, parse_experiment
from .data import MarkovSpec, MQARSpec, TextSpec, make_loaders, make_mqar, mqar_loaders
from .lm.decoder import DecoderLM

__all__ = ["DecoderLM", "Experiment", "MQARSpec", "MarkovSpec", "TextSpec", "load_experiment",
           "make_loaders", "make_mqar", "mqar_loaders", "parse_experiment"]
