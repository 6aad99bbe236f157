"""shape checks data read from YAML against a protobuf message descriptor before it is converted,
and names every mistake in the user's words: the dotted path as the YAML spells it
(`spec.workerSets[0].template.command`), what was expected there, and what was found.

It is generic over the descriptor: field names are the JSON names (camelCase; the proto's
snake_case names are accepted too), a map is a mapping, a repeated field a list, a message a
mapping, a number a number (a whole one for integer fields, in range), a bool true or false, an
enum one of its value names. Every problem is collected; nothing stops at the first.
"""

from __future__ import annotations

import datetime
import difflib
import math
import shlex
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

_INT_RANGE = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
_STRINGS = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)
_TIMESTAMP = "google.protobuf.Timestamp"
_LIST_VALUE = "google.protobuf.ListValue"  # a list of JSON values (a sweep's values)


def problems(data: dict[str, Any], descriptor: Descriptor, path: str = "") -> list[str]:
    """problems: every way `data` does not fit `descriptor`, each `path: what is wrong`, in the
    order the data lists them. Where a mistake is harmless to fix in place (a whole number
    written as 2.0, a date YAML read as a datetime) `data` is changed to what the converter
    takes; an empty list means json_format.ParseDict will accept it."""
    found: list[str] = []
    _message(data, descriptor, path, found)
    return found


def _message(data: dict[str, Any], descriptor: Descriptor, path: str, found: list[str]) -> None:
    by_name: dict[str, FieldDescriptor] = {}
    for each in descriptor.fields:
        by_name[each.json_name] = each
        by_name[each.name] = each
    seen: dict[str, str] = {}
    for key, value in list(data.items()):
        where = _join(path, str(key))
        field = by_name.get(key) if isinstance(key, str) else None
        if field is None:
            found.append(f"{where}: unknown field{_did_you_mean(str(key), descriptor)}")
            continue
        if field.name in seen:
            found.append(f"{where}: given twice (as {seen[field.name]} and as {key})")
            continue
        seen[field.name] = str(key)
        fixed = _field(value, field, where, found)
        if fixed is not value:
            data[key] = fixed


def _did_you_mean(key: str, descriptor: Descriptor) -> str:
    names = [f.json_name for f in descriptor.fields]
    close = difflib.get_close_matches(key, names, n=1) or difflib.get_close_matches(
        key.lower(), [n.lower() for n in names], n=1
    )
    if close:
        match = next(n for n in names if n.lower() == close[0].lower())
        return f" (did you mean {match!r}?)"
    return f"; known fields: {', '.join(names)}"


def _field(value: Any, field: FieldDescriptor, path: str, found: list[str]) -> Any:
    """_field checks one field's value; it returns the value, fixed where that is harmless."""
    if _is_map(field):
        if not isinstance(value, dict):
            found.append(f"{path}: expected {_want(field)}, got {describe(value)}")
            return value
        entry = _message_type(field).fields_by_name["value"]
        for key, item in list(value.items()):
            fixed = _single(item, entry, _join(path, str(key)), found)
            if fixed is not item:
                value[key] = fixed
        return value
    if field.is_repeated:
        if not isinstance(value, list):
            found.append(f"{path}: expected {_want(field)}, got {describe(value)}{_hint(value)}")
            return value
        for i, item in enumerate(value):
            fixed = _single(item, field, f"{path}[{i}]", found)
            if fixed is not item:
                value[i] = fixed
        return value
    return _single(value, field, path, found)


