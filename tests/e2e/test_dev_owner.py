"""`arranger dev` on a machine other accounts share serves its owner alone. It still listens
on 127.0.0.1 and needs no token flag from its owner (the login it leaves is found by address),
while another real account, running the real CLI or raw gRPC calls, is refused: no job list,
no submit, no agent registered in its name. The dashboard URL it prints logs in its owner."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.cookiejar import CookieJar
from pathlib import Path

import grpc
import pytest

from arranger.agent.config import AgentConfigError, load_agent_config
from arranger.client.dev import DevCluster
from arranger.client.logins import dev_login
from arranger.server.store.server_lock import hold_directory
from arranger.v1 import agent_pb2, agent_pb2_grpc, arranger_pb2, arranger_pb2_grpc
from tests.agent.rootagent import local_users
from tests.conftest import running_cluster

REPO = Path(__file__).resolve().parents[2]


# Run as another account, the CLI first runs the same command as root against a port where
# no server listens, so that it has imported all it needs: this interpreter may lie where that
# account cannot read (root's home). Then it becomes that account and runs it for real.
AS_USER = """
import contextlib, io, os, sys
import arranger.client.cli as cli
uid, gid, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
dry = ["127.0.0.1:9" if word == os.environ["SERVER"] else word for word in argv]
with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
    cli.main(dry)
os.setgroups([]); os.setgid(gid); os.setuid(uid)
sys.exit(cli.main(argv))
"""


async def cli(
    *argv: str, user: pwd.struct_passwd | None = None, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """cli: the real `arranger` command, as this account or as `user` (with `home` as its
    home and state directory), run beside the cluster's loop."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ARRANGER_TOKEN", None)
    command = [sys.executable, "-m", "arranger.client.cli", *argv]
    if user is not None:
        assert home is not None
        env.update(
            HOME=str(home), XDG_STATE_HOME=str(home / "state"), USER=user.pw_name, SERVER=argv[1]
        )
        command = [sys.executable, "-c", AS_USER, str(user.pw_uid), str(user.pw_gid), *argv]
    return await asyncio.to_thread(
        subprocess.run,
        command,
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextmanager
def home_of(user: pwd.struct_passwd) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="arranger-intruder-") as top:
        home = Path(top)
        os.chown(home, user.pw_uid, user.pw_gid)
        yield home


JOB = """
apiVersion: arranger/v1
kind: TYJob
metadata: {name: mine}
spec:
  leader: {name: learner, template: {command: [/bin/sleep, "60"], resources: {cpu: 100m}}}
  workerSets:
    - {name: actors, counts: 1, template: {command: [/bin/sleep, "60"], resources: {cpu: 100m}}}
"""


async def test_the_owner_needs_no_token_and_another_account_is_refused(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "dev") as cluster:
        address = cluster.address
        assert dev_login(address) == cluster.token
        login = cluster.login_file
        assert login is not None and login.stat().st_mode & 0o777 == 0o600
        assert login.parent.stat().st_mode & 0o777 == 0o700

        spec = tmp_path / "job.yaml"
        spec.write_text(JOB)
        owner = await cli("--server", address, "submit", str(spec))
        assert owner.returncode == 0, owner.stderr
        listed = await cli("--server", address, "list", "-o", "json")
        assert listed.returncode == 0 and "mine" in listed.stdout, listed.stderr

        with local_users(1) as (intruder,), home_of(intruder) as home:
            theirs = home / "job.yaml"
            theirs.write_text(JOB.replace("mine", "theirs"))
            for argv in (("list",), ("submit", str(theirs)), ("nodes",)):
                seen = await cli("--server", address, *argv, user=intruder, home=home)
                assert seen.returncode != 0, seen.stdout
                assert "token" in seen.stderr, seen.stderr
                assert "mine" not in seen.stdout
            # The login file is its owner's alone.
            stolen = await cli(
                "--server", address, "--token-file", str(login), "list", user=intruder, home=home
            )
            assert stolen.returncode != 0 and "mine" not in stolen.stdout
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await arranger_pb2_grpc.ArrangerStub(channel).ListJobs(
                    arranger_pb2.ListJobsRequest(), timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert [j["name"] for j in json.loads(listed.stdout)] == ["mine"]


async def test_no_agent_joins_without_the_clusters_secret(tmp_path: Path) -> None:
    """A process that is not one of dev's agents cannot register a node (it would be given
    pods, and their job tokens)."""
    async with running_cluster(tmp_path / "dev") as cluster:
        register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="intruder"))
        for metadata in ((), (("authorization", f"Bearer {cluster.token}"),)):
            async with grpc.aio.insecure_channel(cluster.address) as channel:
                call = agent_pb2_grpc.AgentServiceStub(channel).Connect(
                    iter([register]), metadata=metadata, timeout=10
                )
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in call:
                        pass
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "intruder" not in cluster.server.links


def test_the_printed_dashboard_url_logs_its_owner_in(tmp_path: Path) -> None:
    async def pages() -> tuple[int, str, str]:
        async with running_cluster(tmp_path / "dev") as cluster:
            return await asyncio.to_thread(_visit, cluster)

    anonymous, logged_in, owner = asyncio.run(pages())
    assert anonymous == 200  # the login page, after its redirect
    assert "Log in" in logged_in or owner in logged_in
    assert owner in logged_in


def _visit(cluster: DevCluster) -> tuple[int, str, str]:
    base = cluster.server.web.url
    with urllib.request.urlopen(f"{base}/jobs", timeout=10) as page:
        anonymous, where = page.status, page.url
    assert where.endswith("/login")
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    with opener.open(cluster.dashboard_url, timeout=10) as page:
        assert not page.url.endswith("/login"), page.url
        text = page.read().decode()
    return anonymous, text, pwd.getpwuid(os.geteuid()).pw_name


def test_a_busy_data_directory_and_a_bad_agent_config_are_one_line(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    held = hold_directory(data / "arranger.db", create=True)  # as a running server holds it
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "arranger.client.cli",
                "dev",
                "--data-dir",
                str(data),
                "--port",
                "0",
                "--dashboard-port",
                "0",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        if held is not None:
            os.close(held)
    assert done.returncode == 1
    assert done.stderr.startswith("error: another arranger-server"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr

    given = tmp_path / "agent.yaml"
    given.write_text("server: 127.0.0.1:1\nfakeGpus: 2\n")
    assert load_agent_config(given).fake_gpus == 2  # a count, as --fake-gpus takes
    given.write_text("server: 127.0.0.1:1\nfakeGpus: [2]\n")
    with pytest.raises(AgentConfigError, match=r"fakeGpus: must be \{count: N, model: NAME\}"):
        load_agent_config(given)
    given.write_text("server: 127.0.0.1:1\nlabels: zone-a\n")
    with pytest.raises(AgentConfigError, match=r"labels: must be \{NAME: VALUE, ...\}"):
        load_agent_config(given)
