"""Regenerate the Python modules and typed stubs for proto/v1/*.proto (the API and our views of it).

Run through `make proto`. The output is committed under watcher/kubeletapi/v1;
tests/test_proto.py calls `generate()` into a temporary directory and fails
when the committed files differ, so a .proto edit cannot ship without them.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
# The import path the generated code uses; protoc maps it onto proto/.
VIRTUAL_PREFIX = "watcher/kubeletapi"
PROTO_FILES = ["v1/api.proto", "v1/views.proto", "v1/lenient.proto"]
OUTPUT_DIR = ROOT / VIRTUAL_PREFIX / "v1"
GENERATED = [
    "api_pb2.py",
    "api_pb2.pyi",
    "api_pb2_grpc.py",
    "api_pb2_grpc.pyi",
    "views_pb2.py",
    "views_pb2.pyi",
    "lenient_pb2.py",
    "lenient_pb2.pyi",
]


def _plugin(name: str) -> str:
    scripts = Path(sysconfig.get_path("scripts"))
    path = scripts / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise SystemExit(f"{name} not found: install the dev extras (make dev)")
        return found
    return str(path)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into out_dir and return the generated files."""
    from grpc_tools import protoc  # dev-only dependency

    args = [
        "grpc_tools.protoc",
        f"-I{VIRTUAL_PREFIX}={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--mypy_out=quiet:{out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *(f"{VIRTUAL_PREFIX}/{name}" for name in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    base = out_dir / VIRTUAL_PREFIX / "v1"
    return [base / name for name in GENERATED]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, OUTPUT_DIR / path.name)
            print(f"wrote {(OUTPUT_DIR / path.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
