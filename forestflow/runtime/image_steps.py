"""The ``image_decode`` and ``image_encode`` pipeline steps: encoded images <-> pixel tensors.

``image_decode``: one BYTES input, one encoded image per row (PNG, JPEG, GIF, BMP, WebP, PPM), as
raw bytes (binary V2 tensors, V2 gRPC, GraphPipe, BASIC ``Bytes``) or base64 text (JSON bodies:
BASIC ``String``, V2 BYTES as JSON strings). Keys: ``mode`` ("RGB" default, or "L"), ``size = [H, W]``
(resize, with ``resample``: bilinear by default, nearest, bicubic, lanczos, box, hamming), ``scale``
(multiply: FP32 output; UINT8 without it), ``layout`` ("HWC" default, or "CHW"), ``flatten`` (one
``[-1, H*W*C]`` tensor) and ``base64`` ("auto" default: text is base64, bytes are raw; true / false
force it). Every row of a batch must come out the same shape: without ``size``, a row whose size
differs from the first's is a 400 naming it. Mode "L" gives ``[-1, H, W]``, or ``[-1, H, W, 1]`` when
the declared output has four axes; "RGB" gives ``[-1, H, W, 3]`` (``[-1, 3, H, W]`` in CHW).

``image_encode``: one UINT8 tensor ``[-1, H, W]`` or ``[-1, H, W, C]`` (C = 1, 3 or 4; ``layout = "CHW"``
for ``[-1, C, H, W]``), or any numeric tensor with ``scale`` (e.g. 255 for pixels in [0, 1]: values are
multiplied, rounded and clipped to 0..255), to one BYTES image per row: ``format = "PNG"`` (default) or
``"JPEG"`` with ``quality`` (1..95, default 90). Its output's metadata says ``content_type = "image"``:
the V2 REST front-end sends it as base64 text in JSON answers and as raw bytes in binary ones.

Both steps score on a scoring thread, never on the event loop (a single large image takes longer than
the loop may be held), and check their whole configuration at load (a 422 naming the key).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core.frame import IMAGE, Frame, TensorSpec
from forestflow.errors import InvalidInput, PredictionFailed
from forestflow.runtime import images
from forestflow.runtime.base import ServableMetadata
from forestflow.runtime.pipeline_steps import _BuiltinStep, _spec, internal_frame

#: ``max_image_pixels`` when a step is built without gateway settings (the setting's default).
DEFAULT_MAX_PIXELS = 40_000_000
_PORT_KEYS = frozenset({"pipelineInputs", "pipelineOutputs", "stepName"})
_DECODE_KEYS = frozenset({"mode", "size", "resample", "scale", "layout", "flatten", "base64"})
_ENCODE_KEYS = frozenset({"format", "quality", "scale", "layout"})


class _ImageStep(_BuiltinStep):
    """What both image steps share: Pillow, one input and one output, strict keys, off the loop."""

    inline_max_rows = 0  # decoding one large image would hold the event loop: always on a thread
    reads_parameters = False
    keys: frozenset[str] = frozenset()
    #: The one input's name (set at load).
    _input = ""

    def __init__(self, fqrv: Any, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self._where = f"{self.platform} step {self.step!r}" if "stepName" in settings else f"{self.platform} step"

    def _check_common(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The Pillow module, the one input and output port; 422 for unknown keys or other ports."""
        self._image = images.pillow(self.platform)
        unknown = sorted(set(self.settings) - self.keys - _PORT_KEYS)
        if unknown:
            raise self._invalid(f"unknown key {unknown[0]!r}; an {self.platform} step takes {', '.join(sorted(self.keys))}")
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            raise self._invalid("declare exactly one [[models.inputs]] and one [[models.outputs]]")
        return self.inputs[0], self.outputs[0]

    def _scale(self) -> float | None:
        scale = self.settings.get("scale")
        if scale is None:
            return None
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
            raise self._invalid(f"scale must be a non-zero number, got {scale!r}")
        return float(scale)

    def _layout(self) -> str:
        layout = self.settings.get("layout", "HWC")
        if layout not in ("HWC", "CHW"):
            raise self._invalid(f'layout must be "HWC" or "CHW", got {layout!r}')
        return str(layout)

    def _column(self, frame: Frame) -> np.ndarray:
        try:
            return frame.columns[self._input]
        except KeyError:
            raise InvalidInput(f"{self._where}: missing input {self._input!r}") from None

    def metadata(self) -> ServableMetadata:
        assert self._meta is not None, "metadata before load"
        return self._meta


