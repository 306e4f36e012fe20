"""Experiments that span sittings and machines: each arm's results are committed on their own
(`results/arms/ARM.json`) and merged into one report; an arm whose start arm is only in committed results
retrains that k=0 and refuses to go on when the weights differ; the equal-compute control's budget; every
shipped preset trains each of its examples."""

import json
from pathlib import Path

import pytest
import yaml

from flywheel.config.presets import load_preset
from flywheel.core.provenance import resign_arm, weights_sha256
from flywheel.policy.sft import TrainConfig, examples_never_trained, planned_steps
from tests.helpers import TWO_ARMS, experiment_process

REPO = Path(__file__).resolve().parents[2]

def test_arms_from_separate_runs_folders_and_processes_merge_and_k0_is_checked(tmp_path):
    preset = tmp_path / "two-sittings.yaml"
    preset.write_text(yaml.safe_dump(TWO_ARMS))
    results = tmp_path / "results"
    first = experiment_process(preset, tmp_path / "runs1", results, "--arms", "a")
    assert first.returncode == 0, first.stderr[-3000:]
    a = json.loads((results / "arms" / "a.json").read_text())
    k0 = json.loads((tmp_path / "runs1" / "a" / "progress.json").read_text())
    assert a["provenance"]["run_id"] == k0["run_id"] and a["provenance"]["complete"]
    assert a["provenance"]["k0_weights_sha256"] == weights_sha256(_k0_path(tmp_path / "runs1" / "a"))
    # Another sitting, another runs folder without arm a: b retrains a's k=0 and finds the same weights.
    second = experiment_process(preset, tmp_path / "runs2", results, "--arms", "b")
    assert second.returncode == 0, second.stderr[-3000:]
    done = json.loads((tmp_path / "runs2" / "b" / "progress.json").read_text())["done"]
    assert done["sft:0"]["k0_matches_recorded"] and "evaluation:0" not in done
    assert not (tmp_path / "runs2" / "a").exists()
    data = json.loads((results / "results.json").read_text())
    assert data["arms"]["a"]["origin"].startswith("committed") and data["arms"]["b"]["origin"].startswith("store")
    assert data["arms"]["a"]["provenance"]["run_id"] != data["arms"]["b"]["provenance"]["run_id"]
    # b's k=1 is paired with a's k=0 evaluation (the same weights) and with a's k=1, over the same tasks.
    [k1_vs_0] = [c for c in data["arms"]["b"]["comparisons"] if (c["new"], c["old"]) == (1, 0)]
    assert k1_vs_0["old_arm"] == "a" and k1_vs_0["n"] == 3
    assert [(c["arm"], c["reference"], c["k"], c["n"]) for c in data["arm_comparisons"]] == [("b", "a", 1, 3)]
    claims = {(c["arm"], c["k"], c["reference"], c["reference_k"]): c for c in data["claims"]}
    assert claims[("b", 1, "a", 0)]["replicates"]["b"] == k1_vs_0 | {"old_arm": "a"} or \
        claims[("b", 1, "a", 0)]["replicates"]["b"]["n"] == 3  # b's k=0 is a's evaluation of the same weights
    assert claims[("a", 1, "b", 1)]["replicates"]["a"]["n"] == 3
    report = (results / "report.md").read_text()
    assert "## Claims" in report and "`b`@1 vs `a`@0" in report
    assert f"Run `{a['provenance']['run_id']}` from committed" in report
    # A recorded k=0 that this machine does not reproduce: refused in one line, exit 2, before any rollout.
    a["provenance"]["k0_weights_sha256"] = "0" * 64
    (results / "arms" / "a.json").write_text(json.dumps(a))
    resign_arm(results / "arms" / "a.json")  # as if recorded so elsewhere (an edit is refused unless re-signed)
    third = experiment_process(preset, tmp_path / "runs3", results, "--arms", "b")
    assert third.returncode == 2 and "differ from the recorded ones" in third.stderr and "--accept-k0-drift" in third.stderr
    assert "Traceback" not in third.stderr
    # a.json records its k=0 examples' hash: b trained on the same examples, so the difference is numerical
    assert a["provenance"]["k0_examples_sha256"] and "the same training examples" in third.stderr
    assert "rollouts:0" not in json.loads((tmp_path / "runs3" / "b" / "progress.json").read_text())["done"]
    # Accepted: the difference is recorded and b evaluates its own k=0.
    fourth = experiment_process(preset, tmp_path / "runs3", results, "--arms", "b", "--accept-k0-drift")
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    progress = json.loads((tmp_path / "runs3" / "b" / "progress.json").read_text())
    assert progress["k0_drift"]["recorded_sha256"] == "0" * 64 and "evaluation:0" in progress["done"]
    drift = progress["k0_drift"]
    assert drift["same_examples"] is True and drift["recorded_commit"] and drift["recorded_host"]


