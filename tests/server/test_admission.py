"""Admission decides a submit before the controller sees it, as a value: each refusal names the
field or the limit and the status it is answered with, checked in a fixed order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.identity import Principal
from arranger.server.admission import Admission, Refusal
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.limits import SubmitGate, UserLimits
from arranger.server.nodes import NodeRegistration
from arranger.server.packages import Packages
from arranger.server.store import Store
from arranger.spec import JobSpec

SPEC = """
metadata: {{name: {name}, queue: {queue}}}
spec:
  leader: {{name: learner, template: {{command: [l]}}}}
  workerSets: [{{name: actors, counts: {actors}, template: {{command: [a]}}}}]
"""
ALICE = Principal("alice")


def no_store() -> Store:
    raise AssertionError("a job that names no package never reaches the store")


def admission(tmp_path: Path, **limits: int) -> tuple[Admission, Controller]:
    controller = Controller(ControllerConfig())
    config = ServerConfig(data_dir=tmp_path, limits=dataclasses.replace(UserLimits(), **limits))
    view = controller.view
    gate = SubmitGate(config.limits, lambda job_id: view.job(job_id) is not None)
    packages = Packages(no_store, view, config.limits.package_bytes)
    return Admission(view, controller.config, config, packages, gate, lambda: 0.0), controller


def job(name: str = "rl", queue: str = "default", actors: int = 2) -> object:
    return load_job_yaml(SPEC.format(name=name, queue=queue, actors=actors))


async def test_an_admitted_spec_comes_back_parsed(tmp_path: Path) -> None:
    admit, _ = admission(tmp_path)
    spec = await admit.admit(job(), ALICE)  # type: ignore[arg-type]
    assert isinstance(spec, JobSpec) and spec.name == "rl" and spec.num_workers == 2


@pytest.mark.parametrize(
    ("kwargs", "limits", "code", "names"),
    [
        ({}, {"spec_bytes": 10}, "RESOURCE_EXHAUSTED", "limits.specBytes"),
        ({"name": "Bad Name"}, {}, "INVALID_ARGUMENT", "metadata.name"),
        ({"queue": "nowhere"}, {}, "INVALID_ARGUMENT", "metadata.queue"),
        ({"actors": 5}, {"pods_per_user": 3}, "RESOURCE_EXHAUSTED", "pods"),
    ],
)
async def test_each_refusal_names_its_field_or_limit(
    tmp_path: Path, kwargs: dict[str, object], limits: dict[str, int], code: str, names: str
) -> None:
    admit, _ = admission(tmp_path, **limits)
    refused = await admit.admit(job(**kwargs), ALICE)  # type: ignore[arg-type]
    assert isinstance(refused, Refusal), refused
    assert refused.code == code and names in refused.message, refused


async def test_a_name_in_use_by_an_unfinished_job_is_refused(tmp_path: Path) -> None:
    admit, controller = admission(tmp_path)
    first = await admit.admit(job(), ALICE)  # type: ignore[arg-type]
    assert isinstance(first, JobSpec)
    controller.submit("j1", first, spec_to_json(first), 1.0, "alice")
    refused = await admit.admit(job(), ALICE)  # type: ignore[arg-type]
    assert refused == Refusal(
        "ALREADY_EXISTS",
        "metadata.name: job 'rl' (id j1) has not finished; stop it, wait for it to end, "
        "or pick another name",
    )


async def test_the_cheapest_check_answers_first(tmp_path: Path) -> None:
    """A spec too large and invalid is refused for its size: it is never parsed."""
    admit, _ = admission(tmp_path, spec_bytes=10)
    refused = await admit.admit(job(name="Bad Name", queue="nowhere"), ALICE)  # type: ignore[arg-type]
    assert isinstance(refused, Refusal) and refused.message.startswith("limits.specBytes")


BIG = """
metadata: {{name: big, queue: default}}
spec:
  leader: {{name: learner, template: {{command: [l], resources: {leader}}}}}
  workerSets: [{{name: actors, counts: 1, template: {{command: [a], resources: {worker}}}}}]
