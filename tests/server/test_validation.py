"""Spec validation at the API edge: every refusal names its field path."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from google.protobuf import json_format

from arranger.client.specfile import SpecFileError, load_job_yaml
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.spec_bounds import BOUNDS, UNBOUNDED
from arranger.server.validation import SpecInvalid, parse_job, parse_stored_job
from arranger.spec import JobSpec
from arranger.v1 import job_pb2

GOOD = """
apiVersion: arranger/v1
kind: TYJob
metadata: {name: rl, labels: {team: rl}}
spec:
  priority: 7
  minWorkersNum: 2
  volumes: [{name: data, hostPath: /data/rl, mountPath: /data}]
  leader:
    name: learner
    template: {command: [python, learner.py], resources: {cpu: 4, memory: 16Gi, gpu: 1, gpuType: A100}}
  workerSets:
    - {name: actors, counts: 16, template: {command: [python, actor.py], resources: {cpu: 500m, memory: 2Gi}}}
    - {name: evaluators, template: {command: [python, eval.py]}}
"""


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_job(load_job_yaml(text))


def errors(text: str) -> list[str]:
    with pytest.raises(SpecInvalid) as caught:
        parse(text)
    return caught.value.errors


LONE = """
metadata: {name: solo}
spec:
  leader: {name: learner, template: {command: [python, learner.py]}}
