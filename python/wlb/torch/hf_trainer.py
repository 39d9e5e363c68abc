"""``WlbTrainer``: ``transformers.Trainer`` on wlb's packed steps.

    sampler = PackedBatchSampler(lengths, pp=4, dp=world, rank=rank, context=4096,
                                 cost=wlb_hf.packing_cost(model))
    args = TrainingArguments(output_dir, max_steps=1000, gradient_accumulation_steps=4, ...)
    trainer = WlbTrainer(model=model, args=args, train_dataset=dataset, sampler=sampler)
    trainer.train()                      # trainer.train(resume_from_checkpoint=True) resumes

``train_dataset`` is the token dataset the lengths describe (``dataset[i]``: document i's token
ids; ``PackedPieces`` fetches the pieces) and the collator defaults to
``PackedCollate(format="hf")``. One optimizer step is one wlb step: the sampler's PP
micro-batches of this rank are the step's gradient accumulation (``gradient_accumulation_steps``
must equal ``sampler.pp``; under DP the sampler's ``dp`` and ``rank`` must be the Trainer's world
size and process index). The Trainer passes each step's labelled tokens as
``num_items_in_batch``, so the loss is the step's token-weighted mean.

What the Trainer cannot do for a sampler that plans as it goes, and ``WlbTrainer`` does:

- Epochs. The loader has no length (an epoch's step count is known at its end), so training
  runs ``max_steps`` steps, and the loader itself moves the sampler to its next epoch
  (``set_epoch``) each time one ends: the Trainer's own epoch count never reaches it.
- Empty micro-batches (an epoch's last step can hold fewer than PP micro-batches of tokens, see
  ``PackedBatchSampler``): ``training_step`` skips the forward and returns a zero loss; under
  DDP it back-propagates ``0 * sum(p.sum())`` so every rank joins the gradient reduction.
- Resume. The loader is a torchdata ``StatefulDataLoader``; its state (the sampler's included)
  is saved in every checkpoint (``wlb_loader_rank{i}.pt``) and loaded from the checkpoint
  ``train(resume_from_checkpoint=...)`` names, so a resumed run continues right after the last
  micro-batch trained, as the uninterrupted run. The Trainer's own batch skipping is turned
  off (``ignore_data_skip``): it would count batches from the start of the first epoch.
- Online calibration. With ``PackedBatchSampler(calibration=OnlineCalibration(...))`` each
  micro-batch's forward + backward is measured (``calibration.measure``), every optimizer step
  ends with ``calibration.end_step()``, and the calibration's own state (which the loader's copy
  may lack, see ``wlb.torch.calibration``) is saved in the checkpoint and loaded before the
  loader's. With dataloader workers give the calibration ``delay >= ceil(num_workers x
  prefetch_factor / PP)``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ._common import require_torch, torch
from .collate import PackedCollate, PackedPieces
from .sampler import PackedBatchSampler

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import Trainer, TrainerCallback
except ImportError as e:  # pragma: no cover - the hf extra installs both
    raise ImportError("wlb.torch.hf.WlbTrainer needs transformers, accelerate and torchdata "
                      "(pip install 'wlb[hf]')") from e

LOADER_STATE = "wlb_loader_rank{rank}.pt"


class _EpochLoader:
    """A ``StatefulDataLoader`` over the sampler that starts the sampler's next epoch whenever
    one has ended (the Trainer's ``set_epoch`` calls are ignored: its epochs are not the
    sampler's)."""

    def __init__(self, loader: "StatefulDataLoader", sampler: PackedBatchSampler):
        self.loader, self.sampler = loader, sampler
        self._ended = False  # the last iteration ran to the end of its epoch

    def set_epoch(self, epoch: int) -> None:
        """Ignored: the Trainer numbers its passes over a loader without a length, not the
        sampler's epochs."""

    def __iter__(self):
        for _ in range(2):  # a state saved at an epoch's very end yields nothing: go on at once
            if self._ended:
                self.sampler.set_epoch(self.sampler.epoch + 1)
            self._ended = False
            given = False
            for batch in self.loader:
                given = True
                yield batch
            self._ended = True
            if given:
                return

    def state_dict(self) -> Dict[str, Any]:
        return {"loader": self.loader.state_dict(), "ended": self._ended}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if set(state) != {"loader", "ended"}:
            raise ValueError(f"a WlbTrainer loader state has the keys ['ended', 'loader'], got "
                             f"{sorted(state)}")
        self.loader.load_state_dict(state["loader"])
        self._ended = bool(state["ended"])


class _EndStep(TrainerCallback):
    """Ends the calibration's step after each optimizer step (before a checkpoint is saved)."""

    def __init__(self, calibration):
        self.calibration = calibration

    def on_step_end(self, args, state, control, **kwargs):
        self.calibration.end_step()


class WlbTrainer(Trainer):
    """``transformers.Trainer`` whose training loader is ``sampler``'s packed micro-batches (see
    the module docstring). ``sampler``: a ``PackedBatchSampler`` over ``train_dataset``'s
    document lengths; ``data_collator`` defaults to ``PackedCollate(format="hf")``."""

    def __init__(self, *args: Any, sampler: PackedBatchSampler, **kwargs: Any):
        require_torch()
        if not isinstance(sampler, PackedBatchSampler):
            raise TypeError(f"sampler must be a PackedBatchSampler, got {type(sampler).__name__}")
        kwargs.setdefault("data_collator", PackedCollate(format="hf"))
        super().__init__(*args, **kwargs)
        a = self.args
        if a.gradient_accumulation_steps != sampler.pp:
            raise ValueError(f"gradient_accumulation_steps ({a.gradient_accumulation_steps}) must "
                             f"be the sampler's pp ({sampler.pp}): one optimizer step is one "
                             "packed step's micro-batches")
        if (sampler.dp, sampler.rank) != (a.world_size, a.process_index):
            raise ValueError(f"the sampler is rank {sampler.rank} of dp = {sampler.dp} but this "
                             f"process is rank {a.process_index} of {a.world_size}")
        if a.max_steps is None or a.max_steps <= 0:
            raise ValueError("WlbTrainer needs TrainingArguments(max_steps=...) > 0: a packed "
                             "epoch's step count is known only at its end")
        if self.train_dataset is None:
            raise ValueError("WlbTrainer needs the train_dataset the sampler's lengths describe")
        a.ignore_data_skip = True  # the loader's own state resumes (module docstring)
        self.sampler = sampler
        if sampler.calibration is not None:
            self.add_callback(_EndStep(sampler.calibration))
        self._wlb_loader: Optional[_EpochLoader] = None
        self._wlb_resumed_from: Optional[str] = None

    def get_train_dataloader(self) -> _EpochLoader:
        if self._wlb_loader is None:
            a = self.args
            workers = {"prefetch_factor": a.dataloader_prefetch_factor} if (
                a.dataloader_num_workers > 0 and a.dataloader_prefetch_factor) else {}
            loader = StatefulDataLoader(
                PackedPieces(self.train_dataset), batch_sampler=self.sampler,
                collate_fn=self.data_collator, num_workers=a.dataloader_num_workers,
                pin_memory=a.dataloader_pin_memory, **workers)
            self._wlb_loader = _EpochLoader(loader, self.sampler)
        return self._wlb_loader

    def training_step(self, model: Any, inputs: Dict[str, Any],
                      num_items_in_batch: Any = None) -> "torch.Tensor":
        if inputs["input_ids"].numel() > 0:
            if self.sampler.calibration is None:
                return super().training_step(model, inputs, num_items_in_batch)
            with self.sampler.calibration.measure(inputs):
                return super().training_step(model, inputs, num_items_in_batch)
        # An empty micro-batch: no forward (a model cannot run 0 tokens); under DDP a zero that
        # touches every parameter, so this rank joins the gradient reduction too.
        loss = torch.zeros((), device=self.args.device)
        if self.args.world_size > 1:
            model.train()
            zero = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            self.accelerator.backward(zero)
        return loss

    def _loader_state_path(self, checkpoint: str) -> str:
        return os.path.join(checkpoint, LOADER_STATE.format(rank=self.args.process_index))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        checkpoint = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self._wlb_loader is not None:
            os.makedirs(checkpoint, exist_ok=True)
            state = self._wlb_loader.state_dict()
            if self.sampler.calibration is not None:  # all measurements (waits on CUDA)
                state["calibration"] = self.sampler.calibration.state_dict()
            torch.save(state, self._loader_state_path(checkpoint))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self._wlb_resumed_from == resume_from_checkpoint:  # called again after wrapping
            return
        self._wlb_resumed_from = resume_from_checkpoint
        path = self._loader_state_path(resume_from_checkpoint)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {resume_from_checkpoint} has no {os.path.basename(path)}: "
                             "it was not saved by a WlbTrainer of this rank, so the sampler "
                             "cannot resume where it stopped")
        # The state holds numpy arrays and plain containers, written by this class.
        state = torch.load(path, weights_only=False)
        if self.sampler.calibration is not None:
            if "calibration" not in state:
                raise ValueError(f"checkpoint {resume_from_checkpoint} was saved without an "
                                 "OnlineCalibration, but the sampler has one")
            self.sampler.calibration.load_state_dict(state.pop("calibration"))  # before the loader
        self.get_train_dataloader().load_state_dict(state)
