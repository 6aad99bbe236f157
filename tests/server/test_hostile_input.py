"""Hostile and malformed submits thrown at the real gRPC API of a real server.

Over 10,000 generated TYJob messages (in batches sent at once): wrong and unknown enum values,
negative and huge numbers, NaN and infinities, names with path traversal, control characters,
other scripts and a megabyte of text, duplicate worker sets, oversized env and argv, messages
over the size limit; and bytes that are no message at all. The server must keep serving; it
must refuse every message it parses and finds invalid with INVALID_ARGUMENT naming the field
(PERMISSION_DENIED, naming it too, where valid but against its policy: a host path);
and what it stores must pass checks written here independently of its validation.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from arranger.server.access import SubmitPolicy
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.limits import UserLimits
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2

BATCH = 25
EXAMPLES = 420  # x BATCH = 10,500 messages
LIMIT = ServerConfig().max_message_bytes
# A field path: metadata.labels['team'], spec.workerSets[0].template.env, ...
FIELD_PATH = re.compile(
    r"""^(apiVersion|kind|metadata|spec)(\.[A-Za-z0-9_]+|\[(\d+|'([^'\\]|\\.)*'|"([^"\\]|\\.)*")\])*: """
)
NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MEGABYTE = "x" * 2**20

# Strings that have broken parsers and file systems before, next to ordinary ones.
NASTY = [
    "",
    " ",
    "..",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "a\x00b",
    "a\nb",
    "abc\n",
    "-lead",
    "lead-",
    "UPPER",
    "名字",
    "\u202eevil",
    "a" * 49,
    "a" * 25,
    "%s%n",
    "$(reboot)",
    "learner",
    "actors",
    "default",
    MEGABYTE,
]
texts = st.one_of(
    st.from_regex(NAME, fullmatch=True).filter(lambda s: len(s) <= 30),
    st.sampled_from(NASTY),
    st.text(max_size=40),
)
numbers = st.one_of(
    st.integers(-3, 12), st.sampled_from([-(2**31), 2**31 - 1, 0, 10_001, 1_000_000])
)
reals = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 1.5, -1.0, 1e-9, 1e308, 64.0, 65.0]),
    st.floats(allow_nan=True, allow_infinity=True),
)
enums = st.one_of(
    st.sampled_from(["", "Priority", "DRF", "BinPack", "Gang", "MinFragment", "All", "None"]),
    st.text(max_size=12),
)
maps = st.one_of(
    st.dictionaries(texts, texts, max_size=4),
    st.sampled_from([{f"K{i}": "v" for i in range(2000)}, {"BIG": "v" * 70_000}]),
)
argv = st.one_of(
    st.lists(texts, max_size=4),
    st.just(["true"]),
    st.just(["x"] * 2000),
)


def valid_job(name: str, sets: int, counts: int) -> job_pb2.TYJob:
    """valid_job: a small job every check accepts (the base the mutations start from)."""
    job = job_pb2.TYJob(api_version="arranger/v1", kind="TYJob")
    job.metadata.name = name
    job.spec.leader.name = "learner"
    for template in [job.spec.leader.template] + [
        job.spec.worker_sets.add(name=f"set{i}", counts=counts).template for i in range(sets)
    ]:
        template.command.extend(["true"])
        template.resources.cpu = 0.25
        template.resources.memory = 64 * 2**20
    return job


def _template(job: job_pb2.TYJob, which: int) -> job_pb2.PodTemplate:
    sets = job.spec.worker_sets
    return sets[which % len(sets)].template if sets and which else job.spec.leader.template


