"""Issue 46: the background warm-up of cold releases loads them only while no request is served.

A load's thread holds the GIL the event loop needs, so loading in the background while requests
are answered made their tail several times longer. An in-process gateway with lazy loading warms
every routed release while idle; releases learnt from the store while requests keep coming stay
cold (cold requests would load them on demand) until the requests stop, then they load; traffic
that never stops still lets a load through every WARM_BUSY_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from forestflow.codecs.ff_settings import parse_serve_request, serve_request_to_json
from forestflow.registry import residency as residency_module
from forestflow.registry.file_store import FileStore
from tests.registry.test_lazy_loading import BODY, HEADERS, gbm_dir, release, seed_file_store
from tests.support import InProcessGateway, serve_in_process, wait_for


@pytest.mark.slow  # soak-like: seconds of traffic, then the 5 s window without requests the warm-up waits for
async def test_the_background_warm_up_waits_for_the_requests_to_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Requests come every few ms; a window of 5 s keeps a loaded machine's stalls from looking like a pause.
    monkeypatch.setattr(residency_module, "BUSY_WINDOW_S", 5.0)
    monkeypatch.setattr(residency_module, "WARM_BUSY_INTERVAL_S", 600.0)
    model = gbm_dir(tmp_path / "model")
    data = tmp_path / "data"
    await asyncio.to_thread(seed_file_store, data, [release(model, n) for n in range(4)])
    async with serve_in_process(data, lazy_loading=True, warm_concurrency=2) as gw:
        gateway, residency = gw.gateway, gw.gateway.residency
        await wait_for(lambda: len(gateway.loaded) == 4, 30, "the idle gateway to warm its 4 releases")
        assert residency.loads_done == 4 and not residency.warm_paused.is_set()

        answered = asyncio.Event()
        stop = asyncio.Event()

        driving = asyncio.create_task(traffic(gw, stop, answered))
        await asyncio.wait_for(answered.wait(), 30)
        # Four more releases written to the store by someone else: learnt as cold, to be warmed.
        await add_releases(data, model, range(4, 8))
        await wait_for(lambda: len(gateway.registry.cold) == 4, 30, "the gateway to learn the 4 new releases")
        await asyncio.wait_for(residency.warm_paused.wait(), 30)
        served_before = residency.last_request
        await wait_for(lambda: residency.last_request > served_before + 1.0, 30, "a second more of requests")
        assert residency.loads_done == 4, "a release was loaded in the background while requests were served"
        assert sorted(str(f) for f in gateway.registry.cold) == [f"acme.scale.{n}.gbm" for n in range(4, 8)]

        stop.set()
        assert await driving > 0
        await wait_for(lambda: len(gateway.loaded) == 8, 30, "the warm-up to load the 4 releases once requests stopped")
        assert residency.loads_done == 8 and not gateway.registry.cold
        assert not residency.warm_paused.is_set()


async def test_requests_that_never_stop_still_let_the_warm_up_through_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(residency_module, "BUSY_WINDOW_S", 5.0)
    monkeypatch.setattr(residency_module, "WARM_BUSY_INTERVAL_S", 0.2)
    monkeypatch.setattr(residency_module, "WARM_BUSY_SHARE", 0.5)  # the wait after a load: twice its duration
    model = gbm_dir(tmp_path / "model")
    data = tmp_path / "data"
    await asyncio.to_thread(seed_file_store, data, [release(model, 0)])
    async with serve_in_process(data, lazy_loading=True, warm_concurrency=1) as gw:
        gateway, residency = gw.gateway, gw.gateway.residency
        await wait_for(lambda: len(gateway.loaded) == 1, 30, "the idle gateway to warm its release")
        stop = asyncio.Event()
        answered = asyncio.Event()

        driving = asyncio.create_task(traffic(gw, stop, answered))
        try:
            await asyncio.wait_for(answered.wait(), 30)
            await add_releases(data, model, range(1, 4))
            await wait_for(lambda: len(gateway.registry.cold) == 3, 30, "the gateway to learn the 3 new releases")
            await wait_for(lambda: len(gateway.loaded) == 4, 60, "the warm-up to load the 3 releases under traffic")
            assert residency.loads_done == 4 and not driving.done(), "the releases loaded while requests kept coming"
            assert time_since(residency.last_request) < 5.0
        finally:
            stop.set()
            await driving


def time_since(moment: float) -> float:
    return time.monotonic() - moment


async def traffic(gw: InProcessGateway, stop: asyncio.Event, answered: asyncio.Event) -> int:
    """Score requests one after the other until ``stop``; each must answer 200. Returns their count."""
    count = 0
    while not stop.is_set():
        async with gw.session.post(f"{gw.url}/acme/scale/0/score", data=BODY, headers=HEADERS) as r:
            assert r.status == 200, await r.text()
        count += 1
        answered.set()
    return count


async def add_releases(data: Path, model: Path, numbers: range) -> None:
    """Releases written to the gateway's file store by someone else (it learns them as cold)."""
    docs = {}
    for n in numbers:
        defn = parse_serve_request(release(model, n))
        docs[f"servable/{defn.fqrv}"] = serve_request_to_json(defn)
    await FileStore(data / "state" / "registry.json").apply(docs)
