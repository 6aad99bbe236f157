"""A plain-process pod opens only the GPU device nodes it holds: the kernel refuses it the others
(EPERM), through the v1 devices controller or a cgroup-v2 device program, whatever its
environment says, and with or without memory and CPU limits. A node it holds passes the filter:
the stand-in nodes these tests make carry NVIDIA's numbers (major 195) and mode 0666 but have no
driver behind them, so opening one that passes fails with ENXIO instead. Skipped, saying why,
where the kernel's device control cannot be reached (not root, no controller, no BPF)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from arranger.agent import devices
from arranger.agent.agent import Agent
from arranger.agent.cgroups import Cgroups
from arranger.agent.config import AgentConfig
from arranger.agent.devices import NVIDIA_MAJOR, GpuNodes, Rule
from arranger.agent.discovery import Capacity, GpuDevice
from arranger.states import PodState
from arranger.v1 import job_pb2
from tests.agent.rootagent import local_users, needs_root, order, root_agent, shared_dir
from tests.conftest import GI

GPUS = 4
UVM_MAJOR = 241  # a character major Linux keeps for local use, standing in for nvidia-uvm's
NODES = GpuNodes({}, frozenset(range(GPUS)), (UVM_MAJOR,))

# PROBE opens each stand-in (and /dev/null) for reading and writing and prints what it got:
# "ok", or the errno's name. It first drops CUDA_VISIBLE_DEVICES: the filter does not read it.
PROBE = """
import errno, json, os, sys
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
got = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        got[os.path.basename(path)] = "ok"
    except OSError as exc:
        got[os.path.basename(path)] = errno.errorcode[exc.errno]