class ImageDecodeStep(_ImageStep):
    """Encoded images (bytes or base64 text) -> one UINT8 or FP32 pixel tensor."""

    platform = "image_decode"
    keys = _DECODE_KEYS

    def load(self) -> None:
        inp, out = self._check_common()
        if inp["datatype"] != "BYTES":
            raise self._invalid(f"input {inp['name']!r} must be BYTES (one encoded image per row), not {inp['datatype']}")
        mode = self.settings.get("mode", "RGB")
        if mode not in ("L", "RGB"):
            raise self._invalid(f'mode must be "L" or "RGB", got {mode!r}')
        size = self.settings.get("size")
        if size is not None and not (isinstance(size, list) and len(size) == 2 and all(type(d) is int and d > 0 for d in size)):
            raise self._invalid(f"size must be [height, width] in pixels, got {size!r}")
        resample = self.settings.get("resample", "bilinear")
        if resample not in images.RESAMPLE:
            raise self._invalid(f"resample must be one of {', '.join(images.RESAMPLE)}, got {resample!r}")
        flatten = self.settings.get("flatten", False)
        if not isinstance(flatten, bool):
            raise self._invalid("flatten must be true or false")
        b64 = self.settings.get("base64", "auto")
        b64 = {True: "true", False: "false"}.get(b64, b64) if isinstance(b64, bool) else b64
        if b64 not in ("auto", "true", "false"):
            raise self._invalid(f'base64 must be "auto", true or false, got {self.settings.get("base64")!r}')
        self._mode, self._size = str(mode), (int(size[0]), int(size[1])) if size else None
        self._resample, self._flatten, self._base64 = images.RESAMPLE[resample], flatten, str(b64)
        self._scale_by, self._chw = self._scale(), self._layout() == "CHW"
        self._max_pixels = int(getattr(self.gateway_settings, "max_image_pixels", DEFAULT_MAX_PIXELS))
        images.limit_pixels(self._image, self._max_pixels)
        rank = len(out["shape"])
        wanted_rank = 2 if flatten else 4 if mode == "RGB" else rank if rank in (3, 4) else 3
        self._channel_axis = mode == "RGB" or wanted_rank == 4
        self._input = inp["name"]
        self._meta = ServableMetadata(
            name=self.platform,
            platform=self.platform,
            inputs=(TensorSpec(inp["name"], "BYTES", (-1,), "one encoded image per row", content_type=IMAGE),),
            outputs=(TensorSpec(out["name"], "FP32" if self._scale_by is not None else "UINT8", self._out_shape(wanted_rank)),),
            description=f"decodes images to {mode} pixels",
        )
        self.ready = True

    def _out_shape(self, rank: int) -> tuple[int, ...]:
        h, w = self._size if self._size else (-1, -1)
        c = 3 if self._mode == "RGB" else 1
        if rank == 2:
            return (-1, h * w * c if self._size else -1)
        if not self._channel_axis:
            return (-1, h, w)
        return (-1, c, h, w) if self._chw else (-1, h, w, c)

    def predict(self, frame: Frame) -> Frame:
        column = self._column(frame)
        if column.ndim > 1:
            if math.prod(column.shape[1:]) != 1:
                shape = list(column.shape)
                raise InvalidInput(f"{self._where}: input {self._input!r} takes one image per row, got shape {shape}")
            column = column.reshape(len(column))
        pixels = [self._decode_row(i, v) for i, v in enumerate(column.tolist())]
        for i, p in enumerate(pixels[1:], 1):
            if p.shape != pixels[0].shape:
                raise InvalidInput(
                    f"{self._where}: row {i} is {p.shape[1]}x{p.shape[0]} pixels but row 0 is "
                    f"{pixels[0].shape[1]}x{pixels[0].shape[0]}: the rows of a batch must have one size "
                    "(give the step size = [H, W] to resize them)"
                )
        batch = np.stack(pixels) if pixels else self._empty()
        if self._channel_axis and batch.ndim == 3:  # mode L with a channel axis asked for
            batch = batch[..., None]
        if self._chw and batch.ndim == 4:
            batch = np.ascontiguousarray(batch.transpose(0, 3, 1, 2))
        if self._flatten:
            batch = batch.reshape(len(batch), -1)
        out = batch if self._scale_by is None else batch.astype(np.float32) * np.float32(self._scale_by)
        return internal_frame({self.outputs[0]["name"]: out}, {})

    def _decode_row(self, row: int, value: Any) -> np.ndarray:
        try:
            data = images.payload(value, self._base64)
            return images.decode(self._image, data, self._mode, self._size, self._resample, self._max_pixels)
        except images.ImageError as exc:
            raise InvalidInput(f"{self._where}: row {row} of input {self._input!r}: {exc}") from None

    def _empty(self) -> np.ndarray:
        h, w = self._size if self._size else (0, 0)
        return np.zeros((0, h, w, 3) if self._mode == "RGB" else (0, h, w), dtype=np.uint8)


