"""The generated code in arranger/v1 must describe exactly what protos/arranger/v1 says."""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2, timestamp_pb2  # noqa: F401 (loaded for the pool)
from grpc_tools import protoc

from arranger.v1 import agent_pb2, arranger_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def compiled(
    tmp_path: Path, protos: Path = PROTOS
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = tmp_path / f"{protos.name}.pb"
    include = Path(protoc.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(protos)) for p in (protos / "arranger" / "v1").glob("*.proto"))
    status = protoc.main(
        ["protoc", f"-I{protos}", f"-I{include}", f"--descriptor_set_out={out}", *files]
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


PREVIOUS_RELEASE = "v0.3.0"


def released(
    tmp_path: Path, tag: str = PREVIOUS_RELEASE
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """released: the .proto files of release `tag`, compiled, by name (skips the test where
    this checkout does not hold the tag: not a git checkout, or a shallow one)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{tag}:protos/arranger/v1"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"no {tag} here: {listed.stderr.strip()}")
    out = tmp_path / tag / "arranger" / "v1"
    out.mkdir(parents=True)
    for name in listed.stdout.split():
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{tag}:protos/arranger/v1/{name}"],
            capture_output=True,
            check=True,
        )
        (out / name).write_bytes(shown.stdout)
    return compiled(tmp_path, tmp_path / tag)


def released_pool(tmp_path: Path, tag: str = PREVIOUS_RELEASE) -> descriptor_pool.DescriptorPool:
    """released_pool: release `tag`'s messages, apart from this checkout's (message classes
    of a client of that release: message_factory.GetMessageClass(pool.Find...))."""
    pool = descriptor_pool.DescriptorPool()
    for file in _in_import_order(released(tmp_path, tag)):
        pool.Add(file)
    return pool


def _in_import_order(
    files: dict[str, descriptor_pb2.FileDescriptorProto],
) -> list[descriptor_pb2.FileDescriptorProto]:
    added: list[str] = []

    def add(name: str) -> None:
        if name in added or name not in files:
            return
        for dependency in files[name].dependency:
            add(dependency)
        added.append(name)

    for name in sorted(files):
        add(name)
    # The well-known types the release's files import (google/protobuf/...), from protobuf.
    imported = {d for f in files.values() for d in f.dependency if d not in files}
    well_known = [descriptor_pool.Default().FindFileByName(name) for name in sorted(imported)]
    return [
        *(descriptor_pb2.FileDescriptorProto.FromString(f.serialized_pb) for f in well_known),
        *(files[name] for name in added),
    ]


def test_the_wire_keeps_every_field_and_call_of_the_previous_release(tmp_path: Path) -> None:
    """A client or agent of the previous release talks to this server, and this client to
    that server: no field it knew changed its number, type or cardinality, none went, and no
    call changed its messages (new fields and calls may come)."""
    now = compiled(tmp_path)
    for name, before in released(tmp_path).items():
        after = now[name]
        fields_now = {(m.name, f.number): f for m in _messages(after.message_type) for f in m.field}
        for message in _messages(before.message_type):
            for field in message.field:
                kept = fields_now.get((message.name, field.number))
                assert kept is not None, f"{message.name}.{field.name} ({field.number}) is gone"
                assert (kept.type, kept.label, kept.type_name) == (
                    field.type,
                    field.label,
                    field.type_name,
                ), f"{message.name}.{field.name} changed on the wire"
        calls_now = {(s.name, m.name): m for s in after.service for m in s.method}
        for service in before.service:
            for method in service.method:
                call = calls_now.get((service.name, method.name))
                assert call is not None, f"{service.name}.{method.name} is gone"
                assert (call.input_type, call.output_type) == (
                    method.input_type,
                    method.output_type,
                ), f"{service.name}.{method.name} changed its messages"
                assert (call.client_streaming, call.server_streaming) == (
                    method.client_streaming,
                    method.server_streaming,
                )
