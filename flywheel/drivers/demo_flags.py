"""The demo's setting flags: read by the command line's parser (without importing anything heavy, so that
`flywheel --help` stays fast) and by the demo driver (`flywheel/drivers/demo.py`)."""

from __future__ import annotations

# The demo's settings: flag -> (resource section, field, the demo's value). The option itself (its help text
# and bound) is declared once, on its resource field (flywheel/core/options.py); the flag's help and range
# check are read from there (`demo_field_class` in flywheel/drivers/demo.py). `inference` rows apply to the
# in-process transformers policy only. A value comes from the flag when it is given, else from the profile's
# section (so the demo trains as the UI's runs of the same profile do), else from the demo's value here
# (`demo_settings` in flywheel/drivers/demo.py).
#
# The defaults are sized so that `make demo` (ScienceWorld's three demo task types, SmolLM2-135M, the
# in-process transformers policy, packed SFT) shows the flywheel turning in under 15 minutes on a 2-core CPU
# (README "Two commands"): k=0 solves some evaluation tasks, the reward gate admits rollouts, and k=1 is
# compared with k=0 over the same tasks. Measured on a 2-core Xeon with AVX512-BF16 (bf16 autocast):
# an SFT step of 4 examples ~3.4 s; 16 greedy evaluation episodes ~1.5 min; 8 rollout episodes ~1 min; the
# whole demo 9.3-9.5 min in three clean-clone runs (11.0-11.1 with install and model conversion).
# - 8 training tasks x 1 sample = 8 rollout episodes at temperature 0.7 (seeds from the same 8 tasks, plus the
#   synthetic curriculum: ~30 SFT examples);
# - 8 evaluation tasks per split (seen, unseen) = 16 greedy episodes per checkpoint, one batch of 16 envs:
#   n=8 per split gives Wilson intervals ~35-50 points wide, so the table says how little a demo shows;
# - at most 5 env steps: the demo task types' shortcut gold paths are 2-4 steps;
# - 40 SFT steps of 4 examples at k=0 (about 5 passes; with 6 steps, as before, SmolLM2 only ever wrote
#   `look around` and the gate stayed empty in every run), learning rate 3e-4; k=1 continues from k=0 for at
#   most 12 steps (policy.refine_train_steps; whole passes: 9) on the seeds plus the gated successes; examples of at most 768 tokens
#   (longer ones are dropped; the demo's are ~450-650);
# - 6 training tasks set aside for the promotion gate: 6 greedy episodes of k=1 and of k=0 after k=1's SFT;
# - 2 past steps in a prompt, each cut to 250 characters: prompts of ~350-550 tokens;
# - 144 new tokens per step: the teacher's answers (thought, plan, action) are median 99, p95 118, longest 133
#   tokens (the SFT warns when an answer reaches the cap); generation stops at the action line;
# - 16 envs side by side: every episode of a generating asset in one batch;
# - an empty reward gate does not stop the demo (it trains k=1 anyway and says so), so a first run
#   shows every stage; a profile's `loop.continue_on_empty_gate: false` (or the flag) stops it there,
#   as the sensor would.
DEMO_FIELDS: dict[str, tuple[str, str, object]] = {
    "train_tasks": ("envs", "train_limit", 8),
    "eval_tasks": ("envs", "eval_limit", 8),
    "validation_tasks": ("envs", "validation_tasks", 6),
    "max_steps": ("envs", "max_steps", 5),
    "samples": ("policy", "samples_per_task", 1),
    "epochs": ("policy", "epochs", 3.0),
    "lr": ("policy", "learning_rate", 3e-4),
    "max_train_steps": ("policy", "max_train_steps", 40),
    "refine_train_steps": ("policy", "refine_train_steps", 12),
    "batch_size": ("policy", "batch_size", 4),
    "max_length": ("policy", "max_length", 768),
    "max_new_tokens": ("policy", "max_new_tokens", 144),
    "parallel_envs": ("policy", "parallel_envs", 16),
    "history_window": ("policy", "history_window", 2),
    "max_observation_chars": ("policy", "max_observation_chars", 250),
    "dtype": ("inference", "dtype", "auto"),
    "torch_threads": ("inference", "torch_threads", 0),
    "stop_on_loop": ("inference", "stop_on_loop", True),
    "continue_on_empty_gate": ("loop", "continue_on_empty_gate", True),
}
# Numeric flags checked against the bounds of the field named on the right (--iterations is loop.iterations).
DEMO_OPTIONS = {"iterations": "iterations", **{flag: field for flag, (_, field, _) in DEMO_FIELDS.items()}}
