"""job: the job's own view of itself, for the programs it runs (the learner above all).

Every pod gets the API's address and a token good for its own job only (ARRANGER_API,
ARRANGER_JOB_TOKEN; ARRANGER_API_CA with TLS), and this module speaks with them:

    from arranger.job import current

    with current() as job:                     # closing it sends what is left to report
        for m in job.members():                # who is in the job now, and where
            print(m.name, m.rank, m.state, m.address("rpc"))
        job.scale("actors", 8)                 # within the set's [minCount, maxCounts]
        events = job.subscribe()               # membership news, read in the background
        for event in events.poll():            # never blocks; events.get(timeout) waits
            if event.kind == "job-evicting":   # the whole job goes in event.seconds_left
                save_checkpoint()
                job.checkpointed()             # ... and it may go now
        job.report(step, mean_return=r, loss=l)        # buffered, sent about once a second
        job.publish(checkpoint="/shared/run/ckpt-120")  # a text: its latest only is kept
        job.heartbeat()                        # progress without values (progressTimeoutSeconds)
        for peer in job.peers():               # the other members of its sweep (experiment)
            print(peer.index, peer.values, peer.latest.get("mean_return"), peer.notes)

Events: `started` (a worker runs), `lost` (a worker that ran no longer does: its state and
reason say why), `evicting` (a worker is to be evicted in `seconds_left`: the scheduler needs
its room), `job-evicting` (the whole job is) and `withdrawn` (a notice is: the pod runs on). A token stops working when its job ends.
`job.checkpointed()` may be called after any checkpoint, not only under a notice: when the
scheduler must evict, of otherwise equal victims it takes the one that loses least work.

Reports: `job.report(step, **values)` queues a point (numbers by key) and returns at once; a
thread of the job's own sends what is queued in one call (ReportValues) at most every
`report_interval_s` (1 s), and `job.flush()`, `job.close()` (the end of a `with`) and the
program's exit send the rest. `job.publish(**notes)` sets texts (a checkpoint's path) the
server keeps the latest of, sent with the next points. A send the server cannot take now (it is
away, restarting or a standby: RETRIED) keeps its points for the next, at most
MAX_PENDING_POINTS, the oldest dropped past that (counted in `reports_dropped`); one it refuses
(a key past the job's 64, keys an earlier attempt reported counted; the job ended) is dropped
too, and `flush` raises it (grpc.RpcError), whichever thread met it. What the server would
never take (a key not [A-Za-z][A-Za-z0-9_./-]* of at most 64 characters, or past the 64 keys
this program reported; a value not finite; a step below 0; a note past 16, or longer than 1,024
characters) is refused at once (ValueError), before it spoils a send. `job.experiment()` reads
the sweep the job is a member of and `job.peers()` its other members: their sweep values,
stage, latest reported values and notes (population-based training exploits and explores with
them).

Progress: each send names this pod (ARRANGER_POD_NAME), so the server counts its reports as
the pod's progress; `job.heartbeat()` says the pod progresses without a value to report (sent
with the next send, one call however many). A pod whose role sets progressTimeoutSeconds and
that reported once and then not for that long is Stalled.
Only the standard library and gRPC are imported (by job_reports too).
"""

from __future__ import annotations

import base64
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from arranger.job_reports import (  # noqa: F401 (some only re-exported, as before)
    CLOSE_TRY_S,
    POINTS_PER_CALL,
    REPORT_INTERVAL_S,
    REPORT_TRY_S,
    RETRIED,
    Experiment,
    NotInExperiment,
    Peer,
    Pending,
    Reporting,
    checked_notes,
    checked_point,
    experiment_of,
    log,
    report_request,
)
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2

__all__ = [
    "Event",
    "Experiment",
    "Job",
    "Member",
    "NotInExperiment",
    "NotInJob",
    "Peer",
    "Subscription",
    "current",
    "member_of",
    "news",
    "server_time",
]

