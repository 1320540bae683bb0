"""fp4lab.torch.monitor: on sampled steps one JSONL line per layer, pass and operand, with values computed from the
operands the layer quantised (checked against fp4lab.quantize of the same operand); nothing on other steps or
once closed; the same lines from the same run; and the plot script reading them."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import fp4lab
import fp4lab.torch as ft
from fp4lab.torch.monitor import operand_stats

ROOT = Path(__file__).resolve().parents[3]


def make_model(recipe="ufp4"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))
    return ft.convert(m, ft.Recipe(recipe, seed=3))


def run(model, steps, capture=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, t = torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)
        if capture is not None:
            capture.append(x)
        x.requires_grad_(True)  # so the first layer runs its dgrad too
        loss = (model(x) - t).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_sampled_steps_every_layer_pass_operand(tmp_path, recipe):
    model = make_model(recipe)
    with ft.monitor(model, every=2, out=tmp_path / "m.jsonl") as mon:
        run(model, 5)
    recs = read(tmp_path / "m.jsonl")
    assert mon.records == len(recs)
    keys = {(r["step"], r["layer"], r["pass"], r["operand"]) for r in recs}
    want = {(s, l, p, o) for s in (0, 2, 4) for l in ("0", "2") for p in ("fwd_y", "bwd_dx", "bwd_dw")
            for o in ("a", "b")}
    assert keys == want and len(recs) == len(want)  # steps 1 and 3 recorded nothing
    for r in recs:
        for k in ("sqnr_db", "amax", "frac_zero", "frac_sat", "gemm_sqnr_db"):
            assert isinstance(r[k], float) and math.isfinite(r[k]), (r, k)
        assert 0 <= r["frac_zero"] < 1 and 0 <= r["frac_sat"] < 1
        assert 0 < r["sqnr_db"] < 60 and 0 < r["gemm_sqnr_db"] < 60  # 4-bit operands: tens of dB, not exact
    fwd = {(r["layer"], r["operand"]): r for r in recs if r["step"] == 0 and r["pass"] == "fwd_y"}
    assert fwd[("0", "a")]["shape"] == [32, 64] and fwd[("0", "b")]["shape"] == [128, 64]
    assert fwd[("2", "a")]["shape"] == [32, 128]
    assert all(r["amax"] > 0 and r["frac_sat"] > 0 for r in fwd.values())  # each block's amax maps to the top code


def test_values_match_fp4lab_quantize(tmp_path):
    """The first layer's fwd_y operands at step 0 (the input and the weight as they were), quantised apart with
    fp4lab.quantize under the recipe's config for that layer and step, give the recorded statistics."""
    model = make_model("ufp4")
    w0 = model[0].weight.detach().clone()
    xs = []
    with ft.monitor(model, every=3, out=tmp_path / "m.jsonl"):
        run(model, 1, capture=xs)
    recs = {(r["layer"], r["pass"], r["operand"]): r for r in read(tmp_path / "m.jsonl")}
    lin = model[0]
    for op, x in (("a", xs[0]), ("b", w0)):
        cfg = lin.recipe.config("fwd_y", op, layer=lin.layer_id, step=0)
        x = x.detach()
        q = fp4lab.quantize_with(x.numpy(), cfg)
        st = operand_stats(x.detach(), q, cfg)
        r = recs[("0", "fwd_y", op)]
        for k in ("sqnr_db", "amax", "frac_zero", "frac_sat"):
            assert r[k] == st[k], (op, k)
        # the SQNR from its definition, on the unrotated input (ufp4 rotates fwd_y operands: energy kept)
        ref = np.asarray(fp4lab._core.rotate(x.numpy(), cfg))
        dq = q.dequantize().astype(np.float64)
        want = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - dq) ** 2))
        assert r["sqnr_db"] == pytest.approx(want, rel=1e-12)
        assert r["amax"] == float(np.abs(x.numpy()).max())
    a = recs[("0", "fwd_y", "a")]
    y = (fp4lab.gemm(fp4lab.quantize_with(xs[0].detach().numpy(), lin.recipe.config("fwd_y", "a", layer=lin.layer_id,
                                                                              step=0)),
                     fp4lab.quantize_with(w0.numpy(), lin.recipe.config("fwd_y", "b", layer=lin.layer_id, step=0))))
    ref = xs[0].detach().double() @ w0.double().t()
    want = 10 * np.log10((ref ** 2).sum().item() / ((ref - torch.from_numpy(y).double()) ** 2).sum().item())
    assert a["gemm_sqnr_db"] == pytest.approx(want, rel=1e-12)


def test_off_by_default_closed_and_deterministic(tmp_path):
    model = make_model()
    run(model, 1)
    assert ft.ops.observers == []  # nothing watches a model unless asked
    outs = []
    for i in range(2):
        model = make_model()
        mon = ft.monitor(model, every=1, out=tmp_path / f"m{i}.jsonl")
        run(model, 2)
        mon.close()
        assert ft.ops.observers == []
        run(model, 1)  # after close: nothing more
        outs.append((tmp_path / f"m{i}.jsonl").read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 2 * 2 * 3 * 2


def test_unsampled_steps_write_nothing(tmp_path):
    model = make_model()
    ft.set_step(model, 1)
    with ft.monitor(model, every=10, out=tmp_path / "m.jsonl") as mon:
        run(model, 9)  # steps 1..9
    assert mon.records == 0 and (tmp_path / "m.jsonl").read_text() == ""


def test_eval_and_recomputation_not_recorded(tmp_path):
    """An evaluation forward at a sampled step adds nothing; a checkpointed model records each forward once."""
    model = make_model()
    with ft.monitor(model, every=1, out=tmp_path / "m.jsonl") as mon:
        model.eval()
        with torch.no_grad():
            model(torch.randn(32, 64))
        assert mon.records == 0
        model.train()
        x = torch.randn(32, 64, requires_grad=True)
        torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False).pow(2).mean().backward()
    keys = [(r["layer"], r["pass"], r["operand"]) for r in read(tmp_path / "m.jsonl")]
    assert len(keys) == len(set(keys)) == 2 * 3 * 2


