"""A benchmark is a value: a fourth benchmark, defined only in the tests (tests/tinybench), runs the
whole flywheel through Dagster in seconds, named by reference in a profile.

Nothing in flywheel/ or envs.REGISTRY names it: the profile's `benchmarks: {tinybench:
"tests.tinybench:SPEC"}` makes it the only partition and reaches every spec lookup. Only the
policy is a test double (an oracle that replays the teacher's answers after k+1 looks, as
tests/loop_support.py's); env, store, gate, SFT, curriculum and Dagster are real.
"""

from pathlib import Path

import dagster as dg
import pytest

import envs
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.profile import Profile, load_profile
from tests.helpers import assert_profile_refused, check_results, run
from tests.loop_support import OraclePolicy  # k+1 looks, then the teacher's answer
from tests.tinybench import NAME, SPEC, shortest_path

REF = "tests.tinybench:SPEC"
REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"]
ITERATION = ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"]

PROFILE = f"""
benchmarks: {{{NAME}: "{REF}"}}
iterations: 1
runs_dir: RUNS
model: MODEL
envs: {{max_steps: 10}}
policy: {{epochs: 1, max_train_steps: 1, batch_size: 2, samples_per_task: 1, parallel_envs: 2,
          history_window: 2, max_new_tokens: 8}}
curriculum: {{max_proposals: 2}}
loop: {{benchmarks: [{NAME}], iterations: 1, clean_successes: false}}  # the oracle's k+1 looks: cleaning would cut them
"""


def write_profile(tmp_path: Path, model: str, text: str = PROFILE) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text.replace("RUNS", str(tmp_path / "runs")).replace("MODEL", model))
    return path




def test_the_tiny_benchmark_runs_the_flywheel_through_dagster(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "no-data"))  # tasks in code: no data folder needed
    registry = dict(envs.REGISTRY)
    profile = load_profile(write_profile(tmp_path, tiny))
    store = str(profile.runs_path / "flywheel.duckdb")
    oracle = OraclePolicy(store_path=store, benchmark=NAME, base_model_path=tiny, checkpoints_dir=str(profile.runs_path / "ck"),
                              epochs=1, max_train_steps=1, batch_size=2, samples_per_task=1, history_window=2)
    defs = build_defs({"policy": oracle}, profile=profile)
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("teacher_quaternions")).partitions_def.get_partition_keys() == [NAME]
    assert graph.get(dg.AssetKey("evaluation")).partitions_def.get_partition_keys() == [f"{NAME}|0", f"{NAME}|1"]

    instance = dg.DagsterInstance.ephemeral()
    assert run(defs, "bootstrap_job", NAME, BOOTSTRAP, instance).success
    for k in (0, 1):
        result = run(defs, "iteration_job", partition_key(NAME, k), ITERATION, instance)
        assert result.success and check_results(result)["gated_dataset_is_usable"] is True, k

    db = Store(store)
    # The training tasks the run plays: the split without the one set aside for the promotion gate.
    aside = {t.task_id for t in profile.resources()["envs"].validation_set(NAME)}
    assert aside == {"train-3"} and {p["iteration"]: p["promoted"] for p in db.promotions(NAME)} == {0: True, 1: True}
    train = [t for t in SPEC.load_tasks("train") if t.task_id not in aside]
    experts = {t.task_id: t for t in db.load_trajectories(benchmark=NAME, source="expert")}
    assert {t.task_id: list(t.actions) for t in experts.values() if t.success} == {
        t.task_id: shortest_path(t.meta["keys"], t.meta["door"]) for t in train}
    teacher = db.load_trajectories(benchmark=NAME, source="teacher")
    assert len(teacher) == len(train) and all(s.plan and s.thought for t in teacher for s in t.steps)
    synthetic = db.load_trajectories(benchmark=NAME, source="synthetic")
    assert synthetic and all(t.success and t.task_id.startswith("syn-") for t in synthetic)  # more keys: longer
    assert min(len(t.steps) for t in synthetic) > max(len(t.steps) for t in teacher)

    for k in (0, 1):
        gated = db.load_trajectories(db.traj_ids_gated_at(NAME, k))
        # every training task solved, after k+1 looks: new action sequences, so the gate keeps them
        assert sorted(t.task_id for t in gated) == sorted(t.task_id for t in train), k
        assert all(t.success and t.actions[: k + 1] == ("look around",) * (k + 1) for t in gated)
        assert db.latest_checkpoint(NAME, k) is not None
        splits = {split: row["episodes"] for split, row in db.evaluations_at(NAME, k).items()}
        assert splits == {"seen": len(SPEC.load_tasks("seen")), "unseen": len(SPEC.load_tasks("unseen"))}
    checkpoints = db.checkpoint_rows(NAME)
    assert [r["iteration"] for r in checkpoints] == [0, 1]
    assert '"gated_iterations": [0]' in checkpoints[1]["lineage"]  # k=1 trained on gate 0's successes
    assert db.trajectory_benchmarks() == [NAME]
    assert envs.REGISTRY == registry and NAME not in envs.REGISTRY  # configuration, never mutated

    # An evaluation cut short resumes: its finished episodes stay, only the missing one is played again.
    scope = {"benchmark": NAME, "iteration": 1, "source": "policy", "split": "seen"}
    before = {r["traj_id"]: r["created_at"] for r in db.trajectory_table(**scope).iter_rows(named=True)}
    lost = sorted(before)[0]
    db.delete_trajectory_ids([lost])
    assert run(defs, "iteration_job", partition_key(NAME, 1), ["evaluation"], instance).success
    after = {r["traj_id"]: r["created_at"] for r in db.trajectory_table(**scope).iter_rows(named=True)}
    assert set(after) == set(before) and after[lost] > before[lost]
    assert all(after[t] == before[t] for t in before if t != lost)
    assert db.evaluations_at(NAME, 1)["seen"]["episodes"] == len(SPEC.load_tasks("seen"))
    [tag] = {t.model_id for t in db.load_trajectories(**scope)}  # the checkpoint and its evaluation settings
    assert tag.startswith(db.latest_checkpoint(NAME, 1)["checkpoint_id"] + "#")


