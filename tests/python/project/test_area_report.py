"""scripts/area.sh's output folder and cache: a result made from the same RTL, build list and Yosys version (its
key) is written again without Yosys, into --out DIR and never the checkout; another key synthesises. Yosys here is
a stand-in that gives its version and fails on any synthesis, so a test that passes ran none. Also the NAND2
equivalents area_report.py adds to every build."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
AREA = os.path.join(ROOT, "scripts", "area.sh")


@pytest.fixture
def env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "yosys"
    fake.write_text('#!/bin/sh\n[ "$1" = -V ] && { echo "Yosys 0.0 (stand-in)"; exit 0; }\n'
                    'echo "yosys stand-in: no synthesis here" >&2; exit 1\n')
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")


def area(env, *args, cwd):
    return subprocess.run(["bash", AREA, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_result_with_the_current_key_is_written_again_without_yosys(env, tmp_path):
    key = area(env, "--key", cwd=tmp_path).stdout.strip()
    assert len(key) == 64
    cached = json.load(open(os.path.join(ROOT, "rtl", "area.json")))
    cached["key"] = key
    out = tmp_path / "out"
    out.mkdir()
    (out / "area.json").write_text(json.dumps(cached))
    before = {p: open(os.path.join(ROOT, p), "rb").read() for p in ("rtl/area.json", "docs/area.md")}
    p = area(env, "--out", "out", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "without Yosys" in p.stderr
    got = json.load(open(out / "area.json"))
    assert got["key"] == key and got["builds"].keys() == cached["builds"].keys()
    md = (out / "area.md").read_text()
    assert "[`area.json`](area.json)" in md and "NAND2 equivalents" in md
    # The checkout is untouched.
    assert before == {p: open(os.path.join(ROOT, p), "rb").read() for p in before}


def test_another_key_synthesises(env, tmp_path):
    cached = json.load(open(os.path.join(ROOT, "rtl", "area.json")))
    cached["key"] = "0" * 64  # made from other RTL
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "area.json").write_text(json.dumps(cached))
    p = area(env, "--out", "out", cwd=tmp_path)
    assert p.returncode != 0 and "synthesising" in p.stderr and "yosys failed on" in p.stderr
    assert not (tmp_path / "out" / "area.md").exists()


def test_the_default_output_is_a_folder_here_not_the_checkout(env, tmp_path):
    key = area(env, "--key", cwd=tmp_path).stdout.strip()
    cached = json.load(open(os.path.join(ROOT, "rtl", "area.json")))
    cached["key"] = key
    (tmp_path / "fp4lab-area").mkdir()
    (tmp_path / "fp4lab-area" / "area.json").write_text(json.dumps(cached))
    p = area(env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "fp4lab-area" / "area.md").exists()


def test_bad_options_are_usage_errors(env, tmp_path):
    for args in (["--out"], ["--out", ""], ["-j", "0"], ["--bogus"]):
        p = area(env, *args, cwd=tmp_path)
        assert p.returncode == 2, args


def test_nand2_equivalents_are_transistors_over_four_plus_six_per_flip_flop(env, tmp_path):
    key = area(env, "--key", cwd=tmp_path).stdout.strip()
    cached = json.load(open(os.path.join(ROOT, "rtl", "area.json")))
    cached["key"] = key
    (tmp_path / "area.json").write_text(json.dumps(cached))
    p = area(env, "--out", ".", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = json.load(open(tmp_path / "area.json"))
    for name, b in got["builds"].items():
        assert b["nand2_eq"] == b["transistors"] / 4 + 6 * b["ffs"], name
    assert got["nand2"]["um2_per_nand2"] == pytest.approx(0.0407, rel=1e-12)
    # The simulator's native design points carry these figures (sim/configs/h200-class-*.cfg).
    cfg = open(os.path.join(ROOT, "sim", "configs", "h200-class-e1m2.cfg")).read()
    assert f"mac_e1m2_nand2 = {got['builds']['mac_e1m2']['nand2_eq']:g}" in cfg
    assert "um2_per_nand2 = 0.0407" in cfg
