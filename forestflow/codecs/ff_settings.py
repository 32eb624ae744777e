"""ForestFlow's JSON for ids, settings and serve requests <-> the core's types.

Input accepts proto field names or camelCase; output is camelCase with int64 as strings, enums
by name and oneofs as single-key objects, as ForestFlow (ScalaPB json4s) printed them.
"""

from __future__ import annotations

import re
from typing import Any

from forestflow.codecs.jsonread import Obj, camel, oneof
from forestflow.core.definition import NO_ARTIFACT_FLAVORS, ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.core.locator import fqrv_from_path
from forestflow.core.policies import (
    BanditParams,
    ContractSettings,
    ExpirationPolicy,
    ImmediatelyValid,
    ImmediatePhaseIn,
    KeepLatest,
    KeepTopRanked,
    LinearTimeBasedPhaseIn,
    LoggingSettings,
    LogLevel,
    MaxErrorRateValidity,
    MinServedEventsBasedValidity,
    NeverValid,
    Ordering,
    PerformanceBasedValidity,
    PhaseInPolicy,
    PolicySettings,
    RewardKind,
    RouterParams,
    RouterType,
    ServableMetrics,
    ServableSettings,
    StickyParams,
    TimeBasedValidity,
    ValidityRule,
)
from forestflow.errors import InvalidInput

FLAVORS = ("H2OMojo", "Python", "ONNX", "Pipeline", "RemoteV2")
#: The internal flavor of an MLFlowServeRequest: the model's MLmodel file picks the real one at load.
MLFLOW = "MLflow"
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


# ---- ids ------------------------------------------------------------------------------------------
def contract_to_json(contract: Contract) -> dict[str, Any]:
    """``{"organization", "project", "contractNumber"}``."""
    return {"organization": contract.organization, "project": contract.project, "contractNumber": contract.number}


def fqrv_to_json(fqrv: FQRV) -> dict[str, Any]:
    """``{"contract": {...}, "releaseVersion"}``."""
    return {"contract": contract_to_json(fqrv.contract), "releaseVersion": fqrv.release}


def parse_contract(o: Obj) -> Contract:
    """A Contract object."""
    return Contract(o.str("organization"), o.str("project"), o.int("contract_number"))


def parse_fqrv(o: Obj) -> FQRV:
    """An FQRV object."""
    contract = o.obj("contract")
    assert contract is not None
    return FQRV(parse_contract(contract), o.str("release_version"))


# ---- servable settings ------------------------------------------------------------------------
_VALIDITY = (
    "ImmediatelyValid",
    "NeverValid",
    "TimeBasedValidity",
    "PerformanceBasedValidity",
    "MinServedEventsBasedValidity",
    "MaxErrorRateValidity",
)


def parse_validity(value: Any, path: str) -> ValidityRule:
    """One ValidityRuleShim."""
    name, o = oneof(value, path, _VALIDITY)
    if name == "ImmediatelyValid":
        return ImmediatelyValid()
    if name == "NeverValid":
        return NeverValid()
    if name == "TimeBasedValidity":
        return TimeBasedValidity(o.int("validAfterMS"))
    if name == "PerformanceBasedValidity":
        metric = o.str("metric", required=False) or o.str("metricName", required=False)
        return PerformanceBasedValidity(o.float("minThreshold"), metric)
    if name == "MaxErrorRateValidity":
        rate, events = o.float("maxErrorRate"), o.int("minEvents")
        if not 0.0 <= rate <= 1.0:
            raise InvalidInput(f"{o.path}.maxErrorRate: must be between 0 and 1, got {rate}")
        if events < 1:
            raise InvalidInput(f"{o.path}.minEvents: must be >= 1, got {events}")
        return MaxErrorRateValidity(rate, events)
    n = o.int("validAfterMinServedEvents")
    if n < 0:
        raise InvalidInput(f"{o.path}.validAfterMinServedEvents: must be >= 0")
    return MinServedEventsBasedValidity(n)


