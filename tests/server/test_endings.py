"""endings says how a pod ended in a job's message: its exit code, the signal behind it and
its reason beyond the code, bounded."""

from __future__ import annotations

import pytest

from arranger.server.endings import REASON_CHARS, exit_text
from arranger.server.model import PodRecord
from arranger.states import PodState, Role


def ended(code: int | None, reason: str) -> PodRecord:
    pod = PodRecord(
        uid="j/p",
        job_id="j",
        name="j-p",
        role=Role.WORKER,
        worker_set="a",
        index=0,
        rank=0,
        in_minimum=True,
    )
    pod.state, pod.exit_code, pod.reason = PodState.FAILED, code, reason
    return pod


@pytest.mark.parametrize(
    ("code", "reason", "said"),
    [
        (2, "exit code 2", " with exit code 2"),
        (143, "killed by SIGTERM", " with exit code 143 (SIGTERM)"),
        (137, "OOMKilled", " with exit code 137 (SIGKILL; OOMKilled)"),
        (
            125,
            "ImagePullFailed: image x: Error: no",
            " with exit code 125 (ImagePullFailed: image x: Error: no)",
        ),
        (
            None,
            "AgentRestarted: its exit code was not recorded",
            " (AgentRestarted: its exit code was not recorded)",
        ),
        (300, "exit code 300", " with exit code 300"),
    ],
)
def test_exit_text_names_the_signal_and_the_reason(
    code: int | None, reason: str, said: str
) -> None:
    assert exit_text(ended(code, reason)) == said


def test_a_long_reason_is_cut() -> None:
    said = exit_text(ended(1, "ContainerError: " + "x" * 5000))
    assert len(said) == len(" with exit code 1 ()") + REASON_CHARS
