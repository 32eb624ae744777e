"""deploy/k8s: every manifest valid against the Kubernetes schemas, probes and settings match the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from forestflow.api.app import build_app
from forestflow.settings import Settings
from tests.support import ROOT

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"


def resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in resources() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_every_manifest_is_valid_for_kubernetes() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}, "every manifest is in the kustomization"
    kinds = set()
    for doc in resources():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        kinds.add(doc["kind"])
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"} <= kinds


def test_probes_ports_and_settings_match_the_gateway(tmp_path: Path) -> None:
    deployment = by_kind("Deployment", "forestflow")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env: dict[str, str] = {}
    env.update(by_kind("ConfigMap", "forestflow-settings")["data"])
    env.update(by_kind("Secret", "forestflow-secrets")["stringData"])
    assert {ref.get("configMapRef", ref.get("secretRef"))["name"] for ref in container["envFrom"]} == {
        "forestflow-settings",
        "forestflow-secrets",
    }
    assert env["FORESTFLOW_ADMIN_TOKEN"] and env["FORESTFLOW_REDIS_URL"].startswith("redis://")
    settings = Settings.load(environ=env)  # the gateway accepts every value (a non-loopback bind needs the token)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port, "grpc": settings.grpc_port}
    routes = {
        r.resource.canonical
        for r in build_app(Settings.load(environ={}, overrides={"data_dir": tmp_path})).router.routes()
        if r.method == "GET"
    }
    for probe, path in (("livenessProbe", "/health/live"), ("startupProbe", "/health/live"), ("readinessProbe", "/health/ready")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["path"] in routes
        assert ports[get["port"]] == settings.port
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    # the pod is given time to drain: grace, in-flight requests, then the log flush
    assert (
        pod["terminationGracePeriodSeconds"] > settings.drain_grace_s + settings.shutdown_timeout_s + settings.log_flush_timeout_s
    )
    service = by_kind("Service", "forestflow")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http", "grpc"}
    pdb = by_kind("PodDisruptionBudget", "forestflow")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
