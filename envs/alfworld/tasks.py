"""ALFWorld splits as `Task` lists: train / seen / unseen, in a fixed order (types interleaved, see `load_tasks`).

seen = all 140 `valid_seen` games, unseen = the 134 `valid_unseen` games (the
ETO/MPO protocol's list), train = the 3,553 `train` games. Task ids are the
relative game folders, e.g. "pick_heat_then_place_in_recep-Apple-None-GarbageCan-10/trial_T2019...".
"""

from __future__ import annotations

from itertools import zip_longest
from pathlib import Path

from envs.alfworld.data import alfworld_root, load_index
from envs.base import Task
from envs.data import require

BENCHMARK = "alfworld"
DEFAULT_MAX_STEPS = 40  # the ETO protocol's limit
ETO_UNSEEN_IDS = "splits/eto/alfworld_unseen_gamefile_id.txt"

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
ALIASES = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
}
SPLIT_FOLDERS = {"train": "train", "seen": "valid_seen", "unseen": "valid_unseen", "valid_train": "valid_train"}


def split_folder(split: str) -> str:
    """Folder under json_2.1.1/ for a flywheel split name (raw folder names also accepted)."""
    if split in SPLIT_FOLDERS:
        return SPLIT_FOLDERS[split]
    if split in SPLIT_FOLDERS.values():
        return split
    raise ValueError(f"Unknown ALFWorld split {split!r}. Known: {', '.join(SPLIT_FOLDERS)}.")


def resolve_task_types(names: tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """Full task-type names from full names or short aliases; ValueError on unknown ones."""
    if names is None:
        return None
    resolved = []
    for name in names:
        full = ALIASES.get(name, name)
        if full not in TASK_TYPES:
            raise ValueError(f"Unknown ALFWorld task type {name!r}. Known: {', '.join(TASK_TYPES)} or {', '.join(ALIASES)}.")
        resolved.append(full)
    return tuple(resolved)


def task_type_of(game_id: str) -> str:
    return game_id.split("-", 1)[0]


def _rounds(groups: list[list[str]]) -> list[str]:
    """The first of every group, then the second of every group, and so on."""
    return [g for row in zip_longest(*groups) for g in row if g is not None]


def spread(game_ids: list[str]) -> list[str]:
    """One type's games in an order whose every prefix spreads over objects, then rooms: one game of each
    object in turn (objects in name order), each object's games one room at a time, trials last.

    A game id is `TYPE-OBJECT-MOVABLE-RECEPTACLE-ROOM/trial_...`; in sorted order a type's first 12 training
    games are 4 rooms x 3 trials of one object (all `AlarmClock` for pick and look, all `Apple` for heat),
    and a policy trained on seeds drawn that way learns those objects, not the task (the evaluation games hold
    21 objects for pick alone).
    """
    by_object: dict[str, dict[str, list[str]]] = {}
    for game_id in sorted(game_ids):
        parts = game_id.split("/", 1)[0].split("-")
        by_object.setdefault(parts[1], {}).setdefault(parts[-1], []).append(game_id)
    return _rounds([_rounds(list(rooms.values())) for _, rooms in sorted(by_object.items())])


def load_tasks(
    split: str,
    *,
    limit: int | None = None,
    task_types: tuple[str, ...] | None = None,
    root: str | Path | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[Task]:
    """Tasks of a split, filtered by type before `limit` applies: one game of each type in turn (types in
    `TASK_TYPES` order), each type's games in `spread` order (objects, then rooms, in turn).

    Game ids begin with their type, so sorted order groups the games by type: the first 40 training games of
    three types would all be `look_at_obj_in_light` (308 of them), and a preset's seeds and rollout tasks
    (a `limit` prefix) would cover one type. Interleaved, a prefix holds as many games of each type as it can,
    give or take one, and within a type as many objects and rooms as it can.
    """
    folder = split_folder(split)
    base = alfworld_root(root)
    games = load_index(base).get(folder, {})
    wanted = resolve_task_types(task_types)
    ids_by_type: dict[str, list[str]] = {kind: [] for kind in TASK_TYPES}
    for game_id in games:
        if wanted is None or task_type_of(game_id) in wanted:
            ids_by_type[task_type_of(game_id)].append(game_id)
    ordered = _rounds([spread(ids) for ids in ids_by_type.values()])
    tasks = [
        Task(
            benchmark=BENCHMARK,
            split=split,
            task_id=game_id,
            goal=games[game_id]["goal"],
            max_steps=max_steps,
            meta={"task_type": task_type_of(game_id), "split_folder": folder,
                  "walkthrough": tuple(games[game_id]["walkthrough"])},
        )
        for game_id in ordered
    ]
    return tasks if limit is None else tasks[:limit]


def eto_unseen_ids() -> list[str]:
    """The ETO/MPO protocol's 134 unseen game ids, as listed in the shared splits file."""
    lines = require(ETO_UNSEEN_IDS).read_text().splitlines()
    return [line.strip().strip("/") for line in lines if line.strip()]
