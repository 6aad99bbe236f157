"""Prometheus metrics of a real server and its real agents, scraped over HTTP on 127.0.0.1 and
read with prometheus-client's own parser: what they say follows the jobs that ran."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from arranger.agent.config import AgentConfigError, load_agent_config
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.config import ConfigError, ServerConfig
from tests.conftest import eventually, job_spec

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SLEEPS = [sys.executable, "-c", "import signal; signal.pause()"]  # runs until stopped
FAILS = [sys.executable, "-c", "raise SystemExit(3)"]


async def scrape(url: str) -> Samples:
    """scrape: every sample at `url`, by (name, sorted labels); fetched in a thread, since the
    server answers on this test's own event loop."""

    def fetch() -> tuple[str, str]:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.headers["Content-Type"], reply.read().decode()

    kind, text = await asyncio.to_thread(fetch)
    assert kind.startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Iterable[Samples], name: str, **labels: str) -> float:
    """total: the sum of a series over several scrapes, or over every label the filter leaves."""
    want = set(labels.items())
    return sum(v for s in samples for (n, lab), v in s.items() if n == name and want <= set(lab))


def stage(cluster: DevCluster, name: str) -> str:
    job = cluster.server.controller.view.find(name)
    return job.stage.value if job is not None else ""


async def test_server_and_agent_metrics_follow_the_jobs(
    cluster: DevCluster, client: AsyncClient
) -> None:
    server_url = f"{cluster.server.web.url}/metrics"
    agent_urls = [f"{agent.web.url}/metrics" for agent in cluster.agents if agent.web]
    assert server_url.startswith("http://127.0.0.1:") and len(agent_urls) == 2

    before = await scrape(server_url)
    assert value(before, "arranger_server_active") == 1
    assert value(before, "arranger_agents_connected") == 2
    assert total([before], "arranger_node_allocatable", resource="cpu") > 0
    assert total([before], "arranger_node_schedulable") == 2

    await client.submit(job_spec("busy", SLEEPS, workers=2, cpu=0.25))
    await eventually(lambda: stage(cluster, "busy") == "Running", what="busy running")

    async def launched() -> bool:
        agents = [await scrape(url) for url in agent_urls]
        return total(agents, "arranger_agent_pod_launches_total") == 3

    await eventually(launched, timeout_s=30, what="three launches on the agents")
    agents = [await scrape(url) for url in agent_urls]
    assert total(agents, "arranger_agent_pods", state="Running") == 3

    async def sampled() -> bool:
        agents = [await scrape(url) for url in agent_urls]
        pods = {
            lab for s in agents for (n, lab), _ in s.items() if n == "arranger_pod_memory_bytes"
        }
        return len(pods) == 3 and total(agents, "arranger_pod_memory_bytes") > 0

    await eventually(sampled, timeout_s=30, what="each running pod's usage on its agent")
    assert total(agents, "arranger_agent_connected") == 2

    now = await scrape(server_url)
    assert value(now, "arranger_jobs", queue="default", stage="Running") == 1
    assert value(now, "arranger_pods_placed_total") == 3
    assert value(now, "arranger_pods_evicted_total") == 0
    assert value(now, "arranger_job_pending_seconds_count") == 1
    assert value(now, "arranger_scheduling_cycle_duration_seconds_count") >= 1
    assert value(now, "arranger_scheduling_cycles_total", cause="change") >= 1
    cpu = {"resource": "cpu", "unit": "core"}
    assert total([now], "arranger_node_allocated", **cpu) == 0.75
    assert value(now, "arranger_queue_allocated", queue="default", **cpu) == 0.75
    assert value(now, "arranger_queue_deserved", queue="default", **cpu) > 0

    await client.submit(job_spec("broken", FAILS, workers=1, restartLimit=0))
    await eventually(lambda: stage(cluster, "broken") == "Failed", what="broken failed")

    async def failure_counted() -> bool:
        agents = [await scrape(url) for url in agent_urls]
        return total(agents, "arranger_agent_pod_failures_total", reason="ExitCode") >= 1

    await eventually(failure_counted, timeout_s=30, what="a failure counted by its reason")
    now = await scrape(server_url)
    assert value(now, "arranger_jobs", queue="default", stage="Failed") == 1
    agents = [await scrape(url) for url in agent_urls]
    assert total(agents, "arranger_agent_pod_failures_total", reason="Other") == 0

    # Every series deploy/'s Grafana board asks for is one the daemons serve.
    served = set()
    for url in [server_url, *agent_urls]:
        text = await asyncio.to_thread(
            lambda u=url: urllib.request.urlopen(u, timeout=10).read().decode()
        )
        for family in text_string_to_metric_families(text):
            served |= {family.name, *(s.name for s in family.samples)}
    board = json.loads((DEPLOY / "grafana" / "arranger.json").read_text())
    asked = {
        name
        for panel in board["panels"]
        for target in panel["targets"]
        for name in re.findall(r"arranger_[a-z_]+", target["expr"])
    }
    assert asked and asked <= served, asked - served


def test_a_bad_http_address_is_refused_naming_the_setting(tmp_path: Path) -> None:
    try:
        ServerConfig(http_listen="nowhere").check()
    except ConfigError as exc:
        assert "httpListen" in str(exc) and "HOST:PORT" in str(exc)
    else:
        raise AssertionError("a bad httpListen must be refused")
    (tmp_path / "agent.yaml").write_text("httpListen: 127.0.0.1:99999\n")
    try:
        load_agent_config(tmp_path / "agent.yaml")
    except AgentConfigError as exc:
        assert "httpListen" in str(exc)
    else:
        raise AssertionError("a bad httpListen must be refused")