print("PROBE " + json.dumps(got, sort_keys=True), flush=True)
"""


def stand_ins(directory: Path) -> list[str]:
    """stand_ins: device nodes with NVIDIA's numbers in `directory`, open to everyone."""
    nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(GPUS)}
    nodes |= {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-uvm": (UVM_MAJOR, 0)}
    for name, (major, minor) in nodes.items():
        path = directory / name
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        os.chmod(path, 0o666)
    return [str(directory / name) for name in nodes] + ["/dev/null"]


def expected(held: set[int]) -> dict[str, str]:
    """expected: what a pod holding GPUs `held` gets from each stand-in and /dev/null."""
    got = {f"nvidia{i}": "ENXIO" if i in held else "EPERM" for i in range(GPUS)}
    control = "ENXIO" if held else "EPERM"
    return got | {"nvidiactl": control, "nvidia-uvm": control, "null": "ok"}


def pids_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def probed(output: str) -> dict[str, str]:
    line = next(line for line in output.splitlines() if line.startswith("PROBE "))
    found: dict[str, str] = json.loads(line.removeprefix("PROBE "))
    return found


@pytest.fixture(scope="module")
def nodes_dir() -> Iterator[list[str]]:
    if os.geteuid() != 0:
        pytest.skip("making device nodes and cgroups needs root")
    with tempfile.TemporaryDirectory(prefix="arranger-dev-") as top:
        os.chmod(top, 0o755)
        try:
            paths = stand_ins(Path(top))
        except OSError as exc:
            pytest.skip(f"cannot make device nodes here: {exc}")
        yield paths


def hierarchies() -> list[tuple[str, Path]]:
    """hierarchies: the cgroup roots this machine has, by the filter each gives: the v1
    devices controller, and a cgroup-v2 hierarchy (the only one, or beside v1's)."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").is_file():
        return [("v2", root)]
    return [("v1", root), ("v2", root / "unified")]


@pytest.fixture(scope="module", params=hierarchies(), ids=lambda h: h[0])
def filtering(request: pytest.FixtureRequest, nodes_dir: list[str]) -> Iterator[Cgroups]:
    """filtering: pod cgroups with the device filter alone (no limits) on one hierarchy."""
    version, root = request.param
    found, why = Cgroups.detect(f"test-dev-{os.getpid()}", False, NODES, root)
    if found is None or not found.isolates:
        pytest.skip(f"no {version} device filter here: {why or (found and found.lacking)}")
    assert found.version == int(version[1])
    yield found
    found.close()
    assert not any(base.exists() for base in found.bases.values()), "pod cgroups were left"


def run_in(cgroups: Cgroups, held: set[int], paths: list[str], name: str) -> dict[str, str]:
    """run_in: what PROBE gets in a new pod cgroup of a pod holding `held`, joined as a shim
    joins it, before the program starts."""
    cgroup = cgroups.create(name, 0, 0, 0, sorted(held))
    try:
        join = 'for f in $PROCS; do echo $$ > "$f" || exit 125; done; exec "$@"'
        done = subprocess.run(
            ["/bin/sh", "-c", join, "sh", sys.executable, "-c", PROBE, *paths],
            env={"PROCS": " ".join(map(str, cgroup.procs)), "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return probed(done.stdout)
    finally:
        cgroup.remove()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(held=st.sets(st.integers(0, GPUS - 1)))
def test_the_kernel_lets_a_pod_open_only_its_own_gpus(
    filtering: Cgroups, nodes_dir: list[str], held: set[int]
) -> None:
    assert run_in(filtering, held, nodes_dir, "probe.0") == expected(held)


def test_outside_a_pod_cgroup_every_stand_in_passes(nodes_dir: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *nodes_dir], capture_output=True, text=True, check=True
    )
    assert probed(done.stdout) == expected(set(range(GPUS)))


def test_rules_refuse_other_gpus_or_every_nvidia_node() -> None:
    nodes = GpuNodes({0: 3, 1: 0}, frozenset({0, 3}), (510, 237))
    assert nodes.denied([0]) == (Rule(NVIDIA_MAJOR, 0),)  # GPU 0 is /dev/nvidia3
    assert nodes.denied([0, 1]) == ()
    assert nodes.denied([]) == (Rule(NVIDIA_MAJOR), Rule(510), Rule(237))
    assert devices.v1_lines(nodes.denied([])) == ["c 195:* rwm", "c 510:* rwm", "c 237:* rwm"]


def test_a_machine_without_nvidia_devices_makes_no_device_cgroups() -> None:
    """With nothing to filter, a pod's cgroup has no devices part (one directory less to make
    per pod on v1), and the node says why its filter is not active."""
    found, why = Cgroups.detect(f"test-nodev-{os.getpid()}", False, GpuNodes())
    if found is None:
        pytest.skip(f"cgroups cannot be used here: {why}")
    try:
        assert "devices" not in found.bases and not found.isolates
        assert found.isolation_detail == "no NVIDIA device on this machine to filter"
    finally:
        found.close()


def test_the_machine_s_gpu_nodes_are_found_by_number(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making device nodes needs root")
    os.mknod(tmp_path / "nvidia7", 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, 7))
    os.mknod(tmp_path / "nvidia9", 0o600 | 0o020000, os.makedev(1, 3))  # not NVIDIA's
    os.mknod(tmp_path / "nvidiactl", 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, 255))
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n237 nvidia-caps\n"
        "\nBlock devices:\n259 blkext\n511 nvidia-not-a-char\n"
    )
    found = GpuNodes.find({0: 0, 1: 1}, tmp_path, tmp_path / "devices", tmp_path / "driver")
    assert found.gpu_minors == {0, 1, 7}
    assert found.majors == (237, 510)
    assert not found.driver
    (tmp_path / "driver").mkdir()  # a loaded driver may make nodes later: there is a filter
    bare = GpuNodes.find({}, tmp_path / "none", tmp_path / "none", tmp_path / "driver")
    assert bare.present and bare.denied([]) == (Rule(NVIDIA_MAJOR),)


@pytest.mark.e2e
@needs_root
async def test_an_agent_s_pods_open_only_their_gpus_and_hold_a_pids_limit() -> None:
    """A root agent with four (fake) GPUs and no memory or CPU limits runs pods as another
    user: one holding GPU 2 opens its node and the control nodes only, one holding none
    opens no NVIDIA node; each holds a pids limit (its own, or the agent's pidsLimit), and
    RLIMIT_NPROC below the kernel's pid_max, not the agent's own."""
    capacity = Capacity(
        4000, 8 * GI, tuple(GpuDevice(i, f"fake-{i}", "FakeGPU", GI, True) for i in range(GPUS))
    )
    show = (
        "import pathlib, resource, threading, time\n"
        "path = next(l.split(':', 2)[2] for l in open('/proc/self/cgroup') if ':pids:' in l\n"
        "            or l.startswith('0::'))\n"
        "for root in ('/sys/fs/cgroup/pids', '/sys/fs/cgroup'):\n"
        "    f = pathlib.Path(root + path.strip()) / 'pids.max'\n"
        "    if f.exists():\n"
        "        print('PIDS', f.read_text().strip())\n"
        "print('NPROC', *resource.getrlimit(resource.RLIMIT_NPROC))\n"
        "stop = threading.Event()\n"
        "count = 0\n"
        "try:\n"
        "    while count < 1000:\n"
        "        threading.Thread(target=stop.wait, daemon=True).start()\n"
        "        count += 1\n"
        "except RuntimeError:\n"
        "    pass\n"
        "stop.set()\n"
        "print('THREADS', count)\n"
    )
    with shared_dir() as top, local_users(1) as (user,):
        paths = stand_ins(top)
        async with root_agent(top, capacity, user=user.pw_name, pids_limit=200) as node:
            sharing = node.agent.gpu_sharing()
            if not sharing.isolation:
                pytest.skip(f"no device filter here: {sharing.isolation_detail}")
            python = node.agent.supervisor.tools.python  # one every user may run
            probe = [python, "-c", PROBE, *paths]
            node.launch(
                order("j1/gpu", probe, gpus=[job_pb2.GpuAssignment(index=2, share=1)]),
                order("j1/none", probe),
                order("j1/pids", [python, "-c", show], pids=64),
                order("j1/default", [python, "-c", show]),
            )
            for uid in ("j1/gpu", "j1/none", "j1/pids", "j1/default"):
                assert (await node.ended(uid)).state == PodState.SUCCEEDED, node.log(uid)
            # The agent finds nvidia-uvm's major in /proc/devices, where the stand-in's is not.
            uvm = {"nvidia-uvm": "ENXIO"}
            assert probed(node.log("j1/gpu")) == expected({2}) | uvm
            assert probed(node.log("j1/none")) == expected(set()) | uvm
            limited, default = node.log("j1/pids"), node.log("j1/default")
            cgroups = node.agent.cgroups
            holds_pids = cgroups is not None and "pids" in cgroups.bases
    pid_max = pids_max()
    for log, pids in ((limited, 64), (default, 200)):
        lines = dict(line.split(" ", 1) for line in log.splitlines() if " " in line)
        if holds_pids:  # where the pids controller holds pods
            assert lines["PIDS"] == str(pids), log
            assert int(lines["THREADS"]) < pids, log
        soft, hard = map(int, lines["NPROC"].split())
        assert soft == hard <= pid_max - 1024, log
    assert sharing.isolation_detail in ("cgroup v1 devices", "cgroup v2 device program")


@pytest.mark.e2e
def test_an_agent_without_device_control_warns_and_its_node_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel's device control cannot be had (here: cgroups that cannot be written,
    as on a read-only hierarchy), the agent warns as it starts and registers its node with
    isolation false and why."""
    why = "cannot write cgroups under /sys/fs/cgroup: Read-only file system"
    monkeypatch.setattr(Cgroups, "detect", classmethod(lambda cls, *args, **kw: (None, why)))
    capacity = Capacity(
        4000, 8 * GI, tuple(GpuDevice(i, f"fake-{i}", "FakeGPU", GI, True) for i in range(2))
    )
    config = AgentConfig(server="127.0.0.1:1", node_name="n1", data_dir=tmp_path, podman="")
    with capture_logs() as lines:
        agent = Agent(config, capacity)
    warned = {line["event"]: line.get("reason") for line in lines}
    assert warned["pods can open every GPU of this machine: no device filter"] == why
    assert warned["pods run without a pids limit"] == why
    sharing = agent._register().gpu_sharing
    assert (sharing.enforced, sharing.isolation, sharing.isolation_detail) == (False, False, why)
    assert agent._register().runtimes == [f"process (no limits: {why})"]
