"""sdk is the Python client of arranger-server: AsyncClient for asyncio code, Client otherwise.

Both take a job as a TYJob message, a dict in the YAML's shape, or YAML text, and return typed
protobuf messages. Every server refusal becomes an ArrangerError with the gRPC code and the
server's one-line message.

    from arranger.client.sdk import Client
    with Client("127.0.0.1:50051") as c:
        job = c.submit(open("job.yaml").read())
        done = c.wait(job.metadata.name)
        print(done.status.stage)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import grpc
import yaml

from arranger.client.specfile import load_job_yaml
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2, node_pb2

DEFAULT_SERVER = "127.0.0.1:50051"
FINISHED = ("Succeeded", "Failed")
JobLike = job_pb2.TYJob | Mapping[str, Any] | str


def default_server() -> str:
    """default_server: $ARRANGER_SERVER, else 127.0.0.1:50051."""
    return os.environ.get("ARRANGER_SERVER", DEFAULT_SERVER)


class ArrangerError(Exception):
    """ArrangerError is a refusal or failure of a call: `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError, target: str) -> ArrangerError:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.UNAVAILABLE and ("connect" in (details or "").lower()):
            details = f"cannot reach arranger-server at {target} (is it running? set --server or ARRANGER_SERVER)"
        return cls(code, details or code.name)


def as_job(job: JobLike) -> job_pb2.TYJob:
    """as_job accepts a TYJob, a mapping shaped like the YAML, or YAML text."""
    if isinstance(job, job_pb2.TYJob):
        return job
    if isinstance(job, str):
        return load_job_yaml(job)
    return load_job_yaml(yaml.safe_dump(dict(job)))


class AsyncClient:
    """AsyncClient talks to arranger-server over one gRPC channel; use `async with`."""

    def __init__(self, server: str | None = None, timeout_s: float = 30.0) -> None:
        self.server = server or default_server()
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(self.server)
        self._stub = arranger_pb2_grpc.ArrangerStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def submit(self, job: JobLike) -> job_pb2.TYJob:
        request = arranger_pb2.SubmitJobRequest(job=as_job(job))
        try:
            reply = await self._stub.SubmitJob(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None
        return reply.job

    async def get(self, name: str) -> job_pb2.TYJob:
        try:
            return await self._stub.GetJob(
                arranger_pb2.GetJobRequest(name=name), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None

    async def jobs(self, queue: str = "", stages: Iterable[str] = ()) -> list[job_pb2.TYJob]:
        jobs: list[job_pb2.TYJob] = []
        token = ""
        while True:
            request = arranger_pb2.ListJobsRequest(
                queue=queue, stages=list(stages), page_token=token
            )
            try:
                reply = await self._stub.ListJobs(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise ArrangerError.from_rpc(exc, self.server) from None
            jobs.extend(reply.jobs)
            token = reply.next_page_token
            if not token:
                return jobs

    async def watch(self, name: str = "") -> AsyncIterator[arranger_pb2.WatchJobsResponse]:
        """watch yields the job's (or every job's) state now and after every change."""
        call = self._stub.WatchJobs(arranger_pb2.WatchJobsRequest(name=name))
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None
        finally:
            call.cancel()

    async def wait(
        self, name: str, stages: Iterable[str] = FINISHED, timeout_s: float | None = None
    ) -> job_pb2.TYJob:
        """wait returns the job once its stage is one of `stages` (default: finished)."""
        wanted = set(stages)

        async def first() -> job_pb2.TYJob:
            async for event in self.watch(name):
                if event.job.status.stage in wanted:
                    return event.job
            raise ArrangerError(grpc.StatusCode.UNAVAILABLE, "the watch ended before the job did")

        return await asyncio.wait_for(first(), timeout_s)

    async def stop(self, name: str) -> job_pb2.TYJob:
        try:
            return await self._stub.StopJob(
                arranger_pb2.StopJobRequest(name=name), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None

    async def delete(self, name: str) -> None:
        try:
            await self._stub.DeleteJob(
                arranger_pb2.DeleteJobRequest(name=name), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None

    async def logs(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
    ) -> AsyncIterator[bytes]:
        request = arranger_pb2.GetLogsRequest(
            job=job, pod=pod, attempt=attempt, follow=follow, tail_bytes=tail_bytes
        )
        call = self._stub.GetLogs(request)
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None
        finally:
            call.cancel()

    async def nodes(self) -> list[node_pb2.Node]:
        try:
            reply = await self._stub.ListNodes(
                arranger_pb2.ListNodesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None
        return list(reply.nodes)

    async def events(self, job: str = "", limit: int = 1000) -> list[arranger_pb2.Event]:
        try:
            reply = await self._stub.ListEvents(
                arranger_pb2.ListEventsRequest(job=job, limit=limit), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None
        return list(reply.events)


class Client:
    """Client is the blocking twin of AsyncClient; use `with`."""

    def __init__(self, server: str | None = None, timeout_s: float = 30.0) -> None:
        self.server = server or default_server()
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.server)
        self._stub = arranger_pb2_grpc.ArrangerStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise ArrangerError.from_rpc(exc, self.server) from None

    def _stream(self, method: Any, request: Any, timeout_s: float | None = None) -> Iterator[Any]:
        call = method(request, timeout=timeout_s)
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"no answer within {timeout_s} s") from None
            raise ArrangerError.from_rpc(exc, self.server) from None
        finally:
            call.cancel()

    def submit(self, job: JobLike) -> job_pb2.TYJob:
        reply = self._call(self._stub.SubmitJob, arranger_pb2.SubmitJobRequest(job=as_job(job)))
        job_msg: job_pb2.TYJob = reply.job
        return job_msg

    def get(self, name: str) -> job_pb2.TYJob:
        job: job_pb2.TYJob = self._call(self._stub.GetJob, arranger_pb2.GetJobRequest(name=name))
        return job

    def jobs(self, queue: str = "", stages: Iterable[str] = ()) -> list[job_pb2.TYJob]:
        jobs: list[job_pb2.TYJob] = []
        token = ""
        while True:
            request = arranger_pb2.ListJobsRequest(
                queue=queue, stages=list(stages), page_token=token
            )
            reply = self._call(self._stub.ListJobs, request)
            jobs.extend(reply.jobs)
            token = reply.next_page_token
            if not token:
                return jobs

    def watch(self, name: str = "") -> Iterator[arranger_pb2.WatchJobsResponse]:
        return self._stream(self._stub.WatchJobs, arranger_pb2.WatchJobsRequest(name=name))

    def wait(
        self, name: str, stages: Iterable[str] = FINISHED, timeout_s: float | None = None
    ) -> job_pb2.TYJob:
        """wait returns the job once its stage is one of `stages` (default: finished)."""
        wanted = set(stages)
        request = arranger_pb2.WatchJobsRequest(name=name)
        for event in self._stream(self._stub.WatchJobs, request, timeout_s):
            job: job_pb2.TYJob = event.job
            if job.status.stage in wanted:
                return job
        raise ArrangerError(grpc.StatusCode.UNAVAILABLE, "the watch ended before the job did")

    def stop(self, name: str) -> job_pb2.TYJob:
        job: job_pb2.TYJob = self._call(self._stub.StopJob, arranger_pb2.StopJobRequest(name=name))
        return job

    def delete(self, name: str) -> None:
        self._call(self._stub.DeleteJob, arranger_pb2.DeleteJobRequest(name=name))

    def logs(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
    ) -> Iterator[bytes]:
        request = arranger_pb2.GetLogsRequest(
            job=job, pod=pod, attempt=attempt, follow=follow, tail_bytes=tail_bytes
        )
        for chunk in self._stream(self._stub.GetLogs, request):
            yield chunk.data

    def nodes(self) -> list[node_pb2.Node]:
        return list(self._call(self._stub.ListNodes, arranger_pb2.ListNodesRequest()).nodes)

    def events(self, job: str = "", limit: int = 1000) -> list[arranger_pb2.Event]:
        reply = self._call(
            self._stub.ListEvents, arranger_pb2.ListEventsRequest(job=job, limit=limit)
        )
        return list(reply.events)