"""


def test_a_lone_learner_needs_no_worker_sets_and_no_workers() -> None:
    for text in (LONE, LONE + "  workerSets: []\n", LONE + "  minWorkersNum: 0\n"):
        spec = parse(text)
        assert spec.worker_sets == () and spec.num_workers == 0
        assert spec.min_workers_num == 0 and spec.required_workers == 0
        assert [slot.name for slot in spec.pod_slots()] == ["solo-learner"]
    for policy in ("Gang", "BinPack", "LeaderFirst"):
        text = LONE + f"  schedulerPolicy: {{basicPolicy: {policy}}}\n"
        assert parse(text).required_workers == 0 and parse(text).minimum_ranks() == set()
    assert errors(LONE + "  minWorkersNum: 1\n") == [
        "spec.minWorkersNum: must be 0 for a job without worker sets"
    ]


def test_a_full_spec_parses_with_defaults_filled_in() -> None:
    spec = parse(GOOD)
    assert (spec.name, spec.queue, spec.priority, spec.restart_limit) == ("rl", "default", 7, 3)
    assert (
        spec.clean_pod_policy == "All"
        and spec.basic_policy == "BinPack"
        and spec.job_queue_policy == "Priority"
    )
    assert (
        spec.leader.resources.cpu_milli == 4000 and spec.leader.resources.memory_bytes == 16 * 2**30
    )
    assert spec.leader.resources.gpu_milli == 1000 and spec.leader.ports == ("rpc",)
    actors, evaluators = spec.worker_sets
    assert actors.counts == 16 and actors.template.resources.cpu_milli == 500
    assert evaluators.counts == 1 and evaluators.template.resources.cpu_milli == 1000
    assert spec.num_workers == 17 and spec.minimum_ranks() == {0, 1}
    names = [slot.name for slot in spec.pod_slots()]
    assert (
        names[:3] == ["rl-learner", "rl-actors-0", "rl-actors-1"] and names[-1] == "rl-evaluators-0"
    )
    assert [slot.rank for slot in spec.pod_slots()][1:] == list(range(17))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("spec.priority: 11", "spec.priority: must be between 1 and 10"),
        ("spec.priority: 0", "spec.priority: must be between 1 and 10"),
        ("spec.workerSets[0].counts: 0", "spec.workerSets[0].counts: must be >= 1"),
        (
            "spec.minWorkersNum: 18",
            "spec.minWorkersNum: must be between 0 and the total of counts (17; auxiliary sets "
            "not counted)",
        ),
        ("spec.restartLimit: -1", "spec.restartLimit: must be between 0 and 1000"),
        (
            "spec.cleanPodPolicy: Sometimes",
            "spec.cleanPodPolicy: 'Sometimes' is not one of All, Running, None",
        ),
        (
            "spec.schedulerPolicy.basicPolicy: Fastest",
            "spec.schedulerPolicy.basicPolicy: 'Fastest' is not one of",
        ),
        ("metadata.name: Bad_Name", "metadata.name: 'Bad_Name' must be lowercase letters"),
        ("metadata.name: ''", "metadata.name: is required"),
        ("spec.workerSets[1].name: actors", "spec.workerSets[1].name: 'actors' is declared twice"),
        (
            "spec.workerSets[0].name: learner",
            "spec.workerSets[0].name: 'learner' is the leader's name",
        ),
        ("spec.leader.template.command: []", "spec.leader.template.command: is required"),
        (
            "spec.leader.template.resources.gpu: 1.5",
            "spec.leader.template.resources.gpu: above 1 must be a whole number",
        ),
        (
            "spec.leader.template.resources.cpu: -1",
            "spec.leader.template.resources.cpu: must be between 0 and 10000",
        ),
        (
            "spec.volumes[0].hostPath: relative/dir",
            "spec.volumes[0].hostPath: must be an absolute path",
        ),
        (
            "spec.volumes[0].hostPath: /data/../etc",
            "spec.volumes[0].hostPath: must not contain '..'",
        ),
        (
            "spec.leader.template.env: {ARRANGER_ROLE: x}",
            "spec.leader.template.env['ARRANGER_ROLE']: is set by Arranger",
        ),
        (
            "spec.leader.template.readiness: {port: web}",
            "spec.leader.template.readiness.port: 'web' is not one of the declared ports",
        ),
        ("spec.terminating: true", "spec.terminating: must be false on submit"),
        (
            "spec.leader.template.image: --privileged",
            "spec.leader.template.image: '--privileged' is not an image reference",
        ),
        (
            "spec.leader.template.image: 'busybox latest'",
            "spec.leader.template.image: 'busybox latest' is not an image reference",
        ),
        (
            "spec.leader.template.image: 'docker-archive:/root/secret.tar'",
            "spec.leader.template.image: 'docker-archive:/root/secret.tar' names the "
            "docker-archive: transport",
        ),
        (
            "spec.volumes[0].mountPath: '/data:/etc'",
            "spec.volumes[0].mountPath: must not contain ':' or ','",
        ),
        ("apiVersion: v2", "apiVersion: 'v2' is not arranger/v1"),
        (
            "spec.workerSets[1].template.resources.pids: -1",
            "spec.workerSets[1].template.resources.pids: must be a whole number >= 0",
        ),
    ],
)
def test_each_mistake_is_named_by_its_path(change: str, expected: str) -> None:
    found = errors(_edit(GOOD, change))
    assert any(e.startswith(expected) for e in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = errors(_edit(_edit(GOOD, "spec.priority: 0"), "spec.workerSets[0].counts: 0"))
    assert len(found) >= 2


def test_too_many_pods_is_refused() -> None:
    found = errors(_edit(GOOD, "spec.workerSets[0].counts: 10000"))
    assert any("at most 10000 are allowed" in e for e in found)


def _edit(text: str, change: str) -> str:
    """_edit sets one field (dotted path with [i]) in the YAML document."""
    doc = yaml.safe_load(text)
    path, _, value = change.partition(": ")
    keys: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.replace("]", "").split("[")
        keys.append(name)
        keys.extend(int(i) for i in indexes)
    target = doc
    for key in keys[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[keys[-1]] = yaml.safe_load(value)
    return yaml.safe_dump(doc)


def test_a_leader_named_like_a_worker_pod_is_refused() -> None:
    found = errors(_edit(GOOD, "spec.leader.name: actors-3"))
    assert found == ["spec.leader.name: 'actors-3' is also the name of a worker pod"]


def test_an_image_reference_is_kept() -> None:
    spec = parse(
        _edit(GOOD, "spec.leader.template.image: registry.example:5000/rl/learner:1.2@sha256:ab12")
    )
    assert spec.leader.image == "registry.example:5000/rl/learner:1.2@sha256:ab12"


def test_a_pids_limit_is_a_whole_number_kept_per_template() -> None:
    text = _edit(GOOD, "spec.leader.template.resources.pids: 8192")
    spec = parse(_edit(text, "spec.workerSets[0].template.resources.pids: 512"))
    assert spec.leader.resources.pids == 8192
    assert [ws.template.resources.pids for ws in spec.worker_sets] == [512, 0]
    assert spec_from_json(spec_to_json(spec)) == spec  # as the store keeps it
    with pytest.raises(SpecFileError) as caught:  # the file's check: int64 has no fractions
        parse(_edit(GOOD, "spec.leader.template.resources.pids: 1.5"))
    assert caught.value.problems == [
        "<job>: spec.leader.template.resources.pids: expected a whole number, got the number 1.5"
    ]


BIG = """
metadata: {name: a-job-name-longer-than-today-allows-by-a-dozen-chars, queue: default}
spec:
  restartLimit: 5000
  scheduleTimeoutSeconds: 20000000
  leader: {name: a-leader-name-over-24-chars, template: {command: [l], resources: {gpu: 128}}}
  workerSets: [{name: actors, counts: 12000, template: {command: [a], resources: {cpu: 20000}}}]
