"""XLA HLO text -> a plain syntax tree (module, computations, instructions). No lowering here.

Reads what `jax.jit(f).lower(...).as_text(dialect="hlo")` prints and what XLA dumps
(`module_*.before_optimizations.txt`, fused after-optimisation dumps, the canonical printer), old and
new styles alike:

    HloModule jit_f, entry_computation_layout={(f32[8,16]{1,0})->f32[8,10]{1,0}}
    %region_0.2 (a: f32[], b: f32[]) -> f32[] { ... }        computations, with or without signature
    ENTRY main.5 {
      x.1 = f32[8,16]{1,0} parameter(0)
      ROOT %d = f32[8,10] dot(f32[8,16]{1,0} %x.1, w), lhs_contracting_dims={1}, metadata={op_name="..."}
    }

The parser is whitespace-insensitive (an instruction ends where its attribute list ends), so
instructions that span lines, `/*index=5*/` comments and inline `to_apply={...}` bodies all read.
Attribute values are kept as raw text; the `attr_*` helpers below decode the ones lowering needs, so
an attribute nobody reads can never break an import.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

# ----- the syntax tree ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArrayShape:
    """`f32[8,16]{1,0}`: HLO element type, dimensions, and layout (minor-to-major) when printed."""

    dtype: str
    dims: tuple[int, ...]
    layout: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True, slots=True)
class TupleShape:
    """`(f32[2], s32[])`."""

    elements: tuple[Shape, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.elements)) + ")"


Shape = ArrayShape | TupleShape


@dataclass(slots=True)
class Instruction:
    """`[ROOT] name = shape opcode(operands), key=value, ...`; names are kept without their `%`."""

    name: str
    shape: Shape
    opcode: str
    operands: tuple[str, ...]
    attrs: dict[str, str]
    line: int
    literal: str | None = None  # constant(...): the literal's text
    param_index: int | None = None  # parameter(N)


@dataclass(slots=True)
class Computation:
    name: str
    instructions: list[Instruction]
    root: Instruction
    is_entry: bool
    line: int

    @property
    def parameters(self) -> dict[int, Instruction]:
        return {i.param_index: i for i in self.instructions if i.param_index is not None}


@dataclass(slots=True)
class Module:
    name: str
    computations: dict[str, Computation]
    entry: Computation
    attrs: dict[str, str] = field(default_factory=dict)


class HloSyntaxError(Exception):
    """A parse error at a 1-based line; the front end turns it into a ModelLoadError."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


# ----- the parser --------------------------------------------------------------------------------
_NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")
_ATTR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INT = re.compile(r"-?\d+")
_DIM = re.compile(r"(<=)?(\d+)|\?")
_OPEN, _CLOSE = "([{", ")]}"
_SPACE = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)*", re.S)
_ARRAY_SHAPE = re.compile(r"([A-Za-z][A-Za-z0-9]*)\[([0-9,<= ]*)\]")  # the common case, in one match
_PLAIN_VALUE = re.compile(r'[^"()\[\]{},\s]*')  # characters that neither nest, quote nor end a value
_PLAIN_GROUP = re.compile(r'[^"()\[\]{}]*')  # characters that neither nest nor quote
_INLINE_BODY = re.compile(r"\{\s*(ROOT\s+)?%?[A-Za-z_][\w.\-]*\s*=")
# Sections of source locations that new XLA dumps put between the header and the computations.
_STACK_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# Attributes that name called computations (an inline `{...}` body is parsed in their place).
# Nesting xrl follows (tuple shapes, inline bodies); real modules stay in single digits, and a bound
# keeps a hostile file from exhausting Python's stack.
MAX_NESTING = 100
CALL_ATTRS = ("to_apply", "calls", "condition", "body", "select", "scatter", "branch_computations",
               "called_computations", "true_computation", "false_computation")


