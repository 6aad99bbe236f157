"""shape names every way YAML data does not fit a message, in the user's words, all at once."""

from __future__ import annotations

from typing import Any

from arranger.client.shape import problems
from arranger.v1 import job_pb2


def check(data: dict[str, Any]) -> list[str]:
    return problems(data, job_pb2.TYJob.DESCRIPTOR)


def test_a_fitting_document_has_no_problem_and_quoted_numbers_are_read() -> None:
    data = {"spec": {"priority": "3", "leader": {"template": {"resources": {"gpu": "0.5"}}}}}
    assert check(data) == []
    assert data["spec"]["priority"] == 3
    assert data["spec"]["leader"]["template"]["resources"]["gpu"] == 0.5


def test_every_problem_is_named_with_its_path() -> None:
    data = {
        "metdata": {"name": "x"},
        "spec": {
            "priority": 2.5,
            "restartLimit": 2**40,
            "terminating": "yes",
            "worker_sets": [{"name": "a", "template": {"env": {"A": 1}}}, "b"],
            "workerSets": [],
            "leader": {"template": {"command": "python -m learner", "nodeSelector": ["a"]}},
        },
    }
    assert check(data) == [
        "metdata: unknown field (did you mean 'metadata'?)",
        "spec.priority: expected a whole number, got the number 2.5",
        f"spec.restartLimit: {2**40} is out of range (-2147483648 to 2147483647)",
        "spec.terminating: expected true or false, got the string 'yes'",
        'spec.worker_sets[0].template.env.A: expected a string, got the number 1 (quote it: "1")',
        "spec.worker_sets[1]: expected a mapping (name, counts, template, minCount, maxCounts, "
        "retryOnExitCodes, progressTimeoutSeconds, onStall, auxiliary, terminationDelaySeconds, "
        "startAfter), got the string 'b'",
        "spec.workerSets: given twice (as worker_sets and as workerSets)",
        "spec.leader.template.command: expected a list of strings, got the string 'python -m "
        "learner'; write it as a list: [python, -m, learner]",
        "spec.leader.template.nodeSelector: expected a mapping of names to strings, got a list",
    ]


def test_an_unknown_key_far_from_any_field_lists_the_fields() -> None:
    assert check({"spec": {"leader": {"zzz": 1}}}) == [
        "spec.leader.zzz: unknown field; known fields: name, template, retryOnExitCodes, "
        "progressTimeoutSeconds, onStall"
    ]
