"""logins: the token a client presents when it is given none, and where `arranger dev` leaves
its owner's.

A client's token is, first found: the one it is given (the SDK's `token`), $ARRANGER_TOKEN,
the file $ARRANGER_TOKEN_FILE names (`--token-file`), and, for a server reached without TLS,
the login `arranger dev` wrote for that address. A dev cluster's login is a 0600 file named
after the address in the owner's state directory (`$XDG_STATE_HOME/arranger/logins`, in a
0700 directory): every command its owner runs finds it, and no other account can read it.
A login file that another account owns, or that others may read, is not used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from arranger.client.errors import UserFacingError

MAX_TOKEN_FILE_BYTES = 4096


class TokenFileError(UserFacingError):
    """TokenFileError: a token file that cannot be used; the message names it and why."""


def state_dir() -> Path:
    """state_dir: this user's state directory for arranger ($XDG_STATE_HOME/arranger)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "arranger"


def _login_path(address: str) -> Path:
    """_login_path: the login file of exactly `address` (no other name of the host: a name
    may lead elsewhere, as `localhost` to ::1, where another account may listen)."""
    host, _, port = address.strip().rpartition(":")
    return state_dir() / "logins" / f"{host}_{port}".replace("/", "_")


def write_login(address: str, token: str) -> Path:
    """write_login leaves `token` where this user's clients of `address` find it: a file only
    this user may read, replaced whole (never seen half written)."""
    path = _login_path(address)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path.parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise TokenFileError(f"{path.parent} is not a directory of this user's own")
    os.chmod(path.parent, 0o700)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(temp, path)
    return path


def forget_login(address: str, token: str) -> None:
    """forget_login removes the login of `address`, if it is still `token` (a later dev
    cluster on the same address may have replaced it)."""
    path = _login_path(address)
    try:
        if _read_private(path) == token:
            path.unlink()
    except (OSError, TokenFileError):
        pass


def dev_login(address: str) -> str | None:
    """dev_login: the token `arranger dev` left for `address`, None where there is none (or
    it is not this user's alone)."""
    try:
        return _read_private(_login_path(address))
    except (OSError, TokenFileError):
        return None


def read_token_file(path: str | Path) -> str:
    """read_token_file: the token in `path` (its first line, spaces dropped). The path may be
    a link (a mounted secret) or a pipe (`<(pass show arranger)`); a regular file of this
    user's that group or others may read is refused, as ssh refuses such a key (one root
    owns is root's to guard)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenFileError(f"--token-file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if stat.S_ISREG(info.st_mode):
            if info.st_uid not in (os.geteuid(), 0):
                raise TokenFileError(f"--token-file {path}: another account owns it")
            if info.st_uid == os.geteuid() and info.st_mode & 0o077:
                raise TokenFileError(
                    f"--token-file {path}: others may read it (mode "
                    f"{info.st_mode & 0o777:o}): chmod 600 {path}"
                )
        elif stat.S_ISFIFO(info.st_mode):
            os.set_blocking(f.fileno(), True)
        else:
            raise TokenFileError(f"--token-file {path}: not a file or a pipe")
        token = _first_line(f.read(MAX_TOKEN_FILE_BYTES + 1), path)
    if not token:
        raise TokenFileError(f"--token-file {path}: it is empty")
    return token


def _read_private(path: Path) -> str:
    """_read_private: the token of a login file: this user's own regular file, reached
    without a link, that no one else may read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise TokenFileError(f"{path}: not a login file of this user's alone")
        return _first_line(f.read(MAX_TOKEN_FILE_BYTES + 1), path)


def _first_line(data: bytes, path: str | Path) -> str:
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(f"--token-file {path}: longer than a token")
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[0].strip() if lines else ""
