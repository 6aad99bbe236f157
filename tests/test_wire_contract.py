"""The generated code in arranger/v1 must describe exactly what protos/arranger/v1 says."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from arranger.v1 import agent_pb2, arranger_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def compiled(tmp_path: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = tmp_path / "set.pb"
    include = Path(protoc.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "arranger" / "v1").glob("*.proto"))
    status = protoc.main(
        ["protoc", f"-I{PROTOS}", f"-I{include}", f"--descriptor_set_out={out}", *files]
    )
    assert status == 0, "the .proto files do not compile"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    for file in fds.file:  # generated modules embed descriptors without the derived json names
        for message in _messages(file.message_type):
            for field in message.field:
                field.ClearField("json_name")
    return {f.name: f for f in fds.file}


def _messages(
    messages: Iterable[descriptor_pb2.DescriptorProto],
) -> Iterator[descriptor_pb2.DescriptorProto]:
    for message in messages:
        yield message
        yield from _messages(message.nested_type)


def test_generated_code_matches_proto_files(tmp_path: Path) -> None:
    fresh = compiled(tmp_path)
    assert set(fresh) == {
        "arranger/v1/job.proto",
        "arranger/v1/node.proto",
        "arranger/v1/arranger.proto",
        "arranger/v1/agent.proto",
    }
    for name, descriptor in fresh.items():
        module = importlib.import_module("arranger.v1." + Path(name).stem + "_pb2")
        committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        assert committed == descriptor, (
            f"arranger/v1/{Path(name).stem}_pb2.py is stale: run `python scripts/gen_protos.py`"
        )


def test_every_rpc_has_a_generated_stub_and_servicer(tmp_path: Path) -> None:
    for name, descriptor in compiled(tmp_path).items():
        for service in descriptor.service:
            module = importlib.import_module("arranger.v1." + Path(name).stem + "_pb2_grpc")
            servicer = getattr(module, f"{service.name}Servicer")
            source = Path(module.__file__ or "").read_text()
            for method in service.method:
                assert hasattr(servicer, method.name)
                assert f"/arranger.v1.{service.name}/{method.name}" in source


def test_services_the_issue_names_exist() -> None:
    api = {m.name for m in arranger_pb2.DESCRIPTOR.services_by_name["Arranger"].methods}
    assert {
        "SubmitJob",
        "GetJob",
        "ListJobs",
        "WatchJobs",
        "StopJob",
        "DeleteJob",
        "GetLogs",
        "ListNodes",
    } <= api
    connect = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["Connect"]
    assert connect.client_streaming and connect.server_streaming
