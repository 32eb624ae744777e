"""What a reader gives the servable: the forest, the model's inputs and what its outputs mean."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forestflow.runtime.trees.forest import Forest


@dataclass(frozen=True, slots=True)
class Feature:
    """One model input column: its name, and whether it is categorical (with its category names, if stored)."""

    name: str
    categorical: bool = False
    categories: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TreeModel:
    """A read model: ``classes`` is None for a regressor. A binary model whose forest gives one
    probability (``forest.n_groups == 1``) has it for the second class."""

    forest: Forest
    features: list[Feature]
    classes: tuple[str, ...] | None
    #: What the metadata shows about the model (library, objective, trees, ...).
    facts: dict[str, Any] = field(default_factory=dict)