RUNNING = "Running"
FAILOVER_PAUSE_S = 0.5  # after every server of ARRANGER_API refused a call, before the next round
# With several servers, one call's try on one of them: a server that takes no connection and
# refuses nothing (a machine powered off, a network cut) costs this, not the whole timeout.
TRY_S = 5.0
# A connection that answers no ping within seconds is dead: its calls and streams fail
# (UNAVAILABLE) and the job moves on; the server lets agents and clients ping every 5 s.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
Reply = TypeVar("Reply")


class NotInJob(RuntimeError):
    """NotInJob: the program was not started by an Arranger agent (no ARRANGER_JOB_TOKEN)."""


@dataclass(frozen=True)
class Member:
    """Member: one pod of the job as the server knows it now."""

    name: str
    role: str  # leader | worker
    worker_set: str
    index: int
    rank: int
    state: str
    reason: str = ""
    host: str = ""  # its node's address ("" while not placed)
    ports: dict[str, int] = field(default_factory=dict)
    evict_at: float | None = None  # unix seconds: when it is evicted, under notice
    stopping: bool = False  # a stop was ordered; it runs until it has ended

    def address(self, port: str) -> str:
        """address: host:port of one of its named ports ("" when it has none yet)."""
        number = self.ports.get(port)
        return f"{self.host}:{number}" if self.host and number else ""


@dataclass(frozen=True)
class Event:
    """Event: news of the job's membership (see the module's docstring for the kinds)."""

    kind: str
    member: Member
    seconds_left: float | None = None  # for evicting and job-evicting


def member_of(pod: job_pb2.PodStatus) -> Member:
    evict_at = pod.evict_at.ToNanoseconds() / 1e9 if pod.HasField("evict_at") else None
    return Member(
        name=pod.name,
        role=pod.role,
        worker_set=pod.worker_set,
        index=pod.index,
        rank=pod.rank,
        state=pod.state,
        reason=pod.reason,
        host=pod.address,
        ports=dict(pod.ports),
        evict_at=evict_at,
        stopping=pod.stopping,
    )


def server_time(msg: arranger_pb2.WatchJobsResponse) -> float:
    """server_time: the server's clock as it sent `msg`, where it says; else this machine's."""
    if msg.HasField("server_time"):
        return msg.server_time.ToNanoseconds() / 1e9
    return time.time()


def news(before: Member | None, now: Member, clock: float) -> list[Event]:
    """news: the events that one pod's change from `before` (None: not seen yet) to `now`
    makes."""
    events: list[Event] = []
    was_running = before is not None and before.state == RUNNING
    if now.role == "worker" and now.state == RUNNING and not was_running:
        events.append(Event("started", now))
    if now.role == "worker" and was_running and now.state != RUNNING:
        events.append(Event("lost", now))
    if now.evict_at is not None and (before is None or before.evict_at != now.evict_at):
        kind = "job-evicting" if now.role == "leader" else "evicting"
        events.append(Event(kind, now, max(0.0, now.evict_at - clock)))
    noticed = before is not None and before.evict_at is not None
    if noticed and now.evict_at is None and not now.stopping and now.state == RUNNING:
        events.append(Event("withdrawn", now))  # its preemptor no longer needs the room
    return events


