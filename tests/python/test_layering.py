"""The layering of the Python package, read from its source with `ast` (nothing is imported):

1. The product package (python/fp4lab, what the wheel ships) never imports the lab (lab/, the package fp4lab_lab)
   nor anything under tests/ (the numpy oracle tests/python/oracle.py, the test modules). Every import statement
   counts, inside functions too.
2. No library code ends the process. A call of `sys.exit`, `os._exit`, `exit` or `quit`, or a `raise SystemExit`,
   may stand only (a) in a module-level `if __name__ == "__main__":` block, (b) at the top level of a
   `__main__.py`, or (c) in a function of CONSOLE_ENDS below, each a console front-end's way of ending. Everywhere
   else a fault is a DataError or UsageError (fp4lab._files) that the console entry points turn into an exit code.
3. The import graph of python/fp4lab has no circle other than the known ones of KNOWN_CYCLES. Its nodes are the
   modules (a package is its __init__.py; the compiled fp4lab._core is a leaf); an edge is any import statement,
   function-level ones included (a deferred import hides a circle at load time, it does not remove it), relative
   imports resolved; `from P import X` is an edge to P.X where that is a module, else to P. Each strongly
   connected component of more than one module must lie inside one known cycle, so a new circle, or a module
   joining a known one, fails.
"""
import ast
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG_ROOT = os.path.join(ROOT, "python")

# Known circles, left as they are until their modules are split; a circle not listed here fails the test.
KNOWN_CYCLES = [
    # fp4lab.torch: ops imports distributed's quantizers inside functions, distributed imports linear and
    # attention, which import ops.
    {"fp4lab.torch.ops", "fp4lab.torch.distributed", "fp4lab.torch.linear", "fp4lab.torch.attention"},
    # fp4lab.decide (in __init__) imports fp4lab.decision on call, which imports fp4lab's recipes/analyze/cli_path
    # on call.
    {"fp4lab", "fp4lab.decision"},
]
# (module, function) pairs that may end the process: console_main's end by a signal's default action.
CONSOLE_ENDS = {("fp4lab._files", "_end_by_signal")}
EXITS = {("sys", "exit"), ("os", "_exit")}


def package_modules():
    """{dotted name: path} of every .py file under python/fp4lab."""
    mods = {}
    for folder, _, files in os.walk(os.path.join(PKG_ROOT, "fp4lab")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, PKG_ROOT)[:-3].split(os.sep)
                mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = package_modules()
TREES = {m: ast.parse(open(p, encoding="utf-8").read(), p) for m, p in MODULES.items()}


def imported_names(module, tree):
    """(line, absolute dotted name) of every import statement of `module`; for `from P import a` both P and P.a."""
    package = module if MODULES[module].endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            for a in node.names:
                yield node.lineno, name, a.name


def test_the_package_never_imports_the_lab_or_the_tests():
    # Top-level names of what lives outside the wheel: the lab's packages and modules, tests/python's modules.
    outside = {"lab", "tests", "conftest"}
    for folder in (os.path.join(ROOT, "lab"), os.path.join(ROOT, "tests", "python")):
        for f in os.listdir(folder):
            if f.endswith(".py") or os.path.isdir(os.path.join(folder, f)):
                outside.add(f[:-3] if f.endswith(".py") else f)
    assert "fp4lab_lab" in outside and "oracle" in outside  # the listing above found what it guards
    bad = [f"{MODULES[m]}:{line}: imports {name}" for m, tree in TREES.items()
           for line, name, _ in imported_names(m, tree) if name.split(".")[0] in outside]
    assert not bad, "\n".join(bad)


def _is_exit(node):
    """True where `node` is a raise of SystemExit or a call of sys.exit, os._exit, exit or quit."""
    if isinstance(node, ast.Raise) and node.exc is not None:
        e = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(e, ast.Name) and e.id == "SystemExit"
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id in ("exit", "quit")
        return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in EXITS
    return False


def _is_main_guard(node):
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def exits(module, tree):
    """(line, where) of every process end of `module` that the docstring's rule 2 does not allow."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if function is None and node is tree and _is_main_guard(child):
                continue  # (a)
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if _is_exit(child) and (module, function) not in CONSOLE_ENDS:
                if not (function is None and MODULES[module].endswith("__main__.py")):  # (b)
                    found.append((child.lineno, function or "<module>"))
            visit(child, inner)

    visit(tree, None)
    return found


def test_no_library_code_ends_the_process():
    bad = [f"{MODULES[m]}:{line}: {where} ends the process" for m, tree in TREES.items()
           for line, where in exits(m, tree)]
    assert not bad, "\n".join(bad)


def test_the_exit_rule_sees_what_it_forbids():
    # The rule on hand-written modules, so that a checker that finds nothing cannot pass for a clean package.
    def check(src, name="fp4lab.x", path="x.py"):
        saved = MODULES.get(name)
        MODULES[name] = path
        try:
            return [w for _, w in exits(name, ast.parse(src))]
        finally:
            if saved is None:
                del MODULES[name]
            else:
                MODULES[name] = saved
    assert check("import sys\ndef f():\n    sys.exit(1)\n") == ["f"]
    assert check("def f():\n    raise SystemExit(2)\n") == ["f"]
    assert check("def f():\n    raise SystemExit\n") == ["f"]
    assert check("import os\nclass C:\n    def g(self):\n        os._exit(3)\n") == ["g"]
    assert check("exit()\n") == ["<module>"]
    assert check("import sys\nif __name__ == '__main__':\n    sys.exit(main())\n") == []
    assert check("import sys\nsys.exit(main())\n", path="__main__.py") == []
    assert check("import os\ndef _end_by_signal(s):\n    os._exit(1)\n", name="fp4lab._files") == []


def import_graph():
    """{module: set of modules it imports}, over python/fp4lab's modules and the compiled fp4lab._core."""
    nodes = set(MODULES) | {"fp4lab._core"}
    graph = {m: set() for m in nodes}
    for m, tree in TREES.items():
        for _, name, attr in imported_names(m, tree):
            if attr is not None and f"{name}.{attr}" in nodes:
                graph[m].add(f"{name}.{attr}")
                continue
            while name and name not in nodes:  # import fp4lab.torch.ops.x -> the module that defines x
                name = name.rpartition(".")[0]
            if name and name != m:
                graph[m].add(name)
    return graph


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_cycles_finds_circles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(sorted(c) for c in cycles(g)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_new_circle():
    graph = import_graph()
    assert "fp4lab._core" in graph["fp4lab._files"] and "fp4lab.torch.ops" in graph["fp4lab.torch.linear"]
    new = [sorted(c) for c in cycles(graph) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, f"import circles in python/fp4lab: {new}"
