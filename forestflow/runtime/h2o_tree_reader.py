"""Reads H2O GBM and DRF MOJOs (zip files) with the standard library, for the native scorer.

A MOJO holds ``model.ini`` (an ``[info]`` section of ``key = value`` lines, the ``[columns]``
and the ``[domains]`` that name one ``domains/dNNN.txt`` file per categorical column) and one
compressed tree per class and tree group, ``trees/tCC_GGG.bin``. This module parses them as
genmodel's ``ModelMojoReader`` / ``SharedTreeMojoReader`` do and flattens every tree, as
genmodel's ``SharedTreeMojoModel.scoreTree`` walks it, into a table of nodes (numpy arrays) that
``h2o_native`` scores in compiled code.

A compressed tree node is: node type (1 byte: bits 0-1 and 4-5 describe the left child, bits
2-3 the split kind, bits 6-7 the right child), column (2 bytes, 65535 = the tree is one leaf),
NA direction (1 byte), then a float32 split value or a categorical bitset (4 inline bytes, or
a bit offset, a bit count and the bits), then the byte size of the left subtree (1-4 bytes)
unless the left child is a leaf, then the left child, then the right child. A leaf is a float32.
All numbers are little-endian.
"""

from __future__ import annotations

import math
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Node kinds in the flattened table.
LEAF, NUMERIC, BITSET, NA_VS_REST = 0, 1, 2, 3
#: genmodel's ``NaSplitDir`` values that send NAs left (``NALeft``, ``Left``) and "NA vs rest".
_NA_LEFT = (2, 4)
_NA_VS_REST = 1
#: Highest MOJO version of the tree format this reader knows (genmodel 3.46 writes 1.40).
MAX_MOJO_VERSION = 1.40
#: Most nodes the trees of one model may flatten into (the C walk indexes them with int32; each
#: costs ~100 bytes while flattening). Well-formed trees have at most one node per 4 bytes.
MAX_NODES = 1 << 24
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class NativeUnsupported(Exception):
    """This MOJO cannot be scored natively; the message says why (it may still score in the JVM)."""


class InvalidMojo(ValueError):
    """The MOJO is malformed or contradicts itself; the message names the file in it and what is wrong."""


def _java_lines(text: str) -> list[str]:
    """Lines as Java's ``BufferedReader.readLine`` returns them (no empty last line)."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _unescape_newlines(text: str) -> str:
    """genmodel's ``StringEscapeUtils.unescapeNewlines``: ``\\n``, ``\\r``, ``\\\\``; any other ``\\x`` -> ``x``."""
    if "\\" not in text:
        return text
    out, slash = [], False
    for ch in text:
        if slash:
            out.append({"n": "\n", "r": "\r"}.get(ch, ch))
            slash = False
        elif ch == "\\":
            slash = True
        else:
            out.append(ch)
    return "".join(out)


def parse_model_ini(text: str) -> tuple[dict[str, str], list[str], dict[int, str]]:
    """``([info] key -> raw value, [columns], [domains] column index -> "count file")``."""
    info: dict[str, str] = {}
    columns: list[str] = []
    domains: dict[int, str] = {}
    section = ""
    for raw in _java_lines(text):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line in ("[info]", "[columns]", "[domains]"):
            section = line
        elif section == "[info]":
            key, _, value = re.split(r"\s*(=)\s*", line, maxsplit=1) if "=" in line else (line, "", "")
            info[key] = value
        elif section == "[columns]":
            columns.append(line)
        elif section == "[domains]":
            index, _, ref = re.split(r"(:)\s*", line, maxsplit=1)
            domains[int(index)] = ref
    return info, columns, domains


def _value(info: dict[str, str], key: str, default: Any = None) -> Any:
    """A typed ``[info]`` value: null, booleans, numbers and ``[a, b]`` lists as Python values."""
    raw = info.get(key)
    if raw is None or raw == "null":
        return default
    if raw in ("true", "false"):
        return raw == "true"
    if raw.startswith("[") and raw.endswith("]"):
        body = raw[1:-1].strip()
        return [float(v) for v in body.split(",")] if body else []
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


@dataclass
class TreeTable:
    """Every tree of a model flattened into one node table (parallel arrays, one entry per node)."""

    kind: np.ndarray  # int8: LEAF, NUMERIC, BITSET, NA_VS_REST
    column: np.ndarray  # int32: the feature a split reads
    na_left: np.ndarray  # bool: NAs (and out-of-range levels) go left
    split: np.ndarray  # float64: numeric threshold (float32 widened); leaves: the leaf value
    left: np.ndarray  # int32: node index of the left child
    right: np.ndarray  # int32: node index of the right child
    bits_start: np.ndarray  # int32: byte offset in ``bits`` of the bitset in effect at this node, -1 none
    bits_offset: np.ndarray  # int32: the bitset's first level (genmodel's bitoff)
    bits_count: np.ndarray  # int32: how many levels it covers (genmodel's nbits)
    bits: np.ndarray  # uint8: every bitset's bytes
    roots: np.ndarray  # int32: the root node of each scored tree
    target: np.ndarray  # int32: the prediction slot each tree adds to


