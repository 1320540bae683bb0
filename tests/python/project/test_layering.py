"""The layering of the Python package, read from its source with `ast` (nothing is imported):

1. The product package (python/fp4lab, what the wheel ships) never imports the lab (lab/, the package fp4lab_lab)
   nor anything under tests/ (the numpy oracle tests/python/cli/oracle.py, the test modules). Every import statement
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

And the C++ layering, read from the sources and CMake files with regular expressions (nothing is compiled): the
command line (cli/) is a front-end on top, so

4. no C++ file outside cli/ includes a cli/ header (tests/ may: they test the command line);
5. no file of a library (models/ with models/io, analysis/, sim/, kernels/, workloads/, dist/) or of the Python
   module (python/src) includes Boost: Boost.Program_options is the command line's, and neither a library's users
   nor the wheel need it;
6. no CMake target other than the command line's (those cli/CMakeLists.txt defines) compiles a cli/ source, puts
   cli/ on its include path or links a command-line library.
"""
import ast
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PKG_ROOT = os.path.join(ROOT, "python")

# Known circles, each left until its modules are split: none now, so any circle fails the test.
KNOWN_CYCLES: list = []
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
    for f in os.listdir(os.path.join(ROOT, "lab")):
        outside.add(f[:-3] if f.endswith(".py") else f)
    for _, dirs, files in os.walk(os.path.join(ROOT, "tests", "python")):  # each folder's modules import by name
        outside.update(f[:-3] for f in files if f.endswith(".py"))
        outside.update(d for d in dirs if d != "__pycache__")
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
    assert "fp4lab._core" in graph["fp4lab._files"] and "fp4lab.torch.ops" in graph["fp4lab.torch._layer"]
    new = [sorted(c) for c in cycles(graph) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, f"import circles in python/fp4lab: {new}"


# ---- the C++ layering (rules 4-6) --------------------------------------------------------------------------------
CPP_SUFFIXES = (".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh")
BOOST_FREE_DIRS = ("models", "analysis", "sim", "kernels", "workloads", "dist", os.path.join("python", "src"))
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
CMAKE_COMMAND = re.compile(r"\b(add_library|add_executable|nanobind_add_module|target_sources|"
                           r"target_include_directories|target_link_libraries)\s*\(([^()]*)\)", re.I)


def source_files(root, suffixes, under=""):
    """Paths relative to root of the files under root/under ending in one of suffixes; build folders, hidden
    folders and tests/ left out."""
    out = []
    for folder, dirs, files in os.walk(os.path.join(root, under)):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build"))
                         and not (rel == "." and d in ("tests", "shared")))
        out += [os.path.normpath(os.path.join(rel, f)) for f in sorted(files) if f.endswith(suffixes)]
    return out


def cmake_commands(root, path):
    """(command, target, arguments) of each target command of a CMake file, comments dropped."""
    text = re.sub(r"#[^\n]*", "", open(os.path.join(root, path), encoding="utf-8").read())
    for m in CMAKE_COMMAND.finditer(text):
        args = m.group(2).split()
        if args:
            yield m.group(1).lower(), args[0], args[1:]


def cpp_layering_faults(root):
    """Every break of rules 4-6 in the tree at root, one line each."""
    faults = []
    cli_headers = {f for f in os.listdir(os.path.join(root, "cli")) if f.endswith((".hpp", ".h"))}
    for path in source_files(root, CPP_SUFFIXES):
        if path.split(os.sep)[0] == "cli":
            continue
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        here = os.path.dirname(path)
        for kind, name in INCLUDE.findall(text):
            norm = os.path.normpath(name)
            beside = kind == '"' and os.path.exists(os.path.join(root, here, name))
            if norm.startswith("cli" + os.sep) or (norm in cli_headers and not beside) or (
                    beside and os.path.normpath(os.path.join(here, name)).split(os.sep)[0] == "cli"):
                faults.append(f"{path}: includes the command line's {name}")
    for under in BOOST_FREE_DIRS:
        for path in source_files(root, CPP_SUFFIXES, under):
            for _, name in INCLUDE.findall(open(os.path.join(root, path), encoding="utf-8", errors="replace").read()):
                if name.startswith("boost/"):
                    faults.append(f"{path}: includes <{name}> (Boost is the command line's)")
    cmake_files = [p for p in source_files(root, ("CMakeLists.txt", ".cmake"))]
    cli_cmake = os.path.join("cli", "CMakeLists.txt")
    cli_targets = {t for c, t, _ in cmake_commands(root, cli_cmake) if c in ("add_library", "add_executable")}
    for path in cmake_files:
        if path == cli_cmake:
            continue
        for command, target, args in cmake_commands(root, path):
            for a in args:
                names_cli = re.search(r"(^|[/}])cli(/|$)", a) is not None
                if command == "target_link_libraries" and a in cli_targets:
                    faults.append(f"{path}: {target} links the command line's {a}")
                elif command == "target_include_directories" and names_cli:
                    faults.append(f"{path}: {target} puts the command line's folder {a} on its include path")
                elif command not in ("target_link_libraries", "target_include_directories") and names_cli:
                    faults.append(f"{path}: {target} compiles the command line's {a}")
    return faults


