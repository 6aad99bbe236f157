"""gpu_check.py: the probes bench/gpu_check.sh runs on a lent GPU machine (see that script).

Standard library only, except `torch` where a probe needs the GPU, imported late and reported
when missing, so one copy runs as root (facts), inside an Arranger pod as another user (pod)
and as throw-away users under MPS (mps, mpsmem). Every probe prints what it measured as plain
lines and ends with one `RESULT {json}` line that the script (or `verdict`) reads back.

    python3 gpu_check.py facts                  imports, NVML's GPUs, bpf(2), torch's view
    python3 gpu_check.py pod gpu|nogpu|pids     inside a pod: device opens, CUDA, pids limit
    python3 gpu_check.py pod share|share-raised [DIR N]
                                                inside a pod given 0.5 of a GPU under the
                                                agent's MPS daemon: 0.4 and 0.6 of the GPU's
                                                memory (share-raised: after raising its own
                                                MPS variables), a greedy allocator, matmuls
                                                (begun once N pods are ready in DIR) and JAX
                                                preallocating as it does by default; with
                                                share-raised DIR: then waits while DIR/hold
                                                exists, and computes and allocates again
    python3 gpu_check.py mps SECONDS TAG        a loop of bf16 4096x4096 matmuls for SECONDS
    python3 gpu_check.py mpsmem TAG             allocate 1 GiB, then 3 GiB, on cuda:0
    python3 gpu_check.py verdict FILE...        were the mps runs in FILEs concurrent?
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def say(*words: object) -> None:
    print(*words, flush=True)


def result(**fields: object) -> None:
    say("RESULT " + json.dumps(fields, sort_keys=True, default=str))


def stamp() -> str:
    return time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"


def try_open(path: str) -> str:
    """try_open: "ok" if `path` opens for reading and writing, else the errno's name."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def nvidia_nodes() -> list[str]:
    gpus = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    return gpus + [p for p in NODES if os.path.exists(p)]


