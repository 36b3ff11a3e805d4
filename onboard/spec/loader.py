"""Load a spec from YAML and report every problem at its line and column."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from onboard.errors import InputError, printable
from onboard.spec.model import ModelSpec
from onboard.spec.rules import check_rules

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        # One line per problem, whatever the spec's keys hold (escapes, newlines).
        return printable(
            f"{self.file}:{self.line}:{self.col}: {self.path}: {self.message}"
        )


# What one spec may make the loader do (docs/spec.md, "Limits"). A real spec has a
# few hundred nodes, nests five deep and is a few kilobytes.
MAX_SPEC_BYTES = 1 << 20
MAX_NODES = 5_000  # counting each use of an alias as a copy of its anchor
MAX_DEPTH = 32
MAX_INT_DIGITS = 20
MAX_PROBLEMS = 200
VALUE_ECHO_CHARS = 80


class SpecError(InputError):
    """A spec with problems; str() lists each as FILE:LINE:COL: path: message.

    At most MAX_PROBLEMS are listed, then a count of the rest.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = list(map(str, problems[:MAX_PROBLEMS]))
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"... and {len(problems) - MAX_PROBLEMS} more problems")
        super().__init__("\n".join(lines))


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs, recursive aliases, deep nesting and
    oversized integers with a located error instead of hanging or a traceback."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to
        self._total = 0  # nodes so far, each alias use counted as its expansion
        # id() of each mapping -> id() of the keys the text writes in it
        self.explicit_keys: dict[int, set[int]] = {}

    def _count(self, nodes: int, mark) -> None:
        self._total += nodes
        if self._total > MAX_NODES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the spec expands to more than {MAX_NODES} YAML nodes "
                "(each use of an alias counts as a copy)",
                mark,
            )

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None and id(node) not in self._sizes:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} refers to a node that contains "
                    "it (a recursive structure)",
                    event.start_mark,
                )
            if node is not None:
                self._count(self._sizes[id(node)], event.start_mark)
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        self._count(1, mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", mark
            )
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            # Its own keys, before construction inlines those a merge key (<<)
            # brings: an own key may override a merged one, not repeat an own one.
            self.explicit_keys[id(node)] = {id(k) for k, _ in node.value}
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes[id(item)] for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        self._sizes[id(node)] = size
        return node

    def construct_object(self, node, deep=False):
        if (
            isinstance(node, yaml.ScalarNode)
            and node.tag == "tag:yaml.org,2002:int"
            and len(node.value.lstrip("+-0").replace("_", "")) > MAX_INT_DIGITS
        ):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"integer of more than {MAX_INT_DIGITS} digits",
                node.start_mark,
            )
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read {node.tag.rsplit(':', 1)[-1]} value: {exc}",
                node.start_mark,
            ) from None


