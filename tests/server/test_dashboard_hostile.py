"""The dashboard's HTTP port against hostile requests: a real server with real agents on
127.0.0.1, asked over real HTTP."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.security import TlsFiles
from arranger.server import dashboard, login_throttle
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, bare_server, eventually, job_spec, script
from tests.server.test_auth import Secured, in_thread, issue, secured

SLEEPS = "import signal\nsignal.pause()  # runs until stopped\n"


@pytest.mark.e2e
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
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(cluster.dashboard_url) as login:  # dev's printed URL logs in
            assert login.status == 200
        for offset in (str(2**63), str(-(2**63) - 1), "9" * 4000):
            async with http.get(url, params={"offset": offset}) as reply:
                assert reply.status == 400, await reply.text()
        async with http.get(url, params={"offset": "0"}) as reply:
            assert reply.status == 200
    assert not link._logs


@pytest.mark.e2e
async def test_a_login_form_from_an_opaque_origin_is_refused(cluster: DevCluster) -> None:
    """Origin "null" is refused even without Fetch Metadata (login CSRF from a sandboxed
    frame, in a browser that sends no Sec-Fetch-Site); the pages' Referrer-Policy lets this
    site's own form say its real Origin, which is let through (to a wrong token's 401)."""
    web = cluster.server.web.url
    async with aiohttp.ClientSession() as http:
        url = f"{web}/login"
        async with http.get(url) as page:
            assert page.headers["Referrer-Policy"] in ("same-origin", "strict-origin")
        for origin, site, status in [
            ("null", "cross-site", 403),  # a sandboxed frame of another site
            ("null", "same-site", 403),
            ("http://evil.example", None, 403),
            ("null", None, 403),  # a sandboxed frame, in a browser without Fetch Metadata
            ("null", "same-origin", 403),
            (web, "same-origin", 401),  # this site's own form
            (web, None, 401),
        ]:
            headers = {"Origin": origin} | ({"Sec-Fetch-Site": site} if site else {})
            async with http.post(
                url, data={"token": "x"}, headers=headers, allow_redirects=False
            ) as reply:
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


@contextlib.asynccontextmanager
async def secured_on(tmp_path: Path, clock: Callable[[], float]) -> AsyncIterator[Secured]:
    """secured_on: a TLS server with tokens (so a dashboard that asks for one), no agents,
    whose clock is `clock`."""
    tls = tmp_path / "tls"
    assert await in_thread("certs", "--out", str(tls), "--server-host", "127.0.0.1") == 0
    config = dataclasses.replace(
        FAST,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "server",
        tls=TlsFiles(tls / "ca.pem", tls / "server.pem", tls / "server.key"),
    )
    server = ArrangerServer(config, clock=clock)
    async with bare_server(config.data_dir, server=server):
        yield Secured(
            f"127.0.0.1:{server.port}",
            f"127.0.0.1:{server.agent_port}",
            tls,
            config.data_dir,
            "",
            server.web.url,
            server,
        )


async def tries(http: aiohttp.ClientSession, web: str, token: str) -> aiohttp.ClientResponse:
    """tries posts `token` to the login form, as this site's own page does."""
    async with http.post(
        f"{web}/login", data={"token": token}, headers={"Origin": web}, allow_redirects=False
    ) as reply:
        await reply.read()
        return reply


async def test_wrong_tokens_are_throttled_per_client_and_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [1_700_000_000.0]
    wrong = "arr_" + "w" * 43
    async with secured_on(tmp_path, lambda: now[0]) as cluster:
        alice = await issue(cluster, "alice", capsys)
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as http:
                for _ in range(login_throttle.TRIES):
                    assert (await tries(http, cluster.web, wrong)).status == 401
                # Out of tries: a token the server does not know yet is not looked at.
                for token in (wrong, alice):
                    refused = await tries(http, cluster.web, token)
                    assert refused.status == 429
                    assert refused.headers["Retry-After"] == f"{login_throttle.REFILL_S:.0f}"
                # Another client (another loopback address) has its own tries.
                other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
                async with aiohttp.ClientSession(connector=other) as elsewhere:
                    assert (await tries(elsewhere, cluster.web, wrong)).status == 401
                now[0] += login_throttle.REFILL_S  # one try back
                assert (await tries(http, cluster.web, alice)).status == 303  # takes none
                assert (await tries(http, cluster.web, alice)).status == 303
                assert (await tries(http, cluster.web, wrong)).status == 401
                assert (await tries(http, cluster.web, wrong)).status == 429
                # Known now, alice's token logs in though her address is out of tries: who
                # shares it (other accounts, a proxy's users) cannot lock her out.
                assert (await tries(http, cluster.web, alice)).status == 303
    failed = [e for e in logs if e["log_level"] == "warning" and "login" in e["event"]]
    assert [e["address"] for e in failed] == ["127.0.0.1"] * 10 + ["127.0.0.2", "127.0.0.1"]
    assert failed[-1]["throttled_s"] == login_throttle.REFILL_S
    logins = [e for e in logs if e["event"] == "dashboard login"]
    assert [(e["log_level"], e["user"], e["address"]) for e in logins] == [
        ("info", "alice", "127.0.0.1")
    ] * 3
    assert not any(secret in repr(logs) for secret in (wrong, alice, wrong[4:], alice[4:]))
