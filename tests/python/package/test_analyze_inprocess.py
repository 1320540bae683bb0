"""fp4lab.analyze (the trace analysis library through fp4lab._core, in process) against `fp4lab analyze --json`
(the same library behind the command line, in another process): the same dict, every float the same bits, on both
bundled traces under every recipe; and the same one-line faults.

FP4LAB_BIN names the built command line (ctest sets it); the package comes from PYTHONPATH."""
import json
import os
import re
import struct
import subprocess

import ml_dtypes  # noqa: F401  (safetensors reads BF16 through it)
import pytest

import fp4lab

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
TINY = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
DOC = os.path.join(ROOT, "workloads", "doc-lm", "step_001999")
LAYER = os.path.join(TINY, "layers.7.mlp.fc2.safetensors")
RECIPES = ["ufp4", "e2m1-ref", "nvfp4", "mxfp4"]


def cli(*args):
    # argv[0] "fp4lab", as in the command line fp4lab.analyze records in config.command.
    return subprocess.run(["fp4lab", *args], executable=BIN, capture_output=True, text=True)


def masked(d):
    """The stamps of one run (wall time, the commit the build was configured at) left out."""
    d = dict(d, config=dict(d["config"]))
    d["config"].pop("seconds")
    d.pop("git_commit")
    return d


