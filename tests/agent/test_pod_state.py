"""The agent's pod state machine, driven directly with generated sequences of stimuli.

A small model of the runtime stands beside it: it starts what `Start` says, and delivers the
end of a started program whenever the sequence says so, or after a `Stop`. Whatever the order
of orders, kills, stops, starts and ends: no attempt is started twice, no end is lost (every
started attempt that ended is settled, once), and every stopped attempt ends Killed, or Lost
when its exit code is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.agent import pod_state as ps
from arranger.states import AGENT_STOPPED, FENCED, PodState

UIDS = ("j/a", "j/b")


@dataclass
class Runtime:
    """Runtime: what a real runtime would do with the machine's instructions."""

    machine: ps.PodStates = field(default_factory=ps.PodStates)
    started: list[tuple[str, int]] = field(default_factory=list)
    running: set[tuple[str, int]] = field(default_factory=set)  # programs that exist
    starting: set[tuple[str, int]] = field(default_factory=set)  # asked to start
    stopped: set[tuple[str, int]] = field(default_factory=set)
    settled: list[tuple[str, int]] = field(default_factory=list)
    now: float = 0.0

    def feed(self, stimulus: ps.Stimulus) -> None:
        self.now += 1
        for instruction in self.machine.handle(stimulus):
            match instruction:
                case ps.Start(uid, attempt):
                    self.started.append((uid, attempt))
                    self.starting.add((uid, attempt))
                case ps.Stop(uid, attempt):
                    self.stopped.add((uid, attempt))
                case ps.Settle(uid, attempt):
                    self.settled.append((uid, attempt))
                case _:
                    pass

    def step(self, action: tuple[str, int, int, bool]) -> None:
        kind, which, attempt, flag = action
        uid = UIDS[which]
        if kind == "order":
            self.feed(ps.Ordered(uid, attempt, grace_s=1.0))
        elif kind == "kill":
            self.feed(ps.KillOrdered(uid, attempt, 1.0, remove_scratch=flag))
        elif kind == "stop_all":
            self.feed(ps.StopAll(FENCED if flag else AGENT_STOPPED, 1.0))
        elif kind == "start":  # the runtime finishes starting one it was asked to
            for key in sorted(self.starting):
                if key[0] == uid:
                    self.starting.discard(key)
                    if flag:
                        self.running.add(key)
                        self.feed(ps.Started(*key, now=self.now, ready=attempt % 2 == 0))
                    else:
                        self.feed(ps.Exited(*key, code=127, now=self.now, failure="not found"))
                    break
        elif kind == "ready":
            for key in sorted(self.running):
                if key[0] == uid:
                    self.feed(ps.Ready(*key))
        elif kind == "exit":
            for key in sorted(self.running):
                if key[0] == uid:
                    self.running.discard(key)
                    self.feed(ps.Exited(*key, code=None if flag else attempt, now=self.now))
                    break
        elif kind == "forget":
            self.feed(ps.Forgotten(uid))

    def drain(self) -> None:
        """drain: every program asked to start starts, and every program ends (a stopped one
        because it was stopped)."""
        for key in sorted(self.starting):
            self.running.add(key)
            self.feed(ps.Started(*key, now=self.now))
        self.starting.clear()
        for key in sorted(self.running):
            self.feed(ps.Exited(*key, code=143 if key in self.stopped else 0, now=self.now))
        self.running.clear()


