"""The ONNX example of the docs: made by scripts/make_onnx_example.py, deployed with ``forestflow deploy``, scored."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, serve_in_process


async def run(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def answer(body: dict[str, object]) -> dict[str, list[object]]:
    """The Prediction's columns (one field name per value)."""
    prediction = body["Prediction"]
    assert isinstance(prediction, dict)
    out: dict[str, list[object]] = {}
    for g, entry in enumerate(prediction["schema"]):
        for datum in prediction["datum"]:
            (values,) = [t["data"] for t in datum["tensors"][g].values()]
            for name, value in zip(entry["fields"], values, strict=True):
                out.setdefault(name, []).append(value)
    return out


@pytest.mark.slow
async def test_the_onnx_example_deploys_scores_and_is_made_by_its_script(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "flavors.md").read_text()
    block = page[page.index("## ONNX models") :].split("```bash\n", 1)[1].split("```", 1)[0]
    deploy, curl = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert deploy == ".venv/bin/forestflow deploy servables/iris-onnx.json"  # the commands this test runs
    assert "localhost:8090/samples/iris/1/score" in curl and "-d @servables/iris-score.json" in curl
    score = json.loads((ROOT / "servables" / "iris-score.json").read_text())
    async with serve_in_process(tmp_path / "data") as gw:
        code, out, err = await run("-m", "forestflow.cli", "deploy", "servables/iris-onnx.json", "--url", gw.url)
        assert code == 0, out + err
        async with gw.session.post(gw.url + "/samples/iris/1/score", json=score) as r:
            assert r.status == 200, await r.text()
            committed = answer(await r.json())
        assert committed["output_label"] == ["setosa", "virginica"]
        assert [round(sum(p), 6) for p in zip(committed["setosa"], committed["versicolor"], committed["virginica"])] == [1, 1]
        # The script makes that model again (here into a temp dir): deployed as contract 2, it answers the same.
        code, out, err = await run("scripts/make_onnx_example.py", "--out", str(tmp_path / "made"))
        assert code == 0 and (tmp_path / "made" / "model.onnx").is_file(), out + err
        definition = json.loads((ROOT / "servables" / "iris-onnx.json").read_text())
        definition["path"] = (tmp_path / "made").as_uri()
        definition["fqrv"]["contract"]["contract_number"] = 2
        async with gw.session.post(gw.url + "/servable", json=definition) as r:
            assert r.status == 200, await r.text()
        async with gw.session.post(gw.url + "/samples/iris/2/score", json=score) as r:
            made = answer(await r.json())
    assert made["output_label"] == committed["output_label"]
    # Retrained, not copied: the solver stops within its own tolerance, and the BLAS kernels it runs on
    # differ between CPUs (on an AVX-512 machine the probabilities moved by 1e-4), so equal within 1e-3.
    for name in ("setosa", "versicolor", "virginica"):
        assert made[name] == pytest.approx(committed[name], abs=1e-3)
