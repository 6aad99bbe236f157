"""identity: who is calling the API, as one type every part of the server agrees on.

A caller is a `Principal`: a user name and a role. Tokens name both (`arranger token create
--user U --role R`); an insecure or dev server treats every caller as the local OS user with the
admin role. A request's principal is set once, by the server's interceptor, before its handler
runs, and read anywhere below it with `caller()`; later kinds of caller (a job's own token, a
web session) are principals too, with a `kind` of their own.
"""

from __future__ import annotations

import contextvars
import enum
import getpass
from dataclasses import dataclass


class Role(enum.StrEnum):
    """Role: `admin` may do everything; `user` acts on their own jobs and reads the rest."""

    ADMIN = "admin"
    USER = "user"


@dataclass(frozen=True)
class Principal:
    """Principal: an authenticated caller. `token` is the SHA-256 of the token it showed ("" for
    a local caller): the streams it opens end when that token is revoked. `job`: the id of the
    one job a job token confines it to ("": none)."""

    user: str
    role: Role = Role.USER
    kind: str = "token"
    token: str = ""
    job: str = ""

    @property
    def admin(self) -> bool:
        return self.role == Role.ADMIN

    def owns(self, owner: str) -> bool:
        """owns: whether this caller may change what `owner` owns (admins: everything)."""
        return self.admin or (bool(owner) and owner == self.user)

    def __str__(self) -> str:
        return f"{self.user} ({self.role.value})"


def local_principal() -> Principal:
    """local_principal: the OS user running this process, as admin (insecure and dev servers)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "local"
    return Principal(user, Role.ADMIN, kind="local")


_CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("arranger_caller")


def caller() -> Principal:
    """caller: the principal of the request being served (the server sets it for every call).
    Outside a request there is none: a LookupError, so no code runs as nobody by accident."""
    return _CALLER.get()


def set_caller(principal: Principal) -> contextvars.Token[Principal]:
    return _CALLER.set(principal)
