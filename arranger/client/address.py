"""address: where the client finds arranger-server when it is not told."""

from __future__ import annotations

import os

DEFAULT_SERVER = "127.0.0.1:50051"


def default_server() -> str:
    """default_server: $ARRANGER_SERVER, else 127.0.0.1:50051."""
    return os.environ.get("ARRANGER_SERVER", DEFAULT_SERVER)
