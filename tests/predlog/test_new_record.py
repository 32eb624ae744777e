"""``new_record``: the service's PredictionRecord built in C, field for field what the dataclass builds."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import pytest

from forestflow.predlog import _kafka_records
from forestflow.predlog.record import PredictionRecord, new_record
from tests.predlog.test_encode_golden import golden_records


@pytest.mark.parametrize("given", [9, 15, 19, 20])
def test_new_record_is_the_dataclass_built_positionally(given: int) -> None:
    for record in golden_records().values():
        values = [getattr(record, f.name) for f in dataclasses.fields(PredictionRecord)][:given]
        built = new_record(*values)
        assert type(built) is PredictionRecord
        assert built == PredictionRecord(*values)
        assert gc.is_tracked(built)  # it holds frames and dicts: the collector must see it


def test_new_record_refuses_too_many_or_too_few_fields() -> None:
    with pytest.raises(TypeError, match="at most 20 fields"):
        new_record(*range(21))
    with pytest.raises(TypeError, match="missing field 8"):
        new_record(*range(8))


def test_set_record_type_takes_only_writable_slots_of_the_class() -> None:
    class Plain:
        a = 1  # a class attribute, not a slot

    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int

    with pytest.raises(TypeError, match="not a writable slot"):
        _kafka_records.set_record_type(Plain, ("a",), (Plain,))
    with pytest.raises(AttributeError):
        _kafka_records.set_record_type(Slotted, ("b",), (Slotted,))
    bad: Any = ["a"]
    with pytest.raises(TypeError):
        _kafka_records.set_record_type(Slotted, bad, (Slotted,))
    with pytest.raises(ValueError):
        _kafka_records.set_record_type(Slotted, ("a",), ())
    # new_record still builds PredictionRecords: refused calls changed nothing.
    assert type(new_record(*range(9))) is PredictionRecord