def parse_module(text: str) -> Module:
    """Parse a whole HLO module; raises HloSyntaxError."""
    return _Parser(text).module()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.computations: dict[str, Computation] = {}
        self._anonymous = 0
        self._depth = 0  # tuple shapes and inline bodies open now

    # ----- low-level scanning -----
    def line(self, pos: int | None = None) -> int:
        return bisect.bisect_right(self._line_starts, self.pos if pos is None else pos)

    def error(self, expected: str) -> HloSyntaxError:
        self.skip_ws()
        if self.pos >= len(self.text):  # blame the last line with text on it, not the empty end
            last = self.line(len(self.text.rstrip()) - 1)
            return HloSyntaxError(last, f"expected {expected}, found the end of the text")
        found = self.text[self.pos:self.pos + 24].split("\n")[0]
        return HloSyntaxError(self.line(), f"expected {expected}, found {found!r}")

    def skip_ws(self) -> None:
        """Skip whitespace and comments (`/* ... */`, `// ...`)."""
        self.pos = _SPACE.match(self.text, self.pos).end()

    def at_end(self) -> bool:
        self.skip_ws()
        return self.pos >= len(self.text)

    def peek(self, s: str) -> bool:
        self.skip_ws()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.error(what or repr(s))

    def accept_keyword(self, word: str) -> bool:
        self.skip_ws()
        m = _NAME.match(self.text, self.pos)
        if m and m.group(0) == word:
            self.pos = m.end()
            return True
        return False

    def name(self, what: str = "a name") -> str:
        self.skip_ws()
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error(what)
        self.pos = m.end()
        return m.group(1)

    def integer(self, what: str = "an integer") -> int:
        self.skip_ws()
        m = _INT.match(self.text, self.pos)
        if not m:
            raise self.error(what)
        self.pos = m.end()
        return int(m.group(0))

    def balanced(self) -> str:
        """Text from here to the end of one balanced bracket/string run (not including the closer
        that ends the enclosing group, nor a top-level ',' or whitespace)."""
        self.skip_ws()
        text, n, start = self.text, len(self.text), self.pos
        depth = 0
        while self.pos < n:
            m = _PLAIN_VALUE.match(text, self.pos) if depth == 0 else _PLAIN_GROUP.match(text, self.pos)
            if m.end() > self.pos:  # jump over a run of ordinary characters in one step
                self.pos = m.end()
                continue
            c = text[self.pos]
            if c == '"':
                self._skip_string()
                continue
            if c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (c in ", \t\r\n"):
                break
            self.pos += 1
        if depth:
            raise HloSyntaxError(self.line(start), "unbalanced brackets in an attribute value")
        return text[start:self.pos]

    def _skip_string(self) -> None:
        text, n = self.text, len(self.text)
        start = self.pos
        self.pos += 1
        while self.pos < n and text[self.pos] != '"':
            self.pos += 2 if text[self.pos] == "\\" else 1
        if self.pos >= n:
            raise HloSyntaxError(self.line(start), "unterminated string")
        self.pos += 1

    def group_contents(self, opener: str, closer: str) -> str:
        """Skip a bracketed group starting at `opener`; return the text between the brackets."""
        self.expect(opener)
        start, depth, text, n = self.pos, 1, self.text, len(self.text)
        while self.pos < n:
            self.pos = _PLAIN_GROUP.match(text, self.pos).end()
            if self.pos >= n:
                break
            c = text[self.pos]
            if c == '"':
                self._skip_string()
                continue
            if c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth -= 1
                if depth == 0:
                    self.pos += 1
                    return text[start:self.pos - 1]
            self.pos += 1
        raise HloSyntaxError(self.line(start), f"no {closer!r} closes this {opener!r}")

    # ----- grammar -----
    def module(self) -> Module:
        name, attrs = "", {}
        if self.accept_keyword("HloModule"):
            self.skip_ws()
            m = _NAME.match(self.text, self.pos)
            if m:
                name = m.group(1)
                self.pos = m.end()
            attrs = self.attributes()
        entry: Computation | None = None
        while not self.at_end():
            if self._stack_section():
                continue
            comp = self.computation()
            if comp.is_entry:
                if entry is not None:
                    raise HloSyntaxError(comp.line, f"a second ENTRY computation {comp.name!r}")
                entry = comp
        if entry is None:
            if not self.computations:
                raise self.error("a computation (e.g. 'ENTRY main {')")
            entry = list(self.computations.values())[-1]  # XLA: the last computation is the entry
            entry.is_entry = True
        return Module(name, self.computations, entry, attrs)

    def _stack_section(self) -> bool:
        self.skip_ws()
        m = _NAME.match(self.text, self.pos)
        if not m or m.group(0) not in _STACK_SECTIONS:
            return False
        self.pos = m.end()
        while True:  # entries: `1 "file.py"` or `1 {file_name_id=1 ...}`
            self.skip_ws()
            if not _INT.match(self.text, self.pos):
                return True
            self.integer()
            self.balanced()

    def computation(self, name: str | None = None) -> Computation:
        self.skip_ws()
        line = self.line()
        is_entry = self.accept_keyword("ENTRY")
        if name is None:
            if self.peek("{"):
                self._anonymous += 1
                name = f"computation.anonymous.{self._anonymous}"
            else:
                name = self.name("a computation name or 'ENTRY'")
        if self.peek("("):
            self.group_contents("(", ")")  # the signature: the parameter instructions say it again
        if self.accept("->"):
            self.shape()
        self.attributes()  # e.g. execution_thread="main"
        self.expect("{", "'{' to open computation " + repr(name))
        instructions: list[Instruction] = []
        root: Instruction | None = None
        while not self.accept("}"):
            if self.at_end():
                raise HloSyntaxError(line, f"computation {name!r} is not closed with '}}'")
            is_root = self.accept_keyword("ROOT")
            ins = self.instruction()
            instructions.append(ins)
            if is_root:
                if root is not None:
                    raise HloSyntaxError(ins.line, f"a second ROOT in computation {name!r}")
                root = ins
        if not instructions:
            raise HloSyntaxError(line, f"computation {name!r} has no instructions")
        if name in self.computations:
            raise HloSyntaxError(line, f"computation {name!r} is defined twice")
        comp = Computation(name, instructions, root or instructions[-1], is_entry, line)
        self.computations[name] = comp
        return comp

    def _fresh_computation_name(self, base: str) -> str:
        name, i = base, 0
        while name in self.computations:
            i += 1
            name = f"{base}.{i}"
        return name

    def instruction(self) -> Instruction:
        self.skip_ws()
        line = self.line()
        name = self.name("an instruction ('name = shape opcode(...)') or '}'")
        self.expect("=")
        shape = self.shape()
        opcode = self.name("an opcode")
        literal: str | None = None
        param_index: int | None = None
        operands: tuple[str, ...] = ()
        if opcode == "constant":
            literal = self.group_contents("(", ")").strip()
        elif opcode == "parameter":
            self.expect("(")
            param_index = self.integer("a parameter number")
            self.expect(")")
        else:
            operands = self.operands()
        attrs = self.attributes(owner=name)
        return Instruction(name, shape, opcode, operands, attrs, line, literal, param_index)

    def operands(self) -> tuple[str, ...]:
        self.expect("(", "'(' to open the operand list")
        out: list[str] = []
        if self.accept(")"):
            return ()
        while True:
            if self._at_shape():
                self.shape()  # new printers type each operand: `f32[2,3]{1,0} %x`
            out.append(self.name("an operand name"))
            if self.accept(")"):
                return tuple(out)
            self.expect(",", "',' or ')' in the operand list")

    def _at_shape(self) -> bool:
        self.skip_ws()
        if self.text.startswith("(", self.pos):
            return True
        m = _NAME.match(self.text, self.pos)
        return bool(m) and not m.group(0).startswith("%") and self.text.startswith("[", m.end())

    def attributes(self, owner: str = "") -> dict[str, str]:
        attrs: dict[str, str] = {}
        while self.accept(","):
            self.skip_ws()
            m = _ATTR_KEY.match(self.text, self.pos)
            if not m:
                raise self.error("an attribute 'key=value'")
            key = m.group(0)
            self.pos = m.end()
            self.expect("=", f"'=' after attribute {key!r}")
            if key in CALL_ATTRS and self.peek("{") and self._inline_body_ahead():
                # The canonical printer inlines called computations: `to_apply={ x = ... }`.
                self._enter("inline computation bodies")
                attrs[key] = self.computation(name=self._fresh_computation_name(f"{owner}.{key}")).name
                self._depth -= 1
            else:
                attrs[key] = self.balanced()
        return attrs

    def _inline_body_ahead(self) -> bool:
        # `calls={%a, %b}` lists names; an inline body holds `name = ...` instructions.
        return _INLINE_BODY.match(self.text, self.pos) is not None

    def _enter(self, what: str) -> None:
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise HloSyntaxError(self.line(), f"{what} nested more than {MAX_NESTING} deep; xrl does not "
                                              f"read modules nested that deeply")

    def shape(self) -> Shape:
        if self.accept("("):
            self._enter("tuple shapes")
            elements: list[Shape] = []
            if not self.accept(")"):
                while True:
                    elements.append(self.shape())
                    if self.accept(")"):
                        break
                    self.expect(",", "',' or ')' in a tuple shape")
            self._depth -= 1
            return TupleShape(tuple(elements))
        m = _ARRAY_SHAPE.match(self.text, self.pos)
        if m:
            dtype = m.group(1)
            dims = [self._dim(d.strip().removeprefix("<=")) for d in m.group(2).split(",") if d.strip()]
            self.pos = m.end()
        else:
            dtype, dims = self._slow_array_shape()
        layout = None
        if self.text.startswith("{", self.pos):  # a layout follows with no space; a body '{' after one
            layout_text = self.group_contents("{", "}")
            minor_to_major = layout_text.split(":")[0]
            layout = tuple(int(t) for t in re.findall(r"\d+", minor_to_major))
        return ArrayShape(dtype, tuple(dims), layout)

    def _dim(self, digits: str) -> int:
        if len(digits) > 18:  # past int64, and past what int() converts quickly for a hostile file
            raise HloSyntaxError(self.line(), f"dimension {digits[:20]}... has {len(digits)} digits; "
                                              f"no real shape is that large")
        return int(digits)

    def _slow_array_shape(self) -> tuple[str, list[int]]:
        """An array shape token by token, for good error messages (and `?` dims)."""
        dtype = self.name("a shape such as f32[2,3]")
        self.expect("[", f"'[' after element type {dtype!r}")
        dims: list[int] = []
        if not self.accept("]"):
            while True:
                self.skip_ws()
                m = _DIM.match(self.text, self.pos)
                if not m:
                    raise self.error("a dimension size")
                if m.group(0) == "?":
                    raise HloSyntaxError(self.line(), "unbounded dynamic dimension '?': xrl needs static shapes")
                dims.append(self._dim(m.group(2)))  # `<=N` (bounded dynamic) reads as its bound N
                self.pos = m.end()
                if self.accept("]"):
                    break
                self.expect(",", "',' or ']' in a shape")
        return dtype, dims


