"""New variants of issue 49's classes that the first fixes missed: fp4lab.torch.convert swapping an nn.Linear whose
computation is more than its parameters (a forward of its own, hooks, a parametrized weight) and so changing the
model's output silently; and libgomp's own warning printed beside fp4lab's one-line refusal of OMP_NUM_THREADS when
the Python package loads. The package comes from PYTHONPATH (ctest points it at the build's in-tree package)."""
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

@pytest.mark.parametrize("value", ["1e3", "0x10", "abc"])
def test_thread_counts_refused_value_gives_one_line_and_no_libgomp_warning(tmp_path, value):
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
                       env={**os.environ, "OMP_NUM_THREADS": value})
    assert r.returncode == 0 and r.stderr == "", r.stderr  # libgomp: Invalid value for environment variable ...
    assert r.stdout.startswith(f"OMP_NUM_THREADS={value}: not a thread count") and r.stdout.count("\n") == 1


def test_thread_counts_other_warnings_while_loading_are_passed_on():
    r = subprocess.run([sys.executable, "-c", "import fp4lab"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "bogus"})
    assert r.returncode == 0
    assert "OMP_PROC_BIND" in r.stderr  # only the warning about a value fp4lab itself refuses is held back
