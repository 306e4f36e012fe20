"""The training methods an experiment arm can name (`method: NAME`): each one `Method` value in `METHODS`.

Every method runs through the same envs, store, evaluation and Dagster jobs, from the same base model, on the
same tasks; what differs is which assets its stages materialize, a few resource fields it implies (an arm's
own overrides still win) and where its arms stand in the paper's tables. A method declares all of that in
its entry below; the presets, the experiment driver, the results and the paper's tables read it from here.
Adding one (`register`, or a line in `METHODS`): docs/method.md#add-a-method.

| method | what it is | implies | stages per k |
|---|---|---|---|
| base | the base model zero-shot (no training) | - | base_checkpoint, evaluation (k=0) |
| react-sft | SFT on the expert trajectories as plain ReAct, long thought at every step, full history | history_mode react, no synthesis, shuffled | sft, evaluation (k=0) |
| bpo-stage1 | quaternions + long-short fusion | no synthesis, shuffled | sft, evaluation (k=0) |
| bpo-stage2 | + synthetic curriculum, easy to hard | - | sft, evaluation (k=0) |
| bpo-stage3 / bpo | + reward-gated self-refinement, k = 1..K | - | sft, rollouts+gate, evaluation (0..K) |
| rft | rejection sampling on react-sft (no quaternions) | react-sft's, seed repeats kept, no promotion gate | sft, rollouts+gate, evaluation (0..K) |
| eto-dpo | SFT, then DPO on (expert or success, failure) pairs | react-sft's | sft+eval k=0; rollouts k-1, pairs+DPO, eval (1..K) |
| grpo | SFT, then multi-turn GRPO with the episode reward | react-sft's | sft+eval k=0; G rollouts of k-1 + update, eval (1..K) |
| sft-control | the equal-compute control: k > 0 continues SFT on seeds + curriculum only, as many steps as the arm `method.controls` trained at k | replay none, no promotion gate | sft, evaluation (0..K), no rollouts, no gate |

Plain code: no Dagster here (the trainers' assets are in flywheel/assets/baselines.py and training.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flywheel.orchestration.partitions import partition_key

# (stage, partition key or None for the benchmark partition, asset selection)
Stage = tuple[str, str | None, list[str]]
# A method's plan: (the partition key of k, K, evaluate_start) -> its stages in order.
Plan = Callable[[Callable[[int], str], int, bool], list[Stage]]

# The stage each bootstrap needs: the zero-shot base model needs only the tasks (expert replay).
BOOTSTRAP = ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"]


def base_plan(key: Callable[[int], str], iterations: int, evaluate_start: bool) -> list[Stage]:
    """The base model recorded as checkpoint 0 and evaluated: no training."""
    return [("bootstrap", None, ["expert_trajectories"]), ("base:0", key(0), ["base_checkpoint"]),
            ("evaluation:0", key(0), ["evaluation"])]


def sft_plan(key: Callable[[int], str], iterations: int, evaluate_start: bool) -> list[Stage]:
    """Bootstrap, one SFT (k=0), its evaluation."""
    return [("bootstrap", None, list(BOOTSTRAP)), ("sft:0", key(0), ["sft_checkpoint"]),
            ("evaluation:0", key(0), ["evaluation"])]


def _sft_each_k(rollouts: bool) -> Plan:
    def plan(key: Callable[[int], str], iterations: int, evaluate_start: bool) -> list[Stage]:
        stages: list[Stage] = [("bootstrap", None, list(BOOTSTRAP))]
        for k in range(iterations + 1):
            stages.append((f"sft:{k}", key(k), ["sft_checkpoint"]))
            if k < iterations and rollouts:
                stages.append((f"rollouts:{k}", key(k), ["rollouts", "gated_dataset"]))
            if k or evaluate_start or not iterations:
                stages.append((f"evaluation:{k}", key(k), ["evaluation"]))
        return stages
    return plan


flywheel_plan = _sft_each_k(rollouts=True)  # SFT at every k on seeds + curriculum + gated rollouts
control_plan = _sft_each_k(rollouts=False)  # SFT at every k, no rollouts, no gate


def _from_sft(update: Callable[[Callable[[int], str], int], list[Stage]]) -> Plan:
    """A k=0 SFT, then `update(key, k)`'s stages and an evaluation at each k = 1..K."""
    def plan(key: Callable[[int], str], iterations: int, evaluate_start: bool) -> list[Stage]:
        stages: list[Stage] = [("bootstrap", None, list(BOOTSTRAP)), ("sft:0", key(0), ["sft_checkpoint"])]
        if evaluate_start or not iterations:
            stages.append(("evaluation:0", key(0), ["evaluation"]))
        for k in range(1, iterations + 1):
            stages += update(key, k) + [(f"evaluation:{k}", key(k), ["evaluation"])]
        return stages
    return plan


dpo_plan = _from_sft(lambda key, k: [(f"rollouts:{k - 1}", key(k - 1), ["rollouts"]),
                                     (f"dpo:{k}", key(k), ["preference_pairs", "dpo_checkpoint"])])
grpo_plan = _from_sft(lambda key, k: [(f"grpo:{k}", key(k), ["grpo_checkpoint"])])


