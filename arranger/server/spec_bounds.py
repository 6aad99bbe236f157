"""spec_bounds: the sizes and counts a job's spec may reach (documented in README "Limits").

A new job is held to BOUNDS when it is submitted. A spec read back from the store was held to
the bounds of the release that took it, so it is read with UNBOUNDED: a later release that
lowers a bound still loads every job it finds stored, while the structure of the spec (names'
form, required fields, choices, reserved variables, whole GPUs above 1) is checked all the
same (see arranger.server.validation.parse_stored_job).

The bounds at submit:
- job name: 1-48 characters, lowercase DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`); leader and
  worker set names: the same form, 1-24 characters; queue names: 1-63.
- at most 64 worker sets, 10,000 pods per job, 16 ports and 32 volumes per template/job;
  restartLimit at most 1,000.
- command plus args: at most 1,024 entries and 128 KiB; env: at most 1,024 variables and 64 KiB,
  names up to 256 characters.
- labels and nodeSelector: at most 64 entries, keys up to 63 characters, values up to 63.
- paths up to 4,096 characters; cpu 0..10,000 cores; memory 0..1 PiB; gpu 0..64;
  scheduleTimeoutSeconds and the other durations up to 10^7.
- pids: the server's `limits.pidsPerPod` caps it at submit (limits.UserLimits.above_maxima),
  not here, for the same reason.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """Bounds: the most of each size or count a spec may have. Names and paths are in
    characters, command and env sizes in bytes (UTF-8, one NUL after each entry), cpu in cores,
    durations in seconds."""

    job_name: int = 48
    part_name: int = 24  # the leader's, a worker set's, a volume's
    queue_name: int = 63
    worker_sets: int = 64
    pods: int = 10_000  # of one job, counted at every set's maxCounts
    restart_limit: int = 1_000
    ports: int = 16
    volumes: int = 32
    argv_entries: int = 1_024
    argv_bytes: int = 128 * 1024
    env_entries: int = 1_024
    env_bytes: int = 64 * 1024
    env_name: int = 256
    map_entries: int = 64  # labels, nodeSelector
    label: int = 63  # a label's key, and its value
    path: int = 4_096
    cpu_cores: float = 10_000
    memory_bytes: int = 2**50
    gpus: float = 64
    timeout_s: float = 10**7


BOUNDS = Bounds()

_NO_COUNT = sys.maxsize
UNBOUNDED = Bounds(
    job_name=_NO_COUNT,
    part_name=_NO_COUNT,
    queue_name=_NO_COUNT,
    worker_sets=_NO_COUNT,
    pods=_NO_COUNT,
    restart_limit=_NO_COUNT,
    ports=_NO_COUNT,
    volumes=_NO_COUNT,
    argv_entries=_NO_COUNT,
    argv_bytes=_NO_COUNT,
    env_entries=_NO_COUNT,
    env_bytes=_NO_COUNT,
    env_name=_NO_COUNT,
    map_entries=_NO_COUNT,
    label=_NO_COUNT,
    path=_NO_COUNT,
    cpu_cores=math.inf,
    memory_bytes=_NO_COUNT,
    gpus=math.inf,
    timeout_s=math.inf,
)
