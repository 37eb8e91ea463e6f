"""Generate the Python protobuf and gRPC stubs (and their .pyi types) from proto/.

One script, one place: `make proto` runs it and `make proto-check` runs it into a scratch
directory and diffs, so the checked-in stubs can never drift from the .proto files.
The tool versions are pinned in pyproject.toml (grpcio-tools, mypy-protobuf).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUTPUT_ROOT = ROOT / "libs" / "protos"


def generate(output: Path) -> None:
    """Write stubs for every .proto under proto/ into ``output`` (a source root)."""
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    services = [p for p in protos if p.endswith("_service.proto")]
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
    ]
    messages = [f"--python_out={output}", f"--mypy_out=quiet:{output}", *protos]
    # Only the *_service.proto files define services; bus payloads get no empty gRPC stubs.
    stubs = [f"--grpc_python_out={output}", f"--mypy_grpc_out=quiet:{output}", *services]
    subprocess.run(command + messages, check=True, cwd=PROTO_ROOT)
    subprocess.run(command + stubs, check=True, cwd=PROTO_ROOT)
    # Every generated directory below the shared `stride` namespace is a regular package.
    for leaf in sorted({p.parent for p in output.rglob("*_pb2.py")}):
        directory = leaf
        while directory != output / "stride":
            (directory / "__init__.py").touch()
            directory = directory.parent


def main() -> int:
    """Generate into libs/protos, or with --check into a scratch dir and diff."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if checked-in stubs differ")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(OUTPUT_ROOT / "stride", ignore_errors=True)
        generate(OUTPUT_ROOT)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        generate(Path(scratch))
        result = subprocess.run(
            [
                "diff",
                "-r",
                "-q",
                "-x",
                "__pycache__",
                str(Path(scratch) / "stride"),
                str(OUTPUT_ROOT / "stride"),
            ],
            check=False,
        )
        if result.returncode != 0:
            print("generated stubs are stale: run `make proto` and commit", file=sys.stderr)
        return result.returncode


if __name__ == "__main__":
    sys.exit(main())
