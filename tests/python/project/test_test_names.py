"""One naming scheme for the tests (docs/testing.md): C++ test sources are NAME_test.cpp (GoogleTest's), Python test
modules test_NAME.py (pytest's) in a folder of tests/python by subject, with file names unique across those
folders (ctest names each module python_<file name>) and without the project's name in them."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TESTS = os.path.join(ROOT, "tests")
PY = os.path.join(TESTS, "python")


def files_under(top):
    for dp, dns, fns in os.walk(top):
        dns[:] = [d for d in dns if d != "__pycache__" and not d.startswith(".")]
        for fn in fns:
            yield os.path.relpath(os.path.join(dp, fn), TESTS)


def test_cpp_test_sources_are_named_name_test():
    assert [f for f in files_under(TESTS) if os.path.basename(f).startswith("test_") and f.endswith(".cpp")] == []


def test_python_test_modules_live_in_folders_by_subject_with_unique_names():
    modules = [f for f in files_under(PY) if os.path.basename(f).startswith("test_") and f.endswith(".py")]
    assert len(modules) > 40
    assert [f for f in modules if os.path.dirname(f) == "python"] == []  # none at the top of tests/python
    names = [os.path.basename(f) for f in modules]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert [n for n in names if n.startswith("test_fp4lab")] == []
    assert [f for f in files_under(PY) if f.endswith("_test.py")] == []
