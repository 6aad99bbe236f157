"""quantity parses and formats resource amounts: CPU in cores or milli-cores, memory in bytes.

Accepted forms follow Kubernetes quantities, which most of our users already write:
CPU `2`, `0.5`, `500m`; memory `1073741824`, `512Mi`, `16Gi`, `1G`, `1.5Gi`.
Internally CPU is integer milli-cores, memory integer bytes, GPUs integer milli-GPUs, so sums
never drift.
"""

from __future__ import annotations

import math
import re

_MEMORY_SUFFIX = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
_QUANTITY = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$"
)


class QuantityError(ValueError):
    """QuantityError says why a quantity string or number is not acceptable."""


def _number_and_suffix(value: object) -> tuple[float, str]:
    if isinstance(value, bool):
        raise QuantityError(f"expected a number or quantity string, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a finite number, got {value!r}")
        return float(value), ""
    if not isinstance(value, str):
        raise QuantityError(f"expected a number or quantity string, got {type(value).__name__}")
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"invalid quantity {value!r}")
    number = float(match.group(1))
    if match.group(2):
        number *= 10.0 ** int(match.group(2))
    if not math.isfinite(number):
        raise QuantityError(f"invalid quantity {value!r}")
    return number, match.group(3)


def parse_cpu(value: object) -> float:
    """parse_cpu returns cores from `2`, `0.5` or `500m`."""
    number, suffix = _number_and_suffix(value)
    if suffix == "m":
        return number / 1000.0
    if suffix:
        raise QuantityError(
            f"invalid CPU quantity {value!r}: use cores (0.5) or milli-cores (500m)"
        )
    return number


def parse_memory(value: object) -> int:
    """parse_memory returns bytes from `1073741824`, `512Mi`, `16Gi` or `1.5G`."""
    number, suffix = _number_and_suffix(value)
    if suffix not in _MEMORY_SUFFIX:
        raise QuantityError(
            f"invalid memory quantity {value!r}: use bytes or a suffix Ki, Mi, Gi, Ti, K, M, G, T"
        )
    return round(number * _MEMORY_SUFFIX[suffix])


def cpu_milli(cores: float) -> int:
    """cpu_milli converts cores to integer milli-cores."""
    return round(cores * 1000)


def gpu_milli(gpus: float) -> int:
    """gpu_milli converts GPUs to integer milli-GPUs."""
    return round(gpus * 1000)


def format_cpu(milli: int) -> str:
    """format_cpu renders milli-cores the short way: `2`, `0.5`, `0.25`."""
    return f"{milli / 1000:g}"


def format_memory(num_bytes: int) -> str:
    """format_memory renders bytes with a binary suffix: `512Mi`, `15.6Gi`."""
    for suffix, size in (("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if abs(num_bytes) >= size:
            value = num_bytes / size
            return f"{value:.1f}{suffix}".replace(".0" + suffix, suffix)
    return str(num_bytes)


def format_gpu(milli: int) -> str:
    """format_gpu renders milli-GPUs: `1`, `0.25`."""
    return f"{milli / 1000:g}"
