"""The training methods an experiment arm can name (`method: NAME`), and the stages each runs.

Every method runs through the same envs, store, evaluation and Dagster jobs, from the same base
model, on the same tasks; what differs is which assets its stages materialize and a few resource
fields the method implies (an arm's own overrides still win):

| method | what it is | implies | stages per k |
|---|---|---|---|
| base | the base model zero-shot (no training) | - | base_checkpoint, evaluation (k=0) |
| react-sft | SFT on the expert trajectories as plain ReAct, long thought at every step, full history | history_mode react, no synthesis, shuffled | sft, evaluation (k=0) |
| bpo-stage1 | quaternions + long-short fusion | no synthesis, shuffled | sft, evaluation (k=0) |
| bpo-stage2 | + synthetic curriculum, easy to hard | - | sft, evaluation (k=0) |
| bpo-stage3 / bpo | + reward-gated self-refinement, k = 1..K | - | sft, rollouts+gate, evaluation (0..K) |
| rft | rejection sampling on react-sft (no quaternions) | react-sft's, seed repeats kept, successes as played | sft, rollouts+gate, evaluation (0..K) |
| eto-dpo | SFT, then DPO on (expert or success, failure) pairs | react-sft's | sft+eval k=0; rollouts k-1, pairs+DPO, eval (1..K) |
| grpo | SFT, then multi-turn GRPO with the episode reward | react-sft's | sft+eval k=0; G rollouts of k-1 + update, eval (1..K) |
| sft-control | the equal-compute control: k > 0 continues SFT on seeds + curriculum only, as many steps as the arm `method.controls` trained at k | replay none | sft, evaluation (0..K), no rollouts, no gate |

Plain code: no Dagster here (the assets are in flywheel/assets/baselines.py).
"""

from __future__ import annotations

from typing import Any

from flywheel.orchestration.partitions import partition_key

REACT = {"policy": {"history_mode": "react", "history_window": None},
         "curriculum": {"synthesize": False, "order": "shuffle"}}

METHODS: dict[str, dict[str, Any]] = {
    "bpo": {"label": "BPO", "implies": {}, "plan": "flywheel"},
    "base": {"label": "base (zero-shot)", "implies": {}, "plan": "base"},
    "react-sft": {"label": "ReAct SFT", "implies": REACT, "plan": "sft"},
    "bpo-stage1": {"label": "BPO stage 1", "implies": {"curriculum": {"synthesize": False, "order": "shuffle"}},
                   "plan": "sft"},
    "bpo-stage2": {"label": "BPO stage 2", "implies": {}, "plan": "sft"},
    "bpo-stage3": {"label": "BPO stage 3", "implies": {}, "plan": "flywheel"},
    "rft": {"label": "RFT on ReAct SFT", "implies": {**REACT, "loop": {"gate_drops_seed_repeats": False, "clean_successes": False}},
            "plan": "flywheel"},
    "eto-dpo": {"label": "SFT + DPO (ETO)", "implies": REACT, "plan": "dpo"},
    "grpo": {"label": "SFT + GRPO", "implies": REACT, "plan": "grpo"},
    # k > 0: the same SFT steps as the arm it controls (the runner reads them), none of the flywheel's data.
    "sft-control": {"label": "SFT, equal steps (control)", "implies": {"policy": {"replay": "none"}},
                    "plan": "control"},
}
# The stage each bootstrap needs: the zero-shot base model needs only the tasks (expert replay).
BOOTSTRAP = ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"]
BASELINE_STAGES = ("base", "dpo", "grpo")  # stage-name prefixes run by baselines_job


def check_method(name: str) -> str:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return name


def implied_sections(name: str) -> dict[str, dict[str, Any]]:
    """Resource fields the method implies (deep copies; the arm's own overrides are applied after)."""
    return {s: dict(f) for s, f in METHODS[check_method(name)]["implies"].items()}


def method_stages(benchmark: str, iterations: int, method: str = "bpo", *,
                  evaluate_start: bool = True) -> list[tuple[str, str | None, list[str]]]:
    """(stage, partition key or None for the benchmark partition, asset selection), in order.

    `evaluate_start=False` skips evaluation:0 of the methods that continue from a k=0 SFT (bpo-stage3, rft,
    eto-dpo, grpo): that SFT is trained exactly as another arm's (bpo-stage2's, react-sft's), whose k=0
    evaluation the tables use; the SFT itself still runs (it is where k=1 starts from)."""

    plan = METHODS[check_method(method)]["plan"]

    def key(k: int) -> str:
        return str(partition_key(benchmark, k))

    if plan == "base":
        return [("bootstrap", None, ["expert_trajectories"]), ("base:0", key(0), ["base_checkpoint"]),
                ("evaluation:0", key(0), ["evaluation"])]
    stages: list[tuple[str, str | None, list[str]]] = [("bootstrap", None, list(BOOTSTRAP))]
    if plan == "sft":
        return stages + [("sft:0", key(0), ["sft_checkpoint"]), ("evaluation:0", key(0), ["evaluation"])]
    if plan in ("flywheel", "control"):
        for k in range(iterations + 1):
            stages.append((f"sft:{k}", key(k), ["sft_checkpoint"]))
            if k < iterations and plan == "flywheel":
                stages.append((f"rollouts:{k}", key(k), ["rollouts", "gated_dataset"]))
            if k or evaluate_start or not iterations:
                stages.append((f"evaluation:{k}", key(k), ["evaluation"]))
        return stages
    stages.append(("sft:0", key(0), ["sft_checkpoint"]))
    if evaluate_start or not iterations:
        stages.append(("evaluation:0", key(0), ["evaluation"]))
    for k in range(1, iterations + 1):
        if plan == "dpo":
            stages.append((f"rollouts:{k - 1}", key(k - 1), ["rollouts"]))
            stages.append((f"dpo:{k}", key(k), ["preference_pairs", "dpo_checkpoint"]))
        else:
            stages.append((f"grpo:{k}", key(k), ["grpo_checkpoint"]))
        stages.append((f"evaluation:{k}", key(k), ["evaluation"]))
    return stages


def job_for(stage: str) -> str:
    """Which Dagster job runs a stage: bootstrap_job, baselines_job or iteration_job."""
    prefix = stage.split(":", 1)[0]
    if prefix == "bootstrap":
        return "bootstrap"
    return "baselines" if prefix in BASELINE_STAGES else "iteration"
