"""A pod's shim fences it once no agent has run, and no server was heard, for the fence timeout;
an agent back in time keeps it. The shim here is the real one, run as the agent runs it."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from arranger.agent import process
from arranger.agent.cgroups import Cgroups
from arranger.agent.fence import AgentLock, AgentRunning, ServerContact, files
from tests.agent.shims import SHIMS, tools_with, waiting_on
from tests.conftest import eventually, script

FENCE_S = 1.0


FOREVER = "import signal\nsignal.pause()\n"
# FILL takes every task its pids limit leaves (threads count as processes there), then waits.
FILL = (
    "import signal, threading\n"
    "try:\n"
    "    while True:\n"
    "        threading.Thread(target=signal.pause, daemon=True).start()\n"
    "except RuntimeError:\n"
    "    print('FULL', flush=True)\n"
    "signal.pause()\n"
)


@contextlib.contextmanager
def fenced_pod(
    data_dir: Path, shim: str | None, code: str = FOREVER, cgroup_procs: Sequence[Path] = ()
) -> Iterator[int]:
    """fenced_pod: a pod (waiting forever) started under the shim with the fence files of
    data_dir, in the cgroups given; yields the shim's pid, and kills whatever is left of its
    group after."""
    pod = script(data_dir, "forever", code)
    exit_file = data_dir / "runs" / "pod.0.exit"
    exit_file.parent.mkdir(parents=True)
    child, spec = process.spawn(
        pod,
        {"PATH": os.defpath},
        data_dir,
        data_dir / "pod.log",
        exit_file,
        tools_with(shim),
        cgroup_procs=cgroup_procs,
        fence=files(data_dir),
    )
    try:
        yield child.pid
    finally:
        process.signal_group(child.pid, signal.SIGKILL)
        child.wait()
        os.close(spec)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shim_program", SHIMS)
async def test_a_pod_without_an_agent_is_fenced_after_the_timeout(
    tmp_path: Path, shim_program: str | None
) -> None:
    lock = AgentLock(tmp_path)
    lock.acquire()
    contact = ServerContact(tmp_path, FENCE_S)
    contact.set_timeout(FENCE_S)
    heard = (tmp_path / "server-heard").stat().st_mtime
    watching = functools.partial(waiting_on, files(tmp_path).lock)
    with fenced_pod(tmp_path, shim_program) as shim:
        await eventually(lambda: watching(shim), what="the watch to wait on the agent's lock")
        with pytest.raises(AgentRunning):  # one agent per data directory
            AgentLock(tmp_path).acquire()
        lock.release()  # the agent stops (or crashes)
        await eventually(lambda: gone(shim), what="the fence")
        assert time.time() >= heard + FENCE_S, "never before the fence timeout"
        assert (tmp_path / "runs" / "pod.0.kill").read_text().strip() == "Fenced"
        assert "arranger: fenced" in (tmp_path / "pod.log").read_text()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shim_program", SHIMS)
async def test_a_pod_that_fills_its_pids_limit_is_fenced_all_the_same(
    tmp_path: Path, shim_program: str | None
) -> None:
    """The watch's own processes are not the pod's to take: a pod holding every task its pids
    limit allows is still fenced once no agent runs."""
    cgroups, why = Cgroups.detect(f"test-fence-{os.getpid()}", limits=False)
    if cgroups is None or "pids" not in cgroups.bases:
        pytest.skip(f"no pids controller here: {why or (cgroups and cgroups.lacking)}")
    cgroup = cgroups.create("pod.0", 0, 0, pids=12)
    lock = AgentLock(tmp_path)
    lock.acquire()
    ServerContact(tmp_path, FENCE_S).set_timeout(FENCE_S)
    try:
        with fenced_pod(tmp_path, shim_program, FILL, cgroup.procs) as shim:
            log = tmp_path / "pod.log"
            await eventually(lambda: "FULL" in log.read_text(), what="the pod to fill its limit")
            lock.release()
            await eventually(lambda: gone(shim), what="the fence")
            assert (tmp_path / "runs" / "pod.0.kill").read_text().strip() == "Fenced"
    finally:
        cgroup.kill()
        await eventually(lambda: not cgroup.procs[0].read_text().split(), what="the pod to end")
        cgroup.remove()
        cgroups.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shim_program", SHIMS)
async def test_an_agent_back_within_the_timeout_keeps_its_pods(
    tmp_path: Path, shim_program: str | None
) -> None:
    lock = AgentLock(tmp_path)
    lock.acquire()
    ServerContact(tmp_path, FENCE_S).set_timeout(FENCE_S)
    deadline = (tmp_path / "server-heard").stat().st_mtime + FENCE_S
    watching = functools.partial(waiting_on, files(tmp_path).lock)
    with fenced_pod(tmp_path, shim_program) as shim:
        await eventually(lambda: watching(shim), what="the watch to wait on the agent's lock")
        lock.release()  # the agent stops...
        await eventually(lambda: not watching(shim), what="the watch to notice")
        lock = AgentLock(tmp_path)
        lock.acquire()  # ...and the next one starts in time

        def waits_again() -> bool:  # past the deadline, on the new agent's lock
            return time.time() > deadline + 0.2 and bool(watching(shim))

        await eventually(waits_again, what="the watch to wait on the new agent")
        assert not gone(shim), "the pod runs on"
        assert not (tmp_path / "runs" / "pod.0.kill").exists()
    lock.release()


def test_a_restarted_agent_keeps_the_time_the_server_was_last_heard(tmp_path: Path) -> None:
    ServerContact(tmp_path, 300).set_timeout(42)
    then = time.time() - 100
    os.utime(tmp_path / "server-heard", (then, then))
    later = ServerContact(tmp_path, 300)  # the next agent, its config saying 300
    assert later.fence_timeout_s == 42
    assert 99 < later.silent_s() < 110
