"""An experiment's dashboard page in a real browser: Debian's Chromium, headless, driven by
selenium (as test_dashboard), against a real server over TLS with tokens and a real agent
running the members of a sweep (2 values x 2 seeds). Its owner reports two keys for each
member over the API (ReportValues, as the in-job SDK does); the test reads what the browser
renders: the members' table (values, stage, exit code, step, latest values), one chart per key
with one line per member, the links between the jobs page, the members' job pages and the
experiment's, and that another user sees the members' stages but no values. Screenshots go
to the test's temporary directory. Without Chromium and its driver the test skips.

docs/experiment.png is this test's screenshot of the ended experiment; to make it again:

    ARRANGER_DOCS_SCREENSHOT=1 pytest tests/e2e/test_dashboard_experiment.py
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.v1 import arranger_pb2
from tests.conftest import Gate, eventually, job_spec, script
from tests.e2e.test_dashboard import CHROMIUM, DRIVER, Browser, By, secured_cluster
from tests.server.test_auth import issue

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Chromium or its driver is missing (Debian: chromium chromium-driver)",
)
DOCS_SHOT = Path(__file__).parents[2] / "docs" / "experiment.png"
STEPS = 40
# A member waits for the gate, then ends: member 3 fails (exit 1), the others succeed.
MEMBER = """
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1]))).recv(1)
raise SystemExit(1 if sys.argv[2] == "3" else 0)
"""
# What the browser sees of the members' table: each row's cells' text, by column name.
TABLE = """
const heads = [...document.querySelectorAll("#members thead th")].map((th) => th.textContent);
return [...document.querySelectorAll("#members tbody tr")].map((tr) =>
  Object.fromEntries([...tr.querySelectorAll("td")].map((td, i) => [heads[i], td.textContent.trim()])));
"""
# What the charts draw: each chart's key and the members its lines are of.
CHARTS = """
return [...document.querySelectorAll("#charts figure.chart")].map((f) => [
  f.dataset.key, [...f.querySelectorAll("polyline.series")].map((p) => p.dataset.member)]);
"""


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    opened = Browser(tmp_path / "screenshots")
    try:
        yield opened
    finally:
        opened.quit()


def curves(index: int, lr: float) -> list[arranger_pb2.ReportPoint]:
    """curves: a member's made-up learning curves, `loss` and `reward`, step by step."""
    points = []
    for step in range(STEPS):
        wobble = 0.03 * math.sin(step * 0.9 + index)
        loss = (2.0 * math.exp(-step * lr * 8) + 0.1 * index + 0.05) * (1 + wobble)
        reward = 100 * (1 - math.exp(-step * lr * 6)) - 5 * index + 100 * wobble
        points.append(
            arranger_pb2.ReportPoint(step=step * 10, values={"loss": loss, "reward": reward})
        )
    return points


