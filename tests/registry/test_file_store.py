"""The file store: a snapshot plus a journal of changes, replayed at start, compacted when it grows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from forestflow.registry import file_store
from forestflow.registry.file_store import FileStore, journal_path, read_registry


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
    documents = read_registry(tmp_path / "state" / "registry.json")
    assert documents["contract/a.b.1"] == {"k": 1}
    assert len(documents) == 2001
    assert not list((tmp_path / "state").glob(".*.tmp"))


async def test_a_change_appends_one_record_and_a_restart_replays_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "state" / "registry.json"
    store = FileStore(path)
    await store.apply({f"servable/a.b.{i}.v": {"n": i} for i in range(200)})
    await store.apply({"servable/a.b.0.v": None, "contract/a.b.7": {"k": 7}})
    size = journal_path(path).stat().st_size
    await store.apply({"contract/a.b.8": {"k": 8}})
    grown = journal_path(path).stat().st_size - size
    assert 0 < grown < 100, grown  # the change, not the registry of 200 servables
    restarted = await FileStore(path).load()
    assert "servable/a.b.0.v" not in restarted
    assert restarted["servable/a.b.1.v"] == {"n": 1}
    assert restarted["contract/a.b.7"] == {"k": 7} and restarted["contract/a.b.8"] == {"k": 8}
    assert FileStore(path).version == 0 and (await _loaded_version(path)) == store.version == 3


async def _loaded_version(path: Path) -> int:
    store = FileStore(path, replica_id="w1")
    await store.load()
    return store.version


async def test_a_torn_last_record_is_ignored_and_cut_off_by_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "state" / "registry.json"
    await FileStore(path).apply({"contract/a.b.1": {"k": 1}})
    await FileStore(path).apply({"contract/a.b.2": {"k": 2}})
    journal = journal_path(path)
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-7])  # a crash in the middle of appending the second record
    assert (await FileStore(path).load()) == {"contract/a.b.1": {"k": 1}}
    await FileStore(path).apply({"contract/a.b.3": {"k": 3}})
    assert await FileStore(path).load() == {"contract/a.b.1": {"k": 1}, "contract/a.b.3": {"k": 3}}
    assert all(orjson.loads(line) for line in journal.read_bytes().splitlines())  # no garbage left between records


async def test_the_journal_is_compacted_into_a_new_snapshot_once_it_outgrows_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(file_store, "COMPACT_MIN_BYTES", 2000)
    path = tmp_path / "state" / "registry.json"
    store, follower = FileStore(path), FileStore(path, replica_id="w1", replicas=2)
    await follower.load()
    moved = asyncio.Event()

    async def on_change() -> None:
        moved.set()

    follower.watch(on_change)
    try:
        for i in range(60):
            await store.apply({f"contract/a.b.{i}": {"k": i, "pad": "x" * 60}})
        snapshot = orjson.loads(path.read_bytes())
        assert snapshot["generation"] >= 1 and len(snapshot["documents"]) >= 20
        assert journal_path(path).stat().st_size <= max(2000, path.stat().st_size) + 200
        await asyncio.wait_for(moved.wait(), 10)
        docs = await follower.load()  # the follower read the compacted snapshot and the new tail
        assert len(docs) == 60 and docs["contract/a.b.59"]["k"] == 59
        assert follower.version == store.version == 60
    finally:
        await follower.close()
    assert len(await FileStore(path).load()) == 60


async def test_a_journal_of_an_older_generation_is_already_in_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "state" / "registry.json"
    store = FileStore(path)
    await store.apply({"contract/a.b.1": {"k": 1}})
    await store.apply({"contract/a.b.1": {"k": 2}})
    stale = journal_path(path).read_bytes()
    file_store.compact(path)
    journal_path(path).write_bytes(stale)  # a crash between writing the snapshot and the new journal
    assert await FileStore(path).load() == {"contract/a.b.1": {"k": 2}}
    await FileStore(path).apply({"contract/a.b.2": {"k": 3}})
    assert await FileStore(path).load() == {"contract/a.b.1": {"k": 2}, "contract/a.b.2": {"k": 3}}


async def test_a_follower_reads_only_the_new_tail(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state" / "registry.json"
    writer, follower = FileStore(path), FileStore(path, replica_id="w1", replicas=2)
    await writer.apply({f"servable/a.b.{i}.v": {"n": i} for i in range(50)})
    await follower.load()
    reads: list[int] = []
    original = file_store._read_snapshot
    monkeypatch.setattr(file_store, "_read_snapshot", lambda p: reads.append(1) or original(p))
    await writer.apply({"metrics/a.b.3.v": {"scoreCount": 5, "createdAtMS": 1}})
    await follower.check()
    assert follower.peer_counters("a.b.3.v")[0] == 5  # type: ignore[arg-type]
    await writer.apply({"metrics/a.b.3.v": {"scoreCount": 9, "createdAtMS": 1}})
    await follower.check()
    assert follower.peer_counters("a.b.3.v")[0] == 9  # type: ignore[arg-type]
    assert reads == []


async def test_a_change_read_by_a_write_of_counters_is_still_followed(tmp_path: Path) -> None:
    """A follower's own flush catches up on the other's delete: its next check must still call back."""
    path = tmp_path / "state" / "registry.json"
    writer, follower = FileStore(path), FileStore(path, replica_id="w1", replicas=2)
    await writer.apply({"servable/a.b.1.v": {"n": 1}, "metrics/a.b.1.v": {"scoreCount": 1, "createdAtMS": 1}})
    await follower.load()
    calls: list[int] = []

    async def on_change() -> None:
        calls.append(1)
        await follower.load()

    follower._on_change = on_change
    await writer.apply({"servable/a.b.1.v": None, "metrics/a.b.1.v": None})
    await follower.apply({"metrics/a.b.1.v": {"scoreCount": 3, "createdAtMS": 1}})  # its flush, after the delete
    await follower.check()
    assert calls == [1]
    assert await follower.load() == {}  # the flush did not bring the deleted servable's counters back


async def test_deleting_a_release_drops_the_counters_and_router_state_of_every_replica(tmp_path: Path) -> None:
    path = tmp_path / "state" / "registry.json"
    metrics = {"createdAtMS": 1, "scoreCount": 3}
    for replica in ("w1", "w2", "w7"):  # w7: a replica of an earlier, larger --workers run
        store = FileStore(path, replica_id=replica, replicas=3)
        docs = {f"servable/a.b.{i}.v": {"n": i} for i in range(3)} if replica == "w1" else {}
        await store.apply(docs | {f"metrics/a.b.{i}.v": metrics for i in range(3)} | {"routing/a.b.1": {"i": replica}})
        if replica == "w2":
            file_store.compact(path)  # w1's and w2's fields come from the snapshot, w7's from the journal
    deleting = FileStore(path, replica_id="w2", replicas=3)  # not w0: gone replicas are not folded
    await deleting.load()
    await deleting.apply({"servable/a.b.1.v": None, "metrics/a.b.1.v": None, "routing/a.b.1": None})
    contents = FileStore(path, replica_id="w1")
    await contents.load()
    assert sorted(contents._contents.counters) == [f"a.b.{i}.v@{r}" for i in (0, 2) for r in ("w1", "w2", "w7")]
    assert contents._contents.routing == {}
