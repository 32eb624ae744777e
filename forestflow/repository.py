"""Model repository: a directory of servable entries deployed at start, and the V2 repository operations.

Each entry is a directory holding one TOML definition (``model.toml``, ``pipeline.toml`` or the
only ``*.toml`` in it) and its artifacts. The TOML is AMD's model format (see
``runtime/pipeline_definition.py``) with the deployment as extra top-level keys::

    contract = "samples.prostate.1"          # org.project.N
    release = "gbm-v1"                       # default: the directory's name
    [servable_settings]                      # ForestFlow's servableSettings (default: valid at
    policySettings = { validityPolicy = [{ ImmediatelyValid = {} }], phaseInPolicy = { ImmediatePhaseIn = {} } }
    loggingSettings = { logLevel = "NONE" }  #  once loaded, fully phased in, not logged)
    [contract_settings]                      # optional, ForestFlow's contractSettings

A one-model table (no ``[[models]]``) whose platform names a flavor with an artifact deploys as
that flavor, one of platform ``remote_v2`` (``url``, ``model``... beside it) as a RemoteV2
servable; anything else deploys as a ``Pipeline`` of that TOML. Deploying is idempotent: an entry
whose definition (content digest included) is already in the registry is left alone, a changed one
is redeployed, a broken one is logged and skipped while the others load. An entry whose deploy at
start fails (not one that cannot be read) is tried again with backoff until it deploys, as the
entry then reads (``Gateway.loads``): shown as failed meanwhile, it does not hold readiness.

This module only calls the Gateway's public admin methods (``create_servable``,
``delete_servable`` through ``Gateway.admin``) and lookups (``definition``, ``loaded``, ``failed``, ``contracts``).
"""

from __future__ import annotations

import asyncio
import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from forestflow.codecs.ff_settings import (
    contract_settings_to_json,
    parse_contract_settings,
    parse_serve_request,
    serve_request_to_json,
)
from forestflow.codecs.jsonread import Obj
from forestflow.core.definition import NO_ARTIFACT_FLAVORS, ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError, GatewayError, InvalidInput, NotFound, UnknownServable
from forestflow.registry.store import metrics_from_doc, metrics_to_doc
from forestflow.runtime.pipeline_definition import STEP_KEYS
from forestflow.runtime.step_platforms import step_platform

if TYPE_CHECKING:
    from forestflow.service import Gateway

log = structlog.get_logger("forestflow.repository")

#: Definition file names looked for in an entry, before "the only *.toml".
DEFINITION_NAMES = ("model.toml", "pipeline.toml")
#: The tag recording the digest of an entry's files (what "unchanged" means).
DIGEST_TAG = "repositoryDigest"
DEFAULT_SERVABLE_SETTINGS = {
    "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
    "loggingSettings": {"logLevel": "NONE"},
}


class EntryError(Exception):
    """A repository entry that cannot be read into a definition."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of the repository: its directory and definition, or why it has none."""

    directory: Path
    definition: ServableDefinition | None
    error: str = ""


def _definition_file(directory: Path) -> Path:
    for name in DEFINITION_NAMES:
        if (directory / name).is_file():
            return directory / name
    found = sorted(directory.glob("*.toml"))
    if len(found) == 1:
        return found[0]
    raise EntryError(f"expected {' or '.join(DEFINITION_NAMES)} (or a single *.toml), found {len(found)} TOML files")