def test_no_library_and_no_module_uses_the_command_line_or_exposes_boost():
    faults = cpp_layering_faults(ROOT)
    assert not faults, "\n".join(faults)


def test_the_cpp_layering_sees_what_it_forbids(tmp_path):
    # A small tree with one break of each rule, so that a checker that finds nothing cannot pass for a clean tree.
    def put(rel, text):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    put("cli/CMakeLists.txt", "add_library(fp4lab_cli_options options.cpp)\nadd_executable(fp4lab main.cpp)\n")
    put("cli/options.hpp", "#pragma once\n")
    put("cli/options.cpp", '#include "options.hpp"\n#include <boost/program_options.hpp>\n')
    put("models/include/fp4lab/a.hpp", "#include <vector>\n#include <boost/any.hpp>\n")
    put("models/src/a.cpp", '#include "fp4lab/a.hpp"\n')
    put("python/src/core.cpp", '#include "options.hpp"\n#include "fp4lab/a.hpp"\n')
    put("sim/src/x.cpp", '#include "../../cli/options.hpp"\n')
    put("tests/cli/t.cpp", '#include "options.hpp"\n')  # the tests may
    put("python/CMakeLists.txt", "# cli/ in a comment is no fault\n"
        "nanobind_add_module(_core NB_STATIC src/core.cpp ${PROJECT_SOURCE_DIR}/cli/text.cpp)\n"
        "target_include_directories(_core PRIVATE ${PROJECT_SOURCE_DIR}/cli)\n")
    put("kernels/CMakeLists.txt", "add_library(fp4lab_cuda k.cu)\ntarget_link_libraries(fp4lab_cuda PUBLIC fp4lab_cli_options)\n")
    assert sorted(cpp_layering_faults(str(tmp_path))) == sorted([
        "python/src/core.cpp: includes the command line's options.hpp",
        "sim/src/x.cpp: includes the command line's ../../cli/options.hpp",
        "models/include/fp4lab/a.hpp: includes <boost/any.hpp> (Boost is the command line's)",
        "python/CMakeLists.txt: _core compiles the command line's ${PROJECT_SOURCE_DIR}/cli/text.cpp",
        "python/CMakeLists.txt: _core puts the command line's folder ${PROJECT_SOURCE_DIR}/cli on its include path",
        "kernels/CMakeLists.txt: fp4lab_cuda links the command line's fp4lab_cli_options",
    ])


# ---- the command line holds no GPU code (rule 7) -------------------------------------------------------------------
# 7. The GPU work of `fp4lab cuda` -- the conformance check against the golden model and the timing harness (events,
#    warm-up, medians, the copy baseline) -- is the library fp4lab_cuda_tools' (kernels/harness, headers
#    fp4lab/cuda/check.hpp, timing.hpp, device.hpp). No cli/ source includes a CUDA header or the kernels' own
#    (fp4lab/cuda/kernels.hpp), names a CUDA runtime identifier (cudaEventRecord, cudaStream_t, cudaMemcpyAsync...)
#    outside comments and string literals, or calls a kernel of fp4lab/cuda/kernels.hpp.
CUDA_HEADERS = re.compile(r"^(cuda[\w.]*\.h|cuda\.h|fp4lab/cuda/kernels\.hpp|.*\.cuh)$")
CUDA_RUNTIME = re.compile(r"\bcuda[A-Z]\w*")
# The kernels of fp4lab/cuda/kernels.hpp, called through a name of the namespace fp4lab::cuda.
CUDA_KERNELS = ("quantize", "quantize_bf16", "quantize_transposed", "quantize_transposed_bf16", "fake_quantize",
                "fake_quantize_both",
                "dequantize", "dequantize_bf16", "rht", "tensor_amax", "flag_nonfinite", "operand_stats",
                "gemm_reference", "gemm_fast", "gemm_fast_prepare", "gemm_fast_run", "gemm_native_sm100")