@dataclass
class TreeModel:
    """What the native scorer needs from a GBM or DRF MOJO."""

    algo: str  # "gbm" or "drf"
    category: str  # Regression, Binomial, Multinomial
    mojo_version: float
    h2o_version: str
    uuid: str | None
    columns: list[str]  # every column; the response last when supervised
    domains: list[tuple[str, ...] | None]  # per column
    n_features: int
    supervised: bool
    n_classes: int
    n_tree_groups: int
    n_trees_per_group: int
    offset_column: str | None
    balance_classes: bool
    default_threshold: float
    prior_class_distrib: list[float] | None
    model_class_distrib: list[float] | None
    distribution: str  # GBM only ("" for DRF)
    link: str  # GBM only ("" for DRF)
    init_f: float
    binomial_double_trees: bool
    trees: TreeTable
    info: dict[str, str] = field(repr=False, default_factory=dict)
    #: Each tree's ``trees/tCC_GGG_aux.bin`` (node weights, for explanations), in ``trees.roots`` order;
    #: None where the MOJO has none.
    aux: list[bytes | None] = field(repr=False, default_factory=list)

    @property
    def response(self) -> str | None:
        """The response column (genmodel: the last column of a supervised model)."""
        return self.columns[-1] if self.supervised else None

    @property
    def preds_size(self) -> int:
        return 1 if self.category == "Regression" else self.n_classes + 1


# GBM distributions scored natively; others (custom, ordinal, ...) stay on genmodel.
_BINOMIAL_FAMILIES = ("bernoulli", "quasibinomial", "modified_huber")
_REGRESSION_FAMILIES = ("gaussian", "poisson", "gamma", "tweedie", "laplace", "quantile", "huber")
_DEFAULT_LINK = {
    "bernoulli": "logit",
    "quasibinomial": "logit",
    "modified_huber": "logit",
    "fractionalbinomial": "logit",
    "multinomial": "log",
    "poisson": "log",
    "gamma": "log",
    "tweedie": "log",
}
LINKS = ("identity", "log", "logit", "inverse")


