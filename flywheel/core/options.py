"""Options declared once: a field carries its default, its help text, its bound and whether it changes the k=0 SFT.

The way TRL's configs carry `metadata={"help": ...}`: the plain configs (`TrainConfig`, `RolloutConfig`,
`PromptShape`, `DPOSettings`, `GRPOSettings`, `VLLMServerConfig`) declare their fields with `option(...)`; the
Dagster resources (flywheel/resources/fields.py) expose them with `same_as(...)`, which copies the default and
the help, and declare their own fields with `setting(...)`. The launchpad, the CLI's `--help`, the bounds
checks (`flywheel.core.validation.check_options` where a profile or resource is built; `check_bounds` in a
plain config's `__post_init__`, as TRL's configs check themselves) and the fields an arm may change while
sharing another arm's k=0 SFT are all read from these declarations; nothing restates a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from typing import Any


@dataclasses.dataclass(frozen=True)
class Bound:
    """Allowed values of one numeric option: `lo..hi` (`lo` excluded when `open_lo`), plus `special` values."""

    lo: float
    hi: float
    integer: bool = True
    open_lo: bool = False
    special: tuple[tuple[int, str], ...] = ()  # (value, what it means), e.g. ((-1, "use epochs"),)
    why: str = ""  # what the number is, for the error message

    def allows(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not float(value).is_integer():
            return False
        if value in dict(self.special):
            return True
        return (self.lo < value if self.open_lo else self.lo <= value) and value <= self.hi

    def describe(self) -> str:
        def num(x: float) -> str:  # 1000000, not 1e+06
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        kind = "an integer" if self.integer else "a number"
        lo = f"> {num(self.lo)} and <= {num(self.hi)}" if self.open_lo else f"in {num(self.lo)}..{num(self.hi)}"
        extra = "".join(f" or {v} ({meaning})" for v, meaning in self.special)
        return f"{kind} {lo}{extra}"

    def refusal(self, name: str, value: Any) -> str:
        """The one-line error for `name` = `value` outside this bound: the field, its range and the fix."""
        why = f" ({self.why})" if self.why else ""
        return f"{name} must be {self.describe()}{why}, got {value!r}: set {name} within that range."


def option(default: Any = MISSING, *, help: str, bound: Bound | None = None, sft0: bool = True,
           play: bool = True, greedy: bool = True, default_factory: Any = MISSING, hash: bool | None = None) -> Any:
    """A dataclass field with its help text, its bound (numeric options), `sft0`: False when the field
    cannot change a k=0 SFT (how rollouts sample, how k > 0 trains), so an arm that differs from another only
    in such fields may share that arm's k=0 checkpoint, and `play`: False when it cannot change how a given
    checkpoint plays an episode (which tasks get how many episodes, where they run, how k > 0 trains), so arms
    sharing a k=0 that differ only in such fields may share its episodes, and `greedy`: False when it changes an
    episode only through sampling (the rollouts' seed and temperature), so never one played greedily (the
    promotion gate's validation games at eval_temperature 0). `hash` is dataclasses.field's."""
    return dataclasses.field(default=default, default_factory=default_factory, hash=hash,
                             metadata={"help": help, "bound": bound, "sft0": sft0, "play": play, "greedy": greedy})


def option_field(config: type, name: str) -> dataclasses.Field:
    """The declaration of `config.name` (a plain dataclass declared with `option`)."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if "help" not in f.metadata:
                raise TypeError(f"{config.__name__}.{name} is not declared with option(help=...)")
            return f
    raise AttributeError(f"{config.__name__} has no field {name!r}")


def check_bounds(config: Any, *, where: str = "") -> None:
    """Every field of a plain config (declared with `option`) within its bound, as TRL's `__post_init__` checks:
    a ValueError naming `where` + the field and its range. None is unset, allowed."""
    for f in dataclasses.fields(config):
        bound, value = f.metadata.get("bound"), getattr(config, f.name)
        if bound is not None and value is not None and not bound.allows(value):
            raise ValueError(bound.refusal(f"{where}{f.name}", value))


def option_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