async def test_an_experiments_page_in_a_real_browser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Browser, gate: Gate
) -> None:
    async with secured_cluster(tmp_path) as cluster:
        url = cluster.server.web.url
        view = cluster.server.controller.view
        alice = await issue(cluster, "alice", capsys)  # type: ignore[arg-type]
        bob = await issue(cluster, "bob", capsys)  # type: ignore[arg-type]
        member = [*script(tmp_path, "member", MEMBER), str(gate.port), "{index}"]
        doc = job_spec("sweep", member, workerSets=[], minWorkersNum=0, restartLimit=0)
        doc["spec"]["sweep"] = {"parameters": {"lr": [0.1, 0.02]}, "seeds": 2, "maxParallel": 4}
        async with AsyncClient(cluster.address, ca=cluster.tls / "ca.pem", token=alice) as client:
            stub = client._stubs[0]
            request = arranger_pb2.SubmitJobRequest(job=load_job_data(doc))
            exp = (await stub.SubmitJob(request)).experiment
            jobs = [view.job(job_id) for job_id in view.experiment_by_id(exp.id).members]
            await eventually(
                lambda: all(j.stage.value == "Running" for j in jobs), what="all four to run"
            )
            for i, job in enumerate(jobs):
                lr = float(job.spec.sweep.own_values()["lr"])  # type: ignore[union-attr]
                report = arranger_pb2.ReportValuesRequest(job=job.id, points=curves(i, lr))
                await stub.ReportValues(report)  # as the owner: the SDK's job.report does so

        await browser.open(f"{url}/login")
        await browser.type("token", alice)
        await browser.click("login")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "summary"), "the cluster page")

        # The jobs page folds the members into their experiment, which it links to.
        await browser.open(f"{url}/jobs")
        listed = await browser.text("experiments")
        assert "sweep" in listed and "4 Running" in listed
        assert "sweep-0" not in await browser.text("jobs")
        await browser.shot("jobs")
        await browser.click("members-toggle")  # listed, each links to its experiment
        await browser.wait_for(lambda d: "sweep-3" in d.find_element(By.ID, "jobs").text, "members")
        assert "sweep-3 of sweep" in await browser.text("jobs")
        await browser.run(lambda: browser.driver.find_element(By.LINK_TEXT, "sweep").click())
        await browser.wait_for(lambda d: d.find_elements(By.ID, "members"), "the experiment page")
        assert (await browser.url()).endswith(f"/experiments/{exp.id}")
        summary = await browser.text("experiment-summary")
        assert "4 members" in summary and "owner alice" in summary and "seeds 2" in summary
        assert "maxParallel 4" in summary
        assert "lr 0.1, 0.02" in await browser.text("experiment-parameters")

        # A row per member: its values, stage, step and latest values.
        rows = await browser.run(browser.driver.execute_script, TABLE)
        last = {i: curves(i, 0.1 if i < 2 else 0.02)[-1] for i in range(4)}
        assert [(r["#"], r["Member"], r["lr"], r["seed"], r["Stage"], r["Step"]) for r in rows] == [
            ("0", "sweep-0", "0.1", "0", "Running", str(10 * (STEPS - 1))),
            ("1", "sweep-1", "0.1", "1", "Running", str(10 * (STEPS - 1))),
            ("2", "sweep-2", "0.02", "0", "Running", str(10 * (STEPS - 1))),
            ("3", "sweep-3", "0.02", "1", "Running", str(10 * (STEPS - 1))),
        ]
        for i, row in enumerate(rows):
            assert row["loss"] == f"{last[i].values['loss']:.4g}"
            assert row["reward"] == f"{last[i].values['reward']:.4g}"
            assert row["Exit"] == "-" and row["Outcome"] == "-" and row["Elapsed"] != "-"

        # A chart per key, a line per member in each, a legend entry per member.
        await browser.wait_for(
            lambda d: d.find_elements(By.CSS_SELECTOR, '#charts[data-drawn="2"]'), "the charts"
        )
        charts = await browser.run(browser.driver.execute_script, CHARTS)
        names = [f"sweep-{i}" for i in range(4)]
        assert charts == [["loss", names], ["reward", names]]
        legend = await browser.text("legend")
        assert "sweep-0 · lr=0.1 seed=0" in legend and "sweep-3 · lr=0.02 seed=1" in legend
        assert await browser.text("charts-note") == ""
        await browser.shot("experiment-running")

        # A member's page says whose member it is, and links back; a name reaches it too.
        await browser.run(lambda: browser.driver.find_element(By.LINK_TEXT, "sweep-2").click())
        await browser.wait_for(lambda d: d.find_elements(By.ID, "job-experiment"), "sweep-2")
        assert await browser.text("job-experiment") == "member 2 of experiment sweep"
        await browser.run(lambda: browser.driver.find_element(By.LINK_TEXT, "sweep").click())
        await browser.wait_for(lambda d: d.find_elements(By.ID, "members"), "the experiment")
        await browser.open(f"{url}/experiments/sweep")
        assert await browser.text("experiment-name") == "sweep"

        # The members end: three succeed, the last fails; the page shows each exit code.
        gate.open()
        await eventually(lambda: all(j.stage.finished for j in jobs), what="all four to end")
        await browser.open(f"{url}/experiments/{exp.id}")
        await browser.wait_for(
            lambda d: d.find_elements(By.CSS_SELECTOR, '#charts[data-drawn="2"]'), "the charts"
        )
        rows = await browser.run(browser.driver.execute_script, TABLE)
        assert [(r["Stage"], r["Outcome"], r["Exit"]) for r in rows] == [
            ("Succeeded", "Completed", "0"),
            ("Succeeded", "Completed", "0"),
            ("Succeeded", "Completed", "0"),
            ("Failed", "Failed", "1"),
        ]
        stages = await browser.text("experiment-stages")
        assert "1 Failed" in stages and "3 Succeeded" in stages
        await browser.shot("experiment")
        if os.environ.get("ARRANGER_DOCS_SCREENSHOT"):
            shutil.copyfile(browser.shots / "experiment.png", DOCS_SHOT)

        # Bob sees the members and their stages, not their values, and no charts.
        await browser.click("logout")
        await browser.wait_for(lambda d: d.current_url.endswith("/login"), "logged out")
        await browser.type("token", bob)
        await browser.click("login")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "summary"), "bob's cluster page")
        await browser.open(f"{url}/experiments/{exp.id}")
        await browser.wait_for(lambda d: d.find_elements(By.ID, "members"), "bob's page")
        rows = await browser.run(browser.driver.execute_script, TABLE)
        assert [(r["Member"], r["lr"], r["seed"], r["Stage"], r["Step"]) for r in rows] == [
            (f"sweep-{i}", "(hidden)", "(hidden)", stage, "-")
            for i, stage in enumerate(["Succeeded"] * 3 + ["Failed"])
        ]
        assert all("loss" not in row and "reward" not in row for row in rows)
        assert "its owner's (alice)" in await browser.text("values-hidden")
        assert await browser.text("experiment-parameters") == "lr (hidden)"
        assert not await browser.run(
            lambda: browser.driver.find_elements(By.CSS_SELECTOR, "#charts, polyline")
        )
        await browser.shot("experiment-bob")
        await browser.open(f"{url}/api/experiments/{exp.id}/reports")  # a refusal, as text
        await browser.wait_for(lambda d: "owner" in d.page_source, "the values refused to bob")
        assert "loss" not in await browser.run(lambda: browser.driver.page_source)
