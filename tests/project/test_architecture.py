"""The import graph of src/blockcoupling: layers point one way and nothing imports in a cycle.

The layer order is the one docs/DESIGN.md states (lowest first):

    errors, hashing, lazy < validate, fields < loading < engine < prompts < store < report < runs < studies < cli < blockcoupling

Every import counts: at module level, inside functions and under ``if TYPE_CHECKING:``
(parsed with ``ast``, nothing is imported), plus ``importlib.import_module("literal")``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "blockcoupling"

#: lowest first; a module may import from its own layer or a lower one only
LAYERS = ("errors", "validate", "loading", "engine", "prompts", "store", "report", "runs", "studies",
          "cli", PACKAGE)
#: modules that share a layer with another (the bottom: they import nothing of the package)
SAME_LAYER = {"fields": "validate", "hashing": "errors", "jsonsafe": "errors", "lazy": "errors", "progress": "errors",
              "verbosity": "errors"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of the package that ``name`` (a module or an attribute of one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str) -> Iterator[tuple[str, int]]:
    """(imported module of the package, line) for every import statement in ``module``."""
    path, is_pkg = MODULES[module]
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name) if alias.name.split(".")[0] == PACKAGE else None
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                target = full if full in MODULES else _resolve(source)
                if target:
                    yield target, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.split(".")[0] == PACKAGE):
            target = _resolve(node.args[0].value)
            if target:
                yield target, node.lineno


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, without self-imports."""
    graph: dict[str, dict[str, int]] = {}
    for module in MODULES:
        edges: dict[str, int] = {}
        for target, line in _imported(module):
            if target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = _graph()


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return PACKAGE
    if parts[1] in SAME_LAYER:
        return SAME_LAYER[parts[1]]
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: not in any layer of LAYERS; place it in "
                             "docs/DESIGN.md and in tests/project/test_architecture.py")
    return parts[1]


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read() -> None:
    # the check cannot pass vacuously: known edges of each kind are seen
    assert "blockcoupling.errors" in GRAPH["blockcoupling.engine.measure"]  # module level
    assert "blockcoupling.report.html" in GRAPH["blockcoupling.studies.demo"]  # in a function
    assert "blockcoupling.store.collection" in GRAPH["blockcoupling.runs.read"]
    assert len(MODULES) > 60


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        assert layer_of(module) in LAYERS


def test_the_bottom_imports_nothing_of_the_package() -> None:
    for module in MODULES:
        if layer_of(module) == "errors":
            assert GRAPH[module] == {}, f"{module} is at the bottom but imports {GRAPH[module]}"


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == [], "import cycles between modules of src/blockcoupling"


def test_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [
        f"{module} ({layer_of(module)}) line {line} imports {target} ({layer_of(target)})"
        for module, edges in GRAPH.items()
        for target, line in edges.items()
        if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
    ]
    assert upward == [], "imports against the layer order of docs/DESIGN.md:\n" + "\n".join(
        upward)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "report"))
def test_report_imports_no_study(module: str) -> None:
    studies = [t for t in GRAPH[module] if layer_of(t) in ("runs", "studies", "cli", PACKAGE)]
    assert studies == [], f"{module} imports {studies}: report/ must not know the studies"


