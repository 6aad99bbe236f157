"""hostile: what one user can still do to another, against a real arranger-server over TLS.

Starts arranger-server as its own process (TLS, bearer tokens, the default limits, volumes
allowed under the temporary directory), issues tokens for two users and an admin with the
`arranger token` CLI, then replays the attacks a security review made on a server without
users and roles, and prints, for each, whether the server refused it and with what.

Then it measures what authorization costs a submit: sequential submits of a parked job by one
user, against this TLS server with a token and against an insecure server (the local user, an
admin) started the same way, side by side, and the CPU time of the authorization steps alone.

    python bench/hostile.py [--submits 300]

The agent-side attacks (PATH or LD_PRELOAD reaching a root process, one user's pod reading
another's /proc/<pid>/environ, scratch or logs, a pod writing an unbounded log) need root
agents and real accounts: tests/agent prove them; this script covers what goes through the API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import yaml

from arranger.client.cli import main as cli
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import arranger_pb2


def parked(name: str, workers: int = 1, queue: str = "default", **spec: Any) -> dict[str, Any]:
    """parked: a job no node takes (its leader wants a label no node has)."""
    template = {
        "command": ["python", "train.py", "--key", "k-123"],
        "resources": {"cpu": 0.1, "memory": "64Mi"},
        "nodeSelector": {"pool": "none"},
        "env": {"WANDB_API_KEY": "secret-1"},
    }
    body = {
        "leader": {"name": "learner", "template": template},
        "workerSets": [{"name": "actors", "counts": workers, "template": template}],
    }
    body.update(spec)
    return {
        "apiVersion": "arranger/v1",
        "kind": "TYJob",
        "metadata": {"name": name, "queue": queue},
        "spec": body,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server_process(tmp: Path, name: str, settings: dict[str, Any]) -> Iterator[str]:
    """server_process runs arranger-server in its own process group until the block ends."""
    port = free_port()
    settings = {
        "listen": f"127.0.0.1:{port}",
        "dataDir": str(tmp / name),
        "httpListen": "",
        **settings,
    }
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(settings))
    server = [sys.executable, "-m", "arranger.server.main", "--config", str(config)]
    subprocess.run([*server, "--init"], check=True, capture_output=True)  # a new cluster
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "arranger.server.main", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


async def serving(address: str, **client: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with AsyncClient(address, timeout_s=1, **client) as c:
                await c.queues()
                return
        except ArrangerError:
            await asyncio.sleep(0.05)
    raise SystemExit(f"arranger-server at {address} did not come up")


def store_ready(data_dir: Path) -> None:
    """store_ready waits until the server has created and migrated its store."""
    from arranger.server.store.sqlite_schema import MIGRATIONS  # noqa: PLC0415

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{data_dir / 'arranger.db'}?mode=ro", uri=True)
            with contextlib.closing(db):
                if db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
                    return
        time.sleep(0.05)
    raise SystemExit(f"no store appeared in {data_dir}")


def token(data_dir: Path, user: str, role: str = "user") -> str:
    """token runs `arranger token create` and returns what it printed."""
    store_ready(data_dir)
    with tempfile.TemporaryFile(mode="w+") as out:
        with contextlib.redirect_stdout(out):
            code = cli(
                ["token", "create", "--user", user, "--role", role, "--data-dir", str(data_dir)]
            )
        out.seek(0)
        if code != 0:
            raise SystemExit(f"arranger token create --user {user} failed")
        return out.read().strip().splitlines()[-1]


async def outcome(call: Awaitable[Any]) -> str:
    """outcome: `refused CODE: message` or `allowed`."""
    try:
        await call
    except ArrangerError as exc:
        return f"refused {exc.code.name}: {exc.message[:160]}"
    return "allowed"


async def attacks(address: str, ca: Path, data_dir: Path) -> dict[str, Any]:
    # The CLI runs its own event loop: off this one.
    tokens = {u: await asyncio.to_thread(token, data_dir, u) for u in ("alice", "mallory", "trudy")}
    tokens["ops"] = await asyncio.to_thread(token, data_dir, "ops", "admin")
    found: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        c = {
            u: await stack.enter_async_context(AsyncClient(address, ca=ca, token=t, timeout_s=60))
            for u, t in tokens.items()
        }
        alice, mallory, ops = c["alice"], c["mallory"], c["ops"]
        await ops.create_queue(arranger_pb2.Queue(name="team-a", users=["alice"], max_priority=6))
        await alice.submit(parked("victim"), queue_anyway=True)

        seen = await mallory.get("victim")
        found["read another user's env secret"] = (
            "redacted" if "secret-1" not in str(seen) and "k-123" not in str(seen) else "LEAKED"
        )
        found["read another user's logs"] = await outcome(anext(mallory.logs("victim")))
        found["delete another user's job"] = await outcome(mallory.delete("victim"))
        found["cordon a node"] = await outcome(mallory.cordon("gpu-01"))
        found["create a queue"] = await outcome(
            mallory.create_queue(arranger_pb2.Queue(name="mine"))
        )
        found["delete a queue"] = await outcome(mallory.delete_queue("team-a"))
        found["submit into another team's queue"] = await outcome(
            mallory.submit(parked("m-q", queue="team-a"), queue_anyway=True)
        )
        found["priority 10, preemptible: false"] = await outcome(
            mallory.submit(parked("m-p", priority=10, preemptible=False), queue_anyway=True)
        )
        found["mount /etc"] = await outcome(
            mallory.submit(
                parked("m-v", volumes=[{"name": "etc", "hostPath": "/etc"}]), queue_anyway=True
            )
        )
        preload = parked("m-e")
        preload["spec"]["leader"]["template"]["env"] = {"LD_PRELOAD": "/tmp/evil.so"}
        found["LD_PRELOAD in a pod"] = await outcome(mallory.submit(preload))

        # A 3.8 MB job: over the spec cap (the transport's 4 MiB is above it).
        huge = parked("m-huge")
        leader = huge["spec"]["leader"]
        leader["template"] = {**leader["template"], "args": ["y" * 4096] * 900}
        found["a 3.8 MB job"] = await outcome(mallory.submit(huge))

        # 1,000 submits back to back: the bucket lets a burst through, then about 20/s.
        started, accepted, first_refusal = time.monotonic(), 0, ""
        for i in range(1000):
            try:
                await mallory.submit(parked(f"m-flood-{i}"), queue_anyway=True)
                accepted += 1
            except ArrangerError as exc:
                first_refusal = first_refusal or f"{exc.code.name}: {exc.message[:120]}"
        seconds = time.monotonic() - started
        found["1,000 submits back to back"] = (
            f"{accepted} accepted in {seconds:.1f} s; then {first_refusal}"
        )
        # Six 10,000-pod jobs from a user who holds nothing yet: the pods limit stops the second.
        trudy = c["trudy"]
        results = [
            await outcome(trudy.submit(parked(f"t-big-{i}", 9_999), queue_anyway=True))
            for i in range(6)
        ]
        found["six 10,000-pod jobs"] = f"{results.count('allowed')} accepted; {results[-1]}"

        # Thousands of open watches: each user has 64.
        watches = [mallory.watch("victim") for _ in range(100)]
        opened = 0
        refusal = ""
        for watch in watches:
            try:
                await asyncio.wait_for(anext(watch), 10)
                opened += 1
            except ArrangerError as exc:
                refusal = refusal or f"{exc.code.name}: {exc.message[:120]}"
        found["100 open watches"] = f"{opened} opened; then {refusal}"
        for watch in watches:
            await watch.aclose()
        found["others still served while mallory is at her limits"] = await outcome(alice.queues())

        found.update(await later_attacks(c, data_dir.parent))

        # A revoked token's open stream ends.
        stream = alice.watch("victim")
        await anext(stream)
        revoked_at = time.monotonic()
        listed = await asyncio.to_thread(_token_names, data_dir)
        names = [line.split()[0] for line in listed if line.split()[1] == "alice"]
        for name in names:
            await asyncio.to_thread(cli, ["token", "delete", name, "--data-dir", str(data_dir)])

        async def drained() -> str:
            try:
                async for _ in stream:
                    pass
            except ArrangerError as exc:
                return exc.code.name
            return "ended without an error"

        code = await asyncio.wait_for(drained(), 10)
        found["a revoked token's open watch"] = (
            f"ended {code} after {time.monotonic() - revoked_at:.2f} s"
        )
    found["store files"] = modes(data_dir)
    return found


async def later_attacks(c: dict[str, AsyncClient], tmp: Path) -> dict[str, Any]:
    """later_attacks: those of the second review (priorities, packages, listings), replayed
    by mallory against alice."""
    from arranger.client.package import ship  # noqa: PLC0415

    alice, mallory = c["alice"], c["mallory"]
    found: dict[str, Any] = {}
    found["priority 10 in the default queue"] = await outcome(
        mallory.submit(parked("m-top", priority=10), queue_anyway=True)
    )
    secret = tmp / "alice-code"
    secret.mkdir()
    (secret / "train.py").write_text("KEY = 'alice-private'\n")
    shipped = await ship(alice, secret)
    have = await mallory.has_package(shipped.package.sha256)
    found["ask whether alice's package hash is held"] = f"present={have.present}"
    theirs = parked("m-pkg")
    theirs["spec"]["package"] = {"sha256": shipped.package.sha256, "size": shipped.package.size}
    found["a job naming alice's package hash"] = await outcome(mallory.submit(theirs))

    # Packages of random bytes until the per-user quota (set low for this run) refuses one.
    accepted, refusal = 0, ""
    for i in range(40):
        junk = tmp / f"junk-{i}"
        junk.mkdir()
        (junk / "blob").write_bytes(os.urandom(3 * 2**20))
        try:
            await ship(mallory, junk)
            accepted += 1
        except ArrangerError as exc:
            refusal = f"{exc.code.name}: {exc.message[:150]}"
            break
    found["3 MiB packages until refused (quota 16 MiB)"] = f"{accepted} stored; then {refusal}"

    # Event listings of 100,000 back to back: a page of 1,000 each, then the rate limit.
    served, most, refusal = 0, 0, ""
    request = arranger_pb2.ListEventsRequest(limit=100_000)  # as one old client asks
    for _ in range(300):
        try:
            reply = await mallory._call(lambda stub: stub.ListEvents(request, timeout=30))
            page = len(reply.events)
        except ArrangerError as exc:
            refusal = f"{exc.code.name}: {exc.message[:120]}"
            break
        served, most = served + 1, max(most, page)
    found["ListEvents(limit=100000) back to back"] = (
        f"{served} answered, at most {most} events each; then {refusal}"
    )
    return found


async def dashboard_attacks(url: str) -> dict[str, str]:
    """dashboard_attacks: a login form from an opaque origin, and guessed tokens."""
    import aiohttp  # noqa: PLC0415

    found: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/login",
            data={"token": "arr_x"},
            headers={"Origin": "null"},
            allow_redirects=False,
        ) as reply:
            found["login form from Origin null"] = f"HTTP {reply.status}"
        statuses = []
        for i in range(15):
            async with http.post(
                f"{url}/login", data={"token": f"arr_guess{i}"}, allow_redirects=False
            ) as reply:
                statuses.append(reply.status)
        first = statuses.index(429) + 1 if 429 in statuses else None
        found["15 guessed tokens at the login"] = (
            f"{statuses.count(401)} refused 401, then 429 from try {first}"
        )
    return found


async def dev_attacks(tmp: Path) -> dict[str, str]:
    """dev_attacks: `arranger dev`'s server reached without its owner's login (another
    account reaches 127.0.0.1 alike; tests/e2e/test_dev_owner.py runs it as a real one)."""
    import grpc  # noqa: PLC0415

    from arranger.client.dev import DevCluster, DevOptions  # noqa: PLC0415
    from arranger.v1 import agent_pb2, agent_pb2_grpc, arranger_pb2_grpc  # noqa: PLC0415

    found: dict[str, str] = {}
    cluster = DevCluster(DevOptions(agents=1, port=0), tmp / "dev")
    await cluster.start()
    try:
        async with grpc.aio.insecure_channel(cluster.address) as channel:
            try:
                await arranger_pb2_grpc.ArrangerStub(channel).ListJobs(
                    arranger_pb2.ListJobsRequest(), timeout=10
                )
                found["list a dev cluster's jobs without its login"] = "allowed"
            except grpc.aio.AioRpcError as exc:
                found["list a dev cluster's jobs without its login"] = (
                    f"refused {exc.code().name}: {exc.details()}"
                )
            register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="mallory"))
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([register]), timeout=10)
            try:
                async for _ in call:
                    pass
                found["register an agent with a dev cluster"] = "allowed"
            except grpc.aio.AioRpcError as exc:
                found["register an agent with a dev cluster"] = (
                    f"refused {exc.code().name}: {exc.details()}"
                )
    finally:
        await cluster.stop()
    return found


def modes(data_dir: Path) -> str:
    """modes: the permission bits of the store's directory and files."""
    files = sorted(p for p in data_dir.iterdir() if p.name.startswith("arranger.db"))
    shown = " ".join(f"{p.name} {oct(p.stat().st_mode & 0o777)}" for p in files)
    return f"{shown}; dataDir {oct(data_dir.stat().st_mode & 0o777)}"


