"""Runs the real KServe V2/V1 clients against a gateway and prints what they saw, as JSON.

Executed by the tests in a separate interpreter (the client venv: tritonclient and kserve pin
protobuf<7, the gateway needs >=7.35), one process per client family because tritonclient.grpc
and kserve cannot share a process (both register ``inference.*`` protobuf names).

    python v2_client_calls.py triton|kserve|kserve_v1  < job.json  > result.json

The job: ``{"http": "host:port", "grpc": "host:port", "repo": path, "model", "version",
"columns": [{name, datatype, values}], "outputs": [names], "bad_input": name}``; kserve_v1 takes
``{"http": "host:port", "calls": [{"model", "body"}]}`` and sends each body as it is. Every answer is recorded,
errors included, so that the test (not this script) decides what is right.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np

UNKNOWN = "no.such.1"


def arrays(job: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """The job's columns as (name, datatype, numpy array) with numpy types the clients accept."""
    out = []
    for col in job["columns"]:
        dt = col["datatype"]
        if dt == "BYTES":
            arr = np.array([str(v) for v in col["values"]], dtype=object)
        else:
            arr = np.array(col["values"], dtype={"FP64": np.float64, "FP32": np.float32, "INT64": np.int64}[dt])
        out.append((col["name"], dt, arr))
    return out


def plain(arr: np.ndarray) -> dict[str, Any]:
    """An output array as JSON: its shape, values (bytes decoded) and whether BYTES came as bytes."""
    flat = arr.reshape(-1).tolist()
    as_bytes = any(isinstance(v, bytes) for v in flat)
    values = [v.decode() if isinstance(v, bytes) else v for v in flat]
    return {"shape": list(arr.shape), "values": values, "bytes": as_bytes}


def bad_array(job: dict[str, Any]) -> tuple[str, np.ndarray]:
    """A two-values-per-row tensor for an input that takes one value per row."""
    n = len(job["columns"][0]["values"])
    return job["bad_input"], np.ones((n, 2), dtype=np.float64)


def private_pool(repo: str, request_class: Any) -> dict[str, Any]:
    """Load the gateway's message classes next to a client's own ``inference.*`` ones and cross-parse."""
    sys.path.insert(0, repo)
    from forestflow._proto.grpc_predict_v2 import messages

    ours = messages()["ModelInferRequest"](model_name="m", id="i")
    tensor = ours.inputs.add(name="a", datatype="FP64", shape=[2, 1])
    tensor.parameters["k"].int64_param = 3
    ours.raw_input_contents.append(bytes(16))
    theirs = request_class.FromString(ours.SerializeToString())
    back = messages()["ModelInferRequest"].FromString(theirs.SerializeToString())
    return {
        "round_trip": back == ours,
        "name": theirs.inputs[0].name,
        "shape": list(theirs.inputs[0].shape),
        "param": theirs.inputs[0].parameters["k"].int64_param,
    }


