"""fp4lab.QuantConfig built from typed keywords: for every named recipe, pass and operand, the keyword call of its
fields is the settings fp4lab.config (the knob path the command line shares) gives, in value, hash, repr, pickle
and in the bits it quantises to; the rules the knobs enforce hold for keywords, replace() and unpickling too."""
import io
import pickle

import numpy as np
import pytest

import fp4lab
from fp4lab import Format, QuantConfig, Rounding, Scale, _core

NAMES = list(_core.recipe_names()) + list(fp4lab.ABLATIONS)
class ConfigUnpickler(pickle.Unpickler):
    """An unpickler that builds nothing but QuantConfigs (and the copyreg helper their pickles name): loading a
    payload never runs other code."""

    def find_class(self, module, name):
        if (module, name) in (("fp4lab._core", "QuantConfig"), ("copyreg", "__newobj__"),
                              ("copyreg", "_reconstructor")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a QuantConfig")


def loads(payload):
    return ConfigUnpickler(io.BytesIO(payload)).load()


FIELDS = QuantConfig.FIELDS  # the C++ field list (QuantConfig::fields) that equality and pickling walk


def typed_copy(c):
    return QuantConfig(**{f: getattr(c, f) for f in FIELDS})


@pytest.mark.parametrize("name", NAMES)
def test_keywords_give_every_recipes_settings_and_bits(name):
    x = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32) * 3
    for p in ("fwd_y", "bwd_dx", "bwd_dw"):
        for o in ("a", "b"):
            c = fp4lab.config(name, pass_=p, operand=o, seed=11)
            t = typed_copy(c)
            assert t == c and hash(t) == hash(c) and t.to_dict() == c.to_dict(), (name, p, o)
            assert eval(repr(c), {"fp4lab": fp4lab}) == c
            assert loads(pickle.dumps(c)) == c
            assert isinstance(c.format, Format) and isinstance(c.scale, Scale) and isinstance(c.rounding, Rounding)
            q1, q2 = fp4lab.quantize_with(x, c), fp4lab.quantize_with(x, t)
            assert np.array_equal(q1.codes, q2.codes) and np.array_equal(q1.scales.view(np.uint32),
                                                                         q2.scales.view(np.uint32))


def test_knobs_and_keywords_are_one_rule():
    signs = [1, -1, -1, 1] * 8
    by_knobs = fp4lab.config(format="e2m1", block=32, scale="ue8m0", rounding="sr", seed=7, rht=32, rht_signs=signs)
    typed = QuantConfig(format=Format.e2m1, block=32, scale=Scale.ue8m0, rounding=Rounding.sr, seed=7, rht=32,
                        rht_signs=signs)
    assert by_knobs == typed and typed.rht_signs == tuple(signs)
    # rht=16 without signs takes Transformer Engine's vector, as --rht 16 does
    assert QuantConfig(rht=16) == fp4lab.config(rht=16) == QuantConfig(rht=16, rht_signs="te")
    assert QuantConfig(scale="ue8m0-ceil", block=32).scale is Scale.ue8m0_ceil
    # replace: the changed copy, a new RHT size with its own default signs
    c = fp4lab.config("ufp4", pass_="bwd_dw", operand="a")
    assert c.replace(rounding="rtne") == fp4lab.config("ufp4", pass_="bwd_dw", operand="a", rounding="rtne")
    assert c.replace(rht=0).rht_signs is None and c.replace(rht=0).rht == 0
    assert c != c.replace(seed=1) and c.replace(seed=1) == c.with_seed(1)


