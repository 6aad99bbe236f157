"""Node filters: scarce GPU types, machine groups, and the reasons they give."""

from __future__ import annotations

import dataclasses

import pytest

from arranger.sched import SchedulerConfig, run_cycle
from arranger.sched.config import SchedulerConfigError
from arranger.sched.snapshot import SHARES_ENFORCED, SHARES_LOST, SHARES_PROMISED
from arranger.states import ScheduleState
from tests.sched.builders import gang, job_of, node, pod, queue, snapshot

SCARCE = SchedulerConfig(scarce_gpu_types=frozenset({"A100"}))


def test_scarce_gpu_nodes_take_only_pods_asking_for_that_model() -> None:
    nodes = [node("a", gpus=4, model="A100", used_cpu=4), node("b", gpus=4, model="T4")]
    cpu_pod = job_of("c", pod("c-l", leader=True))
    assert run_cycle(snapshot(nodes, [cpu_pod]), SCARCE).placements[0].node == "b"
    assert run_cycle(snapshot(nodes, [cpu_pod])).placements[0].node == "a"  # without protection
    asks = job_of("x", pod("x-l", leader=True, gpu=1, gpu_type="A100"))
    assert run_cycle(snapshot(nodes, [asks]), SCARCE).placements[0].node == "a"
    any_gpu = job_of("y", pod("y-l", leader=True, gpu=1))
    only_a = [nodes[0]]
    decision = run_cycle(snapshot(only_a, [any_gpu]), SCARCE).decisions["y"]
    assert decision.message.endswith("1 reserved for scarce GPU jobs")


def test_machine_groups_keep_private_nodes_for_their_queues() -> None:
    private = node("p", labels={"arranger.io/machine-group": "team-a"}, used_cpu=4)
    shared = node("s")
    queues = [queue("qa", groups=("team-a",)), queue("qb")]
    outsider = gang("o", workers=0, queue="qb")
    insider = gang("i", workers=0, queue="qa")
    only = gang("g", workers=0, queue="qa", group_only=True)
    assert (
        run_cycle(snapshot([private, shared], [outsider], queues=queues)).placements[0].node == "s"
    )
    assert (
        run_cycle(snapshot([private, shared], [insider], queues=queues)).placements[0].node == "p"
    )
    assert (
        run_cycle(snapshot([private, node("s", used_cpu=6)], [only], queues=queues))
        .placements[0]
        .node
        == "p"
    )
    full_shared = node("s", used_cpu=8)
    blocked = run_cycle(snapshot([private, full_shared], [outsider], queues=queues)).decisions["o"]
    assert blocked.state == ScheduleState.UNSCHEDULED
    assert (
        blocked.message
        == "0/2 nodes fit pod o-l of the gang minimum: 1 in another machine group, 1 insufficient cpu"
        "; preempt and reclaim refused (NoPreemptionVictims): no other job is running"
    )
    stays = run_cycle(
        snapshot(
            [node("p", labels={"arranger.io/machine-group": "team-a"}, used_cpu=8), shared],
            [only],
            queues=queues,
        )
    )
    assert "1 not in the queue's machine groups" in stays.decisions["g"].message


def test_gpu_type_may_list_several_models() -> None:
    nodes = [node("a", gpus=2, model="T4"), node("b", gpus=2, model="V100M32", used_cpu=4)]
    either = job_of("j", pod("j-l", leader=True, gpu=1, gpu_type="V100M16|V100M32"))
    plan = run_cycle(snapshot(nodes, [either]))
    assert plan.placements[0].node == "b"


def test_pods_that_name_an_image_go_only_to_nodes_with_a_container_runtime() -> None:
    plain, boxed = node("a"), dataclasses.replace(node("b", used_cpu=4), containers=True)
    image_pod = dataclasses.replace(pod("c-l", leader=True), container=True)
    assert run_cycle(snapshot([plain, boxed], [job_of("c", image_pod)])).placements[0].node == "b"
    # A process goes where BinPack sends it, container runtime or not.
    process = job_of("p", pod("p-l", leader=True))
    assert run_cycle(snapshot([plain, boxed], [process])).placements[0].node == "b"
    nowhere = run_cycle(snapshot([plain], [job_of("c", image_pod)])).decisions["c"]
    assert nowhere.message.endswith(
        "0/1 nodes fit pod c-l of the gang minimum: 1 no container runtime for the image"
    )


def test_a_share_of_a_gpu_goes_where_shares_are_held() -> None:
    promised = dataclasses.replace(node("p", gpus=1, used_cpu=4), shares=SHARES_PROMISED)
    enforced = dataclasses.replace(node("e", gpus=1), shares=SHARES_ENFORCED)
    failing = dataclasses.replace(node("f", gpus=1, used_cpu=6), shares=SHARES_LOST)
    share = job_of("s", pod("s-l", leader=True, gpu=0.5))
    whole = job_of("w", pod("w-l", leader=True, gpu=1))
    strict = SchedulerConfig(enforced_shares_only=True)
    # BinPack prefers the fullest node: the failing one, then the promising one.
    assert run_cycle(snapshot([promised, failing], [share])).placements[0].node == "p"
    assert run_cycle(snapshot([failing], [whole])).placements[0].node == "f"  # whole GPUs go
    assert (
        run_cycle(
            snapshot(
                [promised, enforced],
                [share],
            ),
            strict,
        )
        .placements[0]
        .node
        == "e"
    )
    assert run_cycle(snapshot([promised, enforced], [whole]), strict).placements[0].node == "p"
    refused = run_cycle(snapshot([promised, failing], [share]), strict).decisions["s"]
    assert refused.state == ScheduleState.UNSCHEDULED
    assert refused.message.startswith(
        "0/2 nodes fit pod s-l of the gang minimum: 1 GPU shares not enforced there, "
        "1 GPU share enforcement failing there"
    )
    # Failing is for now: a job that fits only there waits, it is not failed as infeasible.
    waits = run_cycle(snapshot([failing], [share]), strict).decisions["s"]
    assert waits.state == ScheduleState.UNSCHEDULED
    assert SchedulerConfig.from_mapping({"enforcedSharesOnly": True}).enforced_shares_only
    with pytest.raises(SchedulerConfigError, match="enforcedSharesOnly: must be true or false"):
        SchedulerConfig.from_mapping({"enforcedSharesOnly": "false"})


def test_a_containers_share_goes_only_where_shares_are_promised() -> None:
    """An agent that holds GPU shares with MPS refuses a container given one (it would run
    unheld there): the core places it where shares are promised, and with
    enforcedSharesOnly nowhere, saying why."""
    enforced = dataclasses.replace(
        node("e", gpus=1, used_cpu=4), shares=SHARES_ENFORCED, containers=True
    )
    promised = dataclasses.replace(node("p", gpus=1), shares=SHARES_PROMISED, containers=True)
    boxed = dataclasses.replace(pod("c-l", leader=True, gpu=0.5), container=True)
    plan = run_cycle(snapshot([enforced, promised], [job_of("c", boxed)]))
    assert [p.node for p in plan.placements] == ["p"]
    strict = run_cycle(
        snapshot([enforced], [job_of("c", boxed)]), SchedulerConfig(enforced_shares_only=True)
    )
    assert not strict.placements
    assert "a container may have whole GPUs only" in strict.decisions["c"].message
    whole = dataclasses.replace(pod("w-l", leader=True, gpu=1), container=True)
    assert [p.node for p in run_cycle(snapshot([enforced], [job_of("w", whole)])).placements] == [
        "e"
    ]
