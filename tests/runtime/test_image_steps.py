"""The image_decode and image_encode steps on their own, with real PNG, JPEG, GIF and BMP files made by
Pillow: every key, every refusal (422 at load, 400 naming the row at scoring), the pixel limit, the
missing-Pillow answer, and a bounded fuzz of the decoder that must only ever answer 400."""

from __future__ import annotations

import functools
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput, PredictionFailed
from forestflow.runtime.flavors import create_servable
from forestflow.runtime.pipeline import PipelineServable
from forestflow.settings import Settings, SettingsError
from tests.image_support import b64, encode, pixels_of, png16, random_rgb
from tests.pipeline_support import pipeline_dir, port, toml

FQ = FQRV(Contract("t", "img", 1), "r1")
RNG = np.random.default_rng(7)
RGB = random_rgb(RNG, 6, 10)
PNG = encode(RGB)
#: A smooth image (gradients), which JPEG keeps close; JPEG turns random noise into other noise.
SMOOTH = np.dstack([*np.meshgrid(np.arange(10) * 20, np.arange(6) * 40), np.full((6, 10), 90)]).astype(np.uint8)


def _port(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "id": name}


def decoder(out: str = "UINT8", shape: list[int] | None = None, max_image_pixels: int | None = None, **options: Any) -> Any:
    """A loaded image_decode step reading ``image`` and giving ``pixels``."""
    settings = {
        **options,
        "stepName": "decode",
        "pipelineInputs": [_port("image", "BYTES", [-1])],
        "pipelineOutputs": [_port("pixels", out, shape or [-1, -1, -1, 3])],
    }
    step = create_servable("ImageDecode", FQ, Path("."), settings)
    if max_image_pixels is not None:
        step.gateway_settings = Settings.load(environ={}, overrides={"max_image_pixels": max_image_pixels})
    step.load()
    return step


def encoder(datatype: str = "UINT8", shape: list[int] | None = None, from_request: bool = True, **options: Any) -> Any:
    """A loaded image_encode step reading ``pixels`` (a request column, or a tensor of the step before) and giving ``image``."""
    pixels = _port("pixels", datatype, shape or [-1, -1, -1, 3])
    settings = {
        **options,
        "stepName": "encode",
        "pipelineInputs": [{**pixels, "id": "" if from_request else "pixels"}],
        "pipelineOutputs": [_port("image", "BYTES", [-1])],
    }
    step = create_servable("ImageEncode", FQ, Path("."), settings)
    step.load()
    return step


def run(step: Any, values: list[Any], name: str = "image") -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return step.predict(Frame({name: column}))[step.outputs[0]["name"]]


def test_decode_reads_raw_bytes_base64_text_and_data_urls_alike() -> None:
    step = decoder()
    text = b64(PNG)
    out = run(step, [PNG, text, "data:image/png;base64," + text, text[:40] + "\n" + text[40:]])
    assert out.dtype == np.uint8 and out.shape == (4, 6, 10, 3)
    assert all(np.array_equal(row, RGB) for row in out)
    with pytest.raises(InvalidInput, match="row 0 of input 'image': not an image"):
        run(decoder(base64=False), [text])  # base64 = false: the text itself is taken as the file
    with pytest.raises(InvalidInput, match="row 1 of input 'image': not base64 text"):
        run(decoder(base64=True), [text, PNG])  # base64 = true: bytes must be base64 too
    assert np.array_equal(run(decoder(base64=True), [text.encode()])[0], RGB)


def test_decode_modes_resize_layout_flatten_and_scale() -> None:
    grey = pixels_of(PNG, "L")
    assert np.array_equal(run(decoder(mode="L", shape=[-1, -1, -1]), [PNG])[0], grey)
    assert run(decoder(mode="L", shape=[-1, -1, -1, 1]), [PNG]).shape == (1, 6, 10, 1)
    chw = run(decoder(layout="CHW", shape=[-1, 3, -1, -1]), [PNG])
    assert np.array_equal(chw[0], RGB.transpose(2, 0, 1))
    flat = run(decoder(flatten=True, shape=[-1, -1]), [PNG, PNG])
    assert flat.shape == (2, 180) and np.array_equal(flat[1], RGB.reshape(-1))
    scaled = run(decoder(out="FP32", scale=1 / 255), [PNG])
    assert scaled.dtype == np.float32 and np.allclose(scaled[0], RGB / 255, atol=1e-6)
    resized = run(decoder(size=[3, 5], resample="nearest"), [PNG, encode(random_rgb(RNG, 30, 40), "JPEG")])
    assert resized.shape == (2, 3, 5, 3)
    assert decoder(size=[3, 5], flatten=True, shape=[-1, 45]).metadata().outputs[0].shape == (-1, 45)


