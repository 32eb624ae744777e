"""What installing forestflow costs on a fresh machine: the core's environment size and install time, and each
extra's, measured in new venvs outside the checkout and printed as the tables of docs/install.md.

    python bench/install_size.py --quickstart     # the core three ways, the quick start, then every extra
    python bench/install_size.py --core-only --runs 2
    python bench/install_size.py --extras onnx,s3 --cache warm
    python bench/install_size.py --core-only --cases wheel --no-compile --quickstart   # bytecode of what runs only
    python bench/install_size.py --core-only --cases source --pip 'pip==25.3'   # another pip does the install
    python bench/install_size.py --core-only --cases readme --runs 3 --quickstart   # the README's command, all of it

The checkout's files (tracked and untracked, not ignored: what a clone has, plus uncommitted edits) are copied
to a temporary directory, so no build left in the worktree is reused. Each core case gets a new
``python3 -m venv`` and one pip command, as a user would type it:

- ``source``: ``pip install <checkout>`` (pip builds a wheel in an isolated build environment, then installs it);
- ``editable``: ``pip install -e <checkout>`` (the README's first command);
- ``wheel``: ``pip install <forestflow wheel>``, the wheel built once beforehand (what an index serving a binary
  wheel gives ``pip install forestflow``);
- ``readme``: the README's first command as written, less its final ``forestflow serve``, run by ``bash -c`` in
  the copy: the venv's creation and the pip upgrade are timed with the install.

pip runs with no configuration file and without this machine's local indexes and find-links (PIP_CONFIG_FILE is
the null device; PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL and PIP_CONSTRAINT are dropped), so every package comes
from the index as on a fresh machine. ``--cache cold`` gives each pip command an empty cache (everything
downloaded); ``--cache warm`` shares one cache that the first run fills (nothing downloaded from the second
run on). Wall time is inflated by whatever else loads the machine (the load average is printed); CPU time
(pip and every process it waited for) much less so.

Sizes are apparent sizes (``du -sb``), in MB of 10^6 bytes: the whole venv (what the user gets: it includes
the pip and setuptools that ``python3 -m venv`` puts in every venv), the same without them, the bytecode
(``__pycache__``, which pip compiles at install) and each distribution's files from its RECORD. With
``--quickstart`` a core venv (the wheel's when ``wheel`` is among the cases, else the first case's) serves the
README's quick start (deploy the prostate GBM, score it) on free ports and its size is measured again afterwards.
Each extra is installed over a copy of the wheel-installed core venv: its figures are what it adds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("h2o-jvm", "onnx", "s3", "tracing", "mlflow", "uvloop", "images", "sklearn", "all")
#: What ``python3 -m venv`` installs by itself (setuptools also owns pkg_resources and _distutils_hack).
VENV_OWN = ("pip", "setuptools")
MB = 1e6

#: Run by the venv's interpreter: each installed distribution's size from its RECORD (pip records the .pyc it
#: compiles), bytecode included.
_DIST_SIZES = """
import importlib.metadata as md, json, os
out = {}
for dist in md.distributions():
    total = 0
    for file in dist.files or ():
        path = file.locate()
        try:
            total += os.lstat(path).st_size
        except OSError:
            pass
    out[dist.metadata["Name"]] = out.get(dist.metadata["Name"], 0) + total
print(json.dumps(out))
"""


@dataclass
class Install:
    """One pip command's cost."""

    label: str
    command: str
    wall_s: float
    cpu_s: float
    load: float
    phases: dict[str, float] = field(default_factory=dict)


def tree_size(path: Path) -> int:
    """Apparent size of a tree, as ``du -sb`` counts it (files, directories and symlinks themselves)."""
    total = os.lstat(path).st_size
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(directory, name)).st_size
    return total


def bytecode_size(path: Path) -> int:
    """Bytes of every ``__pycache__`` directory under a tree."""
    return sum(tree_size(Path(directory) / "__pycache__") for directory, dirs, _ in os.walk(path) if "__pycache__" in dirs)


def pip_env(cache: Path) -> dict[str, str]:
    """pip's environment on a fresh machine: no config file, no local indexes, this cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")}
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_NO_COMPILE"):
        env.pop(name, None)
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_CACHE_DIR=str(cache), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def timed(label: str, argv: Sequence[str], env: dict[str, str], cwd: Path, log: Path) -> Install:
    """Run a pip command, its output (with seconds since the start) to ``log``; wall and CPU time, and the
    phases pip announces (build environment, wheel build, install)."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    marks: dict[str, float] = {}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - start
            out.write(f"{now:7.2f} {line}")
            text = line.strip()
            for key, needle in (
                ("build env", "Installing build dependencies"),
                ("build", "Building wheel for forestflow"),
                ("build", "Building editable for forestflow"),
                ("install", "Installing collected packages"),
            ):
                if text.startswith(needle):
                    if ": started" in text or key == "install":
                        marks[key + " start"] = now
                    elif ": finished" in text:
                        marks[key + " end"] = now
        status = proc.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status:
        sys.exit(f"{label}: pip failed ({status}), see {log}")
    marks.setdefault("install end", wall)
    phases = {
        key: marks[f"{key} end"] - marks[f"{key} start"] for key in ("build env", "build", "install") if f"{key} start" in marks
    }
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Install(label, " ".join(argv), wall, cpu, load, phases)


