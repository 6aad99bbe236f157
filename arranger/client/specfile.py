"""specfile reads a TYJob from YAML (a file, or standard input as `-`): quantities become
canonical units, and every mistake (unknown keys, wrong types, unreadable quantities) is named at
once, one a line, with its dotted path.

YAML keys are the JSON names of the proto fields (camelCase; snake_case is accepted too).
`cpu: 500m` becomes 0.5 cores, `memory: 16Gi` becomes bytes, env values become strings, and a
key set to null is the same as leaving it out.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from arranger.client import shape
from arranger.client.errors import UserFacingError
from arranger.client.overrides import Override, OverrideError, apply_sets
from arranger.quantity import QuantityError, parse_cpu, parse_memory
from arranger.v1 import job_pb2

MAX_FILE_BYTES = 4 * 2**20
# The quantities a template's resources take: key, reader, what it expects in the user's words.
QUANTITIES = (
    ("cpu", parse_cpu, "cores: a number, or milli-cores like 500m"),
    ("memory", parse_memory, "bytes, or a quantity like 512Mi or 16Gi"),
)
STDIN = "-"


class SpecFileError(UserFacingError, ValueError):
    """SpecFileError lists every problem with a job file, one a line, each phrased as
    `file: path: what is wrong`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = [f"{source}: {problem}" for problem in problems]
        super().__init__("\n".join(self.problems))


def load_job_file(path: str | Path, sets: Sequence[Override] = ()) -> job_pb2.TYJob:
    """load_job_file reads a job from a YAML file, or from standard input when `path` is -,
    with each `--set PATH=VALUE` of `sets` applied before it is checked (see overrides)."""
    if str(path) == STDIN:
        text = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise SpecFileError("<stdin>", [f"larger than {MAX_FILE_BYTES // 2**20} MiB"])
        return load_job_yaml(_decode(text, "<stdin>"), "<stdin>", sets)
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SpecFileError(str(path), [f"larger than {MAX_FILE_BYTES // 2**20} MiB"])
        data = path.read_bytes()
    except OSError as exc:
        raise SpecFileError(str(path), [exc.strerror or str(exc)]) from exc
    return load_job_yaml(_decode(data, str(path)), str(path), sets)


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecFileError(source, [f"not UTF-8 text (byte {exc.start})"]) from None


def load_job_yaml(text: str, source: str = "<job>", sets: Sequence[Override] = ()) -> job_pb2.TYJob:
    """load_job_yaml parses a job from YAML text, `sets` applied (see overrides);
    SpecFileError lists every problem."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecFileError(source, [f"invalid YAML{where}: {problem}"]) from exc
    if sets:
        try:
            doc = apply_sets(doc, sets)
        except OverrideError as exc:
            raise SpecFileError(source, [str(exc)]) from None
    return load_job_data(doc, source)


def load_job_data(doc: Any, source: str = "<job>") -> job_pb2.TYJob:
    """load_job_data converts data shaped like the YAML into a TYJob after checking all of it
    against the message (shape.problems) and reading quantities; SpecFileError lists every
    problem found, not only the first."""
    if not isinstance(doc, dict):
        raise SpecFileError(source, ["expected a TYJob mapping (apiVersion, kind, metadata, spec)"])
    doc = _drop_nulls(doc)
    problems: list[str] = []
    _normalise(doc, problems)
    problems += shape.problems(doc, job_pb2.TYJob.DESCRIPTOR)
    if problems:
        raise SpecFileError(source, problems)
    from google.protobuf import json_format  # noqa: PLC0415 (only submit needs it)

    msg = job_pb2.TYJob()
    try:
        json_format.ParseDict(doc, msg)
    except json_format.ParseError as exc:  # what the shape check does not foresee
        raise SpecFileError(source, [str(exc).splitlines()[0]]) from exc
    return msg


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _normalise(doc: dict[str, Any], problems: list[str]) -> None:
    """_normalise turns quantities into canonical units and env values into strings in every
    template; a value it cannot read is a problem and is removed, so that it is named once."""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return
    templates: list[tuple[str, Any]] = []
    leader = spec.get("leader")
    if isinstance(leader, dict):
        templates.append(("spec.leader.template", leader.get("template")))
    key = "workerSets" if "workerSets" in spec else "worker_sets"
    sets = spec.get(key)
    if isinstance(sets, list):
        for i, ws in enumerate(sets):
            if isinstance(ws, dict):
                templates.append((f"spec.{key}[{i}].template", ws.get("template")))
    for path, template in templates:
        if isinstance(template, dict):
            _normalise_template(path, template, problems)


def _normalise_template(path: str, template: dict[str, Any], problems: list[str]) -> None:
    resources = template.get("resources")
    if isinstance(resources, dict):
        for key, parse, expected in QUANTITIES:
            if key in resources and not isinstance(resources[key], bool):
                try:
                    resources[key] = parse(resources[key])
                except (QuantityError, TypeError, ValueError):
                    got = resources.pop(key)
                    shown = shape.describe(got)
                    problems.append(f"{path}.resources.{key}: expected {expected}, got {shown}")
    env = template.get("env")
    if isinstance(env, dict):
        for key, value in list(env.items()):
            if isinstance(value, dict | list):
                problems.append(
                    f"{path}.env.{key}: expected a string, got a {'mapping' if isinstance(value, dict) else 'list'}"
                )
                del env[key]
            else:
                env[key] = _env_text(value)
    for key in ("command", "args"):
        if isinstance(template.get(key), list):
            template[key] = [
                _env_text(v) if not isinstance(v, dict | list) else v for v in template[key]
            ]


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
