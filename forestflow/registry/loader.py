"""Loading servables: fetch the artifact, build the flavor, verify, load it off the loop, give it a scheduler.

The loader holds the artifact cache's claims: a servable keeps its artifact claimed while it is
loaded, and the claim is released when it is unloaded for good or when its load fails, so the
cache can remove what no servable uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterable
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
        #: With a memory budget, builds run one at a time so that the process's RSS growth is the
        #: release's (:meth:`_measured_load`).
        self._measuring = asyncio.Lock()
        #: The largest RSS growth seen for a model file (name, size, mtime), in bytes.
        self._footprints: dict[tuple[str, int, int], int] = {}

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
            claim = await self.artifacts.fetch(self._request(defn))
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
            budget = self.settings.memory_budget_bytes
            started = time.perf_counter()
            if budget and claim is not None:
                size_bytes, explainer = await self._measured_load(defn, servable, directory, budget)
            else:
                size_bytes = await asyncio.to_thread(release_bytes, servable) if claim is not None else 0
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
        return Loaded(defn, servable, scheduler, claim, load_seconds, explainer, size_bytes)

    async def _measured_load(
        self, defn: ServableDefinition, servable: Servable, directory: Path, budget: int
    ) -> tuple[int, KernelExplainer | None]:
        """Load ``servable`` and measure what it takes: the process's RSS growth over the load, one
        load at a time (the size of the model file understated it 7 to 17 times). The largest growth
        seen for the same model file counts (an allocator that reuses what an eviction freed grows
        less the second time), and never less than the file. A release that is, or was measured,
        larger than the whole budget is refused."""
        key, file_bytes = await asyncio.to_thread(_footprint_key, servable)
        known = max(file_bytes, self._footprints.get(key, 0))
        if known > budget:
            raise _too_large(defn, known, budget)
        async with self._measuring:
            before = _rss_bytes()
            await self._load(defn, servable)
            explainer = await self._explainer(defn, servable, directory)
            grown = _grown(before)
            if key not in self._footprints:
                # The first load of a model file also pays what the process does once (imports,
                # the flavor's caches): a second copy, loaded beside it and dropped, is what one
                # more release of that file takes.
                probe = await asyncio.to_thread(
                    create_servable, defn.flavor, defn.fqrv, Path(servable.artifact_dir), servable.settings
                )
                probe.gateway_settings, probe.loop, probe.restoring = self.settings, servable.loop, True
                before = _rss_bytes()
                await asyncio.to_thread(probe.load)
                grown = _grown(before)
                await asyncio.to_thread(probe.unload)
        size = self._footprints[key] = max(known, grown)
        if size > budget:
            await asyncio.to_thread(servable.unload)
            raise _too_large(defn, size, budget)
        return size, explainer

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

    async def unload(self, loaded: Loaded, *, keep_artifact: bool = False) -> None:
        """Let the work already routed to it finish (at most the request timeout), then close the
        scheduler (what is still queued fails), release the model and its artifact (its cached
        directory stays with ``keep_artifact``: an eviction, the release loads from it again).

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
            await self.artifacts.release(claim, keep=keep_artifact)

    async def prune_artifacts(self, cold: Iterable[ServableDefinition] = ()) -> None:
        """Remove cached artifacts no loaded servable uses and no ``cold`` release may load from
        (after a restart restored them)."""
        keep = [self._request(defn) for defn in cold if defn.has_artifact]
        await self.artifacts.prune(keep)

    @staticmethod
    def _request(defn: ServableDefinition) -> ArtifactRequest:
        path = mlflow_model_dir(defn.path) if defn.flavor == MLFLOW else defn.path
        return ArtifactRequest(path, defn.fqrv, _needed_files(defn))


def _needed_files(defn: ServableDefinition) -> tuple[str, ...] | None:
    """The files a flavor loads, for sources that fetch single objects (S3); None = everything."""
    for key in ("mojoPath", "mojo_path"):
        value = defn.flavor_settings.get(key)
        if defn.flavor == "H2OMojo" and isinstance(value, str) and value.strip():
            return (value.strip(),)
    return None


def _too_large(defn: ServableDefinition, size: int, budget: int) -> CreateServableRequestInvalidError:
    return CreateServableRequestInvalidError(
        f"{defn.fqrv} needs {size / 2**20:.1f} MiB, more than the whole model_memory_budget_mb "
        f"of {budget // 2**20} MiB of this process: it is never loaded here"
    )


def _footprint_key(servable: Servable) -> tuple[tuple[str, int, int], int]:
    """What identifies a release's model file for :attr:`ServableLoader._footprints`, and its bytes."""
    path = model_file(servable)
    if path is not None and path.is_file():
        st = path.stat()
        return (f"{servable.__class__.__name__}:{path.name}", st.st_size, st.st_mtime_ns), st.st_size
    size = release_bytes(servable)
    return (f"{servable.__class__.__name__}:{Path(servable.artifact_dir).name}", size, 0), size


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _grown(before: int | None) -> int:
    """How much the RSS grew since ``before`` (0 where it cannot be read)."""
    after = _rss_bytes()
    return after - before if before is not None and after is not None else 0


def _rss_bytes() -> int | None:
    """This process's resident set now (None where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def release_bytes(servable: Servable) -> int:
    """A release's size for the memory budget: the bytes of the file its flavor loads (H2O's
    mojoPath, ONNX's modelPath, ...), else of every file of its artifact."""
    path = model_file(servable)
    if path is not None and path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in Path(servable.artifact_dir).rglob("*") if p.is_file())


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
