"""Takes docs/ui.png: a gateway phasing a second release in under steady traffic, seen through /ui.

.venv/bin/python scripts/ui_screenshot.py [out.png]     # about a minute
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from selenium import webdriver

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ops.test_ui import chromium  # noqa: E402
from tests.support import GatewayProcess, python_servable, score_body  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "ui.png"
    work = Path(tempfile.mkdtemp(prefix="ff-ui-"))
    gw = GatewayProcess(work / "data").start()
    stop = threading.Event()

    def traffic() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.post(gw.url + "/acme/fraud/1/score", json=score_body([1.0]), timeout=10)
                session.post(gw.url + "/acme/churn/1/score", json=score_body([2.0]), timeout=10)
                time.sleep(0.01)

    contract = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    for project in ("churn", "fraud"):
        body = python_servable(("acme", project, 1), "2026-10", log_level="FULL", contract_settings=contract)
        requests.post(gw.url + "/servable", json=body, timeout=60).raise_for_status()
    sender = threading.Thread(target=traffic)
    sender.start()
    options, service = chromium()
    options.add_argument(f"--user-data-dir={work / 'profile'}")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(gw.url + "/ui")
        time.sleep(20)
        second = python_servable(
            ("acme", "fraud", 1), "2026-11", log_level="SAMPLE", phase_in={"LinearTimeBasedPhaseIn": {"phaseInOverSecs": 30}}
        )
        requests.post(gw.url + "/servable", json=second, timeout=60).raise_for_status()
        requests.post(gw.url + "/acme/fraud/1/score", json={"schema": []}, timeout=10)
        time.sleep(40)
        driver.set_window_size(1200, 1300)
        time.sleep(1.5)
        driver.save_screenshot(str(out))
        print(f"wrote {out}")
    finally:
        driver.quit()
        stop.set()
        sender.join(10)
        gw.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
