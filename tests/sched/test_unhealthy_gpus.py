"""Unhealthy GPUs in the pure core: no pod goes to one, no eviction counts on one, a job that
waits for one waits (it may heal) and says so, and kept node arrays follow a GPU's health."""

from __future__ import annotations

import dataclasses

from arranger.sched import GpuShare, JobInfo, NodeInfo, Res, run_cycle
from arranger.sched.nodes import NodeArrays
from arranger.sched.snapshot import RunningPod
from arranger.states import ScheduleState
from tests.sched.builders import GI, job_of, node, pod, same_arrays, snapshot

XID = "XID 79: GPU has fallen off the bus"


def sick(info: NodeInfo, *indexes: int) -> NodeInfo:
    """sick: the node with the GPUs `indexes` unhealthy."""
    gpus = tuple(
        dataclasses.replace(g, problem=XID if g.index in indexes else "") for g in info.gpus
    )
    return dataclasses.replace(info, gpus=gpus)


def holding_gpu(job_id: str, priority: int, gpu: int) -> JobInfo:
    """holding_gpu: a job whose one pod runs on node n holding GPU `gpu` whole."""
    held = Res(1000, GI, 1000)
    running = (RunningPod(f"{job_id}-l", "n", held, gpus=(GpuShare(gpu, 1000),), start_time=0.0),)
    return JobInfo(
        id=job_id,
        name=job_id,
        queue="default",
        priority=priority,
        submit_time=0.0,
        pending=(),
        running=running,
        allocated=held,
        start_time=0.0,
    )


def test_a_pod_goes_to_a_healthy_gpu_and_waits_naming_the_unhealthy_ones() -> None:
    nodes = [sick(node("n", gpus=2), 0)]
    one = job_of("one", pod("one-l", leader=True, gpu=1))
    assert run_cycle(snapshot(nodes, [one])).placements[0].gpus == (GpuShare(1, 1000),)
    both = job_of("both", pod("both-l", leader=True, gpu=2))
    decision = run_cycle(snapshot(nodes, [both])).decisions["both"]
    # It waits, not Infeasible: the GPU may heal (its agent restarted).
    assert decision.state == ScheduleState.UNSCHEDULED
    assert decision.message.startswith(
        "0/1 nodes fit pod both-l of the gang minimum: 1 GPUs unhealthy there"
    ), decision.message
    half = job_of("half", pod("half-l", leader=True, gpu=0.5))
    only_sick = [sick(node("n", gpus=1), 0), node("m", gpus=1, gpu_used=[1000])]
    decision = run_cycle(snapshot(only_sick, [half])).decisions["half"]
    assert "1 GPUs unhealthy there, 1 insufficient gpu" in decision.message, decision.message


def test_no_share_goes_to_an_unhealthy_gpu_its_pods_share() -> None:
    nodes = [sick(node("n", gpus=2, gpu_used=[500, 0]), 0)]
    half = job_of("half", pod("half-l", leader=True, gpu=0.5))
    # Shares pack onto the fullest GPU with room: GPU 0, were it healthy.
    assert run_cycle(snapshot(nodes, [half])).placements[0].gpus == (GpuShare(1, 500),)


def test_evicting_the_pods_on_an_unhealthy_gpu_makes_no_room() -> None:
    low = holding_gpu("low", 1, 0)
    high = job_of("high", pod("high-l", leader=True, gpu=1), priority=9)
    healthy = [node("n", gpus=1, gpu_used=[1000])]
    assert [e.pod for e in run_cycle(snapshot(healthy, [low, high])).evictions] == ["low-l"]
    plan = run_cycle(snapshot([sick(healthy[0], 0)], [low, high]))
    assert plan.evictions == [] and plan.placements == []  # low runs on where it is


def test_kept_node_arrays_follow_a_gpus_health() -> None:
    well = node("n", gpus=2, gpu_used=[250, 0])
    kept = NodeArrays([well])
    kept.update({"n": sick(well, 0)})
    assert same_arrays(kept, NodeArrays([sick(well, 0)]))
    assert kept.gpu_used == [[1000, 0]] and kept.gpu_sick == [frozenset({0})]
    assert kept.free_whole.tolist() == [1] and kept.gpu_unhealthy.tolist() == [1]
    empty = kept.emptied()  # could a job ever fit: once healed, the GPU is there
    assert empty.free_whole.tolist() == [2] and empty.gpu_unhealthy.tolist() == [0]
    kept.update({"n": well})
    assert same_arrays(kept, NodeArrays([well]))
