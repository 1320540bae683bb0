"""The Python console scripts and the writers of fp4lab.capture, fp4lab.monitor_plot and fp4lab.trace against a
hostile user: outputs that would overwrite an input, options found bad only after the work, record names that
lead out of the output folder, stdout on a full device or a closed pipe, and the one table of exit codes they
share with the command line (docs/spec.md §11.1). FP4LAB_BIN names the built command line (ctest sets it)."""
import json
import os
import re
import signal
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from fp4lab import _core, _files
from fp4lab import trace as ct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PY = sys.executable


def entry(target, *args):
    """The command a console script `module:function` runs (the scripts are not installed in the build tree)."""
    mod, func = target.split(":")
    return [PY, "-c", f"import sys; from {mod} import {func}; sys.exit({func}())", *args]


def script(name, *args):
    return entry(SCRIPTS[name], *args)


with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    PROJECT_SCRIPTS = tomllib.load(f)["project"]["scripts"]
SCRIPTS = dict(PROJECT_SCRIPTS, **{"fp4lab.trace": "fp4lab.trace:main"})  # python3 -m fp4lab.trace too


def run(cmd, **kw):
    if "stdout" not in kw:
        kw.setdefault("capture_output", True)
    return subprocess.run(cmd, text=True, **kw)


def one_line_error(r, prog, code, *needles):
    """`r` ended with the exit code `code` and one line `PROG: error: ...` holding every needle."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"{prog}: error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def make_trace(folder, n=2):
    """A small valid trace v1 folder of `n` F32 records, written by fp4lab.trace."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        g = f"layers.{i}.fc"
        ct.write_file(os.path.join(folder, g + ".safetensors"),
                      {f"{g}.fwd_x": rng.standard_normal((32, 16), dtype=np.float32),
                       f"{g}.fwd_w": rng.standard_normal((16, 16), dtype=np.float32),
                       f"{g}.bwd_dy": rng.standard_normal((32, 16), dtype=np.float32)},
                      {"fp4lab.trace.version": "1", "step": "0"})
    return str(folder)


def files_of(folder):
    return {p: open(os.path.join(folder, p), "rb").read() for p in sorted(os.listdir(folder))}


