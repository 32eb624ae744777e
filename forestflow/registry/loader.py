"""Loading servables: fetch the artifact, build the flavor, verify, load it off the loop, give it a scheduler.

The loader holds the artifact cache's claims: a servable keeps its artifact claimed while it is
loaded, and the claim is released when it is unloaded for good or when its load fails, so the
cache can remove what no servable uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import structlog

from forestflow.codecs.ff_settings import MLFLOW
from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV
from forestflow.core.locator import mlflow_model_dir
from forestflow.errors import CreateServableRequestInvalidError, GatewayError
from forestflow.registry.artifacts import ArtifactCache, ArtifactClaim, ArtifactRequest
from forestflow.registry.registry import Loaded
from forestflow.runtime.base import Servable
from forestflow.runtime.batching import batch_policy
from forestflow.runtime.flavors import create_servable
from forestflow.runtime.kernel_shap import KernelExplainer, read_background
from forestflow.runtime.scheduler import ServableScheduler
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")


class ServableLoader:
    """Turns a servable definition into a loaded servable with its scheduler, and back."""

    def __init__(self, settings: Settings, artifacts: ArtifactCache) -> None:
        self.settings = settings
        self.artifacts = artifacts
        #: Loads that failed since start (``/metrics``).
        self.load_failures = 0
        #: What each load under way is doing: ``fetching`` its artifact or ``loading`` it (``/health/ready``).
        self.phases: dict[FQRV, str] = {}

    async def load(self, defn: ServableDefinition, *, restoring: bool = False) -> Loaded:
        """Fetch, create, verify and load; a failure is a GatewayError (422 with the reason).

        ``restoring``: the definition was accepted before (restored at start, or learnt from the
        shared store), not deployed now; see :attr:`Servable.restoring`."""
        self.phases[defn.fqrv] = "fetching" if defn.has_artifact else "loading"
        try:
            return await self._fetch_and_load(defn, restoring)
        finally:
            self.phases.pop(defn.fqrv, None)

    async def _fetch_and_load(self, defn: ServableDefinition, restoring: bool) -> Loaded:
        claim: ArtifactClaim | None = None
        if defn.has_artifact:
            path = mlflow_model_dir(defn.path) if defn.flavor == MLFLOW else defn.path
            claim = await self.artifacts.fetch(ArtifactRequest(path, defn.fqrv, _needed_files(defn)))
        self.phases[defn.fqrv] = "loading"
        flavor_settings = defn.flavor_settings
        if defn.flavor == "H2OMojo":  # the gateway's H2O scorer choice (a servable's own "scorer" wins)
            flavor_settings = {"gatewayScorer": self.settings.h2o_scorer, **flavor_settings}
        try:
            policy = batch_policy(defn.flavor_settings, self.settings.max_batch_rows, self.settings.max_batch_wait_us)
            directory = claim.directory if claim is not None else Path()
            servable = await asyncio.to_thread(create_servable, defn.flavor, defn.fqrv, directory, flavor_settings)
            servable.gateway_settings = self.settings  # gates of composed flavors (pipeline steps)
            servable.loop = asyncio.get_running_loop()
            servable.restoring = restoring
            if defn.sha256:
                await asyncio.to_thread(_verify_sha256, servable, defn.sha256)
            started = time.perf_counter()
            await self._load(defn, servable)
            explainer = await self._explainer(defn, servable, directory)
            load_seconds = time.perf_counter() - started
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.load_failures += 1
            if claim is not None:
                await self.artifacts.release(claim)  # a failed deploy leaves nothing in the cache
            raise
        settings = self.settings
        # Only a servable that declares it batches has requests combined (on threads or the loop).
        batch_rows = policy.max_rows if servable.batchable else 0
        scheduler = ServableScheduler(
            servable,
            None,  # threads of its own: shadow servables cannot take the threads live work needs
            slots=servable.max_concurrency or settings.scoring_slots,
            live_queue=settings.live_queue,
            shadow_queue=settings.shadow_queue,
            max_batch_rows=batch_rows,
            max_threads=settings.scoring_threads,
            coalesce_rows=batch_rows,
            batch_wait_us=policy.wait_us,
        )
        return Loaded(defn, servable, scheduler, claim, load_seconds, explainer)

    async def _explainer(self, defn: ServableDefinition, servable: Servable, directory: Path) -> KernelExplainer | None:
        """The KernelSHAP explainer the definition declares, with its background scored once (422 if it cannot be)."""
        if defn.explainer is None:
            return None
        body = defn.explainer["KernelShap"]
        samples = int(body["samples"])
        if samples > self.settings.kernel_shap_max_samples:
            raise CreateServableRequestInvalidError(
                f"explainer.KernelShap.samples = {samples} is over the limit (kernel_shap_max_samples = "
                f"{self.settings.kernel_shap_max_samples})"
            )
        background = read_background(body["background"], directory, self.settings.kernel_shap_max_background)
        explainer = KernelExplainer(background, samples, self.settings.max_rows)
        try:
            if servable.runs_on_loop:
                answer = await servable.apredict(background, self.settings.request_timeout_ms / 1000)
                await asyncio.to_thread(explainer.prepare, lambda _: answer)
            else:
                await asyncio.to_thread(explainer.prepare, servable.predict)
        except GatewayError as exc:
            raise CreateServableRequestInvalidError(f"the explainer's background cannot be scored: {exc.message}") from None
        except Exception as exc:
            raise CreateServableRequestInvalidError(
                f"the explainer's background cannot be scored: {type(exc).__name__}: {exc}"
            ) from None
        return explainer

    async def _load(self, defn: ServableDefinition, servable: Servable) -> None:
        try:
            if servable.runs_on_loop:
                await servable.aload()
            else:
                await asyncio.to_thread(servable.load)
        except GatewayError:
            raise
        except Exception as exc:  # a flavor bug or an unexpected artifact: a 422 with the reason
            log.exception("servable_load_failed", fqrv=str(defn.fqrv))
            raise CreateServableRequestInvalidError(f"loading {defn.fqrv} failed: {type(exc).__name__}: {exc}") from exc

    async def unload(self, loaded: Loaded) -> None:
        """Let the work already routed to it finish (at most the request timeout), then close the
        scheduler (what is still queued fails), release the model and its artifact.

        The caller has taken the servable out of routing first (make-before-break).
        """
        if not await loaded.scheduler.drain(self.settings.request_timeout_ms / 1000):
            log.warning("servable_drain_timed_out", fqrv=str(loaded.definition.fqrv))
        await loaded.scheduler.close()
        servable = loaded.servable
        if servable.runs_on_loop:
            await servable.aunload()
        else:
            await asyncio.to_thread(servable.unload)
        if loaded.artifact is not None:
            claim: ArtifactClaim = loaded.artifact
            loaded.artifact = None
            await self.artifacts.release(claim)

    async def prune_artifacts(self) -> None:
        """Remove cached artifacts no loaded servable uses (after a restart restored them)."""
        await self.artifacts.prune()


def _needed_files(defn: ServableDefinition) -> tuple[str, ...] | None:
    """The files a flavor loads, for sources that fetch single objects (S3); None = everything."""
    for key in ("mojoPath", "mojo_path"):
        value = defn.flavor_settings.get(key)
        if defn.flavor == "H2OMojo" and isinstance(value, str) and value.strip():
            return (value.strip(),)
    return None


def model_file(servable: Servable) -> Path | None:
    """The file a servable loads (H2O's mojoPath, ONNX's modelPath, Python's modulePath) inside its artifact."""
    settings = servable.settings
    for key in ("mojoPath", "mojo_path", "modelPath", "modulePath", "module_path"):
        value = settings.get(key)
        if isinstance(value, str) and value.strip():
            return Path(servable.artifact_dir) / value.strip()
    return None


def _verify_sha256(servable: Servable, expected: str) -> None:
    path = model_file(servable)
    if path is None or not path.is_file():
        raise CreateServableRequestInvalidError(f"sha256 given but the model file {path} is not in the artifact")
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    if sha.hexdigest() != expected.lower():
        raise CreateServableRequestInvalidError(
            f"sha256 mismatch for {path.relative_to(servable.artifact_dir)}: expected {expected.lower()}, got {sha.hexdigest()}"
        )
