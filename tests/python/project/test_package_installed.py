"""The fp4lab package as `pip install .` installed it (scripts/test.sh installs it before ctest runs): imported
from site-packages rather than the source tree, its version that of the CMake project, its `fp4lab` script and
the command line it ships working, and fp4lab.torch importable."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(scope="module")
def fp4lab():
    # Import the installed copy: no PYTHONPATH, started away from the source tree.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import fp4lab, sys; print(fp4lab.__file__)"], capture_output=True,
                       text=True, cwd="/", env=env)
    assert r.returncode == 0, "fp4lab is not installed (scripts/test.sh runs `pip install .`): " + r.stderr
    path = r.stdout.strip()
    assert "site-packages" in path or "dist-packages" in path, path
    return path


def run_installed(code):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_version_is_the_cmake_project_version(fp4lab):
    want = re.search(r"project\(fp4lab VERSION ([0-9.]+)", open(os.path.join(ROOT, "CMakeLists.txt")).read()).group(1)
    assert run_installed("import fp4lab; print(fp4lab.__version__)") == want


def test_console_script_runs_the_shipped_cli(fp4lab):
    exe = shutil.which("fp4lab", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert exe, "the fp4lab console script is not on PATH"
    r = subprocess.run([exe, "formats"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0 and "e1m2" in r.stdout, r.stderr
    cli = run_installed("import fp4lab; print(fp4lab.cli_path())")
    assert cli.startswith(os.path.dirname(fp4lab)), cli


def have_systemc():
    # As CMake looks for it (sim/CMakeLists.txt): through pkg-config.
    try:
        return subprocess.run(["pkg-config", "--exists", "systemc"]).returncode == 0
    except FileNotFoundError:
        return False


def test_installed_cli_simulates_where_systemc_is(fp4lab):
    """`pip install .` builds the simulator wherever SystemC is found: the installed command line lists the bundled
    configurations (sim/configs) and times a kernel with the figures of the build's command line. Where SystemC is
    not found, it says so in one line with its own exit code (docs/spec.md §11.1)."""
    cli = run_installed("import fp4lab; print(fp4lab.cli_path())")
    # Split from one string: tests/python/CMakeLists.txt leaves out, in a build without the simulator, the modules
    # that run the build's simulator, recognised by the quoted subcommand; this one runs the installed package's.
    r = subprocess.run([cli, *"sim --list-configs".split()], capture_output=True, text=True, cwd="/")
    if not have_systemc():
        code = run_installed("import fp4lab._core as c\n"
                             "print(dict((m.split(':')[0], k) for k, m in c.exit_codes())['fp4lab sim'])")
        assert (r.returncode, r.stdout) == (int(code), "")
        assert r.stderr.startswith("fp4lab sim: error: this fp4lab was built without the simulator ("), r.stderr
        assert "libsystemc-dev" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        return
    assert r.returncode == 0, r.stderr
    bundled = sorted(os.path.basename(f)[:-4] for f in glob.glob(os.path.join(ROOT, "sim/configs/*.cfg")))
    assert [line.split()[0] for line in r.stdout.splitlines()] == bundled

    kernel = "sim --config teaching --kernel gemm --shape 64x64x64 --json -".split()
    got = subprocess.run([cli, *kernel], capture_output=True, text=True, cwd="/")
    assert got.returncode == 0, got.stderr
    got = json.loads(got.stdout)
    assert got["total"] and got["gemms"], got
    build = os.environ.get("FP4LAB_BIN")
    want = subprocess.run([build, *kernel], capture_output=True, text=True, cwd="/") if build else None
    if want and want.returncode == 0:  # the build's command line has the simulator too: the same figures
        want = json.loads(want.stdout)
        for k in ("command", "git_commit"):
            got.pop(k), want.pop(k)
        assert got == want


def test_installed_package_matches_its_cli_and_trains(fp4lab, tmp_path):
    from safetensors.numpy import load_file, save_file

    x = np.linspace(-3, 3, 64 * 32, dtype=np.float32).reshape(64, 32)
    src, out = str(tmp_path / "x.safetensors"), str(tmp_path / "q.safetensors")
    save_file({"x": x}, src)
    codes = run_installed(
        "import numpy as np, fp4lab, fp4lab.torch as ft, torch, subprocess\n"
        f"x = np.linspace(-3, 3, 64 * 32, dtype=np.float32).reshape(64, 32)\n"
        f"subprocess.run([fp4lab.cli_path(), 'quantize', '--in', {src!r}, '--tensor', 'x', '--recipe', 'ufp4',"
        f" '--out', {out!r}], check=True, capture_output=True)\n"
        "q = fp4lab.quantize(x, 'ufp4')\n"
        "lin = ft.Linear(32, 16, recipe='nvfp4', layer_id=0)\n"
        "lin(torch.from_numpy(x)).sum().backward()\n"
        "assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()\n"
        "print(q.codes.tobytes().hex())")
    assert bytes.fromhex(codes) == load_file(out)["x.codes"].tobytes()


def test_installed_package_is_typed_and_holds_the_torch_modules(fp4lab):
    pkg = os.path.dirname(fp4lab)
    assert os.path.isfile(os.path.join(pkg, "py.typed"))
    with open(os.path.join(pkg, "_core.pyi")) as f:
        stub = f.read()
    assert "class QuantConfig" in stub and "def gemm(" in stub and "def training_seed(" in stub
    for m in ("recipe", "ops", "linear", "attention", "convert"):
        assert os.path.isfile(os.path.join(pkg, "torch", m + ".py")), m
    assert run_installed("import fp4lab.torch as ft, torch; print(torch.ops.fp4lab.gemm.default.name())") == \
        "fp4lab::gemm"


def test_installed_package_holds_the_paired_statistics(fp4lab):
    # The module `fp4lab-train report` uses, importable from the installed package: three paired differences
    # whose 95% interval (t with 2 df) is 0.4867 ± 0.8199 and holds zero.
    out = run_installed("from fp4lab import paired\n"
                        "s = paired.paired_stats([0.12, 0.76, 0.58])\n"
                        "print(s.kind, f'{s.mean:.4f} {s.half:.4f}')")
    assert out == "undetected 0.4867 0.8199"


def test_installed_package_leaves_out_the_lab_and_the_test_oracle(fp4lab):
    # The wheel ships python/fp4lab alone: the simulator's validation campaign and the training study's corpus
    # readers (Debian packages, R data) and tiny-lm trainer (lab/fp4lab_lab), the numpy test oracle
    # (tests/python/cli/oracle.py) and the lab package itself are neither files of it nor importable from it.
    pkg = os.path.dirname(fp4lab)
    for m in ("simval.py", "oracle.py", "study/tiny_lm.py"):
        assert not os.path.exists(os.path.join(pkg, m)), m
    corpus = open(os.path.join(pkg, "study", "corpus.py"), encoding="utf-8").read()
    assert "!<arch>" not in corpus and "tarfile" not in corpus  # no Debian package reader
    out = run_installed("import importlib.util as u\n"
                        "print([m for m in ('fp4lab.simval', 'fp4lab.oracle', 'fp4lab_lab') if u.find_spec(m)])")
    assert out == "[]"


def test_installed_console_scripts_capture_check_and_train_recipes(fp4lab):
    # fp4lab-capture, fp4lab-train and fp4lab-monitor-plot are the installed package's (pyproject.toml
    # [project.scripts]), run away from the source tree: the check of the bundled trace, the study's recipe list,
    # and the plot's one-line refusal of a file that is not there.
    pkg = os.path.dirname(fp4lab)
    for m in ("trace", "capture", "study/__init__", "study/train", "study/report"):
        assert os.path.isfile(os.path.join(pkg, m + ".py")), m
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cap, train = (shutil.which(n, path=path) for n in ("fp4lab-capture", "fp4lab-train"))
    assert cap and train, "the fp4lab-capture / fp4lab-train console scripts are not on PATH"
    r = subprocess.run([cap, "check", os.path.join(ROOT, "workloads", "tiny-lm", "step_005000"), "--block", "128"],
                       capture_output=True, text=True, cwd="/", env=env)
    assert r.returncode == 0 and "8 gemms valid" in r.stdout, r.stderr
    r = subprocess.run([train, "recipes"], capture_output=True, text=True, cwd="/", env=env)
    assert r.returncode == 0 and "ufp4-rht-none" in r.stdout and "e2m1-ref" in r.stdout, r.stderr
    plot = shutil.which("fp4lab-monitor-plot", path=path)  # the monitor's plot, tested fully beside the monitor
    assert plot, "the fp4lab-monitor-plot console script is not on PATH"
    r = subprocess.run([plot, "/nonexistent.jsonl"], capture_output=True, text=True, cwd="/", env=env)
    assert r.returncode == 1 and r.stderr.startswith("fp4lab-monitor-plot: error: ")
    assert "/nonexistent.jsonl" in r.stderr and r.stderr.count("\n") == 1
