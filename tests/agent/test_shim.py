"""The shim a pod runs under, both kinds (the shell's and the compiled one): it records the
pod's exit code where the agent reads it (128 + N for signal N), outlives a TERM sent to the
group until the pod has ended, runs nothing when it cannot join the pod's cgroup, and gives the
pod /dev/null for stdin and none of its own variables. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from arranger.agent import process
from tests.agent.shims import SHIMS, tools_with
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
        script(tmp_path, "program", code), {"PATH": os.defpath, "OUT": str(tmp_path)},
        tmp_path, tmp_path / "pod.log", exit_file, tools_with(shim), cgroup_procs=cgroup_procs,
    )  # fmt: skip
    try:
        yield child, exit_file
    finally:
        process.signal_group(child.pid, signal.SIGKILL)
        child.wait()
        os.close(spec)


def test_the_exit_code_is_recorded_and_the_pod_sees_none_of_the_shims_values(
    tmp_path: Path, shim: str | None
) -> None:
    code = """
import os, pathlib, sys
out = pathlib.Path(os.environ["OUT"])
(out / "stdin").write_text(os.readlink("/proc/self/fd/0"))
(out / "env").write_text(" ".join(sorted(k for k in os.environ if k.startswith("ARRANGER"))))
sys.exit(7)
"""
    with pod(tmp_path, shim, code) as (child, exit_file):
        assert child.wait(timeout=30) == 7
        assert process.recorded_exit(exit_file) == 7
    assert (tmp_path / "stdin").read_text() == "/dev/null"
    assert (tmp_path / "env").read_text() == ""


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
