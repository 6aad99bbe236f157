"""What the server says of itself to Prometheus beyond its jobs: every call by method and
status code (refusals included), unary calls timed, its release, and on a shared store how
long it may still act on its lease. Real server, real gRPC over loopback, each store."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import grpc
import pytest

import arranger
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import FAST, bare_server, eventually, job_spec


def value(exposition: str, series: str) -> float | None:
    """value: the sample of `series` (name and labels as exposed), None if not exposed."""
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


async def test_calls_are_counted_by_method_and_code_and_timed(
    tmp_path: Path, store_url: str
) -> None:
    config = dataclasses.replace(FAST, store=store_url)
    async with bare_server(tmp_path / "server", config) as server:
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            await client.submit(job_spec("counted", ["true"]))
            for _ in range(2):
                with pytest.raises(ArrangerError) as missing:
                    await client.get("no-such-job")
                assert missing.value.code == grpc.StatusCode.NOT_FOUND
        get = 'method="arranger.v1.Arranger/GetJob"'
        not_found = f'arranger_grpc_requests_total{{code="NOT_FOUND",{get}}}'
        # A call is counted as its handler ends, which may be just after the client has its answer.
        await eventually(
            lambda: value(server.metrics.exposition().decode(), not_found) == 2.0,
            what="both refused calls counted",
        )
        shown = server.metrics.exposition().decode()
    submit = 'method="arranger.v1.Arranger/SubmitJob"'
    assert value(shown, f'arranger_grpc_requests_total{{code="OK",{submit}}}') == 1.0
    assert value(shown, not_found) == 2.0
    assert value(shown, f"arranger_grpc_request_duration_seconds_count{{{submit}}}") == 1.0
    assert value(shown, f'arranger_build_info{{version="{arranger.__version__}"}}') == 1.0
    lease = value(shown, "arranger_lease_remaining_seconds")
    if store_url.startswith("sqlite"):
        assert lease is None  # one server per store: no lease to lose
    else:
        assert lease is not None and 0 < lease <= config.lease_s
    assert not re.search(r'method="[^"]*no-such', shown)  # labels are methods, not values