def test_decode_reads_jpeg_gif_bmp_palette_and_alpha_images() -> None:
    rgba = np.dstack([RGB, np.full(RGB.shape[:2], 128, dtype=np.uint8)])
    files = [encode(RGB, "BMP"), encode(rgba, "PNG"), encode(RGB, "GIF"), encode(SMOOTH, "JPEG", quality=95)]
    out = run(decoder(), files)
    assert np.array_equal(out[0], RGB) and np.array_equal(out[1], RGB)  # BMP exact, PNG alpha dropped
    assert np.array_equal(out[2], pixels_of(files[2], "RGB")) and np.array_equal(out[3], pixels_of(files[3], "RGB"))
    assert np.abs(out[3].astype(int) - SMOOTH).mean() < 8  # JPEG: close, not exact


def test_decode_refuses_bad_images_naming_the_row_and_the_reason() -> None:
    step = decoder()
    jpeg = encode(RGB, "JPEG")
    cases = [
        ([PNG, b"hello"], "row 1 of input 'image': not an image"),
        ([PNG[:60]], "row 0 of input 'image': truncated PNG image"),
        ([PNG, PNG, jpeg[: len(jpeg) - 40]], "row 2 of input 'image': truncated JPEG image"),
        ([png16()], "row 0 of input 'image': unsupported mode I;16"),
        ([None], "row 0 of input 'image': no image"),
        ([PNG, encode(random_rgb(RNG, 6, 11))], "row 1 is 11x6 pixels but row 0 is 10x6: the rows of a batch must have one size"),
        ([encode(np.zeros((1, 1, 3), dtype=np.uint8)), 17], "row 1 of input 'image': expected an encoded image"),
    ]
    for values, message in cases:
        with pytest.raises(InvalidInput, match=message):
            run(step, values)


def test_decode_refuses_images_over_max_image_pixels_before_decoding_them() -> None:
    step = decoder(max_image_pixels=100)
    assert run(step, [encode(random_rgb(RNG, 10, 10))]).shape == (1, 10, 10, 3)
    with pytest.raises(InvalidInput, match="row 0 of input 'image': too many pixels: 12x10 is over max_image_pixels = 100"):
        run(step, [encode(random_rgb(RNG, 10, 12))])
    # Over twice the limit Pillow itself refuses at the header (its limit is set from the setting).
    with pytest.raises(InvalidInput, match="row 0 of input 'image': too many pixels"):
        run(step, [encode(np.zeros((20, 20), dtype=np.uint8))])
    # A 1-bit 10000 x 5000 PNG is a few kB on the wire and 50 MP decoded: refused from its header
    # by the default max_image_pixels (40 MP), below Pillow's own refusal at twice that.
    out = io.BytesIO()
    Image.new("1", (10000, 5000)).save(out, format="PNG")
    assert len(out.getvalue()) < 100_000
    with pytest.raises(InvalidInput, match="too many pixels: 10000x5000 is over max_image_pixels = 40000000"):
        run(decoder(), [out.getvalue()])


def test_encode_round_trips_pixels_exactly_as_png_and_closely_as_jpeg() -> None:
    rgba = np.dstack([RGB, RNG.integers(0, 256, RGB.shape[:2], dtype=np.uint8)])
    for pixels, shape in ((RGB, [-1, -1, -1, 3]), (rgba, [-1, -1, -1, 4]), (RGB[..., 0], [-1, -1, -1])):
        column = np.stack([pixels, pixels])
        out = encoder(shape=shape).predict(Frame({"pixels": column}))["image"]
        assert out.shape == (2,) and all(np.array_equal(pixels_of(png), pixels) for png in out)
    jpeg = encoder(format="JPEG", quality=95).predict(Frame({"pixels": SMOOTH[None]}))["image"][0]
    assert jpeg.startswith(b"\xff\xd8") and np.abs(pixels_of(jpeg).astype(int) - SMOOTH).mean() < 8
    floats = (RGB.astype(np.float32) / 255)[None]
    chw = floats.transpose(0, 3, 1, 2)
    png = encoder("FP32", [-1, 3, -1, -1], scale=255, layout="CHW").predict(Frame({"pixels": chw}))["image"][0]
    assert np.array_equal(pixels_of(png), RGB)
    meta = encoder().metadata().outputs[0]
    assert (meta.datatype, meta.content_type) == ("BYTES", "image")