def own_cgroup_files() -> dict[str, str]:
    """own_cgroup_files: this process's pids.max, memory limit and cgroup path(s)."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return {"error": str(exc)}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        found["cgroup " + (controllers or "v2")] = path
        roots = (
            [f"/sys/fs/cgroup/{c}" for c in controllers.split(",") if c]
            if controllers
            else ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        )
        for root in roots:
            for knob in ("pids.max", "memory.max", "memory.limit_in_bytes", "cpu.max"):
                f = Path(root + path) / knob
                if knob not in found and f.is_file():
                    try:
                        found[knob] = f.read_text().strip()
                    except OSError as exc:
                        found[knob] = f"unreadable: {exc.strerror}"
    return found


def facts() -> int:
    say("python", sys.version.split()[0], sys.executable, platform.machine())
    for name in (
        "arranger",
        "pynvml",
        "psutil",
        "yaml",
        "grpc",
        "google.protobuf",
        "structlog",
        "rich",
        "numpy",
        "aiohttp",
        "jinja2",
        "prometheus_client",
        "cryptography",
    ):
        try:
            module = __import__(name, fromlist=["__name__"])
            say(
                f"import {name}: ok {getattr(module, '__version__', '')} "
                f"{os.path.dirname(getattr(module, '__file__', '') or '')}"
            )
        except Exception as exc:
            say(f"import {name}: FAILED {type(exc).__name__}: {exc}")
    nvml: list[dict[str, object]] = []
    try:
        import pynvml  # noqa: PLC0415 (where it is missing, the probe says so)

        pynvml.nvmlInit()
        try:
            say("NVML driver", pynvml.nvmlSystemGetDriverVersion())
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpu = {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "minor": pynvml.nvmlDeviceGetMinorNumber(h),
                    "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
                    "uuid": pynvml.nvmlDeviceGetUUID(h),
                }
                try:
                    current, pending = pynvml.nvmlDeviceGetMigMode(h)
                    gpu["mig"] = f"current={current} pending={pending}"
                except Exception as exc:
                    gpu["mig"] = f"n/a ({exc})"
                try:
                    gpu["compute_mode"] = pynvml.nvmlDeviceGetComputeMode(h)
                except Exception as exc:
                    gpu["compute_mode"] = f"n/a ({exc})"
                nvml.append(gpu)
                say("NVML GPU", json.dumps(gpu, default=str))
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        say(f"NVML: FAILED {type(exc).__name__}: {exc}")
    bpf_ok: object = None
    try:
        from arranger.agent import bpf, devices  # noqa: PLC0415

        fd = bpf.load_device_program(devices.program((devices.Rule(devices.NVIDIA_MAJOR),)))
        os.close(fd)
        bpf_ok = True
        say("bpf(2) BPF_PROG_LOAD of a cgroup device program: ok")
    except Exception as exc:
        bpf_ok = f"{type(exc).__name__}: {exc}"
        say(f"bpf(2) BPF_PROG_LOAD of a cgroup device program: FAILED {bpf_ok}")
    try:
        from arranger.agent.devices import GpuNodes  # noqa: PLC0415

        nodes = GpuNodes.find({int(g["index"]): int(g["minor"]) for g in nvml})  # type: ignore[call-overload]
        say("arranger GpuNodes.find:", nodes, "| a no-GPU pod is denied:", nodes.denied([]))
    except Exception as exc:
        say(f"arranger GpuNodes.find: FAILED {type(exc).__name__}: {exc}")
    torch_info: dict[str, object] = {}
    started = time.monotonic()
    try:
        import torch  # noqa: PLC0415 (only where a probe needs the GPU)

        torch_info = {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "file": os.path.dirname(torch.__file__),
            "import_s": round(time.monotonic() - started, 2),
        }
        torch_info["available"] = torch.cuda.is_available()
        torch_info["count"] = torch.cuda.device_count()
        if torch_info["available"]:
            torch_info["name"] = torch.cuda.get_device_name(0)
            torch_info["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception as exc:
        torch_info["error"] = f"{type(exc).__name__}: {exc}"
    say("torch (as root):", json.dumps(torch_info))
    result(nvml=nvml, bpf=bpf_ok, torch=torch_info)
    return 0


def pod(mode: str, meet: list[str]) -> int:
    say(
        f"{stamp()} probe {mode}: uid={os.getuid()} euid={os.geteuid()} gid={os.getgid()} "
        f"user={os.environ.get('USER')} python={sys.executable}"
    )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    say(f"CUDA_VISIBLE_DEVICES as given: {visible!r}")
    for key, value in own_cgroup_files().items():
        say(f"  {key}: {value}")
    out: dict[str, object] = {"mode": mode, "uid": os.getuid(), "cvd": visible}
    out["rlimit_nproc"] = _nproc()
    if mode == "pids":
        out.update(_fork_many(200))
        result(**out)
        return 0
    if mode.startswith("share"):
        out.update(_share_probe(raised=mode == "share-raised", meet=meet))
        result(**out)
        return 0
    if mode == "nogpu":
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        say("CUDA_VISIBLE_DEVICES deleted: the filter, not the environment, must refuse")
    opens = {path: try_open(path) for path in nvidia_nodes()}
    for path, got in opens.items():
        say(f"  os.open({path!r}, O_RDWR): {got}")
    out["opens"] = opens
    try:
        smi = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        )
        said = (smi.stdout + smi.stderr).strip()
        say(f"  nvidia-smi -L (rc {smi.returncode}): {said}")
        out["nvidia_smi"] = f"rc {smi.returncode}: {said[:300]}"
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"  nvidia-smi -L: {exc}")
        out["nvidia_smi"] = str(exc)
    out.update(_torch_probe())
    result(**out)
    return 0


def _share_probe(raised: bool, meet: list[str]) -> dict[str, object]:
    """_share_probe: what a pod given a share may allocate: 0.4, then 0.6, of the GPU's memory
    (a 0.5 share held by its MPS daemon: the first fits, the second fails). `raised`: first
    asks for more in its own environment, as any program may (the daemon's limit must hold).
    Dropping CUDA_MPS_PIPE_DIRECTORY would leave MPS altogether: not what this probes.
    `meet` (DIR N): the matmul loop begins once N pods have said they are ready in DIR, so
    that pods of different owners measure their shares of the GPU at the same time."""
    if raised:
        os.environ.update(
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1000G"
        )
    keys = ("CUDA_MPS", "CUDA_VISIBLE", "XLA_", "TF_FORCE", "ARRANGER_GPU")
    env = {k: v for k, v in os.environ.items() if k.startswith(keys)}
    say(f"{stamp()} share probe: env={env}")
    out: dict[str, object] = {"env": env}
    try:
        import torch  # noqa: PLC0415 (only where a probe needs the GPU)

        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        out["mem_get_info_gib"] = [round(free / 2**30, 2), round(total / 2**30, 2)]
        out["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        for fraction in (0.4, 0.6):
            try:
                x = torch.empty(int(fraction * total), dtype=torch.uint8, device="cuda")
                x.fill_(1)
                torch.cuda.synchronize()
                got = "ok"
                del x
            except Exception as exc:
                got = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            torch.cuda.empty_cache()
            out[f"alloc_{fraction}"] = got
            say(f"{stamp()} allocate {fraction} of {total / 2**30:.1f} GiB: {got}")
        # As a preallocating framework does: take 256 MiB blocks until none is left. Held to
        # its share, it stops near 0.5 of the card, and its neighbour still has the rest.
        blocks = []
        with contextlib.suppress(Exception):
            while len(blocks) * 256 < total / 2**20:
                blocks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
        out["greedy_gib"] = round(len(blocks) / 4, 2)
        say(f"{stamp()} a greedy program took {out['greedy_gib']} GiB of {total / 2**30:.1f}")
        del blocks
        torch.cuda.empty_cache()
        if meet and not raised:
            out["met"] = _meet(Path(meet[0]), int(meet[1]))
        started = time.time()
        out["matmuls_per_s"] = _matmul_rate(torch)  # against the whole GPU's: the cost of a share
        out["matmul_window"] = [round(started, 2), round(time.time(), 2)]
        say(f"{stamp()} bf16 4096^2 matmuls held to the share: {out['matmuls_per_s']}/s")
        if meet and raised:
            out.update(_after_hold(torch, Path(meet[0]) / "hold", int(total)))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
        say(f"{stamp()} share probe: FAILED {out['error']}")
    if not raised:
        out["jax"] = _jax_probe()
    return out


def _after_hold(torch: Any, hold: Path, total: int, timeout_s: float = 45.0) -> dict[str, object]:
    """_after_hold: wait while `hold` exists (the script kills this pod's MPS control daemon
    meanwhile), then see whether this client still computes and is still held to its share."""
    deadline = time.monotonic() + timeout_s
    say(f"{stamp()} holding while {hold} exists")
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    out: dict[str, object] = {"held": "released" if not hold.exists() else "timed out"}
    try:
        out["after_matmuls_per_s"] = _matmul_rate(torch, 1.0)
        x = torch.empty(int(0.6 * total), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        out["after_alloc_0.6"] = "ok"
        del x
    except Exception as exc:
        out.setdefault("after_matmuls_per_s", "failed")
        out["after_alloc_0.6"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    say(f"{stamp()} after its daemon was killed: {out}")
    return out


def _meet(where: Path, count: int, timeout_s: float = 40.0) -> str:
    """_meet: say this pod is ready in `where`, then wait until `count` pods have (or the
    timeout passed): a barrier between pods of different accounts, through files."""
    (where / f"{os.getpid()}-{os.getuid()}").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(where.iterdir())) >= count:
            say(f"{stamp()} met the other pods ({count} ready)")
            return "met"
        time.sleep(0.05)
    say(f"{stamp()} the other pods did not come within {timeout_s:.0f} s: measuring alone")
    return "alone"


JAX_PROGRAM = """
import json, os, jax, jax.numpy as jnp
device = jax.devices()[0]
x = jnp.ones((8192, 8192), jnp.bfloat16)
total = float((x @ x).astype(jnp.float32).sum().block_until_ready())
stats = device.memory_stats() or {}
print("JAX " + json.dumps({"device": str(device), "sum_ok": abs(total / 8192.0 ** 3 - 1) < 1e-3,
    "bytes_limit_gib": round(stats.get("bytes_limit", 0) / 2**30, 2),
    "peak_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 2),
    "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")}))
