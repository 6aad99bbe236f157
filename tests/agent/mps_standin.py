"""mps_standin: a stand-in for nvidia-cuda-mps-control, for tests on machines without a GPU.

    mps_standin.py -d   the daemon: forks, and the child (a new session, stdio on /dev/null)
                        listens on $CUDA_MPS_PIPE_DIRECTORY/control, writes its pid to
                        nvidia-cuda-mps-control.pid there, and only then lets the parent exit 0
    mps_standin.py      a control client: sends stdin's lines to the daemon and prints its
                        answers; exits 1 when no daemon listens there (as the real one fails)

The daemon answers get_default_active_thread_percentage and get_default_device_pinned_mem_limit
DEV with what set_default_* set (100 and "none" before), and ends on `quit`. Everything it
does goes, one JSON line each, to the file $MPS_STANDIN_RECORD names (the wrapper the test
writes sets it): {"event": "start", "pipe", "log", "devices" (its CUDA_VISIBLE_DEVICES),
"pid"}, then {"event": "command", "pipe", "command"} per line, in the order received. A
command starting with $MPS_STANDIN_FAIL (when set) makes the client exit 1 without sending it.
"""

from __future__ import annotations

import json
import os
import socket
import sys

PID_FILE = "nvidia-cuda-mps-control.pid"


def record(**fields: object) -> None:
    fd = os.open(os.environ["MPS_STANDIN_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def serve(pipe: str, listener: socket.socket) -> None:
    threads, memory = "100", dict[str, str]()
    while True:
        conn, _ = listener.accept()
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
        answers = []
        quit_ = False
        for line in data.decode().splitlines():
            record(event="command", pipe=pipe, command=line)
            words = line.split()
            if not words:
                continue
            if words[0] == "set_default_active_thread_percentage":
                threads = words[1]
            elif words[0] == "set_default_device_pinned_mem_limit":
                memory[words[1]] = words[2]
            elif words[0] == "get_default_active_thread_percentage":
                answers.append(threads)
            elif words[0] == "get_default_device_pinned_mem_limit":
                answers.append(memory.get(words[1], "none"))
            elif words[0] == "quit":
                quit_ = True
        conn.sendall("".join(a + "\n" for a in answers).encode())
        conn.close()
        if quit_:
            os.unlink(os.path.join(pipe, "control"))
            os.unlink(os.path.join(pipe, PID_FILE))
            return


def daemon() -> int:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        os.close(ready_w)
        return 0 if os.read(ready_r, 1) == b"1" else 1
    os.close(ready_r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(pipe, "control"))
    listener.listen(8)
    with open(os.path.join(pipe, PID_FILE), "w") as f:
        f.write(f"{os.getpid()}\n")
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    record(event="start", pipe=pipe, log=log, devices=devices, pid=os.getpid())
    os.write(ready_w, b"1")
    os.close(ready_w)
    serve(pipe, listener)
    os._exit(0)


def client() -> int:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    text = sys.stdin.read()
    fail = os.environ.get("MPS_STANDIN_FAIL")
    if fail and any(line.startswith(fail) for line in text.splitlines()):
        print(f"stand-in: refused {fail}")
        return 1
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(os.path.join(pipe, "control"))
    except OSError as exc:
        print(f"Cannot find MPS control daemon process: {exc}")
        return 1
    conn.sendall(text.encode())
    conn.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := conn.recv(4096):
        data += chunk
    sys.stdout.write(data.decode())
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:] == ["-d"] else client())
