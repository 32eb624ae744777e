"""A servable definition: what an admin deploys (ForestFlow's BasicServeRequest, protocol-free)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from forestflow.core.ids import FQRV
from forestflow.core.policies import ContractSettings, LoggingSettings, PolicySettings, ServableSettings

#: Flavors that load no artifact (their ``path`` is optional and nothing is fetched): models served
#: by another server.
NO_ARTIFACT_FLAVORS = frozenset({"RemoteV2"})


@dataclass(frozen=True, slots=True)
class ServableDefinition:
    """Where a model's artifact lives, how to load it, and the servable's settings."""

    fqrv: FQRV
    path: str
    flavor: str
    flavor_settings: dict[str, Any]
    settings: ServableSettings
    contract_settings: ContractSettings | None = None
    tags: dict[str, str] = field(default_factory=dict)
    #: ms since the epoch when first deployed (kept across restarts).
    created_at_ms: int = 0
    #: Expected sha256 (hex) of the model file the flavor loads; empty = not checked.
    sha256: str = ""
    #: A model-agnostic explainer (``{"KernelShap": {"background": ..., "samples": n}}``); None = none.
    explainer: dict[str, Any] | None = None

    @property
    def has_artifact(self) -> bool:
        """Whether deploying fetches an artifact from ``path`` (not for remote backends)."""
        return self.flavor not in NO_ARTIFACT_FLAVORS

    def with_policy(self, policy: PolicySettings) -> ServableDefinition:
        """A copy with new policy settings (logging kept)."""
        return replace(self, settings=replace(self.settings, policy=policy))

    def with_logging(self, logging: LoggingSettings) -> ServableDefinition:
        """A copy with new logging settings (policy kept)."""
        return replace(self, settings=replace(self.settings, logging=logging))
