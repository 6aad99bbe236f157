"""A container's volumes reach no further on the host than their hostPaths say. A hostPath
through a symbolic link is refused (rootful podman would follow it, and runc would then make
mount points and working directories as root wherever it leads: an empty /etc/nologin, say), as
is a missing one, and a mount point or working directory that runc would have to make inside a
volume on the host; the pod fails with a reason that names the volume and never a path. Real
files, real podman (skipped where it cannot run the test image)."""

from __future__ import annotations

import dataclasses
import os
import pwd
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from arranger.agent.accounts import Accounts
from arranger.agent.config import AgentConfigError, PodUser, load_agent_config
from arranger.agent.host_paths import NOT_NORMALISED, Mount, problems
from arranger.agent.orders import Volume
from arranger.agent.podman import Podman
from arranger.states import PodState
from tests.agent.rootagent import local_users, shared_dir
from tests.agent.test_podman import Agent, order
from tests.containers import busybox_image, containers_of


@pytest.fixture
def top() -> Iterator[Path]:
    """top: a directory every user may pass, holding `allowed` (where hostPaths lie) and
    `outside` (where a link in `allowed` leads, standing for /etc)."""
    with shared_dir() as found:
        (found / "allowed").mkdir()
        (found / "outside").mkdir()
        (found / "allowed" / "link").symlink_to(found / "outside")
        (found / "allowed" / "file").touch()
        yield found


def volume(name: str, host: Path, mount: str) -> Mount:
    return Mount(f"volume {name}", str(host), mount)


# What is refused, on real files.


def test_a_hostpath_through_a_link_or_missing_is_refused_naming_the_volume(top: Path) -> None:
    allowed = top / "allowed"
    found = problems([volume("data", allowed / "link", "/mnt/a")], None)
    assert found == [
        "volume data: hostPath goes through a symbolic link, which the agent does not follow"
    ]
    below = problems([volume("deep", allowed / "link" / "sub", "/mnt/a")], None)
    assert below and "symbolic link" in below[0]  # a link above the last component too
    gone = problems([volume("gone", allowed / "nowhere", "/mnt/a")], None)
    assert gone == ["volume gone: hostPath does not exist on this node"]
    odd = problems([Mount("volume odd", f"{allowed}/./file", "/f")], None)
    assert odd == [f"volume odd: hostPath {NOT_NORMALISED}"]
    for reason in found + below + gone + odd:
        assert str(top) not in reason  # another user may read a pod's reason
    assert (
        problems([volume("data", allowed, "/mnt/a"), volume("f", allowed / "file", "/f")], "/")
        == []
    )


def test_a_node_of_its_own_allowed_host_paths_checks_them_again(top: Path, tmp_path: Path) -> None:
    allowed, outside = top / "allowed", top / "outside"
    mine = [str(allowed)]
    assert problems([volume("data", allowed / "file", "/f")], None, allowed=mine) == []
    refused = problems([volume("etc", outside, "/mnt/e")], None, allowed=mine)
    assert refused == ["volume etc: hostPath is not under a prefix of this node's allowedHostPaths"]
    assert problems([volume("etc", outside, "/mnt/e")], None) == []  # the server's check alone
    config = tmp_path / "agent.yaml"
    config.write_text(f"server: 127.0.0.1:1\nallowedHostPaths: [{allowed}]\n")
    assert load_agent_config(config).allowed_host_paths == (str(allowed),)
    config.write_text("server: 127.0.0.1:1\nallowedHostPaths: [/data/../etc]\n")
    with pytest.raises(AgentConfigError, match="is not a normalised absolute path"):
        load_agent_config(config)


def test_what_runc_would_make_inside_a_volume_is_refused(top: Path) -> None:
    allowed = top / "allowed"
    data = volume("data", allowed, "/mnt/a")
    nested = volume("flag", allowed / "file", "/mnt/a/nologin")
    found = problems([data, nested], "/mnt/a/newdir")
    assert len(found) == 2, found
    assert found[0].startswith(
        "volume flag: mountPath lies in volume data, where it does not exist"
    )
    assert found[1].startswith("workingDir lies in volume data, where it does not exist")
    assert all("as root" in reason and str(top) not in reason for reason in found)
    # Through a link inside the volume: where runc would make it is not for the agent to follow.
    assert "symbolic link" in problems([data], "/mnt/a/link/newdir")[0]
    # Podman's own mount points (/etc/hosts, ...) inside a volume mounted at /etc.
    made = problems([volume("etc", allowed, "/etc")], None, ["/etc/hosts"])
    assert made and made[0].startswith("podman's mount point /etc/hosts lies in volume etc")
    # What is there is fine, as is the volume's own top and anything in the image's files.
    (allowed / "newdir").mkdir()
    (allowed / "nologin").touch()
    assert problems([data, nested], "/mnt/a/newdir") == []
    assert problems([data], "/mnt/a") == []
    assert problems([data], "/work/elsewhere") == []


