"""spec_checks: the checks of single fields of a job's spec, shared by every part of it.

A Checker collects every problem found while a message is converted, each as `field.path: what
is wrong` with the path as users write it in YAML, so that one reply lists them all. Sizes and
counts are checked against the Checker's Bounds (arranger.server.spec_bounds); the form of a
value (a DNS label, a label key, an absolute path) is checked whatever the bounds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from arranger.server.spec_bounds import Bounds
from arranger.states import BasicPolicy, CleanPodPolicy, JobQueuePolicy
from arranger.v1 import job_pb2

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class Checker:
    """Checker collects the problems of one message (`errors`, in the order found), checking
    sizes and counts against `bounds`."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.errors: list[str] = []

    def fail(self, path: str, what: str) -> None:
        self.errors.append(f"{path}: {what}")

    def name(self, path: str, value: str, limit: int, required: bool = True) -> str:
        """name checks a DNS label of at most `limit` characters ("" passes unless required)."""
        if not value:
            if required:
                self.fail(path, "is required")
            return value
        if len(value) > limit:
            self.fail(path, f"must be at most {limit} characters")
        elif not _DNS_LABEL.fullmatch(value):
            self.fail(
                path,
                f"{short(value)} must be lowercase letters, digits and '-', "
                "starting and ending with a letter or digit",
            )
        return value

    def text(self, path: str, value: str, limit: int) -> str:
        if len(value) > limit:
            self.fail(path, f"must be at most {limit} characters")
        elif "\x00" in value:
            self.fail(path, "must not contain NUL characters")
        return value

    def absolute_path(self, path: str, value: str, required: bool) -> None:
        """absolute_path checks a path on a node: absolute, without '..'."""
        if not value:
            if required:
                self.fail(path, "is required")
            return
        self.text(path, value, self.bounds.path)
        if not value.startswith("/"):
            self.fail(path, "must be an absolute path")
        elif ".." in value.split("/"):
            self.fail(path, "must not contain '..'")

    def labels(self, path: str, labels: Mapping[str, str]) -> dict[str, str]:
        most, label = self.bounds.map_entries, self.bounds.label
        if len(labels) > most:
            self.fail(path, f"must have at most {most} entries")
            return {}
        for key, value in labels.items():
            if len(key) > label or not _LABEL_KEY.fullmatch(key):
                self.fail(
                    f"{path}[{short(key)}]",
                    f"key must be 1-{label} letters, digits, '-', '_', '.', '/'",
                )
            if len(value) > label or not _LABEL_VALUE.fullmatch(value):
                self.fail(
                    f"{path}[{short(key)}]",
                    f"value must be at most {label} letters, digits, '-', '_', '.'",
                )
        return dict(labels)

    def choice(
        self,
        path: str,
        value: str,
        enum: type[CleanPodPolicy] | type[JobQueuePolicy] | type[BasicPolicy],
        default: str,
    ) -> str:
        if not value:
            return default
        allowed = [member.value for member in enum]
        if value not in allowed:
            self.fail(path, f"{short(value)} is not one of {', '.join(allowed)}")
            return default
        return value

    def seconds(
        self, spec: job_pb2.JobSpec | job_pb2.Leader | job_pb2.WorkerSet, field: str, path: str
    ) -> float | None:
        """seconds reads an optional duration: above 0, at most the bounds' timeout_s."""
        if not spec.HasField(field):  # type: ignore[arg-type]
            return None
        value = float(getattr(spec, field))
        most = self.bounds.timeout_s
        if not (math.isfinite(value) and 0 < value <= most):
            self.fail(path, f"must be above 0 and at most {most}")
        return value

    def bounded(self, path: str, value: int, low: int, high: int) -> int:
        if not low <= value <= high:
            self.fail(path, f"must be between {low} and {high}")
        return value


def short(value: str, limit: int = 40) -> str:
    """short: a value as a refusal quotes it (repr, cut after `limit` characters)."""
    shown = value if len(value) <= limit else value[:limit] + "..."
    return repr(shown)
