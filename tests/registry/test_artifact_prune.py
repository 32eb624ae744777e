"""The artifact cache with lazy loading: an evicted release keeps its directory; pruning keeps what
cold releases may load from and removes the rest."""

from __future__ import annotations

from pathlib import Path

from forestflow.core.ids import FQRV
from forestflow.registry.artifacts import ArtifactCache, ArtifactRequest


def source(tmp_path: Path, name: str) -> ArtifactRequest:
    directory = tmp_path / "models" / name
    directory.mkdir(parents=True)
    (directory / "model.py").write_text(f"NAME = {name!r}\n")
    return ArtifactRequest(directory.as_uri(), FQRV.parse(f"acme.demo.1.{name}"), None)


async def test_eviction_keeps_the_directory_and_prune_keeps_what_cold_releases_use(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache", file_roots=[tmp_path / "models"])
    cold, deleted, gone_source = source(tmp_path, "cold"), source(tmp_path, "deleted"), source(tmp_path, "vanished")
    claims = {req.fqrv.release: await cache.fetch(req) for req in (cold, deleted, gone_source)}
    for claim in claims.values():
        await cache.release(claim, keep=True)  # evicted from memory, still in the registry
        assert claim.directory.is_dir()
    (Path(gone_source.path.removeprefix("file://")) / "model.py").unlink()
    pruned = await cache.prune([cold, gone_source])  # the deleted release is no longer in the registry
    assert sorted(pruned) == sorted([claims["deleted"].digest, claims["vanished"].digest])
    assert claims["cold"].directory.is_dir() and not claims["deleted"].directory.exists()
    again = await cache.fetch(cold)  # the cold release loads from the kept directory, not a new copy
    assert again.directory == claims["cold"].directory and cache.fetch_count == 3
    await cache.release(again)  # deleted for good: its directory goes with its last claim
    assert not again.directory.exists()