def test_no_volume_goes_on_the_runtimes_own_directories(top: Path) -> None:
    allowed = top / "allowed"
    for mount_path in ("/dev", "/proc/", "//sys", "/"):
        found = problems([volume("sys", allowed, mount_path)], None)
        assert found == [
            "volume sys: mountPath may not be /dev, /proc or /sys, nor a directory above one"
        ]
    assert (
        problems([volume("shm", allowed, "/dev/shm"), volume("d", allowed, "/device")], None) == []
    )


def test_the_agents_own_scratch_may_lie_behind_a_link(top: Path) -> None:
    scratch = Mount("scratch", str(top / "allowed" / "link"), "/arranger/scratch", trusted=True)
    assert problems([scratch], "/arranger/scratch") == []
    missing = problems([scratch], "/arranger/scratch/work")
    assert missing and missing[0].startswith("workingDir lies in scratch, where it does not exist")


# The attack, with real podman: a root agent's container, run as an account of its own.


@pytest.fixture
def podman() -> Podman:
    return busybox_image()


@pytest.fixture
async def agent(tmp_path: Path, podman: Podman) -> AsyncIterator[Agent]:
    if os.geteuid() != 0:
        pytest.skip("rootful podman needs this test to run as root")
    node = f"test-paths-{os.getpid()}"
    with local_users(1) as (user,):
        accounts = Accounts(node, fixed=PodUser.of(pwd.getpwnam(user.pw_name)))
        a = Agent(tmp_path / "agent", podman, node, accounts=accounts)
        try:
            yield a
        finally:
            await a.supervisor.shutdown(grace_s=1)
            assert containers_of(podman, node) == [], "containers were left behind"


async def test_a_link_in_an_allowed_hostpath_makes_nothing_where_it_leads(
    agent: Agent, top: Path
) -> None:
    allowed = top / "allowed"
    volumes = (
        Volume("data", str(allowed / "link"), "/mnt/a"),
        Volume("flag", str(allowed / "file"), "/mnt/a/nologin"),
    )
    launch = order("j1/p", "pwd", working_dir="/mnt/a/newdir", volumes=volumes)
    agent.supervisor.launch(launch)
    run = await agent.finished("j1/p")
    assert run.state == PodState.FAILED, agent.log("j1/p")
    assert run.reason.startswith("ContainerError: volume data: hostPath goes through a symbolic")
    assert str(top) not in run.reason
    assert sorted(os.listdir(top / "outside")) == []  # runc made no nologin, no newdir there


async def test_a_mount_point_missing_in_a_volume_is_not_made_there_by_root(
    agent: Agent, top: Path
) -> None:
    data = top / "allowed" / "data"
    data.mkdir()
    volumes = (
        Volume("data", str(data), "/mnt/a"),
        Volume("flag", str(top / "allowed" / "file"), "/mnt/a/nologin"),
    )
    launch = order("j2/p", "pwd", working_dir="/mnt/a/newdir", volumes=volumes)
    agent.supervisor.launch(launch)
    run = await agent.finished("j2/p")
    assert run.state == PodState.FAILED, agent.log("j2/p")
    assert "volume flag: mountPath lies in volume data, where it does not exist" in run.reason
    assert "workingDir lies in volume data" in run.reason
    assert os.listdir(data) == []
    # Once they are there, the same pod runs, in its working directory inside the volume.
    (data / "newdir").mkdir(mode=0o755)
    (data / "nologin").touch()
    launch = dataclasses.replace(launch, uid="j3/p", job_id="j3")
    agent.supervisor.launch(launch)
    run = await agent.finished("j3/p")
    assert (run.state, agent.log("j3/p")) == (PodState.SUCCEEDED, "/mnt/a/newdir\n")
