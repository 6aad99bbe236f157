"""Timers kept from the controller's changes hand the clock's stimuli exactly the jobs that need
them: after generated sequences of stimuli (the ones the kept snapshot is tested with), ticking
only the jobs that are due leaves nothing for a tick of every job to do, and every job's future
time is kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.server.effects import Effects
from arranger.server.timers import Timers
from tests.server.test_scheduling_state import START, World, step

RETRY_S = 1.0


class TimedWorld(World):
    """TimedWorld: the World whose clock's stimuli go only to the jobs the timers hand over."""

    def __init__(self) -> None:
        super().__init__()
        self.timers = Timers(self.c.timer, RETRY_S)

    def apply(self, fx: Effects) -> None:
        super().apply(fx)
        self.timers.changed(fx.touched_jobs())

    def do(self, action: tuple[object, ...]) -> None:
        if action[0] != "time":
            super().do(action)
            return
        self.now += float(action[1])  # type: ignore[arg-type]
        c, now = self.c, self.now
        self.apply(c.check_nodes(now))
        for _ in range(int(float(action[1]) / RETRY_S) + 1):  # the retries within the step
            self.apply(c.tick(now, [c.jobs[i] for i in self.timers.due(now) if i in c.jobs]))
        left = c.tick(now)  # every job: nothing may be left for it to do
        assert not (left.launches or left.kills or left.events), left


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_due_jobs_are_all_the_clock_needs_to_look_at(steps: list[tuple[object, ...]]) -> None:
    world = TimedWorld()
    for action in START + steps:
        world.do(action)
        now = world.now
        for job_id in world.c.jobs:
            timer = world.c.timer(job_id)
            if timer is not None and timer > now:
                assert world.timers.at(job_id, now) == timer, (action, job_id)
        times = [t for j in world.c.jobs if (t := world.c.timer(j)) is not None and t > now]
        wake = min(times, default=None)
        kept = world.timers.next(now)
        assert wake is None or (kept is not None and kept <= wake), (wake, kept)


def test_a_job_the_tick_cannot_settle_is_retried_later_not_at_once() -> None:
    times = {"j": 5.0}
    timers = Timers(times.get, retry_s=2.0)
    timers.changed(["j"])
    assert timers.next(10.0) == 12.0  # its time has passed: handed over at the retry
    assert timers.due(11.0) == []
    assert timers.due(12.0) == ["j"]
    assert timers.next(12.0) == 14.0  # still past: again a retry later
    times["j"] = 30.0
    timers.changed(["j"])
    assert timers.next(12.5) == 30.0  # a time to come replaces the retry
    assert timers.due(29.0) == []
    assert timers.due(30.0) == ["j"]
    del times["j"]
    timers.changed(["j"])
    assert timers.next(15.0) is None and timers.due(100.0) == []
