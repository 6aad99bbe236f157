"""Standard gRPC plumbing on a real server: reflection answers in protocol v1 (to a client that
knows only the v1 wire contract, not our stubs) and in v1alpha, without credentials; health
answers for the server and for each service by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import bare_server

V1_METHOD = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
SERVICES = {
    "arranger.v1.Arranger",
    "arranger.v1.AgentService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


def fields(message: bytes) -> Iterator[tuple[int, bytes | int]]:
    """fields: (number, value) of each field of a protobuf message in wire format (varints
    and length-delimited values only: all reflection answers need)."""
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = message[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(message):
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            yield number, varint()
        elif kind == 2:
            size = varint()
            yield number, message[at : at + size]
            at += size
        else:
            raise AssertionError(f"unexpected wire type {kind}")


def only(message: bytes, number: int) -> bytes:
    values = [value for n, value in fields(message) if n == number]
    assert len(values) == 1 and isinstance(values[0], bytes), (number, values)
    return values[0]


def length_delimited(number: int, value: str) -> bytes:
    data = value.encode()
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


async def ask_v1(address: str, request: bytes) -> bytes:
    """ask_v1: one ServerReflectionInfo exchange in protocol v1, as raw bytes."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(V1_METHOD)(iter([request]), timeout=10)
        answers = [answer async for answer in call]
    assert len(answers) == 1
    answer = answers[0]
    assert isinstance(answer, bytes)
    return answer


async def test_v1_reflection_lists_and_describes_services(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        # ServerReflectionRequest.list_services = 7 -> ServerReflectionResponse
        # .list_services_response = 6 -> ListServiceResponse.service = 1 -> .name = 1
        listing = only(await ask_v1(address, length_delimited(7, "")), 6)
        names = {only(service, 1).decode() for n, service in fields(listing) if n == 1}
        assert names == SERVICES

        # .file_containing_symbol = 4 -> .file_descriptor_response = 4 -> .file_descriptor_proto
        for symbol, file in [
            ("arranger.v1.Arranger", "arranger/v1/arranger.proto"),
            ("grpc.reflection.v1.ServerReflection", "grpc/reflection/v1/reflection.proto"),
        ]:
            answer = only(await ask_v1(address, length_delimited(4, symbol)), 4)
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw) for _, raw in fields(answer)
            ]  # type: ignore[arg-type]
            described = {f.name: f for f in files}
            assert file in described, sorted(described)
            service = symbol.rsplit(".", 1)[1]
            assert service in {s.name for s in described[file].service}


async def test_v1alpha_reflection_still_answers(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path / "server") as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = [a async for a in stub.ServerReflectionInfo(iter([request]), timeout=10)]
        assert {s.name for s in answers[0].list_services_response.service} == SERVICES


async def test_health_answers_for_each_service_by_name(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path / "server") as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ["", "arranger.v1.Arranger", "arranger.v1.AgentService"]:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == serving, name
        try:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
        else:
            raise AssertionError("an unknown service must be NOT_FOUND")
