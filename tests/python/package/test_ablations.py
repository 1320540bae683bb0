"""The ablation recipes (fp4lab.ABLATIONS, rows of the C++ table of named recipes): what each does to every operand
of every pass, that the rows give what the per-pass knobs of their Python definition gave, that the numpy API and
fp4lab.torch.Recipe give the same settings for a name, and that the study, the paired comparisons and
docs/training.md's table are the one definition."""
import contextlib
import io
import os
import re

import pytest

import fp4lab
from fp4lab import paired

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PASSES = ("fwd_y", "bwd_dx", "bwd_dw")
OPERANDS = [(p, o) for p in PASSES for o in "ab"]

# Rounding per (pass, operand) in pass order, a then b: the presets' SR on dY (operand a of bwd_dx and bwd_dw).
SR_DY = ("rtne", "rtne", "sr", "rtne", "sr", "rtne")
# name: (grid, RHT size per pass, rounding per operand), written from the words of docs/spec.md §2 and §8.
EXPECTED = {
    "ufp4-rht-none": ("e1m2", (0, 0, 0), SR_DY),
    "ufp4-rht-wgrad": ("e1m2", (0, 0, 16), SR_DY),
    "ufp4-rht-fwd-wgrad": ("e1m2", (16, 0, 16), SR_DY),
    "ufp4": ("e1m2", (16, 16, 16), SR_DY),
    "ufp4-sr-none": ("e1m2", (16, 16, 16), ("rtne",) * 6),
    "ufp4-sr-grads": ("e1m2", (16, 16, 16), ("rtne", "rtne", "sr", "sr", "sr", "sr")),
    "e2m1-rht-all": ("e2m1", (16, 16, 16), SR_DY),
}
# What an ablation leaves as its preset has it.
KEPT = ("block", "scale", "tile2d", "rht_bf16", "seed", "stream")


def settings(name):
    return {(p, o): fp4lab.config(name, pass_=p, operand=o).to_dict() for p, o in OPERANDS}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_ablation_changes_its_preset_as_its_name_says(name):
    assert set(fp4lab.ABLATIONS) == set(EXPECTED)
    grid, rht, rounding = EXPECTED[name]
    got, base = settings(name), settings(fp4lab.ABLATIONS[name].base)
    assert tuple(got[(p, "a")]["rht"] for p in PASSES) == tuple(got[(p, "b")]["rht"] for p in PASSES) == rht
    assert tuple(got[k]["rounding"] for k in OPERANDS) == rounding
    te = "+1,+1,+1,-1,+1,-1,-1,-1,-1,-1,-1,+1,-1,+1,-1,-1"  # docs/spec.md §3
    for k in OPERANDS:
        assert got[k]["format"] == grid, k
        assert got[k]["rht_signs"] == (te if got[k]["rht"] else ""), k
        assert {f: got[k][f] for f in KEPT} == {f: base[k][f] for f in KEPT}, k


# The definition the ablations had in Python before the C++ table of named recipes held them: the preset, and the
# knobs per pass put on top of it through the knob parser. Each table row gives every operand of every pass the
# settings this gave, with and without knobs of its own.
_NO_RHT, _SR = {"rht": 0}, {"rounding": "sr"}
PER_PASS_DEFINITION = {
    "ufp4-rht-none": ("ufp4", {"fwd_y": _NO_RHT, "bwd_dx": _NO_RHT, "bwd_dw": _NO_RHT}),
    "ufp4-rht-wgrad": ("ufp4", {"fwd_y": _NO_RHT, "bwd_dx": _NO_RHT}),
    "ufp4-rht-fwd-wgrad": ("ufp4", {"bwd_dx": _NO_RHT}),
    "ufp4": ("ufp4", {}),
    "ufp4-sr-none": ("ufp4", {p: {"rounding": "rtne"} for p in PASSES}),
    "ufp4-sr-grads": ("ufp4", {"bwd_dx": _SR, "bwd_dw": _SR}),
    "e2m1-rht-all": ("e2m1-ref", {"fwd_y": {"rht": 16}, "bwd_dx": {"rht": 16}}),
}
OWN_KNOBS = ({}, {"seed": 7, "stream": 3}, {"rounding": "sr"}, {"rht": 16}, {"rht": 0}, {"format": "e2m1"})


def per_pass_config(name, pass_, operand, knobs):
    base, per_pass = PER_PASS_DEFINITION[name]
    return fp4lab.config(base, pass_=pass_, operand=operand, **{**per_pass.get(pass_, {}), **knobs})


