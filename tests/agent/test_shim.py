"""The shim a pod runs under, both kinds (the shell's and the compiled one): it records the
pod's exit code where the agent reads it (128 + N for signal N), outlives a TERM sent to the
group until the pod has ended, runs nothing when it cannot join the pod's cgroup, and gives the
pod /dev/null for stdin and none of its own variables. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from arranger.agent import launcher, process
from arranger.agent.fence import ServerContact, files
from tests.agent.shims import COMPILED_SHIM, COMPILER, SHIMS, tools_with
from tests.conftest import eventually, script

pytestmark = pytest.mark.parametrize("shim", SHIMS)


@contextmanager
def pod(
    tmp_path: Path, shim: str | None, code: str, cgroup_procs: tuple[Path, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """pod: a Python program started under the shim; the shim and the exit file."""
    exit_file = tmp_path / "runs" / "pod.0.exit"
    exit_file.parent.mkdir(parents=True, exist_ok=True)
    child, spec = process.spawn(
        script(tmp_path, "program", code),
        {"PATH": os.defpath, "OUT": str(tmp_path)},
        tmp_path,
        tmp_path / "pod.log",
        exit_file,
        tools_with(shim),
        cgroup_procs=cgroup_procs,
    )
    try:
        yield child, exit_file
    finally:
        process.signal_group(child.pid, signal.SIGKILL)
        child.wait()
        os.close(spec)


def test_the_exit_code_is_recorded_and_stdin_is_dev_null(tmp_path: Path, shim: str | None) -> None:
    code = """
import os, pathlib, sys
(pathlib.Path(os.environ["OUT"]) / "stdin").write_text(os.readlink("/proc/self/fd/0"))
sys.exit(7)
"""
    with pod(tmp_path, shim, code) as (child, exit_file):
        assert child.wait(timeout=30) == 7
        assert process.recorded_exit(exit_file) == 7
    assert (tmp_path / "stdin").read_text() == "/dev/null"


SEEN = """
import json, os, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
env = sorted(k for k in os.environ if k.startswith("ARRANGER"))
print(json.dumps({"env": env, "fds": fds}))
"""


def _shim_run(tmp_path: Path, shim: str | None, stop_at_gate: bool = False) -> tuple[int, str, int]:
    """_shim_run: the shim run by hand, as spawn runs it, on a command that prints what it was
    given (its ARRANGER variables and open descriptors), with a gate and the fence's files; the
    shim's exit code, what the command printed, and the gate's descriptor number."""
    gate, held = os.pipe()
    exit_file = tmp_path / "runs" / "pod.0.exit"
    exit_file.parent.mkdir(parents=True, exist_ok=True)
    tools = tools_with(shim)
    ServerContact(tmp_path, 60).set_timeout(60)  # the watch waits a minute: it is stopped first
    values = process._shim_values((), exit_file, files(tmp_path), gate, tools)
    program, args = process.shim_argv(tools, [sys.executable, "-I", "-c", SEEN])
    with open(exit_file, "wb") as exit_fd:
        child = subprocess.Popen(
            args,
            executable=program,
            stdin=exit_fd,
            stdout=subprocess.PIPE,
            pass_fds=(gate,),
            env=launcher.root_env(**values),
            start_new_session=True,
        )
    os.close(gate)
    try:
        if stop_at_gate:
            _wait_blocked(child.pid)
            process.signal_group(child.pid, signal.SIGTERM)
        else:
            os.write(held, b"go\n")
        out, _ = child.communicate(timeout=30)
    finally:
        os.close(held)
        process.signal_group(child.pid, signal.SIGKILL)
    return child.returncode, out.decode(), gate


def test_the_command_gets_none_of_the_shims_values(tmp_path: Path, shim: str | None) -> None:
    code, out, gate = _shim_run(tmp_path, shim)
    assert code == 0, out
    seen = json.loads(out)
    assert seen["env"] == []
    # The compiled shim closes the gate; sh cannot close a descriptor above 9, so under the
    # shell's shim the pod inherits it (the read end of a pipe whose writer is gone).
    given = {0, 1, 2, *([] if shim else [gate])}
    assert given <= set(seen["fds"]) and len(set(seen["fds"]) - given) == 1  # listdir's own
    assert shim is None or gate not in seen["fds"]


def test_a_term_at_the_gate_runs_nothing(tmp_path: Path, shim: str | None) -> None:
    code, out, _ = _shim_run(tmp_path, shim, stop_at_gate=True)
    assert (code, out) == (125, "")


def _wait_blocked(pid: int) -> None:
    """_wait_blocked: the shim is asleep reading a pipe (its gate), within the tests'
    deadline."""
    deadline = time.monotonic() + 30
    while "pipe" not in Path(f"/proc/{pid}/wchan").read_text():
        assert time.monotonic() < deadline, "the shim never waited at its gate"
        time.sleep(0.01)


def test_the_compiled_shim_is_built_where_a_compiler_is_found(shim: str | None) -> None:
    if COMPILER is None:
        pytest.skip("no C compiler: pods start under the shell's shim")
    assert COMPILED_SHIM is not None, "cc is here but shim.c did not build"


def test_a_pod_ended_by_a_signal_is_recorded_as_128_and_its_number(
    tmp_path: Path, shim: str | None
) -> None:
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    with pod(tmp_path, shim, code) as (child, exit_file):
        assert child.wait(timeout=30) == 128 + signal.SIGKILL
        assert process.recorded_exit(exit_file) == 128 + signal.SIGKILL


async def test_a_term_to_the_group_lets_the_pod_end_before_the_shim(
    tmp_path: Path, shim: str | None
) -> None:
    code = """
import os, pathlib, signal, sys
def stop(*_):
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
(pathlib.Path(os.environ["OUT"]) / "ready").touch()
signal.pause()
"""
    with pod(tmp_path, shim, code) as (child, exit_file):
        await eventually((tmp_path / "ready").exists, what="the pod's handler to be set")
        process.signal_group(child.pid, signal.SIGTERM)
        assert child.wait(timeout=30) == 3
        assert process.recorded_exit(exit_file) == 3


def test_a_cgroup_it_cannot_join_runs_nothing(tmp_path: Path, shim: str | None) -> None:
    code = "import os, pathlib\n(pathlib.Path(os.environ['OUT']) / 'ran').touch()\n"
    missing = tmp_path / "no-such-cgroup" / "cgroup.procs"
    with pod(tmp_path, shim, code, cgroup_procs=(missing,)) as (child, exit_file):
        assert child.wait(timeout=30) == 125
        assert process.recorded_exit(exit_file) is None
    assert not (tmp_path / "ran").exists()
