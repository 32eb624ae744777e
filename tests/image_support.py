"""Images and image pipelines for the tests and bench/images.py: real PNG/JPEG files made with Pillow,
a scikit-learn digits classifier exported to ONNX behind ``image_decode``, and AMD's invert ensemble.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.pipeline_support import port, toml

#: The digits pipeline's scale: 8-bit pixels back to scikit-learn's 0..16 feature range.
DIGITS_SCALE = 16 / 255
INVERT_MODULE = """
import numpy as np

METADATA = {
    "inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}],
    "outputs": [{"name": "inverted", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}],
}


def predict(frame):
    return {"inverted": 255 - frame["pixels"]}
"""


def encode(pixels: np.ndarray, image_format: str = "PNG", **options: Any) -> bytes:
    """A uint8 ``[H, W]`` or ``[H, W, C]`` array as an image file made by Pillow."""
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(out, format=image_format, **options)
    return out.getvalue()


def png16(height: int = 4, width: int = 4) -> bytes:
    """A 16-bit grey PNG (mode I;16): 8-bit steps refuse it rather than clip it."""
    out = io.BytesIO()
    Image.fromarray(np.full((height, width), 1000, dtype=np.uint16)).save(out, format="PNG")
    return out.getvalue()


def b64(data: bytes) -> str:
    """Base64 text of bytes."""
    return base64.b64encode(data).decode("ascii")


def pixels_of(data: bytes, mode: str | None = None) -> np.ndarray:
    """The pixels Pillow decodes from an image file (converted to ``mode`` when given)."""
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert(mode) if mode else img)


def random_rgb(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random uint8 RGB image."""
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


@dataclass
class Digits:
    """The digits pipeline's directory and test images, with scikit-learn's labels for them."""

    directory: Path
    #: PNG files, 8x8 grey, one per test digit.
    images: list[bytes]
    #: scikit-learn's predictions on the pixels the pipeline decodes from them (as class names).
    expected: list[str]
    #: The decoded, scaled features: what the bare ONNX model is fed (bench/images.py).
    features: np.ndarray


def digits_pipeline(directory: Path, count: int = 24) -> Digits:
    """Train a classifier on scikit-learn's bundled 8x8 digits, export it to ONNX, and write the
    pipeline ``image_decode`` (mode L, size [8, 8], scale 16/255, flatten) -> ``onnx`` -> ``classifier``."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier

    directory.mkdir(parents=True, exist_ok=True)
    data = load_digits()
    train, held_out = data.data[:-count], data.data[-count:]
    model = RandomForestClassifier(n_estimators=20, random_state=0).fit(train, data.target[:-count])
    onx = convert_sklearn(
        model, initial_types=[("pixels", FloatTensorType([None, 64]))], options={id(model): {"zipmap": False}}, target_opset=17
    )
    (directory / "digits.onnx").write_bytes(onx.SerializeToString())
    # Each held-out digit (values 0..16) as an 8-bit grey PNG; the pipeline reads it back scaled.
    images = [encode(np.rint(row.reshape(8, 8) * 255 / 16).astype(np.uint8)) for row in held_out]
    decoded = np.stack([pixels_of(png).reshape(64) for png in images])
    features = decoded.astype(np.float32) * np.float32(DIGITS_SCALE)
    expected = [str(c) for c in model.predict(features)]
    steps = [
        {
            "name": "decode",
            "platform": "image_decode",
            "mode": "L",
            "size": [8, 8],
            "scale": DIGITS_SCALE,
            "flatten": True,
            "inputs": [port("image", "BYTES")],
            "outputs": [port("pixels", "FP32", "pixels", shape=[-1, 64])],
        },
        {
            "name": "model",
            "platform": "onnx",
            "id": "digits.onnx",
            "inputs": [port("pixels", "FP32", "pixels", shape=[-1, 64])],
            "outputs": [port("probabilities", "FP32", "probabilities", shape=[-1, 10])],
        },
        {
            "name": "classify",
            "platform": "classifier",
            "inputs": [port("probabilities", "FP32", "probabilities", shape=[-1, 10])],
            "outputs": [port("label", "BYTES"), port("score", "FP64")],
        },
    ]
    (directory / "pipeline.toml").write_text(toml(steps))
    return Digits(directory, images, expected, features)


def invert_pipeline(directory: Path) -> Path:
    """AMD's ensemble: base64 image in -> decode -> a Python step inverting the pixels -> encode -> PNG out."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "invert.py").write_text(INVERT_MODULE)
    steps = [
        {
            "name": "decode",
            "platform": "image_decode",
            "mode": "RGB",
            "inputs": [port("image_in", "BYTES")],
            "outputs": [port("pixels", "UINT8", "preprocessed_image", shape=[-1, -1, -1, 3])],
        },
        {
            "name": "execute",
            "platform": "python",
            "id": "invert.py",
            "inputs": [port("pixels", "UINT8", "preprocessed_image", shape=[-1, -1, -1, 3])],
            "outputs": [port("inverted", "UINT8", "inverted_image", shape=[-1, -1, -1, 3])],
        },
        {
            "name": "encode",
            "platform": "image_encode",
            "format": "PNG",
            "inputs": [port("inverted", "UINT8", "inverted_image", shape=[-1, -1, -1, 3])],
            "outputs": [port("image_out", "BYTES", "image_out")],
        },
    ]
    (directory / "pipeline.toml").write_text(toml(steps))
    return directory
