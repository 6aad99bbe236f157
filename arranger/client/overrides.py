r"""overrides: `--set PATH=VALUE`, a field of a job file changed on the command line, as Helm's
`--set` changes a chart's values.

PATH names the field as the YAML spells it, dotted, with list items by index:
`spec.priority`, `spec.workerSets[0].counts`, `spec.leader.template.env.LR`; a key holding a
dot writes it `\.` (`...nodeSelector.gpu\.type=a100`). VALUE is read as YAML (`7`, `true`,
`[a, b]`, `'007'` for a string of digits); `--set-string` takes it as it is, a string, as
Helm's does. A mapping on the way is made when missing; a list item must exist, or be the next
one (its index the list's length). What results is checked like the file (unknown fields,
types, quantities), so a `--set` can make no job the file could not. A refusal names the
`--set` and the rule.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from typing import Any

MAX_SETS = 100
MAX_CHARS = 4096  # one --set, path and value
_PART = re.compile(r"([^\[\]]+?)((?:\[\d{1,4}\])*)", re.DOTALL)
_DOT = re.compile(r"(?<!\\)\.")  # a dot that is not written \.
Override = str | tuple[bool, str]  # PATH=VALUE, or (as a string, PATH=VALUE)
_INDEX = re.compile(r"\[(\d{1,4})\]")


def add_set_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """add_set_arguments: `--set` and `--set-string`, both into `sets` in the order given;
    `what` says what they change ("a field of the file")."""
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help=f"change {what}, checked like a file (repeatable): spec.priority=7, "
        "'spec.workerSets[0].counts=8', spec.leader.template.env.LR=0.001 (the value read as "
        "YAML; a key's own dot written \\.)",
    )
    p.add_argument(
        "--set-string",
        dest="sets",
        action="append",
        type=lambda text: (True, text),
        metavar="PATH=VALUE",
        help="as --set, the value taken as a string as it is (007 stays 007)",
    )


class OverrideError(ValueError):
    """OverrideError: a `--set` that cannot be applied; the message names it and why."""


def apply_sets(doc: Any, sets: Iterable[Override]) -> Any:
    """apply_sets: the document with each `PATH=VALUE` applied in order (in place); one given
    as (True, PATH=VALUE) takes VALUE as a string (--set-string)."""
    given = list(sets)
    if len(given) > MAX_SETS:
        raise OverrideError(f"--set: at most {MAX_SETS}")
    for item in given:
        as_string, text = item if isinstance(item, tuple) else (False, item)
        path, value = _parse(text, as_string)
        doc = _put(doc, path, value, text)
    return doc


def _parse(text: str, as_string: bool = False) -> tuple[list[str | int], Any]:
    """_parse: a --set's path (names and indexes) and its value, read as YAML (as it is, with
    `as_string`)."""
    if len(text) > MAX_CHARS:
        raise OverrideError(f"--set {text[:40]!r}...: longer than {MAX_CHARS} characters")
    where, found, raw = text.partition("=")
    if not found or not where:
        raise OverrideError(f"--set {text!r}: give PATH=VALUE (e.g. spec.priority=7)")
    path: list[str | int] = []
    for part in _DOT.split(where):
        match = _PART.fullmatch(part)
        if match is None:
            raise OverrideError(
                f"--set {text!r}: {part!r} is not a field name, with [N] for a list item"
            )
        path.append(match.group(1).replace("\\.", "."))
        path += [int(n) for n in _INDEX.findall(match.group(2))]
    if as_string:
        return path, raw
    import yaml  # noqa: PLC0415 (the CLI's parser imports this module; yaml only a --set needs)

    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise OverrideError(f"--set {text!r}: the value is not YAML: {exc}") from None
    return path, value


def _put(doc: Any, path: list[str | int], value: Any, text: str) -> Any:
    """_put sets `path` in `doc` to `value`, making mappings on the way."""
    if doc is None:
        doc = {}
    at = doc
    for depth, key in enumerate(path):
        last = depth == len(path) - 1
        shown = _shown(path[: depth + 1])
        if isinstance(key, str):
            if not isinstance(at, dict):
                raise OverrideError(f"--set {text!r}: {_shown(path[:depth])} is not a mapping")
            if last:
                at[key] = value
            else:
                if at.get(key) is None:
                    at[key] = [] if isinstance(path[depth + 1], int) else {}
                at = at[key]
        else:
            if not isinstance(at, list):
                raise OverrideError(f"--set {text!r}: {_shown(path[:depth])} is not a list")
            if key > len(at):
                raise OverrideError(
                    f"--set {text!r}: {shown}: the list has {len(at)} items (the next is "
                    f"[{len(at)}])"
                )
            if key == len(at):
                at.append([] if not last and isinstance(path[depth + 1], int) else {})
            if last:
                at[key] = value
            else:
                if at[key] is None:
                    at[key] = {}
                at = at[key]
    return doc


def _shown(path: list[str | int]) -> str:
    """_shown: a path as --set spells it."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out or "the document"
