"""The agent's half of the process environment: ports, GPUs, shares, MPS."""

from __future__ import annotations

from pathlib import Path

from arranger.agent.supervisor import Supervisor
from arranger.v1 import agent_pb2


def environment(tmp_path: Path, order: agent_pb2.LaunchPod, mps: bool = False) -> dict[str, str]:
    supervisor = Supervisor("n1", "10.0.0.1", tmp_path, lambda run: None, mps=mps)
    return supervisor._environment(order, {"rpc": 4000}, tmp_path / "scratch")


def test_a_gpu_share_is_exported_with_its_device_and_mps_percentage(tmp_path: Path) -> None:
    order = agent_pb2.LaunchPod(pod_uid="j/p", env={"A": "1"}, leader_port_name="rpc")
    order.gpus.add(index=3, share=0.25)
    env = environment(tmp_path, order, mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["ARRANGER_GPU_FRACTION"] == "0.25"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["ARRANGER_LEADER_ADDR"] == "10.0.0.1:4000" and env["ARRANGER_PORT_RPC"] == "4000"
    assert env["A"] == "1" and env["ARRANGER_NODE_NAME"] == "n1"


def test_whole_gpus_and_no_gpus(tmp_path: Path) -> None:
    whole = agent_pb2.LaunchPod(pod_uid="j/p")
    whole.gpus.add(index=0, share=1.0)
    whole.gpus.add(index=2, share=1.0)
    env = environment(tmp_path, whole, mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and "ARRANGER_GPU_FRACTION" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert environment(tmp_path, agent_pb2.LaunchPod(pod_uid="j/q"))["CUDA_VISIBLE_DEVICES"] == ""
