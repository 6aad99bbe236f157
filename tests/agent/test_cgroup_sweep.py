"""Empty pod cgroups do not outlive their pods: one whose removal failed while its last process
was still dying is removed when the next pod ends, and an agent that starts removes every
empty one an earlier agent left; one with a process in it, or of a run just starting (its shim
not in it yet), stays. Real cgroups, real processes; skipped where this machine's cgroups
cannot be written."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from arranger.agent.cgroups import Cgroups, PodCgroup
from arranger.agent.supervisor import Supervisor

MIB = 2**20


@pytest.fixture
def node() -> str:
    return f"test-sweep-{os.getpid()}"


@pytest.fixture
def cgroups(node: str) -> Iterator[Cgroups]:
    found, why = Cgroups.detect(node)
    if found is None:
        pytest.skip(f"cgroups cannot be used here: {why}")
    yield found
    found.close()
    assert not any(base.exists() for base in found.bases.values()), "pod cgroups were left"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """sleeper: a real process for a pod's cgroup to hold; killed after."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def join(cgroup: PodCgroup, proc: subprocess.Popen[bytes]) -> None:
    """join moves `proc` into the cgroup, as a pod's shim moves itself."""
    for procs in cgroup.procs:
        procs.write_text(str(proc.pid))


def end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()  # reaped: the kernel no longer counts it in its cgroup


def exists(cgroup: PodCgroup) -> bool:
    return any(d.exists() for d in cgroup.dirs.values())


def test_a_cgroup_left_while_its_process_died_goes_when_the_next_pod_ends(
    cgroups: Cgroups, sleeper: subprocess.Popen[bytes]
) -> None:
    first = cgroups.create("j1/first.0", 64 * MIB, 500)
    join(first, sleeper)
    first.remove()  # the pod's end, while a process of it still dies
    assert exists(first)
    end(sleeper)
    second = cgroups.create("j1/second.0", 64 * MIB, 500)
    assert exists(first)  # not yet: it goes when a pod ends
    second.remove()
    assert not exists(first) and not exists(second)


def test_an_agent_that_starts_removes_the_empty_pod_cgroups_an_earlier_one_left(
    cgroups: Cgroups, node: str, tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # The earlier agent: one pod's cgroup whose removal failed as its process died, one that
    # no run record names (that agent died between making it and recording the run), and one
    # whose pod still runs.
    dying = cgroups.create("j1/dying.0", 64 * MIB, 500)
    unrecorded = cgroups.create("j1/unrecorded.0", 64 * MIB, 500)
    running = cgroups.create("j1/running.0", 64 * MIB, 500)
    join(running, sleeper)
    with subprocess.Popen(["sleep", "600"]) as last:
        join(dying, last)
        dying.remove()
        end(last)
    assert exists(dying) and exists(unrecorded)

    again, _ = Cgroups.detect(node)  # the next agent on this node
    assert again is not None
    Supervisor(node, "127.0.0.1", tmp_path, lambda run: None, cgroups=again).recover()
    assert not exists(dying) and not exists(unrecorded)
    assert exists(running)  # a process is in it
    end(sleeper)
    running.remove()


def test_a_run_just_starting_keeps_its_empty_cgroup(cgroups: Cgroups) -> None:
    starting = cgroups.create("j1/starting.0", 64 * MIB, 500)  # its shim has not joined yet
    assert cgroups.sweep(keep={"j1/starting.0"}) == []
    assert exists(starting)
    assert cgroups.sweep() == ["j1_starting.0"]
    assert not exists(starting)
