"""wlb.torch.hf.WlbTrainer with the real transformers Trainer (and accelerate): two epochs of
packed steps, each epoch in its own order, the step's token count as num_items_in_batch, empty
micro-batches skipped, and a resume from a checkpoint that trains exactly as the uninterrupted
run. Tiny model on the CPU (nothing downloaded)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("torchdata")

import wlb.torch.hf as wlb_hf  # noqa: E402
from wlb.torch import PackedBatchSampler, PackedCollate  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PP, CONTEXT = 2, 64


def corpus(seed=3, documents=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 61, size=int(n)) for n in rng.integers(1, 150, size=documents)]


def tiny_model():
    config = transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


class RecordingCollate(PackedCollate):
    """PackedCollate(format="hf") that logs each micro-batch's pieces."""

    def __init__(self):
        super().__init__(format="hf")
        self.seen = []

    def __call__(self, pieces):
        self.seen.append([(int(d), int(o), len(t)) for d, o, t in pieces])
        return super().__call__(pieces)


def sampler_of(docs, packer="wlb"):
    return PackedBatchSampler([len(d) for d in docs], pp=PP, dp=1, rank=0, context=CONTEXT,
                              packer=packer, seed=5)


def epoch_batches(docs, epoch, packer="wlb"):
    s = sampler_of(docs, packer)
    s.set_epoch(epoch)
    return [[(int(d), int(o), int(n)) for d, o, n in mb] for mb in s]


def make_trainer(tmp_path, docs, max_steps, save_steps, packer="wlb"):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, gradient_accumulation_steps=PP,
        per_device_train_batch_size=1, learning_rate=1e-2, lr_scheduler_type="constant",
        save_strategy="steps", save_steps=save_steps, logging_steps=1, report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, save_only_model=False)
    collate = RecordingCollate()
    trainer = wlb_hf.WlbTrainer(model=tiny_model(), args=args, train_dataset=docs,
                                sampler=sampler_of(docs, packer), data_collator=collate)
    return trainer, collate


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_two_epochs_then_resume_trains_as_the_uninterrupted_run(tmp_path):
    docs = corpus(documents=16)  # 8 steps an epoch: few steps and checkpoints keep CI fast
    first, second = epoch_batches(docs, 0), epoch_batches(docs, 1)
    assert first != second  # the epochs' orders differ, so set_epoch is observable
    steps = (len(first) + len(second)) // PP
    assert len(first) % PP == 0 and steps >= 6
    trainer, collate = make_trainer(tmp_path / "full", docs, steps, save_steps=2)
    recorded = []
    forward = trainer.compute_loss

    def compute_loss(model, inputs, num_items_in_batch=None, **kwargs):
        recorded.append((int((inputs["labels"][:, 1:] != -100).sum()), int(num_items_in_batch)))
        return forward(model, inputs, num_items_in_batch=num_items_in_batch, **kwargs)

    trainer.compute_loss = compute_loss
    trainer.train()
    assert trainer.state.global_step == steps
    assert collate.seen == first + second  # epoch 0, then epoch 1 in its own order
    # Each non-empty micro-batch's loss is divided by its step's labelled tokens.
    nonempty = [mb for mb in first + second if mb]
    assert len(recorded) == len(nonempty)
    at = 0
    for k in range(0, len(first + second), PP):
        step = recorded[at:at + len([mb for mb in (first + second)[k:k + PP] if mb])]
        assert all(passed == sum(own for own, _ in step) for _, passed in step), step
        at += len(step)
    assert at == len(recorded)
    full = weights(trainer.model)

    # Resume from a checkpoint inside the second epoch: the same batches follow, the same weights.
    checkpoint = next(c for c in range(2, steps, 2) if c * PP > len(first))
    resumed, collate2 = make_trainer(tmp_path / "full", docs, steps, save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{checkpoint}"))
    assert collate2.seen == (first + second)[checkpoint * PP:]
    assert torch.allclose(weights(resumed.model), full, rtol=0, atol=1e-6)


def test_resume_at_an_epoch_end_starts_the_next_epoch(tmp_path):
    docs = corpus(seed=4, documents=24)
    first, second = epoch_batches(docs, 0), epoch_batches(docs, 1)
    boundary = len(first) // PP
    trainer, _ = make_trainer(tmp_path, docs, boundary + 2, save_steps=boundary)
    trainer.train()
    resumed, collate = make_trainer(tmp_path, docs, boundary + 2, save_steps=boundary)
    resumed.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{boundary}"))
    assert collate.seen == second[:2 * PP]


def test_empty_micro_batch_is_skipped(tmp_path):
    docs = corpus(seed=6, documents=10)
    trainer, _ = make_trainer(tmp_path, docs, 1, save_steps=10)
    empty = PackedCollate(format="hf")([])
    before = weights(trainer.model).clone()
    loss = trainer.training_step(trainer.model, empty, num_items_in_batch=torch.tensor(5))
    assert float(loss) == 0.0 and torch.equal(weights(trainer.model), before)
    assert all(p.grad is None or not p.grad.any() for p in trainer.model.parameters())


def test_arguments_are_checked(tmp_path):
    docs = corpus(seed=6, documents=10)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2,
                                          gradient_accumulation_steps=PP + 1, report_to=[],
                                          use_cpu=True)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps \(3\) must be the "
                                         r"sampler's pp \(2\)"):
        wlb_hf.WlbTrainer(model=tiny_model(), args=args, train_dataset=docs,
                          sampler=sampler_of(docs))
    with pytest.raises(TypeError, match="sampler must be a PackedBatchSampler, got list"):
        wlb_hf.WlbTrainer(model=tiny_model(), args=args, train_dataset=docs, sampler=[])
    args = transformers.TrainingArguments(output_dir=str(tmp_path), num_train_epochs=2,
                                          gradient_accumulation_steps=PP, report_to=[],
                                          use_cpu=True)
    with pytest.raises(ValueError, match="needs TrainingArguments\\(max_steps=...\\) > 0"):
        wlb_hf.WlbTrainer(model=tiny_model(), args=args, train_dataset=docs,
                          sampler=sampler_of(docs))


