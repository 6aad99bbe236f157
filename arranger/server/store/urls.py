"""urls: a store's URL. `sqlite:///absolute/path` names a SQLite store (a file);
`postgresql://user@host/db` (or `postgres://`) a PostgreSQL database. A URL may carry a
password, which logs and messages never show (`shown`).
"""

from __future__ import annotations

import re
from pathlib import Path

SQLITE = "sqlite://"
POSTGRES = ("postgresql://", "postgres://")


def sqlite_url(path: Path) -> str:
    """sqlite_url: the URL of the SQLite store at `path`."""
    return SQLITE + str(path.absolute())


def store_path(url: str) -> Path | None:
    """store_path: the file of a SQLite store's URL, None for a store that is no file."""
    return Path(url.removeprefix(SQLITE)) if url.startswith(SQLITE) else None


def check_url(url: str) -> str:
    """check_url: why `url` names no store arranger can open ("" if it names one)."""
    if url.startswith(SQLITE):
        path = url.removeprefix(SQLITE)
        if not path.startswith("/"):
            return f"store {url!r}: a SQLite store is sqlite:// and an absolute path"
        return ""
    if url.startswith(POSTGRES):
        return ""
    return f"store {url!r}: sqlite:///path/to/arranger.db or postgresql://user@host/database"


def shown(url: str) -> str:
    """shown: the URL without a password (in its user part or a `password=` parameter), as
    logs and messages may say it."""
    return _QUERY_PASSWORD.sub(r"\1password=***", _USER_PASSWORD.sub(r"\1:***@", url))


_USER_PASSWORD = re.compile(r"^([a-z]+://[^:/@?#]*):[^@/?#]*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&])password=[^&#]*", re.IGNORECASE)
