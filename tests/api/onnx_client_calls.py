"""tritonclient's gRPC client against ONNX servables; prints what it saw as JSON.

Run by tests/api/test_onnx_api.py in the client venv (tests/api/v2_support.py explains why):

    python onnx_client_calls.py < job.json > result.json

The job: ``{"grpc": "host:port", "models": [{"model", "requests": {label: [{name, datatype, values}]}}]}``;
values may be nested (2-D tensors). Every answer is recorded, errors included.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

DTYPES = {"FP64": np.float64, "FP32": np.float32, "INT64": np.int64, "BYTES": object}


def main() -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    job = json.load(sys.stdin)
    client = grpcclient.InferenceServerClient(job["grpc"])
    seen: dict[str, Any] = {}
    for entry in job["models"]:
        model = entry["model"]
        result: dict[str, Any] = {"metadata": client.get_model_metadata(model, as_json=True)}
        for label, tensors in entry["requests"].items():
            inputs = []
            for t in tensors:
                arr = np.array(t["values"], dtype=DTYPES[t["datatype"]])
                tensor = grpcclient.InferInput(t["name"], list(arr.shape), t["datatype"])
                tensor.set_data_from_numpy(arr)
                inputs.append(tensor)
            try:
                answer = client.infer(model, inputs)
            except InferenceServerException as exc:
                result[label] = {"status": str(exc.status()), "message": exc.message()}
                continue
            names = [o["name"] for o in answer.get_response(as_json=True)["outputs"]]
            outputs = {}
            for name in names:
                flat = answer.as_numpy(name)
                outputs[name] = {
                    "shape": list(flat.shape),
                    "values": [v.decode() if isinstance(v, bytes) else v for v in flat.reshape(-1).tolist()],
                }
            result[label] = outputs
        seen[model] = result
    json.dump(seen, sys.stdout, default=str)


if __name__ == "__main__":
    main()
