"""The import graph of onboard/ is layered (docs/architecture.md, "Import layers").

Built from the AST of every module, so imports inside functions and under
``TYPE_CHECKING`` count as much as module-level ones: a cycle that only closes at
call time is still a cycle for whoever reads or moves the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onboard"

# Lowest first: a unit (a subpackage, or a top-level module of onboard/) imports
# only units before it. ``onboard`` is the package's own __init__ (its version).
LAYERS = [
    "onboard",
    "errors",
    "fsutil",
    "config_json",
    "safetensors_header",
    "threads",
    "templating",
    "components",
    "spec",
    "arch",
    "targets",
    "reference",
    "runtime",
    "generate",
    "pr",
    "checkpoint",
    "serving",
    "report",
    "quantize",
    "speculators",
    "validate",
    "publish",
    "pipeline",
    "cli",
]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package __init__), for every module of onboard/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported onboard module, imported name or None, line) for each import in
    ``module``, relative ones resolved; ``from pkg import sub`` names the
    submodule."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if _unit(module) == "components" and id(node) in _annotation_only(tree):
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    found.append((sub, None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    out = []
    for target, name, line in found:
        if target != "onboard" and not target.startswith("onboard."):
            continue
        while target not in MODULES:  # onboard.x.Name: the module that defines it
            target = target.rpartition(".")[0]
        out.append((target, name, line))
    return out


def _annotation_only(tree: ast.Module) -> set[int]:
    """The import nodes under ``if TYPE_CHECKING:`` at module level.

    The one exception to the layers: a component module (onboard/components/)
    names, for its reader, the types of what the stages hand its hooks (the
    spec, a plan layer, the config keys) under TYPE_CHECKING, and imports
    nothing of theirs: the stages build those objects from the components'
    fields and call the components, never the reverse at run time."""
    return {
        id(child)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for child in ast.walk(node)
        if isinstance(child, ast.Import | ast.ImportFrom)
    }


def _unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


# (importer, imported module) -> the (name, line) of each import making the edge.
EDGES: dict[tuple[str, str], list[tuple[str | None, int]]] = {}
for _module in MODULES:
    for _target, _name, _line in _imports(_module):
        if _target != _module:
            EDGES.setdefault((_module, _target), []).append((_name, _line))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _short(module: str) -> str:
    return module.removeprefix("onboard.")


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in MODULES}
    assert units == set(LAYERS), (
        f"units missing from LAYERS: {sorted(units - set(LAYERS))}; "
        f"LAYERS naming no unit: {sorted(set(LAYERS) - units)}"
    )


def test_the_module_graph_is_acyclic() -> None:
    graph: dict[str, set[str]] = {}
    for module, target in EDGES:
        graph.setdefault(module, set()).add(target)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(map(_short, cycle))


def test_the_unit_graph_is_acyclic() -> None:
    graph: dict[str, set[str]] = {}
    for module, target in EDGES:
        edge = (_unit(module), _unit(target))
        if edge[0] != edge[1]:
            graph.setdefault(edge[0], set()).add(edge[1])
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_every_import_runs_down_the_layers() -> None:
    rank = {unit: i for i, unit in enumerate(LAYERS)}
    upward: dict[tuple[str, str], list[str]] = {}
    for module, target in EDGES:
        a, b = _unit(module), _unit(target)
        if a != b and rank[a] < rank[b]:
            upward.setdefault((a, b), []).append(
                f"{_short(module)} -> {_short(target)}"
            )
    assert not upward, f"imports up the layers (LAYERS): {upward}"


def test_no_private_name_crosses_units() -> None:
    crossing = [
        f"{_short(module)}:{line} imports {name} from {_short(target)}"
        for (module, target), names in EDGES.items()
        for name, line in names
        if name and name.startswith("_") and _unit(module) != _unit(target)
    ]
    assert not crossing, crossing


def test_generate_and_pr_do_not_import_each_other() -> None:
    # Peers: onboard.pipeline.generate composes them; pr gets generated files.
    between = sorted(
        f"{_short(module)} -> {_short(target)}"
        for module, target in EDGES
        if {_unit(module), _unit(target)} == {"generate", "pr"}
    )
    assert not between, between