def test_the_layer_order_is_the_documented_one() -> None:
    design = (SRC.parent / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    assert "  <  ".join(("errors, hashing, lazy", "validate, fields", "loading", "engine", "prompts",
                         "store", "report", "runs", "studies", "cli")) in design


def test_the_complexity_budgets_named_exceptions_are_the_ones_design_counts() -> None:
    """ruff's C901 budget (pyproject.toml) is passed by naming a function over it with
    `# noqa: C901 - why`; DESIGN.md states how many there are, and each says why."""
    import re

    root = Path(__file__).resolve().parents[2]
    named = [(p, line) for folder in ("src", "tests", "tools", "benchmarks")
             for p in sorted((root / folder).rglob("*.py")) if p != Path(__file__).resolve()
             for line in p.read_text().splitlines() if "noqa: C901" in line]
    assert all(re.search(r"noqa: C901 - \w", line) for _, line in named), named
    design = " ".join((root / "docs" / "DESIGN.md").read_text().split())
    stated = re.search(r"named where it is defined, `# noqa: C901 - why`, so the list is "
                       r"visible and does not grow silently: today (\d+)", design)
    assert stated and int(stated.group(1)) == len(named), (stated, len(named))
    assert 'max-complexity = 15' in (root / "pyproject.toml").read_text()


#: the modules every collection kind goes through: every module of ``runs/`` (the generic
#: machinery) and the format and commands above and below it; they dispatch through the kind
#: registry (``runs/kinds.py``) and name no kind, neither by importing its package nor by
#: its name
GENERIC = ("blockcoupling.store.collection", *(m for m in MODULES if layer_of(m) == "runs"),
           "blockcoupling.cli.app", "blockcoupling.cli.sweep", "blockcoupling.cli.run")


def _kind_packages() -> dict[str, str]:
    """kind name -> the package it lives in, as its registration says (``package=``)."""
    from blockcoupling.runs import kinds

    return {name: kinds.get(name).package for name in kinds.names()}


def kind_naming(modules: Sequence[str]) -> set[tuple[str, str]]:
    """(module, kind) for each module of ``modules`` that imports a kind's package or holds
    the kind's name as a string."""
    found = set()
    for name, package in _kind_packages().items():
        for module in modules:
            if module == package or module.startswith(package + "."):
                continue
            imports = set(GRAPH.get(module, ()))
            tree = ast.parse(MODULES[module][0].read_text(encoding="utf-8"))
            if any(m == package or m.startswith(package + ".") for m in imports) or any(
                    isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)):
                found.add((module, name))
    return found


def test_every_kind_registers_from_its_own_package() -> None:
    packages = _kind_packages()
    assert {"sweep", "monitor", "vit-grid"} <= set(packages)
    for name, package in packages.items():  # a kind.py of its own, inside studies/
        assert package.startswith("blockcoupling.studies.") and f"{package}.kind" in MODULES, (
            f"kind {name!r} registers package={package!r}: its kind.py, in its own package "
            "under studies/, passes package=__package__")
    with_kind_py = {m.rsplit(".", 1)[0] for m in MODULES if m.endswith(".kind")}
    assert with_kind_py == set(packages.values()), "a kind.py that registers nothing"


def cross_kind_imports(graph: dict[str, dict[str, int]]) -> set[tuple[str, str]]:
    """(module, imported module) for each module of a kind's package that imports another
    kind's package: what every kind shares lives in the store or in a generic module of
    ``studies/`` (``store.collection.UnitRecord``, ``collection_unit_id``)."""
    packages = set(_kind_packages().values())

    def owner(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    return {(module, target) for module, edges in graph.items() if owner(module)
            for target in edges if owner(target) not in (None, owner(module))}


def test_no_kind_package_imports_another_kinds_package() -> None:
    """A kind's package (sweep, monitor, vit) imports no other kind's package; the check
    sees such an import when there is one (the monitor once took its units from the
    sweep's ``units.py``)."""
    assert cross_kind_imports(GRAPH) == set()
    planted = {**GRAPH, "blockcoupling.studies.monitor": {
        **GRAPH["blockcoupling.studies.monitor"], "blockcoupling.studies.sweep.units": 1}}
    assert cross_kind_imports(planted) == {("blockcoupling.studies.monitor",
                                            "blockcoupling.studies.sweep.units")}


def test_generic_modules_name_no_kind() -> None:
    """The modules every kind goes through name no kind, neither by importing its package
    nor by its name; the check sees a kind that is named (it cannot pass vacuously)."""
    assert kind_naming(["blockcoupling.studies.lm_study.run"])  # runs a sweep: it names one
    assert kind_naming(["blockcoupling.cli.vit"]) == {("blockcoupling.cli.vit", "vit-grid")}
    assert kind_naming(GENERIC) == set()
