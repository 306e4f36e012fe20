"""DPO and GRPO move the parameters the right way on a constructed pair / group (tiny random Llama),
and their agent-turn masks cover the agent's answers and nothing of the observations."""

import pytest
import torch

from flywheel.core.trajectory import Step, Trajectory
from flywheel.policy.dpo import DPOSettings, Pair, agent_tokens, make_pairs, train_dpo, transcript
from flywheel.policy.grpo import GRPOSettings, NoLearningSignal, group_advantages, token_logps, train_grpo
from flywheel.policy.models import load_model, load_tokenizer

INSTRUCTIONS = "You are shopping. Find the product and buy it."


def _traj(task: str, actions: list[str], *, reward: float, sample: int = 0, source: str = "policy") -> Trajectory:
    steps = [Step(observation=f"obs {i}", thought=f"I should {a} now because it fits the goal", plan=f"do {a}",
                  action=a, next_observation=f"you did {a}; page {i + 1}") for i, a in enumerate(actions)]
    steps[0].observation = "WebShop [SEP] Instruction: buy red shoes under 50 dollars [SEP] Search"
    return Trajectory(benchmark="webshop", split="train", task_id=task, source=source, sample=sample, steps=steps,
                      success=reward >= 1.0, reward=reward)


def _agent_logp(model_path, traj: Trajectory) -> float:
    tok = load_tokenizer(model_path)
    model = load_model(model_path)
    ids, mask = agent_tokens(tok, transcript(traj, INSTRUCTIONS))
    with torch.no_grad():
        lp = token_logps(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
    return float((lp * torch.tensor(mask[1:], dtype=torch.float32)).sum())


def test_agent_mask_covers_answers_not_observations(tiny):
    tok = load_tokenizer(tiny)
    traj = _traj("t1", ["search[red shoes]", "click[item 3]"], reward=1.0)
    msgs = transcript(traj, INSTRUCTIONS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == "Thought: I should search[red shoes] now because it fits the goal\nAction: search[red shoes]"
    assert msgs[3]["content"].startswith("Observation: you did search[red shoes]")
    ids, mask = agent_tokens(tok, msgs)
    agent_text = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    other_text = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "Action: search[red shoes]" in agent_text and "Action: click[item 3]" in agent_text
    assert "you did" not in agent_text and "buy red shoes" not in agent_text
    assert "you did search[red shoes]" in other_text and "Action: search" not in other_text


def test_make_pairs_prefers_expert_and_pairs_failures_of_the_same_task():
    expert = _traj("a", ["search[x]", "buy"], reward=1.0, source="teacher")
    ok_b = _traj("b", ["search[y]", "buy"], reward=1.0, sample=0)
    bad = [_traj("a", ["search[z]"], reward=0.2, sample=i) for i in range(3)] + [_traj("b", ["click"], reward=0.0, sample=1),
                                                                                    _traj("c", ["click"], reward=0.0)]
    pairs = make_pairs([expert], [ok_b, *bad], max_per_task=2)
    assert [(p.task_id, p.chosen.source, p.rejected.sample) for p in pairs] == [("a", "teacher", 0), ("a", "teacher", 1),
                                                                                 ("b", "policy", 1)]
    assert all(not p.rejected.success for p in pairs)  # task c has no chosen: no pair


@pytest.mark.parametrize("packing", ["tree", "per_step"])
def test_dpo_raises_chosen_over_rejected(tiny, tmp_path, capsys, packing):
    chosen = _traj("t", ["search[red shoes]", "click[b01]", "buy now"], reward=1.0, source="teacher")
    rejected = _traj("t", ["click[next >]", "click[< prev]", "search[blue hat]"], reward=0.0)
    before = _agent_logp(tiny, chosen) - _agent_logp(tiny, rejected)
    res = train_dpo(tiny, [Pair("t", chosen, rejected)], INSTRUCTIONS, tmp_path / "dpo",
                    DPOSettings(beta=0.1, learning_rate=1e-3, max_steps=4, batch_size=1, bf16=False, packing=packing))
    assert res.n_pairs == 1 and res.steps == 4
    assert "'loss'" not in capsys.readouterr().out  # the Trainer's log dicts go to the log, not stdout
    after_chosen, after_rejected = _agent_logp(res.path, chosen), _agent_logp(res.path, rejected)
    assert after_chosen - after_rejected > before + 1.0  # the preference margin grew
    assert after_chosen > _agent_logp(tiny, chosen)  # and the chosen answers got likelier


@pytest.mark.parametrize("packing", ["tree", "per_step"])
def test_grpo_raises_positive_advantage_and_lowers_negative(tiny, tmp_path, packing):
    good = _traj("t", ["search[red shoes]", "click[b01]", "buy now"], reward=1.0, sample=0)
    bad = _traj("t", ["click[next >]", "click[< prev]", "search[blue hat]"], reward=0.0, sample=1)
    adv = dict((t.sample, a) for t, a in group_advantages([good, bad]))
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] > 0.7
    g0, b0 = _agent_logp(tiny, good), _agent_logp(tiny, bad)
    res = train_grpo(tiny, [good, bad], INSTRUCTIONS, tmp_path / "grpo",
                     GRPOSettings(learning_rate=1e-3, epochs=3, batch_size=2, packing=packing))
    assert res.n_trajectories == 2 and res.n_groups == 1 and res.steps == 3
    assert _agent_logp(res.path, good) > g0 + 0.5
    assert _agent_logp(res.path, bad) < b0 - 0.5
    # A group whose episodes all scored alike carries no signal: no update, said so.
    with pytest.raises(NoLearningSignal):
        train_grpo(tiny, [good, _traj("t", ["buy"], reward=1.0, sample=2)], INSTRUCTIONS, tmp_path / "none")


def test_grpo_step_one_transcript_at_a_time_equals_the_whole_batch(tiny):
    """accumulate_step (one transcript per pass, for memory) gives the whole padded batch's loss and gradient."""
    from flywheel.policy.grpo import accumulate_step, clipped_loss, collate

    tok, model = load_tokenizer(tiny), load_model(tiny)
    trajs = [_traj("t", ["search[red shoes]", "click[b01]", "buy now"], reward=1.0),
             _traj("t", ["click[next >]"], reward=0.0, sample=1)]  # different lengths: the batch pads one
    rows = []
    for t, adv in zip(trajs, (0.7, -0.7), strict=True):
        ids, mask = agent_tokens(tok, transcript(t, INSTRUCTIONS))
        rows.append({"input_ids": ids, "mask": mask, "advantage": adv})
    with torch.no_grad():  # a playing policy other than the model, so that ratios differ from 1 and some clip
        old = [token_logps(model, *collate([r], 0)[:2])[0] + torch.linspace(-0.3, 0.3, len(r["input_ids"]) - 1)
               for r in rows]

    ids, att, mask, adv = collate(rows, 0)
    old_padded = torch.nn.utils.rnn.pad_sequence(old, batch_first=True)
    whole = clipped_loss(token_logps(model, ids, att), old_padded, adv, mask, 0.2)
    whole.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    got_loss = accumulate_step(model, rows, old, 0, 0.2)
    assert got_loss == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    assert want and all(torch.allclose(p.grad, want[n], rtol=1e-4, atol=1e-6)
                        for n, p in model.named_parameters() if n in want)


def test_packed_episodes_score_each_turn_under_its_rollout_prompt(tiny):
    """With a history window and clipped observations, the one-transcript scoring (packing per_step) shows each
    turn a context the policy never saw; the packed episode scores each turn under its own rollout prompt, as
    per-step scoring does (at most 1e-4 apart)."""
    from flywheel.core.prompting import PromptShape
    from flywheel.policy.packing import example_ids, packs_logps, per_step_logps
    from flywheel.policy.sft import episode_packs, sft_examples

    tok, model = load_tokenizer(tiny), load_model(tiny)
    traj = _traj("t", ["search[red shoes]", "click[b01]", "click[size 9]", "buy now"], reward=1.0)
    for step in traj.steps:
        step.next_observation += " with a long list of products and prices " * 3
    shape = PromptShape(history_mode="react", history_window=2, max_observation_chars=20)
    packs, length = episode_packs(tok, traj, INSTRUCTIONS, shape, 4096)
    tokenized = [example_ids(tok, r) for r in sft_examples([traj], lambda _t: INSTRUCTIONS, shape)]
    assert length == max(len(ids) for ids, _ in tokenized) and sum(len(p) for p in packs) < sum(map(len, (i for i, _ in tokenized)))
    with torch.no_grad():
        packed = packs_logps(model, packs)
        per_step = torch.cat([per_step_logps(model, ids, start) for ids, start in tokenized])
        assert float((packed - per_step).abs().max()) <= 1e-4
        ids, mask = agent_tokens(tok, transcript(traj, INSTRUCTIONS, max_observation_chars=20))
        whole = token_logps(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
        transcript_turns = whole[torch.tensor(mask[1:], dtype=torch.bool)]
    assert transcript_turns.shape == packed.shape  # the same answer tokens, scored under other contexts
    assert float((transcript_turns - packed).abs().max()) > 1e-3
    assert episode_packs(tok, traj, INSTRUCTIONS, shape, 64)[0] == []  # too long for max_length: dropped, never cut
