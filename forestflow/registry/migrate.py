"""Switching registry stores: refuse to start over the other store's registry, and copy it across.

A data dir remembers which store its registry lives in: the file store's ``state/registry.json``,
or, once the gateway has served it from Redis, ``state/store.json`` (``{"store": "redis", "redisUrl"}``).
Serving with Redis over a data dir whose file store holds contracts, or with the file store over a
data dir whose registry went to Redis, would start with an empty registry and prune the cached
artifacts of the one the user left behind: :func:`check_store_switch` refuses that with one line
naming ``forestflow store migrate``, which :func:`migrate` implements (the source is kept: the
file store's registry is folded into one file renamed ``registry.json.migrated``, Redis is left as it is).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from forestflow.core.ids import FQRV
from forestflow.registry.file_store import FileStore, compact, journal_path, read_registry
from forestflow.registry.store import counters_doc, counters_of

#: What a data dir says about the store its registry lives in.
MARKER = Path("state") / "store.json"
REGISTRY = Path("state") / "registry.json"


class StoreSwitch(Exception):
    """The store the settings choose is not the one this data dir's registry lives in (one line)."""


def _marker(data_dir: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads((data_dir / MARKER).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _file_contracts(data_dir: Path) -> int:
    """How many servables the data dir's file store holds (0 when it has no registry)."""
    try:
        documents = read_registry(data_dir / REGISTRY)
    except (OSError, orjson.JSONDecodeError):
        return 0
    return sum(1 for key in documents if key.startswith("servable/"))


def check_store_switch(data_dir: Path, redis_url: str) -> None:
    """Raise :class:`StoreSwitch` when the chosen store would hide the registry of the other one;
    otherwise remember the choice (a data dir served from Redis records it)."""
    marker = _marker(data_dir)
    if redis_url:
        held = _file_contracts(data_dir)
        if held:
            raise StoreSwitch(
                f"the file store of {data_dir} holds {held} servable(s) and the gateway is set to use Redis "
                f"({redis_url}): copy them with 'forestflow store migrate --to redis --data-dir {data_dir} "
                f"--redis-url {redis_url}', or start without FORESTFLOW_REDIS_URL"
            )
        if marker.get("store") != "redis" or marker.get("redisUrl") != redis_url:
            _write_marker(data_dir, {"store": "redis", "redisUrl": redis_url})
    elif marker.get("store") == "redis":
        url = marker.get("redisUrl", "")
        raise StoreSwitch(
            f"the registry of {data_dir} lives in Redis ({url}) and the gateway is set to use the file store: "
            f"copy it with 'forestflow store migrate --to file --data-dir {data_dir} --redis-url {url}', "
            f"or start with FORESTFLOW_REDIS_URL={url}"
        )


def _write_marker(data_dir: Path, doc: dict[str, Any]) -> None:
    path = data_dir / MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps(doc))
    tmp.replace(path)


async def migrate(data_dir: Path, redis_url: str, to: str) -> int:
    """Copy the registry (definitions, contract settings, counters, unloaded models) from one store
    to the other; returns how many servables were copied. The target must hold no servable."""
    from forestflow.registry.redis_store import RedisStore

    redis = RedisStore(redis_url)
    file = FileStore(data_dir / REGISTRY)  # replica w0 of one: it counts every worker's counters
    try:
        source, target = (file, redis) if to == "redis" else (redis, file)
        docs = await source.load()
        if any(key.startswith("servable/") for key in await target.load()):
            raise StoreSwitch(f"the {to} store already holds servables: nothing was copied")
        copied = {}
        for key, doc in docs.items():
            if key.startswith("routing/") and to == "redis":
                continue  # router positions stay in each replica's memory with Redis
            if key.startswith("metrics/") and source is redis:  # every replica's counters, summed
                own = counters_of(doc)
                peers = redis.peer_counters(FQRV.parse(key.removeprefix("metrics/")))
                doc = {**doc, **counters_doc([a + b for a, b in zip(own, peers)])}
            copied[key] = doc
        await target.apply(copied)
    finally:
        await redis.close()
    if to == "redis":
        registry = data_dir / REGISTRY
        compact(registry)  # the journal's changes into the file that is kept
        registry.replace(registry.with_name(registry.name + ".migrated"))
        journal_path(registry).unlink(missing_ok=True)
        _write_marker(data_dir, {"store": "redis", "redisUrl": redis_url})
    else:
        (data_dir / MARKER).unlink(missing_ok=True)
    return sum(1 for key in copied if key.startswith("servable/"))


def run_migrate(data_dir: Path, redis_url: str, to: str) -> int:
    """``forestflow store migrate``: the number of servables copied (raises StoreSwitch, OSError, RedisError)."""
    return asyncio.run(migrate(data_dir, redis_url, to))
