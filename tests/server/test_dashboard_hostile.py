"""The dashboard's HTTP port against hostile requests: a real server with real agents on
127.0.0.1, asked over real HTTP."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server import dashboard
from tests.conftest import bare_server, eventually, job_spec, script
from tests.server.test_auth import issue, secured

SLEEPS = "import signal\nsignal.pause()  # runs until stopped\n"


async def test_an_offset_out_of_range_is_refused_and_leaves_no_request_behind(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleeps = script(tmp_path, "sleeps.py", SLEEPS)
    await client.submit(job_spec("quiet", leader=sleeps))
    view = cluster.server.controller.view
    await eventually(lambda: view.find("quiet").stage.value == "Running", what="the job to run")
    job = view.find("quiet")
    link = cluster.server.links[job.leader.node]
    url = f"{cluster.server.web.url}/api/jobs/{job.id}/log"
    async with aiohttp.ClientSession() as http:
        for offset in (str(2**63), str(-(2**63) - 1), "9" * 4000):
            async with http.get(url, params={"offset": offset}) as reply:
                assert reply.status == 400, await reply.text()
        async with http.get(url, params={"offset": "0"}) as reply:
            assert reply.status == 200
    assert not link._logs


async def test_a_login_form_from_an_opaque_origin_is_refused(cluster: DevCluster) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"{cluster.server.web.url}/login"
        for origin, site, status in [
            ("null", "cross-site", 403),  # a sandboxed frame of another site
            ("null", "same-site", 403),
            ("http://evil.example", None, 403),
            ("null", "same-origin", 401),  # this site's own form under no-referrer
        ]:
            headers = {"Origin": origin} | ({"Sec-Fetch-Site": site} if site else {})
            async with http.post(url, data={"token": "x"}, headers=headers,
                                 allow_redirects=False) as reply:  # fmt: skip
                assert reply.status == status, (origin, site, reply.status)


async def login(http: aiohttp.ClientSession, web: str, token: str) -> None:
    async with http.post(f"{web}/login", data={"token": token}, allow_redirects=False) as reply:
        assert reply.status == 303, reply.status


async def test_one_token_logging_in_again_and_again_ends_no_one_elses_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "MAX_SESSIONS", 8)
    monkeypatch.setattr(dashboard, "MAX_SESSIONS_PER_TOKEN", 4)
    async with secured(tmp_path) as cluster:
        alice = await issue(cluster, "alice", capsys)
        bob = await issue(cluster, "bob", capsys)
        jars = aiohttp.CookieJar(unsafe=True), aiohttp.CookieJar(unsafe=True)  # 127.0.0.1's
        async with (
            aiohttp.ClientSession(cookie_jar=jars[0]) as alice_http,
            aiohttp.ClientSession(cookie_jar=jars[1]) as bob_http,
        ):
            await login(alice_http, cluster.web, alice)
            for _ in range(3 * dashboard.MAX_SESSIONS):
                bob_http.cookie_jar.clear()
                await login(bob_http, cluster.web, bob)
            async with alice_http.get(f"{cluster.web}/jobs", allow_redirects=False) as reply:
                assert reply.status == 200, reply.status
            async with bob_http.get(f"{cluster.web}/jobs", allow_redirects=False) as reply:
                assert reply.status == 200, reply.status


async def test_a_query_value_stays_one_value_in_the_links_made_of_it(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server, aiohttp.ClientSession() as http:
        url = f"{server.web.url}/jobs"
        async with http.get(url, params={"stage": 'x&mine=0"<'}) as reply:
            page = await reply.text()
        assert 'href="/jobs?mine=1&amp;stage=x%26mine%3D0%22%3C"' in page