@pytest.mark.parametrize("name", list(PER_PASS_DEFINITION))
def test_table_rows_give_what_the_per_pass_knobs_gave(name):
    assert list(fp4lab.ABLATIONS) == list(PER_PASS_DEFINITION)  # the study's order too
    a = fp4lab.ABLATIONS[name]
    assert a.base == PER_PASS_DEFINITION[name][0]
    for p, o in OPERANDS:
        for knobs in OWN_KNOBS:
            want = per_pass_config(name, p, o, knobs).to_dict()
            assert fp4lab.config(name, pass_=p, operand=o, **knobs).to_dict() == want, (p, o, knobs)
        # per_pass, read back from the table, makes the recipe from its base as well.
        assert fp4lab.config(a.base, pass_=p, operand=o, **a.per_pass.get(p, {})).to_dict() == \
            per_pass_config(name, p, o, {}).to_dict(), (p, o)
    assert fp4lab._core.recipe_table(name) == {
        p: {o: {**per_pass_config(name, p, o, {}).to_dict(), "role": fp4lab._core.recipe_table(a.base)[p][o]["role"]}
            for o in "ab"} for p in PASSES}


def test_preset_lists_stay_the_presets():
    presets = ["ufp4", "e2m1-ref", "nvfp4", "mxfp4"]
    assert fp4lab._core.recipe_names() == presets and list(fp4lab.recipes()) == presets
    rows = fp4lab._core.recipe_rows()
    assert [r["name"] for r in rows if r["kind"] == "preset"] == presets
    assert {r["name"] for r in rows if r["kind"] == "ablation"} == set(fp4lab.ABLATIONS) - {"ufp4"}
    assert all(r["base"] in presets for r in rows)


def test_analyze_takes_an_ablation():
    j = fp4lab.analyze(os.path.join(ROOT, "workloads", "tiny-lm", "step_005000"), formats="e1m2", rht=None,
                       recipe="ufp4-rht-none")
    assert j["config"]["recipes"] == ["ufp4-rht-none"]
    got = [g for g in j["gemms"] if g.get("recipe") == "ufp4-rht-none"]
    assert got and all(g["rht"] == 0 for g in got)


def test_config_without_a_pass_and_given_knobs_sit_on_top():
    # Without pass_ the pass is the command line's choice (fwd_y; bwd_dx for the role bwd_dy), with its knobs.
    assert fp4lab.config("ufp4-rht-fwd-wgrad", role="fwd_x").to_dict()["rht"] == 16
    assert fp4lab.config("ufp4-rht-fwd-wgrad", role="bwd_dy").to_dict()["rht"] == 0
    assert fp4lab.config("ufp4-rht-wgrad", pass_="fwd_y", role="fwd_x", rht=16).to_dict()["rht"] == 16
    assert fp4lab.config("ufp4-sr-grads", pass_="bwd_dw", role="fwd_x", rounding="rtne").to_dict()["rounding"] == "rtne"
    with pytest.raises(TypeError, match="pass_ must be a str"):
        fp4lab.config("ufp4-rht-wgrad", pass_=1)


def test_torch_recipe_takes_the_names_with_the_same_settings():
    pytest.importorskip("torch")
    import pickle

    import fp4lab.torch as ft
    assert ft.ABLATIONS is fp4lab.ABLATIONS
    for name in fp4lab.ABLATIONS:
        r = ft.Recipe(name, mode="fast", seed=5)
        assert r.name == name and pickle.loads(pickle.dumps(r)) == r
        want = settings(name)
        for p, o in OPERANDS:
            got = r.config(p, o, layer=0, step=0).to_dict()
            assert {f: got[f] for f in ("format", "rht", "rht_signs", "rounding") + KEPT[:4]} == \
                {f: want[(p, o)][f] for f in ("format", "rht", "rht_signs", "rounding") + KEPT[:4]}, (name, p, o)
    # Knobs given to Recipe sit on top of the ablation's, as on top of a preset's.
    r = ft.Recipe("ufp4-rht-none", per_pass={"bwd_dw": {"rht": 16}})
    assert [r.config(p, "a", layer=0, step=0).to_dict()["rht"] for p in PASSES] == [0, 0, 16]
    with pytest.raises(ValueError, match=r"unknown recipe 'ufp4-rht' \(known: bf16, .*, e2m1-rht-all\)"):
        ft.Recipe("ufp4-rht")


def test_docs_training_table_is_the_definition():
    doc = open(os.path.join(ROOT, "docs", "training.md")).read()
    table = doc[doc.index("**The paper's ablations**"):]
    table = table[table.index("| recipe | what changes |"):]
    table = table[:table.index("\n\n")]
    rows = re.findall(r"^\s*\| `([^`]+)` \| (.+?) \|$", table, re.M)
    assert rows == [(n, a.what) for n, a in fp4lab.ABLATIONS.items()]


def test_study_and_paired_comparisons_take_the_definition():
    st = pytest.importorskip("fp4lab.study")
    from fp4lab.study.cli import main
    assert st.ABLATIONS == list(fp4lab.ABLATIONS)
    assert paired.ABLATION_BASE == {n: a.base for n, a in fp4lab.ABLATIONS.items() if n != a.base}
    assert set(paired.ABLATION_BASE.values()) <= set(fp4lab.recipes())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["recipes"])
    listed = dict(line.split(None, 1) for line in out.getvalue().splitlines())
    assert set(listed) == {"bf16", *fp4lab.recipes(), *fp4lab.ABLATIONS} == set(st.RECIPES)
    for n, a in fp4lab.ABLATIONS.items():
        if n not in fp4lab.recipes():
            assert listed[n] == a.what, n
