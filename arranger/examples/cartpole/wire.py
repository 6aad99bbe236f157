"""wire: length-prefixed JSON messages over a TCP stream.

Each message is a 4-byte big-endian unsigned length followed by that many bytes of
UTF-8 JSON encoding one object. A clean end of stream between messages, or in the
middle of one, raises ConnectionClosed, so callers treat both like a reset peer.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

HEADER = struct.Struct(">I")
# Refuse absurd lengths so a corrupt header cannot make us allocate gigabytes.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class ConnectionClosed(ConnectionError):
    """ConnectionClosed means the peer ended the stream (recv returned no bytes)."""


class ProtocolError(ValueError):
    """ProtocolError means the bytes received are not a valid message."""


def send_msg(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    """send_msg writes msg as one framed JSON message; it returns once all bytes are sent."""
    body = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    sock.sendall(HEADER.pack(len(body)) + body)


def recv_msg(sock: socket.socket) -> dict[str, Any]:
    """recv_msg reads exactly one framed message and returns the decoded JSON object."""
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message length {length} exceeds {MAX_MESSAGE_BYTES}")
    try:
        msg = json.loads(_recv_exact(sock, length).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"message is not UTF-8: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"message is not JSON: {exc}") from exc
    if not isinstance(msg, dict):
        raise ProtocolError(f"message is a {type(msg).__name__}, not an object")
    return msg


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """_recv_exact returns exactly n bytes from sock, or raises ConnectionClosed."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionClosed(f"peer closed the connection ({len(buf)}/{n} bytes read)")
        buf += chunk
    return bytes(buf)
