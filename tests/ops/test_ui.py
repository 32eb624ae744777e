"""/ui in a real headless chromium (Debian's, through selenium): loads clean, shows contracts, follows a phase-in."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from tests.support import GatewayProcess, python_servable, score_body


def chromium() -> webdriver.Chrome:
    """Headless chromium with a fresh profile, no network chatter of its own."""
    binary = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options, Service(executable_path=driver_path)


# The page redraws every second: read it in one script call, never through elements kept between calls.
def shares(driver: webdriver.Chrome, contract: str) -> dict[str, float]:
    """The traffic share the chart drew last, per fqrv."""
    raw = driver.execute_script(
        f"const c = document.querySelector('canvas.share[data-contract=\"{contract}\"]'); return c ? c.dataset.lastShares : null;"
    )
    return json.loads(raw or "{}")


def chart_points(driver: webdriver.Chrome, contract: str) -> int:
    return int(
        driver.execute_script(f"return document.querySelector('canvas.share[data-contract=\"{contract}\"]').dataset.points;")
    )


def text_of(driver: webdriver.Chrome, selector: str) -> str:
    """innerText of the first element matching ``selector`` ('' when there is none yet)."""
    return str(driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", selector))


@pytest.mark.slow
def test_ui_shows_contracts_and_its_chart_follows_a_phase_in(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    gw = gateway_process(tmp_path / "data").start()
    contract = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    first = python_servable(release="v1", log_level="FULL", contract_settings=contract)
    assert requests.post(gw.url + "/servable", json=first, timeout=60).status_code == 200
    stop = threading.Event()

    def traffic() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0]), timeout=10)
                time.sleep(0.02)

    sender = threading.Thread(target=traffic)
    sender.start()
    options, service = chromium()
    (tmp_path / "profile").mkdir()
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(gw.url + "/ui")
        wait = WebDriverWait(driver, 20, poll_frequency=0.1)
        section = 'section.contract[data-contract="acme.demo.1"]'
        wait.until(lambda d: text_of(d, section))
        text = text_of(driver, section)
        assert "acme.demo.1" in text and "v1" in text and "valid" in text and "100%" in text
        wait.until(lambda d: shares(d, "acme.demo.1").get("acme.demo.1.v1") == 1)

        # phase in a second release over a few seconds: the traffic share chart moves towards it
        second = python_servable(release="v2", phase_in={"LinearTimeBasedPhaseIn": {"phaseInOverSecs": 3}})
        assert requests.post(gw.url + "/servable", json=second, timeout=60).status_code == 200
        wait.until(lambda d: shares(d, "acme.demo.1").get("acme.demo.1.v2", 0) >= 0.4)
        assert "v2" in text_of(driver, section)
        # the contract's router and expiration, and what phase-in % and routing share mean under it
        assert "router FairPhaseInPctBasedRouter, expiration KeepLatest 2" in text_of(driver, section + " .policy")
        assert "two releases at 100% split the traffic evenly" in text_of(driver, section + " .meaning")
        assert text_of(driver, "#status") == "ready"
        requests.post(gw.url + "/nobody/here/1/score", json={}, timeout=10)
        wait.until(lambda d: "/nobody/here/1/score" in text_of(d, "#errors"))
        errors = text_of(driver, "#errors")
        assert "UnknownContract" in errors and "nobody" in errors.split("UnknownContract", 1)[1]  # code and message
        log_box = text_of(driver, "#log")
        assert "produced" in log_box and "delivery\nok" in log_box
        assert chart_points(driver, "acme.demo.1") >= 2
        driver.save_screenshot(str(tmp_path / "ui.png"))
        assert (tmp_path / "ui.png").stat().st_size > 10_000
        problems = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert problems == []
    finally:
        driver.quit()
        stop.set()
        sender.join(10)
