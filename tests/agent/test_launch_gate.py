"""A pod's program begins only once its run is recorded: the shim waits on a pipe the agent
holds. An agent that dies before it recorded the run (SIGKILL between spawning and writing the
record) leaves nothing running, so the next agent, which cannot know that run, never finds a
second copy of a pod it starts again. The shim and agents here are real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from arranger.agent import process
from tests.agent.shims import SHIMS, tools_with
from tests.conftest import eventually, script

ROOT = str(Path(__file__).resolve().parent.parent.parent)
MARKS = "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('ran')\n"


def spawn_gated(
    tmp_path: Path, mark: Path, shim: str | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    """spawn_gated: the shim (`shim`, None: the shell's) of a pod that writes `mark`, held at
    its gate; the shim, the gate's write end (the agent's) and the launcher's spec
    descriptor."""
    gate, held = os.pipe2(os.O_CLOEXEC)
    exit_file = tmp_path / "runs" / "pod.0.exit"
    exit_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        child, spec = process.spawn(
            [*script(tmp_path, "marks", MARKS), str(mark)],
            {"PATH": os.defpath},
            tmp_path,
            tmp_path / "pod.log",
            exit_file,
            tools_with(shim),
            gate=gate,
        )
    finally:
        os.close(gate)
    return child, held, spec


@pytest.mark.parametrize("shim", SHIMS)
def test_the_program_begins_when_the_agent_says_go(tmp_path: Path, shim: str | None) -> None:
    mark = tmp_path / "mark"
    child, held, spec = spawn_gated(tmp_path, mark, shim)
    try:
        assert child.poll() is None and not mark.exists()  # held at the gate
        os.write(held, b"go\n")
        os.close(held)
        assert child.wait(timeout=30) == 0
        assert mark.read_text() == "ran"
    finally:
        os.close(spec)


@pytest.mark.parametrize("shim", SHIMS)
def test_a_gate_closed_without_go_runs_nothing(tmp_path: Path, shim: str | None) -> None:
    mark = tmp_path / "mark"
    child, held, spec = spawn_gated(tmp_path, mark, shim)
    os.close(held)  # as the kernel does for an agent that died
    try:
        assert child.wait(timeout=30) == 125
        assert not mark.exists()
    finally:
        os.close(spec)


AGENT = """
import os, sys, signal
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.agent.test_launch_gate import spawn_gated
child, held, spec = spawn_gated(Path({tmp!r}), Path({mark!r}), {shim!r})
print(child.pid, flush=True)
signal.pause()  # killed here: spawned, never recorded
"""


@pytest.mark.parametrize("shim", SHIMS)
async def test_an_agent_killed_before_recording_a_run_leaves_nothing_running(
    tmp_path: Path, shim: str | None
) -> None:
    mark = tmp_path / "mark"
    code = AGENT.format(root=ROOT, tmp=str(tmp_path), mark=str(mark), shim=shim)
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    assert agent.stdout is not None
    shim = int(await agent.stdout.readline())
    agent.kill()
    await agent.wait()

    def shim_gone() -> bool:
        try:
            return psutil.Process(shim).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await eventually(shim_gone, timeout_s=30, what="the orphaned shim to exit")
    assert not mark.exists()  # the pod's program never ran
