"""hf — Hugging Face ``Trainer`` users' way in: :class:`Trainer`, the same ``Trainer`` with the
model trained under a galvatron_fx plan.

    from galvatron_fx.hf import Trainer          # instead of transformers.Trainer
    trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=..., eval_dataset=...)
    trainer.train(); trainer.evaluate(); trainer.save_model("out")

launched with ``torchrun`` as a ``Trainer`` script is. Everything the user gives the ``Trainer``
keeps its meaning: the data loader, collator, per-device batch size (the plan's global batch is
``per_device_train_batch_size × world size``, each process passing the samples its data loader
gave it: ``inputs="rank"``), gradient accumulation, clipping (``max_grad_norm``, over every
parameter whatever its mesh), the optimizer and LR schedule (weight decay as the ``Trainer``
decides it, by the model's own parameter names), logging, evaluation and saving (the trained
weights go back into the model, whose ``save_pretrained`` writes them, and at the end of
``train()``: ``trainer.model`` is the trained model, as with the ``Trainer`` itself).

Contract: the model is compiled (:func:`galvatron_fx.compile`) when the ``Trainer`` first needs
it, on the first training batch's shapes (from the train dataset through the ``Trainer``'s own
collator, not its data loader: no sample is drawn from the run's order), on ``cluster`` (default:
this machine's CPU processes; on GPUs give a preset or a profile) with the search's keywords
(``plan``, ``memory_budget``, ``search``, ``precision``). The ``Trainer`` then steps the
compiled module instead of wrapping the model in ``DistributedDataParallel``: its backward
syncs the gradients (:mod:`galvatron_fx.runtime.user_loop`), its ``no_sync`` accumulates them,
batches of other shapes (an evaluation's last batch) run under the same plan
(:mod:`galvatron_fx.runtime.shapes`). A checkpoint the ``Trainer`` saves holds the model as
``save_pretrained`` writes it and, under ``galvatron_fx/``, the module's sharded parameters and
optimizer state (:meth:`~galvatron_fx.runtime.parallel_module.ParallelModule.save`), from which
``resume_from_checkpoint`` resumes under any plan.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

try:
    import transformers
except ImportError as e:  # pragma: no cover - transformers is what this module is for
    raise ImportError("galvatron_fx.hf needs transformers (pip install transformers accelerate)") from e

__all__ = ["Trainer"]

STATE_DIR = "galvatron_fx"


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` training its model under a galvatron_fx plan (see the module doc).
    Keywords besides the ``Trainer``'s: ``cluster``, ``plan``, ``memory_budget``, ``search``,
    ``precision`` (as :func:`galvatron_fx.compile` takes them)."""

    def __init__(self, *args, cluster=None, plan=None, memory_budget=None, search=None, precision=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._gfx = {"cluster": cluster, "plan": plan, "memory_budget": memory_budget, "search": search,
                     "precision": precision}
        self.pm = None
        # the module's loss is the mean over its batch: the Trainer scales it for accumulation itself
        self.model_accepts_loss_kwargs = False

    # ---- the compiled module -------------------------------------------------------------------
    def _example_batch(self) -> dict[str, Any]:
        dataset: Any = self.train_dataset if self.train_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("galvatron_fx.hf.Trainer plans on the first training batch: give a train_dataset")
        n = self.args.per_device_train_batch_size
        collate = self._get_collator_with_removed_columns(self.data_collator, description="planning")
        if hasattr(dataset, "column_names"):  # a datasets.Dataset: the columns the model takes
            dataset = self._remove_unused_columns(dataset, description="planning")
        return collate([dataset[i] for i in range(n)])

    def _compiled(self):
        if self.pm is not None:
            return self.pm
        import galvatron_fx as gfx

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("galvatron_fx.hf.Trainer runs under torchrun (a process group of the TrainingArguments' "
                             "distributed setup); launch the script with torchrun --nproc-per-node N")
        world = dist.get_world_size()
        cluster = self._gfx["cluster"]
        if cluster is None:
            if torch.cuda.is_available():
                raise ValueError("galvatron_fx.hf.Trainer(cluster=...) on GPUs: give a preset "
                                 "(galvatron_fx.Cluster.preset('dgx-h100', nodes=1)) or a measured profile")
            cluster = gfx.Cluster.local_cpu(world)
        with torch.random.fork_rng(devices=[]):  # planning draws nothing from the run's random streams
            batch = {k: v for k, v in self._example_batch().items() if isinstance(v, torch.Tensor)}
            n = next(iter(batch.values())).shape[0]
            self.pm = self._compile(gfx, cluster, batch, n * world)
        return self.pm

    def _compile(self, gfx, cluster, batch, global_batch_size):
        return gfx.compile(self.model, cluster, batch, global_batch_size=global_batch_size, inputs="rank",
                           plan=self._gfx["plan"], memory_budget=self._gfx["memory_budget"],
                           search=self._gfx["search"], precision=self._gfx["precision"])

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        # the compiled module owns its placement and gradient sync: no DistributedDataParallel
        return self._compiled()

    # ---- the step ------------------------------------------------------------------------------
    def create_optimizer(self, model=None):
        """The ``Trainer``'s optimizer and weight-decay groups (decided on the model's own
        parameter names), over the compiled module's parameters."""
        if self.optimizer is not None:
            return self.optimizer
        pm = self._compiled()
        decay = set(self.get_decay_parameter_names(self.model))
        named = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
        cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
        self.optimizer = cls([g for g in groups if g["params"]], **kwargs)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        pm = self._compiled()
        if return_outputs:
            out = pm(inputs, outputs=True)
            return out["loss"], out
        return pm(inputs)

    def _clip_grad_norm(self, model):
        return self._compiled().clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            grad_norm = self._compiled().clip_grad_norm_(float("inf"))
        return grad_norm.item() if hasattr(grad_norm, "item") else grad_norm

    def train(self, *args, **kwargs):
        """``Trainer.train``; then the trained weights back into ``trainer.model`` (every
        process: a collective), as a user of the ``Trainer`` finds them."""
        out = super().train(*args, **kwargs)
        if self.pm is not None:
            self.pm.to_module(self.model)
        return out

    # ---- evaluation ----------------------------------------------------------------------------
    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """The loss (the mean over every process's batch) and this process's rows of the logits."""
        pm = self._compiled()
        inputs = self._prepare_inputs(inputs)
        labels = inputs.get("labels")
        with torch.no_grad():
            if prediction_loss_only:
                return pm(inputs).detach(), None, None
            out = pm(inputs, outputs=True)
        logits = out.get("logits")
        if logits is not None:  # the gathered batch is every process's, in rank order: keep this one's
            n = next(v for v in inputs.values() if isinstance(v, torch.Tensor)).shape[0]
            logits = logits[dist.get_rank() * n:(dist.get_rank() + 1) * n]
        return out["loss"].detach(), logits, labels

    # ---- saving --------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The trained weights back into the model (every process: a collective), then the
        ``Trainer``'s own ``save_pretrained``."""
        if self.pm is not None:
            self.pm.to_module(self.model)
        super().save_model(output_dir, _internal_call=_internal_call)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        pm = self._compiled()
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # (accelerate's wrapper)
        pm.save(os.path.join(output_dir, STATE_DIR), optimizer, overwrite=True)
        if self.args.should_save and self.lr_scheduler is not None:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, transformers.trainer.SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        state = os.path.join(checkpoint, STATE_DIR)
        if not os.path.isdir(state):
            raise ValueError(f"{checkpoint} holds no {STATE_DIR}/ state: it was not saved by galvatron_fx.hf.Trainer")
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        self._compiled().load(state, optimizer)
        sched = os.path.join(checkpoint, transformers.trainer.SCHEDULER_NAME)
        if self.lr_scheduler is not None and os.path.isfile(sched):
            self.lr_scheduler.load_state_dict(torch.load(sched, weights_only=True))