def _k0_path(arm_dir: Path) -> Path:
    from flywheel.core.store import Store

    return Path(Store(arm_dir / "flywheel.duckdb", read_only=True).latest_checkpoint("webshop", 0)["path"])


# Presets whose committed results ran before whole-pass budgets pin `whole_passes: false` to stay reproducible.
PINNED = {"cpu-scienceworld", "cpu-scienceworld-quick", "cpu-webshop", "cpu-webshop-quick", "cpu-baselines-scienceworld"}


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "experiments").glob("*.yaml")))
def test_shipped_presets_train_every_example_even_when_the_cap_is_below_one_pass(name):
    preset = load_preset(name)
    for arm in preset.arms:
        policy = preset.arm_sections(arm).get("policy", {})
        if name in PINNED:
            assert policy["whole_passes"] is False and (REPO / "experiments" / "results" / name).is_dir()
            continue
        cfg = TrainConfig(batch_size=policy.get("batch_size", 8), max_steps=policy.get("max_train_steps", -1),
                          order="given", whole_passes=policy.get("whole_passes", True))
        if cfg.max_steps <= 0:
            continue
        for n in (cfg.max_steps * cfg.batch_size + 29, 237, 3 * cfg.max_steps * cfg.batch_size + 5):
            assert examples_never_trained(n, cfg) == 0, (arm, n)
            assert planned_steps(n, cfg) * cfg.batch_size >= n


def test_whole_passes_round_the_cap_to_passes_and_off_keeps_it():
    cfg = TrainConfig(batch_size=8, max_steps=16, order="given")
    assert planned_steps(157, cfg) == 20 and examples_never_trained(157, cfg) == 0  # 16 x 8 < 157: one pass
    assert planned_steps(237, cfg) == 30  # one pass of 30 steps
    assert planned_steps(40, cfg) == 15  # 5 steps a pass: 3.2 passes -> 3
    exact = TrainConfig(batch_size=8, max_steps=16, order="given", whole_passes=False)
    assert planned_steps(157, exact) == 16 and examples_never_trained(157, exact) == 29  # the old cut
    assert planned_steps(157, TrainConfig(max_steps=-1)) == -1  # epochs decide


def test_the_control_trains_exactly_the_controlled_arms_steps_whatever_the_k_above_0_budget():
    from flywheel.drivers.experiment import control_budget
    from flywheel.resources import TransformersPolicy

    preset_policy = {"max_train_steps": 102, "refine_train_steps": 34}  # cpu-alfworld's shape
    assert TransformersPolicy(**preset_policy).train_config(1).max_steps == 34
    cfg = TransformersPolicy(**{**preset_policy, **control_budget(41)}).train_config(1)
    assert cfg.max_steps == 41 and planned_steps(300, cfg) == 41  # not rounded to whole passes


