"""The structure of harness/, read from the source (no import is run): no import cycle,
a harness module imported inside a function only where start-up order needs it, and no
function longer than LONGEST lines.

Each allowed late import has its reason in LATE; a new one must join it with a reason,
or move to the top of its module.
"""
import ast

from tests.conftest import ROOT

HARNESS = ROOT / "harness"
# (importer, imported): why the import waits until the function runs
LATE = {
    ("harness.report", "harness.plots"): "matplotlib (~1 s), only on rank 0 when a chart is drawn",
    ("harness.frameworks.tensorflow.train", "harness.frameworks.tensorflow.optimizers"): "TensorFlow at its top: after the driver pins the devices",
}


def _name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_name(p): ast.parse(p.read_text()) for p in sorted(HARNESS.rglob("*.py"))}


def _targets(node, modules) -> set[str]:
    """The harness modules an import statement binds or runs."""
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    elif node.module and node.level == 0:
        found = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    else:
        return set()
    return {t for t in found if t in modules}


def _imports(modules) -> tuple[dict, list]:
    """{module: modules it imports} (anywhere in it), and the imports inside functions."""
    graph, late = {}, []
    for name, tree in modules.items():
        graph[name] = set()
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _targets(node, modules) - {name}
                graph[name] |= targets
                if id(node) in inside:   # the module itself, not the package its name passes through
                    late += [(name, t, node.lineno) for t in targets if not any(u.startswith(t + ".") for u in targets)]
    return graph, late


def _cycle(graph) -> list[str] | None:
    """One import cycle, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None
    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_harness_has_no_import_cycle():
    graph, _ = _imports(_modules())
    assert len(graph) > 20 and graph["harness.driver"], graph      # the scan read the modules
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_simulated_clusters_scripts_import_no_cycle():
    """scripts/cluster's modules import each other by their bare names (each folder is a
    script's): slurm.py imports cluster.py, so cluster.py runs `slurm.py up` as a command."""
    folder = ROOT / "scripts" / "cluster"
    names = {p.stem for p in folder.glob("*.py")}
    graph = {}
    for p in folder.glob("*.py"):
        tree = ast.parse(p.read_text())
        found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        found |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        graph[p.stem] = (found & names) - {p.stem}
    assert graph["slurm"] == {"cluster"}, graph   # the scan read them
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_harness_modules_are_imported_inside_functions_only_for_start_up_order():
    _, late = _imports(_modules())
    unexplained = [f"{a} line {n} imports {b}" for a, b, n in late if (a, b) not in LATE]
    assert not unexplained, "move to the top of the module, or add to LATE with the reason: " + "; ".join(unexplained)
    assert {(a, b) for a, b, _ in late} == set(LATE), "LATE names an import that is no longer late"


LONGEST = 60   # lines of a function in harness/, its docstring included


def test_no_harness_function_is_longer_than_a_screen():
    long = [f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for path in sorted(HARNESS.rglob("*.py")) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > LONGEST]
    assert not long, f"split these (at most {LONGEST} lines): {long}"


def _frameworks_imported(tree) -> set[str]:
    """The training frameworks a module's source imports, anywhere in it."""
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    return {f for f in ("tensorflow", "horovod", "torch") if any(m == f or m.startswith(f + ".") for m in names)}


def test_torch_is_imported_only_by_the_pytorch_package_which_imports_no_tensorflow():
    """Issue 34's seam, as far as it is built: PyTorch lives in harness/frameworks/pytorch/,
    which imports neither TensorFlow nor Horovod (a node with PyTorch alone must run it);
    no other module imports torch. (TensorFlow: the test below.)"""
    modules = _modules()
    torch_users = {n for n, tree in modules.items() if "torch" in _frameworks_imported(tree)}
    assert torch_users and all(n.startswith("harness.frameworks.pytorch") for n in torch_users), torch_users
    pytorch = {n: _frameworks_imported(t) for n, t in modules.items() if n.startswith("harness.frameworks.pytorch")}
    assert all(found <= {"torch"} for found in pytorch.values()), pytorch
    assert not _frameworks_imported(modules["harness.frameworks"])
    # outside the package only the registry reaches in, for its plain-Python facts
    package = "harness.frameworks.pytorch"
    graph, _ = _imports(modules)
    reaching = {(n, t) for n, targets in graph.items() if not n.startswith(package) for t in targets
                if t == package or t.startswith(package + ".")}
    assert reaching == {("harness.frameworks", package), ("harness.frameworks", package + ".facts")}, sorted(reaching)