# ---- tritonclient --------------------------------------------------------------------------------
def triton(job: dict[str, Any]) -> dict[str, Any]:
    """tritonclient over HTTP then gRPC (one process: both are tritonclient)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.grpc import service_pb2

    res: dict[str, Any] = {"private_pool": private_pool(job["repo"], service_pb2.ModelInferRequest)}
    res["http"] = triton_family(job, "http", httpclient)
    res["grpc"] = triton_family(job, "grpc", grpcclient)
    return res


def triton_family(job: dict[str, Any], family: str, mod: Any) -> dict[str, Any]:
    """Every call of one tritonclient module, errors recorded as (status, message)."""
    from tritonclient.utils import InferenceServerException

    model, version = job["model"], job["version"]
    as_json = {"as_json": True} if family == "grpc" else {}
    c = mod.InferenceServerClient(job[family])
    r: dict[str, Any] = {}

    def error(call: Any, *args: Any) -> dict[str, Any]:
        try:
            call(*args)
        except InferenceServerException as exc:
            return {"status": str(exc.status()), "message": exc.message()}
        return {"status": "no error"}

    def inputs(binary: bool) -> list[Any]:
        out = []
        for name, dt, arr in arrays(job):
            t = mod.InferInput(name, list(arr.shape), dt)
            t.set_data_from_numpy(arr, **({"binary_data": binary} if family == "http" else {}))
            out.append(t)
        return out

    def outputs_of(result: Any) -> dict[str, Any]:
        response = result.get_response(**as_json)
        names = [o["name"] for o in response["outputs"]]
        return {
            "id": response.get("id"),
            "model_version": response.get("model_version"),
            "outputs": {n: plain(result.as_numpy(n)) for n in names},
        }

    r["live"], r["ready"] = c.is_server_live(), c.is_server_ready()
    r["model_ready"] = c.is_model_ready(model)
    r["version_ready"] = c.is_model_ready(model, version)
    r["unknown_ready"] = c.is_model_ready(UNKNOWN)
    r["server_metadata"] = c.get_server_metadata(**as_json)
    r["model_metadata"] = c.get_model_metadata(model, **as_json)
    r["infer"] = outputs_of(c.infer(model, inputs(True), request_id="req-1"))
    r["infer_version"] = outputs_of(c.infer(model, inputs(True), model_version=version))
    first = job["outputs"][0]
    if family == "http":
        json_out = [mod.InferRequestedOutput(first, binary_data=False)]
        r["infer_json"] = outputs_of(c.infer(model, inputs(False), outputs=json_out))
        r["infer_gzip"] = outputs_of(
            c.infer(model, inputs(True), request_compression_algorithm="gzip", response_compression_algorithm="gzip")
        )
    else:
        r["infer_subset"] = outputs_of(c.infer(model, inputs(True), outputs=[mod.InferRequestedOutput(first)]))
    r["unknown_model"] = error(c.infer, UNKNOWN, inputs(True))
    name, bad = bad_array(job)
    bad_input = mod.InferInput(name, list(bad.shape), "FP64")
    bad_input.set_data_from_numpy(bad)
    r["bad_shape"] = error(c.infer, model, [bad_input, *(t for t in inputs(True) if t.name() != name)])
    r["after_errors"] = outputs_of(c.infer(model, inputs(True)))
    return r


# ---- kserve --------------------------------------------------------------------------------------
async def kserve(job: dict[str, Any]) -> dict[str, Any]:
    import grpc
    import httpx
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
    from kserve.protocol.grpc import grpc_predict_v2_pb2

    model = job["model"]
    base = f"http://{job['http']}"
    res: dict[str, Any] = {"private_pool": private_pool(job["repo"], grpc_predict_v2_pb2.ModelInferRequest)}

    def request(binary: bool, name: str = model, swap: tuple[str, np.ndarray] | None = None) -> InferRequest:
        inputs = []
        for col, dt, arr in arrays(job):
            if swap and col == swap[0]:
                arr, dt = swap[1], "FP64"
            t = InferInput(col, list(arr.shape), dt)
            t.set_data_from_numpy(arr, binary_data=binary)
            inputs.append(t)
        return InferRequest(model_name=name, infer_inputs=inputs, request_id="req-k")

    def outputs_of(response: Any) -> dict[str, Any]:
        return {
            "id": response.id,
            "model_name": response.model_name,
            "outputs": {o.name: plain(o.as_numpy()) for o in response.outputs},
        }

    async def error(call: Any) -> dict[str, Any]:
        try:
            await call
        except httpx.HTTPStatusError as exc:
            return {"status": exc.response.status_code, "message": str(exc)}
        except grpc.aio.AioRpcError as exc:
            return {"status": str(exc.code()), "message": exc.details()}
        return {"status": "no error"}

    v2 = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    r = res["rest_v2"] = {}
    r["live"], r["ready"] = await v2.is_server_live(base), await v2.is_server_ready(base)
    r["model_ready"] = await v2.is_model_ready(base, model)
    r["infer_json"] = outputs_of(await v2.infer(base, request(False), model_name=model))
    r["infer_binary"] = outputs_of(await v2.infer(base, request(True), model_name=model))
    r["unknown_model"] = await error(v2.infer(base, request(False, UNKNOWN), model_name=UNKNOWN))
    r["bad_shape"] = await error(v2.infer(base, request(False, swap=bad_array(job)), model_name=model))
    r["after_errors"] = outputs_of(await v2.infer(base, request(False), model_name=model))
    await v2.close()

    v1 = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    r = res["rest_v1"] = {}
    r["live"] = await v1.is_server_live(base)
    r["model_ready"] = await v1.is_model_ready(base, model)
    names = [c["name"] for c in job["columns"]]
    rows = [dict(zip(names, values)) for values in zip(*(c["values"] for c in job["columns"]))]
    r["predict_objects"] = await v1.infer(base, {"instances": rows}, model_name=model)
    r["predict_lists"] = await v1.infer(base, {"instances": [list(row.values()) for row in rows]}, model_name=model)
    r["unknown_model"] = await error(v1.infer(base, {"instances": rows}, model_name=UNKNOWN))
    await v1.close()

    g = InferenceGRPCClient(job["grpc"], retries=2)
    r = res["grpc"] = {}
    r["live"], r["ready"] = await g.is_server_live(), await g.is_server_ready()
    r["model_ready"] = await g.is_model_ready(model)
    r["infer"] = outputs_of(await g.infer(request(True)))
    r["unknown_model"] = await error(g.infer(request(True, UNKNOWN)))
    r["bad_shape"] = await error(g.infer(request(True, swap=bad_array(job))))
    r["after_errors"] = outputs_of(await g.infer(request(True)))
    await g.close()
    return res


# ---- kserve V1 only: arbitrary predict bodies ---------------------------------------------------
async def kserve_v1(job: dict[str, Any]) -> dict[str, Any]:
    """``InferenceRESTClient(protocol="v1").infer`` with each job body; answers or (status, error body)."""
    import httpx
    from kserve import InferenceRESTClient, RESTConfig

    base = f"http://{job['http']}"
    client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    seen = []
    for call in job["calls"]:
        try:
            seen.append({"status": 200, "body": await client.infer(base, call["body"], model_name=call["model"])})
        except httpx.HTTPStatusError as exc:
            seen.append({"status": exc.response.status_code, "body": exc.response.json()})
    await client.close()
    return {"results": seen}


def main() -> None:
    family = sys.argv[1]
    job = json.load(sys.stdin)
    if family == "triton":
        result = triton(job)
    else:
        result = asyncio.run(kserve_v1(job) if family == "kserve_v1" else kserve(job))
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
