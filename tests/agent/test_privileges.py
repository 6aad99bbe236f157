"""Nothing a job supplies reaches a process that runs as root. A real root agent, fed by a real
server, gets orders past the server's checks whose PATH, LD_PRELOAD, LD_LIBRARY_PATH, BASH_ENV,
ENV, PYTHONPATH and working directory point at a world-writable directory an attacker filled
with a fake setpriv, sh, python3, env and id, a sitecustomize and a preload library, each of
which notes the uid it ran as. Every note is the pods' user's; none is root's; and a
well-formed pod beside them runs to Succeeded."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from arranger.states import PodState
from tests.agent.rootagent import needs_root, order, root_agent, shared_dir

pytestmark = pytest.mark.e2e  # a real server, agents and processes

FAKES = ("setpriv", "sh", "python3", "python", "env", "id", "true", "attack")
PRELOAD_C = """
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void note(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "preload %%d\\n", (int)getuid()); fclose(f); }
}
"""


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


def attacker_dir(top: Path) -> tuple[Path, Path]:
    """attacker_dir: a world-writable directory of traps, and the file they note uids in."""
    evil = top / "evil"
    evil.mkdir()
    evil.chmod(0o777)
    notes = evil / "notes"
    notes.touch()
    notes.chmod(0o666)
    for name in FAKES:
        fake = evil / name
        fake.write_text(f'#!/bin/sh\necho "{name} $(/usr/bin/id -u)" >> {notes}\n')
        fake.chmod(0o777)
    for name in ("sitecustomize.py", "usercustomize.py", "os.py", "json.py"):
        (evil / name).write_text(
            f"import posix\nwith open({str(notes)!r}, 'a') as f: f.write('{name} %d\\n' % posix.getuid())\n"
        )
    (evil / "rc").write_text(f'echo "rc $(/usr/bin/id -u)" >> {notes}\n')
    return evil, notes


def hostile_env(evil: Path) -> dict[str, str]:
    return {
        "PATH": f"{evil}:.",
        "LD_LIBRARY_PATH": str(evil),
        "BASH_ENV": str(evil / "rc"),
        "ENV": str(evil / "rc"),
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "rc"),
        "PYTHONHOME": str(evil),
        "SHELL": str(evil / "sh"),
        "IFS": "/",
    }


def build_preload(evil: Path, notes: Path) -> Path:
    """build_preload: a library whose constructor notes the uid it runs as (skips without cc)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler here to build the preload library")
    source, library = evil / "preload.c", evil / "preload.so"
    source.write_text(PRELOAD_C % notes)
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build a shared library here: {built.stderr.strip()}")
    library.chmod(0o755)
    return library


def assert_never_root(notes: Path, uid: int) -> list[str]:
    lines = notes.read_text().splitlines()
    assert lines, "no trap was taken at all: the test proved nothing"
    assert [line for line in lines if line.split()[-1] != str(uid)] == [], lines
    return lines


@needs_root
async def test_a_hostile_environment_and_working_directory_never_run_as_root() -> None:
    who = nobody()
    with shared_dir() as top:
        evil, notes = attacker_dir(top)
        good = top / "good"
        good.mkdir()
        good.chmod(0o777)
        async with root_agent(top, user="nobody") as node:
            env = hostile_env(evil)
            node.launch(
                # By name, found in the hostile PATH: the attacker's program, as the pods' user.
                order("j1/by-name", ["attack"], env=env),
                # In the attacker's directory, with PATH "." and a relative program.
                order(
                    "j1/in-cwd",
                    ["sh", "-c", "true"],
                    env={**env, "PATH": "."},
                    working_dir=str(evil),
                ),
                order("j1/relative", ["./python3", "-c", "pass"], env=env, working_dir=str(evil)),
                # A real shell and Python that read what the environment names.
                order("j1/shell", ["/bin/sh", "-c", "id -u"], env=env, working_dir=str(evil)),
                # Its shim's command line (anyone may read it) does not carry its environment.
                order(
                    "j1/well-formed",
                    [
                        "/bin/sh",
                        "-c",
                        f"/usr/bin/id -u > {good}/uid; pwd; "
                        "tr '\\0\\n' '  ' < /proc/$PPID/cmdline; echo; echo $SECRET",
                    ],
                    env={"SECRET": "s3cret-value"},
                ),
            )
            for uid in ("j1/by-name", "j1/in-cwd", "j1/relative", "j1/shell"):
                report = await node.ended(uid)
                assert report.state == PodState.SUCCEEDED, (uid, report, node.log(uid))
            report = await node.ended("j1/well-formed")
            assert report.state == PodState.SUCCEEDED, node.log("j1/well-formed")
            scratch = node.agent.supervisor.files.scratch_dir("j1/well-formed")
            cwd, shim, secret = node.log("j1/well-formed").splitlines()
            assert (cwd, secret) == (str(scratch), "s3cret-value")
            assert "arranger-shim" in shim and "s3cret" not in shim, shim
        assert (good / "uid").read_text().strip() == str(who.pw_uid)
        lines = assert_never_root(notes, who.pw_uid)
        taken = {line.split()[0] for line in lines}
        assert {"attack", "sh", "python3", "id"} <= taken, lines


@needs_root
async def test_a_preloaded_library_runs_only_as_the_pods_user() -> None:
    who = nobody()
    with shared_dir() as top:
        evil, notes = attacker_dir(top)
        preload = build_preload(evil, notes)
        async with root_agent(top, user="nobody") as node:
            env = {**hostile_env(evil), "LD_PRELOAD": str(preload)}
            node.launch(order("j2/preload", ["/bin/true"], env=env, working_dir=str(evil)))
            report = await node.ended("j2/preload")
            assert report.state == PodState.SUCCEEDED, node.log("j2/preload")
        lines = assert_never_root(notes, who.pw_uid)
        assert f"preload {who.pw_uid}" in lines, "the pod's own program loads its preload"


@needs_root
async def test_a_program_that_is_not_there_fails_naming_it() -> None:
    nobody()
    with shared_dir() as top:
        evil, notes = attacker_dir(top)
        async with root_agent(top, user="nobody") as node:
            node.launch(
                order("j3/missing", ["no-such-program"], env={"PATH": str(evil)}),
                order("j3/not-runnable", [str(notes)]),
                order("j3/no-dir", ["/bin/true"], working_dir=str(top / "nowhere")),
            )
            missing = await node.ended("j3/missing")
            assert (missing.state, missing.exit_code) == (PodState.FAILED, 127)
            message = (
                "cannot start `no-such-program`: No such file or directory "
                "(not found in the pod's PATH)"
            )
            assert missing.reason == f"CommandNotFound: {message}"
            assert f"arranger: {message}" in node.log("j3/missing")
            denied = await node.ended("j3/not-runnable")
            assert (denied.state, denied.exit_code) == (PodState.FAILED, 126)
            assert (
                denied.reason == f"CommandNotExecutable: cannot start `{notes}`: Permission denied"
            )
            no_dir = await node.ended("j3/no-dir")
            assert (no_dir.state, no_dir.exit_code) == (PodState.FAILED, 127)
            assert "cannot enter working directory" in no_dir.reason