def test_tensorflow_and_horovod_are_imported_only_by_the_tensorflow_package():
    """Issue 34's seam: the training step, the optimizers, the int8 and torus exchanges,
    the Keras walker and the workloads' Keras members are harness/frameworks/tensorflow/'s,
    and no other module imports TensorFlow or Horovod (a node with PyTorch alone must run
    PyTorch); harness/train.py, flops.py and communication.py (what both frameworks share)
    import no framework, and a module outside the package does not import the package."""
    modules = _modules()
    tensorflow = "harness.frameworks.tensorflow"
    outside = {n for n, tree in modules.items() if _frameworks_imported(tree) & {"tensorflow", "horovod"}
               and not n.startswith(tensorflow)}
    assert not outside, sorted(outside)
    assert not any(_frameworks_imported(modules[n]) for n in ("harness.train", "harness.flops",
                                                              "harness.communication"))
    graph, _ = _imports(modules)
    reaching = {(n, t) for n, targets in graph.items() if not n.startswith(tensorflow) for t in targets
                if t == tensorflow or t.startswith(tensorflow + ".")}
    # the registry alone reaches in, for its plain-Python facts
    assert reaching == {("harness.frameworks", tensorflow), ("harness.frameworks", tensorflow + ".facts")}, \
        sorted(reaching)


# -- issue 47: the seam one package deep ---------------------------------------------
def _packages(modules) -> set[str]:
    """The framework packages: harness/frameworks/<name>/ (each with its facts.py)."""
    return {n.rsplit(".", 1)[0] for n in modules if n.startswith("harness.frameworks.") and n.endswith(".facts")}


def _core(modules) -> dict:
    """The modules of the core: every harness module outside the framework packages and the registry."""
    packages = _packages(modules)
    return {n: t for n, t in modules.items() if n != "harness.frameworks"
            and not any(n == p or n.startswith(p + ".") for p in packages)}


def _code_strings(tree):
    """(line, text) of every string constant of a module's code: docstrings are prose, left out."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_core_never_names_a_framework():
    """The core asks the registry (harness/frameworks/__init__.py) and each framework's facts,
    and never compares, keys or defaults by a framework's keyword: no string of its code
    holds one as a word (its prose may name a library: "Horovod's Adasum")."""
    import re
    modules = _modules()
    names = {p.rsplit(".", 1)[1] for p in _packages(modules)}
    assert {"tensorflow", "pytorch"} <= names, names          # the scan found the packages
    word = re.compile(r"(?<![\w./])(" + "|".join(sorted(names)) + r")(?![\w/])")
    core = _core(modules)
    assert "harness.report" in core and "harness.plan" in core
    named = [f"{n}:{line} {text[:60]!r}" for n, tree in core.items() for line, text in _code_strings(tree)
             if word.search(text)]
    assert not named, named
    assert _code_strings(ast.parse('x = {"tensorflow": 1}')) and word.search("tensorflow")   # the check can fail


def _reach(graph, start) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_no_framework_package_imports_up_into_the_core_that_uses_it():
    """A framework's package sits below every core module that reaches the registry (report,
    run, plan, verify, ...): it imports only core modules that do not, so that its report
    lines, its facts and its training are its own and the layers run one way."""
    modules = _modules()
    graph, _ = _imports(modules)
    packages = _packages(modules)
    above = {n for n in _core(modules) if "harness.frameworks" in _reach(graph, n)}
    assert {"harness.report", "harness.run", "harness.plan"} <= above, sorted(above)   # the scan sees the layers
    up = sorted((n, t) for n, targets in graph.items() if any(n.startswith(p) for p in packages)
                for t in targets if t in above)
    assert not up, up