def test_plot_script(tmp_path):
    model = make_model()
    with ft.monitor(model, every=1, out=tmp_path / "m.jsonl"):
        run(model, 3)
    plot = [sys.executable, "-m", "fp4lab.monitor_plot"]  # the console script fp4lab-monitor-plot
    r = subprocess.run(plot + [str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "m.png")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Not the monitor's JSONL: one line naming the file and line, exit 1, nothing written (no temporary either).
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    good = json.loads(lines[0])
    bad_lines = ["{not json", '{"step": 1}', json.dumps(dict(good, step="x")), json.dumps(dict(good, step=1e400)),
                 json.dumps(dict(good, layer=7)), json.dumps(dict(good, sqnr_db=[1])), "[" * 100000]
    cases = [([lines[0], b], ":2: ") for b in bad_lines] + [([lines[0], "\udcff"], ":2: ")]
    for bad, needle in cases:
        (tmp_path / "bad.jsonl").write_bytes("\n".join(bad).encode("utf-8", "surrogateescape") + b"\n")
        r = subprocess.run(plot + [str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "bad.png")],
                           capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert r.stderr.startswith("fp4lab-monitor-plot: error: ") and "bad.jsonl" in r.stderr
    r = subprocess.run(plot + [str(tmp_path / "absent.jsonl")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "absent.jsonl" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "bad.png").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_tensorboard_where_importable(tmp_path):
    """The same scalars go to TensorBoard event files where tensorboard is importable, and none are written (and
    nothing fails) where it is not."""
    try:
        import tensorboard  # noqa: F401
        have = True
    except ImportError:
        have = False
    model = make_model()
    with ft.monitor(model, every=1, out=tmp_path / "m.jsonl", tensorboard=tmp_path / "tb") as mon:
        run(model, 1)
    assert mon.records == 2 * 3 * 2
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    if not have:
        assert events == []
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert len(events) == 1 and len(acc.Tags()["scalars"]) == mon.records * 5
    rec = read(tmp_path / "m.jsonl")[0]
    ev = acc.Scalars(f"{rec['layer']}/{rec['pass']}/{rec['operand']}/sqnr_db")
    assert [e.step for e in ev] == [0] and ev[0].value == pytest.approx(rec["sqnr_db"], rel=1e-6)  # stored as FP32


def test_unsampled_steps_run_the_unobserved_path(tmp_path, monkeypatch):
    # Between sampled steps the layers keep their own path (fused fake quantisation in fast mode on the GPU).
    from fp4lab.torch import ops
    calls = []
    real = ops._qmatmul_observed
    monkeypatch.setattr(ops, "_qmatmul_observed", lambda *a, **k: calls.append(int(a[2])) or real(*a, **k))
    model = make_model()
    with ft.monitor(model, every=3, out=tmp_path / "m.jsonl"):
        run(model, 5)
    assert sorted(set(calls)) == [0, 3] and len(calls) == 2 * 2 * 3  # steps 0 and 3: 2 layers x 3 GEMMs


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_cuda_records_are_the_host_records_within_fp64_summation(tmp_path, recipe):
    # On the GPU the statistics are computed there; the operands and quantised bits are the host's (exact mode), so
    # the records differ from the host's only by the FP64 sums' order: 1e-9 relative is far below any use.
    # ReLU, not GELU, and no bias: the GPU's erf and column sums need not round as the CPU's, and the next step's
    # operands would differ.
    def relu_model():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 32, bias=False))
        return ft.convert(m, ft.Recipe(recipe, seed=3))

    host, dev = relu_model(), relu_model().cuda()
    with ft.monitor(host, every=2, out=tmp_path / "h.jsonl"):
        run(host, 3)
    with ft.monitor(dev, every=2, out=tmp_path / "d.jsonl"):
        opt = torch.optim.SGD(dev.parameters(), lr=0.05)
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            x, t = torch.randn(32, 64, generator=g).cuda(), torch.randn(32, 32, generator=g).cuda()
            loss = (dev(x.requires_grad_(True)) - t).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    h, d = read(tmp_path / "h.jsonl"), read(tmp_path / "d.jsonl")
    assert len(h) == len(d) == 2 * 2 * 3 * 2
    for rh, rd in zip(h, d):
        for k in ("step", "layer", "pass", "operand", "shape", "label", "amax", "frac_zero", "frac_sat"):
            assert rh[k] == rd[k], (k, rh, rd)
        for k in ("sqnr_db", "gemm_sqnr_db"):
            assert rd[k] == pytest.approx(rh[k], rel=1e-9), (k, rh, rd)


def test_close_stops_watching_even_when_the_last_read_back_fails(tmp_path, monkeypatch):
    from fp4lab.torch import ops
    model = make_model()
    mon = ft.monitor(model, every=1, out=tmp_path / "m.jsonl")

    def fail():
        raise RuntimeError("device fault")
    monkeypatch.setattr(mon, "flush", fail)
    with pytest.raises(RuntimeError, match="device fault"):
        mon.close()
    assert mon not in ops.observers and mon._file.closed
