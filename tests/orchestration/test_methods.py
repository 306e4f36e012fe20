"""A method is a value: the test-only method of tests/tinymethod, registered here, is planned, configured,
given its jobs and placed in the paper's tables without a line of flywheel/ naming it."""

import pytest
import yaml

from flywheel.config.presets import load_preset
from flywheel.core.validation import ConfigurationError
from flywheel.orchestration import methods
from flywheel.orchestration.methods import METHODS, job_for, method_stages, register
from flywheel.reports import paper
from tests.helpers import paper_arm as _arm
from tests.helpers import paper_checkpoint as _ck
from tests.tinymethod import METHOD, NAME


@pytest.fixture
def tinymethod():
    register(METHOD)
    yield METHOD
    methods.unregister(NAME)
    assert NAME not in METHODS


def test_a_registered_method_is_planned_and_configured(tinymethod, tmp_path):
    stages = method_stages("webshop", 2, NAME)
    assert [s for s, _, _ in stages] == ["bootstrap", "sft:0", "rollouts:0", "sft:1", "rollouts:1", "sft:2",
                                         "evaluation:2"]
    assert [job_for(s) for s, _, _ in stages] == ["bootstrap"] + ["iteration"] * 6
    assert stages[-1][2] == ["evaluation"] and stages[2][2] == ["rollouts", "gated_dataset"]
    with pytest.raises(ValueError, match="already registered"):
        register(METHOD)

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "benchmark": "webshop", "iterations": 2, "model": "tiny",
        "arms": {"bpo-stage2": {"method": "bpo-stage2"},
                 "mine": {"method": {"name": NAME, "start_from": "bpo-stage2"}},
                 "mine-b4": {"method": NAME, "policy": {"batch_size": 4}}}}))
    preset = load_preset(str(path))
    assert preset.method("mine") == NAME
    assert preset.arm_sections("mine")["policy"]["batch_size"] == 8  # the method's implied field
    assert preset.arm_sections("mine-b4")["policy"]["batch_size"] == 4  # the arm's own wins


def test_controls_belong_to_a_method_that_trains_equal_steps(tinymethod, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "benchmark": "webshop", "iterations": 1, "model": "tiny", "arms": {
        "bpo": {"method": "bpo"}, "mine": {"method": {"name": NAME, "controls": "bpo"}}}}))
    with pytest.raises(ConfigurationError, match=r"method.controls is for .*sft-control.*bpo-k-only does not"):
        load_preset(str(path))
    path.write_text(yaml.safe_dump({"name": "p", "benchmark": "webshop", "iterations": 1, "model": "tiny", "arms": {
        "bpo": {"method": "bpo"}, "control": {"method": "sft-control"}}}))
    with pytest.raises(ConfigurationError, match=r"'control' \(method sft-control\) needs method.controls"):
        load_preset(str(path))


def test_a_registered_method_takes_its_place_in_the_paper_tables(tinymethod):
    data = {"arms": [
        _arm("bpo-stage2", "bpo-stage2", {0: _ck(0, 1)}),
        _arm("bpo", "bpo", {1: _ck(1, 2), 2: _ck(2, 4)}, start_from="bpo-stage2"),
        _arm("mine", NAME, {2: _ck(2, 6)}, start_from="bpo-stage2"),
        _arm("react-sft", "react-sft", {0: _ck(0, 3)}),
    ]}
    header, rows = paper.table1(data)
    assert [r[0] for r in rows] == ["BPO", "ReAct SFT", "BPO stage 2",
                                    "BPO, K evaluated (`mine`)"]  # Table 1: registry order, the new one last
    _, rows = paper.table2(data, "scienceworld")
    got = {r[0]: r[-1].split(" [")[0] for r in rows}
    assert got["+ stage 3 (K only), k=2 (`mine`)"] == "+50.0"  # against the k=0 it continued from (1 of 10)
    _, rows = paper.table4(data, "scienceworld")
    assert [r[0] for r in rows] == ["SFT (ReAct), k=0", "BPO, k=2", "BPO, K only (`mine`), k=2"]
    assert rows[-1][-1].startswith("+30.0")  # paired with ReAct SFT (3 of 10)
    assert [r["label"] for r in paper.fig2_rows(
        {"arms": [{**data["arms"][2], "checkpoints": {2: {**_ck(2, 6), "buckets": [
            {"bucket": "easy", "lo": None, "hi": 3, "successes": 6, "episodes": 10}]}}}]}, "scienceworld")] == [
        "BPO, K evaluated (`mine`), k=2"]