def parse_phase_in(value: Any, path: str) -> PhaseInPolicy:
    """One PhaseInPolicyShim."""
    name, o = oneof(value, path, ("ImmediatePhaseIn", "LinearTimeBasedPhaseIn"))
    if name == "ImmediatePhaseIn":
        return ImmediatePhaseIn()
    secs = o.int("phase_in_over_secs")
    if secs < 0:
        raise InvalidInput(f"{o.path}.phase_in_over_secs: must be >= 0")
    return LinearTimeBasedPhaseIn(secs)


def parse_policy(o: Obj) -> PolicySettings:
    """PolicySettings: validityPolicy (list) and phaseInPolicy (required)."""
    rules = tuple(parse_validity(v, f"{o.sub('validityPolicy')}[{i}]") for i, v in enumerate(o.list("validityPolicy")))
    if not o.has("phaseInPolicy"):
        raise InvalidInput(f"{o.sub('phaseInPolicy')}: required")
    return PolicySettings(rules, parse_phase_in(o.raw("phaseInPolicy"), o.sub("phaseInPolicy")))


def parse_logging(o: Obj) -> LoggingSettings:
    """LoggingSettings; logging (FULL/SAMPLE) needs at least one key feature, as ForestFlow required."""
    level_name = o.str("logLevel", required=False, default="NONE")
    try:
        level = LogLevel[level_name]
    except KeyError:
        raise InvalidInput(f"{o.sub('logLevel')}: expected NONE, FULL or SAMPLE, got {level_name!r}") from None
    keys = o.list("keyFeatures")
    if not all(isinstance(k, str) for k in keys):
        raise InvalidInput(f"{o.sub('keyFeatures')}: expected an array of strings")
    separator = o.str("keyFeaturesSeparator", required=False, default=".")
    if level is not LogLevel.NONE and not keys:
        raise InvalidInput(f"{o.sub('keyFeatures')}: logLevel {level.name} needs at least one key feature")
    return LoggingSettings(level, tuple(keys), separator)


def parse_servable_settings(o: Obj) -> ServableSettings:
    """ServableSettings: policySettings and loggingSettings are both required (ForestFlow rule)."""
    policy = o.obj("policySettings")
    logging = o.obj("loggingSettings")
    assert policy is not None and logging is not None
    strict = o.raw("strictInputs")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidInput(f"{o.sub('strictInputs')}: expected true or false")
    return ServableSettings(parse_policy(policy), parse_logging(logging), bool(strict))


def validity_to_json(rule: ValidityRule) -> dict[str, Any]:
    """One ValidityRuleShim as JSON."""
    match rule:
        case TimeBasedValidity(valid_after_ms=ms):
            return {"TimeBasedValidity": {"validAfterMS": str(ms)}}
        case PerformanceBasedValidity(min_threshold=t, metric_name=m):
            body: dict[str, Any] = {"minThreshold": t}
            if m:
                body["metricName"] = m
            return {"PerformanceBasedValidity": body}
        case MinServedEventsBasedValidity(valid_after_min_served_events=n):
            return {"MinServedEventsBasedValidity": {"validAfterMinServedEvents": str(n)}}
        case MaxErrorRateValidity(max_error_rate=rate, min_events=n):
            return {"MaxErrorRateValidity": {"maxErrorRate": rate, "minEvents": str(n)}}
    return {type(rule).__name__: {}}


def phase_in_to_json(policy: PhaseInPolicy) -> dict[str, Any]:
    """One PhaseInPolicyShim as JSON."""
    if isinstance(policy, LinearTimeBasedPhaseIn):
        return {"LinearTimeBasedPhaseIn": {"phaseInOverSecs": policy.phase_in_over_secs}}
    return {"ImmediatePhaseIn": {}}


def policy_to_json(policy: PolicySettings) -> dict[str, Any]:
    """PolicySettings as JSON."""
    return {
        "validityPolicy": [validity_to_json(r) for r in policy.validity],
        "phaseInPolicy": phase_in_to_json(policy.phase_in),
    }


