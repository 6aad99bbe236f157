"""What `--wait` shows of the learner's log, with a stand-in for the server's answers: each
attempt once, from its start, a stream broken mid-way not written twice; and what `run` builds."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from arranger.client import follow
from arranger.client.channel import ArrangerError
from arranger.client.follow import follow_leader
from arranger.client.run_command import job_document
from arranger.v1 import arranger_pb2, job_pb2


class Stand:
    """Stand answers get and log_chunks as a server would for a job whose learner ran two
    attempts; the first read of attempt 0 breaks after its first chunk."""

    def __init__(self) -> None:
        self.reads: list[int] = []
        self.gets = 0

    def get(self, job: str) -> job_pb2.TYJob:
        self.gets += 1
        msg = job_pb2.TYJob()
        msg.status.leader.name, msg.status.leader.attempt = "j-learner", 1
        msg.status.leader.state = "Succeeded"
        msg.status.stage = "Succeeded" if self.gets > 2 else "Running"
        return msg

    def log_chunks(self, job: str, pod: str, attempt: int, follow: bool) -> Iterator[Any]:
        self.reads.append(attempt)
        chunks = [b"a0 line1\n", b"a0 line2\n"] if attempt == 0 else [b"a1 line1\n"]
        for i, data in enumerate(chunks):
            yield arranger_pb2.LogChunk(data=data)
            if attempt == 0 and self.reads.count(0) == 1 and i == 0:
                raise ArrangerError(grpc.StatusCode.UNAVAILABLE, "the agent went away")


def test_each_attempt_once_and_a_broken_stream_not_written_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(follow, "POLL_S", 0.0)  # its answers are all there: nothing to wait for
    out, said = io.BytesIO(), []
    stand = Stand()
    done = follow_leader(stand, "j", out, said.append)  # type: ignore[arg-type]
    assert out.getvalue() == b"a0 line1\na0 line2\na1 line1\n"
    assert said == ["[arranger: j-learner attempt 1]"]
    assert stand.reads == [0, 0, 1] and done.status.stage == "Succeeded"


def test_run_puts_its_queue_where_a_file_would() -> None:
    args = argparse.Namespace(
        command=["python", "train.py"],
        cpu="1",
        memory="1Gi",
        gpu="0",
        actors=0,
        actor_command="",
        queue="research",
        priority=None,
        name="x",
        sweep=[],
        seeds=None,
        max_parallel=None,
    )
    doc = job_document(args)
    assert doc["metadata"] == {"name": "x", "queue": "research"}
    assert "queue" not in doc["spec"]
