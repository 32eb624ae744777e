"""Encoded images <-> pixel arrays with Pillow, one image at a time, for the image pipeline steps.

Pillow is optional (the ``images`` extra) and imported only when an image step loads. An image is
untrusted input: only the common formats are opened (PNG, JPEG, GIF, BMP, WebP, PPM; not TIFF, EPS,
which runs Ghostscript, PSD or Pillow's other rarely used decoders),
the size in the header is checked against ``max_image_pixels`` before any pixel is decoded (a
decompression bomb never allocates), truncated files are errors (never padded with grey), and
16-bit or floating-point images are refused rather than clipped to 8 bits. Every failure is an
:class:`ImageError` whose message says what is wrong with the image, for the step to name the row.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

import numpy as np

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.extras import pip_command

#: What a user whose gateway lacks Pillow is told to run.
INSTALL_HINT = pip_command("images")
#: Formats decoded: the common ones, whose decoders are the most used and fuzzed.
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "PPM")
#: Source modes converted to "L" or "RGB" without losing meaning (8 bits per channel, palettes,
#: alpha dropped, CMYK and YCbCr JPEGs); 16-bit and float images would be clipped, so they are refused.
CONVERTIBLE_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"})
#: ``resample`` names -> Pillow's filters (Image.Resampling values).
RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
_DATA_URL = "data:"


class ImageError(ValueError):
    """What is wrong with one image (the caller's data): not an image, truncated, too large..."""


def pillow(platform: str) -> Any:
    """``PIL.Image`` (the module the other functions take as ``image_module``), imported now; a 422
    naming the install command when Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise CreateServableRequestInvalidError(
            f"{platform} step: Pillow is not installed on this gateway; install it with {INSTALL_HINT}"
        ) from None
    return Image


def limit_pixels(image_module: Any, max_pixels: int) -> None:
    """Make Pillow's own decompression-bomb check agree with ``max_image_pixels``: it refuses above
    twice the limit and warns above it, where :func:`decode` refuses the image right after (so the
    warning, which would only repeat that refusal in the log, is silenced)."""
    image_module.MAX_IMAGE_PIXELS = max_pixels
    warnings.filterwarnings("ignore", category=image_module.DecompressionBombWarning)


def payload(value: Any, base64_mode: str) -> bytes:
    """The encoded image a BYTES element carries: raw bytes, or base64 text (``base64_mode`` "auto"
    decodes text and keeps bytes, "true" decodes both, "false" decodes neither)."""
    if value is None:
        raise ImageError("no image (null)")
    if isinstance(value, str):
        if base64_mode == "false":
            return value.encode("utf-8", "replace")
        return _from_base64(value, strict=base64_mode == "true")
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if base64_mode == "true":
            return _from_base64(data.decode("latin-1"), strict=True)
        return data
    raise ImageError(f"expected an encoded image (bytes or base64 text), got {type(value).__name__}")


def _from_base64(text: str, *, strict: bool) -> bytes:
    """Base64 text (a ``data:image/...;base64,`` prefix and line breaks allowed) decoded; in auto mode
    text that is not base64 is taken as the image's bytes themselves (which then fail as no image)."""
    body = text
    if body.startswith(_DATA_URL):
        head, sep, rest = body.partition(",")
        if sep and head.endswith(";base64"):
            body = rest
    if any(c in body for c in " \t\r\n"):
        body = "".join(body.split())
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        if strict:
            raise ImageError("not base64 text") from None
        return text.encode("utf-8", "replace")


def decode(image_module: Any, data: bytes, mode: str, size: tuple[int, int] | None, resample: int, max_pixels: int) -> np.ndarray:
    """One encoded image as a ``uint8`` array ``[H, W]`` (mode "L") or ``[H, W, 3]`` ("RGB"),
    resized to ``size`` = (H, W) when given."""
    try:
        img = image_module.open(io.BytesIO(data), formats=FORMATS)
    except image_module.DecompressionBombError:
        raise ImageError(f"too many pixels (over twice max_image_pixels = {max_pixels})") from None
    except Exception:  # Pillow's identify step raises many types on hostile headers: all mean "no image"
        raise ImageError(f"not an image (formats read: {', '.join(FORMATS)})") from None
    with img:
        width, height = img.size
        if width * height > max_pixels:
            raise ImageError(f"too many pixels: {width}x{height} is over max_image_pixels = {max_pixels}")
        if width == 0 or height == 0:
            raise ImageError(f"empty image ({width}x{height})")
        if img.mode not in CONVERTIBLE_MODES:
            raise ImageError(f"unsupported mode {img.mode} ({img.format}); images of 8 bits per channel are read")
        try:
            img.load()
        except Exception as exc:  # the decoders raise OSError, SyntaxError, EOFError... on bad data
            reason = str(exc)
            if "truncated" in reason.lower():
                raise ImageError(f"truncated {img.format} image") from None
            raise ImageError(f"corrupt {img.format} image: {reason or type(exc).__name__}") from None
        out = img if img.mode == mode else img.convert(mode)
        if size is not None and out.size != (size[1], size[0]):
            out = out.resize((size[1], size[0]), resample)
        return np.asarray(out, dtype=np.uint8)


def encode(image_module: Any, pixels: np.ndarray, image_format: str, quality: int) -> bytes:
    """One ``uint8`` ``[H, W]`` or ``[H, W, C]`` (C = 1, 3 or 4) array as a PNG or JPEG file."""
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    img = image_module.fromarray(np.ascontiguousarray(pixels))
    out = io.BytesIO()
    if image_format == "JPEG":
        img.save(out, format="JPEG", quality=quality)
    else:
        img.save(out, format="PNG")
    return out.getvalue()
