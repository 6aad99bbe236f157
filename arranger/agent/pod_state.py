"""pod_state: the life of every pod attempt on this node, as a pure state machine.

Stimuli (an order of the server, the runtime saying a program started, became ready or ended,
the agent stopping or fencing, a run taken back from an earlier agent) go to
`PodStates.handle`, which updates the records and returns instructions for the supervisor to
carry out (start a program, stop one, report, settle an ended run). It does no I/O, reads no
clock (times come with the stimuli) and sees no protobuf, like the server's controller.

An attempt's phase:

    ordered ─▶ starting ─▶ running ─▶ exited          (a readiness port: starting until it answers)
       └──────────────────▶ running                    (no readiness port)
    adopted (taken back from an earlier agent, still running) is running
    any live phase ─▶ stopping | fenced ─▶ exited | lost

An attempt is started once (`Start`); every end (`Exited`) is settled once (`Settle`), for the
current attempt and for one an order of a newer attempt replaced; a stop (`Stop`) is always
followed, once the runtime reports the end, by a settled Killed end (or Lost, when its exit
code is unknown).

Each stimulus gets an id (`<kind>-<n>`, counted from 1), and every change of an attempt's phase
is a Transition kept in a bounded log (STORY_LENGTH, the oldest dropped first) and logged at
debug level: `story(uid)` tells what happened to one pod, and why, as dask's worker story does.
The clock only stamps those transitions; no decision reads it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import structlog

from arranger.agent.orders import LaunchOrder
from arranger.exits import signal_of
from arranger.states import FENCED, PodState

log = structlog.get_logger("arranger.agent")

LOST_REASON = "AgentRestarted: its exit code was not recorded"
STORY_LENGTH = 10_000  # transitions kept, of all pods together
NEW = ""  # the phase a transition starts from when it makes the attempt known
FORGOTTEN = "forgotten"  # the phase a transition ends in when the attempt is forgotten


class Phase(StrEnum):
    ORDERED = "ordered"
    STARTING = "starting"
    RUNNING = "running"
    ADOPTED = "adopted"
    STOPPING = "stopping"
    FENCED = "fenced"
    EXITED = "exited"
    LOST = "lost"

    @property
    def ended(self) -> bool:
        return self in (Phase.EXITED, Phase.LOST)


@dataclass
class Pod:
    """Pod: what the machine knows of one attempt. `state` is what the server is told."""

    uid: str
    attempt: int
    phase: Phase = Phase.ORDERED
    state: PodState = PodState.LAUNCHING
    exit_code: int | None = None
    reason: str = ""
    kill_reason: str = ""  # set by the first stop: Killed, AgentStopped or Fenced
    grace_s: float = 0.0
    remove_scratch: bool = False
    start_time: float = 0.0
    finish_time: float = 0.0

    @property
    def kill_requested(self) -> bool:
        return bool(self.kill_reason)


# Stimuli.


@dataclass(frozen=True)
class Ordered:
    """Ordered: the server orders this attempt (grace_s: its SIGTERM-to-SIGKILL time);
    `order` is what `Start` hands back once the attempt is to start."""

    uid: str
    attempt: int
    grace_s: float = 0.0
    order: LaunchOrder | None = None


@dataclass(frozen=True)
class Started:
    """Started: the attempt's program exists; `ready` unless a readiness port is awaited."""

    uid: str
    attempt: int
    now: float
    ready: bool = True


@dataclass(frozen=True)
class Ready:
    uid: str
    attempt: int


@dataclass(frozen=True)
class Exited:
    """Exited: the attempt ended (code None: nobody recorded it); `failure` says why its
    program never ran, `oom` whether the kernel killed it for memory."""

    uid: str
    attempt: int
    code: int | None
    now: float
    oom: bool = False
    failure: str = ""


@dataclass(frozen=True)
class KillOrdered:
    uid: str
    attempt: int
    grace_s: float
    remove_scratch: bool = False


@dataclass(frozen=True)
class StopAll:
    """StopAll: every live attempt stops with `reason` (the agent exits, or fences)."""

    reason: str
    grace_s: float


@dataclass(frozen=True)
class Adopted:
    """Adopted: an earlier agent's attempt, taken back: still `running`, or ended with `code`
    (None: unknown) at `ended_at` (None: now); `kill_reason` if that agent had asked it to
    stop."""

    uid: str
    attempt: int
    running: bool
    now: float
    code: int | None = None
    oom: bool = False
    kill_reason: str = ""
    ended_at: float | None = None


@dataclass(frozen=True)
class Forgotten:
    """Forgotten: the server has recorded the attempt's end."""

    uid: str


Stimulus = Ordered | Started | Ready | Exited | KillOrdered | StopAll | Adopted | Forgotten


