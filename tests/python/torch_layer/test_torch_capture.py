"""fp4lab.capture hooks, on real PyTorch modules (needs torch; skipped where it is missing).

The captured tensors are compared bit for bit with values the test controls: the input it fed, the weights,
and dY forced by a loss sum(out * R), whose gradient with respect to `out` is exactly R.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp4lab.capture as ct  # noqa: E402


def bits(t):
    """Exact bit patterns, so comparisons are of encodings, not values within a tolerance."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy()


def load(path):
    from safetensors.torch import load_file
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    return load_file(path), meta


def two_layer(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48))


def test_f32_capture_is_bit_exact(tmp_path):
    model = two_layer()
    cap = ct.TraceCapture(model, r".", {5}, str(tmp_path), metadata={"model": "two-layer test"})
    x = torch.randn(2, 128, 32)  # 256 token rows in a [batch, seq, in] input
    r = torch.randn(2, 128, 48)
    with cap.at(5):
        out = model(x)
        (out * r).sum().backward()
    files = sorted(os.listdir(tmp_path / "step_000005"))
    assert files == ["0.safetensors", "2.safetensors"]
    t0, m0 = load(str(tmp_path / "step_000005" / "0.safetensors"))
    t2, m2 = load(str(tmp_path / "step_000005" / "2.safetensors"))
    assert t0["0.fwd_x"].dtype == torch.float32 and m0["gemm_dtype"] == "float32"
    assert (bits(t0["0.fwd_x"]) == bits(x.reshape(-1, 32))).all()
    assert (bits(t0["0.fwd_w"]) == bits(model[0].weight)).all()
    assert (bits(t2["2.bwd_dy"]) == bits(r.reshape(-1, 48))).all()
    assert (bits(t2["2.fwd_x"]) == bits(torch.relu(model[0](x)).reshape(-1, 64))).all()
    # dW = dY^T X over the captured rows reproduces the weight gradient autograd computed.
    for name, t, mod in (("0", t0, model[0]), ("2", t2, model[2])):
        dw = t[f"{name}.bwd_dy"].double().T @ t[f"{name}.fwd_x"].double()
        np.testing.assert_allclose(dw.numpy(), mod.weight.grad.double().numpy(), rtol=1e-4, atol=1e-4)
    for m in (m0, m2):
        assert m["fp4lab.trace.version"] == "1" and m["step"] == "5" and m["model"] == "two-layer test"
        assert m["tokens_in_pass"] == "256" and m["calls_in_step"] == "1" and "command" in m
    rows = ct.check_trace(str(tmp_path / "step_000005"), 16)
    assert [(r["gemm"], r["tokens"], r["in"], r["out"]) for r in rows] == [("0", 256, 32, 64), ("2", 256, 64, 48)]


def test_strided_rows_and_evenly_spaced_outputs_are_one_sub_gemm(tmp_path):
    """token_stride keeps rows 0, s, 2s, ...; max_out keeps every k-th output feature: rows of W and the same
    columns of dY, bit for bit, so the three tensors remain a consistent sub-GEMM."""
    model = two_layer()
    cap = ct.TraceCapture(model, r"^0$", {1}, str(tmp_path), max_tokens=128, token_multiple=16, token_stride=4,
                          max_out=32)
    x = torch.randn(4, 128, 32)  # 512 token rows
    r = torch.randn(4, 128, 64)
    with cap.at(1):
        h = model[0](x)
        (h * r).sum().backward()
    t, m = load(str(tmp_path / "step_000001" / "0.safetensors"))
    assert t["0.fwd_x"].shape == (128, 32) and t["0.fwd_w"].shape == (32, 32) and t["0.bwd_dy"].shape == (128, 32)
    assert (bits(t["0.fwd_x"]) == bits(x.reshape(-1, 32)[0:512:4])).all()
    assert (bits(t["0.fwd_w"]) == bits(model[0].weight[0:64:2])).all()
    assert (bits(t["0.bwd_dy"]) == bits(r.reshape(-1, 64)[0:512:4, 0:64:2])).all()
    assert m["out_features_kept"] == "32 of 64, every 2th from 0" and m["tokens_kept"].startswith("128 rows, every 4th")
    with pytest.raises(ct.TraceError, match="max_out 24 is not a positive multiple"):
        ct.TraceCapture(model, r".", {1}, str(tmp_path), max_out=24)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("dev", DEVICES)