def logging_to_json(logging: LoggingSettings) -> dict[str, Any]:
    """LoggingSettings as JSON."""
    return {
        "logLevel": logging.log_level.name,
        "keyFeatures": list(logging.key_features),
        "keyFeaturesSeparator": logging.key_features_separator,
    }


def servable_settings_to_json(settings: ServableSettings) -> dict[str, Any]:
    """ServableSettings as JSON (``strictInputs`` only when set, as proto2 leaves unset fields out)."""
    out: dict[str, Any] = {
        "policySettings": policy_to_json(settings.policy),
        "loggingSettings": logging_to_json(settings.logging),
    }
    if settings.strict_inputs:
        out["strictInputs"] = True
    return out


# ---- contract settings ----------------------------------------------------------------------------
def parse_expiration(value: Any, path: str) -> ExpirationPolicy:
    """One ExpirationPolicyShim."""
    name, o = oneof(value, path, ("KeepLatest", "KeepTopRanked"))
    keep = o.int("servablesToKeep")
    if keep < 1:
        raise InvalidInput(f"{o.sub('servablesToKeep')}: must be >= 1")
    if name == "KeepLatest":
        return KeepLatest(keep)
    ordering_name = o.str("ordering", required=False, default="DESC")
    if ordering_name not in ("ASC", "DESC"):
        raise InvalidInput(f"{o.sub('ordering')}: expected ASC or DESC")
    return KeepTopRanked(keep, o.str("metricToEvaluate"), Ordering[ordering_name])


#: The fields each router's settings may have (anything else is a typo, refused).
_ROUTER_FIELDS: dict[RouterType, tuple[str, ...]] = {
    RouterType.FAIR: (),
    RouterType.LATEST: (),
    RouterType.STICKY: ("key", "over"),
    RouterType.THOMPSON: ("rewards", "minShare", "priorAlpha", "priorBeta"),
    RouterType.EPSILON_GREEDY: ("epsilon", "minShare", "rewards"),
}
#: Longest sticky key name.
MAX_STICKY_KEY = 256


def parse_router(value: Any, path: str) -> tuple[RouterType, RouterParams | None]:
    """One RouterTypeShim: the router and its settings (None for Fair and Latest)."""
    name, o = oneof(value, path, tuple(r.value for r in RouterType))
    router = RouterType(name)
    allowed = _ROUTER_FIELDS[router]
    for field_name in o.data:
        if field_name not in allowed and camel(field_name) not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise InvalidInput(f"{o.sub(field_name)}: unknown field (the {name} settings are: {known})")
    if router is RouterType.STICKY:
        key = o.str("key")
        if not key or len(key) > MAX_STICKY_KEY:
            raise InvalidInput(f"{o.sub('key')}: a configs name of 1 to {MAX_STICKY_KEY} characters is required")
        over = o.str("over", required=False, default=RouterType.FAIR.value)
        if over not in (RouterType.FAIR.value, RouterType.LATEST.value):
            raise InvalidInput(f"{o.sub('over')}: expected {RouterType.FAIR.value} or {RouterType.LATEST.value}")
        return router, StickyParams(key, RouterType(over))
    if not router.is_bandit:
        return router, None
    defaults = BanditParams()
    rewards_name = o.str("rewards", required=False, default=defaults.rewards.value)
    if rewards_name not in {k.value for k in RewardKind}:
        raise InvalidInput(f"{o.sub('rewards')}: expected bernoulli or gaussian, got {rewards_name!r}")
    epsilon = o.float("epsilon", required=False, default=defaults.epsilon)
    if not 0.0 <= epsilon <= 1.0:
        raise InvalidInput(f"{o.sub('epsilon')}: must be between 0 and 1, got {epsilon}")
    min_share = o.float("minShare", required=False, default=defaults.min_share)
    if not 0.0 <= min_share <= 0.5:
        raise InvalidInput(f"{o.sub('minShare')}: must be between 0 and 0.5, got {min_share}")
    alpha = o.float("priorAlpha", required=False, default=defaults.prior_alpha)
    beta = o.float("priorBeta", required=False, default=defaults.prior_beta)
    for field_name, prior in (("priorAlpha", alpha), ("priorBeta", beta)):
        if not 0.0 < prior < 1e9:
            raise InvalidInput(f"{o.sub(field_name)}: must be a positive number, got {prior}")
    return router, BanditParams(RewardKind(rewards_name), epsilon, min_share, alpha, beta)