def make_jsonl(path):
    recs = [{"step": s, "layer": "l0", "pass": "fwd_y", "operand": o, "sqnr_db": 20.0 + s, "gemm_sqnr_db": 18.0,
             "frac_zero": 0.1, "frac_sat": 0.0} for s in range(3) for o in "ab"]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def readonly_folder(tmp_path):
    """A folder this process cannot write into (root writes into a mode-555 folder; /proc/self refuses it)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if not os.access(d, os.W_OK):
        return str(d)
    if os.path.isdir("/proc/self") and not os.access("/proc/self", os.W_OK):
        return "/proc/self"
    pytest.skip("no read-only folder for this user")


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("t") / "trace")


# ---- outputs that would overwrite an input -------------------------------------------------------------------

def test_monitor_plot_output_never_overwrites_its_input(tmp_path):
    """`fp4lab-monitor-plot m.jsonl -o m.jsonl` (however spelt, a hard link too) is a usage error before any work,
    the records untouched; a folder or FIFO as the output is a data error, left as it was."""
    jsonl = make_jsonl(tmp_path / "m.jsonl")
    before = open(jsonl, "rb").read()
    os.link(jsonl, tmp_path / "h.jsonl")
    for out in ("m.jsonl", "./m.jsonl", jsonl, "../" + tmp_path.name + "/m.jsonl", "h.jsonl"):
        r = run(script("fp4lab-monitor-plot", "m.jsonl", "-o", out), cwd=tmp_path)
        one_line_error(r, "fp4lab-monitor-plot", 2, "output is also an input")
        assert open(jsonl, "rb").read() == before, out
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for out in ("d", "fifo"):
        r = run(script("fp4lab-monitor-plot", "m.jsonl", "-o", out), cwd=tmp_path)
        one_line_error(r, "fp4lab-monitor-plot", 1, out, "not a regular file")
    assert (tmp_path / "d").is_dir() and not os.listdir(tmp_path / "d")
    assert not (tmp_path / "fifo").is_file()
    from fp4lab import monitor_plot
    with pytest.raises(ValueError, match="output is also an input"):
        monitor_plot.plot(jsonl, jsonl)
    assert open(jsonl, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["d", "fifo", "h.jsonl", "m.jsonl"]  # no PNG, no temporary


def test_capture_check_json_never_overwrites_the_trace(tmp_path):
    """`fp4lab-capture check T --json T/<record>` (and `python3 -m fp4lab.trace`): a usage error before the check,
    every record as it was, nothing on stdout."""
    t = make_trace(tmp_path / "T")
    before = files_of(t)
    rec = os.path.join(t, "layers.0.fc.safetensors")
    for prog, args in (("fp4lab-capture", ["check", t]), ("fp4lab-capture", ["check", rec]),
                       ("fp4lab.trace", [t])):
        for out in (rec, os.path.join(t, "..", "T", "layers.0.fc.safetensors")):
            r = run(script(prog, *args, "--json", out))
            one_line_error(r, prog, 2, "output is also an input")
            assert r.stdout == ""
    assert files_of(t) == before
    # A JSON beside the trace is written, its non-finite figures as null (JSON has no NaN).
    r = run(script("fp4lab-capture", "check", t, "--json", str(tmp_path / "s.json")))
    assert r.returncode == 0 and "2 gemms valid" in r.stdout, r.stderr
    rows = json.loads((tmp_path / "s.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert [x["gemm"] for x in rows] == ["layers.0.fc", "layers.1.fc"]
    assert files_of(t) == before and sorted(os.listdir(tmp_path)) == ["T", "s.json"]


def test_capture_check_json_folder_is_checked_before_the_check(tmp_path, trace_dir):
    """`--json` into a missing or read-only folder, or an empty name, is one line before the trace is read (no
    table printed first), as a bad --block is."""
    ro = readonly_folder(tmp_path)
    for out, code, needle in ((str(tmp_path / "missing" / "s.json"), 1, "no such folder"),
                              (os.path.join(ro, "s.json"), 1, "is not writable"),
                              ("", 2, "empty")):
        for prog, args in (("fp4lab-capture", ["check", trace_dir]), ("fp4lab.trace", [trace_dir])):
            r = run(script(prog, *args, "--json", out))
            one_line_error(r, prog, code, needle)
            assert r.stdout == ""
    for block in ("0", "-16", str(2 ** 40)):
        r = run(script("fp4lab-capture", "check", trace_dir, "--block", block))
        one_line_error(r, "fp4lab-capture", 2, f"--block {block}")
        assert r.stdout == ""


def test_trace_write_file_refuses_folders_fifos_and_inputs(tmp_path):
    """fp4lab.trace.write_file holds its path to the shared output rules before it writes: a folder or FIFO is a
    TraceError naming it, one of `inputs` a usage error; nothing is written or left behind."""
    rng = np.random.default_rng(1)
    tensors = {"g.fwd_x": rng.standard_normal((16, 16), dtype=np.float32)}
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for out in ("d", "fifo"):
        with pytest.raises(ct.TraceError) as e:
            ct.write_file(str(tmp_path / out), tensors, {})
        assert str(e.value).startswith(str(tmp_path / out) + ": ") and "not a regular file" in str(e.value)
    src = tmp_path / "in.safetensors"
    src.write_bytes(b"input")
    with pytest.raises(ValueError, match="output is also an input") as e:
        ct.write_file(str(tmp_path / "." / "in.safetensors"), tensors, {}, inputs=[str(src)])
    assert isinstance(e.value, _files.UsageError)
    assert src.read_bytes() == b"input" and sorted(os.listdir(tmp_path)) == ["d", "fifo", "in.safetensors"]


# ---- fp4lab-capture run: every option and path checked before the script runs -------------------------------

RUN_SCRIPT = """
import sys, torch
open(sys.argv[1], "w").close()  # the script ran
m = torch.nn.Sequential(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(2):
    m(torch.randn(128, 32)).sum().backward()
    opt.step()
"""


@pytest.mark.parametrize("args,code,needle", [
    (["--pattern", "("], 2, "--pattern '(': not a regular expression"),
    (["--steps", "x"], 2, "--steps 'x'"),
    (["--steps", "-1"], 2, "--steps '-1'"),
    (["--token-multiple", "0"], 2, "--token-multiple 0: not a positive integer"),
    (["--token-multiple", "24"], 2, "--token-multiple 24 is not a multiple of"),
    (["--max-tokens", "-5"], 2, "--max-tokens -5"),
    (["--token-stride", "0"], 2, "--token-stride 0"),
    (["--max-out", "24"], 2, "--max-out 24"),
    (["--meta", "novalue"], 2, "--meta 'novalue'"),
    (["--out", "FILE"], 1, "exists and is not a folder"),
])
def test_capture_run_options_are_checked_before_the_script(tmp_path, args, code, needle):
    train = tmp_path / "train.py"
    train.write_text(RUN_SCRIPT)
    (tmp_path / "FILE").write_text("a file")
    base = {"--pattern": ".", "--steps": "1", "--out": str(tmp_path / "out")}
    opts = dict(base, **{args[0]: args[1].replace("FILE", str(tmp_path / "FILE"))})
    cmd = script("fp4lab-capture", "run", *[x for kv in opts.items() for x in kv], "--", str(train),
                 str(tmp_path / "ran"))
    r = run(cmd)
    one_line_error(r, "fp4lab-capture", code, needle)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


# ---- TraceCapture: arguments checked in the constructor, records inside out_dir ------------------------------

def test_trace_capture_checks_its_arguments_in_the_constructor(tmp_path):
    """A bad argument is a one-line ValueError naming it when the capture is made, never a fault inside the
    user's training step (token_multiple=0 was a ZeroDivisionError in the forward hook)."""
    torch = pytest.importorskip("torch")
    from fp4lab.capture import TraceCapture
    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    (tmp_path / "file").write_text("x")
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "step_000000").write_text("a file where the step's folder goes")
    cases = [({"token_multiple": 0}, "token_multiple"), ({"token_multiple": -16}, "token_multiple"),
             ({"token_multiple": 16.0}, "token_multiple"), ({"dim_multiple": 0}, "dim_multiple"),
             ({"token_stride": 0}, "token_stride"), ({"token_stride": True}, "token_stride"),
             ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "256"}, "max_tokens"),
             ({"max_out": 0}, "max_out"), ({"store_dtype": "f16"}, "store_dtype"),
             ({"steps": "5"}, "steps"), ({"steps": [-1]}, "steps"), ({"steps": [1.5]}, "steps"),
             ({"pattern": "("}, "pattern"), ({"pattern": 5}, "pattern"), ({"model": 5}, "model"),
             ({"metadata": [("a", "b")]}, "metadata"), ({"metadata": {"k": "\udc80"}}, "metadata"),
             ({"name_prefix": 3}, "name_prefix"), ({"out_dir": str(tmp_path / "blocked")}, "out_dir"),
             ({"out_dir": str(tmp_path / "file")}, "out_dir"),
             ({"out_dir": str(tmp_path / "file" / "sub")}, "out_dir")]
    for change, name in cases:
        kw = dict({"model": model, "pattern": ".", "steps": {0}, "out_dir": str(tmp_path / "out")}, **change)
        with pytest.raises(ValueError) as e:
            TraceCapture(kw.pop("model"), kw.pop("pattern"), kw.pop("steps"), kw.pop("out_dir"), **kw)
        assert name in str(e.value) and "\n" not in str(e.value), (change, str(e.value))
    assert sorted(os.listdir(tmp_path)) == ["blocked", "file"]
    # The root module as the layer has no name to file its record under (".safetensors" no reader reads).
    with pytest.raises(ValueError, match="name_prefix"):
        TraceCapture(torch.nn.Linear(32, 32), "", {0}, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="255"):
        m = torch.nn.Module()
        m.add_module("x" * 250, torch.nn.Linear(32, 32))
        TraceCapture(m, ".", {0}, str(tmp_path / "out"))


