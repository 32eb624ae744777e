"""C extensions of forestflow (everything else is in pyproject.toml).

Built by ``pip install`` wherever gcc and the Python headers are (the README's install commands,
CI, the Dockerfile's build stage). None needs numpy's headers (codecs/ndarray.h), so setuptools is
the only build requirement: pip's build environment for a source install is setuptools alone.
"""

import os

from setuptools import Extension, setup

#: The varint writers both serializers share.
VARINT_H = "forestflow/codecs/varint.h"
#: Python ints read as C integers (the event writers).
PYLONG_H = "forestflow/codecs/pylong.h"
#: numpy arrays made and read without numpy's headers (the codecs).
NDARRAY_H = "forestflow/codecs/ndarray.h"
#: The buffer-protocol array readers of the runtime's extensions.
ARRAYS_H = "forestflow/runtime/arrays.h"
#: The padded perfect-tree walk both tree kernels share.
PADDED_H = "forestflow/runtime/padded.h"
#: Compiler warnings every extension is built with (a new warning fails tests/test_c_warnings.py), and no
#: debug information unless the builder's CFLAGS ask for it (scripts/asan.sh does): Python's own CFLAGS carry
#: -g, which would make the installed extensions 2.6 times their size (503 kB instead of 190 kB).
WARNINGS = ["-Wall", "-Wextra"] + ([] if "-g" in os.environ.get("CFLAGS", "").split() else ["-g0"])

setup(
    # The extensions compile side by side, one per core (build_ext -j): the install's build step is shorter.
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=[
        # Every extension is built with -Wall -Wextra; tests/test_c_warnings.py holds them to none.
        # The prediction log's PredictionEvent records (codecs/ff_protobuf.py).
        # It reads numpy arrays' memory straight from their fields (their buffers cost more to build than a
        # small column costs to write).
        Extension(
            "forestflow.codecs._ffwire",
            ["forestflow/codecs/_ffwire.c"],
            depends=[VARINT_H, NDARRAY_H, PYLONG_H],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # Request JSON bodies (BASIC /score, V2 infer) read straight into typed numpy columns
        # (codecs/schema_datum.py, api/v2_rest.py).
        Extension(
            "forestflow.codecs._ffjson",
            ["forestflow/codecs/_ffjson.c"],
            depends=[NDARRAY_H],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # The head of a plain HTTP/1.x scoring request (api/fast_http.py), read without llhttp's callbacks.
        Extension(
            "forestflow.api._ffhttp",
            ["forestflow/api/_ffhttp.c"],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # GraphPipe flatbuffer string vectors (codecs/graphpipe.py): the per-value loops only.
        Extension(
            "forestflow.codecs._ffgp",
            ["forestflow/codecs/_ffgp.c"],
            depends=[NDARRAY_H],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # The prediction log's Kafka record batches (predlog/kafka_batch.py).
        Extension(
            "forestflow.predlog._kafka_records",
            ["forestflow/predlog/_kafka_records.c"],
            include_dirs=["forestflow/codecs"],
            depends=[VARINT_H],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # The file log's JSON line of the usual /score and V2 REST event (predlog/encode.py).
        Extension(
            "forestflow.predlog._jsonl",
            ["forestflow/predlog/_jsonl.c"],
            include_dirs=["forestflow/codecs"],
            depends=[PYLONG_H],
            extra_compile_args=WARNINGS + ["-O2"],
        ),
        # The native H2O tree scorer (runtime/h2o_native.py): plain IEEE doubles (no fused multiply-add,
        # no -ffast-math), so the results equal genmodel's.
        Extension(
            "forestflow.runtime._h2o_trees",
            ["forestflow/runtime/_h2o_trees.c"],
            depends=[ARRAYS_H, PADDED_H],
            extra_compile_args=WARNINGS + ["-O2", "-ffp-contract=off"],
            libraries=["m"],
        ),
        # Exact path-dependent TreeSHAP over any tree flavor's node table (runtime/treeshap.py).
        Extension(
            "forestflow.runtime._treeshap",
            ["forestflow/runtime/_treeshap.c"],
            depends=[ARRAYS_H],
            extra_compile_args=WARNINGS + ["-O2"],
            libraries=["m"],
        ),
        # The tree engine of the XGBoost, LightGBM and scikit-learn flavors (runtime/trees/forest.py):
        # plain IEEE arithmetic too, so sums and links equal the libraries' own.
        Extension(
            "forestflow.runtime._forest",
            ["forestflow/runtime/_forest.c"],
            depends=[ARRAYS_H, PADDED_H],
            extra_compile_args=WARNINGS + ["-O2", "-ffp-contract=off"],
            libraries=["m"],
        ),
    ],
)
