"""Pipeline definitions: AMD's TOML model/ensemble format, read and checked into a DAG of steps.

A definition is either AMD's simple one-model table (``name``, ``platform``, ``id``,
``[[inputs]]``, ``[[outputs]]``) or a list of ``[[models]]`` with ``[[models.inputs]]`` and
``[[models.outputs]]`` (each ``name``, ``datatype``, ``shape``, ``id``). Tensors are wired by id:
an output's ``id`` (its ``name`` when absent) feeds every input with that ``id``; an input whose
``id`` is empty or absent is the request column called ``name``. Unlike AMD's linear chains this
is a real DAG: steps are ordered by their dependencies, a tensor may feed several steps, and the
pipeline's outputs are the tensors no step consumes unless ``[pipeline] outputs = [...]`` names
them; ``[pipeline] log_intermediate = true`` adds the other tensors to prediction events. Shapes include
the batch axis (``[-1]`` one value per row, ``[-1, 4]`` a 4-vector per row).

Every problem is a :class:`CreateServableRequestInvalidError` (422) naming the step and tensor.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forestflow.core.frame import DATATYPES
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime.step_platforms import StepPlatform, platform_names, step_platform

#: AMD's datatype spellings that differ from the V2 names.
_DATATYPE_ALIASES = {"STRING": "BYTES", "FLOAT32": "FP32", "FLOAT64": "FP64", "FLOAT16": "FP16"}
#: Keys of a step table that are not options for its flavor (with a repository entry's deployment keys).
STEP_KEYS = _STEP_KEYS = frozenset(
    {"name", "platform", "id", "inputs", "outputs", "pipeline", "contract", "release", "servable_settings", "contract_settings"}
)


def _invalid(message: str) -> CreateServableRequestInvalidError:
    return CreateServableRequestInvalidError(message)


@dataclass(frozen=True, slots=True)
class Port:
    """One declared input or output of a step."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    #: The tensor id it reads or writes ("" on an input: the request column ``name``).
    id: str

    def describe(self, step: str, kind: str) -> str:
        """``step 'gbm' input 'AGE' (tensor 'age')``: how error messages name a port."""
        where = f"tensor {self.id!r}" if self.id else "from the request"
        return f"step {step!r} {kind} {self.name!r} ({where})"

    def as_json(self) -> dict[str, Any]:
        """The port as the flavor of its step receives it (``pipelineInputs``/``pipelineOutputs``)."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape), "id": self.id}


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step: which flavor runs it, on which artifact, with which ports and options."""

    name: str
    platform: str
    flavor: StepPlatform
    artifact: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def flavor_settings(self) -> dict[str, Any]:
        """The settings its flavor loads with: the options, the artifact and (for built-in steps) the declared ports."""
        settings = dict(self.options)
        if self.flavor.artifact_key is not None:
            settings[self.flavor.artifact_key] = self.artifact
        if self.flavor.takes_ports:
            settings["pipelineInputs"] = [p.as_json() for p in self.inputs]
            settings["pipelineOutputs"] = [p.as_json() for p in self.outputs]
            settings["stepName"] = self.name
        return settings


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """A checked definition: steps in dependency order, request inputs, final output tensor ids."""

    steps: tuple[StepSpec, ...]
    request_inputs: tuple[Port, ...]
    outputs: tuple[str, ...]
    #: tensor id -> (producing step, its output port)
    producers: dict[str, tuple[StepSpec, Port]]
    #: ``[pipeline] log_intermediate = true``: prediction events also carry the tensors between steps.
    log_intermediate: bool = False