def _token_names(data_dir: Path) -> list[str]:
    from arranger.server.store import on_store, sqlite_url  # noqa: PLC0415

    tokens = on_store(sqlite_url(data_dir / "arranger.db"), lambda store: store.list_tokens())
    return [f"{t.name} {t.user}" for t in tokens]


async def submit_latency(address: str, submits: int, prefix: str, **client: Any) -> list[float]:
    """submit_latency: seconds per submit of a parked job, one after another."""
    latencies = []
    async with AsyncClient(address, timeout_s=60, **client) as c:
        for i in range(submits):
            started = time.perf_counter()
            await c.submit(parked(f"{prefix}-{i}"), queue_anyway=True)
            latencies.append(time.perf_counter() - started)
    return latencies


def authorization_cpu_us(rounds: int = 20_000) -> float:
    """authorization_cpu_us: CPU microseconds of the authorization steps of one submit (queue
    policy, host paths, denied variables, per-user limits), measured in-process."""
    from arranger.client.sdk import as_job  # noqa: PLC0415
    from arranger.identity import Principal, Role  # noqa: PLC0415
    from arranger.server.access import SubmitPolicy  # noqa: PLC0415
    from arranger.server.limits import SubmitGate, UserLimits  # noqa: PLC0415
    from arranger.server.queues import DEFAULT  # noqa: PLC0415
    from arranger.server.validation import parse_job  # noqa: PLC0415

    spec = parse_job(as_job(parked("cost")))
    policy = SubmitPolicy(allowed_host_paths=("/data",))
    gate = SubmitGate(UserLimits(submits_per_s=1e9, submit_burst=10**9), lambda _: True)
    who = Principal("alice", Role.USER)
    started = time.process_time()
    for i in range(rounds):
        policy.problems(spec, who, DEFAULT)
        gate.problem(who, 2, float(i))
    return (time.process_time() - started) / rounds * 1e6


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": round(1000 * statistics.median(ordered), 2),
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=300)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    }
    with tempfile.TemporaryDirectory(prefix="arranger-hostile-") as name:
        tmp = Path(name)
        tls = tmp / "tls"
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            cli(["certs", "--out", str(tls), "--server-host", "127.0.0.1", "--agent", "n1"])
        secure = {
            "tls": {
                "ca": str(tls / "ca.pem"),
                "cert": str(tls / "server.pem"),
                "key": str(tls / "server.key"),
            },
            "agentListen": f"127.0.0.1:{free_port()}",
            "allowedHostPaths": [str(tmp)],
        }
        web = free_port()
        attacked = {
            **secure,
            "httpListen": f"127.0.0.1:{web}",
            "limits": {"storedPackageBytesPerUser": 16 * 2**20},
        }
        with server_process(tmp, "secure", attacked) as address:
            data_dir = tmp / "secure"
            probe = token(data_dir, "probe", "admin")
            asyncio.run(serving(address, ca=tls / "ca.pem", token=probe))
            result["attacks"] = asyncio.run(attacks(address, tls / "ca.pem", data_dir))
            result["attacks"].update(asyncio.run(dashboard_attacks(f"http://127.0.0.1:{web}")))
        result["attacks"].update(asyncio.run(dev_attacks(tmp)))
        # Latency: a user unhindered by the rate limit (the limits are the same checks).
        fast = {
            **secure,
            "agentListen": f"127.0.0.1:{free_port()}",
            "limits": {"submitsPerSecond": 10**6, "submitBurst": 10**6},
        }
        with server_process(tmp, "fast", fast) as address:
            user = token(tmp / "fast", "bench")
            asyncio.run(serving(address, ca=tls / "ca.pem", token=user))
            secured = asyncio.run(
                submit_latency(address, args.submits, "s", ca=tls / "ca.pem", token=user)
            )
        with server_process(tmp, "insecure", {"insecure": True}) as address:
            asyncio.run(serving(address))
            insecure = asyncio.run(submit_latency(address, args.submits, "i"))
    result["submit_latency"] = {
        "tls_and_token_user": summary(secured),
        "insecure_local_admin": summary(insecure),
        "submits": args.submits,
    }
    result["authorization_cpu_us_per_submit"] = round(authorization_cpu_us(), 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