def test_replicates_pool_with_a_hierarchical_bootstrap():
    from flywheel.core.quality import hierarchical_difference, paired_difference

    tasks = [f"t{i}" for i in range(40)]
    old = {t: i < 10 for i, t in enumerate(tasks)}
    reps = [{t: i < 10 + g for i, t in enumerate(tasks)} for g in (8, 12, 16)]  # +20, +30, +40 points
    pooled = hierarchical_difference([(r, old) for r in reps])
    assert pooled["n"] == 40 and pooled["runs"] == 3
    assert abs(pooled["delta"] - 0.3) < 1e-9 and pooled["ci_low"] < 0.3 < pooled["ci_high"] and pooled["significant"]
    assert [round(r, 3) for r in pooled["per_run"]] == [0.2, 0.3, 0.4] and abs(pooled["spread"] - 0.2) < 1e-9
    # t over the three run differences: 30 +- 4.303 * 10 / sqrt(3)
    assert abs(pooled["t_ci_low"] - (0.3 - 4.302653 * 0.1 / 3 ** 0.5)) < 1e-5
    one = paired_difference(reps[1], old)
    assert abs(one["delta"] - pooled["delta"]) < 1e-9
    # A replicate that lost everything pulls the pooled estimate down: one lucky run is no longer the answer.
    split = hierarchical_difference([(reps[0], old), ({t: False for t in tasks}, old), (reps[2], old)])
    assert abs(split["delta"] - (0.2 - 0.25 + 0.4) / 3) < 1e-9 and not split["significant"]
    assert paired_difference(reps[2], old)["significant"]


def test_a_claim_not_run_names_the_arms_without_an_evaluation():
    """An arm that started but has no evaluation at the claim's k (its record has no outcomes there: still
    running, or its evaluation skipped) is named with the k it lacks; an arm that never ran, by its name."""
    from types import SimpleNamespace

    from flywheel.reports.results import claims

    preset = SimpleNamespace(compare=[("sft", 0, "base", 0), ("bpo", 2, "base", 0)], replicates={},
                             arm_sections=lambda arm: {}, arms={"base": {}, "sft": {}, "bpo": {}})
    records = {"base": {"outcomes": {"0|seen": {"t1": [1, 1], "t2": [0, 1]}}}, "sft": {"outcomes": {}}}
    rows = claims(preset, records)
    assert [(r["arm"], r["status"], r["missing"]) for r in rows] == [("sft", "not evaluated", ["sft@0 not evaluated"]),
                                                                    ("bpo", "not run yet", ["bpo"])]


def test_a_claim_pairs_average_reward_over_the_same_tasks_as_success():
    """Each claim carries the paired average-reward difference (WebShop's metric) beside the success one."""
    from types import SimpleNamespace

    from flywheel.reports.results import claims

    preset = SimpleNamespace(compare=[("bpo", 2, "base", 0)], replicates={}, arm_sections=lambda arm: {},
                             arms={"base": {}, "bpo": {}})
    records = {"base": {"outcomes": {"0|unseen": {"t1": [0, 0.5], "t2": [0, 0.25], "t3": [1, 1.0]}}},
               "bpo": {"outcomes": {"2|unseen": {"t1": [1, 1.0], "t2": [0, 0.75], "t4": [1, 1.0]}}}}
    [row] = claims(preset, records)
    d = row["replicates"]["bpo"]
    assert (d["n"], d["gained"], d["lost"], d["delta"]) == (2, 1, 0, 0.5)  # t1, t2 only: t3/t4 are unpaired
    assert (d["reward"]["n"], d["reward"]["delta"]) == (2, 0.5)  # (+0.5 + 0.5) / 2