def test_record_files_stay_inside_out_dir_whatever_the_module_name(tmp_path):
    """A module named by an absolute path, or a name_prefix with `..`, writes its record inside
    out_dir/step_NNNNNN (its file name escaped), under its own gemm name; names that differ keep apart files."""
    torch = pytest.importorskip("torch")
    from fp4lab.capture import TraceCapture
    outside = str(tmp_path / "outside")
    names = [outside, "a/b", "a%2Fb", "x"]
    model = torch.nn.Module()
    for n in names:
        model.add_module(n, torch.nn.Linear(32, 32))
    for prefix in ("", "../../up/"):
        out = tmp_path / ("out" + str(len(prefix)))
        cap = TraceCapture(model, ".", {0}, str(out), token_multiple=16, name_prefix=prefix)
        with cap.at(0):
            sum(getattr(model, n)(torch.randn(16, 32)).sum() for n in names).backward()
        cap.remove()
        folder = os.path.realpath(out / "step_000000")
        assert len(cap.written) == 4
        assert all(os.path.dirname(os.path.realpath(p)) == folder for p in cap.written), cap.written
        assert len(os.listdir(folder)) == 4
        assert sorted(r["gemm"] for r in ct.check(folder)) == sorted(prefix + n for n in names)
    assert sorted(os.listdir(tmp_path)) == ["out0", "out9"]  # no outside.safetensors, no up/


# ---- stdout on a full device or a closed pipe ------------------------------------------------------------------

def test_every_console_script_is_covered():
    assert set(PROJECT_SCRIPTS) == {"fp4lab", "fp4lab-capture", "fp4lab-train", "fp4lab-monitor-plot"}
    assert set(SCRIPTS) == set(STDOUT_RUNS)


