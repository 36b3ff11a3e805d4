"""Load a spec from YAML and report every problem at its line and column."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from onboard.errors import InputError
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
        return f"{self.file}:{self.line}:{self.col}: {self.path}: {self.message}"


class SpecError(InputError):
    """A spec with problems; str() lists each as FILE:LINE:COL: path: message."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(map(str, problems)))


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _index_nodes(
    node: yaml.Node,
    loc: Loc,
    out: dict[Loc, yaml.Node],
    dupes: list[tuple[Loc, yaml.Node]],
) -> None:
    """Map each value's path to its YAML node (keys of mappings map to the key node)."""
    out[loc] = node
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = _scalar_key(key_node)
            if key in seen:
                dupes.append((loc + (key,), key_node))
            seen.add(key)
            out[loc + (key, "__key__")] = key_node
            _index_nodes(value_node, loc + (key,), out, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_nodes(item, loc + (i,), out, dupes)


def _scalar_key(node: yaml.Node) -> str | int:
    value = (
        yaml.safe_load(yaml.serialize(node))
        if not isinstance(node, yaml.ScalarNode)
        else _UniqueKeyLoader("").construct_scalar(node)
    )
    # Integer keys (kv_sharing: {5: 3}) come back as ints so paths match pydantic's.
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":int"):
        try:
            return int(value)
        except ValueError:
            pass
    return value


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += (
            f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
        )
    return out or "<root>"


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
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
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
    _index_nodes(root, (), nodes, dupes)
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
        for err in exc.errors():
            problems.append(_problem_from_pydantic(file, nodes, err))
        raise SpecError(_sorted(problems)) from None
    for loc, message in check_rules(spec):
        line, col = _locate(file, nodes, loc, key=True)
        problems.append(Problem(file, line, col, _dotted(loc), message))
    if problems:
        raise SpecError(_sorted(problems))
    return spec


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line, p.col, p.path))


def _problem_from_pydantic(
    file: str, nodes: dict[Loc, yaml.Node], err: dict
) -> Problem:
    loc = tuple(err["loc"])
    # Drop pydantic's markers such as "[key]" so the path matches the YAML.
    loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p))
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        owner = _model_for(loc[:-1])
        message = f"unknown field {loc[-1]!r}"
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
        line, col = _locate(file, nodes, loc)
        if "input" in err and err["type"] not in (
            "model_type",
            "dict_type",
            "value_error",
        ):
            message += f" (got {err['input']!r})"
    return Problem(file, line, col, _dotted(loc), message)


def load_spec(path: str | Path) -> ModelSpec:
    """Load and fully validate a spec file (raises SpecError, exit code 2)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
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
