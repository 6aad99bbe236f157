"""The compiled launcher (launch.c) and the Python one (LAUNCHER) do the same with the same spec:
the same program in the same directory with the same environment, or the same exit code,
failure record and log line."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from arranger.agent import launcher
from arranger.states import COMMAND_NOT_EXECUTABLE, COMMAND_NOT_FOUND

COMPILED = launcher.compiled(launcher.LAUNCH_SOURCE)
pytestmark = pytest.mark.skipif(COMPILED is None, reason="no C compiler (cc or gcc) on the PATH")


def launch(
    program: list[str], argv: list[str], env: Mapping[str, str], cwd: Path, nproc: int = 0
) -> tuple[int, str, tuple[int, str] | None]:
    """launch: exit code, output and failure record of one launcher on one spec."""
    fd = launcher.spec_fd(argv, env, cwd, nproc)
    try:
        done = subprocess.run(
            [*program, str(fd)],
            check=False,
            pass_fds=(fd,),
            capture_output=True,
            timeout=30,
            env={},
            cwd="/",
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        return done.returncode, output, launcher.failure(fd)
    finally:
        os.close(fd)


def both(
    argv: list[str], env: Mapping[str, str], cwd: Path, nproc: int = 0
) -> tuple[int, str, object]:
    assert COMPILED is not None
    python = launch([sys.executable, "-I", "-S", "-c", launcher.LAUNCHER], argv, env, cwd, nproc)
    compiled = launch([COMPILED], argv, env, cwd, nproc)
    assert compiled == python, (argv, env)
    return compiled


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    (tmp_path / "locked").mkdir()
    tool = tmp_path / "bin" / "tool"
    tool.write_text('#!/bin/sh\necho "tool $0 $* in $(pwd) with $GREETING"\n')
    tool.chmod(0o755)
    (tmp_path / "locked" / "tool").write_text("#!/bin/sh\necho never\n")  # not executable
    return tmp_path


def test_the_program_runs_as_the_spec_says(place: Path) -> None:
    env = {"PATH": f"{place}/locked:/nowhere:{place}/bin/", "GREETING": "hello world"}
    code, out, failed = both(["tool", "a b", "c"], env, place)
    assert (code, failed) == (0, None)
    # A program that cannot be run is passed over for one later in PATH, as execvpe does.
    assert out == f"tool {place}/bin/tool a b c in {place} with hello world\n"
    code, out, _ = both([str(place / "bin" / "tool")], {"GREETING": "x"}, place / "bin")
    assert (code, out) == (0, f"tool {place}/bin/tool  in {place}/bin with x\n")
    code, out, _ = both(["sh", "-c", 'echo "$# $GREETING."'], {}, place)  # in /bin:/usr/bin
    assert (code, out) == (0, "0 .\n")
    code, out, _ = both(["bin/tool"], {"PATH": ""}, place)  # an empty entry: the file itself
    assert (code, out) == (0, f"tool bin/tool  in {place} with \n")


def test_what_cannot_start_fails_alike(place: Path) -> None:
    path = f"{place}/bin:/nowhere"
    code, out, failed = both(["no-such-tool", "x"], {"PATH": path}, place)
    message = "cannot start `no-such-tool`: No such file or directory (not found in the pod's PATH)"
    assert (code, failed) == (127, (127, f"{COMMAND_NOT_FOUND}: {message}"))
    assert out == f"arranger: {message}\n"
    code, _, failed = both(["tool"], {}, place)  # PATH unset: /bin:/usr/bin
    assert failed == (
        127,
        f"{COMMAND_NOT_FOUND}: cannot start `tool`: No such file or "
        "directory (not found in the pod's PATH)",
    )
    # Found but not runnable (and nothing runnable later): that candidate is named.
    code, out, failed = both(["tool"], {"PATH": f"/nowhere:{place}/locked:/nowhere"}, place)
    message = f"cannot start `tool`: Permission denied ({place}/locked/tool)"
    assert (code, failed) == (126, (126, f"{COMMAND_NOT_EXECUTABLE}: {message}"))
    code, _, failed = both([str(place / "locked" / "tool")], {}, place)
    message = f"cannot start `{place}/locked/tool`: Permission denied"
    assert (code, failed) == (126, (126, f"{COMMAND_NOT_EXECUTABLE}: {message}"))
    code, _, failed = both([str(place / "bin" / "gone")], {}, place)
    message = f"cannot start `{place}/bin/gone`: No such file or directory"
    assert (code, failed) == (127, (127, f"{COMMAND_NOT_FOUND}: {message}"))
    code, _, failed = both(["tool"], {"PATH": f"{place}/bin"}, place / "gone")
    message = (
        f"cannot start `tool`: cannot enter working directory {place}/gone: "
        "No such file or directory"
    )
    assert (code, failed) == (127, (127, f"StartError: {message}"))


def test_a_file_the_kernel_cannot_run_is_not_executable(place: Path) -> None:
    junk = place / "bin" / "junk"
    junk.write_bytes(b"\x7fELF not really\n")  # executable, but no format the kernel knows
    junk.chmod(0o755)
    code, out, failed = both(["junk"], {"PATH": f"{place}/bin"}, place)
    message = f"cannot start `junk`: Exec format error ({junk})"
    assert (code, failed) == (126, (126, f"{COMMAND_NOT_EXECUTABLE}: {message}"))
    assert out == f"arranger: {message}\n"


def test_names_are_quoted_and_messages_bounded_alike(place: Path) -> None:
    code, out, failed = both(["t\u00e9`a\\b\tc"], {"PATH": "/nowhere"}, place)
    assert out.startswith("arranger: cannot start `t\\xc3\\xa9\\`a\\\\b\\x09c`: ")
    long_dir = place.joinpath(*(f"nowhere-{i:04d}" for i in range(600)))  # 8 KB: ENAMETOOLONG
    code, out, failed = both(["no-such-tool"], {"PATH": "/nowhere"}, long_dir)
    assert code == 126 and failed is not None
    assert len(failed[1].encode()) == len("StartError: ") + 4000
    assert out == f"arranger: {failed[1].partition(': ')[2]}\n"
    code, _, failed = both(["x" * 20000], {"PATH": "/nowhere"}, place)  # ENAMETOOLONG
    assert failed is not None and failed[1].startswith("StartError: cannot start `xxx")
    assert len(failed[1].partition(": ")[2]) == 4000


def test_both_set_the_pod_s_process_limit_for_good(place: Path) -> None:
    """RLIMIT_NPROC is set, soft and hard, so the pod cannot raise it; never above the hard
    limit the launcher had; 0 leaves it as inherited."""
    show = (
        "import resource\n"
        "print(*resource.getrlimit(resource.RLIMIT_NPROC))\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_NPROC, (500, 501))\n"
        "except (ValueError, OSError) as exc:\n"
        "    print('raise refused')\n"
    )
    argv = [sys.executable, "-c", show]
    code, out, failed = both(argv, {}, place, 500)
    if os.geteuid() == 0:  # root may raise its own limits: only the value is checked
        assert out.splitlines()[0] == "500 500"
    else:
        assert (code, failed, out) == (0, None, "500 500\nraise refused\n")
    inherited = resource.getrlimit(resource.RLIMIT_NPROC)
    code, out, failed = both(argv, {}, place, 0)
    assert out.splitlines()[0] == " ".join(map(str, inherited))
