"""states names the enumerations of jobs and pods (DESIGN §3) and the policies of a spec.

They are strings on the wire and in the store, as in the Kubernetes API.
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """Stage is a job's lifecycle stage, owned by the controller."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESCHEDULING = "Rescheduling"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Stage.SUCCEEDED, Stage.FAILED)


class ScheduleState(StrEnum):
    """ScheduleState is how much of a job is placed, owned by the scheduler."""

    UNSCHEDULED = "Unscheduled"
    SCHEDULED_PARTLY = "ScheduledPartly"
    SCHEDULED_SUCCEED = "ScheduledSucceed"
    SCHEDULED_FAILED = "ScheduledFailed"


class PodState(StrEnum):
    """PodState is the state of a pod's current attempt.

    Placed, Launching and Running hold resources on the pod's node; the four terminal states
    do not.
    """

    PENDING = "Pending"
    PLACED = "Placed"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    LOST = "Lost"
    KILLED = "Killed"

    @property
    def terminal(self) -> bool:
        return self in (PodState.SUCCEEDED, PodState.FAILED, PodState.LOST, PodState.KILLED)

    @property
    def holds_resources(self) -> bool:
        return self in (PodState.PLACED, PodState.LAUNCHING, PodState.RUNNING)


# Why an agent ended a pod it was not asked to stop. AGENT_STOPPED: the agent stopped it as it
# exited (stopPodsOnExit, arranger dev): the server runs it again without counting a restart.
# FENCED: the server was silent past fenceTimeout, or the agent itself was gone that long.
AGENT_STOPPED = "AgentStopped"
FENCED = "Fenced"
SCALED_DOWN = "ScaledDown"  # a worker its job's scale-down removed (no restart counted)

# Why a pod's program never ran, where running it again would fail the same way: a failed
# pod's reason starts with one of these and ": " (the agent's launcher says which, or the
# container runtime), and its job does not start it again (see arranger.server.endings).
# CommandNotFound: exec said ENOENT or ENOTDIR; CommandNotExecutable: EACCES, EPERM or
# ENOEXEC; ContainerCommandNotFound and ContainerCannotRun: the container runtime's own
# (podman's exit 127 and 126, or its init's "failed to exec").
COMMAND_NOT_FOUND = "CommandNotFound"
COMMAND_NOT_EXECUTABLE = "CommandNotExecutable"
CONTAINER_COMMAND_NOT_FOUND = "ContainerCommandNotFound"
CONTAINER_CANNOT_RUN = "ContainerCannotRun"
PACKAGE_REFUSED = "PackageRefused"  # the job's working directory holds what may not be unpacked
CANNOT_START = frozenset(
    {
        COMMAND_NOT_FOUND,
        COMMAND_NOT_EXECUTABLE,
        CONTAINER_COMMAND_NOT_FOUND,
        CONTAINER_CANNOT_RUN,
        PACKAGE_REFUSED,
    }
)


def cannot_start(reason: str) -> str:
    """cannot_start: the kind (one of CANNOT_START) of a pod's reason that says its program can
    never start, else ""."""
    kind, colon, _ = reason.partition(": ")
    return kind if colon and kind in CANNOT_START else ""


class NodeState(StrEnum):
    """NodeState says whether a node's agent is connected and heard from within nodeTimeout."""

    READY = "Ready"
    NOT_READY = "NotReady"


class Role(StrEnum):
    LEADER = "leader"
    WORKER = "worker"


class CleanPodPolicy(StrEnum):
    """CleanPodPolicy decides what happens to a finished job's processes (DESIGN §3)."""

    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class JobQueuePolicy(StrEnum):
    PRIORITY = "Priority"
    DRF = "DRF"


class BasicPolicy(StrEnum):
    GANG = "Gang"
    BINPACK = "BinPack"
    LEADER_FIRST = "LeaderFirst"
    MIN_FRAGMENT = "MinFragment"
    JOB_AFFINITY = "JobAffinity"
    JOB_ANTI_AFFINITY = "JobAntiAffinity"