def _single(value: Any, field: FieldDescriptor, path: str, found: list[str]) -> Any:
    """_single checks a value of the field's element type (one item of a list or map)."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if _message_type(field).full_name == _LIST_VALUE:
            return _list_value(value, path, found)
        if _message_type(field).full_name == _TIMESTAMP:
            if isinstance(value, datetime.datetime):
                stamp = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
                return stamp.isoformat().replace("+00:00", "Z")
            if not isinstance(value, str):
                found.append(f"{path}: expected a date and time (RFC 3339), got {describe(value)}")
            return value
        if not isinstance(value, dict):
            found.append(f"{path}: expected {_want_one(field)}, got {describe(value)}")
            return value
        _message(value, _message_type(field), path, found)
        return value
    if kind in _STRINGS:
        if not isinstance(value, str):
            found.append(f"{path}: expected a string, got {describe(value)}{_quote(value)}")
        return value
    if kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            found.append(f"{path}: expected true or false, got {describe(value)}")
        return value
    if kind == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in _enum_type(field).values]
        if value not in names:
            found.append(f"{path}: expected one of {', '.join(names)}, got {describe(value)}")
        return value
    if isinstance(value, str):  # a quoted number, as JSON may carry one
        number = _number(value, kind in _FLOATS)
        if number is None:
            found.append(f"{path}: expected {_want_one(field)}, got {describe(value)}")
            return value
        value = number
    if isinstance(value, bool) or not isinstance(value, int | float):
        found.append(f"{path}: expected {_want_one(field)}, got {describe(value)}")
        return value
    if kind in _FLOATS:
        if not math.isfinite(value):
            found.append(f"{path}: expected a finite number, got {value}")
        return value
    if isinstance(value, float):
        if not value.is_integer():
            found.append(f"{path}: expected a whole number, got {describe(value)}")
            return value
        value = int(value)
    low, high = _INT_RANGE.get(kind, (-(2**63), 2**64 - 1))
    if not low <= value <= high:
        found.append(f"{path}: {value} is out of range ({low} to {high})")
    return value


def _list_value(value: Any, path: str, found: list[str]) -> Any:
    """_list_value checks a ListValue: a list of strings, numbers and true/false values (the
    JSON values a sweep takes; a date YAML read is taken as the text it was written as)."""
    if not isinstance(value, list):
        found.append(
            f"{path}: expected a list of strings, numbers or true/false values, got {describe(value)}"
        )
        return value
    for i, item in enumerate(value):
        if isinstance(item, datetime.date):
            value[i] = item.isoformat()
        elif isinstance(item, float) and not math.isfinite(item):
            found.append(f"{path}[{i}]: expected a finite number, got {item}")
        elif not isinstance(item, str | int | float | bool):
            found.append(
                f"{path}[{i}]: expected a string, a number or true/false, got {describe(item)}"
            )
    return value


def _number(text: str, fractional: bool) -> int | float | None:
    """_number: the number a quoted string holds (a whole one unless `fractional`), or None."""
    try:
        return float(text) if fractional else int(text.strip())
    except ValueError:
        return None


def _message_type(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None, field.full_name  # a message field has its type
    return field.message_type


def _enum_type(field: FieldDescriptor) -> EnumDescriptor:
    assert field.enum_type is not None, field.full_name  # an enum field has its type
    return field.enum_type


def _is_map(field: FieldDescriptor) -> bool:
    return (
        field.type == FieldDescriptor.TYPE_MESSAGE and _message_type(field).GetOptions().map_entry
    )


def _want(field: FieldDescriptor) -> str:
    """_want: what a field takes, in the user's words ("a list of strings")."""
    if _is_map(field):
        value = _message_type(field).fields_by_name["value"]
        return f"a mapping of names to {_plural(value)}"
    if field.is_repeated:
        return f"a list of {_plural(field)}"
    return _want_one(field)


def _want_one(field: FieldDescriptor) -> str:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        keys = ", ".join(f.json_name for f in _message_type(field).fields)
        return f"a mapping ({keys})"
    if kind in _STRINGS:
        return "a string"
    if kind == FieldDescriptor.TYPE_BOOL:
        return "true or false"
    if kind in _FLOATS:
        return "a number"
    if kind == FieldDescriptor.TYPE_ENUM:
        return "one of " + ", ".join(v.name for v in _enum_type(field).values)
    return "a whole number"


def _plural(field: FieldDescriptor) -> str:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return "lists" if _message_type(field).full_name == _LIST_VALUE else "mappings"
    if kind in _STRINGS:
        return "strings"
    if kind == FieldDescriptor.TYPE_BOOL:
        return "true/false values"
    if kind in _FLOATS:
        return "numbers"
    return "whole numbers"


def describe(value: Any) -> str:
    """describe: what the YAML held, in the user's words ("the string 'python x.py'")."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the value {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value:g}" if isinstance(value, float) else f"the number {value}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:39] + "…"
        return f"the string {text!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, datetime.date):
        return f"the date {value.isoformat()}"
    return f"a {type(value).__name__}"


def _hint(value: Any) -> str:
    """_hint: for a string where a list is expected, the list it probably meant."""
    if not isinstance(value, str):
        return ""
    try:
        words = shlex.split(value)
    except ValueError:
        return ""
    if not words:
        return ""
    return f"; write it as a list: [{', '.join(words)}]"


def _quote(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f' (quote it: "{value}")'
    return ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