COMMENTS_AND_STRINGS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def cli_gpu_faults(root):
    """Every break of rule 7 in the cli/ folder of the tree at root, one line each."""
    faults = []
    for path in source_files(root, CPP_SUFFIXES, "cli"):
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        for _, name in INCLUDE.findall(text):
            if CUDA_HEADERS.match(name):
                faults.append(f"{path}: includes {name} (GPU code is fp4lab_cuda_tools')")
        code = COMMENTS_AND_STRINGS.sub(lambda m: "" if m.group(0)[0] in "\"'" else " ", text)
        for name in sorted(set(CUDA_RUNTIME.findall(code))):
            faults.append(f"{path}: uses the CUDA runtime's {name}")
        if re.search(r"\busing\s+namespace\s+(fp4lab\s*::\s*)?cuda\b", code):
            faults.append(f"{path}: uses namespace fp4lab::cuda")
        names = {"cuda"} | set(re.findall(r"\bnamespace\s+(\w+)\s*=\s*(?:::)?fp4lab\s*::\s*cuda\s*;", code))
        call = re.compile(r"\b(" + "|".join(sorted(names)) + r")\s*::\s*(" + "|".join(CUDA_KERNELS) + r")\s*\(")
        for alias, kernel in sorted(set(call.findall(code))):
            faults.append(f"{path}: launches {alias}::{kernel}")
    return faults


def test_the_command_line_holds_no_gpu_code():
    assert os.path.isfile(os.path.join(ROOT, "kernels", "harness", "include", "fp4lab", "cuda", "check.hpp"))
    faults = cli_gpu_faults(ROOT)
    assert not faults, "\n".join(faults)


def test_the_gpu_rule_sees_what_it_forbids(tmp_path):
    def put(rel, text):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    put("cli/a.cpp", '#include <cuda_runtime_api.h>\n#include "fp4lab/cuda/kernels.hpp"\n'
        "void f() { cudaEvent_t e; cudaEventCreate(&e); }\n")
    put("cli/b.cpp", "namespace fc = fp4lab::cuda;\nvoid g() { fc::gemm_fast(a, b, c, ws); fc::device_info(); }\n"
        "void h() { fp4lab::cuda::quantize(x, 1, 16, cfg, q, ws); fp4lab::quantize(x, 1, 16, cfg); }\n")
    put("cli/c.cpp", "using namespace fp4lab::cuda;\n")
    # Allowed: the harness's headers, CUDA named in comments and output text, the golden model's quantize.
    put("cli/d.cpp", '#include "fp4lab/cuda/timing.hpp"\n// cudaMemcpyAsync is the baseline\n'
        'const char* s = "copy = cudaMemcpyAsync";\nauto q = fp4lab::quantize(x, 1, 16, cfg);\n')
    assert sorted(cli_gpu_faults(str(tmp_path))) == sorted([
        "cli/a.cpp: includes cuda_runtime_api.h (GPU code is fp4lab_cuda_tools')",
        "cli/a.cpp: includes fp4lab/cuda/kernels.hpp (GPU code is fp4lab_cuda_tools')",
        "cli/a.cpp: uses the CUDA runtime's cudaEventCreate",
        "cli/a.cpp: uses the CUDA runtime's cudaEvent_t",
        "cli/b.cpp: launches cuda::quantize",
        "cli/b.cpp: launches fc::gemm_fast",
        "cli/c.cpp: uses namespace fp4lab::cuda",
    ])
