"""/ui shows a RemoteV2 release's backend: up, then down with its circuit open when the backend stops."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.ops.test_ui import chromium, text_of
from tests.remote.support import remote_servable
from tests.support import GatewayProcess, python_servable, score_body


@pytest.mark.slow
def test_ui_shows_the_backend_up_then_down(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    backend = gateway_process(tmp_path / "backend").start()
    assert requests.post(backend.url + "/servable", json=python_servable(), timeout=60).status_code == 200
    front = gateway_process(tmp_path / "front").start()
    body = remote_servable(backend.url, failureThreshold=1, cooldownMs=60_000)
    assert requests.post(front.url + "/servable", json=body, timeout=60).status_code == 200
    assert requests.post(front.url + "/acme/front/1/score", json=score_body([1.0]), timeout=10).status_code == 200
    options, service = chromium()
    (tmp_path / "profile").mkdir()
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(front.url + "/ui")
        wait = WebDriverWait(driver, 20, poll_frequency=0.1)
        pill = 'section.contract[data-contract="acme.front.1"] .pill.backend'
        wait.until(lambda d: text_of(d, pill) == "backend up")
        backend.stop()
        assert requests.post(front.url + "/acme/front/1/score", json=score_body([1.0]), timeout=10).status_code == 503
        wait.until(lambda d: text_of(d, pill) == "backend down, circuit open")
        title = driver.execute_script("return document.querySelector(arguments[0]).title;", pill)
        assert backend.url in title and "cannot connect" in title
        assert text_of(driver, "#status") == "ready"  # the gateway itself stays ready
        driver.save_screenshot(str(tmp_path / "ui.png"))
        problems = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert problems == []
    finally:
        driver.quit()
