"""The dataflow graph: immutable nodes over named values, with types, weights and a structural hash.

A Graph is never mutated after construction. A rewrite builds a new Graph with `replace`, which
shares every untouched Node, TensorType and weight array with its parent: a candidate costs a
few dict copies, not a deep copy (docs/architecture.md, "Candidates without whole-graph copies").
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from xrl.errors import InvalidGraphError
from xrl.ir.types import TensorType

AttrValue = Any  # int | float | str | tuple[int, ...] | tuple[float, ...] | np.ndarray (Constant only)


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)  # weakref: keys of _HASH_PREFIX
class Node:
    """One operator application. `inputs` may hold "" for an omitted optional input (ONNX style)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    domain: str = ""

    def attr(self, key: str, default: AttrValue = None) -> AttrValue:
        return self.attrs.get(key, default)

    def attr_key(self) -> tuple:
        """Attributes as a hashable, order-independent tuple (arrays by content digest)."""
        return tuple(sorted((k, _hashable(v)) for k, v in self.attrs.items()))


def _hashable(v: AttrValue) -> Any:
    if isinstance(v, np.ndarray):
        return ("ndarray", array_digest(v))
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def array_digest(array: np.ndarray) -> str:
    """Content digest of a weight, used by the canonical hash (names play no part in it). A read-only array
    (every IR weight) is hashed once: the graphs a search makes share their weights' arrays, and hashing
    them again for each new graph took 4.8 s of a bert-base deployment run."""
    if not array.flags.writeable:
        known = _DIGESTS.get(id(array))
        if known is not None and known[0]() is array:
            return known[1]
    h = hashlib.blake2b(digest_size=16)
    h.update(array.dtype.str.encode())
    h.update(repr(array.shape).encode())
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # bytes of any dtype, no copy where contiguous
    digest = h.hexdigest()
    if not array.flags.writeable:
        key = id(array)
        _DIGESTS[key] = (weakref.ref(array, lambda _, key=key: _DIGESTS.pop(key, None)), digest)
    return digest


# id(array) -> (a weak reference to it, its digest): an entry goes with its array
_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}