def readme_install_command() -> str:
    """The README's first command up to (not including) ``forestflow serve``."""
    readme = (ROOT / "README.md").read_text()
    line = next(text for text in readme.splitlines() if text.startswith("python3 -m venv .venv"))
    return line.split(" && .venv/bin/forestflow serve")[0]


def new_venv(python: str, path: Path) -> Path:
    """A new ``python -m venv`` (pip and setuptools as the interpreter's ensurepip ships them)."""
    subprocess.run([python, "-m", "venv", str(path)], check=True)
    return path


def dist_sizes(venv: Path) -> dict[str, int]:
    """Each installed distribution's bytes (from its RECORD)."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", _DIST_SIZES], check=True, capture_output=True, text=True)
    sizes: dict[str, int] = json.loads(done.stdout)
    return sizes


def site_packages(venv: Path) -> Path:
    (path,) = (venv / "lib").glob("python3*/site-packages")
    return path


def snapshot(dest: Path) -> Path:
    """The checkout's files as a clone has them (plus uncommitted edits; nothing ignored, so no build)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def quickstart(venv: Path, src: Path, work: Path) -> str:
    """The README's quick start from this venv: serve, deploy the prostate GBM, score it; the score's answer."""
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(FORESTFLOW_PORT=str(port), FORESTFLOW_GRPC_PORT=str(grpc_port), FORESTFLOW_DATA_DIR=str(work / "data"))
    cli = str(venv / "bin" / "forestflow")
    url = f"http://127.0.0.1:{port}"
    log = open(work / "serve.log", "wb")
    server = subprocess.Popen([cli, "serve"], cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health/live", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the core venv's gateway did not start, see {work / 'serve.log'}")
                time.sleep(0.2)
        for argv in (
            ["deploy", "servables/prostate-gbm.json", "--wait"],
            ["score", "servables/prostate-score.json", "--contract", "samples/prostate/1", "--json"],
        ):
            done = subprocess.run([cli, *argv, "--url", url], cwd=src, env=env, capture_output=True, text=True, timeout=120)
            if done.returncode:
                sys.exit(f"quick start: forestflow {' '.join(argv)} failed: {done.stdout}{done.stderr}")
        return done.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def mb(n: float) -> str:
    return f"{n / MB:.1f}"


