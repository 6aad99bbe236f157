"""launcher starts a pod's program so that nothing a job supplies reaches a process running as root.

What runs as root to start a pod (the shim, its cgroup joining, setpriv) is called by absolute
path, found once when the agent starts (`Tools`), and gets an environment the agent builds from
nothing (`root_env`). The pod's argv, environment and working directory do not travel on any
command line (every user of the node can read /proc/*/cmdline) nor in an environment: they are
written to a memfd the agent hands down, and read by `LAUNCHER`, a small Python program that
already runs as the pod's user (setpriv switched to it). The launcher enters the working
directory, looks the program up in the pod's own PATH and execs it in the pod's environment.

When it cannot, the launcher writes why to the pod's log and, over the spec, to the memfd
(`failure` reads it back), and exits 127 (the program or directory does not exist) or 126
(it cannot be run): the pod fails with a reason that names the program.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
# Interpreters the launcher may run in when the agent's own cannot be run by other users (one
# under /root, say). The launcher needs nothing but the posix and sys modules.
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
_SPEC, _FAILED = b"spec", b"fail"

# `python -I -S -c LAUNCHER FD`: isolated (no PYTHON* variables, no user site, no current
# directory on sys.path), without site, so that nothing of the pod's environment or files is
# read before the pod's program runs. The memfd is closed on exec; on a failure the launcher
# overwrites it with "fail\0CODE\0REASON" for the agent. It uses the built-in `posix` module,
# not `os`, whose import (os, stat, posixpath, _collections_abc) would cost every pod a few
# milliseconds of CPU more than the rest of the launcher; `run` looks the program up in the
# pod's PATH as os.execvpe does (PATH unset: /bin:/usr/bin; the first error other than "not
# there" wins).
LAUNCHER = r"""
import posix, sys
fd = int(sys.argv[1])
posix.set_inheritable(fd, False)
parts = posix.pread(fd, posix.fstat(fd).st_size, 0).split(b"\0")
cwd, count = parts[1], int(parts[2])
argv = parts[3:3 + count] or [b""]
env = dict(item.split(b"=", 1) for item in parts[3 + count:])
def fail(code, reason):
    posix.ftruncate(fd, 0)
    posix.pwrite(fd, b"fail\0%d\0" % code + reason.encode(errors="replace"), 0)
    line = "arranger: cannot start %r: %s\n" % ([argv[0].decode(errors="replace")], reason)
    posix.write(2, line.encode(errors="replace"))
    posix._exit(code)
def code(exc):
    return 127 if isinstance(exc, (FileNotFoundError, NotADirectoryError)) else 126
def run(file):
    if b"/" in file:
        posix.execve(file, argv, env)
    saved = last = None
    for directory in env.get(b"PATH", b"/bin:/usr/bin").split(b":"):
        try:
            posix.execve(directory.rstrip(b"/") + b"/" + file if directory else file, argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            saved = saved or exc
    raise saved or last
try:
    posix.chdir(cwd)
except OSError as exc:
    fail(code(exc), "cannot enter working directory %s: %s" % (cwd.decode(errors="replace"), exc.strerror))
try:
    run(argv[0])
except OSError as exc:
    fail(code(exc), "%s: %s" % (exc.strerror, argv[0].decode(errors="replace")))
"""


class LaunchError(ValueError):
    """LaunchError: what the agent cannot hand to a launcher (a NUL byte in a value)."""


@dataclass(frozen=True)
class Tools:
    """Tools: the programs that start pods, by absolute path. `setpriv` is None where it is not
    installed (then pods can run only as the agent's own user); `python` runs the launcher."""

    setpriv: str | None
    python: str
    shell: str = SHELL


def find_tools(switching: bool) -> Tools:
    """find_tools: setpriv and an interpreter for the launcher. With `switching` (pods may run
    as users other than the agent's) the interpreter must be one they can run, root's own and
    writable by root only; raises LaunchError when there is none."""
    setpriv = which("setpriv")
    if not switching:
        return Tools(setpriv, sys.executable)
    for candidate in (sys.executable, *SYSTEM_PYTHONS):
        if _shared_program(candidate):
            return Tools(setpriv, os.path.realpath(candidate))
    raise LaunchError(
        f"no Python that pods' users may run (tried {sys.executable}, "
        f"{', '.join(SYSTEM_PYTHONS)}): install python3 where every user can run it"
    )


def which(name: str) -> str | None:
    """_which: `name` in the root PATH (never the agent's own PATH, whoever set it)."""
    for directory in ROOT_PATH.split(":"):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _shared_program(path: str) -> bool:
    """_shared_program: whether every user may run `path` and only root could change it (the
    file and each directory above it are root's and not writable by group or others)."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        for part in (real, *real.parents):
            st = part.stat()
            if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return False
            if part != real and not st.st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


def root_env(**agent_values: str) -> dict[str, str]:
    """root_env: the whole environment of a process the agent runs as root: a fixed PATH and
    only the values the agent itself gives."""
    return {"PATH": ROOT_PATH, **agent_values}


def encode(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> bytes:
    """encode: the spec the launcher reads. Raises LaunchError for what execve cannot carry."""
    for what, value in [("argv", a) for a in argv] + [("env", f"{k}={v}") for k, v in env.items()]:
        if "\0" in value:
            raise LaunchError(f"{what} holds a NUL byte: {value.split(chr(0))[0]!r}...")
    for key in env:
        if not key or "=" in key:
            raise LaunchError(f"env: {key!r} is not a variable name")
    if "\0" in str(cwd):
        raise LaunchError("workingDir holds a NUL byte")
    fields = [_SPEC, os.fsencode(cwd), str(len(argv)).encode()]
    fields += [a.encode(errors="surrogateescape") for a in argv]
    fields += [f"{k}={v}".encode(errors="surrogateescape") for k, v in env.items()]
    return b"\0".join(fields)


def spec_fd(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    """spec_fd: a memfd (close-on-exec) holding the launch spec; the caller closes it."""
    data = encode(argv, env, cwd)
    fd = os.memfd_create("arranger-pod", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def command(tools: Tools, fd: int, uid: int | None = None, gid: int = 0,
            groups: Sequence[int] = ()) -> list[str]:  # fmt: skip
    """command: how the shim runs the launcher on spec `fd`: through setpriv, as `uid` with
    `gid` and `groups` and no way to gain privileges, when uid is given."""
    launch = [tools.python, "-I", "-S", "-c", LAUNCHER, str(fd)]
    if uid is None:
        return launch
    if tools.setpriv is None:
        raise LaunchError("running pods as another user needs setpriv (util-linux)")
    group_flag = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return [tools.setpriv, f"--reuid={uid}", f"--regid={gid}", group_flag, "--no-new-privs",
            "--", *launch]  # fmt: skip


def failure(fd: int) -> tuple[int, str] | None:
    """failure: the exit code and reason a launcher left in spec `fd`, None if it exec'd."""
    try:
        head = os.pread(fd, 64 * 1024, 0)
    except OSError:
        return None
    tag, _, rest = head.partition(b"\0")
    if tag != _FAILED:
        return None
    code, _, reason = rest.partition(b"\0")
    try:
        return int(code), reason.decode(errors="replace")
    except ValueError:
        return None
