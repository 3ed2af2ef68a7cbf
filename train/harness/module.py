"""The LightningModule: a DecoderLM trained with cross-entropy at the labelled positions."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from ..data import IGNORE, accuracy, accuracy_by_kv_pairs
from ..lm.decoder import build_model
from .devices import check_shardable
from .optim import build_optimizer, build_schedule
from .sharding import is_sharded, recompute_layers, shard


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite: the run stops rather than train on."""


class LMModule(L.LightningModule):
    def __init__(self, config: dict[str, Any]):
        super().__init__()
        self.save_hyperparameters()  # hparams.config: the resolved variant config
        self.config = config
        self.model = build_model(config)
        self._micro_losses: list[torch.Tensor] = []  # this step's so far (_step_loss)

    def configure_model(self) -> None:
        """Called by Lightning on every process once it is set up, for every strategy:
        train.activation_checkpointing recomputes each layer in the backward; under
        train.strategy fsdp (a device mesh set) every layer is sharded, then the root
        (train/harness/sharding.py)."""
        t = self.config.get("train", {})
        if t.get("activation_checkpointing", False):
            recompute_layers(self.model)
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh["data_parallel"], t.get("precision", "32-true"))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: [B, T]
        return self.model(tokens)  # [B, T, vocab]

    def _loss(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, labels = batch  # [B, T], [B, T]
        logits = self.model(tokens)  # [B, T, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        return loss, logits

    def _aux_loss(self) -> torch.Tensor | None:
        """Sum of the auxiliary losses the blocks set in the last forward (MoE balancing)."""
        terms = [b.aux_loss for b in self.model.blocks if getattr(b, "aux_loss", None) is not None]
        return torch.stack(terms).sum() if terms else None

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        self.model.set_step(self.global_step)  # before the forward: a warm-up reads it
        loss, _ = self._loss(batch)
        self._check_finite(loss)
        aux = self._aux_loss()
        step_loss = self._step_loss(loss)
        if step_loss is not None and self._reads_train_scalars(self.global_step + 1):
            # logger=False: train/harness/checkpoint.py's TrainScalars writes them to
            # TensorBoard, before the step's checkpoint (Lightning would write them after it);
            # the mean over ranks is the global batch's loss (each holds an equal share)
            self.log("train/loss", step_loss, prog_bar=True, logger=False, sync_dist=True)
            if aux is not None:  # logged apart, so train/loss stays comparable across variants
                self.log("train/aux_loss", aux, logger=False)
            self.log("train/lr", self.optimizers().param_groups[0]["lr"], logger=False)
        return loss if aux is None else loss + aux

    def _step_loss(self, loss: torch.Tensor) -> torch.Tensor | None:
        """The loss of the optimizer step this micro-batch belongs to: the mean of its
        train.accumulate_grad_batches micro-batches' (equal shares of the step's batch),
        at the last of them; None before it."""
        self._micro_losses.append(loss.detach())
        if len(self._micro_losses) < self.config.get("train", {}).get("accumulate_grad_batches",
                                                                       1):
            return None
        step_loss = torch.stack(self._micro_losses).mean()
        self._micro_losses = []
        return step_loss

    def _reads_train_scalars(self, step: int) -> bool:
        """Whether anything reads the train/* scalars of the update that makes `step`:
        TrainScalars (every log_every_n_steps), the validation line, the checkpoint's
        metrics and the final ones. A Lightning log costs about a millisecond, a few % of
        a small model's step, so the steps between are not logged (the progress bar shows
        the last logged value)."""
        t = self.config.get("train", {})
        every = (t.get("log_every_n_steps", 1), t.get("val_every_n_steps", 1),
                 t.get("checkpoint_every_n_steps", 1))
        return step >= t.get("max_steps", step) or any(step % n == 0 for n in every)

    def _check_finite(self, loss: torch.Tensor) -> None:
        # checked before the optimizer step, so no checkpoint ever holds the weights the
        # bad loss would have produced; the last one written is the last good one
        if not torch.isfinite(loss):
            raise NonFiniteLoss(
                f"variant {self.config.get('variant', '?')!r}: training loss is "
                f"{loss.item()} at step {self.global_step}; stopped (lower train.lr, or "
                "check the data)")

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # A finite loss can still take a step that overflows the weights (a too-high lr);
        # stop here, before the checkpoint and the rank monitor of this step see them. One
        # sum per tensor is the quick test (NaN and inf carry through a sum; isfinite is
        # several times slower on CPU) and one sync on a GPU; the exact test names them.
        with torch.no_grad():
            if torch.stack([p.sum() for p in self.model.parameters()]).isfinite().all():
                return
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # else a sum overflowed, every weight finite
            raise NonFiniteLoss(
                f"variant {self.config.get('variant', '?')!r}: the update at step "
                f"{self.global_step} made {len(bad)} weight tensors non-finite ({bad[0]}, ...); "
                "stopped (lower train.lr)")

    def validation_step(self, batch, batch_idx: int) -> None:
        loss, logits = self._loss(batch)
        acc, count = accuracy(logits, batch[1])
        # sync_dist: under DDP every rank validates the whole split (train/harness/fit.py turns
        # Lightning's distributed sampler off), so the mean over ranks is its figure
        self.log("val/loss", loss, prog_bar=True, batch_size=batch[0].shape[0], sync_dist=True)
        # weighted by the number of query positions, so the epoch value is exact
        self.log("val/accuracy", acc, prog_bar=True, batch_size=max(count, 1), sync_dist=True)
        data = self.config.get("data", {})
        if data.get("task", "mqar") == "mqar":  # per number of key-value pairs
            pairs = data.get("val_kv_pairs") or [data.get("num_kv_pairs")]
            for n, (acc_n, count_n) in accuracy_by_kv_pairs(logits, batch[1], pairs).items():
                self.log(f"val/accuracy/kv{n}", acc_n, batch_size=count_n, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        # The loggers' x-axis for the validation figures (Lightning takes a logged "step"
        # as it): the validated step, as the console and the rank monitor show it, where
        # Lightning would put them one step before it (global_step - 1) during a fit
        self.log("step", float(self.global_step), sync_dist=True)

    def configure_optimizers(self):
        t = self.config["train"]
        if is_sharded(self.model):  # however the config got here (a sweep, a variant)
            check_shardable(t.get("strategy", "fsdp"), t.get("optimizer", "adamw"))
        optimizer = build_optimizer(self.model, t)
        schedule = build_schedule(optimizer, t)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
