"""Expert action sequences: ALFWorld's handcoded expert, else the game's walkthrough.

The handcoded expert searches receptacles the way an agent without a map must,
so its paths look like a good policy's; the walkthrough is the PDDL planner's
omniscient shortest path. The expert is preferred and the walkthrough used
where the expert fails or needs more steps than the task allows.

`solve` plays both through the real engine (run it in the worker process).
The expert is driven exactly as ALFWorld's `AlfredExpert` wrapper drives it
(first action "look"; a proposal that is not admissible becomes "look": `choose` drops
those no-op looks from the path it returns), with
one fix: ALFWorld 0.4.2 renamed `put` to `move` in the actions the expert
writes but not in its state tracking, so after a `move` it still believes it
holds the object. We feed that tracker the old verb.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envs.alfworld.worker import GameEngine

EXPERT_MAX_STEPS = 150  # how long the expert may search before it counts as failed


class _MoveAwareTracking:
    """Mixin for ALFWorld's TW policies: track `move X to Y` like the old `put X in Y`."""

    def update_state_tracking(self, game_state: Any, last_action: str) -> None:
        if last_action.startswith("move "):
            last_action = "put " + last_action[len("move ") :]
        super().update_state_tracking(game_state, last_action)  # type: ignore[misc]


def _make_agent(traj: dict[str, Any], max_steps: int, fix_move_tracking: bool) -> Any:
    """`HandCodedTWAgent` set up from traj_data in memory (its `reset` reads a file)."""
    import alfworld.gen.constants as constants
    from alfworld.agents.expert import HandCodedTWAgent

    agent = HandCodedTWAgent(max_steps=max_steps + 1)
    params = {**traj["pddl_params"], "task_type": traj["task_type"]}
    agent.task_params = {k: v.lower() if v in constants.OBJECTS else v for k, v in params.items()}
    policy = agent.get_task_policy(agent.task_params)
    if fix_move_tracking:
        policy = type(policy.__name__, (_MoveAwareTracking, policy), {})
    agent.policy = policy(agent.task_params, max_steps=max_steps + 1)
    return agent


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The expert breaks ties with the global `random`; make it repeatable, then restore."""
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


def play_handcoded(
    game_file: Path,
    traj: dict[str, Any],
    *,
    engine: GameEngine,
    seed: int = 0,
    max_steps: int = EXPERT_MAX_STEPS,
    fix_move_tracking: bool = True,
) -> dict[str, Any]:
    """Run the handcoded expert on an engine built with `facts=True`; returns {"actions", "won", "stopped"}."""
    from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

    actions: list[str] = []
    with _seeded(seed):
        state = engine.reset(str(game_file))
        agent = _make_agent(traj, max_steps, fix_move_tracking)
        agent.observe(state["feedback"])
        action = "look"
        while len(actions) < max_steps:
            state = engine.step(action)  # engine errors propagate: they are not the expert's fault
            actions.append(action)
            if state["won"]:
                return {"actions": actions, "won": True, "stopped": "won"}
            try:
                proposal = agent.act(state, 0, state["won"], action)
            except (HandCodedAgentFailed, HandCodedAgentTimeout) as exc:
                return {"actions": actions, "won": False, "stopped": type(exc).__name__}
            except (IndexError, KeyError, ValueError) as exc:  # the expert's own bugs, e.g. nothing left to search
                return {"actions": actions, "won": False, "stopped": f"{type(exc).__name__}: {exc}"}
            action = proposal if proposal in state["admissible_commands"] else "look"
    return {"actions": actions, "won": False, "stopped": "max_steps"}


def replay(game_file: Path, actions: list[str], *, engine: GameEngine) -> bool:
    """Whether `actions` win the game (used to check walkthroughs)."""
    state = engine.reset(str(game_file))
    for action in actions:
        state = engine.step(action)
        if state["won"]:
            return True
    return bool(state["won"])


def solve(game_file: Path, traj: dict[str, Any], walkthrough: list[str], *, engine: GameEngine, **options: Any) -> dict[str, Any]:
    """Both sources for one game: {"handcoded": play_handcoded(...), "walkthrough_won": bool}."""
    return {
        "handcoded": play_handcoded(game_file, traj, engine=engine, **options),
        "walkthrough_won": replay(game_file, walkthrough, engine=engine),
    }


def without_looks(actions: list[str]) -> list[str]:
    """The handcoded path without its `look`s: the wrapper's opening one and those standing in for an
    inadmissible proposal. `look` changes nothing in the game (it re-describes the current place, and at the
    start "you see nothing"; the agent's first observation already lists the room), so the rest still wins;
    kept, they taught the policy to spend its first step on it (cpu-alfworld's first k=0: 12 of 18 seeds
    opened with `look`, and the policy did on 129 of 129 evaluation games)."""
    return [a for a in actions if a != "look"]


def expert_limit(max_steps: int, expert_path_steps: int | None) -> int:
    """The longest searching-expert path a seed or synthesized task may take: the episode's limit, or less."""
    return max_steps if expert_path_steps is None else min(max_steps, expert_path_steps)


def choose(result: dict[str, Any], walkthrough: list[str], max_steps: int) -> tuple[list[str], str]:
    """The action list to use and its source ("handcoded", without its `look`s, or "walkthrough")."""
    expert = result["handcoded"]
    path = without_looks(expert["actions"])
    if expert["won"] and len(path) <= max_steps:
        return path, "handcoded"
    if result["walkthrough_won"] and len(walkthrough) <= max_steps:
        return list(walkthrough), "walkthrough"
    raise ValueError(
        f"No expert path within {max_steps} steps: handcoded stopped by {expert['stopped']} after "
        f"{len(expert['actions'])} actions; walkthrough ({len(walkthrough)} actions) won={result['walkthrough_won']}."
    )
