"""gen_protos regenerates arranger/v1 from protos/arranger/v1/*.proto.

Run from anywhere: python scripts/gen_protos.py. Needs grpcio-tools and mypy-protobuf (the
`dev` extra); mypy-protobuf writes the .pyi stubs that keep `mypy --strict` meaningful.
tests/test_wire_contract.py fails when the committed code drifts from the .proto files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def main() -> int:
    files = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "arranger" / "v1").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    for plugin in ("protoc-gen-mypy", "protoc-gen-mypy_grpc"):
        if shutil.which(plugin) is None and not (bin_dir / plugin).exists():
            sys.exit(f"{plugin} not found: pip install mypy-protobuf")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        f"--mypy_out={ROOT}",
        f"--mypy_grpc_out={ROOT}",
        *files,
    ]
    plugins = [
        f"--plugin=protoc-gen-mypy={shutil.which('protoc-gen-mypy') or bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc="
        f"{shutil.which('protoc-gen-mypy_grpc') or bin_dir / 'protoc-gen-mypy_grpc'}",
    ]
    status = protoc.main([args[0], *plugins, *args[1:]])
    for empty in (ROOT / "arranger" / "v1").glob("*_pb2_grpc.py*"):
        if "Stub" not in empty.read_text():  # messages only: no service stubs to keep
            empty.unlink()
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