def test_encode_refuses_what_cannot_be_an_image_as_the_callers_or_the_pipelines_fault() -> None:
    with pytest.raises(InvalidInput, match="image_encode step 'encode': 4 channels cannot be written as JPEG"):
        encoder(format="JPEG").predict(Frame({"pixels": np.zeros((1, 2, 2, 4), dtype=np.uint8)}))
    with pytest.raises(InvalidInput, match=r"needs \[N, H, W\] or \[N, H, W, C\]"):
        encoder().predict(Frame({"pixels": np.zeros((1, 4), dtype=np.uint8)}))
    # Pixels of the step before that break its declared UINT8 output: a server failure (500), not the caller's.
    with pytest.raises(PredictionFailed, match="expected UINT8 pixels, got float64 values"):
        encoder(from_request=False).predict(Frame({"pixels": np.full((1, 2, 2, 3), 0.5)}))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: decoder(mode="CMYK"), 'mode must be "L" or "RGB"'),
        (lambda: decoder(size=[8]), r"size must be \[height, width\]"),
        (lambda: decoder(resample="fancy"), "resample must be one of"),
        (lambda: decoder(layout="NHWC"), 'layout must be "HWC" or "CHW"'),
        (lambda: decoder(scale=0), "scale must be a non-zero number"),
        (lambda: decoder(flatten="yes"), "flatten must be true or false"),
        (lambda: decoder(base64="maybe"), 'base64 must be "auto", true or false'),
        (lambda: decoder(sise=[8, 8]), "unknown key 'sise'; an image_decode step takes"),
        (lambda: encoder(format="GIF"), 'format must be "PNG" or "JPEG"'),
        (lambda: encoder(quality=100), "quality must be an integer 1..95"),
        (lambda: encoder("FP32"), "pixels are UINT8, or give scale"),
        (lambda: encoder(shape=[-1, 64]), r"shape must be \[-1, H, W\] or \[-1, H, W, C\]"),
    ],
)
def test_bad_step_keys_are_422s_naming_the_key(build: Any, message: str) -> None:
    with pytest.raises(CreateServableRequestInvalidError, match=message):
        build()


def _image_pipeline(tmp_path: Path, output: dict[str, Any]) -> PipelineServable:
    steps = [{"name": "decode", "platform": "image_decode", "inputs": [port("image", "BYTES")], "outputs": [output]}]
    directory = pipeline_dir(tmp_path / "p", toml(steps))
    pipeline = create_servable("Pipeline", FQ, directory, {"Pipeline": {"definition": "pipeline.toml"}})
    assert isinstance(pipeline, PipelineServable)
    return pipeline


def test_a_pipeline_declares_its_image_input_and_checks_the_decoders_output(tmp_path: Path) -> None:
    pipeline = _image_pipeline(tmp_path, port("pixels", "UINT8", "pixels", shape=[-1, -1, -1, 3]))
    pipeline.load()
    (image,) = pipeline.metadata().inputs
    assert (image.name, image.datatype, image.content_type) == ("image", "BYTES", "image")
    assert pipeline.inline_max_rows == 0  # never decoded on the event loop
    out = pipeline.predict(Frame.from_columns({"image": [b64(PNG)]}))
    assert np.array_equal(out["pixels"][0], RGB)
    pipeline.unload()
    wrong = _image_pipeline(tmp_path, port("pixels", "FP32", "pixels", shape=[-1, -1, -1, 3]))
    with pytest.raises(CreateServableRequestInvalidError, match="declared FP32 but the model gives UINT8"):
        wrong.load()


def test_without_pillow_an_image_step_is_a_422_naming_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pillow cannot be uninstalled from the shared environment: an import that fails is what a gateway without it sees.
    monkeypatch.setitem(sys.modules, "PIL", None)
    pipeline = _image_pipeline(tmp_path, port("pixels", "UINT8", "pixels", shape=[-1, -1, -1, 3]))
    with pytest.raises(CreateServableRequestInvalidError) as err:
        pipeline.load()
    assert err.value.message == (
        "step 'decode': image_decode step: Pillow is not installed on this gateway; "
        "install it with pip install 'forestflow[images]'"
    )


def _truncations() -> st.SearchStrategy[bytes]:
    files = [PNG, encode(RGB, "JPEG"), encode(RGB, "GIF"), encode(RGB, "BMP"), encode(RGB[..., 0], "PNG")]
    return st.sampled_from(files).flatmap(lambda f: st.integers(0, len(f) - 1).map(lambda n: f[:n]))


def _mutations() -> st.SearchStrategy[bytes]:
    files = [PNG, encode(RGB, "JPEG"), encode(RGB, "GIF")]

    def mutate(f: bytes, at: int, value: int) -> bytes:
        at %= len(f)
        return f[:at] + bytes([value]) + f[at + 1 :]

    return st.builds(mutate, st.sampled_from(files), st.integers(0, 10_000), st.integers(0, 255))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300), _truncations(), _mutations()).map(lambda b: [b, b64(b)]))
def test_fuzzed_images_only_ever_decode_or_answer_400(values: list[Any]) -> None:
    step = _fuzzed()
    for value in values:
        try:
            out = run(step, [value])
        except InvalidInput as exc:
            assert "row 0 of input 'image'" in exc.message
        else:
            assert out.dtype == np.uint8 and out.shape[0] == 1 and out.shape[-1] == 3


@functools.cache
def _fuzzed() -> Any:
    return decoder(size=[6, 10])


def test_max_image_pixels_is_a_setting_read_from_the_environment_and_checked() -> None:
    assert Settings.load(environ={}).max_image_pixels == 40_000_000
    assert Settings.load(environ={"FORESTFLOW_MAX_IMAGE_PIXELS": "1000"}).max_image_pixels == 1000
    with pytest.raises(SettingsError, match="invalid max_image_pixels = 0"):
        Settings.load(environ={"FORESTFLOW_MAX_IMAGE_PIXELS": "0"})