def read_tree_model(path: str | Path) -> TreeModel:
    """Parse a GBM/DRF MOJO; :class:`NativeUnsupported` for anything else the native scorer cannot do,
    :class:`InvalidMojo` for a file that is malformed or contradicts itself (nothing of it is scored)."""
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        try:
            info, columns, domain_refs = parse_model_ini(zf.read("model.ini").decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidMojo(f"model.ini: {exc}") from None
        algo = info.get("algo", "")
        if algo not in ("gbm", "drf"):
            raise NativeUnsupported(f"the native scorer handles GBM and DRF MOJOs, not {algo or 'this model'!r}")
        category = info.get("category", "")
        if category not in ("Regression", "Binomial", "Multinomial"):
            raise NativeUnsupported(f"the native scorer does not handle {category} {algo.upper()} models")
        version = _number(info, "mojo_version", 0.0)
        if version > MAX_MOJO_VERSION:
            raise NativeUnsupported(f"MOJO version {version} is newer than the native scorer knows ({MAX_MOJO_VERSION})")
        if version >= 1.40 and info.get("_genmodel_encoding", "AUTO") not in ("AUTO", "Enum", "SortByResponse"):
            raise NativeUnsupported(f"categorical encoding {info['_genmodel_encoding']} is done by genmodel")
        if info.get("calib_method") not in (None, "null"):
            raise NativeUnsupported("calibrated MOJOs (calib_method) are left to genmodel")
        if info.get("endianness", "LITTLE_ENDIAN") != "LITTLE_ENDIAN":
            raise NativeUnsupported("big-endian MOJOs are not supported")
        if info.get("treatment_column") not in (None, "null"):
            raise NativeUnsupported("uplift models are left to genmodel")
        n_columns = _count(info, "n_columns", len(columns))
        if len(columns) != n_columns:
            raise InvalidMojo(f"model.ini lists {len(columns)} columns, n_columns says {n_columns}")
        escape = _value(info, "escape_domain_values", False) is True
        domains: list[tuple[str, ...] | None] = [None] * n_columns
        for index, ref in domain_refs.items():
            if index >= n_columns:
                continue
            count, _, file = ref.partition(" ")
            if f"domains/{file}" not in names:
                raise InvalidMojo(f"model.ini names domain file domains/{file}, which the MOJO lacks")
            try:
                lines = _java_lines(zf.read(f"domains/{file}").decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidMojo(f"domains/{file}: {exc}") from None
            if escape:
                lines = [_unescape_newlines(v) for v in lines]
            if not count.isdigit() or len(lines) != int(count):
                raise InvalidMojo(f"domain file domains/{file} has {len(lines)} levels, model.ini says {count}")
            domains[index] = tuple(lines)

        n_classes = _count(info, "n_classes", 1)
        groups = _count(info, "n_trees", 0)
        bdt = bool(_value(info, "binomial_double_trees", False))
        per_group = _count(info, "n_trees_per_class", 1 if n_classes == 2 and not bdt else n_classes)
        _check_family(algo, category, n_classes, str(info.get("distribution", "")))
        distribution = link = ""
        init_f = 0.0
        if algo == "gbm":
            distribution = str(info.get("distribution", ""))
            if distribution not in _BINOMIAL_FAMILIES + _REGRESSION_FAMILIES + ("multinomial",):
                raise NativeUnsupported(f"GBM distribution {distribution!r} is left to genmodel")
            link = str(_value(info, "link_function", None) or _DEFAULT_LINK.get(distribution, "identity"))
            if link not in LINKS:
                raise NativeUnsupported(f"link function {link!r} is left to genmodel")
            init_f = _number(info, "init_f", 0.0)
        blobs = _tree_files(zf, names, groups, per_group)
        aux_names = [name[: -len(".bin")] + "_aux.bin" for _, _, name, _ in blobs]
        aux = [zf.read(name) if name in names else None for name in aux_names]
        offset_col = _value(info, "offset_column", None)
        tree_version = 0 if version == 1.0 else (1 if version == 1.1 else 2)
        width = 1 if category == "Regression" else n_classes + 1
        targets = [(0 if n_classes == 1 else 1) + c for _, c, _, _ in blobs]
        if targets and max(targets) >= width:
            raise InvalidMojo(f"n_trees_per_class = {per_group} does not fit {n_classes} classes")
        table = flatten_trees(targets, [b for _, _, _, b in blobs], tree_version, [name for _, _, name, _ in blobs])
        n_features = _count(info, "n_features", n_columns)
        if not 0 < n_features <= n_columns:
            raise InvalidMojo(f"n_features = {n_features} with {n_columns} columns")
        # The compiled walk does not check bounds: every index it will follow is checked here.
        splits = table.kind != LEAF
        if splits.any() and int(table.column[splits].max()) >= n_features:
            raise InvalidMojo(f"a tree splits on column {int(table.column[splits].max())}, the model has {n_features} features")
        supervised = _value(info, "supervised", False) is True
        if category != "Regression" and supervised and domains[-1] is not None and len(domains[-1]) != n_classes:
            raise InvalidMojo(f"the response has {len(domains[-1])} levels, n_classes says {n_classes}")
        distribs = {key: _value(info, key) for key in ("prior_class_distrib", "model_class_distrib")}
        for key, distrib in distribs.items():
            if distrib is not None and (not isinstance(distrib, list) or len(distrib) != n_classes):
                raise InvalidMojo(f"{key} does not hold one number per class ({n_classes})")
        return TreeModel(
            algo=algo,
            category=category,
            mojo_version=version,
            h2o_version=str(info.get("h2o_version", "unknown")),
            uuid=info.get("uuid"),
            columns=columns,
            domains=domains,
            n_features=n_features,
            supervised=supervised,
            n_classes=n_classes,
            n_tree_groups=groups,
            n_trees_per_group=per_group,
            offset_column=str(offset_col) if offset_col is not None else None,
            balance_classes=bool(_value(info, "balance_classes", False)),
            default_threshold=_number(info, "default_threshold", 0.5),
            prior_class_distrib=distribs["prior_class_distrib"],
            model_class_distrib=distribs["model_class_distrib"],
            distribution=distribution,
            link=link,
            init_f=init_f,
            binomial_double_trees=bdt,
            trees=table,
            info=info,
            aux=aux,
        )


def _number(info: dict[str, str], key: str, default: float) -> float:
    """A finite number from ``[info]``; InvalidMojo naming the key otherwise."""
    value = _value(info, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidMojo(f"model.ini: {key} = {info.get(key)!r} is not a finite number")
    return float(value)


def _count(info: dict[str, str], key: str, default: int) -> int:
    """A whole number from ``[info]`` in 0..2^31; InvalidMojo naming the key otherwise."""
    value = _value(info, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise InvalidMojo(f"model.ini: {key} = {info.get(key)!r} is not a count")
    return value


def _check_family(algo: str, category: str, n_classes: int, distribution: str) -> None:
    """InvalidMojo unless the category, the class count and (GBM) the distribution agree: the scorer
    writes one prediction slot per class, and a bernoulli model of one class wrote past its row."""
    expected = {"Regression": "n_classes = 1", "Binomial": "n_classes = 2", "Multinomial": "n_classes >= 2"}[category]
    if (category == "Regression") != (n_classes == 1) or (category == "Binomial" and n_classes != 2):
        raise InvalidMojo(f"model.ini: a {category} model needs {expected}, it says n_classes = {n_classes}")
    if algo != "gbm":
        return
    wanted = "Binomial" if distribution in _BINOMIAL_FAMILIES else "Regression" if distribution in _REGRESSION_FAMILIES else None
    if distribution == "multinomial" and category == "Regression" or wanted is not None and wanted != category:
        raise InvalidMojo(f"model.ini: distribution = {distribution} does not fit category = {category}")


_TREE_FILE = re.compile(r"trees/t(\d{2,})_(\d{3,})\.bin")


def _tree_files(zf: zipfile.ZipFile, names: set[str], groups: int, per_group: int) -> list[tuple[int, int, str, bytes]]:
    """``(order, class, name, bytes)`` of every tree file, in genmodel's order: class-major, then
    group (its per-class sums follow it). Files of classes or groups past the counts are ignored,
    as genmodel ignores them."""
    found = []
    for name in names:
        match = _TREE_FILE.fullmatch(name)
        if match is None:
            continue
        c, g = int(match[1]), int(match[2])
        if c < per_group and g < groups and name == f"trees/t{c:02d}_{g:03d}.bin":
            found.append((c, g, name))
    found.sort()
    total = sum(zf.getinfo(name).file_size for _, _, name in found)
    if total > 4 * MAX_NODES:
        raise InvalidMojo(f"the tree files hold {total} bytes, more than a model of {MAX_NODES} nodes")
    return [(c * groups + g, c, name, zf.read(name)) for c, g, name in found]


class _NodeBuilder:
    """Accumulates flattened nodes while the trees are walked."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, bool, float, int, int, int, int, int]] = []
        self.bits = bytearray()
        self.bitsets: dict[bytes, int] = {}  # identical bitsets share their bytes

    def add(self) -> int:
        self.rows.append((LEAF, 0, False, 0.0, -1, -1, -1, 0, 0))
        return len(self.rows) - 1

    def set(self, index: int, *values: Any) -> None:
        self.rows[index] = values

    def bitset(self, data: bytes) -> int:
        """The offset of ``data`` in the shared bitset bytes."""
        start = self.bitsets.get(data)
        if start is None:
            start = self.bitsets[data] = len(self.bits)
            self.bits += data
        return start


def flatten_trees(targets: list[int], blobs: list[bytes], tree_version: int = 2, names: list[str] | None = None) -> TreeTable:
    """Flatten compressed trees (``targets[i]`` = the prediction slot tree ``i`` adds to); InvalidMojo
    naming the tree (``names[i]``, else its position) that is malformed."""
    nodes = _NodeBuilder()
    roots = []
    for i, blob in enumerate(blobs):
        try:
            roots.append(_flatten_one(blob, nodes, tree_version))
        except ValueError as exc:
            raise InvalidMojo(f"{names[i] if names else f'tree {i}'}: {exc}") from None
    rows = nodes.rows or [(LEAF, 0, False, 0.0, -1, -1, -1, 0, 0)]
    kind, column, na_left, split, left, right, bstart, boff, bcount = zip(*rows)
    bits = np.frombuffer(bytes(nodes.bits) or b"\0", dtype=np.uint8).copy()
    # Children of leaves point at themselves: harmless, never followed.
    return TreeTable(
        kind=np.array(kind, dtype=np.int8),
        column=np.array(column, dtype=np.int32),
        na_left=np.array(na_left, dtype=np.bool_),
        split=np.array(split, dtype=np.float64),
        left=np.array(left, dtype=np.int32),
        right=np.array(right, dtype=np.int32),
        bits_start=np.array(bstart, dtype=np.int32),
        bits_offset=np.array(boff, dtype=np.int32),
        bits_count=np.array(bcount, dtype=np.int32),
        bits=bits,
        roots=np.array(roots, dtype=np.int32),
        target=np.array(targets, dtype=np.int32),
    )


def _flatten_one(tree: bytes, nodes: _NodeBuilder, tree_version: int) -> int:
    """Flatten one compressed tree; returns its root's node index.

    The tree is walked in its byte order (a node, its left subtree, its right subtree), and each
    node must start exactly where the bytes before it end: a left-subtree size that does not span
    the left subtree (0 made both children read the same bytes, so a 169-byte tree flattened into
    half a million nodes), a child pointing back or past the end, or bytes after the tree is a
    ValueError. So every node is read once and the table has at most one node per 4 bytes.
    """
    root = nodes.add()
    # (byte position, node index, child-kind mask or -1 for "a node is here", bitset in effect)
    stack: list[tuple[int, int, int, tuple[int, int, int]]] = [(0, root, -1, (-1, 0, 0))]
    size = len(tree)
    cursor = 0  # where the next node in byte order must start
    while stack:
        pos, index, leaf_mask, inherited = stack.pop()
        if pos != cursor:
            raise ValueError(f"a node's left-subtree size does not match its left subtree (byte {pos}, expected {cursor})")
        if len(nodes.rows) > MAX_NODES:
            raise ValueError(f"the trees have more than {MAX_NODES} nodes")
        if leaf_mask >= 0 and leaf_mask & 16:  # this child is a leaf: a float32
            nodes.set(index, LEAF, 0, False, _f4(tree, pos), index, index, -1, 0, 0)
            cursor = pos + 4
            continue
        _need(tree, pos + 3)
        node_type = tree[pos]
        col = struct.unpack_from("<H", tree, pos + 1)[0]
        if col == 65535:
            nodes.set(index, LEAF, 0, False, _f4(tree, pos + 3), index, index, -1, 0, 0)
            cursor = pos + 7
            continue
        _need(tree, pos + 4)
        na_dir = tree[pos + 3]
        pos += 4
        equal = node_type & 12
        lmask = node_type & 51
        rmask = (node_type & 0xC0) >> 2
        split = -1.0
        bitset = inherited  # genmodel keeps one bitset object: a split without one still sees the last filled
        kind = NUMERIC
        if na_dir == _NA_VS_REST:
            kind = NA_VS_REST
        elif equal == 0:
            split = _f4(tree, pos)
            pos += 4
        elif equal == 8:
            if pos + 4 > size:
                raise ValueError("a tree's bitset runs past its end")
            kind = BITSET
            bitset = (nodes.bitset(tree[pos : pos + 4]), 0, 32)
            pos += 4
        elif equal == 12:
            kind = BITSET
            _need(tree, pos + (6 if tree_version >= 2 else 4))
            bit_offset = struct.unpack_from("<H", tree, pos)[0]
            if tree_version >= 2:
                nbits = struct.unpack_from("<i", tree, pos + 2)[0]
                nbytes = ((nbits - 1) >> 3) + 1
                pos += 6
            else:
                nbytes = struct.unpack_from("<H", tree, pos + 2)[0]
                nbits = nbytes << 3
                pos += 4
            if nbits <= 0 or pos + nbytes > size:
                raise ValueError("a tree's bitset runs past its end")
            bitset = (nodes.bitset(tree[pos : pos + nbytes]), bit_offset, nbits)
            pos += nbytes
        else:
            raise ValueError(f"unsupported split kind {equal} in a tree")
        if lmask <= 3:
            _need(tree, pos + lmask + 1)
            left_size = int.from_bytes(tree[pos : pos + lmask + 1], "little")
            pos += lmask + 1
            left_pos, right_pos = pos, pos + left_size
        elif lmask & 16:
            left_pos, right_pos = pos, pos + 4
        else:
            raise ValueError(f"illegal left-child mask {lmask} in a tree")
        if right_pos >= size:
            raise ValueError("a tree's node points past its end")
        cursor = pos
        left, right = nodes.add(), nodes.add()
        in_effect = bitset if equal != 0 else (-1, 0, 0)
        nodes.set(index, kind, col, na_dir in _NA_LEFT, split, left, right, *in_effect)
        stack.append((right_pos, right, rmask, bitset))
        stack.append((left_pos, left, lmask if lmask & 16 else -1, bitset))
    if cursor != size:
        raise ValueError(f"{size - cursor} bytes after the tree's last node")
    return root


def _need(buf: bytes, end: int) -> None:
    """ValueError unless ``buf`` holds ``end`` bytes."""
    if end > len(buf):
        raise ValueError("a tree's node runs past its end")


def _f4(buf: bytes, pos: int) -> float:
    _need(buf, pos + 4)
    value: float = struct.unpack_from("<f", buf, pos)[0]
    return value
