"""Writes a foreman.toml from plain values: the one config writer of the demo, the emulator, the tests and bench."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

#: A TOML document as plain values: tables are mappings, arrays of tables are lists of mappings.
Document = Mapping[str, Any]


class ConfigWriteError(ValueError):
    """A value that has no TOML form here (None, NaN, a set, a mixed array of tables and values, ...)."""


def _key(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigWriteError(f"{where}: a key must be a non-empty string, not {name!r}")
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    # JSON's escapes are TOML's basic-string escapes; DEL is the one control character JSON leaves raw.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _scalar(value: object, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigWriteError(f"{where}: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Path):
        return _string(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(item, f"{where}[{i}]") for i, item in enumerate(value)) + "]"
    if isinstance(value, Mapping):
        items = (f"{_key(k, where)} = {_scalar(v, f'{where}.{k}')}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise ConfigWriteError(f"{where}: {type(value).__name__} has no TOML form")


def _is_table_array(value: object) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(item, Mapping) for item in value)


def _table(lines: list[str], path: Sequence[str], table: Mapping[str, Any], *, header: str | None) -> None:
    where = ".".join(path) or "$"
    plain = [(k, v) for k, v in table.items() if not isinstance(v, Mapping) and not _is_table_array(v)]
    # An array-of-tables element always needs its header: without it, its sub-tables would join the previous one.
    if header is not None and (plain or not table or header.startswith("[[")):
        lines.append(header)
    for key, value in plain:
        lines.append(f"{_key(key, where)} = {_scalar(value, f'{where}.{key}')}")
    for key, value in table.items():
        name = [*path, _key(key, where)]
        if isinstance(value, Mapping):
            _table(lines, name, value, header=f"[{'.'.join(name)}]")
        elif _is_table_array(value):
            for item in value:
                _table(lines, name, item, header=f"[[{'.'.join(name)}]]")


def render_config(doc: Document, *, comment: str | None = None) -> str:
    """TOML text for ``doc`` (``tomllib.loads`` of the result equals ``doc``, paths as strings)."""
    lines = [f"# {line}" if line else "#" for line in (comment or "").splitlines()]
    _table(lines, [], doc, header=None)
    return "\n".join(lines) + "\n"


def merged(base: Document, *overrides: Document) -> dict[str, Any]:
    """``base`` with each override laid over it, table by table (a value in an override replaces the base's)."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for override in overrides:
        for key, value in override.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def write_config(path: Path, doc: Document, *, comment: str | None = None) -> Path:
    """Write ``doc`` as TOML to ``path`` (its folder is created) and return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(doc, comment=comment), encoding="utf-8")
    return path
