"""Pods run as the user the agent config names; arranger-agent as root will not run them as root
unless told so."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from arranger.agent.config import (
    AgentConfig,
    AgentConfigError,
    check_pods_not_root,
    load_agent_config,
    pod_user,
)
from arranger.agent.orders import LaunchOrder
from arranger.agent.runs import PodRun
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching users needs root")


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


@needs_root
async def test_a_pod_runs_as_the_configured_user() -> None:
    who = nobody()
    with tempfile.TemporaryDirectory() as top:  # pytest's own are private to root
        os.chmod(top, 0o755)  # the user must reach its scratch directory inside
        await _runs_as(Path(top), who)


async def _runs_as(tmp_path: Path, who: pwd.struct_passwd) -> None:
    ended: list[PodRun] = []
    done = asyncio.Event()

    def changed(run: PodRun) -> None:
        if run.ended.is_set():
            ended.append(run)
            done.set()

    supervisor = Supervisor(
        "n1", "127.0.0.1", tmp_path / "agent", changed, user=pod_user(AgentConfig(user="nobody"))
    )
    order = LaunchOrder(
        uid="j1/p",
        attempt=0,
        job_id="j1",
        pod_name="p",
        command=("/bin/sh", "-c", 'echo "$(id -u) $(id -g) $USER $(pwd)"'),
    )
    supervisor.launch(order)
    await asyncio.wait_for(done.wait(), 30)
    run = ended[0]
    log = supervisor.files.log_path("j1/p", 0).read_text()
    assert run.state == PodState.SUCCEEDED, log
    uid, gid, user, cwd = log.split()
    assert (int(uid), int(gid), user) == (who.pw_uid, who.pw_gid, "nobody")
    assert cwd == str(supervisor.files.scratch_dir("j1/p"))
    # The pod cannot touch what the agent (root) writes: run records and exit codes.
    runs = supervisor.files.record_path("j1/p").parent
    assert runs.stat().st_uid == 0 and not runs.stat().st_mode & 0o022
    assert supervisor.files.exit_path("j1/p", 0).stat().st_uid == 0


def test_an_agent_running_as_root_must_name_a_user_for_its_pods(tmp_path: Path) -> None:
    if not ROOT:
        check_pods_not_root(AgentConfig())  # not root: nothing to refuse
        return
    with pytest.raises(AgentConfigError, match="set runAs: owner"):
        check_pods_not_root(AgentConfig())
    check_pods_not_root(AgentConfig(run_as_root=True))
    check_pods_not_root(AgentConfig(user="nobody"))
    check_pods_not_root(AgentConfig(run_as="owner"))
    daemon = subprocess.run(
        [
            sys.executable,
            "-m",
            "arranger.agent.main",
            "--server",
            "127.0.0.1:1",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert daemon.returncode == 1 and "set runAs: owner" in daemon.stderr


def test_an_unknown_user_is_refused() -> None:
    with pytest.raises(AgentConfigError, match="no user named"):
        pod_user(AgentConfig(user="no-such-user-here"))


def test_run_as_owner_is_the_only_run_as_and_excludes_user(tmp_path: Path) -> None:
    settings = tmp_path / "agent.yaml"
    settings.write_text("runAs: owner\n")
    assert load_agent_config(settings).run_as == "owner"
    settings.write_text("runAs: somebody\n")
    with pytest.raises(AgentConfigError, match="runAs: must be owner"):
        load_agent_config(settings)
    settings.write_text("runAs: owner\nuser: nobody\n")
    with pytest.raises(AgentConfigError, match="runAs and user exclude each other"):
        load_agent_config(settings)
    if not ROOT:
        with pytest.raises(AgentConfigError, match="only an agent running as root"):
            pod_user(AgentConfig(run_as="owner"))
