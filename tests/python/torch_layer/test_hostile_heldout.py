"""Further hostile variants of the same classes: fp4lab.torch.convert swapping an nn.Linear whose
computation is more than its parameters (a forward of its own, hooks, a parametrized weight) and so changing the
model's output silently; libgomp's own warning printed beside fp4lab's one-line refusal of OMP_NUM_THREADS when
the Python package loads, and OMP_THREAD_LIMIT values libgomp ignores with a warning. The package comes from PYTHONPATH (ctest points it at the build's in-tree package)."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils import parametrizations  # noqa: E402

import fp4lab.torch as ft  # noqa: E402
from fp4lab import trace as ct  # noqa: E402


# ---- silent conversion: what a swap for an fp4lab Linear would drop -------------------------------------------

class _Doubled(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _hooked_after(m):
    m.register_forward_hook(lambda mod, args, out: out + 100)


def _hooked_before(m):
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 10,))


def _weight_normed(m):
    parametrizations.weight_norm(m)


MODELS = {
    "a subclass with a forward of its own": (lambda: nn.Sequential(_Doubled(32, 32)), "a forward of its own"),
    "a forward hook": (lambda: nn.Sequential(nn.Linear(32, 32)), "hooks (forward_hooks)"),
    "a forward pre-hook": (lambda: nn.Sequential(nn.Linear(32, 32)), "hooks (forward_pre_hooks)"),
    "a parametrized weight": (lambda: nn.Sequential(nn.Linear(32, 32)), "parametrized"),
}
EXTRA = {"a forward hook": _hooked_after, "a forward pre-hook": _hooked_before,
         "a parametrized weight": _weight_normed}


@pytest.mark.parametrize("what", list(MODELS))
def test_silent_conversion_convert_leaves_a_linear_it_would_change(what):
    torch.manual_seed(0)
    build, reason = MODELS[what]
    m = build()
    EXTRA.get(what, lambda layer: None)(m[0])
    x = torch.randn(16, 32)
    with torch.no_grad():
        before = m(x)
    c = ft.convert(m, "ufp4")
    (entry,) = c.fp4lab_report
    assert entry.name == "0" and entry.action == "left" and reason in entry.reason, entry
    assert not isinstance(c[0], ft.Linear)
    with torch.no_grad():
        assert torch.equal(c(x), before)


def test_silent_conversion_a_plain_linear_beside_them_is_still_converted():
    m = nn.Sequential(_Doubled(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    _hooked_after(m[2])
    c = ft.convert(m, "ufp4")
    assert [(e.name, e.action) for e in c.fp4lab_report] == [("0", "left"), ("1", "converted"), ("2", "left")]
    assert isinstance(c[1], ft.Linear) and not isinstance(c[0], ft.Linear) and not isinstance(c[2], ft.Linear)


# ---- thread counts: the refusal is the only line ---------------------------------------------------------------

@pytest.mark.parametrize("var, value", [("OMP_NUM_THREADS", "1e3"), ("OMP_NUM_THREADS", "0x10"),
                                        ("OMP_NUM_THREADS", "abc"), ("OMP_THREAD_LIMIT", "0"),
                                        ("OMP_THREAD_LIMIT", "abc"), ("OMP_THREAD_LIMIT", "-1")])
def test_thread_counts_refused_value_gives_one_line_and_no_libgomp_warning(tmp_path, var, value):
    f = str(tmp_path / "t.safetensors")
    rng = np.random.default_rng(0)
    ct.write_file(f, {f"g.{r}": rng.standard_normal((32, 16), dtype=np.float32) for r in ("fwd_x", "fwd_w", "bwd_dy")},
                  {"fp4lab.trace.version": "1"})
    code = ("import fp4lab\n"
            "try:\n"
            "    fp4lab.analyze(%r)\n"
            "except fp4lab._files.UsageError as e:\n"
            "    print(e)\n" % f)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, var: value})
    assert r.returncode == 0 and r.stderr == "", r.stderr  # libgomp: Invalid value for environment variable ...
    assert r.stdout.startswith(f"{var}={value}: not a thread count") and r.stdout.count("\n") == 1
    # The command line: the same one line, exit 2, and no libgomp warning.
    cli = os.environ.get("FP4LAB_BIN")
    if cli:
        r = subprocess.run([cli, "formats"], capture_output=True, text=True, timeout=60, env={**os.environ, var: value})
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr.startswith(f"fp4lab formats: error: {var}={value}: not a thread count"), r.stderr
        assert r.stderr.count("\n") == 1, r.stderr


def test_thread_counts_other_warnings_while_loading_are_passed_on():
    r = subprocess.run([sys.executable, "-c", "import fp4lab"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "bogus"})
    assert r.returncode == 0
    assert "OMP_PROC_BIND" in r.stderr  # only the warning about a value fp4lab itself refuses is held back


# ---- inputs that never end: a FIFO or a device where a file is read ---------------------------------------------

def test_a_fifo_or_device_as_an_input_is_one_data_error_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "train.bin")  # no writer: opening it would block for ever
    (tmp_path / "val.bin").write_bytes(b"x" * 4096)
    os.symlink("/dev/zero", tmp_path / "zero.json")  # read to its end, it would fill the memory
    code = ("import sys\n"
            "from fp4lab import _files\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        _files.read_bytes(p)\n"
            "    except _files.DataError as e:\n"
            "        print(e)\n"
            "sys.exit(__import__('fp4lab.study.cli', fromlist=['main']).main(\n"
            "    ['train', '--data', %r, '--size', 'test', '--steps', '10', '--device', 'cpu']))\n" % str(tmp_path))
    try:
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "train.bin"), str(tmp_path / "zero.json")],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail("reading a FIFO blocked")
    assert r.stdout.splitlines() == [f"{tmp_path}/train.bin: not a regular file",
                                     f"{tmp_path}/zero.json: not a regular file"]
    assert r.returncode == 1 and r.stderr == f"fp4lab-train train: error: {tmp_path}/train.bin: not a regular file\n"


# ---- the lab's study name (scripts/train_study.sh): the name of a run is file names ---------------------------------

@pytest.mark.parametrize("spec, bad", [("small:ufp4:exact:x:2000", "SEED 'x'"), ("small:../../x:exact:0:10", "RECIPE"),
                                       ("../x:ufp4:exact:0:10", "SIZE"), ("small:ufp4:slow:0:10", "MODE"),
                                       ("small:ufp4:exact:0:-5", "STEPS")])
def test_run_names_take_only_what_train_takes(spec, bad, capsys):
    from fp4lab_lab import study as lab_study  # lab/ on PYTHONPATH (tests/python/CMakeLists.txt)
    assert lab_study.main(["name", spec]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"python3 -m fp4lab_lab.study name: error: {spec}: {bad}")
    assert err.count("\n") == 1
    assert lab_study.main(["name", "small:ufp4:exact:0:2000", "test:bf16:fast:1:10:--lr 1e-3"]) == 0
    assert capsys.readouterr().out == "small-ufp4-exact-s0-2000\ntest-bf16-bf16-s1-10\n"
