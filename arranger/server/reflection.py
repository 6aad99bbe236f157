"""reflection: gRPC server reflection in both protocol versions, v1 and v1alpha.

grpcio-reflection serves only `grpc.reflection.v1alpha.ServerReflection`, and tools that speak
only v1 (newer grpcurl, Postman, grpc_cli) find nothing. The v1 protocol is the same messages,
field for field, in another package, so:
- `V1_FILE` is the library's own v1alpha file descriptor renamed into `grpc.reflection.v1`
  and added to the default pool, so that v1 clients can ask for the v1 service's own file;
- the v1 service is the library's servicer behind a second name: the bytes on the wire are the
  same, so its messages decode and encode through the v1alpha classes unchanged.
Both names are listed, as Go and Java servers list them.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1 = "grpc.reflection.v1.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_file() -> None:
    """_add_v1_file puts the v1 protocol's file into the default pool (once per process)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    source = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(source)
    source.name = V1_FILE
    source.package = "grpc.reflection.v1"
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    for message in source.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new)
    for service in source.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    source.ClearField("options")  # the v1alpha file's language package names
    pool.Add(source)


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """enable serves reflection for `service_names` (and for itself) under both names."""
    _add_v1_file()
    names = [*service_names, V1, V1ALPHA]
    servicer = reflection.aio.ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler})
            for service in (V1, V1ALPHA)
        ]
    )
