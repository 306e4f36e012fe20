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
# The defaults are sized so that `make demo` (ScienceWorld's demo task types, SmolLM2-135M in float32,
# the in-process transformers policy) runs the whole chain in about 15 minutes on a 2-core AVX2 CPU
# (README "Two commands"). Measured there: an SFT step of 4 examples of ~550 tokens takes ~20-30 s;
# generation is the larger cost: a prefill of 16 prompts x 450 tokens ~15-45 s and each generated token
# ~0.3-1 s for the whole batch, so a generation "tick" (one env step of every episode in the batch) costs
# ~max_new_tokens decode steps, and each generating asset (rollouts, two evaluations) costs ~max_steps ticks.
# - 8 training tasks x 1 sample = 8 rollout episodes at temperature 0.7 (seeds from the same 8 tasks:
#   ~70 SFT examples with the synthetic curriculum);
# - 3 evaluation tasks per split (seen, unseen) = 6 greedy episodes per checkpoint, in one batch: a smoke
#   test of the chain; its table prints n and Wilson intervals, and n=3 says how little it shows;
# - at most 5 env steps: the demo task types' shortcut gold paths are 3-5 steps;
# - 6 SFT steps of 4 examples per checkpoint (24 of the ~70 examples), learning rate 3e-4 (a few steps
#   must teach the answer format), examples of at most 768 tokens (longer ones are dropped; the demo's
#   are ~450-650);
# - 2 past steps in a prompt, each cut to 250 characters: prompts of ~350-550 tokens;
# - 128 new tokens per step: the teacher's answers (thought, plan, action) are median ~110, p90 ~134
#   tokens; generation stops at the action line, and an answer stuck in a loop stops there;
# - 16 envs side by side: every episode of a generating asset in one batch;
# - an empty reward gate does not stop the demo (it trains k=1 anyway and says so), so a first run
#   shows every stage; a profile's `loop.continue_on_empty_gate: false` (or the flag) stops it there,
#   as the sensor would.
DEMO_FIELDS: dict[str, tuple[str, str, object]] = {
    "train_tasks": ("envs", "train_limit", 8),
    "eval_tasks": ("envs", "eval_limit", 3),
    "max_steps": ("envs", "max_steps", 5),
    "samples": ("policy", "samples_per_task", 1),
    "epochs": ("policy", "epochs", 3.0),
    "lr": ("policy", "learning_rate", 3e-4),
    "max_train_steps": ("policy", "max_train_steps", 6),
    "batch_size": ("policy", "batch_size", 4),
    "max_length": ("policy", "max_length", 768),
    "max_new_tokens": ("policy", "max_new_tokens", 128),
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
