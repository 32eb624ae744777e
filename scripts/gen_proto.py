"""Regenerate the committed protobuf code under forestflow/_proto/ from proto/*.proto.

forestflow.proto compiles to a FileDescriptorSet (forestflow.binpb) and a small module, forestflow_pb2.py,
that builds its message classes from that set through protobuf's public API (descriptor_pool,
message_factory), not the generated code of protoc's --python_out, which calls google.protobuf.internal.

Usage: python scripts/gen_proto.py [--check]
With --check, exit 1 if the committed files differ from what would be generated.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "forestflow" / "_proto"
#: Compiled to a FileDescriptorSet and a module of message classes built from it (see module_text).
SOURCES = {"forestflow.proto": "forestflow"}
#: Compiled to a binary FileDescriptorSet only (no Python module): forestflow/api/v2_grpc.py loads it
#: into a private descriptor pool, since tritonclient/kserve register the same "inference.*" names.
DESCRIPTOR_SETS = {"grpc_predict_v2.proto": "grpc_predict_v2.binpb"}


def generate(out_dir: Path) -> None:
    """Run protoc for every source into ``out_dir``."""
    for source, stem in SOURCES.items():
        binpb = out_dir / f"{stem}.binpb"
        args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={binpb}", str(PROTO_DIR / source)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")
        (out_dir / f"{stem}_pb2.py").write_text(module_text(binpb.read_bytes(), binpb.name))
    for source, target in DESCRIPTOR_SETS.items():
        args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out_dir / target}", str(PROTO_DIR / source)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")


def module_text(descriptor_set: bytes, binpb_name: str) -> str:
    """The Python module that loads ``binpb_name`` and names its messages, enums and enum values."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
    (file,) = files
    lines = [
        f'"""Messages of {file.name}, built from {binpb_name} (scripts/gen_proto.py writes both; do not edit)."""',
        "",
        "from forestflow._proto.loader import Enum, load_file, message",
        "",
        f'DESCRIPTOR = load_file(__name__, "{binpb_name}")',
        "",
    ]
    for enum in file.enum_type:
        lines.append(f'{enum.name} = Enum(DESCRIPTOR.enum_types_by_name["{enum.name}"])')
        lines.extend(f"{value.name} = {value.number}" for value in enum.value)
    lines.append("")
    lines.extend(f'{m.name} = message(DESCRIPTOR, "{m.name}")' for m in file.message_type)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    if not args.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for fresh in sorted(Path(tmp).iterdir()):
            committed = OUT_DIR / fresh.name
            if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                stale.append(fresh.name)
                if committed.exists() and fresh.suffix == ".py":
                    sys.stdout.writelines(
                        difflib.unified_diff(committed.read_text().splitlines(True), fresh.read_text().splitlines(True))
                    )
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run python scripts/gen_proto.py")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
