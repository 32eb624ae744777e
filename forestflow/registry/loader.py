"""Loading servables: fetch the artifact, build the flavor, load it off the loop, give it a scheduler."""

from __future__ import annotations

import asyncio

import structlog

from forestflow.core.definition import ServableDefinition
from forestflow.errors import CreateServableRequestInvalidError, GatewayError
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.registry import Loaded
from forestflow.runtime.base import create_servable
from forestflow.runtime.scheduler import ServableScheduler
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")


class ServableLoader:
    """Turns a servable definition into a loaded servable with its scheduler, and back."""

    def __init__(self, settings: Settings, artifacts: ArtifactCache) -> None:
        self.settings = settings
        self.artifacts = artifacts

    async def load(self, defn: ServableDefinition) -> Loaded:
        """Fetch, create and load; a failure is a GatewayError (422 with the reason)."""
        directory = await self.artifacts.fetch(defn.path)
        servable = create_servable(defn.flavor, defn.fqrv, directory, defn.flavor_settings)
        servable.gateway_settings = self.settings  # gates of composed flavors (pipeline steps)
        try:
            await asyncio.to_thread(servable.load)
        except GatewayError:
            raise
        except Exception as exc:  # a flavor bug or an unexpected artifact: a 422 with the reason
            log.exception("servable_load_failed", fqrv=str(defn.fqrv))
            raise CreateServableRequestInvalidError(f"loading {defn.fqrv} failed: {type(exc).__name__}: {exc}") from exc
        settings = self.settings
        scheduler = ServableScheduler(
            servable,
            None,  # threads of its own: shadow servables cannot take the threads live work needs
            slots=servable.max_concurrency or settings.scoring_slots,
            live_queue=settings.live_queue,
            shadow_queue=settings.shadow_queue,
            max_batch_rows=settings.max_batch_rows if getattr(servable, "batchable", False) else 0,
            max_threads=settings.scoring_threads,
            coalesce_rows=settings.max_batch_rows,
        )
        return Loaded(defn, servable, scheduler)

    async def unload(self, loaded: Loaded) -> None:
        """Close the scheduler (queued work fails) and release the model."""
        await loaded.scheduler.close()
        await asyncio.to_thread(loaded.servable.unload)
