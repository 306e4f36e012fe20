"""Resource fields declared once (flywheel/core/options.py): the launchpad shows each one's help text.

`setting(...)` declares a field the resource owns; `same_as(Config, "name")` exposes a plain config's field
with its default and help. Everything that needs a field's bound, help or k=0 role asks here, by class.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo

from flywheel.core.options import MISSING, Bound, option_default, option_field
from flywheel.core.validation import check_options


def setting(default: Any = MISSING, *, help: str, bound: Bound | None = None, sft0: bool = True,
            play: bool = True, greedy: bool = True, default_factory: Any = None) -> Any:
    """A resource field with its help text (the launchpad's description), bound, k=0 role and episode roles
    (see `option`)."""
    given = {"default_factory": default_factory} if default_factory is not None else \
        {} if default is MISSING else {"default": default}
    return Field(**given, description=help, json_schema_extra={"bound": bound, "sft0": sft0, "play": play,
                                                                        "greedy": greedy})


def same_as(config: type, name: str, **changes: Any) -> Any:
    """The resource field that mirrors `config.name`: its default, help, bound and k=0 role, unless `changes`
    (e.g. `sft0=False`, or how the Dagster config spells the same value: `default=""` for None) say otherwise."""
    f = option_field(config, name)
    meta = {"help": f.metadata["help"], "bound": f.metadata["bound"], "sft0": f.metadata["sft0"],
            "play": f.metadata["play"], "greedy": f.metadata["greedy"], **changes}
    if "default_factory" in changes:  # e.g. a list field over a tuple default
        return setting(**meta)
    return setting(meta.pop("default") if "default" in meta else option_default(f), **meta)


def _extra(info: FieldInfo) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def help_of(cls: type, name: str) -> str:
    """A resource field's help text ("" if it has none)."""
    return cls.model_fields[name].description or ""


def bounds_of(*classes: type) -> dict[str, Bound]:
    """Field name -> bound, over the resource classes given (a name bound twice must be bound the same)."""
    out: dict[str, Bound] = {}
    for cls in classes:
        for name, info in cls.model_fields.items():
            bound = _extra(info).get("bound")
            if bound is None:
                continue
            if out.setdefault(name, bound) != bound:
                raise TypeError(f"field {name!r} has two different bounds ({out[name]} and {bound})")
    return out


def check_fields(resource: Any, *, where: str) -> None:
    """Every field of `resource` within its declared bound (a ConfigurationError naming `where`+field)."""
    cls = type(resource)
    check_options({name: getattr(resource, name) for name in cls.model_fields}, bounds=bounds_of(cls), where=where)


def not_in_sft0(*classes: type) -> tuple[str, ...]:
    """The fields of these resource classes declared `sft0=False`: they cannot change a k=0 SFT."""
    return _declared_false("sft0", classes)


def not_in_play(*classes: type) -> tuple[str, ...]:
    """The fields of these resource classes declared `play=False`: they cannot change how a checkpoint plays an
    episode."""
    return _declared_false("play", classes)


def not_in_greedy_play(*classes: type) -> tuple[str, ...]:
    """The fields of these resource classes declared `play=False` or `greedy=False`: they cannot change how a
    checkpoint plays an episode greedily (eval_temperature 0)."""
    return tuple(sorted(set(_declared_false("play", classes)) | set(_declared_false("greedy", classes))))


def _declared_false(role: str, classes: tuple[type, ...]) -> tuple[str, ...]:
    return tuple(sorted({name for cls in classes for name, info in cls.model_fields.items()
                         if _extra(info).get(role) is False}))