# Each mutation makes one part of a valid job hostile: (what it changes, how).
MUTATIONS: dict[str, Any] = {
    "name": lambda j, d: setattr(j.metadata, "name", d(texts)),
    "api": lambda j, d: setattr(j, "api_version", d(st.sampled_from(["v2", "", "arranger/v1 "]))),
    "kind": lambda j, d: setattr(j, "kind", d(st.sampled_from(["Job", "", "tyjob"]))),
    "queue": lambda j, d: setattr(
        j.metadata, "queue", d(st.sampled_from(["nope", "../q", "a" * 64]))
    ),
    "labels": lambda j, d: j.metadata.labels.update(d(maps)),
    "priority": lambda j, d: setattr(j.spec, "priority", d(numbers)),
    "restarts": lambda j, d: setattr(j.spec, "restart_limit", d(numbers)),
    "minimum": lambda j, d: setattr(j.spec, "min_workers_num", d(numbers)),
    "cleanup": lambda j, d: setattr(j.spec, "clean_pod_policy", d(enums)),
    "queueing": lambda j, d: setattr(j.spec.scheduler_policy, "job_queue_policy", d(enums)),
    "basic": lambda j, d: setattr(j.spec.scheduler_policy, "basic_policy", d(enums)),
    "leader": lambda j, d: setattr(j.spec.leader, "name", d(texts)),
    "set name": lambda j, d: j.spec.worker_sets.add(
        name=d(st.sampled_from(["set0", "learner", ""]) | texts), counts=1
    ).template.CopyFrom(j.spec.leader.template),
    "counts": lambda j, d: j.spec.worker_sets.add(name="many", counts=d(numbers)).template.CopyFrom(
        j.spec.leader.template
    ),
    "min count": lambda j, d: j.spec.worker_sets.add(
        name="mins", counts=2, min_count=d(numbers)
    ).template.CopyFrom(j.spec.leader.template),
    "command": lambda j, d: _replace(_template(j, d(numbers)).command, d(argv)),
    "args": lambda j, d: _template(j, d(numbers)).args.extend(d(argv)),
    "env": lambda j, d: _template(j, d(numbers)).env.update(d(maps)),
    "selector": lambda j, d: _template(j, d(numbers)).node_selector.update(d(maps)),
    "workdir": lambda j, d: setattr(_template(j, d(numbers)), "working_dir", d(texts)),
    "cpu": lambda j, d: setattr(_template(j, d(numbers)).resources, "cpu", d(reals)),
    "memory": lambda j, d: setattr(
        _template(j, d(numbers)).resources, "memory", d(st.sampled_from([-1, 0, 2**62, 2**63 - 1]))
    ),
    "gpu": lambda j, d: setattr(_template(j, d(numbers)).resources, "gpu", d(reals)),
    "gpu type": lambda j, d: setattr(
        _template(j, d(numbers)).resources,
        "gpu_type",
        d(st.sampled_from(["|", "bad type!"]) | texts),
    ),
    "ports": lambda j, d: _template(j, d(numbers)).ports.extend(
        job_pb2.Port(name=n) for n in d(st.lists(texts, max_size=20))
    ),
    "readiness": lambda j, d: setattr(_template(j, d(numbers)).readiness, "port", d(texts)),
    "image": lambda j, d: setattr(_template(j, d(numbers)), "image", d(texts)),
    "volume": lambda j, d: j.spec.volumes.add(
        name=d(texts),
        host_path=d(st.sampled_from(["/data", "relative", "/../etc", ""])),
        mount_path=d(st.sampled_from(["/mnt", "", "x"]) | texts),
    ),
    "timeout": lambda j, d: setattr(
        j.spec,
        d(
            st.sampled_from(
                ["schedule_timeout_seconds", "preemption_grace_seconds", "max_runtime_seconds"]
            )
        ),
        d(reals),
    ),
}


def _replace(field: Any, values: list[str]) -> None:
    del field[:]
    field.extend(values)


