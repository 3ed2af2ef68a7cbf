"""The rank monitor in Hugging Face's Trainer: a TrainerCallback that measures on the main
process every n optimizer steps and at the end of training (train/monitor/core.py).

    monitor = Monitor(probe_batch, "runs/mine/llama", every_n_steps=50, tensorboard=True)
    trainer = Trainer(model, args, ..., callbacks=[trainer_callback(monitor)])

The model is called as `model(input_ids=tokens, use_cache=False)` unless the monitor was
given another `forward`. transformers is imported when the callback is made, not before.
"""

from __future__ import annotations

from ..monitor.core import Monitor
from .model_dir import import_transformers


def _hf_forward(model, tokens):
    return model(input_ids=tokens, use_cache=False)


def trainer_callback(monitor: Monitor):
    """A transformers.TrainerCallback driving `monitor`."""
    transformers = import_transformers()
    if monitor.forward is None:
        monitor.forward = _hf_forward

    class RankMonitorCallback(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.is_world_process_zero and model is not None:
                monitor.step(model, state.global_step)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if state.is_world_process_zero and model is not None:
                monitor.finish(model, state.global_step)

    return RankMonitorCallback()
