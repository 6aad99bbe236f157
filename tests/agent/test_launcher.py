"""The compiled launcher (launch.c) and the Python one (LAUNCHER) do the same with the same spec:
the same program in the same directory with the same environment, or the same exit code,
failure record and log line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from arranger.agent import launcher

COMPILED = launcher.compiled()
pytestmark = pytest.mark.skipif(COMPILED is None, reason="no C compiler (cc or gcc) on the PATH")


def launch(
    program: list[str], argv: list[str], env: Mapping[str, str], cwd: Path
) -> tuple[int, str, tuple[int, str] | None]:
    """launch: exit code, output and failure record of one launcher on one spec."""
    fd = launcher.spec_fd(argv, env, cwd)
    try:
        done = subprocess.run(
            [*program, str(fd)], check=False, pass_fds=(fd,), capture_output=True, timeout=30,
            env={}, cwd="/",
        )  # fmt: skip
        output = (done.stdout + done.stderr).decode(errors="replace")
        return done.returncode, output, launcher.failure(fd)
    finally:
        os.close(fd)


def both(argv: list[str], env: Mapping[str, str], cwd: Path) -> tuple[int, str, object]:
    assert COMPILED is not None
    python = launch([sys.executable, "-I", "-S", "-c", launcher.LAUNCHER], argv, env, cwd)
    compiled = launch([COMPILED], argv, env, cwd)
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
    code, out, failed = both(["no-such-tool"], {"PATH": f"{place}/bin"}, place)
    assert code == 127
    assert failed == (127, "No such file or directory: no-such-tool")
    assert (
        out == "arranger: cannot start ['no-such-tool']: No such file or directory: no-such-tool\n"
    )
    code, _, failed = both(["tool"], {"PATH": f"{place}/locked:/nowhere"}, place)
    assert (code, failed) == (126, (126, "Permission denied: tool"))
    code, _, failed = both(["tool"], {"PATH": f"{place}/bin"}, place / "gone")
    assert code == 127 and failed is not None
    assert failed[1] == f"cannot enter working directory {place}/gone: No such file or directory"
    code, _, failed = both([str(place / "locked" / "tool")], {}, place)
    assert (code, failed) == (126, (126, f"Permission denied: {place}/locked/tool"))
