"""SFT on fused quaternions with the tiny model: full fine-tuning and LoRA both produce a loadable checkpoint."""

import json

import pytest
import torch

from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.models import cpu_has_bf16, load_tokenizer
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
    # the dtype the matmuls ran in is recorded (a block's identity): auto = bf16 autocast where the CPU has it
    assert res.compute_dtype == ("bfloat16" if torch.cuda.is_available() or cpu_has_bf16() else "float32")
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


@pytest.mark.parametrize("packing", ["tree", "per_step"])
@pytest.mark.parametrize("on", [False, True])
def test_gradient_checkpointing_is_what_the_config_says(tmp_path, tiny, monkeypatch, on, packing):
    """TRL turns activation recomputation on by default; a small CPU model must not pay for it."""
    import transformers

    seen = {}
    real = transformers.Trainer.train

    def spy(self, *args, **kwargs):
        seen["args"] = self.args.gradient_checkpointing
        seen["model"] = bool(getattr(self.model, "is_gradient_checkpointing", False))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "train", spy)
    rows = sft_examples([make_traj(n=2)], lambda t: "instr")
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, batch_size=2, gradient_checkpointing=on,
                                                       packing=packing))
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
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(max_steps=1, batch_size=2, group_by_length=grouped,
                                                       packing="per_step"))
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
                                            order="given", packing="per_step"))
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
    per_step = {"packing": "per_step"}
    whole = training_fingerprint("m", rows, TrainConfig(micro_batch_size=None, **per_step))
    assert training_fingerprint("m", rows, TrainConfig(micro_batch_size=8, **per_step)) == whole  # as before the field
    assert training_fingerprint("m", rows, TrainConfig(micro_batch_size=1, **per_step)) != whole
    # packed SFT's micro-batches are its packs, whatever the field says
    assert training_fingerprint("m", rows, TrainConfig(micro_batch_size=1)) == training_fingerprint("m", rows, TrainConfig())


class _Killed(Exception):
    """Stands for the process being killed mid-SFT (the end of a sitting)."""


def _kill_at(step: int):
    def progress(line: str) -> None:
        if line.startswith(f"sft step {step}/"):
            raise _Killed(line)
    return progress


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("packing", ["tree", "per_step"])
def test_a_killed_sft_resumes_from_its_last_saved_state(tiny, tmp_path, packing):
    """A kill after step 3's forward/backward (state saved at step 2) and a rerun: the rerun trains steps 3-4 only
    and ends where an uninterrupted run ends (weights, the mean loss over all four steps)."""
    import torch

    from flywheel.policy.sft import saved_state, training_fingerprint

    rows = sft_examples([make_traj(n=3), make_traj(task="t2", n=3)], lambda t: "instr")
    cfg = TrainConfig(max_steps=4, batch_size=2, learning_rate=1e-3, whole_passes=False, order="given",
                      save_minutes=1e-9, packing=packing)  # a save after every step
    whole = train_sft(tiny, rows, tmp_path / "whole", cfg)
    with pytest.raises(_Killed):
        train_sft(tiny, rows, tmp_path / "ck", cfg, progress=_kill_at(3))
    assert saved_state(tmp_path / "ck.partial", training_fingerprint(tiny, rows, cfg)).name == "checkpoint-2"
    assert [p.name for p in (tmp_path / "ck.partial" / "trainer").glob("checkpoint-*")] == ["checkpoint-2"]
    lines: list[str] = []
    resumed = train_sft(tiny, rows, tmp_path / "ck", cfg, progress=lines.append)
    assert any("resumes" in line and "checkpoint-2 of 4" in line for line in lines)
    assert [line.split(" loss")[0] for line in lines if line.startswith("sft step")] == ["sft step 3/4", "sft step 4/4"]
    assert resumed.steps == 4 and resumed.train_loss == pytest.approx(whole.train_loss, rel=1e-4)
    assert (whole.resumed_at, resumed.resumed_at) == (0, 2)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "ck")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not (tmp_path / "ck.partial").exists()


def test_a_killed_sft_of_another_training_starts_over(tiny, tmp_path):
    """What a killed attempt saved is resumed only by the same training (model, examples, config): another
    config in the same checkpoint folder starts from step 1, and no saving (save_minutes 0) leaves nothing."""
    import dataclasses

    rows = sft_examples([make_traj(n=3), make_traj(task="t2", n=3)], lambda t: "instr")
    cfg = TrainConfig(max_steps=3, batch_size=2, whole_passes=False, order="given", save_minutes=1e-9)
    with pytest.raises(_Killed):
        train_sft(tiny, rows, tmp_path / "ck", cfg, progress=_kill_at(3))
    lines: list[str] = []
    train_sft(tiny, rows, tmp_path / "ck", dataclasses.replace(cfg, learning_rate=1e-3), progress=lines.append)
    assert not any("resumes" in line for line in lines) and lines[0].startswith("sft step 1/3")

    with pytest.raises(_Killed):
        train_sft(tiny, rows, tmp_path / "off", dataclasses.replace(cfg, save_minutes=0), progress=_kill_at(3))
    assert not list((tmp_path / "off.partial").glob("trainer/checkpoint-*"))

    (tmp_path / "bad.partial").mkdir()  # a marker that is not unpublished_dirs': not a state to resume
    (tmp_path / "bad.partial" / "resume.json").write_text("[")
    lines.clear()
    train_sft(tiny, rows, tmp_path / "bad", cfg, progress=lines.append)
    assert lines[0].startswith("sft step 1/3") and not (tmp_path / "bad.partial").exists()


def test_save_minutes_is_not_part_of_the_training_identity():
    from flywheel.policy.sft import training_fingerprint

    rows = sft_examples([make_traj(n=2)], lambda t: "instr")
    assert training_fingerprint("m", rows, TrainConfig(save_minutes=0)) == training_fingerprint("m", rows, TrainConfig())
