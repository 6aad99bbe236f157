"""host_paths checks, on the agent, the host paths a container's mounts name, following no
symbolic link.

The server holds a volume's hostPath to `allowedHostPaths` as a string. Podman runs as root
and would follow a symbolic link in it anywhere on the host, and runc would then make, as
root, the mount points and the working directory it does not find there (an empty
/etc/nologin, say). So just before `podman run`, `problems` walks each volume's hostPath one
component at a time from `/` (openat with O_PATH | O_NOFOLLOW), and the pod does not start
where:

- a hostPath is not normalised, or one of its components is a symbolic link or is missing;
- a mountPath is /dev, /proc or /sys, or a directory above one (runc makes its device nodes,
  links and mount points there);
- a mount point (another volume's mountPath, or one podman makes itself, such as
  /etc/hosts) or the working directory lies inside a mount (a volume, or the pod's scratch
  directory) where it does not exist on the host, or is reached through a symbolic link
  there: runc would make it on the host, as root.

A reason names the volume and the rule, never a hostPath: a pod's reason is shown to every
user, and a volume's hostPath only to its job's owner (server.access). The agent logs the
path for the node's admins.

What stays open:
- podman is handed the path, not what the walk opened (runc bind-mounts from inside the
  container's mount namespace, where the kernel refuses another process's /proc/PID/fd/N as
  a source: measured with podman 4.3 and runc), so the walk is done as late as can be, just
  before `podman run`. Whoever may write a directory along a hostPath could still swap a component for a
  link in between (an image pull lies there too), and only they: the window is open where
  users may write inside an allowed path.
- Links inside a mounted volume, or in the image, are resolved by runc within the
  container's own root, so what runc makes through them stays inside the container's files
  and its volumes' directories, never elsewhere on the host.
- An agent given its own `allowedHostPaths` checks each hostPath's prefix again (a server,
  or an admin's token, then cannot mount more on this node than its config allows); one
  without takes the server's check. It does not read an image's own WORKDIR, which a volume
  might hold.
- A plain process's pod mounts nothing, and enters its working directory as its own user
  (see launcher): nothing there is made as root.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

SYSTEM_DIRS = ("/dev", "/proc", "/sys")  # the container runtime's own; no volume goes there

SYMLINK = "goes through a symbolic link, which the agent does not follow"
MISSING = "does not exist on this node"
NOT_NORMALISED = "must be a normalised absolute path (no '.', '..', '//' or trailing '/')"
ON_SYSTEM_DIR = "may not be /dev, /proc or /sys, nor a directory above one"
MADE_AS_ROOT = "the container runtime would create it there, on the host, as root"
NOT_ALLOWED = "is not under a prefix of this node's allowedHostPaths"


class _Refused(Exception):
    """_Refused: why a walk stopped (SYMLINK, MISSING, or what the kernel said)."""


@dataclass(frozen=True)
class Mount:
    """Mount: one directory or file a container mounts: `name` as a reason calls it ("volume
    data"), `host_path` where it lies on the host, `mount_path` where the container sees it.
    A `trusted` host path is the agent's own (the scratch directory) and is opened as it is;
    any other is walked without following a link."""

    name: str
    host_path: str
    mount_path: str
    trusted: bool = False


def problems(
    mounts: Sequence[Mount],
    workdir: str | None,
    made: Sequence[str] = (),
    allowed: Sequence[str] | None = None,
) -> list[str]:
    """problems: why the container may not start with these mounts, `workdir` (None: the
    image's own) and the mount points `made` that podman adds itself; empty: it may. Each
    reason names what it is about ("volume data: hostPath ..."). With `allowed` (the agent's
    own allowedHostPaths), a hostPath must also lie under one of those prefixes."""
    found = []
    for mount in mounts:
        if mount.trusted:
            continue
        why = _host_path_problem(mount.host_path)
        if not why and allowed is not None and not any(_under(mount.host_path, a) for a in allowed):
            why = NOT_ALLOWED
        if why:
            found.append(f"{mount.name}: hostPath {why}")
        if any(_under(system, _clean(mount.mount_path)) for system in SYSTEM_DIRS):
            found.append(f"{mount.name}: mountPath {ON_SYSTEM_DIR}")
    if found:
        return found
    targets: list[tuple[str, str, Mount | None]] = [
        (f"{m.name}: mountPath", m.mount_path, m) for m in mounts
    ]
    targets += [(f"podman's mount point {path}", path, None) for path in made]
    if workdir:
        targets.append(("workingDir", workdir, None))
    for what, path, own in targets:
        outer = _enclosing(mounts, path, own)
        if outer is None:
            continue  # in the image's own files: made in the container's layer, if at all
        why = _inside_problem(outer, path)
        if why == MISSING:
            found.append(f"{what} lies in {outer.name}, where it {why}: {MADE_AS_ROOT}")
        elif why:
            found.append(f"{what} lies in {outer.name}, where it {why}")
    return found


def _host_path_problem(host_path: str) -> str:
    """_host_path_problem: why `host_path` cannot be mounted ("": it can)."""
    if not host_path.startswith("/") or posixpath.normpath(host_path) != host_path:
        return NOT_NORMALISED
    if host_path.startswith("//"):
        return NOT_NORMALISED
    try:
        with _root_of(Mount("", host_path, "")):
            return ""
    except _Refused as refused:
        return str(refused)


def _enclosing(mounts: Sequence[Mount], path: str, own: Mount | None) -> Mount | None:
    """_enclosing: the deepest mount other than `own` whose mountPath holds `path` (the path
    itself, for a working directory: it is there as soon as it is mounted)."""
    path = _clean(path)
    best: Mount | None = None
    for mount in mounts:
        top = _clean(mount.mount_path)
        if mount is own or not _under(path, top):
            continue
        if own is not None and path == top:
            continue  # two mounts on one place: podman refuses that itself
        if best is None or len(top) > len(_clean(best.mount_path)):
            best = mount
    return best


def _inside_problem(outer: Mount, path: str) -> str:
    """_inside_problem: why `path`, inside mount `outer`, is not there on the host ("": it
    is, reached without a link)."""
    rest = posixpath.relpath(_clean(path), _clean(outer.mount_path))
    parts = [] if rest == "." else rest.split("/")
    try:
        with _root_of(outer) as fd:
            os.close(_walk(fd, parts))
    except _Refused as refused:
        return str(refused)
    return ""


@contextlib.contextmanager
def _root_of(mount: Mount) -> Iterator[int]:
    """_root_of: an O_PATH descriptor of the mount's host path, closed after: walked from `/`
    without links, or opened as it is where the path is the agent's own."""
    if mount.trusted:
        try:
            fd = os.open(mount.host_path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise _Refused(f"cannot be opened ({exc.strerror})") from None
    else:
        top = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = _walk(top, mount.host_path.split("/")[1:])
        finally:
            os.close(top)
    try:
        yield fd
    finally:
        os.close(fd)


def _walk(start: int, parts: Sequence[str]) -> int:
    """_walk: a new O_PATH descriptor of `parts` below directory `start` (which stays open),
    opened one component at a time, none of them a link (an O_NOFOLLOW open of a link opens
    the link itself, which fstat tells); the caller closes it. Raises _Refused at a link, or
    at a component that is missing or cannot be opened."""
    fd = os.dup(start)
    for part in parts:
        try:
            below = os.open(part, _OPEN, dir_fd=fd)
        except OSError as exc:
            missing = isinstance(exc, (FileNotFoundError, NotADirectoryError))
            raise _Refused(MISSING if missing else f"cannot be opened ({exc.strerror})") from None
        finally:
            os.close(fd)
        fd = below
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            raise _Refused(SYMLINK)
    return fd


def _clean(container_path: str) -> str:
    """_clean: a path in the container as the container runtime reads it: `//dev/` is /dev."""
    return "/" + posixpath.normpath(container_path).lstrip("/")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