def test_resume_from_a_checkpoint_without_the_loader_state_is_refused(tmp_path):
    docs = corpus(seed=6, documents=10)
    trainer, _ = make_trainer(tmp_path, docs, 2, save_steps=1)
    trainer.train()
    os.remove(tmp_path / "checkpoint-1" / "wlb_loader_rank0.pt")
    again, _ = make_trainer(tmp_path, docs, 2, save_steps=1)
    with pytest.raises(ValueError, match="has no wlb_loader_rank0.pt"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_online_calibration_is_measured_ended_and_checkpointed(tmp_path):
    """With a calibration: every non-empty micro-batch is measured, every optimizer step ends a
    calibration step, fits come, and a resume loads the calibration saved at the checkpoint, so
    the steps planned with the checkpoint's fit are the uninterrupted run's."""
    from wlb.torch import OnlineCalibration
    docs = corpus(seed=8, documents=80)

    def run(path, resume=None):
        calibration = OnlineCalibration(refit_every=4, window=8, min_samples=8)
        # wlb's plans: the refit counts below are those of its micro-batches.
        sampler = PackedBatchSampler([len(d) for d in docs], pp=PP, dp=1, rank=0,
                                     context=CONTEXT, packer="wlb", seed=5,
                                     calibration=calibration)
        args = transformers.TrainingArguments(
            output_dir=str(path), max_steps=16, gradient_accumulation_steps=PP,
            per_device_train_batch_size=1, save_strategy="steps", save_steps=8, report_to=[],
            use_cpu=True, seed=0, disable_tqdm=True)
        collate = RecordingCollate()
        trainer = wlb_hf.WlbTrainer(model=tiny_model(), args=args, train_dataset=docs,
                                    sampler=sampler, data_collator=collate)
        trainer.train(resume_from_checkpoint=resume)
        return calibration, collate.seen

    calibration, seen = run(tmp_path)
    assert calibration.steps_ended == 16
    # The refit after step 4 has steps 0-2's 6 measurements (read a step late), fewer than
    # min_samples; the later ones fit.
    assert calibration.refits == 4 and calibration.refits_skipped == 1, calibration.last_error
    assert calibration.fits() and calibration.last_fit.samples >= 8
    resumed, seen2 = run(tmp_path, resume=str(tmp_path / "checkpoint-8"))
    assert resumed.steps_ended == 16
    # Steps 9-12 are planned with the fit made at the end of step 8, in the checkpoint.
    assert seen2[:4 * PP] == seen[8 * PP:12 * PP]
    state = torch.load(tmp_path / "checkpoint-8" / "wlb_loader_rank0.pt", weights_only=False)
    assert state["calibration"]["steps_ended"] == 8


@pytest.mark.parametrize("packer", ["wlb", "wlb-refine", "wlb-lookahead", "original"])
def test_no_empty_micro_batch_before_the_last_step(packer):
    """What a Hugging Face model needs (it cannot run 0 tokens): every step but an epoch's last
    has PP non-empty micro-batches. Heavy-tailed streams (100 to 264K tokens, log-uniform) at
    S = 2K-8K, where issue 58 saw empty micro-batches mid-epoch."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        context = int(rng.choice([2048, 4096, 8192]))
        lengths = np.exp(rng.uniform(np.log(100), np.log(264000), size=300)).astype(np.int64)
        pp = 4
        sampler = PackedBatchSampler(lengths, pp=pp, dp=1, rank=0, context=context, packer=packer,
                                     seed=seed)
        batches = list(sampler)
        steps = [batches[k:k + pp] for k in range(0, len(batches), pp)]
        for index, step in enumerate(steps[:-1]):
            assert all(step), (f"seed {seed}, S = {context}: step {index} of {len(steps)} has an "
                               "empty micro-batch")
