"""The option tables of docs/configuration.md, rendered from the fields' declarations (their one source).

`python -m flywheel.config.reference` rewrites each block between `<!-- options: CLASS -->` and
`<!-- /options -->` in docs/configuration.md; `tests/project/test_options.py` checks the committed page is that
rendering, so a default or a help text changed in the code cannot leave the docs behind.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.core.metrics import md_table
from flywheel.core.settings import REPO_ROOT
from flywheel.resources import (
    CurriculumResource,
    EnvResource,
    LoopResource,
    ManagedVLLMPolicy,
    MethodResource,
    OpenAICompatiblePolicy,
    OpenAITeacherResource,
    PolicyResource,
    ScriptedTeacherResource,
    StoreResource,
    TransformersPolicy,
)
from flywheel.resources.ray_cluster import RayConfig

DOC = REPO_ROOT / "docs" / "configuration.md"
# class name -> (class, the class whose fields it inherits and whose table already lists them)
CLASSES: dict[str, tuple[type, type | None]] = {
    cls.__name__: (cls, PolicyResource if issubclass(cls, PolicyResource) and cls is not PolicyResource else None)
    for cls in (EnvResource, PolicyResource, TransformersPolicy, ManagedVLLMPolicy, OpenAICompatiblePolicy, RayConfig,
                LoopResource, CurriculumResource, MethodResource, ScriptedTeacherResource, OpenAITeacherResource,
                StoreResource)
}
BLOCK = re.compile(r"(<!-- options: (\w+) -->\n)(.*?)(<!-- /options -->)", re.S)


def shown_default(info: Any) -> str:
    """A field's default as the page shows it: paths relative to the repository, secrets by variable."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, dg.EnvVar):
        return f"`${value.env_var_name}`"
    if isinstance(value, dg.Config):
        return f"`{type(value).__name__}()`"
    if isinstance(value, str) and value.startswith(str(REPO_ROOT)):
        value = str(Path(value).relative_to(REPO_ROOT))
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = repr(value) if isinstance(value, str) else str(value)
    return f"`{text}`"


def option_table(cls: type, inherited: type | None = None) -> str:
    """field | default | meaning, for every configurable field of `cls` (minus those `inherited` lists)."""
    rows = []
    skip = set(inherited.model_fields) if inherited else set()
    for name, info in cls.model_fields.items():
        if name in skip or name == "server_pool":  # server_pool: the driver's live pool, not configuration
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        meaning = (info.description or "").replace("|", "\\|")
        if extra.get("bound") is not None:
            meaning += f" ({extra['bound'].describe()})"
        rows.append([f"`{name}`", shown_default(info), meaning])
    return md_table(["field", "default", "meaning"], rows) + "\n"


def render(text: str) -> str:
    """`text` with every options block re-rendered; an unknown class name is an error."""
    def block(m: re.Match) -> str:
        if m.group(2) not in CLASSES:
            raise KeyError(f"docs: no options table for {m.group(2)!r}; known: {', '.join(CLASSES)}")
        return m.group(1) + option_table(*CLASSES[m.group(2)]) + m.group(4)

    return BLOCK.sub(block, text)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DOC
    path.write_text(render(path.read_text()))
    print(f"wrote the option tables of {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
