"""Committed presets keep their committed behaviour when a default changes: they pin the old value."""

import pytest

from flywheel.config.presets import load_preset

# The presets committed before cleaned successes and the teaching sampling rule became defaults (issue 54).
COMMITTED = ["cpu-alfworld", "cpu-baselines-scienceworld", "cpu-comparison-scienceworld", "cpu-comparison-webshop",
             "cpu-scienceworld-quick", "cpu-scienceworld", "cpu-webshop-quick", "cpu-webshop", "gpu-8b"]


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_presets_pin_k_above_0_at_k0s_rate(name):
    """They ran before the rule chose a quarter of k=0's rate for k > 0 (docs/method.md)."""
    preset = load_preset(name)
    for arm in preset.arms:
        assert preset.arm_sections(arm)["policy"].get("refine_lr_scale") == 1.0, (name, arm)


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_presets_pin_uncleaned_successes_and_their_sampling(name):
    preset = load_preset(name)
    for arm in preset.arms:
        loop = preset.arm_sections(arm).get("loop", {})
        assert loop.get("clean_successes") is False, (name, arm)
        assert loop.get("adaptive_sampling") is False or loop.get("sampling_rule") == "hard_first", (name, arm)