def _compose(text: str) -> tuple[yaml.Node | None, object, dict[int, set[int]]]:
    """The document's node tree, its Python value and, per mapping, the id() of
    the keys the text writes in it (not those a merge key brings), under the
    loader's bounds."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return root, data, loader.explicit_keys


def _index_nodes(
    node: yaml.Node,
    loc: Loc,
    out: dict[Loc, yaml.Node],
    dupes: list[tuple[Loc, yaml.Node]],
    explicit: dict[int, set[int]] | None = None,
) -> None:
    """Map each value's path to its YAML node (keys of mappings map to the key node).

    A key written twice in one mapping is a duplicate; with ``explicit`` (the
    keys the text writes in their own mapping), a key a merge key (<<) brought
    and the mapping then sets again is an override, as YAML means it (the later
    node, the override, is the one located)."""
    out[loc] = node
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = _scalar_key(key_node)
            own = explicit is None or id(key_node) in explicit.get(id(node), ())
            if key in seen and own:
                dupes.append((loc + (key,), key_node))
            if own:
                seen.add(key)
            out[loc + (key, "__key__")] = key_node
            _index_nodes(value_node, loc + (key,), out, dupes, explicit)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_nodes(item, loc + (i,), out, dupes, explicit)


def _scalar_key(node: yaml.Node) -> str | int:
    if not isinstance(node, yaml.ScalarNode):
        # A sequence or mapping as a key: not a field name; the constructor
        # refuses it (unhashable) or pydantic reports it.
        return f"<{node.id} key>"
    value = node.value
    # Integer keys (kv_sharing: {5: 3}, also written 07, 0x21 or 1_0) and boolean
    # ones come back as YAML reads them, so paths match pydantic's.
    if node.tag.endswith((":int", ":bool")):
        try:
            return yaml.constructor.SafeConstructor().construct_object(node)
        except (yaml.YAMLError, ValueError):
            pass
    return value


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += (
            f"[{part}]"
            if isinstance(part, int)
            else ("." if out else "") + _key_token(part)
        )
    return out or "<root>"


def _key_token(key: str) -> str:
    """A key as one token of the ``FILE:LINE:COL: PATH: message`` line: escaped,
    no spaces, a long key cut with the rest counted."""
    text = printable(key).replace(" ", "\\x20")
    if len(text) > VALUE_ECHO_CHARS:
        text = f"{text[:VALUE_ECHO_CHARS]}...(+{len(text) - VALUE_ECHO_CHARS})"
    return text


def _locate(
    file: str, nodes: dict[Loc, yaml.Node], loc: Loc, key: bool = False
) -> tuple[int, int]:
    """Line/column of the closest existing node on the path (1-based)."""
    if key and loc + ("__key__",) in nodes:
        mark = nodes[loc + ("__key__",)].start_mark
        return mark.line + 1, mark.column + 1
    for end in range(len(loc), -1, -1):
        node = nodes.get(loc[:end])
        if node is not None:
            return node.start_mark.line + 1, node.start_mark.column + 1
    return 1, 1


def spec_locator(path: Path) -> Callable[[Loc], tuple[int, int]]:
    """Line/column (1-based) of a field path in the spec file at ``path``, found as
    spec errors are, for checks outside this package that point into the spec; an
    unreadable file locates everything at 1:1."""
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        root = None
    nodes: dict[Loc, yaml.Node] = {}
    if root is not None:
        _index_nodes(root, (), nodes, [])
    return lambda loc: _locate(str(path), nodes, loc)


def _model_for(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``loc`` (for did-you-mean)."""
    model: type[BaseModel] | None = ModelSpec
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        model = _inner_model(field.annotation)
    return model


