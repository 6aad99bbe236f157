"""launcher starts a pod's program so that nothing a job supplies reaches a process running as root.

What runs as root to start a pod (the shim, its cgroup joining, setpriv) is called by absolute
path, found once when the agent starts (`Tools`), and gets an environment the agent builds from
nothing (`root_env`). The pod's argv, environment and working directory do not travel on any
command line (every user of the node can read /proc/*/cmdline) nor in an environment: they are
written to a memfd the agent hands down, and read by `LAUNCHER`, a small Python program that
already runs as the pod's user (setpriv switched to it). The launcher sets the pod's
RLIMIT_NPROC (soft and hard: the pod cannot raise it again), enters the working directory,
looks the program up in the pod's own PATH and execs it in the pod's environment.
Where a C compiler is found, the agent builds the same launcher from `launch.c` once per
machine and source (`compiled`): a pod then starts without a Python interpreter's start-up.

When it cannot, the launcher writes why to the pod's log ("arranger: cannot start `python4`:
No such file or directory (not found in the pod's PATH)") and, over the spec, to the memfd (`failure`
reads it back), and exits 127 (the program or directory does not exist) or 126 (it cannot be
run): the pod fails with a reason that names the program and starts with its kind,
CommandNotFound or CommandNotExecutable (a program that can never start; see
arranger.states.CANNOT_START), or StartError (a working directory it cannot enter, or another
error of exec).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
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
# overwrites it with "fail\0CODE\0KIND: MESSAGE" for the agent and writes "arranger: MESSAGE"
# to the pod's log, byte for byte as launch.c does (KIND: see `kind`; MESSAGE: at most 4000
# bytes). It uses the built-in `posix` module, not `os`, whose import (os, stat, posixpath,
# _collections_abc) would cost every pod a few milliseconds of CPU more than the rest of the
# launcher; `run` looks the program up in the pod's PATH as os.execvpe does (PATH unset:
# /bin:/usr/bin; the first error other than "not there" wins).
LAUNCHER = r"""
import posix, sys
fd = int(sys.argv[1])
posix.set_inheritable(fd, False)
parts = posix.pread(fd, posix.fstat(fd).st_size, 0).split(b"\0")
cwd, nproc, count = parts[1], int(parts[2]), int(parts[3])
argv = parts[4:4 + count] or [b""]
env = dict(item.split(b"=", 1) for item in parts[4 + count:])
path = env.get(b"PATH", b"/bin:/usr/bin")
def quoted(name):
    return b"".join(b"\\%c" % c if c in b"\\`" else b"%c" % c if 32 <= c < 127 else b"\\x%02x" % c
                    for c in name)
def fail(code, kind, why):
    message = (b"cannot start `%s`: %s" % (quoted(argv[0]), why))[:4000]
    posix.ftruncate(fd, 0)
    posix.pwrite(fd, b"fail\0%d\0%s: %s" % (code, kind, message), 0)
    posix.write(2, b"arranger: %s\n" % message)
    posix._exit(code)
def missing(exc):
    return isinstance(exc, (FileNotFoundError, NotADirectoryError))
def kind(exc):
    if missing(exc):
        return b"CommandNotFound"
    if isinstance(exc, PermissionError) or exc.errno == 8:  # EACCES, EPERM; ENOEXEC
        return b"CommandNotExecutable"
    return b"StartError"
def run(file):
    if b"/" in file:
        try:
            posix.execve(file, argv, env)
        except OSError as exc:
            return exc, None
    saved = last = None
    for directory in path.split(b":"):
        candidate = directory.rstrip(b"/") + b"/" + file if directory else file
        try:
            posix.execve(candidate, argv, env)
        except OSError as exc:
            last = exc
            if not missing(exc) and saved is None:
                saved = exc, candidate
    return saved or (last, None)
