"""How `arranger explain` prints the victims a waiting job would take, one line each with why
it is needed."""

from __future__ import annotations

import io

from rich.console import Console

from arranger.client import render
from arranger.v1 import arranger_pb2


def test_each_victim_is_printed_with_why_it_is_needed() -> None:
    reply = arranger_pb2.ExplainJobResponse(decision="Unscheduled")
    reply.job.metadata.name = "learner"
    reply.could_preempt.add(
        job="actors", pods=3, why="frees 3 cpu, 3Gi memory on n1, where the minimum's pods go"
    )
    reply.could_preempt.add(
        job="gpu-job",
        pods=1,
        why="frees 1 cpu, 1Gi memory, 1 gpu on n2, where the minimum's pods go (its minimum: the whole job)",
    )
    out = io.StringIO()
    render.explanation(reply, Console(file=out, width=200, no_color=True))
    text = out.getvalue()
    assert "Would evict" in text and text.count("Would evict") == 1
    assert "3 pods of actors: frees 3 cpu, 3Gi memory on n1, where the minimum's pods go" in text
    assert "1 pods of gpu-job: frees 1 cpu, 1Gi memory, 1 gpu on n2" in text