def router_to_json(settings: ContractSettings) -> dict[str, Any]:
    """The router of ContractSettings as a single-key object, with its settings."""
    params = settings.router_params
    body: dict[str, Any] = {}
    if isinstance(params, StickyParams):
        body = {"key": params.key, "over": params.over.value}
    elif isinstance(params, BanditParams) and settings.router is RouterType.THOMPSON:
        body = {
            "rewards": params.rewards.value,
            "minShare": params.min_share,
            "priorAlpha": params.prior_alpha,
            "priorBeta": params.prior_beta,
        }
    elif isinstance(params, BanditParams):
        body = {"epsilon": params.epsilon, "minShare": params.min_share, "rewards": params.rewards.value}
    return {settings.router.value: body}


def parse_contract_settings(o: Obj) -> ContractSettings:
    """ContractSettings: expirationPolicy and router, both required; allowPinnedReleases optional."""
    if not o.has("expirationPolicy"):
        raise InvalidInput(f"{o.sub('expirationPolicy')}: required")
    if not o.has("router"):
        raise InvalidInput(f"{o.sub('router')}: required")
    expiration = parse_expiration(o.raw("expirationPolicy"), o.sub("expirationPolicy"))
    router, params = parse_router(o.raw("router"), o.sub("router"))
    pinned = o.raw("allowPinnedReleases")
    if pinned is not None and not isinstance(pinned, bool):
        raise InvalidInput(f"{o.sub('allowPinnedReleases')}: expected true or false, got {pinned!r}")
    return ContractSettings(expiration, router, params, bool(pinned))


def contract_settings_to_json(settings: ContractSettings) -> dict[str, Any]:
    """ContractSettings as JSON."""
    exp = settings.expiration
    if isinstance(exp, KeepTopRanked):
        expiration: dict[str, Any] = {
            "KeepTopRanked": {
                "servablesToKeep": exp.servables_to_keep,
                "metricToEvaluate": exp.metric_to_evaluate,
                "ordering": exp.ordering.name,
            }
        }
    else:
        expiration = {"KeepLatest": {"servablesToKeep": exp.servables_to_keep}}
    out: dict[str, Any] = {"expirationPolicy": expiration, "router": router_to_json(settings)}
    if settings.allow_pinned_releases:
        out["allowPinnedReleases"] = True
    return out


