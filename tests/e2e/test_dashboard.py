"""The dashboard in a real browser: Debian's Chromium, headless, driven by selenium, against a
real server over TLS with tokens and a real agent (mutual TLS) running a real job. The test
logs in, reads the pages through the browser (what it renders, not the HTML), follows the
job to its live log tail, checks what another user may not see, and saves screenshots in the
test's temporary directory. Without Chromium and its driver the test skips, saying why
(.ci/run installs them, as it does podman).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.agent.discovery import fake_gpus
from arranger.client.sdk import AsyncClient
from arranger.identity import local_principal
from arranger.security import TlsFiles
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from tests.conftest import FAST, NODE, eventually, job_spec, running_cluster, script
from tests.server.test_auth import in_thread, issue, run_cli

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Chromium or its driver is missing (Debian: chromium chromium-driver)",
)
TALKS = """
import itertools, sys, time
for n in itertools.count():
    print(f"learner step {n}", flush=True)
    time.sleep(0.2)
"""


@dataclasses.dataclass
class Cluster:
    server: ArrangerServer
    address: str
    tls: Path
    data_dir: Path


@contextlib.asynccontextmanager
async def secured_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """secured_cluster: a TLS server with tokens and one agent joined over mutual TLS."""
    tls = tmp_path / "tls"
    argv = ("certs", "--out", str(tls), "--server-host", "127.0.0.1", "--agent", "gpu-0")
    assert run_cli(*argv) == 0
    config: ServerConfig = dataclasses.replace(
        FAST,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "server",
        tls=TlsFiles(tls / "ca.pem", tls / "server.pem", tls / "server.key"),
    )
    server = ArrangerServer(config)
    await server.start()
    agent = Agent(
        AgentConfig(
            server=f"127.0.0.1:{server.agent_port}",
            node_name="gpu-0",
            address="127.0.0.1",
            data_dir=tmp_path / "agent",
            path_prepend=(str(Path(sys.executable).parent),),
            heartbeat_interval_s=0.2,
            fence_timeout_s=FAST.fence_timeout_s,
            stop_pods_on_exit=True,
            usage_interval_s=0.2,
            tls=TlsFiles(tls / "ca.pem", tls / "gpu-0.pem", tls / "gpu-0.key"),
        ),
        dataclasses.replace(NODE, gpus=tuple(fake_gpus(2, "FakeGPU", "gpu-0"))),
    )
    try:
        agent.start()
        await eventually(agent.connected.is_set, what="the agent to join")
        yield Cluster(server, f"127.0.0.1:{server.port}", tls, config.data_dir)
    finally:
        await agent.stop()
        await server.stop()


class Browser:
    """Browser: headless Chromium; each call runs in a thread, since the server under test
    answers on this test's own event loop."""

    def __init__(self, shots: Path) -> None:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM or ""
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
        ):
            options.add_argument(flag)
        service = webdriver.ChromeService(executable_path=DRIVER)
        self.driver = webdriver.Chrome(options=options, service=service)
        self.shots = shots
        shots.mkdir(exist_ok=True)

    async def run(self, call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(call, *args)

    async def open(self, url: str) -> None:
        await self.run(self.driver.get, url)

    async def text(self, element_id: str) -> str:
        element = await self.run(self.driver.find_element, By.ID, element_id)
        return str(await self.run(lambda: element.text))

    async def wait_for(self, check: Callable[[Any], Any], what: str, timeout_s: float = 20) -> None:
        try:
            await self.run(WebDriverWait(self.driver, timeout_s, 0.1).until, check)
        except TimeoutException:
            await self.shot("timeout")
            raise AssertionError(f"timed out waiting for {what}") from None

    async def type(self, element_id: str, text: str) -> None:
        await self.run(lambda: self.driver.find_element(By.ID, element_id).send_keys(text))

    async def click(self, element_id: str) -> None:
        await self.run(lambda: self.driver.find_element(By.ID, element_id).click())

    async def url(self) -> str:
        return str(await self.run(lambda: self.driver.current_url))

    async def shot(self, name: str) -> None:
        await self.run(self.driver.save_screenshot, str(self.shots / f"{name}.png"))

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    opened = Browser(tmp_path / "screenshots")
    try:
        yield opened
    finally:
        opened.quit()


async def test_dashboard_in_a_real_browser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Browser
) -> None:
    async with secured_cluster(tmp_path) as cluster:
        url = cluster.server.web.url
        alice = await issue(cluster, "alice", capsys)  # type: ignore[arg-type]
        bob = await issue(cluster, "bob", capsys)  # type: ignore[arg-type]
        ca = cluster.tls / "ca.pem"
        talks = script(tmp_path, "talks", TALKS)
        async with AsyncClient(cluster.address, ca=ca, token=alice) as client:
            spec = job_spec("learning", talks, workers=1)
            spec["spec"]["leader"]["template"]["resources"]["gpu"] = 0.5
            await client.submit(spec)
            await eventually(
                lambda: cluster.server.controller.view.find("learning").stage.value == "Running",
                what="the job to run",
            )  # type: ignore[union-attr]
            waiting = job_spec("waiting", talks)
            waiting["spec"]["leader"]["template"]["resources"]["gpu"] = 2  # both: one is held
            await client.submit(waiting)

        # Not logged in: every page sends the browser to the login page.
        await browser.open(f"{url}/jobs")
        await browser.wait_for(lambda d: d.current_url.endswith("/login"), "the login page")
        await browser.type("token", "arr_wrong")
        await browser.click("login")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "error"), "the refusal")
        assert "not known" in await browser.text("error")

        await browser.type("token", alice)
        await browser.click("login")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "summary"), "the cluster page")
        assert await browser.text("user") == "alice"

        # The GPU map: one node, one GPU half held by the learner, the other idle.
        await browser.open(url)
        node = await browser.text("node-gpu-0")
        assert "gpu-0" in node and "learning" in node
        assert await browser.text("gpus-shared") == "1"
        assert await browser.text("gpus-idle") == "1"
        assert await browser.text("gpus-fragmented") == "0.50"
        await browser.shot("cluster")

        # Jobs: both, with their stage and why one waits.
        await browser.open(f"{url}/jobs")
        jobs = await browser.text("jobs")
        assert "learning" in jobs and "Running" in jobs
        assert "waiting" in jobs and "Pending" in jobs and "insufficient gpu" in jobs
        await browser.shot("jobs")

        # Follow the job to its pods, events and the live tail of the leader's log.
        await browser.run(lambda: browser.driver.find_element(By.LINK_TEXT, "learning").click())
        await browser.wait_for(lambda d: d.find_elements(By.ID, "job-name"), "the job page")
        assert await browser.text("job-stage") == "Running"
        assert "gpu-0" in await browser.text("pods")

        async def usage_shown() -> bool:
            await browser.open(await browser.url())
            return bool(
                await browser.run(lambda: browser.driver.find_elements(By.CSS_SELECTOR, "td.usage"))
            )

        await eventually(usage_shown, timeout_s=20, what="the pods' usage on the job page")
        assert "Submitted" in await browser.text("events")
        await browser.wait_for(
            lambda d: "learner step 3" in d.find_element(By.ID, "log-tail").text,
            "the log tail to show the learner's lines",
        )
        first = await browser.text("log-tail")
        await browser.wait_for(
            lambda d: len(d.find_element(By.ID, "log-tail").text) > len(first),
            "the log tail to grow as the learner writes",
        )
        await browser.shot("job")

        # Queues: the default queue holds what the job's pods hold.
        await browser.open(f"{url}/queues")
        assert "default" in await browser.text("queues")

        # Bob sees the job but neither its command lines nor its log.
        await browser.click("logout")
        await browser.wait_for(lambda d: d.current_url.endswith("/login"), "logged out")
        await browser.type("token", bob)
        await browser.click("login")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "summary"), "bob's cluster page")
        job = cluster.server.controller.view.find("learning")
        assert job is not None
        await browser.open(f"{url}/jobs/{job.id}")
        body = await browser.text("log")  # the heading; the note follows it
        assert body == "Log"
        page = await browser.run(lambda: browser.driver.find_element(By.TAG_NAME, "main").text)
        assert "its owner's (alice)" in page and "learner step" not in page
        assert "talks" not in page  # the command line is alice's
        await browser.open(f"{url}/api/jobs/{job.id}/log")  # a refusal, shown as text
        await browser.wait_for(lambda d: "owner" in d.page_source, "the log refused to bob")

        # A revoked token ends its sessions.
        argv = ("token", "delete", "bob", "--data-dir", str(cluster.data_dir))
        assert await in_thread(*argv) == 0

        async def sent_to_login() -> bool:
            await browser.open(f"{url}/jobs")
            return (await browser.url()).endswith("/login")

        await eventually(sent_to_login, timeout_s=20, what="the revoked session to end")
    assert {p.name for p in (tmp_path / "screenshots").iterdir()} >= {
        "cluster.png",
        "jobs.png",
        "job.png",
    }


async def test_the_url_arranger_dev_prints_logs_its_owner_in(
    tmp_path: Path, browser: Browser
) -> None:
    async with running_cluster(tmp_path / "dev") as cluster:
        url = cluster.server.web.url
        await browser.open(f"{url}/jobs")  # anyone else is sent to the login page
        await browser.wait_for(lambda d: d.current_url.endswith("/login"), "the login page")
        await browser.open(cluster.dashboard_url)
        await browser.wait_for(lambda d: d.find_elements(By.ID, "user"), "the owner's page")
        assert await browser.text("user") == local_principal().user
        assert "token=" not in await browser.url()  # the login does not stay in the address bar