def test_k_above_0_continues_at_a_quarter_of_the_rate_unless_retrained_from_base_or_set():
    """The rule's choice (docs/method.md): a checkpoint k > 0 that continues from k-1 trains at
    `refine_lr_scale` (0.25) times k=0's rate; one retrained from the base model at k=0's rate; an explicit
    `refine_learning_rate` wins over both; `refine_lr_scale: 1.0` is the recipe before the choice."""
    from flywheel.resources import TransformersPolicy

    def rates(**kw) -> tuple[float, float, float]:
        policy = TransformersPolicy(learning_rate=2e-4, **kw)
        return tuple(policy.train_config(k).learning_rate for k in (0, 1, 2))
    assert rates() == (2e-4, 5e-5, 5e-5)
    assert rates(refine_from="base") == (2e-4, 2e-4, 2e-4)
    assert rates(refine_lr_scale=1.0) == (2e-4, 2e-4, 2e-4)
    assert rates(refine_learning_rate=1e-4) == rates(refine_learning_rate=1e-4, refine_from="base") == (2e-4, 1e-4, 1e-4)
    assert TransformersPolicy(learning_rate=1e-5).train_config(1).learning_rate == 2.5e-6  # relative to the base rate


def test_control_replicates_differ_by_their_k_above_0_seed_and_share_the_k0():
    """`policy.refine_seed` seeds every k > 0 SFT (the control samples no rollouts, so its replicates differ only
    by it) and not k=0; `refine_learning_rate` likewise: an arm that sets them still takes its start arm's k=0."""
    from types import SimpleNamespace

    from flywheel.drivers.experiment import check_shares_k0
    from flywheel.policy.sft import step_batches
    from flywheel.resources import TransformersPolicy

    policy = TransformersPolicy(seed=3, refine_seed=11)
    assert (policy.train_config(0).seed, policy.train_config(1).seed, policy.train_config(2).seed) == (3, 11, 11)
    assert TransformersPolicy(seed=3).train_config(2).seed == 3  # null: the seed, as before
    slow = TransformersPolicy(learning_rate=2e-4, refine_learning_rate=5e-5)  # k > 0's rate, a choice of its own
    assert (slow.train_config(0).learning_rate, slow.train_config(1).learning_rate) == (2e-4, 5e-5)
    rows = [{"task_id": f"t{i // 3}", "t": i % 3} for i in range(48)]  # 16 trajectories of 3 steps

    def order(seed: int) -> list[list[int]]:
        return step_batches(rows, TrainConfig(batch_size=8, max_steps=6, seed=seed, packing="tree"))
    assert order(11) != order(12) and sorted(sum(order(11), [])) == sorted(sum(order(12), [])) == list(range(48))
    arms = {"a": {}, "c1": {"policy": {"refine_seed": 1, "refine_learning_rate": 5e-5}, "method": {"start_from": "a"}}}
    check_shares_k0(SimpleNamespace(name="p", arms=arms, arm_sections=lambda arm: arms[arm]), "c1", "a")


def test_a_committed_start_arm_is_refused_only_for_a_k0_that_changed(tmp_path):
    """An arm that retrains a committed start arm's k=0 compares the configurations that shape that k=0, not
    every field: a default pinned in the preset after the start arm ran (`policy.refine_lr_scale`, the loop)
    leaves it usable; another learning rate is refused, naming the field."""
    from types import SimpleNamespace

    from flywheel.core.provenance import write_arm
    from flywheel.core.validation import ConfigurationError
    from flywheel.drivers.experiment import recorded_start

    ran = {"envs": {"seed_limit": 3}, "policy": {"learning_rate": 2e-4}, "method": {"name": "bpo-stage2"}}
    write_arm(tmp_path, "a", {"arm": "a", "results": {"per_k": []}, "outcomes": {}, "splits": {}, "config": ran,
                              "provenance": {"k0_weights_sha256": "f" * 64}})

    def preset(**policy) -> SimpleNamespace:
        sections = {**ran, "policy": {**ran["policy"], **policy}, "loop": {"clean_successes": False}}
        return SimpleNamespace(arm_sections=lambda arm: sections)
    assert recorded_start(preset(refine_lr_scale=1.0), "b", "a", tmp_path)["provenance"]["k0_weights_sha256"]
    with pytest.raises(ConfigurationError, match=r"\['policy.learning_rate'\] differ\): run arm 'a' again"):
        recorded_start(preset(learning_rate=1e-4), "b", "a", tmp_path)
