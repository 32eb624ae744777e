"""Regenerate the committed protobuf code under forestflow/_proto/ from proto/*.proto.

Usage: python scripts/gen_proto.py [--check]
With --check, exit 1 if the committed files differ from what would be generated.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "forestflow" / "_proto"
SOURCES = ["forestflow.proto"]
#: Compiled to a binary FileDescriptorSet only (no Python module): forestflow/api/v2_grpc.py loads it
#: into a private descriptor pool, since tritonclient/kserve register the same "inference.*" names.
DESCRIPTOR_SETS = {"grpc_predict_v2.proto": "grpc_predict_v2.binpb"}


def generate(out_dir: Path) -> None:
    """Run protoc for every source into ``out_dir``."""
    for source in SOURCES:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(PROTO_DIR / source)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")
    for source, target in DESCRIPTOR_SETS.items():
        args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out_dir / target}", str(PROTO_DIR / source)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")


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
                if committed.exists() and fresh.suffix in (".py", ".pyi"):
                    sys.stdout.writelines(
                        difflib.unified_diff(committed.read_text().splitlines(True), fresh.read_text().splitlines(True))
                    )
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run python scripts/gen_proto.py")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
