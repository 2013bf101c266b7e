"""The package's shape: no import circles, between modules or between layers, counting imports inside
functions too (a lazy import hides a circle from Python, not from a reader)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

PACKAGE = Path(__file__).resolve().parents[1] / "seal_mini"

# The layers, lowest first. A module may import its own layer and the layers below it, never one above.
# "seal_mini" is the foundation: config, labels, runio, distributed (what every layer reads).
LAYERS = ["seal_mini", "envs", "engine", "core", "evaluation", "training", "programs", "checks"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every seal_mini module `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from seal_mini.engine import rollout` imports a module; `from seal_mini.config import X` a name
            found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return {name for name in found if name in modules and name != "seal_mini"}


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) - {module_name(f)} for f in files}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "seal_mini"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a path [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_in_a_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_module_sits_in_a_known_layer_and_imports_only_downwards():
    upward = []
    for module, imported in import_graph().items():
        assert layer(module) in LAYERS, f"{module}: put it in one of {LAYERS} (tests/test_layout.py)"
        for other in imported:
            if LAYERS.index(layer(other)) > LAYERS.index(layer(module)):
                upward.append(f"{module} imports {other} ({layer(module)} -> {layer(other)})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(sorted(upward))


def test_training_does_not_import_reporting():
    graph = import_graph()
    reachable, todo = set(), ["seal_mini.training.train"]
    while todo:
        for nxt in graph[todo.pop()] - reachable:
            reachable.add(nxt)
            todo.append(nxt)
    assert "seal_mini.evaluation.report" not in reachable


def test_the_checks_see_a_circle_and_an_upward_import(tmp_path):
    """The checks above are only as good as the graph: imports inside a function, in both spellings, must
    show, and so must a circle and an import from a higher layer."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    module = tmp_path / "lazy.py"
    module.write_text(
        "import json\n"
        "def f():\n    from seal_mini.checks import oracle\n"
        "def g():\n    import seal_mini.evaluation.report\n"
        "def h():\n    from seal_mini.config import ConfigError\n"
    )
    known = {"seal_mini.checks.oracle", "seal_mini.checks", "seal_mini.evaluation.report", "seal_mini.config"}
    assert imports_of(module, known) == known
    assert LAYERS.index(layer("seal_mini.checks.oracle")) > LAYERS.index(layer("seal_mini.envs.bfcl"))
    assert layer("seal_mini.config") == "seal_mini" and layer("seal_mini.core.grpo") == "core"


@pytest.mark.parametrize("sub", LAYERS[1:])
def test_each_layer_says_what_it_holds(sub):
    init = PACKAGE / sub / "__init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init}: a docstring saying what the layer holds"
