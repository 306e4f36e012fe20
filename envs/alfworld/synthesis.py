"""Task synthesis for ALFWorld (curriculum stage 2): new goals written into a game's PDDL problem.

A synthesized task takes a training game (its scene: objects, receptacles, their
properties) and replaces the problem's `(:goal ...)` with one of the six ALFWorld task
types over objects and receptacles present in that scene, using ALFWorld's own goal
library (`alfworld.gen.goal_library`), and the intro's "Your task is to: ..." with the
matching template text. The TextWorld engine then checks the new goal itself (`won`),
and ALFWorld's handcoded expert (driven with the new task's parameters) solves it.

Params: {"base_game": "<train game id>", "task_type": one of the six (or alias),
         "object": object type as in the scene (e.g. "Apple"),
         "receptacle": receptacle type (e.g. "CounterTop"; not for look_at_obj_in_light),
         "toggle": "DeskLamp" or "FloorLamp" (look_at_obj_in_light only)}

Refused (ValueError with the reason): unknown game or task type; an object or receptacle
type absent from the scene; an object that cannot be picked up, heated, cooled or
cleaned as the type needs; no microwave / fridge / sink for heat / cool / clean; fewer
than two instances for pick_two; a receptacle that cannot hold the object (the scene's
`canContain`); a goal already true at the start; the base game's own goal; a goal and
scene equal to an evaluation game's.

Faithful subset: goals are the six base types without sliced objects or movable
receptacles (`pick_and_place_with_movable_recep` and the slice variants are not
proposed), the base game's initial state is kept as it is, and the expected lengths
offered to the teacher are typical walkthrough lengths per type, not measured ones.
Object and receptacle types are limited to those ALFWorld's own training games use with
the task type (e.g. no pick_two into a SinkBasin).

A new game's `walkthrough` is never empty: TextWorld's PddlEnv runs the planner at every
reset when it is (`self.walkthrough or replan()`), which took over 400 s on some kitchen
games. It holds `["look"]` until the expert has solved the task, then the expert's path.
`make_env` also caps a synthesized game's load and solve at `SYNTH_TIMEOUT_S`.
Games are written under `<cache>/alfworld_synthetic/`; `SyntheticAlfWorldEnv` plays
a task whose `meta["game_file"]` names such a game.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from envs.alfworld.data import alfworld_root, game_file, load_index
from envs.alfworld.env import AlfWorldEnv, strip_banner
from envs.alfworld.expert import EXPERT_MAX_STEPS, expert_limit, without_looks
from envs.alfworld.tasks import ALIASES, DEFAULT_MAX_STEPS, TASK_TYPES, task_type_of
from envs.base import Env, Task
from envs.data import cache_dir

SYNTH_DIR = "alfworld_synthetic"
RANK = {"look_at_obj_in_light": 0, "pick_and_place_simple": 1, "pick_clean_then_place_in_recep": 2,
        "pick_heat_then_place_in_recep": 2, "pick_cool_then_place_in_recep": 2, "pick_two_obj_and_place": 3}
TYPICAL_LENGTH = {"look_at_obj_in_light": 4, "pick_and_place_simple": 5, "pick_clean_then_place_in_recep": 7,
                  "pick_heat_then_place_in_recep": 7, "pick_cool_then_place_in_recep": 7, "pick_two_obj_and_place": 9}
NEEDS = {  # task type -> (object property, appliance receptacle types)
    "pick_clean_then_place_in_recep": ("cleanable", ("SinkBasin", "BathtubBasin")),
    "pick_heat_then_place_in_recep": ("heatable", ("Microwave",)),
    "pick_cool_then_place_in_recep": ("coolable", ("Fridge",)),
}
LAMPS = ("DeskLamp", "FloorLamp")
SYNTH_TIMEOUT_S = 90.0  # seconds a synthesized game may take to load or be solved
PLACEHOLDER_WALKTHROUGH = ("look",)  # non-empty, so TextWorld does not plan at reset (see module doc)
SCHEMA = """params for an ALFWorld goal in an existing training scene:
  "base_game": the training game whose scene (objects, receptacles) is used,
  "task_type": pick_and_place_simple | look_at_obj_in_light | pick_clean_then_place_in_recep |
               pick_heat_then_place_in_recep | pick_cool_then_place_in_recep | pick_two_obj_and_place,
  "object": an object type present in that scene (e.g. "Apple"),
  "receptacle": a receptacle type present in that scene (not for look_at_obj_in_light),
  "toggle": "DeskLamp" or "FloorLamp" (look_at_obj_in_light only)."""

_GOAL_TASK = re.compile(r'("task":\s*\[\s*\{\s*"rhs":\s*")Your task is to: [^"]*(")')


@dataclass
class Scene:
    """What a game's PDDL problem says about its objects and receptacles (by type)."""

    objects: dict[str, list[str]] = field(default_factory=dict)  # type -> object ids
    receptacles: dict[str, list[str]] = field(default_factory=dict)  # type -> receptacle ids
    props: dict[str, set[str]] = field(default_factory=dict)  # property -> object ids
    can_contain: set[tuple[str, str]] = field(default_factory=set)  # (receptacle type, object type)
    in_receptacle: set[tuple[str, str]] = field(default_factory=set)  # (object id, receptacle id)

    def having(self, obj_type: str, prop: str) -> list[str]:
        return [o for o in self.objects.get(obj_type, []) if o in self.props.get(prop, set())]

    def pickable_types(self, prop: str | None = None, at_least: int = 1) -> list[str]:
        out = []
        for t in sorted(self.objects):
            ids = [o for o in self.having(t, "pickupable") if prop is None or o in self.props.get(prop, set())]
            if len(ids) >= at_least:
                out.append(t)
        return out