@pytest.mark.parametrize("kw, err, text", [
    (dict(block=8), ValueError, "block size must be 16 or 32, not 8"),
    (dict(rht=8), ValueError, "RHT size must be a power of two"),
    (dict(rht=32), ValueError, "rht=32 needs rht_signs"),
    (dict(rht=16, rht_signs=[1, -1]), ValueError, "rht=16 needs 16 signs, got 2"),
    (dict(rht_signs=[1] * 16), ValueError, "rht_signs given without an RHT size"),
    (dict(rht=16, rht_signs=[1, 0.5] * 8), ValueError, "entries are +1 or -1, not 0.5"),
    (dict(rht=16, rht_signs=[True] * 16), TypeError, "entries are +1 or -1"),
    (dict(tile2d=True, block=32), ValueError, "tile2d (16x16 scale tiles) needs block 16"),
    (dict(rht_bf16=True), ValueError, "rht_bf16 needs an RHT"),
    (dict(format="e9m9"), ValueError, "unknown format 'e9m9'"),
    (dict(format=3), TypeError, "format must be an fp4lab.Format"),
    (dict(scale=Rounding.sr), TypeError, "scale must be an fp4lab.Scale"),
])
def test_a_setting_the_quantiser_cannot_take_is_refused_in_one_line(kw, err, text):
    with pytest.raises(err) as e:
        QuantConfig(**kw)
    assert text in str(e.value) and "\n" not in str(e.value)


def test_replace_and_unpickling_hold_to_the_same_rules():
    c = QuantConfig(rht=16)
    with pytest.raises(TypeError, match="no setting 'blocks'"):
        c.replace(blocks=32)
    with pytest.raises(ValueError, match="block size must be 16 or 32"):
        c.replace(block=64)
    # A pickle is data: a state the constructor refuses does not load. (Block 32 is the pickle's one BININT1 32.)
    payload = pickle.dumps(QuantConfig(block=32), protocol=4)
    assert payload.count(b"K\x20") == 1 and loads(payload).block == 32
    with pytest.raises(ValueError, match="block size must be 16 or 32, not 8"):
        loads(payload.replace(b"K\x20", b"K\x08"))
    with pytest.raises(pickle.UnpicklingError, match="is not a QuantConfig"):
        loads(pickle.dumps(print))