@st.composite
def jobs(draw: st.DrawFn) -> job_pb2.TYJob:
    """jobs: a valid job with no, one or a few hostile changes."""
    name = draw(st.from_regex(r"[a-z][a-z0-9]{3,12}", fullmatch=True))
    job = valid_job(name, draw(st.integers(0, 2)), draw(st.integers(1, 3)))
    for what in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3)):
        MUTATIONS[what](job, draw)
    return job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """server: a real arranger-server (no agents: nothing accepted ever runs) on its own event
    loop thread, for the whole module."""
    data = Path(tmp_path_factory.mktemp("hostile"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    policy = SubmitPolicy(allowed_host_paths=("/data",))
    app = ArrangerServer(
        ServerConfig(listen="127.0.0.1:0", data_dir=data, policy=policy, init=True, http_listen="")
    )
    asyncio.run_coroutine_threadsafe(app.start(), loop).result(30)
    try:
        yield f"127.0.0.1:{app.port}"
    finally:
        asyncio.run_coroutine_threadsafe(app.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def stub(server: str) -> Iterator[arranger_pb2_grpc.ArrangerStub]:
    with grpc.insecure_channel(server) as channel:
        yield arranger_pb2_grpc.ArrangerStub(channel)


@pytest.mark.timeout(600)
def test_hostile_submits_are_refused_by_field_and_nothing_invalid_is_stored(
    stub: arranger_pb2_grpc.ArrangerStub,
) -> None:
    accepted: set[str] = set()
    latest: dict[str, str] = {}  # name -> id of the job last accepted under it

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        phases=(Phase.explicit, Phase.generate),  # shrinking batches of megabytes takes minutes
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(batch=st.lists(jobs(), min_size=BATCH, max_size=BATCH))
    def throw(batch: list[job_pb2.TYJob]) -> None:
        calls: list[tuple[job_pb2.TYJob, Future[Any]]] = [
            (job, stub.SubmitJob.future(arranger_pb2.SubmitJobRequest(job=job), timeout=30))
            for job in batch
        ]
        # The calls run at once: a name may be taken by a job later in the batch.
        taken = {job.metadata.name for job, call in calls if call.exception() is None}
        for job, call in calls:
            try:
                reply = call.result()
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    if details.startswith("limits.specBytes"):  # the server's cap on one spec
                        assert job.ByteSize() > UserLimits().spec_bytes, details
                    else:  # the transport's size limit
                        assert job.ByteSize() > LIMIT - 1024, details
                elif code == grpc.StatusCode.ALREADY_EXISTS:
                    assert job.metadata.name in accepted | taken, details
                elif code == grpc.StatusCode.PERMISSION_DENIED:  # policy: hostPath, deniedEnv
                    assert FIELD_PATH.match(details), details
                else:
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
                    assert FIELD_PATH.match(details), details
                    assert len(details) < 8192, "a refusal does not echo megabytes back"
                continue
            name = job.metadata.name
            if name in latest:  # a name is unique among unfinished jobs only
                earlier = stub.GetJob(arranger_pb2.GetJobRequest(name=latest[name]), timeout=30)
                assert earlier.status.stage in ("Succeeded", "Failed"), earlier.status
            accepted.add(name)
            latest[name] = reply.job.metadata.id

    throw()
    # Everything accepted, and nothing else, is stored; every stored job passes checks written
    # here, independent of the server's validation.
    listed: list[job_pb2.JobSummary] = []
    token = ""
    while True:
        page = stub.ListJobs(arranger_pb2.ListJobsRequest(page_token=token), timeout=30)
        listed += page.jobs
        token = page.next_page_token
        if not token:
            break
    assert {j.name for j in listed} == accepted
    assert len(accepted) > 50, "the generator should also produce valid jobs"
    for summary in listed:
        check_stored(stub.GetJob(arranger_pb2.GetJobRequest(name=summary.id), timeout=30))


def test_garbage_bytes_are_refused_by_the_transport(server: str) -> None:
    with grpc.insecure_channel(server) as channel:
        raw = channel.unary_unary(
            "/arranger.v1.Arranger/SubmitJob",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for body in (b"\xff" * 64, b"\x0a\x05\xff\xfe\xfd\xfc\xfb", bytes(range(256)) * 4):
            with pytest.raises(grpc.RpcError) as caught:
                raw(body, timeout=10)
            assert caught.value.code() != grpc.StatusCode.OK
        health = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert health(b"", timeout=10) is not None  # still serving


def check_stored(job: job_pb2.TYJob) -> None:
    name = job.metadata.name
    assert NAME.fullmatch(name) and len(name) <= 48, name
    assert job.api_version == "arranger/v1" and job.kind == "TYJob"
    spec = job.spec
    assert 1 <= spec.priority <= 10 and spec.restart_limit >= 0
    sets = [ws.name for ws in spec.worker_sets]
    assert len(set(sets)) == len(sets) and spec.leader.name not in sets
    pods = 1 + sum(ws.counts for ws in spec.worker_sets)
    assert all(ws.counts >= 1 for ws in spec.worker_sets) and pods <= 10_000
    assert 0 <= spec.min_workers_num <= pods - 1
    for template in [spec.leader.template, *(ws.template for ws in spec.worker_sets)]:
        assert template.command and sum(len(a) for a in template.command) < 2**17
        r = template.resources
        assert math.isfinite(r.cpu) and 0 <= r.cpu <= 10_000
        assert 0 <= r.memory <= 2**50
        assert math.isfinite(r.gpu) and 0 <= r.gpu <= 64
        assert r.gpu < 1 or r.gpu == int(r.gpu)
        assert len(template.env) <= 1024
        assert sum(len(k) + len(v) for k, v in template.env.items()) <= 64 * 1024
        assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in template.env)
        image = template.image  # reaches podman's command line: never an option, never a space
        assert not image or (not image.startswith("-") and len(image) <= 512), image
        assert not any(c.isspace() or not c.isprintable() for c in image), image