class ImageEncodeStep(_ImageStep):
    """A pixel tensor -> one PNG or JPEG image per row (BYTES)."""

    platform = "image_encode"
    keys = _ENCODE_KEYS

    def load(self) -> None:
        inp, out = self._check_common()
        image_format = self.settings.get("format", "PNG")
        if image_format not in ("PNG", "JPEG"):
            raise self._invalid(f'format must be "PNG" or "JPEG", got {image_format!r}')
        quality = self.settings.get("quality", 90)
        if type(quality) is not int or not 1 <= quality <= 95:
            raise self._invalid(f"quality must be an integer 1..95 (JPEG), got {quality!r}")
        self._format, self._quality = str(image_format), quality
        self._scale_by, self._chw = self._scale(), self._layout() == "CHW"
        if inp["datatype"] != "UINT8" and self._scale_by is None:
            raise self._invalid(
                f"input {inp['name']!r} is {inp['datatype']}: pixels are UINT8, or give scale (e.g. 255 for values in [0, 1])"
            )
        if inp["datatype"] in ("BYTES", "BOOL"):
            raise self._invalid(f"input {inp['name']!r} must be a numeric pixel tensor, not {inp['datatype']}")
        if len(inp["shape"]) not in (3, 4):
            raise self._invalid(f"input {inp['name']!r}: shape must be [-1, H, W] or [-1, H, W, C], got {inp['shape']}")
        if out["datatype"] != "BYTES":
            raise self._invalid(f"output {out['name']!r} must be BYTES (one encoded image per row), not {out['datatype']}")
        self._input = inp["name"]
        self._meta = ServableMetadata(
            name=self.platform,
            platform=self.platform,
            inputs=(_spec(inp),),
            outputs=(TensorSpec(out["name"], "BYTES", (-1,), f"one {self._format} image per row", content_type=IMAGE),),
            description=f"encodes pixels as {self._format}",
        )
        self.ready = True

    def predict(self, frame: Frame) -> Frame:
        column = self._column(frame)
        if column.ndim not in (3, 4):
            raise self._unusable(f"input {self._input!r} needs [N, H, W] or [N, H, W, C], got {list(column.shape)}")
        if self._chw and column.ndim == 4:
            column = column.transpose(0, 2, 3, 1)
        channels = column.shape[3] if column.ndim == 4 else 1
        if channels not in ((1, 3) if self._format == "JPEG" else (1, 3, 4)):
            raise self._unusable(f"{channels} channels cannot be written as {self._format}")
        pixels = self._as_uint8(column)
        out = np.empty(len(pixels), dtype=object)
        for i in range(len(pixels)):
            out[i] = images.encode(self._image, pixels[i], self._format, self._quality)
        return internal_frame({self.outputs[0]["name"]: out}, {})

    def _as_uint8(self, column: np.ndarray) -> np.ndarray:
        if self._scale_by is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                scaled = np.rint(np.nan_to_num(column.astype(np.float64) * self._scale_by))
            return np.clip(scaled, 0, 255).astype(np.uint8)
        if column.dtype == np.uint8:
            return column
        if column.dtype.kind in "iu" and (column.size == 0 or (column.min() >= 0 and column.max() <= 255)):
            return column.astype(np.uint8)
        raise self._unusable(f"expected UINT8 pixels, got {column.dtype} values")

    def _unusable(self, reason: str) -> InvalidInput | PredictionFailed:
        """Pixels that cannot be an image: the caller's fault (400) when they came in the request, else
        the step before broke its declared output (the pipeline's failure, a 500)."""
        if not self.inputs[0].get("id"):
            return InvalidInput(f"{self._where}: {reason}")
        return PredictionFailed(self.fqrv, f"{self._where}: {reason}")
