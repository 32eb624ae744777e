"""The C string-vector routines of the GraphPipe codec (codecs/_ffgp.c), against the format itself."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from graphpipe import convert

from forestflow.codecs import _ffgp
from forestflow.codecs.graphpipe import encode_infer_response, parse_request
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.errors import InvalidInput

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")


def _vector(values: list[bytes]) -> bytes:
    """A flatbuffer string vector at position 0: count, uoffsets, then each string (length, bytes, NUL)."""
    head, body = struct.pack("<I", len(values)), b""
    base = 4 + 4 * len(values)
    offsets = []
    for i, value in enumerate(values):
        offsets.append(base + len(body) - (4 + 4 * i))
        body += struct.pack("<I", len(value)) + value + b"\x00" + bytes(-(len(value) + 5) % 4)
    return head + struct.pack(f"<{len(values)}I", *offsets) + body


def test_read_strings_gives_text_or_all_bytes_or_none_when_out_of_the_body() -> None:
    assert _ffgp.read_strings(_vector([b"a", b"\xe2\x82\xac", b""]), 4, 3) == ["a", "\u20ac", ""]
    assert _ffgp.read_strings(_vector([b"ok", b"\xff"]), 4, 2) == [b"ok", b"\xff"]  # one not text: all bytes
    cut = _vector([b"abc", b"defgh"])[:-6]  # the last string's bytes run past the end
    assert _ffgp.read_strings(cut, 4, 2) is None
    assert _ffgp.read_strings(_vector([]), 4, 0) == []


def test_write_strings_lays_each_distinct_value_out_once_and_reads_back() -> None:
    values: list[object] = ["a", "bb", "a", None, b"\xff", 2.5, b"a"]
    written = _ffgp.write_strings(values)
    count, *offsets = struct.unpack_from(f"<{1 + len(values)}I", written)
    assert count == len(values)
    targets = [4 + 4 * i + off for i, off in enumerate(offsets)]
    assert targets[0] == targets[2] == targets[6]  # "a" and b"a" are the same bytes: written once
    assert all(t % 4 == 0 for t in targets)
    assert _ffgp.read_strings(written, 4, count) == [b"a", b"bb", b"a", b"", b"\xff", b"2.5", b"a"]


def test_a_string_offset_outside_the_body_is_named_by_the_python_walk() -> None:
    body = bytearray(convert.serialize_infer_request(convert.InferReq("", [np.array([["x", "y"]], dtype=object)], ["in"], [])))
    last = bytes(body).rindex(b"y") - 4  # the length prefix of the last string
    body[last : last + 4] = struct.pack("<I", 10_000)
    with pytest.raises(InvalidInput, match=r"input_tensors\[0\]\.string_val\[1\]: string length outside the body"):
        parse_request(bytes(body))


def test_the_c_written_response_reads_back_with_the_graphpipe_client() -> None:
    frame = Frame({"label": np.array(["yes", None, "yes"], dtype=object), "p": np.array([0.25, 0.5, 0.75])})
    tensors, errors = convert.deserialize_infer_response(encode_infer_response(FQRV.parse("o.p.1.r"), frame))
    assert errors == []
    fqrv, label, p = tensors
    assert fqrv.tolist() == [[b"o.p.1.r"]]
    assert label.tolist() == [[b"yes"], [b""], [b"yes"]]
    assert p.dtype == np.float64 and p.tolist() == [[0.25], [0.5], [0.75]]
