"""specfile reads a TYJob from YAML: quantities become canonical units, unknown keys are errors.

YAML keys are the JSON names of the proto fields (camelCase; snake_case is accepted too).
`cpu: 500m` becomes 0.5 cores, `memory: 16Gi` becomes bytes, env values become strings, and a
key set to null is the same as leaving it out.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from arranger.quantity import QuantityError, parse_cpu, parse_memory
from arranger.v1 import job_pb2

MAX_FILE_BYTES = 4 * 2**20
_UNKNOWN = re.compile(
    r'has no field named "([^"]+)" at "TYJob\.?([^"]*)"\.\s*Available Fields\(except extensions\): "\[(.*)\]"'
)


_FAILED_FIELD = re.compile(r"Failed to parse (\w+) field: ")


class SpecFileError(ValueError):
    """SpecFileError is a problem with a job file, phrased as `file: path: what is wrong`."""


def load_job_file(path: str | Path) -> job_pb2.TYJob:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SpecFileError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from exc
    return load_job_yaml(text, str(path))


def load_job_yaml(text: str, source: str = "<job>") -> job_pb2.TYJob:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecFileError(f"{source}: invalid YAML{where}: {problem}") from exc
    if not isinstance(doc, dict):
        raise SpecFileError(
            f"{source}: expected a TYJob mapping (apiVersion, kind, metadata, spec)"
        )
    doc = _drop_nulls(doc)
    try:
        _normalise(doc)
    except (QuantityError, TypeError) as exc:
        raise SpecFileError(f"{source}: {exc}") from exc
    msg = job_pb2.TYJob()
    try:
        json_format.ParseDict(doc, msg)
    except json_format.ParseError as exc:
        raise SpecFileError(f"{source}: {_parse_error(str(exc))}") from exc
    return msg


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _normalise(doc: dict[str, Any]) -> None:
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return
    templates: list[tuple[str, Any]] = []
    leader = spec.get("leader")
    if isinstance(leader, dict):
        templates.append(("spec.leader.template", leader.get("template")))
    sets = spec.get("workerSets", spec.get("worker_sets"))
    if isinstance(sets, list):
        for i, ws in enumerate(sets):
            if isinstance(ws, dict):
                templates.append((f"spec.workerSets[{i}].template", ws.get("template")))
    for path, template in templates:
        if isinstance(template, dict):
            _normalise_template(path, template)


def _normalise_template(path: str, template: dict[str, Any]) -> None:
    resources = template.get("resources")
    if isinstance(resources, dict):
        for key, parse in (("cpu", parse_cpu), ("memory", parse_memory)):
            if key in resources:
                try:
                    resources[key] = parse(resources[key])
                except QuantityError as exc:
                    raise QuantityError(f"{path}.resources.{key}: {exc}") from exc
    env = template.get("env")
    if isinstance(env, dict):
        for key, value in env.items():
            if isinstance(value, dict | list):
                raise TypeError(f"{path}.env.{key}: must be a string, not a {type(value).__name__}")
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


def _parse_error(text: str) -> str:
    match = _UNKNOWN.search(text)
    if match:
        field, where, available = match.groups()
        path = f"{where}.{field}" if where else field
        names = [name.strip().strip("'") for name in available.split(",")]
        names = [n for n in names if n and "_" not in n]
        close = difflib.get_close_matches(field, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; known fields: {', '.join(names)}"
        return f"{path}: unknown field{hint}"
    first = text.splitlines()[0]
    path = _FAILED_FIELD.findall(first)
    rest = _FAILED_FIELD.sub("", first).rstrip(".")
    rest = re.sub(r"\s+at \"?TYJob[^\s\"]*\"?", "", rest)
    return f"{'.'.join(path)}: {rest}" if path else rest
