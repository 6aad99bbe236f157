"""start_failure reads a container runtime's word that a pod's command cannot start as the pod's
reason, "KIND: cannot start `COMMAND`: WHY" (KIND: see arranger.states.CANNOT_START).

Podman exits 127 when the OCI runtime found no such command in the image and 126 when it could
not run it. With podman's init (`--init`, catatonit) the container starts all the same: its
init fails to exec the command, says so ("ERROR (catatonit:6): failed to exec pid1: No such
file or directory") as the container's last line of output, and exits 1.

Podman exits 125 when the image could not be pulled; it says "Trying to pull IMAGE..." first
and its error last: the reason is then "ImagePullFailed: image IMAGE: <podman's last line>".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from arranger.states import CONTAINER_CANNOT_RUN, CONTAINER_COMMAND_NOT_FOUND

INIT_FAILED = re.compile(r"\(catatonit:\d+\): failed to exec pid1: (.+)$")
NOT_THERE = ("No such file or directory", "Not a directory")
TAIL_BYTES = 4096
SAID_CHARS = 500  # the most of podman's last line that a reason keeps
IMAGE_PULL_FAILED = "ImagePullFailed"
PULLING = "Trying to pull "


def podman_run(code: int, said: str, command: str, output: str = "", image: str = "") -> str:
    """podman_run: the reason of a `podman run` of `image` that exited `code` (not 0), `said`
    being the last line it wrote and `output` all it wrote."""
    said = said[:SAID_CHARS] or f"podman exit {code}"
    if code == 125 and PULLING in output:
        return f"{IMAGE_PULL_FAILED}: image {image[:SAID_CHARS]}: {said}"
    if code == 127:
        return f"{CONTAINER_COMMAND_NOT_FOUND}: cannot start `{command}`: {said}"
    if code == 126:
        return f"{CONTAINER_CANNOT_RUN}: cannot start `{command}`: {said}"
    return f"ContainerError: {said}"


def init_said(code: int | None, log_path: Path, command: str) -> str:
    """init_said: the reason of a container that exited `code` when its init could not exec
    `command` (the last line of its log, at `log_path`, says so), else ""."""
    if code != 1:
        return ""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - TAIL_BYTES))
            tail = log.read(TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    found = INIT_FAILED.search(lines[-1]) if lines else None
    if found is None:
        return ""
    why = found.group(1)
    kind = CONTAINER_COMMAND_NOT_FOUND if why in NOT_THERE else CONTAINER_CANNOT_RUN
    return f"{kind}: cannot start `{command}`: {why}"