class Graph:
    """A typed dataflow graph.

    - `inputs`: activation inputs (fed at run time), in order.
    - `initializers`: weights, name -> read-only numpy array.
    - `outputs`: value names the graph returns, in order; `output_names` are the names a user sees
      (stable across rewrites that rename the value computing an output).
    - `types`: a TensorType for every value (inputs, weights and every node output).
    - `domain_opsets`: the opset version of each non-default operator domain the source model
      imported (e.g. {"com.microsoft": 1}), so that export declares the versions its opaque nodes
      were written for. Metadata like `name`: it plays no part in the hash, and `replace` keeps it.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        inputs: Iterable[str],
        outputs: Iterable[str],
        types: Mapping[str, TensorType],
        initializers: Mapping[str, np.ndarray] | None = None,
        *,
        name: str = "graph",
        output_names: Iterable[str] | None = None,
        weight_digests: Mapping[str, str] | None = None,
        domain_opsets: Mapping[str, int] | None = None,
    ) -> None:
        self.nodes: dict[str, Node] = {}
        for n in nodes:
            if n.name in self.nodes:
                raise InvalidGraphError(f"node name {n.name!r} is used twice")
            self.nodes[n.name] = n
        self.inputs: tuple[str, ...] = tuple(inputs)
        self.outputs: tuple[str, ...] = tuple(outputs)
        self.output_names: tuple[str, ...] = tuple(output_names) if output_names is not None else self.outputs
        if len(self.output_names) != len(self.outputs):
            raise InvalidGraphError("output_names and outputs differ in length")
        self.types: dict[str, TensorType] = dict(types)
        self.initializers: dict[str, np.ndarray] = {}
        for k, v in (initializers or {}).items():
            if v.flags.writeable:
                v = v.view()
                v.flags.writeable = False
            self.initializers[k] = v
        self.name = name
        self.domain_opsets: dict[str, int] = {d: int(v) for d, v in (domain_opsets or {}).items()
                                               if d not in ("", "ai.onnx")}
        # Digests are expensive for big weights: computed once and handed down to rewritten graphs.
        self._digests: dict[str, str] = dict(weight_digests or {})
        # Set by `replace`: the graph this one was rewritten from, and what changed, for incremental hashing.
        self._hash_parent: Graph | None = None
        self._hash_delta: tuple[set[str], set[str], set[str]] = (set(), set(), set())

    # ----- structure -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, {len(self.inputs)} inputs, "
                f"{len(self.initializers)} weights)")

    @cached_property
    def producers(self) -> dict[str, tuple[Node, int]]:
        """value name -> (producing node, output index)."""
        out: dict[str, tuple[Node, int]] = {}
        for n in self.nodes.values():
            for i, v in enumerate(n.outputs):
                if v in out:
                    raise InvalidGraphError(f"value {v!r} is produced by both {out[v][0].name!r} and {n.name!r}")
                out[v] = (n, i)
        return out

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        """value name -> nodes that read it (a node reading a value twice is listed once)."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes.values():
            for v in n.inputs:
                if v:
                    users = out.get(v)
                    if users is None:
                        out[v] = [n]
                    elif users[-1] is not n:  # n read v already (nodes are listed as they come)
                        users.append(n)
        return out

    def producer(self, value: str) -> Node | None:
        p = self.producers.get(value)
        return p[0] if p else None

    def is_weight(self, value: str) -> bool:
        return value in self.initializers

    @cached_property
    def topological_order(self) -> tuple[Node, ...]:
        """Nodes in a deterministic topological order (Kahn's algorithm, ties by insertion order).

        Raises InvalidGraphError on a cycle, naming a node on it.
        """
        producers = self.producers
        consumers = self.consumers
        indeg: dict[str, int] = {}  # the number of distinct nodes a node reads from
        for n in self.nodes.values():
            ins = n.inputs
            if len(ins) == 1:
                indeg[n.name] = 1 if ins[0] in producers else 0
            else:
                indeg[n.name] = len({producers[v][0].name for v in ins if v in producers})
        ready = [n for n in self.nodes.values() if indeg[n.name] == 0]  # also the order: nodes leave it in turn
        i = 0
        while i < len(ready):
            n = ready[i]
            i += 1
            if len(n.outputs) == 1:  # a consumer list names a node once
                users: Iterable[Node] = consumers.get(n.outputs[0], ())
            else:  # a node that reads two of n's outputs counts once
                users = {c.name: c for v in n.outputs for c in consumers.get(v, ())}.values()
            for c in users:
                d = indeg[c.name] = indeg[c.name] - 1
                if d == 0:
                    ready.append(c)
        if len(ready) != len(self.nodes):
            stuck = next(n.name for n in self.nodes.values() if indeg[n.name] > 0)
            raise InvalidGraphError(f"the graph has a cycle through node {stuck!r}")
        return tuple(ready)

    # ----- values ---------------------------------------------------------------------------
    def type_of(self, value: str) -> TensorType:
        try:
            return self.types[value]
        except KeyError:
            raise InvalidGraphError(f"value {value!r} has no type") from None

    def const_value(self, value: str) -> np.ndarray | None:
        """The value of a weight, or None for an activation."""
        return self.initializers.get(value)

    def weight_digest(self, name: str) -> str:
        d = self._digests.get(name)
        if d is None:
            d = self._digests[name] = array_digest(self.initializers[name])
        return d

    @property
    def num_parameters(self) -> int:
        return int(sum(a.size for a in self.initializers.values()))

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes.values():
            hist[n.op] = hist.get(n.op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def fresh_name(self, prefix: str) -> str:
        """A node/value name not used in this graph."""
        taken = self._names
        i = len(taken)
        while f"{prefix}_{i}" in taken:
            i += 1
        name = f"{prefix}_{i}"
        taken.add(name)
        return name

    @cached_property
    def _names(self) -> set[str]:
        return set(self.nodes) | set(self.types) | set(self.initializers)

    # ----- rewriting ------------------------------------------------------------------------
    def replace(
        self,
        remove: Iterable[str] = (),
        add: Iterable[Node] = (),
        *,
        rename: Mapping[str, str] | None = None,
        new_types: Mapping[str, TensorType] | None = None,
        new_weights: Mapping[str, np.ndarray] | None = None,
        new_digests: Mapping[str, str] | None = None,
    ) -> Graph:
        """A new graph with nodes `remove` (by name) dropped, `add` appended, and every use of a
        value `v` in `rename` redirected to `rename[v]` (graph outputs too; their user-visible
        names stay). Values and weights nobody uses any more are dropped. Nothing is deep-copied.
        """
        rename = dict(rename or {})
        removed = set(remove)
        add = list(add)
        changed = {n.name for n in add}
        rebuilt: dict[str, tuple[Node, Node]] = {}  # name -> (parent's node, its copy reading the renamed values)
        nodes: list[Node] = []
        for n in self.nodes.values():
            if n.name in removed:
                continue
            if rename and not rename.keys().isdisjoint(n.inputs):
                old, n = n, Node(n.name, n.op, tuple(rename.get(v, v) for v in n.inputs), n.outputs, n.attrs, n.domain)
                rebuilt[n.name] = (old, n)
                changed.add(n.name)
            nodes.append(n)
        nodes.extend(add)
        for v in new_weights or ():
            changed.update(c.name for c in self.consumers.get(v, ()) if c.name not in removed)
        outputs = tuple(rename.get(v, v) for v in self.outputs)
        types = dict(self.types)
        if new_types:
            types.update(new_types)
        weights = dict(self.initializers)
        if new_weights:
            weights.update(new_weights)
        used = set(self.inputs) | set(outputs)
        for n in nodes:
            used.update(n.inputs)
            used.update(n.outputs)
        used.discard("")
        types = {k: t for k, t in types.items() if k in used}
        weights = {k: w for k, w in weights.items() if k in used}
        digests = {k: d for k, d in self._digests.items() if k in weights}
        if new_digests:
            digests.update(new_digests)
        child = Graph(nodes, self.inputs, outputs, types, weights, name=self.name,
                      output_names=self.output_names, weight_digests=digests, domain_opsets=self.domain_opsets)
        child._hash_parent = self
        child._hash_delta = (changed, removed, set(new_weights or ()))
        if "producers" in self.__dict__ and "consumers" in self.__dict__:
            child._derive_maps(self, removed, rebuilt, add)
        return child

    def _derive_maps(self, parent: Graph, removed: set[str], rebuilt: Mapping[str, tuple[Node, Node]],
                     add: list[Node]) -> None:
        """Set `producers` and `consumers` of this graph, made by `parent.replace`, from the parent's: the
        entries of the values the rewrite touched are made anew, the rest (tuples, lists) are shared. The
        result equals computing them from scratch (each list in node order), for a few entries' work and
        allocations instead of the whole graph's: searches build a graph per candidate. (A new key of
        `consumers` comes last rather than where the scan would put it: nothing reads the keys' order.)
        Where an added node writes a value something else writes, both are left to be computed on use,
        which raises."""
        gone = [parent.nodes[name] for name in removed if name in parent.nodes]
        producers = dict(parent.producers)
        for n in gone:
            for v in n.outputs:
                del producers[v]
        for _, n in rebuilt.values():
            for i, v in enumerate(n.outputs):
                producers[v] = (n, i)
        for n in add:
            for i, v in enumerate(n.outputs):
                if v in producers:
                    return
                producers[v] = (n, i)
        gained: dict[str, list[Node]] = {}  # value -> rebuilt nodes that read it and did not before
        touched: set[str] = set()
        for n in gone:
            touched.update(n.inputs)
        for old, n in rebuilt.values():
            touched.update(old.inputs)
            touched.update(n.inputs)
            for v in dict.fromkeys(n.inputs):
                if v not in old.inputs:
                    gained.setdefault(v, []).append(n)
        readers: dict[str, list[Node]] = {}  # value -> added nodes that read it, in the order they are added
        for n in add:
            touched.update(n.inputs)
            for v in dict.fromkeys(n.inputs):
                readers.setdefault(v, []).append(n)
        touched.discard("")
        consumers = dict(parent.consumers)
        position: dict[str, int] | None = None
        for v in touched:
            users: list[Node] = []
            for u in parent.consumers.get(v, ()):
                if u.name in removed:
                    continue
                r = rebuilt.get(u.name)
                if r is not None:
                    if v not in r[1].inputs:
                        continue
                    u = r[1]
                users.append(u)
            if v in gained:  # the parent's nodes keep their places: order the new readers among them
                if position is None:
                    position = {name: i for i, name in enumerate(parent.nodes)}
                users = sorted(users + gained[v], key=lambda u: position[u.name])
            users += readers.get(v, ())
            if users:
                consumers[v] = users
            else:
                consumers.pop(v, None)
        self.__dict__["producers"] = producers
        self.__dict__["consumers"] = consumers

    # ----- identity -------------------------------------------------------------------------
    # A value's hash says what computes it (op, attributes, the hashes of its inputs), never what it is
    # called. The graph hash combines the output hashes with the multiset of node hashes (a sum, so it is
    # order-free and can be updated). A graph made by `replace` hashes incrementally from its parent:
    # only the added nodes and what lies downstream of them are rehashed.
    @cached_property
    def value_hashes(self) -> dict[str, str]:
        """value name -> structural hash."""
        self._hash_all()
        return self.__dict__["value_hashes"]

    @cached_property
    def canonical_hash(self) -> str:
        """Equal for two graphs that differ only in node/value names or node order."""
        h = self.value_hashes
        return _digest((tuple(h[v] for v in self.outputs), self._node_hash_sum))

    def _source_hashes(self, h: dict[str, str], names: Iterable[str] | None = None) -> None:
        for i, v in enumerate(self.inputs):
            h[v] = _digest(("input", i, str(self.types[v])))
        for v in self.initializers if names is None else names:
            h[v] = _digest(("weight", self.weight_digest(v)))
        h[""] = "none"

    def _node_hash(self, n: Node, h: dict[str, str]) -> str:
        """_digest((n.domain, n.op, n.attr_key(), input hashes)); sets the hashes of n's outputs in h."""
        # The repr of that tuple, with the part that depends on the node alone made once per Node object
        # (a candidate shares most of its nodes with its parent, and attr_key sorts and digests attributes).
        prefix = _HASH_PREFIX.get(n)
        if prefix is None:
            prefix = _HASH_PREFIX[n] = f"({n.domain!r}, {n.op!r}, {n.attr_key()!r}, "
        ins = tuple(map(h.get, n.inputs))
        if None in ins:  # a value nothing defines (an invalid graph): hashed by its name
            ins = tuple(h.get(v, "?" + v) for v in n.inputs)
        node_h = hashlib.blake2b((prefix + repr(ins) + ")").encode(), digest_size=16).hexdigest()
        for i, v in enumerate(n.outputs):  # _digest((node_h, i)), spelled out: node_h is hex, its repr is quoted
            h[v] = hashlib.blake2b(f"('{node_h}', {i})".encode(), digest_size=16).hexdigest()
        return node_h

    def _hash_all(self) -> None:
        parent = self._hash_parent
        self._hash_parent = None  # hold the parent only until hashed: chains of rewrites must not pin memory
        if parent is not None:
            self._hash_from(parent)
            return
        h: dict[str, str] = {}
        self._source_hashes(h)
        node_hashes = {n.name: self._node_hash(n, h) for n in self.topological_order}
        self.__dict__["value_hashes"] = h
        self._node_hashes = node_hashes
        self._node_hash_sum = sum(int(x, 16) for x in node_hashes.values()) % _MOD

    def _hash_from(self, parent: Graph) -> None:
        """Rehash the changed nodes (`_hash_delta`'s roots) and every node downstream of them; keep the
        parent's hashes for the rest. One walk in topological order: a node is dirty when it is a root or
        reads a value a dirty node writes, and its dirty producers come before it."""
        ph = parent.value_hashes
        roots, removed, new_weights = self._hash_delta
        h = dict(ph)
        self._source_hashes(h, new_weights)
        node_hashes = dict(parent._node_hashes)
        parent_nodes = parent.nodes
        dirty_values: set[str] = set()
        dirty: list[Node] = []
        for n in self.topological_order:
            if n.name in roots or not dirty_values.isdisjoint(n.inputs):
                dirty.append(n)
                dirty_values.update(n.outputs)
        total = parent._node_hash_sum
        for name in set(removed).union(n.name for n in dirty if n.name in parent_nodes):
            total -= int(node_hashes.pop(name), 16)
        for n in dirty:
            x = node_hashes[n.name] = self._node_hash(n, h)
            total += int(x, 16)
        self.__dict__["value_hashes"] = h
        self._node_hashes = node_hashes
        self._node_hash_sum = total % _MOD

    # ----- checking -------------------------------------------------------------------------
    def validate(self, *, check_types: bool = True) -> Graph:
        """Check the IR invariants; raise InvalidGraphError naming the first broken one.

        Every value is defined once, every use is defined, the graph is acyclic, every value has a
        type, and (with check_types) re-running shape inference reproduces the recorded types.
        """
        from xrl.ir.ops import infer_node  # ops.py needs Graph only for types; import late

        defined: set[str] = set()
        for v in list(self.inputs) + list(self.initializers):
            if v in defined:
                raise InvalidGraphError(f"value {v!r} is defined twice")
            defined.add(v)
        for v in self.producers:
            if v in defined:
                raise InvalidGraphError(f"value {v!r} is both a graph input/weight and a node output")
            defined.add(v)
        for n in self.nodes.values():
            for v in n.inputs:
                if v and v not in defined:
                    raise InvalidGraphError(f"node {n.name!r} ({n.op}) reads {v!r}, which nothing defines")
        for v in self.outputs:
            if v not in defined:
                raise InvalidGraphError(f"graph output {v!r} is not defined")
        for v in defined:
            if v not in self.types:
                raise InvalidGraphError(f"value {v!r} has no type")
        for v, w in self.initializers.items():
            if TensorType.of(w) != self.types[v]:
                raise InvalidGraphError(f"weight {v!r} is {TensorType.of(w)} but typed {self.types[v]}")
        order = self.topological_order
        if check_types:
            for n in order:
                inferred = infer_node(n, self)
                if inferred is None:
                    continue  # opaque op: its recorded types stand
                for v, t in zip(n.outputs, inferred):
                    if self.types[v] != t:
                        raise InvalidGraphError(
                            f"node {n.name!r} ({n.op}) output {v!r} is typed {self.types[v]} but its inputs give {t}")
        return self


_MOD = 1 << 128


def _digest(obj: object) -> str:
    return hashlib.blake2b(repr(obj).encode(), digest_size=16).hexdigest()


# Node -> the start of the repr its hash digests (what depends on the node alone): see Graph._node_hash.
# Weak keys: an entry lives as long as its node, which no graph may change.
_HASH_PREFIX: weakref.WeakKeyDictionary[Node, str] = weakref.WeakKeyDictionary()
