"""messages: the wire messages a client builds from what a user gives (YAML, dicts, numbers)
and reads back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from arranger.quantity import parse_cpu, parse_memory
from arranger.v1 import arranger_pb2, job_pb2

JobLike = job_pb2.TYJob | Mapping[str, Any] | str


def progress_of(event: arranger_pb2.WatchJobsResponse) -> job_pb2.JobProgress | None:
    """progress_of: the job's progress an ADDED or MODIFIED tells (None for the others)."""
    if event.type == "ADDED":
        return event.summary.progress
    if event.type == "MODIFIED":
        return event.progress
    return None


def as_job(job: JobLike) -> job_pb2.TYJob:
    """as_job accepts a TYJob, a mapping shaped like the YAML, or YAML text."""
    if isinstance(job, job_pb2.TYJob):
        return job
    from arranger.client.specfile import load_job_data, load_job_yaml  # noqa: PLC0415 (YAML)

    if isinstance(job, str):
        return load_job_yaml(job)
    return load_job_data(dict(job))


def queue_message(
    name: str,
    weight: float = 1.0,
    cpu: float | str | None = None,
    memory: int | str | None = None,
    gpu: float | None = None,
    machine_groups: Iterable[str] = (),
) -> arranger_pb2.Queue:
    """queue_message builds a Queue; cpu and memory take quantities ("8", "500m", "64Gi")."""
    queue = arranger_pb2.Queue(name=name, weight=weight, machine_groups=list(machine_groups))
    if cpu is not None:
        queue.capability.cpu = parse_cpu(cpu)
    if memory is not None:
        queue.capability.memory = parse_memory(memory)
    if gpu is not None:
        queue.capability.gpu = gpu
    return queue
