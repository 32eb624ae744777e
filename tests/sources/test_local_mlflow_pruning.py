"""file:// roots and size cap, MLflow model directories, and pruning of the artifact cache."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.sources.support import assert_golden, cache_entries, delete, deploy, error_text, fqrv, h2o_request
from tests.support import H2O_DIR, ROOT, python_servable, serve_in_process

# MLflow's MLmodel schema (mlflow.models.Model.to_yaml): artifact_path, flavors (name -> properties),
# model_uuid, run_id, utc_time_created, optional signature; python_function's loader_module/env.
MLMODEL = """artifact_path: model
flavors:
  python_function:
    loader_module: mlflow.h2o
    data: model.h2o
    env:
      conda: conda.yaml
      virtualenv: python_env.yaml
    python_version: 3.11.9
  {h2o_flavor}:
    data: {data}
    h2o_version: 3.46.0.11
model_uuid: 2f0c6b1e8f3a4b52a9a1d2c3e4f5a6b7
run_id: 5d3c0b8e1a2f4c6d8e0f1a2b3c4d5e6f
utc_time_created: '2026-11-23 10:00:00.123456'
"""


def write_mlflow_model(root: Path, flavor: str = "h2o_mojo", mojo: str = "prostate_gbm_binomial.zip") -> Path:
    """An MLflow model directory: MLmodel, and <data>/h2o.yaml naming the MOJO (ForestFlow's h2o_mojo)."""
    root.mkdir(parents=True)
    (root / "MLmodel").write_text(MLMODEL.format(h2o_flavor=flavor, data="model.h2o"))
    (root / "model.h2o").mkdir()
    (root / "model.h2o" / "h2o.yaml").write_text(f"full_file: model.h2o/{mojo}\nmodel_dir: model.h2o\nmodel_file: {mojo}\n")
    shutil.copy(H2O_DIR / mojo, root / "model.h2o" / mojo)
    return root


def mlflow_request(path: str, release: str = "r1") -> dict:
    return {"path": path, "fqrv": fqrv("ml", "prostate", 1, release), "servableSettings": h2o_request("", "")["servableSettings"]}


async def test_mlflow_model_directory_and_mlmodel_file_score_golden(tmp_path: Path) -> None:
    model = write_mlflow_model(tmp_path / "models" / "m1")
    async with serve_in_process(tmp_path / "data", artifact_roots=str(tmp_path / "models")) as gw:
        status, payload = await deploy(gw, mlflow_request((model / "MLmodel").as_uri()))
        assert status == 200, payload
        await assert_golden(gw, "ml/prostate/1", "prostate_gbm_binomial")
        async with gw.session.get(gw.url + "/ml/prostate/1/r1/settings") as r:
            assert r.status == 200
        await delete(gw, "ml/prostate/1", "r1")
        assert cache_entries(gw) == []


async def test_mlflow_model_without_a_supported_flavor_is_422_naming_its_flavors(tmp_path: Path) -> None:
    model = write_mlflow_model(tmp_path / "models" / "m2", flavor="h2o")  # MLflow's own h2o flavor: a binary model
    async with serve_in_process(tmp_path / "data", artifact_roots=str(tmp_path / "models")) as gw:
        status, payload = await deploy(gw, mlflow_request(model.as_uri()))
        assert status == 422, payload
        assert "the model has python_function, h2o; supported: h2o_mojo, xgboost, lightgbm, sklearn, onnx" in error_text(payload)
        assert "loader_module 'mlflow.h2o' needs the mlflow package" in error_text(payload)
        status, payload = await deploy(gw, mlflow_request((tmp_path / "models").as_uri()))
        assert status == 422, payload
        assert "no MLmodel file" in error_text(payload)
        assert cache_entries(gw) == []


async def test_file_paths_outside_the_roots_and_over_the_size_cap_are_422(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(H2O_DIR / "prostate_kmeans.zip", outside / "model.zip")
    # artifact_roots unset: the defaults, the data dir and the working directory (the repository).
    async with serve_in_process(tmp_path / "data", artifact_max_bytes=200_000, artifact_roots="") as gw:
        status, payload = await deploy(gw, h2o_request(outside.as_uri(), "model.zip", fqrv("f", "p", 1, "r1")))
        assert status == 422, payload
        assert "outside the directories file:// deploys may read" in error_text(payload)
        assert "artifact_roots" in error_text(payload) and "FORESTFLOW_ARTIFACT_ROOTS" in error_text(payload)
        # The whole fixture directory (448 kB) is over a 200 kB cap: refused before anything is copied.
        status, payload = await deploy(gw, h2o_request(H2O_DIR.as_uri(), "prostate_kmeans.zip", fqrv("f", "p", 1, "r1")))
        assert status == 422, payload
        assert "artifact_max_bytes = 200000" in error_text(payload)
        assert cache_entries(gw) == []
        # A symlink inside an allowed directory cannot reach outside the roots either.
        linked = tmp_path / "data" / "linked"
        linked.mkdir(parents=True)
        (linked / "model.zip").symlink_to(outside / "model.zip")
        status, payload = await deploy(gw, h2o_request(linked.as_uri(), "model.zip", fqrv("f", "p", 1, "r1")))
        assert status == 422, payload
        assert "links outside" in error_text(payload)
        assert cache_entries(gw) == []


async def test_failed_deploy_delete_and_expiration_remove_artifacts_and_restart_prunes(tmp_path: Path) -> None:
    one, two, bad = tmp_path / "one", tmp_path / "two", tmp_path / "bad"
    for d, mojo in ((one, "prostate_gbm_binomial.zip"), (two, "prostate_kmeans.zip")):
        d.mkdir()
        shutil.copy(H2O_DIR / mojo, d / "model.zip")
    bad.mkdir()
    (bad / "model.zip").write_bytes(b"not a zip")
    roots = {"artifact_roots": f"{tmp_path},{ROOT}"}  # the echo servable lives in the repo
    data = tmp_path / "data"
    async with serve_in_process(data, **roots) as gw:
        status, payload = await deploy(gw, h2o_request(bad.as_uri(), "model.zip", fqrv("p", "q", 1, "bad")))
        assert status == 422, payload
        assert cache_entries(gw) == []  # the failed deploy's copy is gone
        # Default contract settings keep the latest one: r2 expires r1 and its artifact.
        assert (await deploy(gw, h2o_request(one.as_uri(), "model.zip", fqrv("p", "q", 1, "r1"))))[0] == 200
        first = cache_entries(gw)
        assert (await deploy(gw, h2o_request(two.as_uri(), "model.zip", fqrv("p", "q", 1, "r2"))))[0] == 200
        second = cache_entries(gw)
        assert len(first) == len(second) == 1 and first != second
        # An echo servable from the repo, kept across the restart below.
        assert (await deploy(gw, python_servable(("acme", "demo", 1), "v1")))[0] == 200
        kept = cache_entries(gw)
        assert len(kept) == 2
    # Leftovers of a crash: an unreferenced artifact and a staging directory.
    (data / "artifacts" / ("f" * 64)).mkdir()
    (data / "artifacts" / ".staging-crashed").mkdir()
    async with serve_in_process(data, **roots) as gw:
        assert cache_entries(gw) == kept  # restored servables keep theirs, the rest is gone
        await assert_golden(gw, "p/q/1", "prostate_kmeans")
        await delete(gw, "p/q/1", "r2")
        await delete(gw, "acme/demo/1", "v1")
        assert cache_entries(gw) == []