def test_the_passes_are_listed_once():
    # The training GEMMs come from the C++ table (kPasses) as fp4lab._core.PASSES; no module spells them again.
    import os
    import re
    assert _core.PASSES == ("fwd_y", "bwd_dx", "bwd_dw") == tuple(_core.recipe_table("ufp4"))
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    spelled = re.compile(r"""\(\s*["']fwd_y["'],\s*["']bwd_dx["'],\s*["']bwd_dw["']\s*\)""")
    bad = []
    for top in ("python/fp4lab", "lab"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(".py") and spelled.search(open(os.path.join(folder, f), encoding="utf-8").read()):
                    bad.append(os.path.relpath(os.path.join(folder, f), root))
    assert not bad, bad


def test_knobs_take_the_enum_members_and_make_no_command_line_text():
    c = fp4lab.config("mxfp4", format=Format.e2m1_max2, scale=Scale.ue8m0_ceil, rounding=Rounding.sr, rht=32,
                      rht_signs=np.array([1.0, -1.0] * 16), tile2d=np.bool_(False), seed=np.uint8(9))
    assert c == QuantConfig(format="e2m1_max2", block=32, scale="ue8m0-ceil", rounding="sr", rht=32,
                            rht_signs=[1, -1] * 16, seed=c.seed, stream=c.stream)
    # the knob path holds no text conversion of its own: the module has no such helper left
    assert not hasattr(fp4lab, "_knob_text")


@pytest.mark.parametrize("kw, text", [
    (dict(seed=2**64), "--seed: '18446744073709551616' is not an integer from 0 to 18446744073709551615"),
    (dict(seed=-1), "--seed: '-1' is not an integer from 0 to 18446744073709551615"),
    (dict(block=2**40), "--block: '1099511627776' is not an integer"),
    (dict(rht=2**63), "--rht: RHT size must be a power of two from 16 to 128, not -1"),
    (dict(tile2d=1), "--tile2d: '1' is not true or false"),
])
def test_typed_knobs_out_of_range_are_named_in_one_line(kw, text):
    with pytest.raises(ValueError) as e:
        fp4lab.config("ufp4", **kw)
    assert str(e.value).startswith(text) and "\n" not in str(e.value)
    assert fp4lab.config("ufp4", seed=2**64 - 1).seed != fp4lab.config("ufp4", seed=0).seed


def test_the_field_list_is_every_keyword_and_each_takes_part_in_equality_pickle_and_repr():
    """QuantConfig.FIELDS is the C++ list equality and the pickled state are built from: it names exactly the
    constructor's keywords and to_dict's settings, and a change to any one field alone makes another value that
    survives repr and pickle."""
    signs = [1, -1] * 16
    c = QuantConfig(format="e2m1", block=16, scale="ue8m0", tile2d=False, rht=32, rht_signs=signs, rht_bf16=True,
                    rounding="sr", seed=5, stream=3)
    other = {"format": "e1m2", "block": 32, "scale": "fp32", "tile2d": True, "rht": 16, "rht_signs": [-1, 1] * 16,
             "rht_bf16": False, "rounding": "rtne", "seed": 6, "stream": 4, "sr_draw": "philox1"}
    assert sorted(FIELDS) == sorted(other) == sorted(set(c.to_dict()) - {"label"})
    assert len(c.__getstate__()) == len(FIELDS)
    assert QuantConfig(**{f: getattr(c, f) for f in FIELDS}) == c
    for f, v in other.items():
        d = c.replace(**{f: v})
        assert d != c and getattr(d, f) != getattr(c, f), f
        assert eval(repr(d), {"fp4lab": fp4lab}) == d and loads(pickle.dumps(d)) == d, f


def test_the_sr_draw_is_a_named_setting_and_older_pickles_load_as_the_original_draw():
    """docs/spec.md §4: philox4 is the default and the presets' draw; philox1 (the original) is selectable by name
    everywhere a setting is, and a QuantConfig pickled before sr_draw existed (ten fields) loads as philox1, the
    draw it was made under."""
    from fp4lab import SrDraw
    assert QuantConfig().sr_draw is SrDraw.philox4 and fp4lab.config("ufp4", role="bwd_dy").sr_draw is SrDraw.philox4
    old = fp4lab.config("ufp4", role="bwd_dy", sr_draw="philox1")
    assert old.sr_draw is SrDraw.philox1 and old == QuantConfig(**{**{f: getattr(old, f) for f in FIELDS},
                                                                  "sr_draw": SrDraw.philox1})
    assert old.label.endswith("_sr-philox1") and old.to_dict()["sr_draw"] == "philox1"
    # The two draws give different codes under SR, the same under RTNE.
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    new = old.replace(sr_draw="philox4")
    assert not np.array_equal(fp4lab.quantize_with(x, old).codes, fp4lab.quantize_with(x, new).codes)
    # philox16 (8 bits an element) is a third, named draw: other codes again, its name in the label.
    d16 = old.replace(sr_draw="philox16")
    assert d16.sr_draw is SrDraw.philox16 and d16.label.endswith("_sr-philox16")
    assert not np.array_equal(fp4lab.quantize_with(x, d16).codes, fp4lab.quantize_with(x, new).codes)
    rtne = fp4lab.config("ufp4")
    assert np.array_equal(fp4lab.quantize_with(x, rtne).codes,
                          fp4lab.quantize_with(x, rtne.replace(sr_draw="philox1")).codes)
    # The ten-field state of before: loads, as philox1.
    state = old.__getstate__()
    assert len(state) == 11 and state[-1] == "philox1"
    legacy = QuantConfig.__new__(QuantConfig)
    legacy.__setstate__(tuple(new.__getstate__()[:10]))
    assert legacy == old
    with pytest.raises(ValueError, match="unknown SR draw 'philox2' \\(known: philox1, philox4, philox16\\)"):
        fp4lab.config("ufp4", sr_draw="philox2")
    with pytest.raises(TypeError, match="sr_draw"):
        fp4lab.config("ufp4", sr_draw=4)
