"""A store of the release before packages had owners (0.1.0), made by its own server (a real
process, from its own source: see test_upgrade), on each store backend, opened by this
release's server: each package a job names belongs to that job's owner, one no job names to no
one (admins alone may read it until it is pruned), and the `default` queue keeps the policy it
had, the admin told how to cap it."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from arranger.client.package import ship
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, eventually, job_spec
from tests.e2e.test_upgrade import Daemon, _git, free_port, source_of

BEFORE_OWNERS = "v0.1.0"  # the last release whose packages had no owners


@pytest.fixture(scope="module")
def old_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """old_source: the source tree of the release before package owners."""
    commit = _git("rev-list", "-n", "1", BEFORE_OWNERS)
    if not commit:
        pytest.skip(f"no tag {BEFORE_OWNERS} here: not a git checkout, or a shallow one")
    return source_of(commit, tmp_path_factory)


@pytest.mark.timeout(180)
async def test_packages_of_the_release_before_owners_get_their_jobs_owners(
    tmp_path: Path, old_source: Path, store_url: str
) -> None:
    address = f"127.0.0.1:{free_port()}"
    settings = {
        "insecure": True,
        "listen": address,
        "dataDir": str(tmp_path / "server"),
        "store": store_url,
        "httpListen": "",
    }
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump(settings))
    trees = {}
    for name in ("named", "loose"):
        trees[name] = tmp_path / name
        trees[name].mkdir()
        (trees[name] / "train.py").write_text(f"print({name!r})\n")
    old = Daemon("arranger.server.main", config, old_source, tmp_path / "old-server.log")
    try:
        old.run("--init")
        old.start()
        async with AsyncClient(address, timeout_s=10) as client:

            async def serving() -> bool:
                with contextlib.suppress(ArrangerError):
                    return bool(await client.queues())
                return False

            await eventually(serving, timeout_s=60, what="the previous release's server")
            await client.submit(job_spec("named", ["python", "train.py"]), trees["named"])
            loose = (await ship(client, trees["loose"])).package  # no job names it
            named = (await client.get("named")).spec.package
            assert named.sha256 and loose.sha256 != named.sha256
    finally:
        old.stop()
    assert old.imports() == old_source / "arranger" / "__init__.py"

    new = dataclasses.replace(
        FAST, listen="127.0.0.1:0", data_dir=tmp_path / "server", store=store_url, migrate=True
    )
    with capture_logs() as logs:
        server = ArrangerServer(new)
        await server.start()
        try:
            job = server.controller.view.find("named")
            assert job is not None and job.owner
            store = server.store
            assert await store.package_size(named.sha256, job.owner) == named.size
            assert await store.package_bytes(job.owner) == named.size
            assert await store.package_size(loose.sha256, job.owner) is None  # no one's ...
            assert await store.package_size(loose.sha256) == loose.size  # ... yet still held
            assert server.controller.queues["default"].max_priority is None  # as it was
        finally:
            await server.stop()
    assert any(
        e["log_level"] == "warning" and e["event"].startswith("queue 'default' has no maxPriority")
        for e in logs
    )
