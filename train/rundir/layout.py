"""The names of a run directory's files, in one place.

    runs/<experiment>/experiment.yaml      EXPERIMENT_FILE
    runs/<experiment>/<variant>/           VariantFiles(vdir): config, checkpoint, ranks,
                                           report, status, diverged

Every stage that writes a run and every reader of one takes its paths from here, so that
the writer and the readers cannot drift apart. What each file holds is in
docs/RUN_DIRECTORY.md; reading them back is train/rundir/read.py (the checkpoint too:
load_checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXPERIMENT_FILE = "experiment.yaml"  # the resolved experiment, at runs/<experiment>/
CONFIG_FILE = "config.yaml"  # the resolved variant config, its params and backends used
CHECKPOINT_FILE = "checkpoints/last.ckpt"  # a run's one checkpoint
RANKS_FILE = "ranks.jsonl"  # one rank measurement per line
REPORT_FILE = "report.json"  # the run's report (schema rankzoo.report)
STATUS_FILE = "status.json"  # running / finished / stopped / diverged at step k
EVAL_FILE = "eval.json"  # rankzoo eval's lm-evaluation-harness scores (schema rankzoo.eval)
DIVERGED_FILE = "diverged.txt"  # an older sweep run whose loss went NaN (status.json says so now)
# a directory holding any of these is a variant's (train/rundir/read.py is_variant_dir)
RESULT_FILES = (REPORT_FILE, RANKS_FILE, CONFIG_FILE)


@dataclass(frozen=True)
class VariantFiles:
    """The files of one variant directory: a variant, a sweep's grid point or a fine-tune."""

    dir: Path

    def __post_init__(self):
        object.__setattr__(self, "dir", Path(self.dir))

    @property
    def config(self) -> Path:
        return self.dir / CONFIG_FILE

    @property
    def checkpoint(self) -> Path:
        return self.dir / CHECKPOINT_FILE

    @property
    def ranks(self) -> Path:
        return self.dir / RANKS_FILE

    @property
    def report(self) -> Path:
        return self.dir / REPORT_FILE

    @property
    def status(self) -> Path:
        return self.dir / STATUS_FILE

    @property
    def eval(self) -> Path:
        return self.dir / EVAL_FILE

    @property
    def diverged(self) -> Path:
        return self.dir / DIVERGED_FILE
