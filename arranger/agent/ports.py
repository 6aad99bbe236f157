"""ports hands out TCP port numbers for pods' named ports."""

from __future__ import annotations

import socket


class PortAllocator:
    """PortAllocator gives each named port a free number, never one it has already given out.

    A pod restarted in place asks for its previous numbers again and gets them back. The
    kernel picks fresh numbers (bind to port 0), so they come from the ephemeral range.
    """

    def __init__(self) -> None:
        self.in_use: set[int] = set()

    def allocate(self, wanted: dict[str, int]) -> dict[str, int]:
        ports: dict[str, int] = {}
        for name, asked in wanted.items():
            number = asked if asked > 0 and asked not in self.in_use else self._fresh()
            self.in_use.add(number)
            ports[name] = number
        return ports

    def release(self, ports: dict[str, int]) -> None:
        self.in_use.difference_update(ports.values())

    def _fresh(self) -> int:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("0.0.0.0", 0))
                number = int(sock.getsockname()[1])
            if number not in self.in_use:
                return number
        raise OSError("no free TCP port found")
