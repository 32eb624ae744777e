"""The C extensions compile without a warning under -Wall -Wextra (what setup.py builds them with)."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    "forestflow/api/_ffhttp.c",
    "forestflow/codecs/_ffgp.c",
    "forestflow/codecs/_ffjson.c",
    "forestflow/codecs/_ffwire.c",
    "forestflow/predlog/_jsonl.c",
    "forestflow/predlog/_kafka_records.c",
    "forestflow/runtime/_h2o_trees.c",
    "forestflow/runtime/_treeshap.c",
    "forestflow/runtime/_forest.c",
]


@pytest.mark.parametrize("source", SOURCES)
def test_extension_compiles_without_warnings(source: str) -> None:
    # No numpy include directory: the extensions build without numpy (setuptools is the only build requirement).
    includes = [sysconfig.get_paths()["include"], str(ROOT / "forestflow" / "codecs")]
    command = ["gcc", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-O2", *(f"-I{i}" for i in includes), str(ROOT / source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