def parse_scene(problem: str) -> Scene:
    scene = Scene()
    for oid, t in re.findall(r"\(objectType (\S+) (\w+)Type\)", problem):
        scene.objects.setdefault(t, []).append(oid)
    for rid, t in re.findall(r"\(receptacleType (\S+) (\w+)Type\)", problem):
        scene.receptacles.setdefault(t, []).append(rid)
    for prop in ("pickupable", "heatable", "coolable", "cleanable", "toggleable", "sliceable", "isReceptacleObject"):
        scene.props[prop] = set(re.findall(rf"\({prop} (\S+)\)", problem))
    scene.can_contain = set(re.findall(r"\(canContain (\w+)Type (\w+)Type\)", problem))
    init = problem.split("(:goal", 1)[0]
    scene.in_receptacle = set(re.findall(r"\(inReceptacle (\S+) (\S+)\)", init))
    return scene


@lru_cache(maxsize=256)
def _load_game(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _folder_parts(game_id: str) -> tuple[str, str, str, str, str]:
    folder = game_id.split("/", 1)[0]
    parts = folder.split("-")
    if len(parts) != 5:
        raise ValueError(f"not an ALFWorld game id: {game_id!r}")
    return parts[0], parts[1], parts[2], parts[3], parts[4]


@lru_cache(maxsize=4)
def _observed(root: str) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """task type -> (object types, receptacle/lamp types) that ALFWorld's own training games use with it."""
    seen: dict[str, tuple[set[str], set[str]]] = {}
    for game_id in load_index(Path(root)).get("train", {}):
        try:
            task_type, obj, _, parent, _ = _folder_parts(game_id)
        except ValueError:
            continue
        objs, receps = seen.setdefault(task_type, (set(), set()))
        objs.add(obj.removesuffix("Sliced"))
        receps.add(parent)
    return {k: (frozenset(o), frozenset(r)) for k, (o, r) in seen.items()}


def _goal_pddl(task_type: str, obj: str, recep: str, toggle: str) -> str:
    from alfworld.gen.goal_library import gdict

    return gdict[task_type]["pddl"].format(obj=obj, recep=recep, toggle=toggle, mrecep="").replace("#", "-")


def _goal_text(task_type: str, obj: str, recep: str, toggle: str, pick: int) -> str:
    from alfworld.gen.goal_library import gdict

    templates = gdict[task_type]["templates"]
    text = templates[pick % len(templates)].format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")
    return text.strip().rstrip(".") + "."


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


class SyntheticAlfWorldEnv(AlfWorldEnv):
    """`AlfWorldEnv` that also plays synthesized games (`task.meta["game_file"]`)."""

    def reset(self, task: Task) -> str:
        path = task.meta.get("game_file")
        if not path:
            return super().reset(task)
        if not Path(path).is_file():
            raise ValueError(f"synthesized game {path} of {task.task_id} is missing")
        self.worker.begin_episode()
        self._task, self._steps, self._done = task, 0, False
        self._last = self.worker.call("reset", game_file=str(path))
        observation = self._last["observation"]
        return strip_banner(observation) if self.strip_banner else observation


class AlfWorldSynthesizer:
    benchmark = "alfworld"

    def __init__(self, root: str | None = None, expert_seed: int = 0, max_steps: int = DEFAULT_MAX_STEPS,
                 expert_path_steps: int | None = None) -> None:
        self.root = root
        self.expert_seed = expert_seed
        self.max_steps = max_steps  # the spec's episode limit: a synthesized task gets the seeds' limit
        self.expert_path_steps = expert_path_steps  # and the seeds' longest searching path (AlfWorldSpec)

    def proposal_schema(self) -> str:
        return SCHEMA

    def _scene(self, base_game: str) -> tuple[Path, dict[str, Any], Scene]:
        root = alfworld_root(self.root)
        if base_game not in load_index(root).get("train", {}):
            raise ValueError(f"base_game {base_game!r} is not a training game")
        path = game_file(root, "train", base_game)
        game = _load_game(str(path))
        return path, game, parse_scene(game["pddl_problem"])

    # ------------------------------------------------------------------ candidates
    def candidates(self, seeds: Sequence[Task], *, holdout: Sequence[Task], limit: int, seed: int = 0) -> list[dict[str, Any]]:
        out_harder: list[dict[str, Any]] = []
        out_other: list[dict[str, Any]] = []
        order = list(seeds)
        random.Random(f"alfworld-synthesis:{seed}").shuffle(order)  # many seeds: a spread of scenes and types
        for t in order:
            if len(out_harder) + len(out_other) >= 3 * limit:
                break
            if t.meta.get("game_file"):
                continue
            rng = random.Random(f"alfworld-synthesis:{seed}:{t.task_id}")
            try:
                _, _, scene = self._scene(t.task_id)
            except (ValueError, OSError):
                continue
            seed_type = task_type_of(t.task_id)
            types = list(TASK_TYPES)
            rng.shuffle(types)
            for task_type in types:
                if task_type == seed_type and RANK[task_type] < 3:
                    continue
                params = self._random_params(t.task_id, task_type, scene, rng)
                if params is None:
                    continue
                try:
                    self.instantiate(params, seeds=seeds, holdout=holdout, write=False)
                except ValueError:
                    continue
                kind = "harder_task_type" if RANK[task_type] > RANK.get(seed_type, 0) else "other_goal_same_scene"
                note = f"{task_type} with {params['object']} in the scene of {t.task_id.split('/')[0]}"
                cand = {"kind": kind, "params": params, "expected_length": TYPICAL_LENGTH[task_type], "note": note}
                (out_harder if kind == "harder_task_type" else out_other).append(cand)
        out_harder.sort(key=lambda c: -c["expected_length"])
        out: list[dict[str, Any]] = []
        while len(out) < limit and (out_harder or out_other):
            for q in (out_harder, out_other):
                if q and len(out) < limit:
                    out.append(q.pop(0))
        return out

    def _random_params(self, base: str, task_type: str, scene: Scene, rng: random.Random) -> dict[str, Any] | None:
        prop = NEEDS.get(task_type, (None, ()))[0]
        objs_ok, receps_ok = _observed(str(alfworld_root(self.root).resolve())).get(task_type, (frozenset(), frozenset()))
        objs = [o for o in scene.pickable_types(prop, at_least=2 if task_type == "pick_two_obj_and_place" else 1)
                if o in objs_ok]
        if not objs:
            return None
        obj = rng.choice(objs)
        if task_type == "look_at_obj_in_light":
            lamps = [lamp for lamp in LAMPS if scene.having(lamp, "toggleable") and lamp in receps_ok]
            return {"base_game": base, "task_type": task_type, "object": obj, "toggle": lamps[0]} if lamps else None
        receps = sorted(r for r in scene.receptacles if (r, obj) in scene.can_contain and r in receps_ok)
        if not receps:
            return None
        return {"base_game": base, "task_type": task_type, "object": obj, "receptacle": rng.choice(receps)}

    # ------------------------------------------------------------------ instantiate
    def instantiate(self, params: dict[str, Any], *, seeds: Sequence[Task], holdout: Sequence[Task], write: bool = True) -> Task:
        unknown = sorted(set(params) - {"base_game", "task_type", "object", "receptacle", "toggle"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected base_game, task_type, object, receptacle, toggle")
        for name in ("base_game", "task_type", "object"):
            if not isinstance(params.get(name), str) or not params[name].strip():
                raise ValueError(f"{name} must be a non-empty string")
        task_type = ALIASES.get(params["task_type"], params["task_type"])
        if task_type not in TASK_TYPES:
            raise ValueError(f"unknown task type {params['task_type']!r}; known: {', '.join(TASK_TYPES)}")
        base = params["base_game"].strip().strip("/")
        path, game, scene = self._scene(base)
        obj = self._match(params["object"], scene.objects, "object")
        look = task_type == "look_at_obj_in_light"
        recep = toggle = ""
        instances = scene.having(obj, "pickupable")
        if not instances:
            raise ValueError(f"{obj} cannot be picked up")
        if look:
            toggle = self._match(str(params.get("toggle") or ""), {k: v for k, v in scene.objects.items() if k in LAMPS}, "lamp")
            if not scene.having(toggle, "toggleable"):
                raise ValueError(f"the {toggle} in this scene cannot be switched on")
        else:
            if not isinstance(params.get("receptacle"), str):
                raise ValueError(f"{task_type} needs a receptacle")
            recep = self._match(params["receptacle"], scene.receptacles, "receptacle")
            if (recep, obj) not in scene.can_contain:
                raise ValueError(f"a {recep} cannot hold a {obj} in this scene (no canContain)")
        if task_type in NEEDS:
            prop, appliances = NEEDS[task_type]
            if not any(a in scene.receptacles for a in appliances):
                raise ValueError(f"{task_type} needs a {' or '.join(appliances)}, and this scene has none")
            if not any(o in scene.props[prop] for o in instances):
                raise ValueError(f"no {obj} in this scene is {prop}")
        if task_type == "pick_two_obj_and_place" and len(instances) < 2:
            raise ValueError(f"pick_two needs two {obj}s; this scene has {len(instances)}")
        if task_type in ("pick_and_place_simple", "pick_two_obj_and_place"):
            recep_ids = set(scene.receptacles.get(recep, []))
            already = sum(1 for o in instances if any((o, r) in scene.in_receptacle for r in recep_ids))
            if already >= (2 if task_type == "pick_two_obj_and_place" else 1):
                raise ValueError(f"the goal is already true at the start ({already} {obj} already in a {recep})")
        objs_ok, receps_ok = _observed(str(alfworld_root(self.root).resolve())).get(task_type, (frozenset(), frozenset()))
        if obj not in objs_ok:
            raise ValueError(f"ALFWorld's training games never ask {task_type} of a {obj} (they use: {', '.join(sorted(objs_ok))})")
        if (toggle or recep) not in receps_ok:
            raise ValueError(f"ALFWorld's training games never use a {toggle or recep} for {task_type} "
                             f"(they use: {', '.join(sorted(receps_ok))})")
        b_type, b_obj, _, b_parent, scene_no = _folder_parts(base)
        folder = f"{task_type}-{obj}-None-{toggle or recep}-{scene_no}"
        if (task_type, obj.lower(), (toggle or recep).lower()) == (b_type, b_obj.lower(), b_parent.lower()):
            raise ValueError(f"same goal as its base game {base}")
        held = {t.task_id.split("/", 1)[0].lower() for t in holdout}
        if folder.lower() in held:
            raise ValueError(f"same goal and scene as an evaluation game ({folder})")
        seed_folders = {t.task_id.split("/", 1)[0].lower() for t in seeds}
        if folder.lower() in seed_folders and base.split("/", 1)[-1] in {t.task_id.split("/", 1)[-1] for t in seeds}:
            raise ValueError(f"same goal as a seed task ({folder})")
        pick = int(hashlib.sha1(folder.encode()).hexdigest(), 16)
        text = _goal_text(task_type, obj, recep, toggle, pick)
        task_id = f"synth/{folder}/{base.split('/', 1)[-1]}"
        traj = {"task_type": task_type, "task_id": task_id,
                "pddl_params": {"object_target": obj, "object_sliced": False, "mrecep_target": "",
                                "parent_target": recep, "toggle_target": toggle},
                "scene": {"scene_num": int(scene_no)}, "synthesized_from": base}
        out = self._write_game(game, task_id, task_type, obj, recep, toggle, text, traj) if write else None
        return Task(
            benchmark=self.benchmark, split="synthetic", task_id=task_id, goal=text, max_steps=self.max_steps,
            meta={"task_type": task_type, "synthetic": True, "base_game": base, "game_file": str(out) if out else "",
                  "traj_data": traj, "base_game_file": str(path)},
        )

    @staticmethod
    def _match(name: str, present: dict[str, list[str]], what: str) -> str:
        wanted = re.sub(r"[^a-z]", "", name.lower())
        for t in present:
            if t.lower() == wanted:
                return t
        shown = ", ".join(sorted(present)) or "none"
        raise ValueError(f"no {what} of type {name!r} in this scene (present: {shown})")

    def _write_game(self, game: dict[str, Any], task_id: str, task_type: str, obj: str, recep: str, toggle: str,
                    text: str, traj: dict[str, Any]) -> Path:
        problem = game["pddl_problem"]
        start = problem.index("(:goal")
        new_problem = problem[:start] + _goal_pddl(task_type, obj, recep, toggle).strip() + "\n"
        grammar, n = _GOAL_TASK.subn(lambda m: m.group(1) + "Your task is to: " + text + m.group(2), game["grammar"])
        if n != 1:
            raise ValueError("the base game's grammar has no single 'Your task is to:' line to rewrite")
        new_game = {**game, "pddl_problem": new_problem, "grammar": grammar, "walkthrough": list(PLACEHOLDER_WALKTHROUGH)}
        digest = hashlib.sha1(json.dumps([task_id, new_problem[-4000:], text]).encode()).hexdigest()[:16]
        folder = cache_dir() / SYNTH_DIR / digest
        folder.mkdir(parents=True, exist_ok=True)
        for name, payload in (("game.tw-pddl", new_game), ("traj_data.json", traj)):
            _write_json(folder / name, payload)
        return folder / "game.tw-pddl"

    # ------------------------------------------------------------------ env and expert
    def make_env(self, **options: Any) -> Env:
        options.setdefault("root", self.root)
        options.setdefault("step_timeout_s", SYNTH_TIMEOUT_S)
        return SyntheticAlfWorldEnv(**options)

    def solve(self, task: Task, env: Env) -> list[str]:
        """ALFWorld's handcoded expert, driven with the synthesized task's parameters, in the env's worker."""
        if not isinstance(env, SyntheticAlfWorldEnv):
            raise ValueError("ALFWorld synthesis needs a SyntheticAlfWorldEnv")
        options = {"seed": self.expert_seed, "max_steps": EXPERT_MAX_STEPS, "fix_move_tracking": True}
        env.worker.begin_episode()
        result = env.worker.call("expert", game_file=task.meta["game_file"], traj_data=task.meta["traj_data"],
                                 walkthrough=[], options=options)
        expert = result["handcoded"]
        if not expert["won"]:
            raise ValueError(f"the handcoded expert did not win: stopped by {expert['stopped']} after {len(expert['actions'])} actions")
        # Without its no-op `look`s, as the seeds' paths (`expert.choose`); the caller replays it to a win.
        actions = without_looks(expert["actions"])
        if len(actions) > (limit := expert_limit(task.max_steps, self.expert_path_steps)):
            raise ValueError(f"the handcoded expert needed {len(actions)} actions, over the limit of {limit}")
        path = Path(task.meta["game_file"])
        game = json.loads(path.read_text())
        if game.get("walkthrough") != actions:  # the game file now carries a real solution
            _write_json(path, {**game, "walkthrough": actions})
        return actions