# ----- attribute decoding ------------------------------------------------------------------------
def attr_ints(value: str) -> tuple[int, ...]:
    """`{1,0}` or `{}` -> (1, 0) / ()."""
    return tuple(int(t) for t in re.findall(r"-?\d+", value))


def attr_computations(value: str) -> tuple[str, ...]:
    """`%region_0.2` or `{%a, %b}` -> the computation names."""
    return tuple(m.group(1) for m in _NAME.finditer(value.strip("{} ")))


@dataclass(frozen=True, slots=True)
class Window:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]
    lhs_dilate: tuple[int, ...]
    rhs_dilate: tuple[int, ...]
    reversal: tuple[int, ...]


def attr_window(value: str, rank: int) -> Window:
    """`{size=3x3 stride=2x2 pad=1_1x0_1 rhs_dilate=2x2}` -> a Window (defaults filled in)."""
    fields = dict(item.split("=", 1) for item in value.strip("{}").split() if "=" in item)

    def ints(key: str, default: int) -> tuple[int, ...]:
        return tuple(int(t) for t in fields[key].split("x")) if key in fields else (default,) * rank

    pad = tuple(tuple(int(p) for p in t.split("_")) for t in fields["pad"].split("x")) if "pad" in fields \
        else ((0, 0),) * rank
    return Window(ints("size", 1), ints("stride", 1), pad, ints("lhs_dilate", 1), ints("rhs_dilate", 1),
                  ints("rhs_reversal", 0))