STDOUT_RUNS = {  # a run of each that writes to stdout (the plot writes nothing there)
    "fp4lab": lambda t, j: ["recipes"],
    "fp4lab-capture": lambda t, j: ["check", t],
    "fp4lab-train": lambda t, j: ["recipes"],
    "fp4lab-monitor-plot": lambda t, j: [j, "-o", os.path.join(os.path.dirname(j), "m.png")],
    "fp4lab.trace": lambda t, j: [t],
}


@pytest.mark.parametrize("name", sorted(STDOUT_RUNS))
def test_console_scripts_end_like_the_cli_on_full_or_closed_stdout(tmp_path, trace_dir, name):
    """stdout on /dev/full: one line naming stdout and exit 1, no traceback; a closed pipe (`| head -1`): ended by
    SIGPIPE without a word, as the command line ends. `fp4lab` runs the command line itself."""
    if name == "fp4lab-monitor-plot":
        pytest.importorskip("matplotlib")
    cmd = script(name, *STDOUT_RUNS[name](trace_dir, make_jsonl(tmp_path / "m.jsonl")))
    plain = run(cmd)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    if name == "fp4lab-monitor-plot":
        assert plain.stdout == ""  # its one output is the PNG
        return
    with open("/dev/full", "w") as full:
        r = run(cmd, stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(name) and ": error: stdout" in r.stderr, r.stderr
    rd, wr = os.pipe()
    os.close(rd)
    try:
        r = run(cmd, stdout=wr, stderr=subprocess.PIPE)
    finally:
        os.close(wr)
    assert r.returncode == -signal.SIGPIPE and r.stderr == "", (r.returncode, r.stderr)


# ---- one table of exit codes -------------------------------------------------------------------------------

def spec_exit_table():
    text = open(os.path.join(ROOT, "docs", "spec.md"), encoding="utf-8").read()
    section = text[text.index("### 11.1 "):]
    section = section[:section.index("\n## ")]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M)
    return section, [(int(c), m) for c, m in rows]


def test_exit_codes_are_one_table_for_the_cli_and_the_python_front_ends():
    """docs/spec.md §11.1's table (which tests/cli compares with fp4lab/io/exit_codes.hpp and `fp4lab --help`) is what
    fp4lab._core.exit_codes() reads from that header, and fp4lab._files' codes and fault classes are its rows;
    the section names every console script of pyproject.toml as using them."""
    section, table = spec_exit_table()
    assert table == [tuple(r) for r in _core.exit_codes()]
    meaning = {m.split(":")[0]: c for c, m in table}
    assert (_files.EXIT_OK, _files.EXIT_DATA, _files.EXIT_USAGE) == \
        (meaning["success"], meaning["bad data"], meaning["bad usage"])
    assert _files.DataError.exit_code == _files.EXIT_DATA and _files.UsageError.exit_code == _files.EXIT_USAGE
    assert issubclass(ct.TraceError, _files.DataError) and issubclass(ct.TraceError, ValueError)
    for name in PROJECT_SCRIPTS:
        assert f"`{name}`" in section, name


def test_faults_end_with_the_tables_codes(tmp_path, trace_dir):
    """A bad input is exit 1, a bad option exit 2, each one line `PROG: error: ...`, in every console script (no
    argparse usage dump)."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x02")
    codes = {m.split(":")[0]: c for c, m in spec_exit_table()[1]}
    usage, data = codes["bad usage"], codes["bad data"]
    for name, args, code, needle in (
            ("fp4lab-capture", ["check", str(bad)], data, "shorter than the 8-byte header"),
            ("fp4lab.trace", [str(bad)], data, "shorter than the 8-byte header"),
            ("fp4lab-capture", ["check", trace_dir, "--block", "x"], usage, "--block"),
            ("fp4lab-capture", ["check", trace_dir, "--jso", "x"], usage, "--jso"),
            ("fp4lab-capture", [], usage, "cmd"),
            ("fp4lab-monitor-plot", [str(bad), "--bogus"], usage, "--bogus"),
            ("fp4lab-monitor-plot", [make_jsonl(tmp_path / "m.jsonl"), "--layer", "("], usage, "--layer '('"),
            ("fp4lab-monitor-plot", [str(tmp_path / "absent.jsonl")], data, "absent.jsonl"),
            ("fp4lab-train", ["bogus"], usage, "bogus"),
            ("fp4lab", ["bogus"], usage, "bogus")):
        r = run(script(name, *args), cwd=tmp_path)
        assert r.returncode == code and r.stderr.count("\n") == 1, (name, args, r.returncode, r.stderr)
        assert r.stderr.startswith(name) and ": error: " in r.stderr and needle in r.stderr, (name, r.stderr)