def test_a_profile_names_benchmarks_by_reference(tmp_path):
    profile = load_profile(write_profile(tmp_path, str(tmp_path / "model"),
                                         f'benchmarks: {{{NAME}: "{REF}", webshop: null}}\n'))
    assert profile.benchmarks == (NAME, "webshop") and profile.benchmark_refs == {NAME: REF}
    res = profile.resources()
    assert res["envs"].benchmark_refs == {NAME: REF}
    assert res["envs"].spec(NAME) == SPEC and res["envs"].env_factory(NAME)().reset(SPEC.load_tasks("seen")[0])
    keys = build_defs(profile=profile).resolve_asset_graph().get(dg.AssetKey("expert_trajectories"))
    assert sorted(keys.partitions_def.get_partition_keys()) == sorted([NAME, "webshop"])
    # the list form still names registered benchmarks; the registry alone does not know the tiny one
    assert Profile(benchmarks=("webshop",)).benchmark_refs == {}
    with pytest.raises(envs.UnknownBenchmarkError, match=f"Unknown benchmark '{NAME}'.*by reference"):
        envs.get_benchmark(NAME)


@pytest.mark.parametrize("text, message", [
    (f"benchmarks: [{NAME}]\n", f"Unknown benchmark '{NAME}'"),
    (f'benchmarks: {{{NAME}: "tests.tinybench:NOPE"}}\n', "does not load"),
    (f'benchmarks: {{{NAME}: "tests.tinybench"}}\n', "not a reference of the form"),
    (f'benchmarks: {{other: "{REF}"}}\n', f"is the benchmark '{NAME}', not 'other'"),
    ('benchmarks: {mine: "tests.tinybench:NAME"}\n', "is not a BenchmarkSpec"),
    (f"benchmarks: {{{NAME}: 3}}\n", "maps each name to 'package.module:SPEC' or null"),
    (f'benchmarks: {{{NAME}: "{REF}"}}\nloop: {{benchmarks: [webshop]}}\n',
     "Unknown benchmark 'webshop' in loop.benchmarks: the benchmark partitions are tinybench"),
])
def test_a_bad_reference_fails_when_the_profile_loads(tmp_path, text, message):
    assert_profile_refused(tmp_path, text, message)


def test_flywheel_never_names_the_tiny_benchmark():
    """It lives in tests/ only: neither flywheel/ nor envs/ (the registry) knows it."""
    offenders = [str(p.relative_to(REPO)) for folder in ("flywheel", "envs") for p in sorted((REPO / folder).rglob("*.py"))
                 if NAME in p.read_text().lower()]
    assert offenders == []


def test_the_demo_cli_plays_a_benchmark_named_by_reference(tmp_path, tiny):
    """`flywheel --profile P demo --benchmark tinybench`: validation, the spec's tasks and the resources
    all see the profile's reference (nothing is trained here: the resources are built, not run)."""
    from flywheel.cli import build_parser
    from flywheel.drivers.demo import demo_resources, validate_demo_args

    path = write_profile(tmp_path, tiny)
    args = build_parser().parse_args(["--profile", str(path), "demo", "--benchmark", NAME, "--train-tasks", "2"])
    validate_demo_args(args)
    envs_resource = demo_resources(args)["envs"]
    assert envs_resource.benchmark_refs == {NAME: REF}
    assert envs_resource.spec(NAME) == SPEC and len(envs_resource.tasks(NAME, "train")) == 2
    other = build_parser().parse_args(["demo", "--benchmark", NAME])  # no profile: the registry does not know it
    with pytest.raises(Exception, match=f"Unknown benchmark '{NAME}'"):
        validate_demo_args(other)