def _digest(directory: Path) -> str:
    """A digest of every file's relative name and bytes: any change to the entry changes it."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(directory)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def read_entry(directory: Path) -> ServableDefinition:
    """An entry directory as a servable definition (EntryError with the reason if it is not one)."""
    file = _definition_file(directory)
    try:
        doc = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EntryError(f"{file.name} is not valid TOML: {exc}") from None
    contract = doc.get("contract")
    if not isinstance(contract, str):
        raise EntryError(f'{file.name}: contract required ("org.project.N")')
    try:
        parsed = Contract.parse(contract)
    except InvalidInput as exc:
        raise EntryError(f"{file.name}: contract: {exc.message}") from None
    release = doc.get("release", directory.name)
    if not isinstance(release, str) or not release:
        raise EntryError(f"{file.name}: release must be a string")
    platform = step_platform(str(doc.get("platform", ""))) if "models" not in doc else None
    if platform is not None and platform.artifact_key is not None and isinstance(doc.get("id"), str):
        flavor: dict[str, Any] = {platform.flavor: {platform.artifact_key: doc["id"]}}
    elif platform is not None and platform.flavor in NO_ARTIFACT_FLAVORS:
        # A model served elsewhere (platform remote_v2): the table's other keys are its flavor's.
        flavor = {platform.flavor: {k: v for k, v in doc.items() if k not in STEP_KEYS}}
    else:
        flavor = {"Pipeline": {"definition": file.name}}
    body: dict[str, Any] = {
        "path": directory.resolve().as_uri(),
        "fqrv": {
            "contract": {"organization": parsed.organization, "project": parsed.project, "contract_number": parsed.number},
            "release_version": release,
        },
        "flavor": flavor,
        "servableSettings": doc.get("servable_settings", DEFAULT_SERVABLE_SETTINGS),
        "tags": {DIGEST_TAG: _digest(directory)},
    }
    if "contract_settings" in doc:
        body["contractSettings"] = doc["contract_settings"]
    try:
        return parse_serve_request(body)
    except GatewayError as exc:
        raise EntryError(f"{file.name}: {exc.message}") from None


def _comparable(defn: ServableDefinition) -> dict[str, Any]:
    out = serve_request_to_json(defn)
    out.pop("createdAtMS", None)
    return out


class ModelRepository:
    """Deploys the entries of a repository directory into a Gateway and answers the V2 repository calls."""

    def __init__(self, gateway: Gateway, root: Path | None) -> None:
        self.gateway = gateway
        self.root = root
        #: Why the last deploy of an entry failed (shown by the index until it deploys).
        self.failures: dict[FQRV, str] = {}
        #: One deploy of an entry at a time: a retry in the background and a load request never race.
        self._deploying = asyncio.Lock()

    def scan(self) -> list[Entry]:
        """Every entry directory, read (a broken one carries its reason instead of a definition)."""
        if self.root is None:
            return []
        if not self.root.is_dir():
            log.error("repository_missing", path=str(self.root))
            return []
        entries = []
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                entries.append(Entry(directory, read_entry(directory)))
            except (EntryError, OSError) as exc:
                entries.append(Entry(directory, None, str(exc)))
        return entries

    async def deploy_all(self) -> dict[str, int]:
        """Deploy every entry (idempotently); broken ones are logged and skipped, the ones whose
        deploy failed are tried again in the background. Returns counts."""
        counts = {"deployed": 0, "unchanged": 0, "failed": 0}
        for entry in await asyncio.to_thread(self.scan):
            outcome = await self._deploy_entry(entry)
            counts[outcome] += 1
            if outcome == "failed" and entry.definition is not None:
                fqrv = entry.definition.fqrv
                self.gateway.loads.follow(entry.definition, self._redeploy, registered=False, failed=self.failures[fqrv])
        log.info("repository_loaded", path=str(self.root), **counts)
        return counts

    async def _deploy_entry(self, entry: Entry) -> str:
        if entry.definition is None:
            log.error("repository_entry_skipped", entry=entry.directory.name, reason=entry.error)
            return "failed"
        try:
            deployed = await self._deploy(entry.definition)
        except GatewayError as exc:
            log.error("repository_entry_skipped", entry=entry.directory.name, fqrv=str(entry.definition.fqrv), reason=exc.message)
            return "failed"
        if not deployed:
            return "unchanged"
        log.info("repository_entry_deployed", entry=entry.directory.name, fqrv=str(entry.definition.fqrv))
        return "deployed"

    async def _deploy(self, defn: ServableDefinition) -> bool:
        """Deploy one entry's definition unless the registry has it as it is (False); a failure
        is remembered for the index and raised."""
        async with self._deploying:
            try:
                current = self.gateway.definition(defn.fqrv)
            except UnknownServable:
                current = None
            if current is not None and _comparable(current) == _comparable(defn):
                return False
            try:
                if current is not None:
                    await self.gateway.admin.delete_servable(defn.fqrv)
                await self.gateway.admin.create_servable(defn)
            except GatewayError as exc:
                self.failures[defn.fqrv] = exc.message
                raise
            self.failures.pop(defn.fqrv, None)
            return True

    async def _redeploy(self, defn: ServableDefinition) -> bool:
        """One more attempt at an entry whose deploy at start failed, as the entry reads now (run
        by ``Gateway.loads``); an entry gone from the repository, or no longer readable, is left."""
        for entry in await asyncio.to_thread(self.scan):
            if entry.definition is not None and entry.definition.fqrv == defn.fqrv:
                if await self._deploy(entry.definition):
                    log.info("repository_entry_deployed", entry=entry.directory.name, fqrv=str(defn.fqrv))
                return True
        self.failures.pop(defn.fqrv, None)
        return True

    # ---- V2 repository extension ----------------------------------------------------------------
    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: ``{name, version, state[, reason]}`` for every repository
        entry and every servable the gateway has (model name = contract, version = release)."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for entry in await asyncio.to_thread(self.scan):
            if entry.definition is None:
                rows[(f"({entry.directory.name})", "")] = {
                    "name": entry.directory.name,
                    "version": "",
                    "state": "UNAVAILABLE",
                    "reason": entry.error,
                }
                continue
            fqrv = entry.definition.fqrv
            rows[(str(fqrv.contract), fqrv.release)] = self._row(fqrv)
        for contract, state in self.gateway.contracts.items():
            for release in state.servables:
                rows.setdefault((str(contract), release), self._row(FQRV(contract, release)))
        for key, parked in (await self.gateway.store.load()).items():
            if key.startswith("parked/"):
                for item in parked["servables"]:
                    fqrv = parse_serve_request(item["definition"]).fqrv
                    rows.setdefault((str(fqrv.contract), fqrv.release), self._row(fqrv))
        out = sorted(rows.values(), key=lambda r: (r["name"], r["version"]))
        return [r for r in out if r["state"] == "READY"] if ready_only else out

    def _row(self, fqrv: FQRV) -> dict[str, Any]:
        row: dict[str, Any] = {"name": str(fqrv.contract), "version": fqrv.release}
        loaded = self.gateway.loaded.get(fqrv)
        if loaded is not None and loaded.servable.ready:
            row["state"] = "READY"
        elif fqrv in self.failures or fqrv in self.gateway.failed:
            row["state"], row["reason"] = "UNAVAILABLE", self.failures.get(fqrv) or self.gateway.failed[fqrv]
        else:
            row["state"], row["reason"] = "UNAVAILABLE", "unloaded"
        return row

    async def load(self, name: str) -> list[FQRV]:
        """Bring a model (contract) back: the releases an unload set aside, with their settings and
        counters, then every repository entry of it not deployed as it is. 404 when neither has it;
        a failed deploy answers with its reason (422)."""
        contract = _model_contract(name)
        deployed = await self._restore_parked(contract)
        entries = [
            e for e in await asyncio.to_thread(self.scan) if e.definition is not None and e.definition.fqrv.contract == contract
        ]
        if not entries and not deployed:
            raise NotFound(f"the model repository has no entry for model {name!r}, and it was not unloaded")
        for entry in entries:
            assert entry.definition is not None
            try:
                current = self.gateway.definition(entry.definition.fqrv)
            except UnknownServable:
                current = None
            changed = current is None or _comparable(current) != _comparable(entry.definition)
            if changed and await self._deploy_entry(entry) == "failed":
                raise CreateServableRequestInvalidError(self.failures[entry.definition.fqrv])
            if entry.definition.fqrv not in deployed:
                deployed.append(entry.definition.fqrv)
        return deployed

    async def unload(self, name: str) -> list[FQRV]:
        """Free every release of a model (contract), and stop retrying its entries; 404 if the gateway
        has none.

        Triton's unload: the models leave memory and routing, and their definitions, settings and
        counters are set aside in the store (``parked/<contract>``) for :meth:`load` to bring back
        (a contract deployed through the admin API as much as a repository entry)."""
        contract = _model_contract(name)
        gateway = self.gateway
        retried = [f for f, status in gateway.loads.statuses.items() if f.contract == contract and not status.registered]
        for fqrv in retried:
            gateway.loads.drop(fqrv)
        state = gateway.contracts.get(contract)
        if state is None:
            if retried:
                return []
            raise NotFound(f"unknown model {name!r}")
        entries = sorted(state.servables.values(), key=lambda e: (e.metrics.created_at_ms, e.fqrv.release))
        parked = {
            "contractSettings": contract_settings_to_json(state.settings),
            "servables": [
                {
                    "definition": serve_request_to_json(gateway.definition(e.fqrv)),
                    "metrics": metrics_to_doc(gateway.stats_metrics(e)),
                }
                for e in entries
            ],
        }
        await gateway.admin.persist({parked_key(contract): parked})
        removed = []
        for entry in entries:
            removed += await gateway.admin.delete_servable(entry.fqrv)
        log.info("model_unloaded", model=str(contract), releases=[str(f) for f in removed])
        return removed

    async def _restore_parked(self, contract: Contract) -> list[FQRV]:
        """Deploy again what :meth:`unload` set aside (none: [])."""
        gateway = self.gateway
        parked = (await gateway.store.load()).get(parked_key(contract))
        if not parked:
            return []
        admin = gateway.admin
        settings = parse_contract_settings(Obj(parked["contractSettings"], parked_key(contract)))
        if contract not in gateway.contracts:
            await admin.create_contract(contract, settings)
        restored = []
        for item in parked["servables"]:
            defn = replace(parse_serve_request(item["definition"]), contract_settings=None)
            if defn.fqrv not in gateway.loaded:
                await admin.create_servable(defn)
            metrics = metrics_from_doc(item["metrics"], defn.created_at_ms)
            async with gateway.registry.lock:
                gateway.registry.entry(defn.fqrv).metrics = metrics
                gateway.registry.mark_counted(contract)
            restored.append(defn.fqrv)
        async with gateway.registry.lock:
            await admin.evaluate(gateway.contracts[contract])
        await admin.flush_metrics()
        await admin.persist({parked_key(contract): None})
        log.info("model_loaded", model=str(contract), releases=[str(f) for f in restored])
        return restored


def parked_key(contract: Contract) -> str:
    """Key of the store document holding an unloaded model's releases, settings and counters."""
    return f"parked/{contract}"


def _model_contract(name: str) -> Contract:
    try:
        return Contract.parse(name)
    except InvalidInput:
        raise NotFound(f"unknown model {name!r}: model names are contracts, org.project.N") from None