# Instructions.


@dataclass(frozen=True)
class Start:
    """Start: start the attempt's program, as its order says."""

    uid: str
    attempt: int
    order: LaunchOrder | None = None


@dataclass(frozen=True)
class Stop:
    """Stop: mark the attempt stopped with `reason` (for a later agent) and signal it."""

    uid: str
    attempt: int
    grace_s: float
    reason: str


@dataclass(frozen=True)
class Report:
    uid: str
    attempt: int


@dataclass(frozen=True)
class Settle:
    """Settle: the attempt ended: free what it held and report it."""

    uid: str
    attempt: int


@dataclass(frozen=True)
class RemoveScratch:
    uid: str


@dataclass(frozen=True)
class Unrecord:
    """Unrecord: the attempt is forgotten: drop what is kept of it, its run record included."""

    uid: str
    attempt: int


Instruction = Start | Stop | Report | Settle | RemoveScratch | Unrecord


@dataclass(frozen=True)
class Transition:
    """Transition: attempt `attempt` of pod `uid` went from phase `before` to `after` (NEW:
    it was not known; FORGOTTEN: it is no longer) on stimulus `stimulus_id`, at `at`."""

    stimulus_id: str
    uid: str
    attempt: int
    before: str
    after: str
    at: float


class PodStates:
    """PodStates holds every attempt this node knows: the current one per pod (`pods`) and
    the live ones a newer order replaced (`replaced`, until they end), and the newest
    attempt ordered of each pod (`newest`), which outlives its record: an order of an attempt
    already forgotten is not started again. `transitions` is the story of them all, the
    newest last; `clock` stamps it."""

    def __init__(
        self, clock: Callable[[], float] = time.time, story_length: int = STORY_LENGTH
    ) -> None:
        self.pods: dict[str, Pod] = {}
        self.replaced: dict[tuple[str, int], Pod] = {}
        self.newest: dict[str, int] = {}
        self.transitions: deque[Transition] = deque(maxlen=story_length)
        self._clock = clock
        self._stimuli = 0
        self._stimulus_id = ""

    def find(self, uid: str, attempt: int) -> Pod | None:
        pod = self.pods.get(uid)
        if pod is not None and pod.attempt == attempt:
            return pod
        return self.replaced.get((uid, attempt))

    def story(self, uid: str) -> list[Transition]:
        """story: the transitions of pod `uid` (every attempt) still kept, oldest first."""
        return [t for t in self.transitions if t.uid == uid]

    def handle(self, stimulus: Stimulus) -> list[Instruction]:
        """handle applies one stimulus, tagged with the next stimulus id, and returns what the
        supervisor must do, in order."""
        self._stimuli += 1
        self._stimulus_id = f"{type(stimulus).__name__.lower()}-{self._stimuli}"
        match stimulus:
            case Ordered():
                return self._ordered(stimulus)
            case Started():
                return self._started(stimulus)
            case Ready():
                pod = self.find(stimulus.uid, stimulus.attempt)
                if pod is None or pod.phase != Phase.STARTING:
                    return []
                self._move(pod, Phase.RUNNING, PodState.RUNNING)
                return [Report(pod.uid, pod.attempt)]
            case Exited():
                pod = self.find(stimulus.uid, stimulus.attempt)
                if pod is None or pod.phase.ended:
                    return []  # told twice: settled once
                return self._end(pod, stimulus.code, stimulus.now, stimulus.oom, stimulus.failure)
            case KillOrdered():
                return self._kill_ordered(stimulus)
            case StopAll():
                out: list[Instruction] = []
                for pod in [*self.pods.values(), *self.replaced.values()]:
                    if not pod.phase.ended:
                        out += self._stop(pod, stimulus.grace_s, stimulus.reason)
                return out
            case Adopted():
                return self._adopted(stimulus)
            case Forgotten():
                pod = self.pods.get(stimulus.uid)
                if pod is None or not pod.phase.ended:
                    return []
                del self.pods[stimulus.uid]
                self._note(pod, pod.phase, FORGOTTEN)
                return [Unrecord(stimulus.uid, pod.attempt)]

    def _move(self, pod: Pod, phase: Phase, state: PodState | None = None) -> None:
        """_move puts the attempt in `phase` (and `state`, if given), noting the change."""
        before, pod.phase = pod.phase, phase
        if state is not None:
            pod.state = state
        if before != phase:
            self._note(pod, before, phase)

    def _known(self, pod: Pod) -> Pod:
        """_known notes a new attempt in its first phase."""
        self._note(pod, NEW, pod.phase)
        return pod

    def _note(self, pod: Pod, before: str, after: str) -> None:
        transition = Transition(
            self._stimulus_id, pod.uid, pod.attempt, before, after, self._clock()
        )
        self.transitions.append(transition)
        log.debug(
            "pod transition",
            stimulus=transition.stimulus_id,
            pod=pod.uid,
            attempt=pod.attempt,
            before=before,
            after=after,
        )

    def _ordered(self, order: Ordered) -> list[Instruction]:
        current = self.pods.get(order.uid)
        if current is not None and current.attempt >= order.attempt:
            return [Report(current.uid, current.attempt)]  # a repeated order: say how it stands
        if order.attempt <= self.newest.get(order.uid, -1):
            return []  # an attempt that ran here and was forgotten: it never runs twice
        self.newest[order.uid] = order.attempt
        out: list[Instruction] = []
        if current is not None and not current.phase.ended:
            self.replaced[(current.uid, current.attempt)] = current
            out += self._stop(current, 0.0, "Killed")
        self.pods[order.uid] = self._known(Pod(order.uid, order.attempt, grace_s=order.grace_s))
        return [*out, Start(order.uid, order.attempt, order.order)]

    def _started(self, started: Started) -> list[Instruction]:
        pod = self.find(started.uid, started.attempt)
        if pod is None or pod.phase.ended or pod.start_time:
            return []
        pod.start_time = started.now
        if pod.kill_requested:  # stopped while it started: now it can be signalled
            return [Stop(pod.uid, pod.attempt, pod.grace_s, pod.kill_reason)]
        if started.ready:
            self._move(pod, Phase.RUNNING, PodState.RUNNING)
        else:
            self._move(pod, Phase.STARTING)
        return [Report(pod.uid, pod.attempt)]

    def _kill_ordered(self, kill: KillOrdered) -> list[Instruction]:
        pod = self.pods.get(kill.uid)
        if pod is None or pod.attempt != kill.attempt:
            return [RemoveScratch(kill.uid)] if kill.remove_scratch else []
        pod.remove_scratch = pod.remove_scratch or kill.remove_scratch
        if pod.phase.ended:
            return [RemoveScratch(kill.uid)] if pod.remove_scratch else []
        return self._stop(pod, kill.grace_s, "Killed")

    def _stop(self, pod: Pod, grace_s: float, reason: str) -> list[Instruction]:
        if not pod.kill_reason:
            pod.kill_reason = reason
        self._move(pod, Phase.FENCED if pod.kill_reason == FENCED else Phase.STOPPING)
        return [Stop(pod.uid, pod.attempt, grace_s, pod.kill_reason)]

    def _adopted(self, adopted: Adopted) -> list[Instruction]:
        pod = Pod(adopted.uid, adopted.attempt, Phase.ADOPTED, kill_reason=adopted.kill_reason)
        pod.start_time = adopted.now
        self.pods[adopted.uid] = pod
        self.newest[adopted.uid] = max(adopted.attempt, self.newest.get(adopted.uid, -1))
        if adopted.running:
            pod.state = PodState.RUNNING
            if pod.kill_reason:
                pod.phase = Phase.FENCED if pod.kill_reason == FENCED else Phase.STOPPING
            self._known(pod)
            return []
        self._known(pod)
        ended = adopted.ended_at if adopted.ended_at is not None else adopted.now
        return self._end(pod, adopted.code, ended, adopted.oom, "")

    def _end(
        self, pod: Pod, code: int | None, now: float, oom: bool, failure: str
    ) -> list[Instruction]:
        """_end settles an attempt by its exit code (see `ending`)."""
        state, pod.reason = ending(pod, code, oom, failure)
        pod.exit_code, pod.finish_time = code, now
        self._move(pod, Phase.LOST if state == PodState.LOST else Phase.EXITED, state)
        self.replaced.pop((pod.uid, pod.attempt), None)
        return [Settle(pod.uid, pod.attempt)]


def ending(pod: Pod, code: int | None, oom: bool, failure: str) -> tuple[PodState, str]:
    """ending: how an attempt ended. A stop asked for makes it Killed (with the stop's
    reason) whatever its code; else a program that never ran, or that the kernel killed for
    memory, Failed; exit 0 Succeeded; another code Failed; no code known Lost."""
    if pod.kill_requested:
        return PodState.KILLED, pod.kill_reason
    if code is None:
        return PodState.LOST, LOST_REASON
    if failure:
        return PodState.FAILED, failure
    if oom and code != 0:
        return PodState.FAILED, "OOMKilled"
    if code == 0:
        return PodState.SUCCEEDED, "Completed"
    return PodState.FAILED, describe_exit(code)


def describe_exit(code: int) -> str:
    """describe_exit: "killed by SIGTERM" for 128 + N (a signal), else "exit code N"."""
    killed_by = signal_of(code)
    return f"killed by {killed_by}" if killed_by else f"exit code {code}"
