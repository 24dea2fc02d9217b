"""Regenerate the Python modules and typed stubs for proto/: the pod-resources v1 API and our views
of it (v1/), the Pods API (v1alpha1/) and the subset of Kubernetes' own messages its pods are (k8s/).

Run through `make proto`. The output is committed under watcher/kubeletapi/;
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
PROTO_FILES = [
    "v1/api.proto",
    "v1/views.proto",
    "v1/lenient.proto",
    "v1alpha1/pods.proto",
    "k8s/resource.proto",
    "k8s/meta_v1.proto",
    "k8s/core_v1.proto",
]
OUTPUT_DIR = ROOT / VIRTUAL_PREFIX
# Paths under OUTPUT_DIR; gRPC stubs only for the files that have a service.
GENERATED = [
    "v1/api_pb2.py",
    "v1/api_pb2.pyi",
    "v1/api_pb2_grpc.py",
    "v1/api_pb2_grpc.pyi",
    "v1/views_pb2.py",
    "v1/views_pb2.pyi",
    "v1/lenient_pb2.py",
    "v1/lenient_pb2.pyi",
    "v1alpha1/pods_pb2.py",
    "v1alpha1/pods_pb2.pyi",
    "v1alpha1/pods_pb2_grpc.py",
    "v1alpha1/pods_pb2_grpc.pyi",
    "k8s/resource_pb2.py",
    "k8s/resource_pb2.pyi",
    "k8s/meta_v1_pb2.py",
    "k8s/meta_v1_pb2.pyi",
    "k8s/core_v1_pb2.py",
    "k8s/core_v1_pb2.pyi",
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
    """Run protoc into out_dir and return the generated files (each path ends in a GENERATED name)."""
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
    base = out_dir / VIRTUAL_PREFIX
    return [base / name for name in GENERATED]


def relative(path: Path) -> str:
    """A generated file's name under OUTPUT_DIR, e.g. "v1/api_pb2.py"."""
    return "/".join(path.parts[-2:])


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            target = OUTPUT_DIR / relative(path)
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(path, target)
            print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