def _inner_model(annotation) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def parse_spec_text(text: str, file: str = "<spec>") -> ModelSpec:
    """Parse and validate spec YAML; raise SpecError listing every problem."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            [Problem(file, 1, 1, "<root>", f"larger than {MAX_SPEC_BYTES} bytes")]
        )
    try:
        root, data, explicit = _compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        reason = getattr(exc, "problem", None) or str(exc)
        problem = Problem(file, line, col, "<root>", f"invalid YAML: {reason}")
        raise SpecError([problem]) from None
    if root is None or not isinstance(data, dict):
        raise SpecError(
            [Problem(file, 1, 1, "<root>", "a spec must be a YAML mapping of fields")]
        )
    nodes: dict[Loc, yaml.Node] = {}
    dupes: list[tuple[Loc, yaml.Node]] = []
    _index_nodes(root, (), nodes, dupes, explicit)
    problems = [
        Problem(
            file,
            n.start_mark.line + 1,
            n.start_mark.column + 1,
            _dotted(loc),
            "duplicate key (YAML would silently keep the last one)",
        )
        for loc, n in dupes
    ]
    try:
        spec = ModelSpec.model_validate(data)
    except ValidationError as exc:
        said: dict[str, Problem] = {}
        for err in exc.errors():
            problem, member = _problem_from_pydantic(file, nodes, err)
            if member:
                # One value that no member of a union takes: one problem (the
                # last member's, the widest: "a valid number" over "a valid
                # integer"), not one per member.
                said[problem.path] = problem
            elif problem not in problems:
                problems.append(problem)
        problems += [p for p in said.values() if p not in problems]
        if _looks_like_hf_config(data):
            problems.insert(0, Problem(file, 1, 1, "<root>", HF_CONFIG_HINT))
        raise SpecError(_sorted(problems)) from None
    for loc, message in check_rules(spec):
        line, col = _locate(file, nodes, loc, key=True)
        problems.append(Problem(file, line, col, _dotted(loc), message))
    if problems:
        raise SpecError(_sorted(problems))
    return spec


HF_CONFIG_HINT = (
    "this is a Hugging Face config.json, not a spec: `onboard spec from-hf "
    "CONFIG -o spec.yaml` writes the spec it describes"
)


def _looks_like_hf_config(data: dict) -> bool:
    return "architectures" in data or (
        "model_type" in data and "name" not in data and "num_attention_heads" in data
    )


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line, p.col, p.path))


def _problem_from_pydantic(
    file: str, nodes: dict[Loc, yaml.Node], err: dict
) -> tuple[Problem, bool]:
    """The problem of one pydantic error, and whether the error is one member's
    of a union (``query_pre_attn_scalar: PositiveInt | float``)."""
    # Drop pydantic's markers such as "[key]" and a union member's tag
    # ("constrained-int") so the path matches the YAML (a key the YAML holds,
    # brackets and all, stays).
    loc: Loc = ()
    member = at_key = False
    for part in err["loc"]:
        if isinstance(part, str) and loc + (part,) not in nodes:
            if "[" in part:
                at_key = at_key or part == "[key]"
                continue
            owner = (
                _model_for(loc)
                if isinstance(nodes.get(loc), yaml.MappingNode)
                else None
            )
            if loc in nodes and (owner is None or part not in owner.model_fields):
                # Neither a key the YAML holds nor a field of the section the
                # value is (a missing one): a union member's tag.
                member = True
                continue
        loc += (part,)
    message = err["msg"]
    if err["type"] == "extra_forbidden" and loc:
        owner = _model_for(loc[:-1])
        message = f"unknown field {printable(repr(loc[-1]), VALUE_ECHO_CHARS)}"
        if owner is not None:
            hint = difflib.get_close_matches(
                str(loc[-1]), list(owner.model_fields), n=1
            )
            if hint:
                message += f"; did you mean {hint[0]!r}?"
            else:
                message += f" (allowed: {', '.join(owner.model_fields)})"
        line, col = _locate(file, nodes, loc, key=True)
    elif err["type"] == "missing":
        line, col = _locate(file, nodes, loc[:-1])
        message = "required field is missing"
    else:
        # A mapping key pydantic refuses (kv_sharing's `true:`): at the key.
        line, col = _locate(file, nodes, loc, key=at_key)
        if "input" in err and err["type"] not in (
            "model_type",
            "dict_type",
            "value_error",
        ):
            message += f" (got {printable(repr(err['input']), VALUE_ECHO_CHARS)})"
    return Problem(file, line, col, _dotted(loc), message), member


def load_spec(path: str | Path) -> ModelSpec:
    """Load and fully validate a spec file (raises SpecError, exit code 2)."""
    path = Path(path)
    try:
        # Only a regular file: a FIFO or /dev/zero would block or never end.
        if not path.is_file():
            reason = "no such file" if not path.exists() else "not a regular file"
            reason = f"cannot read spec: {reason}"
            raise SpecError([Problem(str(path), 1, 1, "<root>", reason)])
        with path.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            [Problem(str(path), 1, 1, "<root>", f"cannot read spec: {exc}")]
        ) from None
    return parse_spec_text(text, str(path))


def dump_spec(spec: ModelSpec) -> str:
    """Canonical YAML of a spec (every field, in schema order)."""
    # Python mode keeps integer mapping keys (kv_sharing) as YAML integers.
    data = spec.model_dump(mode="python")
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=88)
