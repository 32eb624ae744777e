"""Pinned releases: ``X-Forestflow-Release: <release>`` makes that release answer one request.

Valid or shadow-only, the named release scores the request (no shadow copies), which is logged as
served and marked pinned. Allowed when the contract's settings say ``allowPinnedReleases: true``
or the caller shows the admin token; 403 otherwise, 404 for a release the contract lacks.
"""

from __future__ import annotations

from collections.abc import Mapping

from forestflow.api.admin import is_admin_token
from forestflow.core.contract_state import ContractState
from forestflow.service import Gateway, Route

#: The header naming the release that must answer a request.
PIN_HEADER = "X-Forestflow-Release"


def pinned_route(
    gateway: Gateway, state: ContractState, release: str | None, authorization: str, admin_token: str
) -> Route | None:
    """The route of a request pinned to ``release`` (None when it names none): 403 unless the
    contract allows pinning or ``authorization`` carries the admin token; 404 for an unknown release."""
    if not release:
        return None
    allowed = gateway.pinned_release(state, release, is_admin_token(admin_token, authorization))
    return gateway.route(state.contract, allowed, state, pinned=True)


def headers_pinned_route(gateway: Gateway, state: ContractState, headers: Mapping[str, str]) -> Route | None:
    """:func:`pinned_route` for a request's headers."""
    pin, authorization = headers.get(PIN_HEADER), headers.get("Authorization", "")
    return pinned_route(gateway, state, pin, authorization, gateway.settings.admin_token)