# ---- serve requests -------------------------------------------------------------------------------
def parse_serve_request(body: Any, url_fqrv: FQRV | None = None) -> ServableDefinition:
    """A BasicServeRequest, or an MLFlowServeRequest (no ``flavor``: ``path`` names an MLflow model).

    ForestFlow tried the two in that order; a body without ``flavor`` can only be the second.
    The FQRV comes from the body, the URL, or a Git path (``...org/project.git#v<N>.<release>``).
    """
    o = Obj(body, "")
    mlflow = not o.has("flavor")
    flavor_raw = o.raw("flavor")
    flavor_name = next(iter(flavor_raw), None) if isinstance(flavor_raw, dict) else None
    # A model served by another server has no artifact: its path is optional (and unused).
    path = o.str("path", required=flavor_name not in NO_ARTIFACT_FLAVORS, default="")
    if o.has("fqrv"):
        fqrv_obj = o.obj("fqrv")
        assert fqrv_obj is not None
        fqrv = parse_fqrv(fqrv_obj)
        if url_fqrv is not None and url_fqrv != fqrv:
            raise InvalidInput(f"fqrv: {fqrv} in the body disagrees with {url_fqrv} in the URL")
    elif url_fqrv is not None:
        fqrv = url_fqrv
    else:
        extracted = fqrv_from_path(path)
        if extracted is None:
            raise InvalidInput(
                "fqrv: required (or POST to /servable/{org}/{project}/{n}/{release}, or a Git path "
                "ending in org/project.git#v<N>.<release>)"
            )
        fqrv = extracted
    if mlflow:
        flavor, flavor_settings = MLFLOW, {}
    else:
        flavor, flavor_obj = oneof(o.raw("flavor"), "flavor", FLAVORS)
        flavor_settings = dict(flavor_obj.data)
    sha256 = o.str("sha256", required=False, default="")
    if sha256 and not _SHA256.match(sha256):
        raise InvalidInput(f"sha256: expected 64 hex digits, got {sha256!r}")
    settings_obj = o.obj("servableSettings")
    assert settings_obj is not None
    contract_obj = o.obj("contractSettings", required=False)
    return ServableDefinition(
        fqrv=fqrv,
        path=path,
        flavor=flavor,
        flavor_settings=flavor_settings,
        settings=parse_servable_settings(settings_obj),
        contract_settings=parse_contract_settings(contract_obj) if contract_obj else None,
        tags=o.str_map("tags"),
        created_at_ms=o.int("createdAtMS", required=False),
        sha256=sha256.lower(),
        explainer=parse_explainer(o.raw("explainer")) if o.has("explainer") else None,
    )


def parse_explainer(value: Any) -> dict[str, Any]:
    """``{"KernelShap": {"background": "file.csv" or [rows], "samples": n}}``, checked for shape here
    (the file and the sizes are checked when the release loads)."""
    _, body = oneof(value, "explainer", ("KernelShap",))
    background = body.raw("background")
    if not (isinstance(background, str) and background.strip()) and not (
        isinstance(background, list) and background and all(isinstance(r, dict) for r in background)
    ):
        raise InvalidInput("explainer.KernelShap.background: a CSV file in the servable directory, or a list of records")
    samples = body.int("samples", required=False, default=200)
    if samples < 1:
        raise InvalidInput(f"explainer.KernelShap.samples: must be positive, got {samples}")
    return {"KernelShap": {"background": background, "samples": samples}}


def serve_request_to_json(defn: ServableDefinition) -> dict[str, Any]:
    """A definition back to its serve request JSON (plus createdAtMS, used for persistence).

    An MLflow definition is written as an MLFlowServeRequest (no ``flavor``)."""
    out: dict[str, Any] = {
        "path": defn.path,
        "fqrv": fqrv_to_json(defn.fqrv),
        "servableSettings": servable_settings_to_json(defn.settings),
        "tags": dict(defn.tags),
        "createdAtMS": str(defn.created_at_ms),
    }
    if defn.flavor != MLFLOW:
        out["flavor"] = {defn.flavor: dict(defn.flavor_settings)}
    if defn.sha256:
        out["sha256"] = defn.sha256
    if defn.explainer is not None:
        out["explainer"] = defn.explainer
    if defn.contract_settings is not None:
        out["contractSettings"] = contract_settings_to_json(defn.contract_settings)
    return out


def metrics_to_json(fqrv: FQRV, m: ServableMetrics) -> dict[str, Any]:
    """ServableMetrics as JSON (int64 as strings; unset stamps left out)."""
    out: dict[str, Any] = {
        "fqrv": fqrv_to_json(fqrv),
        "scoreCount": str(m.score_count),
        "shadeCount": str(m.shade_count),
        "errorCount": str(m.error_count),
        "shadeErrorCount": str(m.shade_error_count),
        "createdAtMS": str(m.created_at_ms),
        "currentPhaseInPct": m.current_phase_in_pct,
        "performanceMetrics": m.performance_view(),
    }
    if m.became_valid_at_ms is not None:
        out["becameValidAtMS"] = str(m.became_valid_at_ms)
    if m.feedback_count:
        out["feedbackCount"] = str(m.feedback_count)
        out["rewardSum"] = m.reward_sum
        out["rewardMean"] = m.reward_sum / m.feedback_count
    return out
