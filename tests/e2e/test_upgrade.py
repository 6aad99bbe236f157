"""An upgrade from the previous release kills nothing, in either order.

The previous release's server and agent run from its own source (`git archive` of its
commit: the newest release tag other than this commit's, or, before the first tag, the
commit this release's work started from), as real processes with real pods. Then each
daemon is stopped with SIGTERM (what systemd sends) and this release's started over the
same store and data directory: servers first, or agents first (a new agent joining the old
server). Counted at the end: every pod process is the one that ran before, the job is still
Running, and no restart was charged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import yaml

import arranger
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import eventually, job_spec, script
from tests.e2e.test_agent_crash import alive
from tests.e2e.test_agent_restart import stop_pods_of

ROOT = Path(__file__).resolve().parents[2]
# The commit this release's work started from, while no release is tagged.
BEFORE_THE_FIRST_TAG = "e7764361a31384a01fd5dac9e4a7fdca10f9d9e5"
WAITS = "import signal\nsignal.pause()  # runs until stopped\n"


def _git(*args: str) -> str:
    ran = subprocess.run(
        ["git", "-C", str(ROOT), *args], check=False, capture_output=True, text=True, timeout=60
    )
    return ran.stdout.strip() if ran.returncode == 0 else ""


def previous_release() -> str:
    """previous_release: the commit of the previous release ("" if this checkout has none)."""
    if shutil.which("git") is None or not _git("rev-parse", "--git-dir"):
        return ""
    head = _git("rev-parse", "HEAD")
    for tag in _git("tag", "--list", "v*", "--sort=-v:refname").splitlines():
        commit = _git("rev-list", "-n", "1", tag)
        if commit and commit != head:
            return commit
    return BEFORE_THE_FIRST_TAG if _git("cat-file", "-t", BEFORE_THE_FIRST_TAG) else ""


@pytest.fixture(scope="module")
def old_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """old_source: the previous release's source tree, to run with PYTHONPATH."""
    commit = previous_release()
    if not commit:
        pytest.skip("no previous release here: not a git checkout, or a shallow one")
    yield source_of(commit, tmp_path_factory)