def core_row(case: str, install: Install, venv: Path) -> tuple[str, dict[str, int]]:
    total = tree_size(venv)
    sizes = dist_sizes(venv)
    own = sum(sizes.get(name, 0) for name in VENV_OWN)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in install.phases.items())
    row = (
        f"| {case} | {mb(total)} | {mb(total - own)} | {mb(bytecode_size(venv))} | "
        f"{install.wall_s:.1f} s ({phases}) | {install.cpu_s:.1f} s | {install.load:.1f} |"
    )
    return row, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3", help="the interpreter whose venvs are measured (default python3)")
    parser.add_argument("--cache", choices=("cold", "warm"), default="cold", help="pip cache per command (default cold)")
    parser.add_argument("--runs", type=int, default=1, help="repeat the core cases (default 1)")
    parser.add_argument(
        "--cases", default="source,wheel,editable", help="source, wheel, editable, readme (default source,wheel,editable)"
    )
    parser.add_argument("--core-only", action="store_true", help="no extras")
    parser.add_argument("--extras", default=",".join(EXTRAS), help="extras to measure (default every one)")
    parser.add_argument("--quickstart", action="store_true", help="serve the quick start from the wheel-installed core")
    parser.add_argument(
        "--no-compile", action="store_true", help="pip install --no-compile for the core (bytecode is then written as imported)"
    )
    parser.add_argument(
        "--pip",
        help="a pip requirement (e.g. 'pip==25.3') each core venv's pip is upgraded to before its install (not timed, own cache)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="forestflow-install-"))
    try:
        measure(args, work)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path) -> None:
    """Every measurement ``args`` asks for, in ``work``."""
    # A fresh machine writes bytecode as modules are imported (what --no-compile leaves to the first run).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    src = snapshot(work / "src")

    def fresh_copy(name: str) -> Path:
        """A copy of the snapshot that no build has touched."""
        return Path(shutil.copytree(src, work / f"src-{name}"))

    shared_cache = work / "cache"
    run_no = 0

    def env() -> dict[str, str]:
        nonlocal run_no
        run_no += 1
        return pip_env(shared_cache if args.cache == "warm" else work / f"cache-{run_no}")

    python = shutil.which(args.python) or args.python
    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True)
    empty_venv = new_venv(python, work / "empty")
    empty = tree_size(empty_venv)
    empty_pip = subprocess.run([str(empty_venv / "bin" / "pip"), "--version"], capture_output=True, text=True).stdout.split()[1]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {version.stdout.strip()}, pip {empty_pip}, "
        f"{os.cpu_count()} cores, cache {args.cache}; an empty venv is {mb(empty)} MB (pip, setuptools)",
        flush=True,
    )

    cases = [c for c in args.cases.split(",") if c]
    # The wheel every `wheel` case and every extra installs, built once (its build is the `source` case's);
    # not built when nothing installs it (e.g. `--core-only --cases readme`).
    wheel = Path()
    if "wheel" in cases or not args.core_only:
        wheels = work / "wheels"
        subprocess.run(
            [str(empty_venv / "bin" / "pip"), "wheel", "--no-deps", "-q", "-w", str(wheels), str(fresh_copy("wheel"))],
            env=pip_env(work / "cache-wheel"),
            cwd=work,
            check=True,
        )
        (wheel,) = wheels.glob("forestflow-*.whl")

    print("\n| core, installed from | venv MB | without pip, setuptools | bytecode MB | wall time | CPU time | load |")
    print("|---|---|---|---|---|---|---|")
    core_venv: Path | None = None
    core_tree = src
    sizes: dict[str, int] = {}
    for run in range(args.runs):
        for case in cases:
            tree = fresh_copy(f"{case}-{run}")  # pip builds in the tree (editable: in place, and it stays in use)
            if case == "readme":
                command = readme_install_command().replace("python3 ", f"{python} ", 1)
                install = timed(case, ["bash", "-c", command], env(), tree, work / f"{case}-{run}.log")
                row, case_sizes = core_row(f"`{command}`", install, tree / ".venv")
                print(row, flush=True)
                if core_venv is None:
                    core_venv, core_tree, sizes = tree / ".venv", tree, case_sizes
                continue
            venv = new_venv(python, work / f"core-{case}-{run}")
            label = case
            if args.pip:
                upgrade = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", args.pip]
                subprocess.run(upgrade, env=pip_env(work / "cache-pip"), cwd=work, check=True)
                pip_version = subprocess.run([str(venv / "bin" / "pip"), "--version"], capture_output=True, text=True)
                label = f"{case} (pip {pip_version.stdout.split()[1]})"
            target = {"source": [str(tree)], "editable": ["-e", str(tree)], "wheel": [str(wheel)]}[case]
            pip = [str(venv / "bin" / "pip"), "install", *(["--no-compile"] if args.no_compile else []), *target]
            install = timed(case, pip, env(), work, work / f"{case}-{run}.log")
            row, case_sizes = core_row(label, install, venv)
            print(row, flush=True)
            if case == "wheel" or core_venv is None:
                core_venv, core_tree, sizes = venv, tree, case_sizes
    assert core_venv is not None

    print("\n| distribution | MB (with its bytecode) |\n|---|---|")
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        if size >= 0.1 * MB:
            print(f"| {name} | {mb(size)} |")
    rest = sum(size for size in sizes.values() if size < 0.1 * MB)
    print(f"| {sum(1 for s in sizes.values() if s < 0.1 * MB)} others | {mb(rest)} |", flush=True)

    if args.quickstart:
        answer = quickstart(core_venv, core_tree, work)
        print(f"\nquick start served from {core_venv.name}: {json.dumps(json.loads(answer))[:240]}")
        print(
            f"venv after the quick start: {mb(tree_size(core_venv))} MB, bytecode {mb(bytecode_size(core_venv))} MB", flush=True
        )

    if args.core_only:
        return
    assert "wheel" in cases, "the extras are installed over the wheel-installed core"
    print("\n| extra | adds MB | wall time | CPU time | load |\n|---|---|---|---|---|")
    base = tree_size(core_venv)
    for extra in [e for e in args.extras.split(",") if e]:
        venv = work / f"extra-{extra}"
        shutil.copytree(core_venv, venv, symlinks=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", f"{wheel}[{extra}]"]
        install = timed(extra, pip, env(), work, work / f"extra-{extra}.log")
        print(
            f"| `{extra}` | {mb(tree_size(venv) - base)} | {install.wall_s:.1f} s | {install.cpu_s:.1f} s | {install.load:.1f} |",
            flush=True,
        )
        shutil.rmtree(venv)


if __name__ == "__main__":
    main()
