"""Recompile the committed Java helper class(es) under forestflow/runtime/java/.

Usage: python scripts/gen_java.py
Needs a JDK (javac) and the genmodel jar (the h2o wheel's). The class targets Java 8, so any JVM
that runs genmodel loads it. The source's SHA-256 is recorded next to it; a test fails when the
source changed but the class was not rebuilt.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from forestflow.runtime.jvm import JAVA_DIR, JAVA_SOURCES, genmodel_jar  # noqa: E402


def main() -> int:
    javac = shutil.which("javac")
    if javac is None:
        print("javac not found: install a JDK (e.g. apt-get install openjdk-17-jdk-headless)", file=sys.stderr)
        return 1
    for name in JAVA_SOURCES:
        source = JAVA_DIR / name
        subprocess.run(
            [javac, "--release", "8", "-Xlint:-options", "-cp", str(genmodel_jar()), "-d", str(JAVA_DIR), str(source)],
            check=True,
        )
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        source.with_name(name + ".sha256").write_text(digest + "\n")
        print(f"compiled {source.relative_to(ROOT)} ({digest[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
