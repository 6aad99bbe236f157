"""The `reason` label of arranger_agent_pod_failures_total: a failed attempt's reason as the
README's table of failed pods names it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arranger.agent.metrics import EXITED, FAILURE_NAMES, SIGNALED, failure_label
from arranger.agent.pod_state import describe_exit

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("CommandNotFound: rl-learner: cannot start `python4`: No such file", "CommandNotFound"),
        (
            "CommandNotExecutable: cannot start `./run.sh`: Permission denied",
            "CommandNotExecutable",
        ),
        ("ContainerCommandNotFound: exec failed", "ContainerCommandNotFound"),
        ("PackageRefused: /etc/passwd: absolute", "PackageRefused"),
        ("StartError: cannot start `x`: Input/output error", "StartError"),
        ("ContainerError: image 'x' not found", "ContainerError"),
        ("OOMKilled", "OOMKilled"),
        (describe_exit(3), EXITED),
        (describe_exit(128 + 9), SIGNALED),
        ("", "Other"),
        ("Someone: said anything", "Other"),
        ("exit code 3; and more", "Other"),
    ],
)
def test_a_failure_is_labelled_by_its_named_reason(reason: str, label: str) -> None:
    assert failure_label(reason) == label


def test_every_label_is_a_name_of_the_readme_table() -> None:
    text = README.read_text()
    start = text.index("| reason | the pod failed because |")
    table = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"^\| `([A-Za-z]+)` \|", table, re.MULTILINE))
    assert named == {*FAILURE_NAMES, EXITED, SIGNALED, "Other"}
