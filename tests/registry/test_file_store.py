"""The file store: atomic rewrites that a cancelled writer cannot leave racing the next one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from forestflow.registry.file_store import FileStore


async def test_cancelled_apply_finishes_its_write_before_the_next_one_starts(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "state" / "registry.json")
    big = {f"servable/doc{i}": {"payload": "x" * 2000} for i in range(2000)}  # a write that takes a while
    for _ in range(5):
        first = asyncio.create_task(store.apply(big))
        await asyncio.sleep(0.001)  # let it reach the writer thread
        first.cancel()
        # Before the fix this second write could start while the cancelled one's thread was still
        # writing the same temporary file, and one of the two renames failed with FileNotFoundError.
        await store.apply({"contract/a.b.1": {"k": 1}})
        await asyncio.gather(first, return_exceptions=True)
    data = orjson.loads((tmp_path / "state" / "registry.json").read_bytes())
    assert data["documents"]["contract/a.b.1"] == {"k": 1}
    assert len(data["documents"]) == 2001
    assert not list((tmp_path / "state").glob(".*.tmp"))