class Job(Reporting):
    """Job: the running job, reached with its own token (see `current`).

    `api` may name several servers sharing one store, comma-separated, of which one is active
    (ARRANGER_API does where the cluster has a standby): a call that finds a server
    unreachable or a standby (UNAVAILABLE), or silent for TRY_S, is made again on the next,
    round and round, within its timeout, and the job then stays with the one that answered.
    Its calls may come from several threads (a subscription's and the reporting one's among
    them). `experiment` is the name of the experiment it is a member of, where known
    (ARRANGER_EXPERIMENT; "": the server is asked); `report_interval_s` is the least time
    between two sends of reports (see the module). Its reports and experiment calls (report,
    publish, flush, reports_dropped, experiment, peers) are Reporting's (job_reports)."""

    def __init__(
        self,
        api: str,
        token: str,
        job_id: str,
        ca_pem: bytes | None = None,
        experiment: str = "",
        report_interval_s: float = REPORT_INTERVAL_S,
        pod: str = "",
    ) -> None:
        self.id = job_id
        self.pod = pod  # the pod this program runs in: its reports are its progress
        self._metadata = (("authorization", f"Bearer {token}"),)
        self.servers = [a.strip() for a in api.split(",") if a.strip()] or [api]
        credentials = grpc.ssl_channel_credentials(ca_pem) if ca_pem else None
        self._channels = [
            grpc.secure_channel(a, credentials, options=CHANNEL_OPTIONS)
            if credentials
            else grpc.insecure_channel(a, options=CHANNEL_OPTIONS)
            for a in self.servers
        ]
        self._stubs = [arranger_pb2_grpc.ArrangerStub(c) for c in self._channels]
        self._current = 0  # the server that answered last
        self.streaming = 0  # the server the last `events` stream went to
        self._moving = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self._closed = threading.Event()
        super().__init__(experiment, report_interval_s)

    @property
    def current(self) -> str:
        """current: the server this job's calls go to now."""
        return self.servers[self._current]

    def close(self) -> None:
        """close ends the job's subscriptions, sends what is left to report (after a send
        of the reporting thread under way, for at most CLOSE_TRY_S; what cannot be sent is
        counted in `reports_dropped` and logged, never raised: call `flush` first to know),
        then closes its connections."""
        if self._closed.is_set():
            return
        self._closed.set()
        for subscription in self._subscriptions:
            subscription.close()
        self._end_reports()
        for channel in self._channels:
            channel.close()

    def next_server(self, failed: int) -> None:
        """next_server: calls go to the server after `failed` (an index into `servers`) from
        now on, unless another thread has moved on from it already."""
        with self._moving:
            if self._current == failed:
                self._current = (failed + 1) % len(self._stubs)

    def _unary(self, method: str, request: object, timeout_s: float, answer: type[Reply]) -> Reply:
        """_unary makes a call on the current server, moving on while one is unavailable or
        silent (see the class)."""
        deadline = time.monotonic() + timeout_s
        single = len(self._stubs) == 1
        tried = 0
        while True:
            at = self._current
            call = getattr(self._stubs[at], method)
            left = deadline - time.monotonic()
            try:
                reply: Reply = call(
                    request, metadata=self._metadata, timeout=left if single else min(left, TRY_S)
                )
                return reply
            except grpc.RpcError as exc:
                moving_on = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if single or exc.code() not in moving_on:
                    raise
                tried += 1
                pause = FAILOVER_PAUSE_S if tried % len(self._stubs) == 0 else 0.0
                if time.monotonic() + pause >= deadline:
                    raise
                self.next_server(at)
                time.sleep(pause)  # a whole round was refused: a standby is taking over

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, timeout_s: float = 30.0) -> job_pb2.TYJob:
        """get: the whole job as the server knows it now."""
        request = arranger_pb2.GetJobRequest(name=self.id)
        return self._unary("GetJob", request, timeout_s, job_pb2.TYJob)

    def members(self) -> list[Member]:
        """members: the leader, then the workers wanted now, by rank (the job's status also
        lists the workers a scale-down ended; they are left out)."""
        job = self.get()
        wanted = {ws.name: ws.counts for ws in job.spec.worker_sets}
        workers = [w for w in job.status.workers if w.index < wanted.get(w.worker_set, 0)]
        return [member_of(job.status.leader), *map(member_of, workers)]

    def scale(self, worker_set: str, counts: int) -> job_pb2.TYJob:
        """scale sets how many workers of the set the job wants; a count beyond the set's
        [minCount, maxCounts] is refused (grpc.RpcError, INVALID_ARGUMENT, naming the field)."""
        request = arranger_pb2.ScaleJobRequest(name=self.id, worker_set=worker_set, counts=counts)
        return self._unary("ScaleJob", request, 30.0, job_pb2.TYJob)

    def checkpointed(self) -> job_pb2.TYJob:
        """checkpointed: the learner has saved what it needs, now. Call it after every
        checkpoint, notice or not: the server keeps when (status.checkpoint_time, its clock),
        and of otherwise equal victims the scheduler evicts the one that loses least work
        first. Under a notice of the whole job's eviction, that eviction goes ahead now,
        without waiting for the notice's end."""
        request = arranger_pb2.ConfirmCheckpointRequest(name=self.id)
        return self._unary("ConfirmCheckpoint", request, 30.0, job_pb2.TYJob)

    def events(self) -> Iterator[Event]:
        """events yields the membership news from now on (a pod already under notice is
        told at once), until the job ends or the stream breaks."""
        request = arranger_pb2.WatchJobsRequest(name=self.id)
        self.streaming = self._current
        stream = self._stubs[self.streaming].WatchJobs(request, metadata=self._metadata)
        known: dict[str, Member] = {}
        try:
            for msg in stream:
                # The time left is counted on the server's clock where it says it: this
                # machine's may differ from the server's.
                clock = server_time(msg)
                if msg.type == "SYNCED":
                    for m in self.members():  # the baseline: later changes follow in order
                        if m.evict_at is not None:
                            yield from news(None, m, clock)
                        known[m.name] = m
                for pod in msg.pods:
                    now = member_of(pod)
                    yield from news(known.get(now.name), now, clock)
                    known[now.name] = now
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED):
                raise
        finally:
            stream.cancel()

    def subscribe(self) -> Subscription:
        """subscribe reads `events` on a thread of its own, for a program that cannot wait."""
        subscription = Subscription(self)
        self._subscriptions.append(subscription)
        return subscription


