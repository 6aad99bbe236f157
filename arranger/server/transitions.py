"""transitions: the controller's recent changes of jobs' stages and pods' states, each tagged
with the stimulus that made it (as dask's worker story), for whoever asks how a job came to be
where it is.

Each stimulus the controller takes (a submit, a plan, a pod report, a node lost, the clock...)
gets an id made here, `<stimulus>-<n>`, n counting up from 1 per controller. When the stimulus
has been applied, every job and pod its effects touched is compared with the stage or state
last told of it, and each change is told: appended to a bounded log (the oldest go first) and
written at debug level. A transition is a record's change over one stimulus, as it is stored
in one commit: a state a pod passes through within one stimulus (Placed on the way to
Launching, when its plan also launches it) is never stored nor seen outside, and is not told.
A record new with the stimulus is told from "" (none).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar

import structlog

from arranger.server.effects import Effects
from arranger.server.model import JobRecord

log = structlog.get_logger("arranger.server")


class Transition(NamedTuple):
    """Transition: `key` (a job's id, or a pod's uid "<job id>/<pod name>") went from stage
    or state `before` ("": none, it is new) to `after`, by the stimulus `stimulus_id` (a
    `stimulus`), whose time was `time` (the server's clock, unix seconds)."""

    stimulus_id: str
    stimulus: str
    key: str
    before: str
    after: str
    time: float


class TransitionLog:
    """TransitionLog: the last `length` transitions, oldest first (`entries`), and the stage or
    state last told of every job and pod in memory (`told`, by key). `count` is the number of
    stimuli taken, `name` the one being applied ("": none).

    An entry is kept as one string, "<stimulus id>\t<time>\t<key>\t<before>\t<after>" (no
    key holds a tab): strings are no work for the garbage collector, while a cycle's thousands
    of tuples would make it run more often and promote more to its oldest generation."""

    def __init__(self, jobs: Mapping[str, JobRecord], length: int) -> None:
        self.jobs = jobs
        self.entries: deque[str] = deque(maxlen=length)
        self.told: dict[str, str] = {}
        self.count = 0
        self.name = ""

    def tell(self, fx: Effects, now: float) -> None:
        """tell: the stimulus being applied has these effects; each job and pod they touched
        whose stage or state is not the one last told has made a transition. Those of one
        stimulus are kept in the order of their keys: a job before its pods."""
        told, jobs = self.told, self.jobs
        found: list[str] = []  # "<key>\t<before>\t<after>"
        # A stage's or state's _value_ is its plain string (`.value`, a descriptor, is slower).
        for job_id in fx.jobs:
            job = jobs.get(job_id)
            if job is not None and (after := job.stage._value_) != (was := told.get(job_id)):
                found.append(f"{job_id}\t{was or ''}\t{after}")
                told[job_id] = after
        for uid in fx.pods:
            job_id, _, pod_name = uid.partition("/")
            job = jobs.get(job_id)
            pod = job.pods.get(pod_name) if job is not None else None
            if pod is not None and (after := pod.state._value_) != (was := told.get(uid)):
                found.append(f"{uid}\t{was or ''}\t{after}")
                told[uid] = after
        if not found:
            return
        if len(found) > 1:
            found.sort()  # "\t" sorts before "/": a job's own before its pods'
        stimulus_id = f"{self.name}-{self.count}"
        stamp = f"{stimulus_id}\t{now!r}\t"
        self.entries.extend(stamp + change for change in found)
        if _debugging():
            for change in found:
                key, before, after = change.split("\t")
                log.debug(
                    "transition", stimulus_id=stimulus_id, key=key, before=before, after=after
                )

    def know(self, job: JobRecord) -> None:
        """know: the job and its pods are as stored (restored, or put back after a write that
        failed): what they are now is told of them, without a transition."""
        self.told[job.id] = job.stage._value_
        for pod in job.pods.values():
            self.told[pod.uid] = pod.state._value_

    def forget(self, job: JobRecord) -> None:
        """forget: the job and its pods are no longer in memory."""
        self.told.pop(job.id, None)
        for pod in job.pods.values():
            self.told.pop(pod.uid, None)

    def recent(self) -> list[Transition]:
        """recent: every transition kept, oldest first."""
        return [_transition(entry) for entry in self.entries]

    def story(self, key: str) -> list[Transition]:
        """story: the transitions kept of `key`, oldest first: a pod's (by uid), or a job's
        and its pods' (by the job's id)."""
        own, pods = f"\t{key}\t", f"\t{key}/"
        return [_transition(e) for e in self.entries if own in e or pods in e]


def _transition(entry: str) -> Transition:
    stimulus_id, time, key, before, after = entry.split("\t")
    name = stimulus_id.rpartition("-")[0]
    return Transition(stimulus_id, name, key, before, after, float(time))


def _debugging() -> bool:
    """_debugging: structlog as configured now writes debug lines (asked once a stimulus:
    the logger itself costs microseconds a call even when it writes nothing)."""
    wrapper = structlog.get_config()["wrapper_class"]
    level = getattr(wrapper, "get_effective_level", None)
    return level is None or level(None) <= logging.DEBUG


class Tells(Protocol):
    """Tells: what takes stimuli and tells their transitions (the controller)."""

    transitions: TransitionLog


S = TypeVar("S", bound=Tells)
P = ParamSpec("P")
R = TypeVar("R")


def stimulus(
    name: str,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """stimulus marks a method as a stimulus called `name`: it gets an id, and the transitions
    in the effects it returns (alone, or beside the record it made) are told with it, at its
    `now`. A stimulus taken on the way of another is part of that one."""

    def mark(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        params = list(inspect.signature(method).parameters)
        at = params.index("now") - 1 if "now" in params else -1  # in args, past self

        @functools.wraps(method)
        def tagged(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            story = self.transitions
            if story.name:
                return method(self, *args, **kwargs)
            story.count += 1
            story.name = name
            try:
                result = method(self, *args, **kwargs)
                fx = result if isinstance(result, Effects) else _effects(result)
                if fx is not None and (fx.jobs or fx.pods):
                    story.tell(fx, _now(args, kwargs, at))
            finally:
                story.name = ""
            return result

        return tagged

    return mark


def _effects(result: object) -> Effects | None:
    """_effects: the Effects a stimulus returned beside the record it made (None: none)."""
    if isinstance(result, tuple):
        return next((r for r in result if isinstance(r, Effects)), None)
    return None


def _now(args: tuple[object, ...], kwargs: Mapping[str, object], at: int) -> float:
    """_now: the stimulus's `now`, given by name or at `at` among the arguments."""
    now = kwargs["now"] if "now" in kwargs else args[at] if 0 <= at < len(args) else 0.0
    return float(now) if isinstance(now, float | int) else 0.0