@dataclass(frozen=True)
class PaperPlace:
    """Where a method's arms stand in the paper's tables (flywheel/reports/paper.py). Table 1 and Fig. 2 show
    every method, in `METHODS` order, under its label; the rest only the methods that name a place here."""

    ablation: str = ""  # Table 2 (stage ablation): its row, each against the row before ("+ stage 1")
    ablation_per_k: bool = False  # Table 2: a row per k = 1..K, each against k-1 (self-refinement)
    comparison: str = ""  # Table 4 (SFT vs DPO vs GRPO vs BPO): its row ("SFT + DPO (ETO)")
    reference: bool = False  # Table 4 pairs every row with this method's arm (ReAct SFT)
    continues_reference: bool = False  # starts from the reference's k=0 (Table 4 pairs with the SFT they share)
    prompt_shape: str = ""  # Table 5 (k=0 prompt shapes): "fused", "fused, else" (when no fused arm ran), "react"
    prompt_note: str = ""  # Table 5: said after its prompt shape
    row: int = 100  # its rows' place in Tables 2 and 4, lowest first (arms of one method: the preset's order)


@dataclass(frozen=True)
class Method:
    """One training method: its name, label, stages and the fields it implies, as one value."""

    name: str
    label: str  # how tables name it
    plan: Plan  # its stages (see `method_stages`)
    implies: dict[str, dict[str, Any]] = field(default_factory=dict)  # resource fields, below an arm's own
    trains: bool = True  # False: the untrained base model (its k=0 has no training to vary)
    samples: bool = False  # its k > 0 learns from its own rollouts (what moves a run at k > 0)
    baseline_stages: tuple[str, ...] = ()  # stage-name prefixes `baselines_job` runs (its trainer's assets)
    equal_steps: bool = False  # k > 0 trains as many SFT steps as the arm `method.controls` names (the control)
    paper: PaperPlace = PaperPlace()


REACT = {"policy": {"history_mode": "react", "history_window": None},
         "curriculum": {"synthesize": False, "order": "shuffle"}}

METHODS: dict[str, Method] = {m.name: m for m in [
    Method("bpo", "BPO", flywheel_plan, samples=True,
           paper=PaperPlace(ablation="+ stage 3", ablation_per_k=True, comparison="BPO", row=4)),
    Method("base", "base (zero-shot)", base_plan, trains=False, baseline_stages=("base",),
           paper=PaperPlace(ablation="base", row=0)),
    Method("react-sft", "ReAct SFT", sft_plan, implies=REACT,
           paper=PaperPlace(comparison="SFT (ReAct)", reference=True, prompt_shape="react", row=0)),
    Method("bpo-stage1", "BPO stage 1", sft_plan, implies={"curriculum": {"synthesize": False, "order": "shuffle"}},
           paper=PaperPlace(ablation="+ stage 1", prompt_shape="fused", row=1)),
    Method("bpo-stage2", "BPO stage 2", sft_plan,
           paper=PaperPlace(ablation="+ stage 2", prompt_shape="fused, else",
                            prompt_note=", with stage 2's synthetic tasks", row=2)),
    Method("bpo-stage3", "BPO stage 3", flywheel_plan, samples=True,
           paper=PaperPlace(ablation="+ stage 3", ablation_per_k=True, comparison="BPO (stage 3)", row=3)),
    Method("rft", "RFT on ReAct SFT", flywheel_plan, implies={**REACT, "loop": {"gate_drops_seed_repeats": False, "clean_successes": False,
                                                                  "promotion_gate": False}},
           samples=True, paper=PaperPlace(continues_reference=True)),
    Method("eto-dpo", "SFT + DPO (ETO)", dpo_plan, implies=REACT, samples=True, baseline_stages=("dpo",),
           paper=PaperPlace(comparison="SFT + DPO (ETO)", continues_reference=True, row=1)),
    Method("grpo", "SFT + GRPO", grpo_plan, implies=REACT, samples=True, baseline_stages=("grpo",),
           paper=PaperPlace(comparison="SFT + GRPO", continues_reference=True, row=2)),
    # k > 0: the same SFT steps as the arm it controls (the runner reads them), none of the flywheel's data.
    Method("sft-control", "SFT, equal steps (control)", control_plan,
           implies={"policy": {"replay": "none"}, "loop": {"promotion_gate": False}},
           equal_steps=True),
]}


def register(method: Method) -> Method:
    """Add a method (e.g. one a test or a plugin defines) to `METHODS`, after the built-in ones (Table 1's
    order). A name already taken is refused."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered; choose another name")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    METHODS.pop(name, None)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def check_method(name: str) -> str:
    return get_method(name).name


def placed(has: Callable[[PaperPlace], Any]) -> list[Method]:
    """The methods whose paper place has `has(place)` true, in their rows' order (`PaperPlace.row`)."""
    return sorted((m for m in METHODS.values() if has(m.paper)), key=lambda m: m.paper.row)


def implied_sections(name: str) -> dict[str, dict[str, Any]]:
    """Resource fields the method implies (deep copies; the arm's own overrides are applied after)."""
    return {s: dict(f) for s, f in get_method(name).implies.items()}


def method_stages(benchmark: str, iterations: int, method: str = "bpo", *,
                  evaluate_start: bool = True) -> list[Stage]:
    """(stage, partition key or None for the benchmark partition, asset selection), in order.

    `evaluate_start=False` skips evaluation:0 of the methods that continue from a k=0 SFT (bpo-stage3, rft,
    eto-dpo, grpo): that SFT is trained exactly as another arm's (bpo-stage2's, react-sft's), whose k=0
    evaluation the tables use; the SFT itself still runs (it is where k=1 starts from)."""

    def key(k: int) -> str:
        return str(partition_key(benchmark, k))

    return get_method(method).plan(key, iterations, evaluate_start)


def job_for(stage: str) -> str:
    """Which Dagster job runs a stage: bootstrap_job, baselines_job (a method's `baseline_stages`) or
    iteration_job."""
    prefix = stage.split(":", 1)[0]
    if prefix == "bootstrap":
        return "bootstrap"
    return "baselines" if any(prefix in m.baseline_stages for m in METHODS.values()) else "iteration"