actions = st.lists(
    st.tuples(
        st.sampled_from(["order", "kill", "stop_all", "start", "ready", "exit", "forget"]),
        st.integers(0, len(UIDS) - 1),
        st.integers(0, 3),
        st.booleans(),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(actions)
def test_no_attempt_starts_twice_no_end_is_lost_and_every_stop_ends(
    steps: list[tuple[str, int, int, bool]],
) -> None:
    runtime = Runtime()
    for action in steps:
        runtime.step(action)
    runtime.drain()

    assert len(runtime.started) == len(set(runtime.started)), "an attempt started twice"
    assert len(runtime.settled) == len(set(runtime.settled)), "an end settled twice"
    assert set(runtime.settled) == set(runtime.started), "an end was lost"
    ended = {**runtime.machine.replaced}
    assert not ended, "a replaced attempt never ended"
    for uid, pod in runtime.machine.pods.items():
        assert pod.phase.ended, f"{uid} still {pod.phase}"
    for uid, attempt in runtime.stopped:
        pod = runtime.machine.pods.get(uid)
        if pod is not None and pod.attempt == attempt:
            assert pod.state in (PodState.KILLED, PodState.LOST), pod
            assert pod.reason in ("Killed", AGENT_STOPPED, FENCED, ps.LOST_REASON)


def test_a_repeated_order_is_answered_with_how_the_attempt_stands() -> None:
    machine = ps.PodStates()
    assert machine.handle(ps.Ordered("j/a", 0)) == [ps.Start("j/a", 0)]
    assert machine.handle(ps.Ordered("j/a", 0)) == [ps.Report("j/a", 0)]
    assert machine.handle(ps.Started("j/a", 0, now=5.0)) == [ps.Report("j/a", 0)]
    assert machine.pods["j/a"].state == PodState.RUNNING


def test_a_newer_order_stops_the_older_attempt_and_settles_both() -> None:
    machine = ps.PodStates()
    machine.handle(ps.Ordered("j/a", 0))
    machine.handle(ps.Started("j/a", 0, now=1.0))
    assert machine.handle(ps.Ordered("j/a", 1, grace_s=2.0)) == [
        ps.Stop("j/a", 0, 0.0, "Killed"),
        ps.Start("j/a", 1),
    ]
    assert machine.handle(ps.Exited("j/a", 0, code=137, now=2.0)) == [ps.Settle("j/a", 0)]
    assert machine.pods["j/a"].attempt == 1 and not machine.replaced


def test_an_end_is_judged_by_what_was_asked() -> None:
    machine = ps.PodStates()
    machine.handle(ps.Adopted("j/a", 0, running=True, now=1.0))
    machine.handle(ps.StopAll(FENCED, 5.0))
    assert machine.pods["j/a"].phase == ps.Phase.FENCED
    machine.handle(ps.Exited("j/a", 0, code=0, now=2.0))
    assert (machine.pods["j/a"].state, machine.pods["j/a"].reason) == (PodState.KILLED, FENCED)
    machine.handle(ps.Adopted("j/b", 0, running=False, now=1.0, code=None))
    assert machine.pods["j/b"].state == PodState.LOST
    machine.handle(ps.Ordered("j/c", 0))
    machine.handle(ps.Started("j/c", 0, now=1.0))
    machine.handle(ps.Exited("j/c", 0, code=137, now=2.0, oom=True))
    assert (machine.pods["j/c"].state, machine.pods["j/c"].reason) == (PodState.FAILED, "OOMKilled")


def test_the_story_of_a_pod_tells_its_transitions_in_order_with_their_stimuli() -> None:
    clock = iter(range(100))
    machine = ps.PodStates(clock=lambda: float(next(clock)))
    machine.handle(ps.Ordered("j/a", 0))  # ordered-1
    machine.handle(ps.Ordered("j/b", 0))  # ordered-2: another pod's
    machine.handle(ps.Started("j/a", 0, now=1.0, ready=False))  # started-3
    machine.handle(ps.Ready("j/a", 0))  # ready-4
    machine.handle(ps.Ordered("j/a", 1))  # ordered-5: replaces attempt 0
    machine.handle(ps.Exited("j/a", 0, code=143, now=2.0))  # exited-6
    machine.handle(ps.Ordered("j/a", 1))  # ordered-7: repeated, no transition
    story = [(t.stimulus_id, t.attempt, t.before, t.after) for t in machine.story("j/a")]
    assert story == [
        ("ordered-1", 0, ps.NEW, "ordered"),
        ("started-3", 0, "ordered", "starting"),
        ("ready-4", 0, "starting", "running"),
        ("ordered-5", 0, "running", "stopping"),
        ("ordered-5", 1, ps.NEW, "ordered"),
        ("exited-6", 0, "stopping", "exited"),
    ]
    assert [t.at for t in machine.story("j/a")] == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [t.stimulus_id for t in machine.story("j/b")] == ["ordered-2"]


def test_the_story_is_bounded_and_ends_with_the_forgetting() -> None:
    machine = ps.PodStates(clock=lambda: 0.0, story_length=5)
    for attempt in range(4):
        machine.handle(ps.Ordered("j/a", attempt))
        machine.handle(ps.Exited("j/a", attempt, code=0, now=1.0))
    machine.handle(ps.Forgotten("j/a"))
    assert len(machine.transitions) == 5
    story = [(t.attempt, t.before, t.after) for t in machine.story("j/a")]
    assert story == [
        (2, ps.NEW, "ordered"),
        (2, "ordered", "exited"),
        (3, ps.NEW, "ordered"),
        (3, "ordered", "exited"),
        (3, "exited", ps.FORGOTTEN),
    ]
