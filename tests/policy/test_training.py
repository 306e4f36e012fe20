"""SFT on fused quaternions with the tiny model: full fine-tuning and LoRA both produce a loadable checkpoint."""

import json

import pytest

from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.models import load_tokenizer
from flywheel.policy.sft import TrainConfig, sft_examples, train_sft
from tests.fakes import make_traj


def test_examples_are_fused_one_per_step():
    rows = sft_examples([make_traj(n=3)], lambda t: "instr")
    assert len(rows) == 3
    last_prompt = rows[2]["prompt"][1]["content"]
    assert "p0" in last_prompt and "p1" in last_prompt and "e0" not in last_prompt  # only plans in history
    assert rows[2]["completion"][0]["content"] == "Thought: e2\nPlan: p2\nAction: a2"


@pytest.mark.parametrize("lora", [False, True])
def test_train_sft_writes_a_loadable_checkpoint(tmp_path, tiny, lora, capsys):
    rows = sft_examples([make_traj(n=3), make_traj(task="t2", n=2)], lambda t: "instr")
    # max_steps 2 rounds to one whole pass over the 5 examples: 3 steps of 2 (TrainConfig.whole_passes)
    res = train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=2, batch_size=2, learning_rate=1e-3, lora=lora, lora_r=4))
    assert res.n_examples == 5 and res.steps == 3 and res.train_loss > 0
    # each trained answer's length in tokens, as the policy generates it (no chat markers)
    tok = load_tokenizer(tiny)
    assert res.answer_tokens == tuple(len(tok(r["completion"][0]["content"], add_special_tokens=False)["input_ids"])
                                      for r in rows)
    assert all(n > 3 for n in res.answer_tokens)
    assert "'loss'" not in capsys.readouterr().out  # the Trainer's log dicts go to the log, not stdout
    assert json.loads((tmp_path / "ck" / "training.json").read_text())["config"]["lora"] is lora
    assert not (tmp_path / "ck.partial").exists()
    gen = TransformersGenerator(str(tmp_path / "ck"))
    [out] = gen.generate([rows[0]["prompt"]], temperature=0.0, max_new_tokens=4)
    assert out.completion_tokens <= 4


def test_too_long_examples_are_dropped_not_truncated(tmp_path, tiny):
    rows = sft_examples([make_traj(n=2)], lambda t: "instr " * 400)
    with pytest.raises(ValueError, match="longer than max_length"):
        train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, max_length=64))


def test_empty_dataset_is_a_clear_error(tmp_path, tiny):
    with pytest.raises(ValueError, match="empty"):
        train_sft(tiny, [], tmp_path / "ck")


@pytest.mark.parametrize("on", [False, True])
def test_gradient_checkpointing_is_what_the_config_says(tmp_path, tiny, monkeypatch, on):
    """TRL turns activation recomputation on by default; a small CPU model must not pay for it."""
    import trl

    seen = {}
    real = trl.SFTTrainer.train

    def spy(self, *args, **kwargs):
        seen["args"] = self.args.gradient_checkpointing
        seen["model"] = bool(getattr(self.model, "is_gradient_checkpointing", False))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(trl.SFTTrainer, "train", spy)
    rows = sft_examples([make_traj(n=2)], lambda t: "instr")
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, batch_size=2, gradient_checkpointing=on))
    assert seen["args"] is on
    if not on:
        assert seen["model"] is False  # nothing switched it on behind the config's back


@pytest.mark.parametrize("grouped", [False, True])
def test_group_by_length_batches_examples_of_similar_length(tiny, tmp_path, monkeypatch, grouped):
    import trl
    from transformers.trainer_pt_utils import LengthGroupedSampler

    seen = {}
    real = trl.SFTTrainer.train

    def spy(self, *args, **kwargs):
        seen["sampler"] = self._get_train_sampler()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(trl.SFTTrainer, "train", spy)
    rows = sft_examples([make_traj(n=4)], lambda t: "instr")
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, batch_size=2, group_by_length=grouped))
    assert isinstance(seen["sampler"], LengthGroupedSampler) is grouped


def test_micro_batches_train_the_same_steps_on_the_same_loss(tiny, tmp_path, monkeypatch):
    """A step of 4 as 4 micro-batches of 1 (gradient accumulation): as many optimizer steps, each a forward pass
    per example, and the same loss (the mean over every completion token of the step) up to float rounding."""
    import trl

    seen = []
    real = trl.SFTTrainer.train

    def spy(self, *args, **kwargs):
        seen.append((self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(trl.SFTTrainer, "train", spy)
    rows = sft_examples([make_traj(n=4), make_traj(task="t2", n=4)], lambda t: "instr")
    results = {micro: train_sft(tiny, rows, tmp_path / f"ck{micro}",
                                TrainConfig(max_steps=2, batch_size=4, micro_batch_size=micro, learning_rate=1e-3,
                                            order="given"))
               for micro in (None, 1)}
    assert seen == [(4, 1), (1, 4)]
    assert results[None].steps == results[1].steps == 2
    assert results[1].train_loss == pytest.approx(results[None].train_loss, rel=1e-4)


def test_a_micro_batch_that_does_not_divide_the_batch_is_a_clear_error(tiny, tmp_path):
    rows = sft_examples([make_traj(n=4)], lambda t: "instr")
    with pytest.raises(ValueError, match="must divide batch_size=4"):
        train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, batch_size=4, micro_batch_size=3))
    assert not (tmp_path / "ck").exists() and not (tmp_path / "ck.partial").exists()


def test_micro_batching_changes_the_fingerprint_only_when_it_splits_the_batch():
    from flywheel.policy.sft import training_fingerprint

    rows = sft_examples([make_traj(n=2)], lambda t: "instr")
    whole = training_fingerprint("m", rows, TrainConfig(micro_batch_size=None))
    assert training_fingerprint("m", rows, TrainConfig(micro_batch_size=8)) == whole  # as trained before the field
    assert training_fingerprint("m", rows, TrainConfig(micro_batch_size=1)) != whole
