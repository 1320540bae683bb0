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

import oracle  # tests/python/cli/oracle.py
from fp4lab import _core
from fp4lab import trace as ct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))

BUNDLED = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
BUNDLED_TRACES = [BUNDLED, os.path.join(ROOT, "workloads", "doc-lm", "step_001999")]
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
    ("truncated", "tensor 'g.fwd_x': data_offsets [18432, 26624) run past the end of the data section (26614 bytes "
                  "of data)"),  # the reference writer puts fwd_x last
    ("short", "file is 2 bytes, shorter than the 8-byte header length"),
    ("version", '__metadata__ lacks "fp4lab.trace.version" (not an fp4lab trace v1 file)'),
    ("missing", "gemm 'g': tensor 'g.bwd_dy' is missing"),
    ("shape", "gemm 'g': out mismatch: fwd_w [48, 32] [out, in] vs bwd_dy [64, 40] [tokens, out]"),
    ("block", "gemm 'g': tokens = 56 is not a multiple of the block size 16"),
    ("nan", "tensor 'g.fwd_w' element 17 is +Inf"),
    ("dtype", "gemm 'g': 'g.fwd_x' has dtype F16; trace v1 takes BF16 or F32"),
])
def test_check_rejects_bad_files_naming_file_and_fault(tmp_path, fault, message):
    """fp4lab.trace.check faults are the C++ reader's: the message `fp4lab analyze` gives for the same file."""
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
    with pytest.raises(ct.TraceError) as e:
        ct.check(str(p))
    assert str(e.value) == f"{p}: {message}"
    # The check command prints the same fault on one line and exits 1, as `fp4lab analyze` does.
    r = subprocess.run([sys.executable, "-m", "fp4lab.capture", "check", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == f"fp4lab-capture: error: {p}: {message}\n"
    r = subprocess.run([BIN, "analyze", "--trace", str(p)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == f"fp4lab analyze: error: {p}: {message}\n"


@pytest.mark.parametrize("trace", BUNDLED_TRACES, ids=os.path.basename)
def test_reads_of_the_bundled_traces_equal_the_oracles(trace):
    """Every tensor of every file, as fp4lab.trace reads it through the C++ reader, against the oracle's own numpy
    reader (tests/python/cli/oracle.py): the same names in the same order, metadata, dtypes, shapes and bytes; the float32 values
    of read_file, records and check bit for bit."""
    names = sorted(f for f in os.listdir(trace) if f.endswith(".safetensors"))
    assert len(names) == 8
    want_records = oracle.load_trace(trace)
    for fn in names:
        path = os.path.join(trace, fn)
        meta, raw = ct.read_raw(path)
        ometa, otensors = oracle.read_safetensors(path)
        assert meta == ometa and meta["fp4lab.trace.version"] == "1"
        assert list(raw) == list(otensors)
        meta2, arrays, dtypes = ct.read_file(path)
        assert meta2 == meta and list(arrays) == list(raw)
        for name, a in raw.items():
            odt, oa = otensors[name]
            assert ct.dtype_name(a) == dtypes[name] == odt and a.shape == oa.shape, name
            assert a.tobytes() == oa.tobytes(), name
            assert arrays[name].dtype == np.float32
            assert arrays[name].tobytes() == oracle.as_f32(odt, oa).tobytes(), name
    got = ct.records(trace)
    assert [g for g, *_ in got] == [g for g, *_ in want_records]
    for (g, *ts), (_, *ots) in zip(got, want_records):
        for t, o in zip(ts, ots):
            assert t.dtype == np.float32 and t.shape == o.shape and t.tobytes() == o.tobytes(), g
    rows = ct.check(trace)
    assert [(r["gemm"], r["tokens"], r["in"], r["out"]) for r in rows] == \
        [(g, x.shape[0], x.shape[1], w.shape[0]) for g, x, w, _ in want_records]
    for r, (_, x, w, dy) in zip(rows, want_records):
        assert r["x"] == ct.tensor_stats(x) and r["w"] == ct.tensor_stats(w) and r["dy"] == ct.tensor_stats(dy)


def test_writer_output_reads_back_in_the_oracle(tmp_path):
    """What fp4lab.trace writes (the C++ writer), read by the oracle's independent reader: bytes, dtypes, order and
    metadata as given; torch tensors and numpy arrays alike."""
    r = np.random.default_rng(3)
    bf = r.standard_normal((16, 8)).astype(np.float32).astype(ml_dtypes.bfloat16)
    tensors = {"z.fwd_w": r.standard_normal((4, 32), dtype=np.float32), "a.x": bf, "empty": np.zeros((0, 3), np.float32)}
    p = tmp_path / "w.safetensors"  # an os.PathLike, as the functions take
    ct.write_file(p, tensors, {"step": 7, "note": "ünïcode"})
    meta, got = oracle.read_safetensors(p)
    assert meta == {"step": "7", "note": "ünïcode"} and list(got) == list(tensors)
    for name, a in tensors.items():
        assert got[name][0] == ct.dtype_name(a) and got[name][1].shape == a.shape and got[name][1].tobytes() == a.tobytes()
        assert ct.read_raw(p)[1][name].tobytes() == a.tobytes()
    assert os.listdir(tmp_path) == ["w.safetensors"]  # written under a temporary name, then renamed
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(r.standard_normal((2, 16), dtype=np.float32)).to(torch.bfloat16)
    ct.write_file(p, {"t": t}, {})
    _, got = oracle.read_safetensors(p)
    assert got["t"][0] == "BF16" and got["t"][1].tobytes() == t.view(torch.int16).numpy().tobytes()


def test_dtype_table_is_the_readers():
    """fp4lab.trace's numpy dtype for each safetensors dtype name covers exactly the C++ reader's set, sizes equal."""
    assert {n: d.itemsize for n, d in ct._dtypes().items()} == _core.safetensors_dtypes()


def _hostile(tmp_path, kind):
    p = tmp_path / f"{kind}.safetensors"
    good_blob = (tmp_path / "ok.safetensors")
    save_file(good(), str(good_blob), metadata=META)
    blob = good_blob.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    if kind == "truncated":
        p.write_bytes(blob[:8 + n + 100])
    elif kind == "malformed":
        p.write_bytes(blob[:8] + blob[8:8 + n].replace(b"{", b"[", 1) + blob[8 + n:])
    elif kind == "dtype":
        p.write_bytes(blob.replace(b'"F32"', b'"F31"', 1))
    elif kind == "huge":
        p.write_bytes((1 << 62).to_bytes(8, "little") + blob[8:])
    elif kind == "newline":
        p = tmp_path / "a\nb.safetensors"
        p.write_bytes(b"")
    return p


@pytest.mark.parametrize("kind,fault", [
    ("truncated", "tensor 'g.bwd_dy': data_offsets [0, 12288) run past the end of the data section (100 bytes of data)"),
    ("malformed", "header is not valid JSON (syntax error near byte"),
    ("dtype", 'unknown dtype "F31"'),
    ("huge", "header length 4611686018427387904 is absurd (limit 104857600 bytes)"),
    ("newline", "file is 0 bytes, shorter than the 8-byte header length"),
])
def test_hostile_files_give_one_line_errors(tmp_path, kind, fault):
    p = _hostile(tmp_path, kind)
    for f in (ct.read_raw, ct.read_file, ct.check, ct.records):
        with pytest.raises(ct.TraceError) as e:
            f(str(p))
        text = str(e.value)
        assert "\n" not in text and fault in text, (f.__name__, text)
        assert text.startswith(str(p).replace("\n", "\\x0A") + ": "), text
    assert isinstance(e.value, ValueError)


def test_missing_paths_and_unwritable_outputs_give_one_line_errors(tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(ct.TraceError, match="cannot open: No such file or directory") as e:
        ct.read_raw(missing)
    assert str(e.value).startswith(missing)
    with pytest.raises(ct.TraceError, match="file is a directory, not a regular file"):
        ct.read_raw(str(tmp_path))
    with pytest.raises(ct.TraceError, match="folder holds no .safetensors files"):
        ct.check(str(tmp_path))
    out = str(tmp_path / "no" / "such" / "folder" / "x.safetensors")
    with pytest.raises(ct.TraceError) as e:
        ct.write_file(out, good(), META)
    assert str(e.value).startswith(out + ": ") and "\n" not in str(e.value)


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