def test_autocast_bf16_stores_the_gemm_operands(tmp_path, dev):
    model = two_layer(1).to(dev)
    cap = ct.TraceCapture(model, r"^2$", {0}, str(tmp_path), max_tokens=200)  # keeps 128 of 384 rows
    x = torch.randn(3, 128, 32, device=dev)
    with cap.at(0):
        with torch.autocast(dev, dtype=torch.bfloat16):
            h = torch.relu(model[0](x))
            out = model[2](h)
        out.float().sum().backward()
    t, m = load(str(tmp_path / "step_000000" / "2.safetensors"))
    assert m["gemm_dtype"] == "bfloat16" and m["tokens_in_pass"] == "384"
    assert t["2.fwd_x"].dtype == torch.bfloat16 and list(t["2.fwd_x"].shape) == [128, 64]
    assert (bits(t["2.fwd_w"]) == bits(model[2].weight.to(torch.bfloat16))).all()
    assert (bits(t["2.fwd_x"]) == bits(h.reshape(-1, 64)[:128].to(torch.bfloat16))).all()
    assert (bits(t["2.bwd_dy"]) == bits(torch.ones(128, 48, dtype=torch.bfloat16))).all()
    assert t["2.fwd_x"].device.type == "cpu"


def test_unarmed_steps_write_nothing_and_later_calls_are_counted(tmp_path):
    model = two_layer()
    cap = ct.TraceCapture(model, r"^0$", {2}, str(tmp_path))
    x = torch.randn(128, 32)
    for step in range(4):
        with cap.at(step):
            for _ in range(3):  # three micro-batches: the first is kept
                model(x + step).sum().backward()
    assert os.listdir(tmp_path) == ["step_000002"]
    t, m = load(str(tmp_path / "step_000002" / "0.safetensors"))
    assert m["calls_in_step"] == "3"
    assert (bits(t["0.fwd_x"]) == bits(x + 2)).all()


def test_capture_errors_name_the_fault(tmp_path):
    with pytest.raises(ct.TraceError, match="matches no nn.Linear"):
        ct.TraceCapture(two_layer(), r"^nothing$", {0}, str(tmp_path))
    odd = torch.nn.Sequential(torch.nn.Linear(32, 40))
    with pytest.raises(ct.TraceError, match=r"module 0: out_features = 40 is not a multiple of 16"):
        ct.TraceCapture(odd, r".", {0}, str(tmp_path))
    model = two_layer()
    cap = ct.TraceCapture(model, r".", {0}, str(tmp_path))
    cap.arm(0)
    model(torch.randn(128, 32))
    with pytest.raises(ct.TraceError, match=r"step 0: no backward pass reached 0, 2"):
        cap.write()
    cap.arm(0)
    with torch.no_grad():
        model(torch.randn(128, 32))
    with pytest.raises(ct.TraceError, match="no grad-enabled forward reached"):
        cap.write()
    cap.arm(0)
    with pytest.raises(ct.TraceError, match="only 100 token rows"):
        model(torch.randn(100, 32))


SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for it in range(5):
        seen.append(model[2].weight.detach().clone())
        x = torch.randn(128, 32)
        model(x).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
        with torch.no_grad():
            model(x)  # an evaluation call: not captured
    torch.save(seen, sys.argv[1])
""")


def test_run_wraps_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "traces"
    cmd = [sys.executable, "-m", "fp4lab.capture", "run", "--pattern", r"^2$",
           "--steps", "0,3", "--out", str(out), "--meta", "model=wrapped test", "--", str(script),
           str(tmp_path / "seen.pt")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    seen = torch.load(tmp_path / "seen.pt")
    for step in (0, 3):
        t, m = load(str(out / f"step_{step:06d}" / "2.safetensors"))
        # The weight captured at step s is the one after s optimizer updates.
        assert (bits(t["2.fwd_w"]) == bits(seen[step])).all()
        assert not (bits(t["2.fwd_w"]) == bits(seen[step + 1])).all()
        assert m["step"] == str(step) and m["model"] == "wrapped test" and "capture.py run" in m["command"]
    assert sorted(os.listdir(out)) == ["step_000000", "step_000003"]

    p = subprocess.run(cmd[:7] + ["7"] + cmd[8:], capture_output=True, text=True)
    assert p.returncode == 1 and "before steps [7] were captured" in p.stderr and "the run made 5 (the last step it captures is 4)" in p.stderr
