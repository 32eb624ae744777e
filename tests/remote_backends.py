"""Upstream V2 servers on loopback for RemoteV2 servables: MLServer, run from ./.venv-mlserver.

MLServer pins protobuf, grpcio and fastapi ranges of its own, so it runs from a venv of its own
(``scripts/mlserver_venv.sh``, which ``scripts/test.sh`` calls; made here too when missing). The
iris model it serves is trained by ``servables/mlserver-iris/train.py`` with that venv's
interpreter, so scikit-learn's versions at dump and at load are the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

from tests.support import ROOT, ChildProcess, free_port

MLSERVER_VENV = ROOT / ".venv-mlserver"
MLSERVER_PYTHON = MLSERVER_VENV / "bin" / "python"
TRAIN_IRIS = ROOT / "servables" / "mlserver-iris" / "train.py"
IRIS_TWIN = ROOT / "tests" / "fixtures" / "servables" / "iris_twin" / "model.py"
#: The name and version the iris model has on MLServer (servables/mlserver-iris/model-settings.json).
IRIS_MODEL = "iris"
IRIS_VERSION = "1"
#: Three iris flowers, one of each class (sepal length, sepal width, petal length, petal width).
IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [5.9, 3.0, 4.2, 1.5], [6.9, 3.1, 5.4, 2.1]]


def ensure_mlserver_venv() -> Path:
    """./.venv-mlserver with MLServer installed (instant when already made); its interpreter."""
    subprocess.run(["bash", str(ROOT / "scripts" / "mlserver_venv.sh")], check=True, timeout=900)
    return MLSERVER_PYTHON


def train_iris(models_dir: Path) -> Path:
    """The iris model under ``models_dir/iris`` (model.joblib, model-settings.json, weights.json),
    plus the local twin's module beside it as ``twin.py``; returns the model's directory."""
    target = models_dir / IRIS_MODEL
    subprocess.run([str(ensure_mlserver_venv()), str(TRAIN_IRIS), str(target)], check=True, timeout=300)
    (target / "twin.py").write_text(IRIS_TWIN.read_text())
    return target


def iris_probabilities(model_dir: Path, rows: list[list[float]]) -> np.ndarray:
    """What the model answers for ``rows``, computed here from its weights (softmax of the logits)."""
    weights = json.loads((model_dir / "weights.json").read_text())
    logits = np.asarray(rows, dtype=np.float64) @ np.asarray(weights["coef"]).T + np.asarray(weights["intercept"])
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


class MLServerProcess(ChildProcess):
    """``mlserver start`` on free loopback ports (HTTP and gRPC; no metrics server), in one process
    (``parallel_workers`` 0: inference on MLServer's own event loop, no worker pool). The ports are
    chosen once, so a stopped server started again answers at the same addresses."""

    def __init__(self, models_dir: Path, log_path: Path, cpu: int | None = None) -> None:
        self.models_dir = models_dir
        #: The core it is pinned to (taskset; benchmarks), or None.
        self.cpu = cpu
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def model_dir(self) -> Path:
        """The iris model's directory (with ``weights.json`` and the twin's ``twin.py``)."""
        return self.models_dir / IRIS_MODEL

    @property
    def rest_url(self) -> str:
        """The REST base URL, as a RemoteV2 ``url`` with protocol rest."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the gRPC service, as a RemoteV2 ``url`` with protocol grpc."""
        return f"127.0.0.1:{self.grpc_port}"

    def settings(self) -> dict[str, Any]:
        """The server's settings.json."""
        return {
            "host": "127.0.0.1",
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_endpoint": None,
            "metrics_dir": str(self.models_dir / ".metrics"),
            "parallel_workers": 0,
            "debug": False,
        }

    def start(self, timeout_s: float = 120.0) -> MLServerProcess:
        """Start and return once MLServer says it is ready and the iris model is loaded."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        (self.models_dir / "settings.json").write_text(json.dumps(self.settings()))
        log = open(self.log_path, "ab")
        argv = [str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(self.models_dir)]
        taskset = shutil.which("taskset")
        if self.cpu is not None and taskset and (os.cpu_count() or 1) > 1:
            argv = [taskset, "-c", str(self.cpu), *argv]
        self.proc = subprocess.Popen(
            argv,
            cwd=self.models_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("MLSERVER_")},
            start_new_session=True,  # stopped as a group (ChildProcess)
        )
        deadline = time.monotonic() + timeout_s
        with requests.Session() as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mlserver exited with {self.proc.returncode}: {self.log()}")
                if self._ready(http):
                    return self
                if time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(f"mlserver not ready after {timeout_s}s: {self.log()}")
                time.sleep(0.05)

    def _ready(self, http: requests.Session) -> bool:
        try:
            server = http.get(self.rest_url + "/v2/health/ready", timeout=1)
            model = http.get(f"{self.rest_url}/v2/models/{IRIS_MODEL}/ready", timeout=1)
        except requests.RequestException:
            return False
        return server.status_code == 200 and model.status_code == 200

    def infer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A V2 REST infer straight to MLServer (the reference answer); raises on a non-200."""
        r = requests.post(f"{self.rest_url}/v2/models/{IRIS_MODEL}/versions/{IRIS_VERSION}/infer", json=body, timeout=30)
        r.raise_for_status()
        answer: dict[str, Any] = r.json()
        return answer
