"""`rankzoo train` as a distributed launch for tests/train/harness/test_fsdp.py, with two
test-only hooks added to every Trainer the harness builds:

- RANKZOO_TEST_SHARDS=DIR: each rank writes DIR/rank<r>.json at the end of training:
  per parameter of the model its type, the elements this rank holds and the whole
  tensor's (as they were at the start), and the dtype of the first layer's MLP weight as
  its forward saw it;
- RANKZOO_TEST_KILL_AT=K: global rank zero sends SIGKILL to its process group (the
  launcher and the ranks it started) once step K's checkpoint is written, as a node that
  dies would.

Lightning's launcher re-executes this script for the other ranks, so the hooks reach them.
"""

import json
import os
import signal
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback

import train.harness.fit as fit
from train.cli import main


class Shards(Callback):
    def __init__(self, out: Path):
        self.out, self.held, self.seen = out, {}, set()

    def on_train_start(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        up = pl_module.model.layers[0].mlp.up
        up.register_forward_pre_hook(lambda module, args: self.seen.add(str(module.weight.dtype)))
        held = self.held
        for name, p in pl_module.model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            held[name] = {"type": type(p).__name__, "local": local.numel(), "whole": p.numel(),
                          "placements": [str(s) for s in getattr(p, "placements", ())]}

    def on_train_end(self, trainer, pl_module) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(
            json.dumps({"parameters": self.held, "compute_dtypes": sorted(self.seen)}))


class KillAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        saver = next(c for c in trainer.callbacks if isinstance(c, fit.StepCheckpoint))
        if trainer.is_global_zero and saver.saved_step == self.step:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def make_trainer(*args, **kwargs):
    trainer = plain_make_trainer(*args, **kwargs)
    if "RANKZOO_TEST_SHARDS" in os.environ:
        trainer.callbacks.append(Shards(Path(os.environ["RANKZOO_TEST_SHARDS"])))
    if "RANKZOO_TEST_KILL_AT" in os.environ:  # after StepCheckpoint: its save comes first
        trainer.callbacks.append(KillAt(int(os.environ["RANKZOO_TEST_KILL_AT"])))
    return trainer


plain_make_trainer, fit.make_trainer = fit.make_trainer, make_trainer

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