"""


def sized(leader: str = "{cpu: 1}", worker: str = "{cpu: 1}") -> object:
    return load_job_yaml(BIG.format(leader=leader, worker=worker))


async def test_a_job_no_registered_node_could_ever_hold_is_refused_naming_each_shortfall(
    tmp_path: Path,
) -> None:
    """As Slurm's sbatch: every registered node counts, Ready or not, as if empty."""
    admit, controller = admission(tmp_path)
    controller.node_registered(NodeRegistration("a", "10.0.0.1", 8000, 8 * 2**30), 0.0)
    controller.node_registered(NodeRegistration("b", "10.0.0.2", 4000, 16 * 2**30), 0.0)
    huge = sized(worker='{cpu: 16, memory: "32Gi", gpu: 1}')
    refused = await admit.admit(huge, ALICE)  # type: ignore[arg-type]
    assert refused == Refusal(
        "FAILED_PRECONDITION",
        "spec.workerSets[0].template: each worker of actors needs 16 CPUs (the largest node has "
        "8 CPUs), 32Gi of memory (the largest node has 16Gi) and 1 GPU (the largest node has 0 "
        "GPUs); it could never run on the 2 registered nodes (counted Ready and empty); submit "
        "with --queue-anyway (queue_anyway) to queue it for a node that may join",
    )
    assert isinstance(await admit.admit(huge, ALICE, queue_anyway=True), JobSpec)  # type: ignore[arg-type]
    picky = sized(leader="{cpu: 1}", worker="{cpu: 1}")
    picky.spec.leader.template.node_selector["zone"] = "b"  # type: ignore[attr-defined]
    refused = await admit.admit(picky, ALICE)  # type: ignore[arg-type]
    assert isinstance(refused, Refusal) and refused.message.startswith(
        "spec.leader.template: the leader needs nodeSelector zone=b; no registered node has "
        "those labels"
    ), refused


async def test_nodes_not_ready_count_and_no_nodes_at_all_refuse_nothing(tmp_path: Path) -> None:
    admit, controller = admission(tmp_path)
    wide = sized(leader="{cpu: 8}")
    assert isinstance(await admit.admit(wide, ALICE), JobSpec)  # type: ignore[arg-type]
    controller.node_registered(NodeRegistration("a", "10.0.0.1", 8000, 8 * 2**30), 0.0)
    controller.cordon("a", True, 0.0)
    controller.node_disconnected("a", 0.0)
    assert isinstance(await admit.admit(sized(leader="{cpu: 7}"), ALICE), JobSpec)  # type: ignore[arg-type]
    gang = await admit.admit(sized(leader="{cpu: 5}", worker="{cpu: 5}"), ALICE)  # type: ignore[arg-type]
    assert isinstance(gang, Refusal) and gang.message.startswith(
        "spec.workerSets: the gang minimum (2 pods) needs 10 CPUs (the cluster has 8 in all) on "
        "1 registered node;"
    ), gang


async def test_refusals_for_never_fitting_are_charged_to_the_callers_rate(tmp_path: Path) -> None:
    """A user cannot submit jobs that never fit faster than their rate: each costs a token."""
    admit, controller = admission(tmp_path, submit_burst=3)
    controller.node_registered(NodeRegistration("a", "10.0.0.1", 8000, 8 * 2**30), 0.0)
    huge = sized(worker='{cpu: 16, memory: "1Gi"}')
    codes = [(await admit.admit(huge, ALICE)).code for _ in range(4)]  # type: ignore[arg-type, union-attr]
    assert codes == ["FAILED_PRECONDITION"] * 3 + ["RESOURCE_EXHAUSTED"], codes


async def test_a_node_that_registers_again_larger_counts_at_once(tmp_path: Path) -> None:
    """The summary of the fleet may be seconds old; a refusal looks at the nodes as they are."""
    admit, controller = admission(tmp_path)
    controller.node_registered(NodeRegistration("a", "10.0.0.1", 8000, 8 * 2**30), 0.0)
    huge = sized(worker='{cpu: 16, memory: "1Gi"}')
    assert isinstance(await admit.admit(huge, ALICE), Refusal)  # type: ignore[arg-type]
    controller.node_registered(NodeRegistration("a", "10.0.0.1", 32000, 8 * 2**30), 1.0)
    assert isinstance(await admit.admit(huge, ALICE), JobSpec)  # type: ignore[arg-type]