"""


def _jax_probe() -> str:
    """_jax_probe: JAX as an ordinary program runs it, preallocating what its environment lets it
    (the agent's XLA_PYTHON_CLIENT_MEM_FRACTION for a share), in a process of its own beside
    this one (which keeps its CUDA context): does it fit in the share and compute?"""
    started = time.monotonic()
    try:
        run = subprocess.run(
            [sys.executable, "-c", JAX_PROGRAM],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        got = f"did not run: {exc}"
    else:
        lines = (run.stdout + run.stderr).strip().splitlines()
        said = [line for line in lines if line.startswith("JAX ")]
        got = said[-1].removeprefix("JAX ") if said else f"rc {run.returncode}: {lines[-3:]}"
    got = f"{got} ({time.monotonic() - started:.1f} s)"[:800]
    say(f"{stamp()} JAX with its default preallocation: {got}")
    return got


def _matmul_rate(torch: Any, seconds: float = 3.0) -> float:
    """_matmul_rate: bf16 4096^2 matmuls a second, over `seconds` after a warm-up."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    count, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    return round(count / (time.monotonic() - start), 1)


def _nproc() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    return f"{soft} {hard}"


def _fork_many(wanted: int) -> dict[str, object]:
    """_fork_many forks up to `wanted` children that sleep, counts them, then ends them."""
    children: list[int] = []
    failure = ""
    for _ in range(wanted):
        try:
            pid = os.fork()
        except OSError as exc:
            failure = errno.errorcode.get(exc.errno or 0, str(exc))
            break
        if pid == 0:
            try:
                time.sleep(60)
            finally:
                os._exit(0)
        children.append(pid)
    say(f"  forked {len(children)} of {wanted} children; first failure: {failure or 'none'}")
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
    return {"forked": len(children), "wanted": wanted, "fork_error": failure}


def _torch_probe() -> dict[str, object]:
    out: dict[str, object] = {}
    started = time.monotonic()
    try:
        import torch  # noqa: PLC0415 (only where a probe needs the GPU)
    except Exception as exc:
        say(f"  import torch: FAILED {type(exc).__name__}: {exc}")
        return {"torch": f"import failed: {exc}"}
    out["torch_import_s"] = round(time.monotonic() - started, 2)
    try:
        out["cuda_available"] = torch.cuda.is_available()
        out["device_count"] = torch.cuda.device_count()
        say(
            f"  torch {torch.__version__}: cuda.is_available()={out['cuda_available']} "
            f"device_count()={out['device_count']}"
        )
        try:
            torch.cuda.init()
            out["cuda_init"] = "ok"
        except Exception as exc:
            out["cuda_init"] = f"{type(exc).__name__}: {exc}"[:400]
        say(f"  torch.cuda.init(): {out['cuda_init']}")
        if out["cuda_available"]:
            a = torch.randn(1024, 1024, device="cuda")
            b = torch.randn(1024, 1024, device="cuda")
            c = a @ b
            torch.cuda.synchronize()
            ref = a.cpu() @ b.cpu()
            err = float((c.cpu() - ref).abs().max())
            out["matmul"] = f"ok on {torch.cuda.get_device_name(0)}, max |diff| vs CPU {err:.3g}"
            say(f"  matmul on cuda: {out['matmul']}")
            out["matmuls_per_s"] = _matmul_rate(torch)  # a whole GPU, beside a share's
            say(f"  bf16 4096^2 matmuls on a whole GPU: {out['matmuls_per_s']}/s")
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"[:400]
        say(f"  torch: FAILED {out['torch_error']}")
    return out


def mps(seconds: float, tag: str) -> int:
    """mps: a loop of bf16 4096^2 matmuls for `seconds`, with the time of each stage."""
    t0 = time.time()
    env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}
    say(f"{stamp()} {tag}: start uid={os.getuid()} pid={os.getpid()} env={env}")
    out: dict[str, object] = {"tag": tag, "uid": os.getuid(), "pid": os.getpid(), "t0": t0}
    try:
        import torch  # noqa: PLC0415 (only where a probe needs the GPU)

        say(f"{stamp()} {tag}: torch imported")
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        c = a @ b
        torch.cuda.synchronize()
        out["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        out["ready"] = time.time()
        say(
            f"{stamp()} {tag}: CUDA ready ({out['ready'] - t0:.2f} s after start), "
            f"SMs seen {out['sms']}"
        )
        n, start = 0, time.time()
        while time.time() - start < seconds:
            for _ in range(10):
                c = a @ b
            torch.cuda.synchronize()
            n += 10
        end = time.time()
        del c
        out.update(
            start=start,
            end=end,
            iters=n,
            per_s=round(n / (end - start), 1),
            tflops=round(n * 2 * 4096**3 / (end - start) / 1e12, 1),
        )
        say(
            f"{stamp()} {tag}: {n} matmuls in {end - start:.2f} s ({out['per_s']}/s, "
            f"{out['tflops']} TFLOP/s)"
        )
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
        say(f"{stamp()} {tag}: FAILED {out['error']}")
    result(**out)
    return 0


def mpsmem(tag: str) -> int:
    """mpsmem: what a client may allocate: 1 GiB, then (after freeing it) 3 GiB."""
    env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}
    say(f"{stamp()} {tag}: start uid={os.getuid()} env={env}")
    out: dict[str, object] = {"tag": tag, "env": env}
    try:
        import torch  # noqa: PLC0415 (only where a probe needs the GPU)

        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        out["mem_get_info_gib"] = [round(free / 2**30, 2), round(total / 2**30, 2)]
        say(f"{stamp()} {tag}: mem_get_info free/total GiB {out['mem_get_info_gib']}")
        for gib in (1, 3):
            try:
                x = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda")
                x.fill_(1)
                torch.cuda.synchronize()
                out[f"alloc_{gib}g"] = "ok"
                del x
            except Exception as exc:
                out[f"alloc_{gib}g"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            torch.cuda.empty_cache()
            say(f"{stamp()} {tag}: allocate {gib} GiB: {out[f'alloc_{gib}g']}")
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
        say(f"{stamp()} {tag}: FAILED {out['error']}")
    result(**out)
    return 0


def verdict(files: list[str]) -> int:
    """verdict: whether the mps runs whose outputs are `files` ran their loops at once, one
    after another, or did not finish."""
    runs = []
    for name in files:
        found = None
        try:
            for line in Path(name).read_text(errors="replace").splitlines():
                if line.startswith("RESULT "):
                    found = json.loads(line.removeprefix("RESULT "))
        except OSError:
            pass
        if found is None or "start" not in found:
            why = (found or {}).get("error", "no result (hung until its timeout, or died)")
            say(f"  {name}: DID NOT FINISH: {why}")
        runs.append((name, found))
    done = [(n, r) for n, r in runs if r and "start" in r]
    for n, r in done:
        say(
            f"  {Path(n).name}: waited {r['ready'] - r['t0']:.2f} s to get CUDA, loop "
            f"{r['start'] - done[0][1]['t0']:.2f}..{r['end'] - done[0][1]['t0']:.2f} s after the "
            f"first start, {r['iters']} matmuls ({r['tflops']} TFLOP/s, SMs seen {r['sms']})"
        )
    if len(done) < len(runs):
        say("VERDICT: not all finished (a hang or a failure: see above)")
    elif len(done) >= 2:
        overlap = min(r["end"] for _, r in done) - max(r["start"] for _, r in done)
        if overlap > 0:
            say(f"VERDICT: concurrent (the loops overlapped {overlap:.2f} s)")
        else:
            say(f"VERDICT: serialized (one loop began {-overlap:.2f} s after the other ended)")
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        say(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "facts":
        return facts()
    if command == "pod":
        return pod(rest[0], rest[1:3])
    if command == "mps":
        return mps(float(rest[0]), rest[1])
    if command == "mpsmem":
        return mpsmem(rest[0])
    if command == "verdict":
        return verdict(rest)
    say(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
