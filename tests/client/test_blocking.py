"""The blocking Client is interrupted by a signal whichever of its threads the kernel delivered
it to: a Ctrl-C that lands on the loop's thread (or gRPC's) still ends a call waiting forever."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from arranger.client.blocking import Client


class Interrupted(Exception):
    pass


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    def handler(number: int, frame: FrameType | None) -> None:
        raise Interrupted

    before = signal.signal(signal.SIGINT, handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_signal_delivered_to_the_loops_thread_ends_the_wait(sigint_raises: None) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        # The signal goes to this thread, not the one waiting in the call (as the kernel may
        # choose); Python runs its handler only in the main thread.
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        try:
            await asyncio.get_running_loop().create_future()  # never set: waits until cancelled
        finally:
            cancelled.set()

    with Client("127.0.0.1:1") as client:
        started = time.monotonic()
        with pytest.raises(Interrupted):
            client._run(forever())
        assert time.monotonic() - started < 30
        assert cancelled.wait(30), "the call is cancelled on the loop"


def test_a_calls_own_timeout_is_still_its_answer() -> None:
    async def times_out() -> None:
        raise TimeoutError("the call's deadline")

    with Client("127.0.0.1:1") as client, pytest.raises(TimeoutError, match="deadline"):
        client._run(times_out())
