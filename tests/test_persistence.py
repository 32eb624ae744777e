"""A second gateway process on the same data dir serves the same contracts, settings and counters."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.support import GatewayProcess, python_servable, score_body


def test_restart_restores_contracts_settings_counters(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    data = tmp_path / "data"
    first = gateway_process(data).start()
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    for body in (python_servable(contract_settings=keep_two), python_servable(release="v2")):
        r = requests.post(first.url + "/servable", json=body, timeout=30)
        assert r.status_code == 200, r.text
    logging = {"logLevel": "FULL", "keyFeatures": ["reqid", "user"], "keyFeaturesSeparator": "|"}
    assert requests.put(first.url + "/acme/demo/1/v2/logging", json=logging, timeout=10).status_code == 200
    answered = [requests.post(first.url + "/acme/demo/1/score", json=score_body([1.0]), timeout=10).json() for _ in range(7)]
    before = requests.get(first.url + "/acme/demo/1/stats", timeout=10).json()
    assert first.stop() == 0

    second = gateway_process(data).start()
    assert requests.get(second.url + "/health/ready", timeout=10).json()["ready"] is True
    assert requests.get(second.url + "/contracts/list", timeout=10).json() == {
        "Contracts": {"contracts": [{"organization": "acme", "project": "demo", "contractNumber": 1}]}
    }
    # Counters are persisted; the observed sliding windows (errorRate, p99LatencyMs) start afresh.
    for item in before:
        item["ServableMetrics"]["performanceMetrics"] = {}
    assert requests.get(second.url + "/acme/demo/1/stats", timeout=10).json() == before
    settings = requests.get(second.url + "/acme/demo/1/v2/settings", timeout=10).json()
    assert settings["ServableSettings"]["loggingSettings"] == logging
    assert requests.get(second.url + "/acme/demo/1/c-settings", timeout=10).json() == {"ContractSettings": keep_two}
    # The router continues where it stopped: the next picks follow the same deterministic sequence.
    nxt = requests.post(second.url + "/acme/demo/1/score", json=score_body([4.0]), timeout=10).json()
    assert nxt["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [8.0]
    counts = {
        e["ServableMetrics"]["fqrv"]["releaseVersion"]: int(e["ServableMetrics"]["scoreCount"])
        for e in requests.get(second.url + "/acme/demo/1/stats", timeout=10).json()
    }
    assert sum(counts.values()) == len(answered) + 1
    assert second.stop() == 0
