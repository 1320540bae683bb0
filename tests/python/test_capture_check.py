"""fp4lab.trace (the reader and writer of trace folders, and `fp4lab-capture check`) and the bundled
workloads/tiny-lm trace. FP4LAB_BIN names the built binary (ctest sets it)."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file, load_file

from fp4lab import trace as ct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))

BUNDLED = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
META = {"fp4lab.trace.version": "1", "step": "3", "model": "synthetic"}


def write(path, tensors, meta=META):
    save_file(tensors, str(path), metadata=meta)
    return str(path)


def good(t=64, i=32, o=48, seed=0):
    r = np.random.default_rng(seed)
    return {"g.fwd_x": r.standard_normal((t, i), dtype=np.float32),
            "g.fwd_w": r.standard_normal((o, i), dtype=np.float32),
            "g.bwd_dy": r.standard_normal((t, o), dtype=np.float32)}


def test_reader_matches_safetensors_on_f32(tmp_path):
    p = write(tmp_path / "a.safetensors", good())
    meta, arrays, dtypes = ct.read_file(p)
    ref = load_file(p)
    assert meta == META and set(arrays) == set(ref) and set(dtypes.values()) == {"F32"}
    for k in ref:
        assert arrays[k].tobytes() == ref[k].tobytes()


def test_reader_decodes_bf16_bit_patterns(tmp_path):
    pats = np.array([0x3F80, 0xC040, 0x0001, 0x7F7F, 0x8000, 0x3E00], dtype="<u2")  # 1, -3, min sub, max, -0, 0.125
    want = pats.view(ml_dtypes.bfloat16).astype(np.float32)
    p = tmp_path / "b.safetensors"
    save_file({"t": pats.view(ml_dtypes.bfloat16).reshape(2, 3)}, str(p), metadata=META)
    raw = p.read_bytes()
    assert b'"dtype":"BF16"' in raw and raw.endswith(pats.tobytes())  # stored as BF16, the patterns as given
    _, arrays, dtypes = ct.read_file(str(p))
    assert dtypes["t"] == "BF16" and arrays["t"].shape == (2, 3)
    assert arrays["t"].reshape(-1).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert want[0] == 1.0 and want[1] == -3.0 and want[5] == 0.125


def test_writer_round_trips_a_record_the_cli_analyses_alike(tmp_path):
    """A bundled record read and written again by fp4lab.trace: the same tensors, bytes and metadata, and the same
    `fp4lab analyze` lists from the C++ reader."""
    src = os.path.join(BUNDLED, "layers.0.attn.proj.safetensors")
    meta, tensors = ct.read_raw(src)
    dst = str(tmp_path / "layers.0.attn.proj.safetensors")
    ct.write_file(dst, tensors, meta)
    meta2, tensors2 = ct.read_raw(dst)
    assert meta2 == meta and list(tensors2) == list(tensors)
    for k, a in tensors.items():
        assert tensors2[k].dtype == a.dtype and tensors2[k].tobytes() == a.tobytes(), k
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]  # written under a temporary name, then renamed
    out = []
    for i, p in enumerate((src, dst)):
        j = tmp_path / f"a{i}.json"
        r = subprocess.run([BIN, "analyze", "--trace", p, "--formats", "e1m2", "--json", str(j)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out.append({k: json.load(open(j))[k] for k in ("tensors", "gemms")})
    assert out[0] == out[1]
    with pytest.raises(ct.TraceError, match="dtype int32 is not BF16 or F32"):
        ct.write_file(dst, {"x": np.zeros(4, np.int32)}, {})


@pytest.mark.parametrize("fault,message", [
    ("truncated", r"not a valid safetensors file \(.*\)"),
    ("short", r"not a valid safetensors file \(.*header too small\)"),
    ("version", r'lacks "fp4lab.trace.version": "1"'),
    ("missing", r"gemm 'g' lacks tensor 'g.bwd_dy'"),
    ("shape", r"gemm 'g': shapes fwd_x \[64, 32\], fwd_w \[48, 32\], bwd_dy \[64, 40\] disagree"),
    ("block", r"gemm 'g': tokens = 56 is not a multiple of 16"),
    ("nan", r"tensor 'g.fwd_w': non-finite value at flat index 17"),
    ("dtype", r"tensor 'g.fwd_x' is F16, trace v1 allows BF16 or F32"),
])
def test_check_rejects_bad_files_naming_file_and_fault(tmp_path, fault, message):
    p = tmp_path / f"{fault}.safetensors"
    t = good()
    meta = META
    if fault == "version":
        meta = {"step": "3"}
    elif fault == "missing":
        del t["g.bwd_dy"]
    elif fault == "shape":
        t["g.bwd_dy"] = t["g.bwd_dy"][:, :40].copy()
    elif fault == "block":
        t = good(t=56)
    elif fault == "nan":
        t["g.fwd_w"].reshape(-1)[17] = np.inf
    elif fault == "dtype":
        t["g.fwd_x"] = t["g.fwd_x"].astype(np.float16)
    write(p, t, meta)
    if fault == "truncated":
        p.write_bytes(p.read_bytes()[:-10])
    elif fault == "short":
        p.write_bytes(b"\x01\x02")
    with pytest.raises(ct.TraceError, match=message) as e:
        ct.check(str(p))
    assert str(e.value).startswith(str(p))
    # The CLI prints the same fault on one line and exits 1.
    r = subprocess.run([sys.executable, "-m", "fp4lab.capture", "check", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and str(p) in r.stderr


def test_stats_are_standard_moments():
    a = np.zeros((4, 2))
    a[0, 0] = 1.0  # one spike among eight elements
    s = ct.tensor_stats(a)
    mu = 1 / 8
    var = mu - mu * mu
    kurt = ((1 - mu) ** 4 * 1 + mu ** 4 * 7) / 8 / var ** 2
    assert s["kurtosis"] == pytest.approx(kurt, rel=1e-12)
    assert s["amax_over_rms"] == pytest.approx(1 / np.sqrt(1 / 8), rel=1e-12)
    assert s["max_over_median_channel_rms"] == pytest.approx(0.5 / 0.25, rel=1e-12)  # column rms 0.5 and 0: median 0.25


# ---- the bundled trace ------------------------------------------------------------------------------------

EXPECTED = {  # gemm: (tokens, in, out) of the tiny LM in workloads/README.md
    f"layers.{b}.{n}": s for b in (0, 7) for n, s in (
        ("attn.qkv", (256, 256, 768)), ("attn.proj", (256, 256, 256)),
        ("mlp.fc1", (256, 256, 2048)), ("mlp.fc2", (256, 1024, 256)))}


@pytest.fixture(scope="module")
def bundled():
    if not os.path.isdir(BUNDLED):
        pytest.fail(f"{BUNDLED}: bundled trace missing")
    return {r["gemm"]: r for r in ct.check(BUNDLED, 128)}


def test_bundled_trace_is_valid_v1(bundled):
    assert {g: (r["tokens"], r["in"], r["out"]) for g, r in bundled.items()} == EXPECTED
    for g, r in bundled.items():
        assert r["dtype"] == "BF16" and r["step"] == "5000"
        assert "train_tiny_lm.py train" in r["command"] and "TinyLM" in r["model"]
    total = sum(os.path.getsize(os.path.join(BUNDLED, f)) for f in os.listdir(BUNDLED))
    assert total <= 16 * 10**6


def test_bundled_fc2_input_is_outlier_heavier_than_fc1_input(bundled):
    # SwiGLU's product silu(gate) * up gives fc2 a heavy-tailed input; fc1 reads the RMS-normalised stream.
    for b in (0, 7):
        fc1, fc2 = bundled[f"layers.{b}.mlp.fc1"]["x"], bundled[f"layers.{b}.mlp.fc2"]["x"]
        assert fc2["kurtosis"] > 2 * fc1["kurtosis"], (b, fc1, fc2)
        assert fc2["amax_over_rms"] > fc1["amax_over_rms"], (b, fc1, fc2)