def read_definition(directory: Path, file_name: str) -> PipelineSpec:
    """Read ``file_name`` in ``directory`` and check it (every artifact must be in the directory)."""
    base = directory.resolve()
    path = (base / file_name).resolve()
    if not path.is_relative_to(base):
        raise _invalid(f"definition {file_name!r} points outside the pipeline directory")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise _invalid(f"pipeline definition {file_name!r} not found in the pipeline directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _invalid(f"pipeline definition {file_name!r} cannot be read: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _invalid(f"pipeline definition {file_name!r} is not valid TOML: {exc}") from None
    return parse_definition(doc, base)


def parse_definition(doc: dict[str, Any], directory: Path) -> PipelineSpec:
    """Check a parsed TOML document and order its steps (see the module docstring)."""
    tables = doc.get("models")
    if tables is None:
        tables = [doc]  # AMD's simple one-model case
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise _invalid("pipeline definition: [[models]] must be a non-empty list of tables")
    steps = [_step(t, i, directory) for i, t in enumerate(tables)]
    names = [s.name for s in steps]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _invalid(f"pipeline definition: two steps are named {duplicate!r}")

    producers: dict[str, tuple[StepSpec, Port]] = {}
    for step in steps:
        for port in step.outputs:
            if port.id in producers:
                other = producers[port.id][0].name
                raise _invalid(
                    f"{port.describe(step.name, 'output')}: tensor id {port.id!r} is already produced by step {other!r}"
                )
            producers[port.id] = (step, port)

    consumed: set[str] = set()
    request: dict[str, Port] = {}
    for step in steps:
        for port in step.inputs:
            if not port.id:
                _check_request_input(step, port, request)
                continue
            if port.id not in producers:
                raise _invalid(f"{port.describe(step.name, 'input')}: no step produces tensor {port.id!r}")
            producer, out = producers[port.id]
            _check_compatible(step, port, producer, out)
            consumed.add(port.id)

    ordered = _dependency_order(steps, producers)
    outputs = _pipeline_outputs(doc, steps, producers, consumed)
    log_intermediate = doc.get("pipeline", {}).get("log_intermediate", False)
    if not isinstance(log_intermediate, bool):
        raise _invalid("[pipeline] log_intermediate must be true or false")
    return PipelineSpec(tuple(ordered), tuple(request.values()), outputs, producers, log_intermediate)


def _step(table: dict[str, Any], index: int, directory: Path) -> StepSpec:
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise _invalid(f"models[{index}]: name required (a string)")
    platform = table.get("platform")
    if not isinstance(platform, str) or not platform:
        raise _invalid(f"step {name!r}: platform required; supported: {', '.join(platform_names())}")
    flavor = step_platform(platform)
    if flavor is None:
        raise _invalid(f"step {name!r}: unknown platform {platform!r}; supported: {', '.join(platform_names())}")
    artifact = table.get("id", "")
    if not isinstance(artifact, str):
        raise _invalid(f"step {name!r}: id must be the artifact's file name (a string)")
    if flavor.artifact_key is not None:
        if not artifact:
            raise _invalid(f"step {name!r}: id required (the {platform} artifact file in the pipeline directory)")
        path = (directory / artifact).resolve()
        if not path.is_relative_to(directory):
            raise _invalid(f"step {name!r}: artifact {artifact!r} points outside the pipeline directory")
        if not path.is_file():
            raise _invalid(f"step {name!r}: artifact {artifact!r} not found in the pipeline directory")
    inputs = _ports(table.get("inputs", []), name, "input")
    outputs = _ports(table.get("outputs", []), name, "output")
    if not outputs:
        raise _invalid(f"step {name!r}: declares no [[models.outputs]]")
    options = {k: v for k, v in table.items() if k not in _STEP_KEYS}
    return StepSpec(name, platform, flavor, artifact, inputs, outputs, options)


def _ports(items: Any, step: str, kind: str) -> tuple[Port, ...]:
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _invalid(f"step {step!r}: [[models.{kind}s]] must be a list of tables")
    ports = []
    for i, item in enumerate(items):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(f"step {step!r} {kind} #{i}: name required (a string)")
        datatype = str(item.get("datatype", "FP64")).upper()
        datatype = _DATATYPE_ALIASES.get(datatype, datatype)
        if datatype not in DATATYPES:
            raise _invalid(f"step {step!r} {kind} {name!r}: unknown datatype {item.get('datatype')!r}")
        shape = item.get("shape", [-1])
        if (
            not isinstance(shape, list)
            or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)
        ):
            raise _invalid(
                f"step {step!r} {kind} {name!r}: shape must be a list of sizes with the batch axis first, e.g. [-1] or [-1, 4]"
            )
        tensor_id = item.get("id", "")
        if not isinstance(tensor_id, str):
            raise _invalid(f"step {step!r} {kind} {name!r}: id must be a string")
        if kind == "output" and not tensor_id:
            tensor_id = name
        ports.append(Port(name, datatype, tuple(shape), tensor_id))
    names = [p.name for p in ports]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _invalid(f"step {step!r}: two {kind}s are named {duplicate!r}")
    return tuple(ports)