if nproc:
    import resource
    try:
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = nproc if hard == resource.RLIM_INFINITY else min(nproc, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    except OSError as exc:
        fail(126, b"StartError", b"cannot set RLIMIT_NPROC: %s" % exc.strerror.encode())
try:
    posix.chdir(cwd)
except OSError as exc:
    why = b"cannot enter working directory %s: %s" % (cwd, exc.strerror.encode())
    fail(127 if missing(exc) else 126, b"StartError", why)
exc, where = run(argv[0])
why = exc.strerror.encode()
if where is not None:
    why += b" (%s)" % where
elif b"/" not in argv[0]:
    why += b" (not found in the pod's PATH)"  # its value is the job's, hidden from others
fail(127 if missing(exc) else 126, kind(exc), why)
"""


class LaunchError(ValueError):
    """LaunchError: what the agent cannot hand to a launcher (a NUL byte in a value)."""


@dataclass(frozen=True)
class Tools:
    """Tools: the programs that start pods, by absolute path. `setpriv` is None where it is not
    installed (then pods can run only as the agent's own user); `launch` is the compiled
    launcher, and where it is None `python` runs LAUNCHER; `shim` is the compiled shim (see
    shim.c), and where it is None `shell` runs process.SHIM."""

    setpriv: str | None
    python: str
    shell: str = SHELL
    launch: str | None = None
    shim: str | None = None


def find_tools(switching: bool, compile_launcher: bool = True) -> Tools:
    """find_tools: setpriv, the compiled launcher where one can be built, and an interpreter
    for the Python one. With `switching` (pods may run as users other than the agent's) both
    must be programs they can run, root's own and writable by root only; raises LaunchError
    when there is no such interpreter."""
    setpriv = which("setpriv")
    launch = compiled(LAUNCH_SOURCE) if compile_launcher else None
    shim = compiled(SHIM_SOURCE) if compile_launcher else None  # runs as the agent's user
    if not switching:
        return Tools(setpriv, sys.executable, launch=launch, shim=shim)
    if launch is not None and not _shared_program(launch):
        launch = None
    for candidate in (sys.executable, *SYSTEM_PYTHONS):
        if _shared_program(candidate):
            return Tools(setpriv, os.path.realpath(candidate), launch=launch, shim=shim)
    raise LaunchError(
        f"no Python that pods' users may run (tried {sys.executable}, "
        f"{', '.join(SYSTEM_PYTHONS)}): install python3 where every user can run it"
    )


LAUNCH_SOURCE = Path(__file__).with_name("launch.c")
SHIM_SOURCE = Path(__file__).with_name("shim.c")


def compiled(source_file: Path, cache: Path | None = None) -> str | None:
    """compiled: the program built from `source_file` (launch.c, shim.c) with the machine's C
    compiler, kept in `cache` (default: /run/arranger for root, else ~/.cache/arranger) under
    a name that carries the source's hash, so it is built once per machine and source; None
    where there is no compiler, the cache is not the agent's own, or the build fails (the
    Python launcher, or the shell's shim, is used).

    A kept program is reused only as the agent built it: beside it lies the SHA-256 of what
    was built (`<name>.sha256`), and both must be the agent's own regular files that no one
    else may write, in a directory only the agent and root may write, and the program must
    hash to the record. Anything else of that name (an empty file planted for the next
    release's source, one cut short) is built again, and the program and its record each
    put in place whole (written aside, then renamed)."""
    compiler = which("cc") or which("gcc")
    if compiler is None:
        return None
    building = noting = None
    try:
        source = source_file.read_bytes()
        where = cache or _cache_dir()
        where.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not _only_ours_to_write(where):
            return None  # someone else's, or others may write there
        digest = hashlib.sha256(source).hexdigest()[:16]
        path = where / f"{source_file.stem}-{digest}"
        record = where / f"{path.name}.sha256"
        if _as_built(path, record):
            return str(path)
        building = where / f".{path.name}.{os.getpid()}"
        noting = where / f".{record.name}.{os.getpid()}"
        subprocess.run(
            [compiler, "-O2", "-std=gnu11", "-o", str(building), str(source_file)],
            env=root_env(),
            cwd=where,
            capture_output=True,
            timeout=120,
            check=True,
        )
        building.chmod(PROGRAM_MODE)
        built = hashlib.sha256(building.read_bytes()).hexdigest()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(noting, flags, 0o644), "w") as f:
            f.write(f"{built}\n")
        # Agents building at once each put a whole file there; a record that ends up beside
        # another agent's program only costs the next start a build.
        building.replace(path)
        noting.replace(record)
        return str(path)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        for left in (building, noting):
            if left is not None:
                with contextlib.suppress(OSError):
                    left.unlink(missing_ok=True)


PROGRAM_MODE = 0o755  # a compiled program's mode, as built and as reused


def _as_built(path: Path, record: Path) -> bool:
    """_as_built: whether `path` is the program the agent built there: it hashes to the
    SHA-256 in `record`, and each is a regular file of the agent's own that no one else may
    write (the program with exactly PROGRAM_MODE)."""
    try:
        noted = _own_file(record).decode("ascii").strip()
        program = _own_file(path, PROGRAM_MODE)
    except (OSError, UnicodeDecodeError):
        return False
    return len(noted) == 64 and hashlib.sha256(program).hexdigest() == noted


def _own_file(path: Path, mode: int | None = None) -> bytes:
    """_own_file: the content of `path`, a regular file (never through a link) of the agent's
    own user that group and others may not write, and of exactly `mode` where given; raises
    OSError where it is not."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        bits = stat.S_IMODE(st.st_mode)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or bits & (stat.S_IWGRP | stat.S_IWOTH)
            or (mode is not None and bits != mode)
        ):
            raise OSError(f"{path} is not the agent's own file as it wrote it")
        return f.read()


def _only_ours_to_write(where: Path) -> bool:
    """_only_ours_to_write: whether the directory `where` (not a link) is the agent's own
    user's and no one else may write it, nor any directory above it but root and the agent
    (a sticky one, such as /tmp, where others may not rename what is not theirs, aside)."""
    st = where.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return False
    for above in Path(os.path.realpath(where)).parents:
        st = above.stat()
        if st.st_uid not in (0, os.geteuid()):
            return False
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return False
    return True


def _cache_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/arranger")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "arranger"


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


def encode(argv: Sequence[str], env: Mapping[str, str], cwd: Path, nproc: int = 0) -> bytes:
    """encode: the spec the launcher reads ("spec", the working directory, the pod's
    RLIMIT_NPROC (0: as inherited), the count of argv, argv, then the environment, each
    ended by a NUL). Raises LaunchError for what execve cannot carry."""
    for what, value in [("argv", a) for a in argv] + [("env", f"{k}={v}") for k, v in env.items()]:
        if "\0" in value:
            raise LaunchError(f"{what} holds a NUL byte: {value.split(chr(0))[0]!r}...")
    for key in env:
        if not key or "=" in key:
            raise LaunchError(f"env: {key!r} is not a variable name")
    if "\0" in str(cwd):
        raise LaunchError("workingDir holds a NUL byte")
    fields = [_SPEC, os.fsencode(cwd), str(nproc).encode(), str(len(argv)).encode()]
    fields += [a.encode(errors="surrogateescape") for a in argv]
    fields += [f"{k}={v}".encode(errors="surrogateescape") for k, v in env.items()]
    return b"\0".join(fields)


def spec_fd(argv: Sequence[str], env: Mapping[str, str], cwd: Path, nproc: int = 0) -> int:
    """spec_fd: a memfd (close-on-exec) holding the launch spec; the caller closes it."""
    data = encode(argv, env, cwd, nproc)
    fd = os.memfd_create("arranger-pod", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def command(
    tools: Tools, fd: int, uid: int | None = None, gid: int = 0, groups: Sequence[int] = ()
) -> list[str]:
    """command: how the shim runs the launcher on spec `fd`: through setpriv, as `uid` with
    `gid` and `groups` and no way to gain privileges, when uid is given."""
    if tools.launch is not None:
        launch = [tools.launch, str(fd)]
    else:
        launch = [tools.python, "-I", "-S", "-c", LAUNCHER, str(fd)]
    if uid is None:
        return launch
    if tools.setpriv is None:
        raise LaunchError("running pods as another user needs setpriv (util-linux)")
    group_flag = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return [
        tools.setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        group_flag,
        "--no-new-privs",
        "--",
        *launch,
    ]


def failure(fd: int) -> tuple[int, str] | None:
    """failure: the exit code and reason ("KIND: cannot start ...") a launcher left in spec
    `fd`, None if it exec'd."""
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
