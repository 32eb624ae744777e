"""Routers: pick ONE servable per request batch, by phase-in weight.

The pick is ForestFlow's deterministic "read-fast weighted collection": the current item keeps
answering until its lifetime share of picks exceeds its share of the weight, then the index moves
on. Over 1,000 picks, weights 100/30 give exactly 769/231. The state (counters, index) is plain
data so it survives evaluation and restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forestflow.core.policies import RouterType, ServableMetrics, recency_key


@dataclass(slots=True)
class _Item:
    key: str
    weight: int
    served: int = 0


@dataclass(slots=True)
class WeightedPicker:
    """Deterministic weighted round-robin over (key, weight) items."""

    items: list[_Item] = field(default_factory=list)
    index: int = 0
    elements_served: int = 0

    @property
    def total_weight(self) -> int:
        """Sum of the weights."""
        return sum(item.weight for item in self.items)

    def keys(self) -> list[str]:
        """The item keys in pick order."""
        return [item.key for item in self.items]

    def next(self) -> str | None:
        """The key that answers the next request (None with no items)."""
        if not self.items:
            return None
        if self.index >= len(self.items):
            self.index = 0
        self.elements_served += 1
        item = self.items[self.index]
        item.served += 1
        total = self.total_weight
        # All-zero weights: everything goes to the first item (ForestFlow's behaviour).
        if total > 0 and item.served * total > item.weight * self.elements_served:
            self.index = (self.index + 1) % len(self.items)
        return item.key

    def reweighted(self, weights: list[tuple[str, int]]) -> WeightedPicker:
        """The picker for a new list of weights.

        The same set of keys keeps its cumulative counters (items re-sorted by weight, index
        reset), as ForestFlow's merge; a different set starts fresh in the given order.
        """
        if sorted(k for k, _ in weights) != sorted(self.keys()):
            return WeightedPicker([_Item(k, w) for k, w in weights])
        served = {item.key: item.served for item in self.items}
        new_weights = dict(weights)
        if [(i.key, i.weight) for i in self.items] == [(k, new_weights[k]) for k in self.keys()]:
            return self  # nothing changed: keep the index where it is
        items = sorted((_Item(k, w, served[k]) for k, w in weights), key=lambda i: i.weight)
        return WeightedPicker(items, 0, self.elements_served)

    def without(self, key: str) -> WeightedPicker:
        """The picker without ``key`` (a release leaving routing); the others keep their counters."""
        if key not in self.keys():
            return self
        items = [_Item(i.key, i.weight, i.served) for i in self.items if i.key != key]
        return WeightedPicker(items, 0, sum(i.served for i in items))

    def to_state(self) -> dict[str, Any]:
        """Plain-data form for persistence."""
        return {
            "items": [[i.key, i.weight, i.served] for i in self.items],
            "index": self.index,
            "elementsServed": self.elements_served,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> WeightedPicker:
        """Inverse of :meth:`to_state`."""
        items = [_Item(str(k), int(w), int(s)) for k, w, s in state.get("items", [])]
        return cls(items, int(state.get("index", 0)), int(state.get("elementsServed", 0)))


def router_weights(router: RouterType, survivors: dict[str, ServableMetrics]) -> list[tuple[str, int]]:
    """(key, weight) of the servables that receive user traffic, in ForestFlow's order.

    Fair: every survivor, weight = phase-in %. Latest: the newest valid servable alone once it is
    at 100 %, otherwise it and the previous one weighted by their phase-in %. The bandits route
    among the same releases as Fair (their phase-in % caps their share).
    """
    if router is not RouterType.LATEST:
        ordered = sorted(survivors, key=lambda k: recency_key(survivors[k]))
        return [(k, survivors[k].current_phase_in_pct) for k in ordered]
    newest_first = sorted(survivors, key=lambda k: recency_key(survivors[k]), reverse=True)[:2]
    if not newest_first:
        return []
    latest = newest_first[0]
    if survivors[latest].current_phase_in_pct >= 100 or len(newest_first) == 1:
        return [(latest, survivors[latest].current_phase_in_pct)]
    previous = newest_first[1]
    return [(previous, survivors[previous].current_phase_in_pct), (latest, survivors[latest].current_phase_in_pct)]