"""


def stored(spec: JobSpec) -> job_pb2.TYJob:
    """stored: the message the store reads a spec back into (convert.spec_from_json's)."""
    msg = job_pb2.TYJob()
    json_format.Parse(spec_to_json(spec), msg)
    return msg


def test_a_stored_spec_loads_whatever_the_bounds_of_today() -> None:
    """A job stored by a release with higher bounds (names, counts, sizes) loads as it was
    stored, while a submit of the same spec is refused by today's bounds."""
    spec = parse_job(load_job_yaml(BIG), UNBOUNDED)  # as a release without these bounds took it
    msg = stored(spec)
    assert parse_stored_job(msg) == spec
    assert spec_from_json(spec_to_json(spec)) == spec  # as the server loads it
    with pytest.raises(SpecInvalid) as caught:
        parse_job(msg)
    assert [e.partition(":")[0] for e in caught.value.errors] == [
        "metadata.name",
        "spec.restartLimit",
        "spec.scheduleTimeoutSeconds",
        "spec.leader.name",
        "spec.leader.template.resources.gpu",
        "spec.workerSets[0].maxCounts",
        "spec.workerSets[0].counts",
        "spec.workerSets[0].template.resources.cpu",
        "spec.workerSets",
    ]


def test_a_lowered_bound_refuses_a_submit_but_not_a_stored_job() -> None:
    spec = parse(GOOD)  # 1 + 16 + 1 pods: within today's bounds
    msg = stored(spec)
    lowered = dataclasses.replace(BOUNDS, pods=10)  # as a later release might
    with pytest.raises(SpecInvalid) as caught:
        parse_job(msg, lowered)
    assert caught.value.errors == [
        "spec.workerSets[0].maxCounts: must be between 1 and 10",
        "spec.workerSets[0].counts: must be between 0 and maxCounts (16)",
        "spec.workerSets: the job may have 18 pods (maxCounts); at most 10 are allowed",
    ]
    assert parse_stored_job(msg) == spec


def test_a_stored_spec_is_still_checked_for_its_structure() -> None:
    msg = stored(parse(GOOD))
    msg.metadata.name = "Not-A-DNS-Label"
    msg.spec.worker_sets[0].template.env["ARRANGER_JOB"] = "x"
    with pytest.raises(SpecInvalid) as caught:
        parse_stored_job(msg)
    assert [e.partition(":")[0] for e in caught.value.errors] == [
        "metadata.name",
        "spec.workerSets[0].template.env['ARRANGER_JOB']",
    ]