def same_bits(a, b, where="$"):
    """a == b with every float compared by its IEEE bits, keys in the same order, ints and floats not mixed."""
    assert type(a) is type(b), (where, a, b)
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same_bits(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_bits(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), (where, a, b)
    else:
        assert a == b, (where, a, b)


def check_against_cli(traces, cli_args, **kwargs):
    got = fp4lab.analyze(traces, **kwargs)
    r = cli("analyze", "--trace", *traces, "--json", "-", *cli_args)
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert got["config"]["command"] == want["config"]["command"]
    same_bits(masked(got), masked(want))
    return got


def test_tiny_lm_every_recipe_same_bits_as_cli():
    got = check_against_cli([TINY], ["--recipe", ",".join(RECIPES)], recipe=RECIPES)
    assert len(got["tensors"]) == 8 * 3 * 4 and {g.get("recipe") for g in got["gemms"]} == {None, *RECIPES}
    assert got["inversion"]["tensors_total"] == 24 and len(got["decay"]) == 4


def test_doc_lm_records_every_recipe_other_settings_same_bits_as_cli():
    # Two records of the doc-lm trace given as two files (entries then name their trace), three grids, RHT sizes
    # given before "none" (so some deltas have no reference), block 32 with UE8M0 scales and an SR seed.
    files = [os.path.join(DOC, "blocks.7.fc2.safetensors"), os.path.join(DOC, "blocks.0.qkv.safetensors")]
    got = check_against_cli(files, ["--formats", "e1m2,e2m1,int4", "--rht", "32,none,16", "--recipe", "all",
                                    "--rht-seed", "3", "--block", "32", "--scale", "ue8m0", "--seed", "7"],
                            formats=["e1m2", "e2m1", "int4"], rht=[32, None, 16], recipe="all", rht_seed=3,
                            block=32, scale="ue8m0", seed=7)
    assert got["config"]["trace"] == files and all(t["trace"] in files for t in got["tensors"])
    assert got["inversion"]["rht"] == 32
    assert {g.get("recipe") for g in got["gemms"]} == {None, *RECIPES}


def test_infinite_sqnr_is_none_as_in_the_json(tmp_path):
    # An all-zero dY: no error, SQNR +inf, which the JSON writes as null.
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open
    with safe_open(LAYER, "np") as f:
        meta = f.metadata()
    d = load_file(LAYER)
    k = next(n for n in d if n.endswith("bwd_dy"))
    d[k] = d[k] * 0
    save_file(d, str(tmp_path / "z.safetensors"), metadata=meta)
    got = check_against_cli([str(tmp_path / "z.safetensors")], ["--rht", "none"], rht="none")
    assert any(t["sqnr_db"] is None for t in got["tensors"] if t["role"] == "bwd_dy")


def cli_fault(*args):
    r = cli("analyze", *args)
    assert r.returncode in (1, 2) and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    return r.stderr.strip().split(": error: ", 1)[1]


def test_faults_are_the_cli_lines_as_value_error(tmp_path):
    nan = tmp_path / "nan"
    nan.mkdir()
    raw = bytearray(open(LAYER, "rb").read())
    raw[-2:] = b"\xc0\x7f"  # the last BF16 element becomes a NaN
    (nan / "l.safetensors").write_bytes(bytes(raw))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(bytes(raw[: len(raw) // 2]))
    cases = [  # (traces, the CLI's options, fp4lab.analyze's keywords, what the message names)
        ([str(nan)], [], {}, ["l.safetensors", "NaN"]),
        ([str(cut)], [], {}, ["cut.safetensors"]),
        (["/nonexistent/trace"], [], {}, ["/nonexistent/trace"]),
        ([LAYER], ["--formats", "e3m0"], {"formats": "e3m0"}, ["e3m0"]),
        ([LAYER], ["--rht", "none,0"], {"rht": [None, 0]}, ["--rht: none is given twice"]),
        ([LAYER], ["--block", "8"], {"block": 8}, ["--block"]),
        ([LAYER], ["--recipe", "fp8"], {"recipe": "fp8"}, ["fp8"]),
        ([TINY, TINY + "/"], [], {}, ["given twice"]),
    ]
    for traces, opts, kwargs, needles in cases:
        want = cli_fault("--trace", *traces, *opts)
        with pytest.raises(ValueError) as e:
            fp4lab.analyze(traces, **kwargs)
        assert str(e.value) == want and "\n" not in want
        for n in needles:
            assert n in want, (n, want)


def test_argument_types():
    with pytest.raises(TypeError):
        fp4lab.analyze(b"/bytes/path")
    with pytest.raises(ValueError, match="no trace"):
        fp4lab.analyze([])


def without_stamps(text):
    """The report's text with the stamps of one run blanked: its wall time and the commit its build was made at."""
    out = re.sub(r'("seconds": )[-+0-9.eE]+', r"\1S", text)
    out = re.sub(r'("git_commit": )"[^"]*"', r"\1G", out)
    assert out.count('"seconds": S') == 1 and out.count('"git_commit": G') == 1
    return out


def test_json_path_writes_the_cli_bytes(tmp_path):
    # json= writes the document `fp4lab analyze --json FILE` writes, byte for byte (config.command names FILE),
    # and returns None; the folder holds nothing else afterwards (no temporary left).
    out = tmp_path / "report.json"
    opts = ["--rht", "16,none", "--recipe", "all", "--seed", "5"]  # in the order config.command records them
    assert fp4lab.analyze([TINY], recipe="all", rht=[16, None], seed=5, json=out) is None
    got = out.read_text()
    out.unlink()
    r = cli("analyze", "--trace", TINY, "--json", str(out), *opts)
    assert r.returncode == 0, r.stderr
    want = out.read_text()
    assert without_stamps(got) == without_stamps(want)
    doc = json.loads(got)
    assert doc["config"]["command"].endswith(f"--json {out} --rht 16,none --recipe all --seed 5")
    d = fp4lab.analyze([TINY], recipe="all", rht=[16, None], seed=5)  # the dict names "--json -" in its command
    doc["config"]["command"] = d["config"]["command"]
    same_bits(masked(doc), masked(d))
    assert sorted(os.listdir(tmp_path)) == ["report.json"]


def test_json_path_refused_before_any_work(tmp_path):
    # An output that is an input, or that cannot be written, is refused with the command line's line before the
    # analysis, and the input is left as it was; a fault of the analysis leaves no file.
    layer = tmp_path / "l.safetensors"
    layer.write_bytes(open(LAYER, "rb").read())
    before = layer.read_bytes()
    cases = [(layer, ["output is also an input"]), (tmp_path / "no" / "r.json", ["no such folder"]),
             (tmp_path, ["not a regular file"])]
    for out, needles in cases:
        want = cli_fault("--trace", str(layer), "--json", str(out))
        with pytest.raises(ValueError) as e:
            fp4lab.analyze([str(layer)], json=out)
        assert str(e.value) == want
        for n in needles:
            assert n in want, (n, want)
    assert layer.read_bytes() == before
    raw = bytearray(before)
    raw[-2:] = b"\xc0\x7f"  # a NaN: the analysis fails after the output check passed
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "l.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="NaN"):
        fp4lab.analyze([str(bad)], json=tmp_path / "r.json")
    assert sorted(os.listdir(tmp_path)) == ["bad", "l.safetensors"]
    with pytest.raises(TypeError):
        fp4lab.analyze([TINY], json=b"/bytes/path")
    for name in ("", "-"):  # no file name ("-" is the command line's stdout)
        with pytest.raises(ValueError, match="json needs a file name"):
            fp4lab.analyze([TINY], json=name)
    # A path the file system refuses is named before a bad trace, as the command line names it first.
    want = cli_fault("--trace", "/nonexistent/trace", "--json", str(tmp_path / "no" / "r.json"))
    with pytest.raises(ValueError) as e:
        fp4lab.analyze(["/nonexistent/trace"], json=tmp_path / "no" / "r.json")
    assert str(e.value) == want and "no such folder" in want


def test_typed_keywords_same_bits_as_cli():
    # Enum members and numpy integers are typed values, not text: the same analysis and the same recorded command
    # line as their names on the command line.
    import numpy as np
    got = check_against_cli([LAYER], ["--formats", "int4,e1m2", "--rht", "none,32", "--recipe", "nvfp4",
                                      "--rht-seed", "9", "--block", "32", "--scale", "ue8m0-ceil",
                                      "--seed", "18446744073709551615"],
                            formats=[fp4lab.Format.int4, fp4lab.Format.e1m2], rht=(None, np.int64(32)),
                            rht_seed=np.uint64(9), block=32, scale=fp4lab.Scale.ue8m0_ceil, recipe=["nvfp4"],
                            seed=2**64 - 1)
    assert [s["format"] for s in got["config"]["settings"]] == ["int4", "int4", "e1m2", "e1m2"]
