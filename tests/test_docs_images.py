"""docs/images.md runs as written: each bash block of its example against a real gateway process, and the
thumbnails that come back (base64 in JSON, raw bytes in binary, base64 from /score) are the image resized."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.support import ROOT, GatewayProcess

DOC = (ROOT / "docs" / "images.md").read_text()
EXAMPLE = ROOT / "servables" / "thumbnail-example.png"


def _documents(text: str) -> list[Any]:
    """Every JSON document printed one after the other (curl prints no newline after its body)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        out.append(value)
    return out


def _pixels(png: bytes) -> np.ndarray:
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(png)) as img:
        return np.asarray(img)


def test_the_thumbnail_example_runs_as_written(tmp_path: Path) -> None:
    section = DOC[DOC.index("## Example: thumbnails") : DOC.index("## A vision model")]
    deploy, json_calls, binary_call = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    with Image.open(EXAMPLE) as img:
        expected = np.asarray(img.convert("RGB").resize((32, 32), Image.Resampling.LANCZOS))
    written = tmp_path / "thumbnail.png"
    gw = GatewayProcess(tmp_path / "data").start()
    try:

        def run(block: str) -> str:
            script = (
                block.replace("localhost:8090", gw.url.removeprefix("http://"))
                .replace(".venv/bin/", f"{Path(sys.executable).parent}/")
                .replace("/tmp/thumbnail.png", str(written))
                .replace("forestflow deploy ", f"forestflow deploy --url {gw.url} ")
            )
            done = subprocess.run(["bash", "-ec", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (block, done.stdout[-2000:], done.stderr[-2000:])
            return done.stdout

        created, printed_meta = run(deploy).split("\n", 1)
        assert created.startswith("deployed samples/thumbnail/1/png-v1 in "), created
        (meta,) = _documents(printed_meta)
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "image"}}]

        v2, basic = _documents(run(json_calls))
        (out,) = v2["outputs"]
        assert (out["name"], out["shape"], out["parameters"]) == ("thumbnail", [1], {"content_type": "base64"})
        assert np.array_equal(_pixels(base64.b64decode(out["data"][0])), expected)
        prediction = basic["Prediction"]
        assert prediction["schema"] == [{"type": "Bytes", "fields": ["thumbnail"]}]
        (record,) = prediction["datum"]
        assert np.array_equal(_pixels(base64.b64decode(record["tensors"][0]["Byte"]["data"][0])), expected)

        printed = run(binary_call)
        assert "'binary_data_size'" in printed and "'thumbnail'" in printed, printed
        assert np.array_equal(_pixels(written.read_bytes()), expected)
    finally:
        assert gw.stop() == 0
