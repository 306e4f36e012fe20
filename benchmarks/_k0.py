"""A preset's k=0 SFT set, built by the project's own code (no training): what `sft_checkpoint` would train on.

Runs the arm's bootstrap (expert paths, teacher annotation, curriculum) into a temporary folder, orders the
trajectories as `sft_checkpoint` does (the curriculum's easy -> hard, or shuffled), and builds the SFT
examples with the preset's prompt shape. Used by answer_budget.py and sft_packing.py.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402

from flywheel.assets.training import training_set  # noqa: E402
from flywheel.config.presets import arm_resources, load_preset  # noqa: E402
from flywheel.curriculum.order import grade  # noqa: E402
from flywheel.definitions import build_defs  # noqa: E402
from flywheel.drivers.experiment import resolve_model  # noqa: E402
from flywheel.drivers.pipeline import run_stage  # noqa: E402
from flywheel.orchestration.methods import method_stages  # noqa: E402
from flywheel.policy.sft import TrainConfig, sft_examples  # noqa: E402
from flywheel.profile import Profile  # noqa: E402


@dataclass
class K0Set:
    preset: str
    arm: str
    model: str  # the preset's base model folder
    trajectories: int
    examples: list[dict]  # prompt/completion rows with task_id and t, in training order
    cfg: TrainConfig  # the preset's SFT config for k=0 (order "given" when the curriculum orders)
    max_new_tokens: int


def k0_set(preset_name: str, arm: str | None = None, *, model_dir: Path | None = None) -> K0Set:
    preset = load_preset(preset_name)
    arm = arm or next(iter(preset.arms))
    with tempfile.TemporaryDirectory(prefix="k0-set-") as tmp:
        arm_dir = Path(tmp) / arm
        model = resolve_model(preset.model, model_dir or Path(tmp))
        res = arm_resources(preset, arm, arm_dir, model_path=model)
        defs = build_defs(res, profile=Profile(benchmarks=(preset.benchmark,), iterations=preset.max_partition))
        [(_, key, selection)] = [s for s in method_stages(preset.benchmark, preset.iterations, preset.method(arm))
                                 if s[0] == "bootstrap"]
        run_stage(defs.resolve_job_def("bootstrap_job"), key or preset.benchmark, selection,
                  dg.DagsterInstance.ephemeral())
        policy, curriculum, loop = res["policy"], res["curriculum"], res["loop"]
        trajs, _ = training_set(res["store"].get(), preset.benchmark, 0, include_synthetic=curriculum.synthesize,
                                refine_from=policy.refine_from, seed=policy.seed, replay=policy.replay,
                                drop_invalid_steps=loop.gate_drops_invalid_steps)
        spec = res["envs"].spec(preset.benchmark)
        cfg = policy.train_config(0)
        mode = curriculum.mode()
        if mode != "shuffle":  # as sft_checkpoint: easy to hard, walked in that order
            scored = curriculum.scorer().score_all(trajs, spec)
            trajs, _, _ = grade(trajs, scored, edges=curriculum.train_edges(preset.benchmark), mode=mode, seed=cfg.seed)
            cfg = replace(cfg, order="given")
        examples = sft_examples(trajs, lambda _t: spec.system_prompt(), cfg.prompt)
        res["envs"].close()
    return K0Set(preset.name, arm, str(model), len(trajs), examples, cfg, policy.max_new_tokens)
