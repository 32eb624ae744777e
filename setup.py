"""C extensions of forestflow (everything else is in pyproject.toml).

Plain CPython C API, no numpy headers: built by ``pip install`` wherever gcc and the Python
headers are (the README's install commands, CI, the Dockerfile's build stage).
"""

from setuptools import Extension, setup

#: The varint writers both serializers share.
VARINT_H = "forestflow/codecs/varint.h"

setup(
    ext_modules=[
        # The prediction log's PredictionEvent records (codecs/ff_protobuf.py).
        Extension("forestflow.codecs._ffwire", ["forestflow/codecs/_ffwire.c"], depends=[VARINT_H], extra_compile_args=["-O2"]),
        # The prediction log's Kafka record batches (predlog/kafka_batch.py).
        Extension(
            "forestflow.predlog._kafka_records", ["forestflow/predlog/_kafka_records.c"],
            include_dirs=["forestflow/codecs"], depends=[VARINT_H], extra_compile_args=["-O2"],
        ),
        # The native H2O tree scorer (runtime/h2o_native.py): plain IEEE doubles (no fused multiply-add,
        # no -ffast-math), so the results equal genmodel's.
        Extension("forestflow.runtime._h2o_trees", ["forestflow/runtime/_h2o_trees.c"], extra_compile_args=["-O2", "-ffp-contract=off"], libraries=["m"]),
    ],
)
