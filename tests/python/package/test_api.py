"""The numpy API of the fp4lab package against the fp4lab command line, bit for bit, on the bundled real trace:
every recipe, pass and operand role, knob overrides, BF16 input, the contract GEMM, and the error messages.

FP4LAB_BIN names the built command line (ctest sets it); the package comes from PYTHONPATH (ctest points it at
the build's in-tree package) or from an installed wheel."""
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import fp4lab

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
TRACE = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
LAYER = os.path.join(TRACE, "layers.7.mlp.fc2.safetensors")
ROLES = {"fwd_y": ("fwd_x", "fwd_w"), "bwd_dx": ("bwd_dy", "fwd_w"), "bwd_dw": ("bwd_dy", "fwd_x")}
RECIPES = ["ufp4", "e2m1-ref", "nvfp4", "mxfp4"]


def cli(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    return r


def cli_error(*args):
    r = cli(*args)
    assert r.returncode in (1, 2), (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    return line.split(": error: ", 1)[1]


@pytest.fixture(scope="module")
def layer():
    d = load_file(LAYER)
    return {k.rsplit(".", 1)[1]: v for k, v in d.items()}  # fwd_x, fwd_w, bwd_dy as ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def operands(layer, tmp_path_factory):
    """Each role as the K-major operand of each pass (the trace tensor or its transpose), in BF16, and a file
    holding them for the CLI."""
    ops = {}
    for p, roles in ROLES.items():
        for o, role in zip("ab", roles):
            t = layer[role]
            if p == "bwd_dx" and role == "fwd_w":
                t = t.T
            if p == "bwd_dw":
                t = t.T
            ops[(p, o)] = np.ascontiguousarray(t)
    path = str(tmp_path_factory.mktemp("ops") / "ops.safetensors")
    save_file({f"{p}.{o}": v.astype(np.float32) for (p, o), v in ops.items()}, path)
    return ops, path


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def read_quantized(path, name):
    d = load_file(path)
    return {k[len(name) + 1:]: v for k, v in d.items()}


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantize_matches_cli_for_every_pass_and_role(recipe, operands, tmp_path):
    ops, path = operands
    for p, roles in ROLES.items():
        for o, role in zip("ab", roles):
            out = str(tmp_path / f"{p}{o}.safetensors")
            r = cli("quantize", "--in", path, "--tensor", f"{p}.{o}", "--recipe", recipe, "--pass", p, "--role", role,
                    "--out", out)
            assert r.returncode == 0, r.stderr
            ref = read_quantized(out, f"{p}.{o}")
            q = fp4lab.quantize(ops[(p, o)], recipe, pass_=p, role=role)  # BF16 input, converted exactly
            assert np.array_equal(q.codes, ref["codes"]), (recipe, p, role)
            assert np.array_equal(bits(q.scales), bits(ref["scales"])), (recipe, p, role)
            if q.scale_codes is None:
                assert "scale_codes" not in ref
            else:
                assert np.array_equal(q.scale_codes, ref["scale_codes"])
            assert np.float32(q.global_scale).view(np.uint32) == bits(ref["global_scale"])[0]
            assert np.array_equal(bits(q.dequantize()), bits(ref["dequant"])), (recipe, p, role)


KNOB_SETS = [
    (["--format", "int4", "--scale", "ue8m0-ceil", "--block", "32"], dict(format="int4", scale="ue8m0-ceil", block=32)),
    (["--format", "e2m1_max2", "--rht", "32", "--rht-seed", "7"], dict(format="e2m1_max2", rht=32, rht_seed=7)),
    (["--recipe", "ufp4", "--role", "bwd_dy", "--seed", "123", "--stream", "5"],
     dict(recipe="ufp4", role="bwd_dy", seed=123, stream=5)),
    (["--recipe", "nvfp4", "--role", "fwd_w", "--tile2d=false", "--rht", "16", "--rht-bf16"],
     dict(recipe="nvfp4", role="fwd_w", tile2d=False, rht=16, rht_bf16=True)),
    (["--format", "e1m2", "--rht-signs", "+1,-1,+1,-1,-1,+1,+1,-1,+1,+1,+1,-1,-1,-1,+1,-1", "--rounding", "sr"],
     dict(format="e1m2", rht_signs=[1, -1, 1, -1, -1, 1, 1, -1, 1, 1, 1, -1, -1, -1, 1, -1], rounding="sr")),
]


@pytest.mark.parametrize("args,knobs", KNOB_SETS)
def test_knobs_match_cli(args, knobs, layer, tmp_path):
    x = np.ascontiguousarray(layer["fwd_x"][:64].astype(np.float32))
    src = str(tmp_path / "x.safetensors")
    save_file({"x": x}, src)
    out = str(tmp_path / "q.safetensors")
    r = cli("quantize", "--in", src, "--tensor", "x", *args, "--out", out)
    assert r.returncode == 0, r.stderr
    ref = read_quantized(out, "x")
    knobs = dict(knobs)
    q = fp4lab.quantize(x, knobs.pop("recipe", None), role=knobs.pop("role", None), **knobs)
    assert np.array_equal(q.codes, ref["codes"])
    assert np.array_equal(bits(q.dequantize()), bits(ref["dequant"]))


@pytest.mark.parametrize("recipe", RECIPES)
def test_gemm_matches_cli_for_every_pass(recipe, operands, tmp_path):
    ops, path = operands
    for p in ROLES:
        out = str(tmp_path / f"{p}.safetensors")
        r = cli("gemm", "--a", f"{path}:{p}.a", "--b", f"{path}:{p}.b", "--recipe", recipe, "--pass", p, "--out", out)
        assert r.returncode == 0, r.stderr
        ref = load_file(out)["C"]
        qa = fp4lab.quantize(ops[(p, "a")], recipe, pass_=p, role=ROLES[p][0])
        qb = fp4lab.quantize(ops[(p, "b")], recipe, pass_=p, role=ROLES[p][1])
        c = fp4lab.gemm(qa, qb)
        assert c.dtype == np.float32 and c.shape == ref.shape
        assert np.array_equal(bits(c), bits(ref)), (recipe, p)


def test_config_operand_matches_role():
    for r in RECIPES:
        for p, (ra, rb) in ROLES.items():
            assert fp4lab.config(r, pass_=p, operand="a").to_dict() == fp4lab.config(r, pass_=p, role=ra).to_dict()
            assert fp4lab.config(r, pass_=p, operand="b").to_dict() == fp4lab.config(r, pass_=p, role=rb).to_dict()


def test_formats_are_the_spec_grids():
    f = {d["name"]: d for d in fp4lab.formats()}
    assert f["e2m1"]["levels"] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert f["e1m2"]["levels"] == [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75]
    assert f["int4"]["levels"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert f["e2m1_max2"]["levels"] == [0, 0.5, 1, 1.5, 2]
    assert f["e2m1"]["int_levels"] == [0, 1, 2, 3, 4, 6, 8, 12]


def test_recipes_table():
    r = fp4lab.recipes()
    assert set(r) == set(RECIPES)
    u = r["ufp4"]
    for p in ROLES:  # RHT-16 on all three GEMMs, E1M2, fp32 scales
        for o in "ab":
            assert (u[p][o]["format"], u[p][o]["rht"], u[p][o]["scale"]) == ("e1m2", 16, "fp32")
    assert u["bwd_dx"]["a"]["role"] == "bwd_dy" and u["bwd_dx"]["a"]["rounding"] == "sr"
    assert u["fwd_y"]["a"]["rounding"] == "rtne" and u["bwd_dw"]["b"]["rounding"] == "rtne"
    e = r["e2m1-ref"]
    assert [e[p]["a"]["rht"] for p in ROLES] == [0, 0, 16]
    n = r["nvfp4"]
    assert n["fwd_y"]["b"]["tile2d"] and n["bwd_dx"]["b"]["tile2d"] and not n["fwd_y"]["a"]["tile2d"]
    assert n["bwd_dw"]["a"]["rht_bf16"] and n["fwd_y"]["a"]["scale"] == "ue4m3"
    m = r["mxfp4"]
    assert all(m[p][o]["block"] == 32 and m[p][o]["scale"] == "ue8m0" and m[p][o]["rht"] == 0
               for p in ROLES for o in "ab")


def test_version():
    assert fp4lab.__version__.count(".") == 2


# ---- bad input: the CLI's one-line messages, as exceptions ------------------------------------------------------

def test_dtype_rank_contiguity():
    with pytest.raises(TypeError, match="float32 or ml_dtypes.bfloat16"):
        fp4lab.quantize(np.zeros((4, 16)), format="e1m2")  # float64
    with pytest.raises(TypeError, match="numpy array"):
        fp4lab.quantize([[0.0] * 16], format="e1m2")
    with pytest.raises(ValueError, match="2-D"):
        fp4lab.quantize(np.zeros((2, 4, 16), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        fp4lab.quantize(np.zeros((32, 16), np.float32).T)


def test_shape_faults_carry_the_cli_message(tmp_path):
    x = np.ones((4, 40), np.float32)
    src = str(tmp_path / "x.safetensors")
    save_file({"x": x}, src)
    want = cli_error("quantize", "--in", src, "--tensor", "x", "--out", str(tmp_path / "o.safetensors"))
    with pytest.raises(ValueError) as e:
        fp4lab.quantize(x)
    assert str(e.value) in want and "not a multiple of the block size 16" in str(e.value)
    with pytest.raises(ValueError, match="not a multiple of the RHT size 32"):
        fp4lab.quantize(np.ones((4, 48), np.float32), rht=32, rht_seed=1)


def test_nonfinite_input():
    x = np.ones((2, 16), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match="element 19 is NaN"):
        fp4lab.quantize(x)
    x[1, 3] = np.inf
    with pytest.raises(ValueError, match="element 19 is Inf"):
        fp4lab.quantize(x.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("args,knobs", [
    (["--format", "e3m0"], dict(format="e3m0")),
    (["--recipe", "fp8"], dict(recipe="fp8")),
    (["--rht", "24"], dict(rht=24)),
    (["--rht-signs", "+1,0"], dict(rht_signs=[1, 0])),
    (["--tile2d", "--block", "32"], dict(tile2d=True, block=32)),
    (["--seed", "-1"], dict(seed=-1)),
    (["--stream", "4294967296"], dict(stream=2**32)),
])
def test_bad_knobs_carry_the_cli_message(args, knobs, tmp_path):
    src = str(tmp_path / "x.safetensors")
    save_file({"x": np.ones((16, 64), np.float32)}, src)
    want = cli_error("quantize", "--in", src, "--tensor", "x", *args, "--out", str(tmp_path / "o.safetensors"))
    knobs = dict(knobs)
    with pytest.raises(ValueError) as e:
        fp4lab.quantize(np.ones((16, 64), np.float32), knobs.pop("recipe", None), **knobs)
    assert str(e.value) == want


@pytest.mark.parametrize("knobs", [dict(seed="7"), dict(block="16"), dict(rht="16"), dict(tile2d="true"),
                                   dict(rht_signs="+1,-1"), dict(format=3)])
def test_knob_values_are_typed_not_text(knobs):
    # The command line reads option text; the package takes ints, bools, sequences and names.
    with pytest.raises(TypeError, match="knob "):
        fp4lab.quantize(np.ones((16, 64), np.float32), **knobs)


def test_unknown_knob_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'fromat'"):
        fp4lab.quantize(np.ones((1, 16), np.float32), fromat="e1m2")


def test_gemm_operands_must_agree():
    a = fp4lab.quantize(np.ones((2, 32), np.float32))
    b = fp4lab.quantize(np.ones((2, 64), np.float32))
    with pytest.raises(ValueError, match="disagree on K"):
        fp4lab.gemm(a, b)
    with pytest.raises(TypeError):
        fp4lab.gemm(a, np.ones((2, 32), np.float32))


def test_qtensor_arrays_are_read_only_views():
    q = fp4lab.quantize(np.arange(64, dtype=np.float32).reshape(2, 32))
    assert q.codes.shape == (2, 32) and q.codes.dtype == np.uint8 and q.scales.shape == (2, 2)
    with pytest.raises(ValueError):
        q.codes[0, 0] = 1


# ---- analyze: in process (tests/python/package/test_analyze_inprocess.py holds it to the CLI's JSON, bit for bit) ------

def test_analyze_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ValueError, match="bad.safetensors"):
        fp4lab.analyze(str(bad))
