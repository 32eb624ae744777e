"""Message classes and enums from a compiled FileDescriptorSet, through protobuf's public API only."""

from __future__ import annotations

from importlib import resources
from typing import Any

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message_factory


def load_file(package_module: str, binpb_name: str) -> descriptor.FileDescriptor:
    """Add the one file of the descriptor set ``binpb_name`` (beside ``package_module``) to the default pool."""
    package = package_module.rpartition(".")[0]
    data = resources.files(package).joinpath(binpb_name).read_bytes()
    (file,) = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return descriptor_pool.Default().AddSerializedFile(file.SerializeToString())


def message(file: descriptor.FileDescriptor, name: str) -> Any:
    """The message class of the top-level message ``name`` (typed Any: its fields exist only at run time)."""
    return message_factory.GetMessageClass(file.message_types_by_name[name])


class Enum:
    """A protobuf enum's names and numbers (what generated code's EnumTypeWrapper offers that we use)."""

    def __init__(self, enum: descriptor.EnumDescriptor) -> None:
        self.DESCRIPTOR = enum
        self._numbers: dict[str, int] = {value.name: value.number for value in enum.values}
        self._names: dict[int, str] = {number: name for name, number in self._numbers.items()}

    def Value(self, name: str) -> int:  # noqa: N802 (protobuf's own spelling)
        """The number of the value called ``name``."""
        try:
            return self._numbers[name]
        except KeyError:
            raise ValueError(f"enum {self.DESCRIPTOR.full_name} has no value named {name!r}") from None

    def Name(self, number: int) -> str:  # noqa: N802
        """The name of the value numbered ``number``."""
        try:
            return self._names[number]
        except KeyError:
            raise ValueError(f"enum {self.DESCRIPTOR.full_name} has no value numbered {number}") from None
