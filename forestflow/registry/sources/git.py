"""Git artifacts: a shallow fetch of exactly one tag with the ``git`` command line.

``git clone --depth 1 --branch v<N>.<release> --single-branch`` fetches the one commit the tag
names (never the history). Only http(s) transports are allowed (``GIT_ALLOW_PROTOCOL``), git never
prompts, and files stored with Git LFS arrive as pointers: they are pulled with ``git lfs`` when
it is installed, and refused with a clear message when it is not. The ``.git`` directory is
dropped, so the cached artifact is the tree at the tag.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources import FetchLimits, redact, timed_out, too_large, tree_size

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
_POLL_S = 0.2


def git_env() -> dict[str, str]:
    """The environment git runs in: no prompts, http(s) only, LFS left as pointers until asked."""
    return {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "http:https",
        "GIT_LFS_SKIP_SMUDGE": "1",
    }


async def fetch_git(repo_url: str, tag: str, staging: Path, limits: FetchLimits, ssl_verify: bool = True) -> None:
    """Fill ``staging`` with the tree of ``repo_url`` at ``tag``."""
    if shutil.which("git") is None:
        raise CreateServableRequestInvalidError("Git paths need the git command line, which is not installed on the gateway")
    shown = redact(repo_url)
    what = f"Git repository {shown} tag {tag}"
    deadline = time.monotonic() + limits.timeout_s
    args = [
        "git",
        "-c",
        "advice.detachedHead=false",
        "-c",
        f"http.sslVerify={'true' if ssl_verify else 'false'}",
        "clone",
        "--quiet",
        "--depth",
        "1",
        "--single-branch",
        "--no-tags",
        "--branch",
        tag,
        "--",
        repo_url,
        str(staging),
    ]
    code, err = await _run(args, staging, limits, deadline, what)
    if code != 0:
        raise CreateServableRequestInvalidError(_clone_error(err, shown, tag))
    pointers = await asyncio.to_thread(_lfs_pointers, staging)
    if pointers:
        await _pull_lfs(pointers, staging, limits, deadline, what)
    await asyncio.to_thread(shutil.rmtree, staging / ".git", True)
    if await asyncio.to_thread(tree_size, staging) > limits.max_bytes:
        raise too_large(what, limits)


async def _pull_lfs(pointers: list[str], staging: Path, limits: FetchLimits, deadline: float, what: str) -> None:
    shown = ", ".join(pointers[:3]) + (" ..." if len(pointers) > 3 else "")
    probe = await asyncio.create_subprocess_exec(
        "git", "lfs", "version", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=git_env()
    )
    if await probe.wait() != 0:
        raise CreateServableRequestInvalidError(
            f"{what}: {shown} stored with Git LFS (the checkout holds LFS pointers) and git-lfs is not "
            "installed on the gateway; install git-lfs or commit the files themselves"
        )
    code, err = await _run(["git", "-C", str(staging), "lfs", "pull"], staging, limits, deadline, what)
    if code != 0:
        raise CreateServableRequestInvalidError(f"{what}: git lfs pull failed: {_last_line(err)}")
    still = await asyncio.to_thread(_lfs_pointers, staging)
    if still:
        raise CreateServableRequestInvalidError(f"{what}: {', '.join(still[:3])} still LFS pointers after git lfs pull")


async def _run(args: list[str], staging: Path, limits: FetchLimits, deadline: float, what: str) -> tuple[int, str]:
    """Run git, killing it past the deadline or once the checkout grows over the size cap."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=git_env(),
    )
    assert proc.stderr is not None
    stderr = asyncio.ensure_future(proc.stderr.read())
    try:
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), max(0.0, min(_POLL_S, deadline - time.monotonic())))
                break
            except TimeoutError:
                pass
            if time.monotonic() >= deadline:
                raise timed_out(what, limits)
            if await asyncio.to_thread(tree_size, staging) > limits.max_bytes:
                raise too_large(what, limits)
    finally:
        if proc.returncode is None:  # refused, timed out or cancelled: stop git before the cache cleans up
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, (await stderr).decode(errors="replace")


def _clone_error(err: str, shown: str, tag: str) -> str:
    if "not found in upstream" in err or "Could not find remote branch" in err:
        return f"Git repository {shown}: tag {tag} not found"
    if "not found" in err.lower() and "repository" in err.lower():
        return f"Git repository {shown}: repository not found"
    return f"Git repository {shown} tag {tag}: git clone failed: {_last_line(err)}"


def _last_line(err: str) -> str:
    lines = [line.strip() for line in err.strip().splitlines() if line.strip()]
    return redact(lines[-1]) if lines else "no message"


def _lfs_pointers(root: Path) -> list[str]:
    """Files of the checkout that are Git LFS pointers (small text files with the LFS header)."""
    found = []
    for path in sorted(root.rglob("*")):
        if ".git" in path.relative_to(root).parts or not path.is_file() or path.stat().st_size > 1024:
            continue
        with open(path, "rb") as fh:
            if fh.read(len(LFS_POINTER)) == LFS_POINTER:
                found.append(str(path.relative_to(root)))
    return found
