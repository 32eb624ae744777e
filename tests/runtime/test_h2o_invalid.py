"""Malformed H2O MOJOs, crafted from the committed fixtures: the reader refuses each one naming the
file in the MOJO and what is wrong (the servable: a 422 naming the MOJO, never handed to genmodel),
and the C kernel refuses tables and parameters that would take its walk out of bounds or round a
cycle, even when they never went through the reader."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime import _h2o_trees
from forestflow.runtime.h2o_mojo import H2OMojoServable
from forestflow.runtime.h2o_native import NativeTreeScorer
from forestflow.runtime.h2o_tree_reader import InvalidMojo, flatten_trees, read_tree_model
from tests.runtime.test_h2o_mojo import FIXTURES, FQ
from tests.runtime.test_h2o_native import edited_mojo

BINOMIAL = "prostate_gbm_binomial.zip"
TREE = "trees/t00_000.bin"  # its root is a numeric split whose left-subtree size is the byte at 8


def _byte(at: int, value: int) -> Callable[[bytes], bytes]:
    return lambda blob: blob[:at] + bytes([value]) + blob[at + 1 :]


def exploding_tree(depth: int = 18) -> bytes:
    """``depth`` numeric splits whose left subtrees all have size 0, then one leaf: read naively,
    both children of every split are the rest of the bytes (169 bytes -> 2^19 - 1 nodes)."""
    split = b"\x00\x00\x00\x00" + struct.pack("<f", 0.5) + b"\x00"
    return split * depth + b"\x00\xff\xff" + struct.pack("<f", 1.0)


#: name -> (source, model.ini edit, tree edit, what the refusal says)
BAD: dict[str, tuple[str, Callable[[str], str] | None, Callable[[bytes], bytes] | None, str]] = {
    "bernoulli with one class": (
        BINOMIAL,
        lambda ini: ini.replace("n_classes = 2", "n_classes = 1"),
        None,
        "a Binomial model needs n_classes = 2, it says n_classes = 1",
    ),
    "bernoulli in a Regression model": (
        BINOMIAL,
        lambda ini: ini.replace("category = Binomial", "category = Regression").replace("n_classes = 2", "n_classes = 1"),
        None,
        "distribution = bernoulli does not fit category = Regression",
    ),
    "a Regression DRF of three classes": (
        "prostate_drf_regression.zip",
        lambda ini: ini.replace("n_classes = 1", "n_classes = 3"),
        None,
        "a Regression model needs n_classes = 1",
    ),
    "fewer classes than trees per class": (
        "prostate_gbm_multinomial4.zip",
        lambda ini: ini.replace("n_classes = 4", "n_classes = 3"),
        None,
        "n_trees_per_class = 4 does not fit 3 classes",
    ),
    "a negative class count": (BINOMIAL, lambda ini: ini.replace("n_classes = 2", "n_classes = -2"), None, "n_classes"),
    "an endless tree count": (
        BINOMIAL,
        lambda ini: ini.replace("n_trees = 25", "n_trees = 99999999999999"),
        None,
        "n_trees = '99999999999999' is not a count",
    ),
    "a left subtree of size 0": (BINOMIAL, None, _byte(8, 0), f"{TREE}: a node's left-subtree size does not match"),
    "a child past the end": (BINOMIAL, None, _byte(8, 255), f"{TREE}: a tree's node points past its end"),
    "bytes after the tree": (BINOMIAL, None, lambda blob: blob + b"\0\0\0\0", f"{TREE}: 4 bytes after the tree's last node"),
    "a truncated tree": (BINOMIAL, None, lambda blob: blob[:-3], f"{TREE}: a tree's node runs past its end"),
    "an exploding tree": (BINOMIAL, None, lambda blob: exploding_tree(), f"{TREE}: a node's left-subtree size does not match"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_malformed_mojo_is_refused_naming_the_file_and_the_fault(tmp_path: Path, case: str) -> None:
    source, ini, tree, reason = BAD[case]
    mojo = edited_mojo(tmp_path, source, ini, {TREE: tree} if tree else None, name="crafted.zip")
    started = time.monotonic()
    with pytest.raises(InvalidMojo) as caught:
        read_tree_model(tmp_path / mojo)
    assert reason in str(caught.value)
    assert time.monotonic() - started < 5  # the exploding tree flattened for seconds into 2^19 nodes
    for scorer in ("auto", "native"):  # auto does not hand a malformed file to genmodel either
        servable = H2OMojoServable(FQ, tmp_path, {"mojoPath": mojo, "scorer": scorer})
        with pytest.raises(CreateServableRequestInvalidError, match=f"MOJO file 'crafted.zip' is invalid: .*{reason[-20:]}"):
            servable.load()
        assert not servable.ready


def test_an_exploding_tree_is_refused_before_it_is_expanded() -> None:
    blob = exploding_tree()
    assert len(blob) == 169
    with pytest.raises(InvalidMojo, match="tree 0: a node's left-subtree size does not match"):
        flatten_trees([0], [blob])


def _scorer_tables() -> tuple[NativeTreeScorer, dict[str, np.ndarray]]:
    scorer = NativeTreeScorer(read_tree_model(FIXTURES / BINOMIAL))
    names = ("nodes", "values", "bits", "roots", "target", "dom_len", "params", "prior", "model_distrib")
    return scorer, {name: getattr(scorer, f"_{name}").copy() for name in names}


def _score(scorer: NativeTreeScorer, tables: dict[str, np.ndarray], width: int | None = None) -> np.ndarray:
    n, w = 2, width or scorer.preds_size
    preds = np.zeros((n, w))
    _h2o_trees.score(np.zeros((n, scorer.n_features)), np.zeros(n), *tables.values(), preds, np.zeros(n, dtype=np.uint8))
    return preds


def test_the_kernel_checks_the_tables_it_scores_with() -> None:
    """score() is the last line: tables that never passed check_tables() are refused, not walked."""
    scorer, tables = _scorer_tables()
    assert _score(scorer, tables).shape == (2, 3)
    split = int(np.flatnonzero(tables["nodes"][:, 0] == 1)[0])

    def refused(column: int, value: int, match: str) -> None:
        bad = dict(tables, nodes=tables["nodes"].copy())
        bad["nodes"][split, column] = value
        with pytest.raises(ValueError, match=match):
            _score(scorer, bad)
        with pytest.raises(ValueError, match=match):
            _h2o_trees.check_tables(bad["nodes"], bad["values"], bad["bits"], bad["roots"], bad["target"], scorer.n_features, 3)

    refused(3, split, "does not come after it")  # the left child is the node itself: a walk never ends
    refused(4, split - 1 if split else split, "does not come after it")
    refused(3, len(tables["nodes"]), "refers outside")
    refused(1, scorer.n_features, "refers outside")  # a column past the row
    refused(1, -1, "refers outside")
    refused(0, 9, "refers outside")  # an unknown node kind
    bitset = dict(tables, nodes=tables["nodes"].copy())
    bitset["nodes"][split, 0], bitset["nodes"][split, 5] = 2, -1  # a bitset split without a bitset
    with pytest.raises(ValueError, match="refers outside"):
        _score(scorer, bitset)
    bitset["nodes"][split, 5], bitset["nodes"][split, 7] = 0, 8 * len(tables["bits"]) + 1  # one past its bytes
    with pytest.raises(ValueError, match="refers outside"):
        _score(scorer, bitset)
    roots = dict(tables, roots=tables["roots"].copy())
    roots["roots"][-1] = len(tables["nodes"])
    with pytest.raises(ValueError, match="root or target"):
        _score(scorer, roots)


@pytest.mark.parametrize(
    ("slot", "value", "width"),
    [
        (4, 1.0, 3),  # a binomial GBM of one class
        (4, 2.0, 2),  # a binomial GBM written into rows of 2: p[2] past the row
        (4, 3.0, 3),  # three classes in rows of 3
        (4, float("nan"), 3),
        (4, 1e300, 3),
        (0, 7.0, 3),  # an unknown algorithm
        (1, -1.0, 3),  # an unknown family
        (2, 4.0, 3),  # an unknown link
        (9, 3.0, 3),  # an unknown tree version
    ],
)
def test_the_kernel_checks_the_family_against_the_prediction_width(slot: int, value: float, width: int) -> None:
    scorer, tables = _scorer_tables()
    tables["params"][slot] = value
    with pytest.raises(ValueError, match="score\\(\\): (the prediction width|unknown algorithm|a tree's root or target)"):
        _score(scorer, tables, width)