def _shapes_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _check_compatible(step: StepSpec, port: Port, producer: StepSpec, out: Port) -> None:
    if port.datatype != out.datatype:
        raise _invalid(
            f"{port.describe(step.name, 'input')}: datatype {port.datatype} but step {producer.name!r} "
            f"produces it as {out.datatype}"
        )
    if not _shapes_match(port.shape, out.shape):
        raise _invalid(
            f"{port.describe(step.name, 'input')}: shape {list(port.shape)} but step {producer.name!r} "
            f"produces it as {list(out.shape)}"
        )


def _check_request_input(step: StepSpec, port: Port, request: dict[str, Port]) -> None:
    """Steps that read the same request column must agree on its datatype and shape."""
    seen = request.setdefault(port.name, port)
    if seen.datatype != port.datatype or not _shapes_match(seen.shape, port.shape):
        raise _invalid(
            f"{port.describe(step.name, 'input')}: declared {port.datatype} {list(port.shape)} but another step "
            f"reads request column {port.name!r} as {seen.datatype} {list(seen.shape)}"
        )


def _dependency_order(steps: list[StepSpec], producers: dict[str, tuple[StepSpec, Port]]) -> list[StepSpec]:
    """Steps ordered so every step runs after the steps it reads from (definition order otherwise)."""
    needs = {s.name: {producers[p.id][0].name for p in s.inputs if p.id} for s in steps}
    done: list[StepSpec] = []
    finished: set[str] = set()
    remaining = list(steps)
    while remaining:
        ready = [s for s in remaining if needs[s.name] <= finished]
        if not ready:
            raise _invalid(_describe_cycle(remaining, producers))
        for s in ready:
            done.append(s)
            finished.add(s.name)
        remaining = [s for s in remaining if s.name not in finished]
    return done


def _describe_cycle(remaining: list[StepSpec], producers: dict[str, tuple[StepSpec, Port]]) -> str:
    """Name one cycle among the steps that could not be ordered, with the tensors that close it."""
    by_name = {s.name: s for s in remaining}
    step = remaining[0]
    path: list[tuple[str, str]] = []  # (step, tensor it reads from the next step in the walk)
    seen: dict[str, int] = {}
    while step.name not in seen:
        seen[step.name] = len(path)
        port = next(p for p in step.inputs if p.id and producers[p.id][0].name in by_name)
        path.append((step.name, port.id))
        step = by_name[producers[port.id][0].name]
    loop = path[seen[step.name] :]
    chain = " <- ".join(f"step {name!r} (reads tensor {tensor!r})" for name, tensor in loop)
    return f"pipeline definition has a cycle: {chain} <- step {loop[0][0]!r}"


def _pipeline_outputs(
    doc: dict[str, Any], steps: list[StepSpec], producers: dict[str, tuple[StepSpec, Port]], consumed: set[str]
) -> tuple[str, ...]:
    section = doc.get("pipeline", {})
    if not isinstance(section, dict):
        raise _invalid("[pipeline] must be a table")
    named = section.get("outputs")
    if named is None:
        return tuple(p.id for s in steps for p in s.outputs if p.id not in consumed)
    if not isinstance(named, list) or not named or not all(isinstance(n, str) for n in named):
        raise _invalid("[pipeline] outputs must be a non-empty list of tensor ids")
    for tensor in named:
        if tensor not in producers:
            raise _invalid(f"[pipeline] outputs: no step produces tensor {tensor!r}")
    return tuple(named)
