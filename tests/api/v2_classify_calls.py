"""Runs tritonclient (HTTP and gRPC) with ``class_count`` against a gateway; prints what it saw as JSON.

Executed in the client venv (see tests/api/v2_support.py). The job: ``{"http", "grpc", "calls":
[{"model", "columns": [{name, datatype, values}], "output", "k"}]}``; errors are recorded, not raised.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np


def call(mod: Any, client: Any, family: str, spec: dict[str, Any]) -> dict[str, Any]:
    inputs = []
    for col in spec["columns"]:
        if col["datatype"] == "BYTES":
            arr = np.array([str(v) for v in col["values"]], dtype=object)
        else:
            arr = np.array(col["values"], dtype=np.float64)
        t = mod.InferInput(col["name"], list(arr.shape), col["datatype"])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    wanted = [mod.InferRequestedOutput(spec["output"], class_count=spec["k"])]
    try:
        result = client.infer(spec["model"], inputs, outputs=wanted)
    except Exception as exc:  # recorded for the test to judge
        return {"error": str(exc)}
    arr = result.as_numpy(spec["output"])
    return {"shape": list(arr.shape), "values": [v.decode() if isinstance(v, bytes) else v for v in arr.reshape(-1).tolist()]}


def main() -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    job = json.load(sys.stdin)
    out: dict[str, Any] = {}
    for family, mod in (("http", httpclient), ("grpc", grpcclient)):
        client = mod.InferenceServerClient(job[family])
        out[family] = [call(mod, client, family, spec) for spec in job["calls"]]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