def source_of(commit: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """source_of: the source tree of a commit, to run with PYTHONPATH."""
    out = tmp_path_factory.mktemp("previous")
    archive = out / "source.tar"
    _git("archive", "--format=tar", f"--output={archive}", commit)
    with tarfile.open(archive) as tar:
        tar.extractall(out / "source", filter="data")
    return out / "source"


class Daemon:
    """Daemon: arranger-server or arranger-agent from `source` (None: this release), as its
    own process group, logging to a file."""

    def __init__(self, module: str, config: Path, source: Path | None, log: Path) -> None:
        self.command = [sys.executable, "-m", module, "--config", str(config)]
        self.env = dict(os.environ)
        self.env.pop("PYTHONPATH", None)
        if source is not None:
            self.env["PYTHONPATH"] = str(source)
        # `python -m` looks in its working directory first: not in this checkout's.
        self.cwd = source if source is not None else log.parent
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, *extra: str) -> None:
        subprocess.run(
            [*self.command, *extra], check=True, env=self.env, cwd=self.cwd, capture_output=True
        )

    def imports(self) -> Path:
        """imports: the arranger package this daemon's Python imports."""
        ran = subprocess.run(
            [sys.executable, "-c", "import arranger; print(arranger.__file__)"],
            check=True,
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Path(ran.stdout.strip())

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        """stop: SIGTERM, as systemd sends, and wait."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def cluster_of(directory: Path, old: Path) -> AsyncIterator[tuple[str, dict[str, Path]]]:
    """cluster_of: configuration for one server and one agent, cleaned up after (pods
    included); yields the server's address and the config files."""
    address = f"127.0.0.1:{free_port()}"
    server = {
        "insecure": True,
        "listen": address,
        "dataDir": str(directory / "server"),
        "httpListen": "",
        "schedulePeriodSeconds": 0.2,
        "heartbeatIntervalSeconds": 0.5,
        "fenceTimeoutSeconds": 30,
        "nodeTimeoutSeconds": 45,
        "killGraceSeconds": 2,
    }
    agent = {
        "server": address,
        "nodeName": "upgraded",
        "address": "127.0.0.1",
        "dataDir": str(directory / "agent"),
        "runAsRoot": os.geteuid() == 0,
    }
    configs = {"server": directory / "server.yaml", "agent": directory / "agent.yaml"}
    configs["server"].write_text(yaml.safe_dump(server))
    configs["agent"].write_text(yaml.safe_dump(agent))
    try:
        yield address, configs
    finally:
        stop_pods_of(directory / "agent")


async def status_of(client: AsyncClient) -> tuple[str, int, list[int]]:
    """status_of: the job's stage, restarts charged and pod process ids, [] if unknown."""
    job = (await client.get("steady")).status
    restarts = next((j.progress.restarts for j in await client.jobs() if j.name == "steady"), -1)
    return job.stage, restarts, [job.leader.pid, *(w.pid for w in job.workers)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("order", ["servers first", "agents first"])
async def test_an_upgrade_from_the_previous_release_kills_nothing(
    tmp_path: Path, old_source: Path, order: str
) -> None:
    async with cluster_of(tmp_path, old_source) as (address, configs):
        logs = tmp_path / "daemons.log"
        old_server = Daemon("arranger.server.main", configs["server"], old_source, logs)
        old_agent = Daemon("arranger.agent.main", configs["agent"], old_source, logs)
        new_server = Daemon("arranger.server.main", configs["server"], None, logs)
        new_agent = Daemon("arranger.agent.main", configs["agent"], None, logs)
        daemons = [old_server, old_agent, new_server, new_agent]
        try:
            old_server.run("--init")
            old_server.start()
            old_agent.start()
            async with AsyncClient(address, timeout_s=10) as client:

                def heard_since(since: float) -> Callable[[], Awaitable[bool]]:
                    """heard_since: the node is Ready and its agent heartbeated after `since`
                    (a node restored from the store is Ready before its agent is back)."""

                    async def check() -> bool:
                        with contextlib.suppress(ArrangerError):
                            for node in await client.nodes():
                                if node.name == "upgraded" and node.state == "Ready":
                                    return node.last_heartbeat.ToMicroseconds() / 1e6 > since
                        return False

                    return check

                await eventually(heard_since(0.0), timeout_s=60, what="the old agent to join")
                waits = script(tmp_path, "waits", WAITS)
                await client.submit(job_spec("steady", leader=waits, workers=2))

                async def steady() -> bool:
                    with contextlib.suppress(ArrangerError):
                        stage, _, pids = await status_of(client)
                        return stage == "Running" and all(pids) and len(pids) == 3
                    return False

                await eventually(steady, timeout_s=60, what="the job to run on the old release")
                # The old daemons run the previous release's code, not this checkout's.
                assert old_agent.imports() == old_source / "arranger" / "__init__.py"
                _, _, pids = await status_of(client)
                steps = (
                    [(old_server, new_server), (old_agent, new_agent)]
                    if order == "servers first"
                    else [(old_agent, new_agent), (old_server, new_server)]
                )
                for old, new in steps:
                    old.stop()
                    since = time.time()
                    new.start()
                    await eventually(heard_since(since), timeout_s=60, what="the node back")
                    await eventually(steady, timeout_s=60, what="the job running")
                    assert all(alive(pid) for pid in pids)
                assert new_agent.imports() != old_agent.imports()  # this release's daemons
                assert (tmp_path / "agent" / "agent-id").exists()  # made by this release's agent
                stage, restarts, now = await status_of(client)
                assert (stage, restarts, now) == ("Running", 0, pids), logs.read_text()[-3000:]
                versions = {n.name: n.agent_version for n in await client.nodes()}
                assert versions == {"upgraded": arranger.__version__}
        finally:
            for daemon in reversed(daemons):
                daemon.stop()