def attr_slices(value: str) -> tuple[tuple[int, int, int], ...]:
    """`{[0:1:1], [1:5]}` -> ((0, 1, 1), (1, 5, 1))."""
    out = []
    for m in re.finditer(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]", value):
        out.append((int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)))
    return tuple(out)


def attr_padding(value: str) -> tuple[tuple[int, int, int], ...]:
    """`0_0x1_2_0` -> ((0, 0, 0), (1, 2, 0)): low, high, interior per dimension."""
    out = []
    for t in value.split("x"):
        parts = [int(p) for p in t.split("_")]
        out.append((parts[0], parts[1], parts[2] if len(parts) > 2 else 0))
    return tuple(out)


def attr_string(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


_LITERAL_TOKEN = re.compile(r"[-+]?(?:inf|nan(?:\(0x[0-9a-fA-F]+\))?|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|true|false")


def literal_tokens(text: str) -> list[str] | None:
    """The scalar tokens of a constant's literal, in row-major order; None if the literal is elided
    (`{...}`, printed when large constants are not printed)."""
    body = text.strip()
    m = re.match(r"[A-Za-z]\w*\[[^\]]*\](\{[\d,]*\}(?=\s))?", body)  # old printers: `constant(f32[2] {1, 2})`
    if m:
        body = body[m.end():]
    if "..." in body:
        return None
    return _LITERAL_TOKEN.findall(body)