class Subscription:
    """Subscription: a job's events gathered in the background (see Job.subscribe). A stream
    the server breaks (a restart, a failover, a lost connection) is opened again, after
    RETRY_S, doubling up to RETRY_MAX_S, until the job ends (`ended` is then set) or `close`
    is called; a pod already under notice is told again when it is."""

    RETRY_S, RETRY_MAX_S = 0.5, 8.0

    def __init__(self, job: Job) -> None:
        self._queue: queue.Queue[Event] = queue.Queue()
        self.ended = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(job,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        """close stops opening the stream again (the job's channel closes it)."""
        self._closed.set()

    def _read(self, job: Job) -> None:
        wait = self.RETRY_S
        while not self._closed.is_set():
            try:
                for event in job.events():
                    self._queue.put(event)
                    wait = self.RETRY_S
                if self._closed.is_set():
                    break
                job.get()  # the stream ended: the job did (refused), or the server went
            except grpc.RpcError as exc:
                if exc.code() not in RETRIED:
                    break
                job.next_server(job.streaming)  # it went, or is a standby: try the next
            except ValueError:  # the channel was closed under it (Job.close)
                break
            self._closed.wait(wait)
            wait = min(wait * 2, self.RETRY_MAX_S)
        self.ended.set()

    def poll(self) -> list[Event]:
        """poll: the events that came since the last call (never blocks)."""
        found: list[Event] = []
        while True:
            try:
                found.append(self._queue.get_nowait())
            except queue.Empty:
                return found

    def get(self, timeout_s: float | None = None) -> Event | None:
        """get waits for the next event (None after `timeout_s`)."""
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


def current(report_interval_s: float = REPORT_INTERVAL_S) -> Job:
    """current: the job this program runs in, from the environment its agent gave it."""
    token = os.environ.get("ARRANGER_JOB_TOKEN", "")
    api = os.environ.get("ARRANGER_API", "")
    job_id = os.environ.get("ARRANGER_JOB_ID", "")
    if not (token and api and job_id):
        raise NotInJob(
            "no ARRANGER_JOB_TOKEN, ARRANGER_API or ARRANGER_JOB_ID: not run by Arranger"
        )
    ca = os.environ.get("ARRANGER_API_CA", "")
    experiment = os.environ.get("ARRANGER_EXPERIMENT", "")
    pod = os.environ.get("ARRANGER_POD_NAME", "")
    ca_pem = base64.b64decode(ca) if ca else None
    return Job(api, token, job_id, ca_pem, experiment, report_interval_s, pod)
