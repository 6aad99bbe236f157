"""redaction takes a job's hidden values out of text that other users read.

A job's hidden values are what `access.redact` hides from everyone but its owner and admins:
its environment values, its command's arguments, its volumes' host paths and its package's
hash. An agent's word on a pod can echo them: a start failure names the PATH it searched, a
container runtime the host path it could not mount. That word becomes the pod's reason, the
job's message, its events and its history record, which every user reads (listings and
watches are the same for every caller; events and history hold no secret). So a pod's
reason is scrubbed once, as it arrives (`public_reason`), of its own job's hidden values:
each becomes a label that names where it came from ("(hidden env PATH)"); the owner finds
the whole line in the pod's log.

Values shorter than MIN_CHARS are left: they would take words out of every message ("1",
"on", "yes") and hide nothing worth hiding; a value is taken out only where it stands whole,
not inside a longer word. A value with ':' (PATH, PYTHONPATH) is hidden whole and by each of
its parts but the system's own directories (/usr/bin, ...), so that a message naming one
directory of it hides it too. A job's values are gathered once and kept (by spec) for the
jobs met last: a burst of reasons, or of reads by other users, does not walk a large spec
again each time.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from arranger.spec import JobSpec
from arranger.v1 import job_pb2

MIN_CHARS = 6
SYSTEM_DIRS = frozenset(
    f"{top}/{leaf}" if top else f"/{leaf}"
    for top in ("", "/usr", "/usr/local")
    for leaf in ("bin", "sbin", "lib", "lib64", "lib32", "libexec", "share")
)  # parts of a PATH-like value every machine has: no secret, and in many messages
KEPT_JOBS = 1024  # jobs whose hidden values are kept, the last met
REASON_CHARS = 4096  # a scrubbed reason is cut to this, or to its length as it came if longer
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]*")  # a reason's kind: "CommandNotFound", "OOMKilled"


@dataclass(frozen=True)
class Hidden:
    """Hidden: a job's hidden values, each with the label that stands for it, longest first
    (of two values where one holds the other, the longer is taken out whole)."""

    labels: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, spec: JobSpec) -> Hidden:
        kept = _KEPT.get(id(spec))
        if kept is not None and kept[0] is spec:
            _KEPT.move_to_end(id(spec))
            return kept[1]
        found: dict[str, str] = {}
        for value, label in _values(spec):
            parts = [p for p in value.split(":") if p not in SYSTEM_DIRS] if ":" in value else []
            for part in (value, *parts):
                if len(part) >= MIN_CHARS:
                    found.setdefault(part, label)
        hidden = cls(tuple(sorted(found.items(), key=lambda item: -len(item[0]))))
        _KEPT[id(spec)] = (spec, hidden)
        while len(_KEPT) > KEPT_JOBS:
            _KEPT.popitem(last=False)
        return hidden

    def scrub(self, text: str) -> str:
        """scrub: `text` with every hidden value it holds whole (not inside a longer word)
        replaced by its label, in one pass (a label is never scrubbed again)."""
        held = [(value, label) for value, label in self.labels if value in text]
        if not held:
            return text
        labels = dict(held)
        pattern = re.compile("|".join(_whole(value) for value, _ in held))
        return pattern.sub(lambda found: labels[found.group(0)], text)


_KEPT: OrderedDict[int, tuple[JobSpec, Hidden]] = OrderedDict()


def _whole(value: str) -> str:
    """_whole: a pattern of `value` where it is not part of a longer word."""
    before = r"(?<!\w)" if value[0].isalnum() or value[0] == "_" else ""
    after = r"(?!\w)" if value[-1].isalnum() or value[-1] == "_" else ""
    return before + re.escape(value) + after


def _values(spec: JobSpec) -> Iterator[tuple[str, str]]:
    templates = [spec.leader, *(ws.template for ws in spec.worker_sets)]
    for template in templates:
        for key, value in template.env.items():
            yield value, f"(hidden env {key})"
        for argument in (*template.command[1:], *template.args):
            yield argument, "(hidden argument)"
    for volume in spec.volumes:
        yield volume.host_path, f"(hidden hostPath of volume {volume.name})"
    if spec.package is not None:
        yield spec.package.sha256, "(hidden package)"


def public_reason(reason: str, spec: JobSpec) -> str:
    """public_reason: an agent's reason for one of the job's pods as every user may read it.
    Its kind ("CommandNotFound: ...") is kept as it came, whatever the job holds: the
    controller reads it (a start failure, an agent that stopped) and it carries no value."""
    kind, colon, rest = reason.partition(": ")
    if _KIND.fullmatch(reason):
        return reason
    if colon and _KIND.fullmatch(kind):
        public = f"{kind}{colon}{Hidden.of(spec).scrub(rest)}"
    else:
        public = Hidden.of(spec).scrub(reason)
    # A label is longer than a short value: a reason full of one never grows without bound.
    most = max(REASON_CHARS, len(reason))
    return public if len(public) <= most else public[: most - 1] + "…"


def scrub_status(status: job_pb2.JobStatus, spec: JobSpec) -> None:
    """scrub_status takes the job's hidden values out of its status's message and its pods'
    reasons, in place (for a reader who is not its owner: the reasons were scrubbed as they
    came, but a store written before that may hold them whole)."""
    hidden = Hidden.of(spec)
    status.message = hidden.scrub(status.message)
    pods: Iterable[job_pb2.PodStatus] = [status.leader, *status.workers]
    for pod in pods:
        pod.reason = hidden.scrub(pod.reason)
