"""docs/results/README.md indexes docs/results/: every file there is a row of the index (first cell, in
backticks, relative to docs/results/), every row names a file that exists, once, with what it is; and every
path into docs/results/ that the project's Markdown names exists. No fp4lab import and no pytest needed: ctest runs
it as a plain script (tests/python/CMakeLists.txt), in well under a second; pytest collects it too."""
import itertools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RESULTS = os.path.join(ROOT, "docs", "results")
INDEX = os.path.join(RESULTS, "README.md")


def results_files():
    out = set()
    for d, dirs, files in os.walk(RESULTS):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), RESULTS).replace(os.sep, "/")
            if rel != "README.md":
                out.add(rel)
    return out


def index_rows():
    """(name, other cells) of every table row whose first cell is one backticked name."""
    rows = []
    for line in open(INDEX, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        m = re.fullmatch(r"`([^`]+)`", cells[0]) if cells else None
        if m:
            rows.append((m.group(1), cells[1:]))
    return rows


def test_every_file_is_indexed_and_every_entry_exists():
    rows = index_rows()
    names = [n for n, _ in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"named more than once in docs/results/README.md: {dup}"
    files = results_files()
    missing = sorted(files - set(names))
    assert not missing, f"files in docs/results/ that docs/results/README.md does not list: {missing}"
    absent = sorted(set(names) - files)
    assert not absent, f"docs/results/README.md lists files that do not exist: {absent}"


def test_every_entry_says_what_it_is():
    empty = [n for n, rest in index_rows() if not rest or not all(rest)]
    assert not empty, f"rows of docs/results/README.md with an empty cell: {empty}"


def expand_braces(p):
    """a-{x,y}-b -> a-x-b, a-y-b (the shell's form the docs use for pairs of files)."""
    parts = re.split(r"\{([^{}]*)\}", p)
    choices = [[s] if i % 2 == 0 else s.split(",") for i, s in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def markdown_files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x not in ("__pycache__", "node_modules")]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(d, f)


def test_paths_into_results_exist():
    bad = []
    for md in markdown_files():
        text = open(md, encoding="utf-8", errors="replace").read()
        here = os.path.dirname(md)
        refs = [(os.path.join(ROOT, p), p) for p in re.findall(r"docs/results/[\w./{},-]*[\w}/]", text)]
        # relative Markdown links, e.g. (results/x.json) from docs/ or (../x.json) from docs/results/
        refs += [(os.path.join(here, p), p) for p in re.findall(r"\]\(([^)#\s]+)\)", text)
                 if not re.match(r"[a-z]+:", p)
                 and os.path.normpath(os.path.join(here, p)).startswith(RESULTS)]
        for full, shown in refs:
            for f in expand_braces(full):
                if not os.path.exists(f):
                    bad.append(f"{os.path.relpath(md, ROOT)}: {shown}")
    assert not bad, "paths into docs/results/ that do not exist:\n" + "\n".join(sorted(set(bad)))


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
    print("docs/results/README.md: every file indexed, every entry present, every docs path into docs/results/ exists")
