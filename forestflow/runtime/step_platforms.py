"""Pipeline step platforms: the names a TOML pipeline step gives (``h2o_mojo``, ``python``, ``map``...)
and the flavor each becomes. Plain data, below the flavors: pipeline definitions read it without
importing any flavor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepPlatform:
    """How a pipeline step of a ``platform`` (AMD's TOML name) becomes a servable of a flavor.

    ``artifact_key`` is the flavor setting that receives the step's ``id`` (the artifact file);
    None for built-in steps without an artifact. ``gate`` names the gateway setting that must be on
    (e.g. ``allow_python``) before a step of this platform may load. ``takes_ports``: the flavor
    reads the step's declared ports (``pipelineInputs``/``pipelineOutputs`` settings); model
    flavors do not, and some refuse settings they do not know.
    """

    flavor: str
    artifact_key: str | None
    gate: str | None = None
    takes_ports: bool = False


_PLATFORMS: dict[str, StepPlatform] = {}


def register_platform(platform: str, step: StepPlatform) -> None:
    """Let pipeline steps name a flavor by its platform (``h2o_mojo``, ``python``, ``map``...)."""
    _PLATFORMS[platform] = step


def step_platform(platform: str) -> StepPlatform | None:
    """The flavor behind a step platform, None if unknown."""
    return _PLATFORMS.get(platform)


def platform_names() -> list[str]:
    """Every platform a pipeline step may name."""
    return sorted(_PLATFORMS)


register_platform("h2o_mojo", StepPlatform("H2OMojo", "mojoPath"))
register_platform("python", StepPlatform("Python", "modulePath", gate="allow_python"))
register_platform("map", StepPlatform("Map", None, takes_ports=True))
register_platform("classifier", StepPlatform("Classifier", None, takes_ports=True))
register_platform("regressor", StepPlatform("Regressor", None, takes_ports=True))
register_platform("image_decode", StepPlatform("ImageDecode", None, takes_ports=True))
register_platform("image_encode", StepPlatform("ImageEncode", None, takes_ports=True))
register_platform("onnx", StepPlatform("ONNX", "modelPath"))
register_platform("remote_v2", StepPlatform("RemoteV2", None))
