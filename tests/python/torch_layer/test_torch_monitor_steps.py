"""fp4lab.torch.monitor counts optimizer steps (``micro_batches`` forwards each, under gradient accumulation), and
fp4lab-monitor-plot's default figure is one heatmap per (statistic, pass), layers by steps, with no legend: a
32-block Llama's 224 GEMMs stay one pixel row each rather than 1,344 legend entries."""
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import fp4lab.torch as ft
from fp4lab import monitor_plot


def make_model():
    torch.manual_seed(0)
    return ft.convert(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)), ft.Recipe("nvfp4", seed=3))


def train(model, steps, micro_batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        opt.zero_grad()
        for j in range(micro_batches):  # gradient accumulation: micro_batches forwards per optimizer step
            g = torch.Generator().manual_seed(i * 10 + j)
            x, t = torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)
            ((model(x.requires_grad_(True)) - t).pow(2).mean() / micro_batches).backward()
        opt.step()


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_steps_are_optimizer_steps_under_gradient_accumulation(tmp_path):
    model = make_model()
    with ft.monitor(model, every=2, out=tmp_path / "m.jsonl", micro_batches=3) as mon:
        train(model, 5, 3)
    recs = read(tmp_path / "m.jsonl")
    assert mon.records == len(recs) == 3 * 2 * 3 * 2  # optimizer steps 0, 2, 4: 2 layers, 3 passes, 2 operands
    assert sorted({(r["step"], r["sr_step"]) for r in recs}) == [(0, 0), (2, 6), (4, 12)]  # first micro-batches
    assert model[0].step == 15
    # Without accumulation the two counts agree.
    model = make_model()
    with ft.monitor(model, every=2, out=tmp_path / "n.jsonl"):
        train(model, 3, 1)
    assert sorted({(r["step"], r["sr_step"]) for r in read(tmp_path / "n.jsonl")}) == [(0, 0), (2, 2)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_micro_batches_must_be_a_positive_int(tmp_path, bad):
    with pytest.raises(ValueError, match=r"^monitor\(\): micro_batches must be a positive int, not "):
        ft.monitor(make_model(), every=1, out=tmp_path / "m.jsonl", micro_batches=bad)
    assert not (tmp_path / "m.jsonl").exists()


def test_default_plot_is_a_layer_by_step_heatmap_per_pass(tmp_path):
    model = make_model()
    with ft.monitor(model, every=1, out=tmp_path / "m.jsonl"):
        train(model, 2, 1)
    template = read(tmp_path / "m.jsonl")
    # A 32-block model's worth of GEMMs (224, as a Llama's 7 per block) at 3 steps, from the real records.
    names = [f"model.layers.{b}.p{i}" for b in range(32) for i in range(7)]
    lines = [json.dumps(dict(r, layer=name, step=s)) for s in (0, 5, 10) for name in names for r in template
             if r["layer"] == "0" and r["step"] == 0]
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = monitor_plot._heatmaps(plt, monitor_plot.read(str(tmp_path / "big.jsonl")))
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4 * 3  # statistics x passes
    shapes = sorted(ax.images[0].get_array().shape for ax in panels)
    assert shapes == [(224, 3)] * 3 + [(448, 3)] * 9  # GEMM SQNR: a row per GEMM; operand statistics: A and B
    assert all(ax.get_legend() is None and len(ax.get_yticklabels()) <= 40 for ax in panels)
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["0", "5", "10"]
    plt.close(fig)
    for extra in ([], ["--lines"]):
        out = tmp_path / f"m{len(extra)}.png"
        r = subprocess.run([sys.executable, "-m", "fp4lab.monitor_plot", str(tmp_path / "m.jsonl"), "-o", str(out)]
                           + extra, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
