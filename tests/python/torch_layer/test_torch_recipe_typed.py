"""fp4lab.torch.Recipe as a typed value: its six QuantConfigs are what fp4lab.config gives for each named recipe,
pass and operand; a recipe built from QuantConfigs equals the one the knobs build and trains to the same bits; its
key alone gives the recipe back (no live instance, no registry), and a key that is not one is a one-line error;
equality, hashing and pickles follow the settings, and a pickle names nothing but the recipe and its configs."""
import dataclasses
import gc
import io
import os
import pickle
import subprocess
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")

import fp4lab  # noqa: E402
import fp4lab.torch as ft  # noqa: E402
from fp4lab import QuantConfig, Rounding, _core  # noqa: E402
from fp4lab.torch.recipe import OPERANDS, recipe_of_key  # noqa: E402

NAMES = list(_core.recipe_names()) + [a for a in fp4lab.ABLATIONS if a not in _core.recipe_names()]
PAIRS = [(p, o) for p in ("fwd_y", "bwd_dx", "bwd_dw") for o in ("a", "b")]


def test_the_six_configs_are_what_fp4lab_config_gives():
    assert OPERANDS == tuple(PAIRS)
    for name in NAMES:
        r = ft.Recipe(name, seed=9)
        assert [op for op, _ in r.configs] == PAIRS
        for (p, o), c in r.configs:
            assert type(c) is QuantConfig and c == fp4lab.config(name, pass_=p, operand=o), (name, p, o)
    # Knobs sit on top of the named recipe's settings, as fp4lab.config puts them.
    r = ft.Recipe("nvfp4", rounding="sr", per_pass={"bwd_dw": {"rht": 0}})
    for (p, o), c in r.configs:
        assert c == fp4lab.config("nvfp4", pass_=p, operand=o, rounding="sr", **({"rht": 0} if p == "bwd_dw" else {}))


def step_bits(recipe):
    """Output, input gradient and weight gradient bits of one training step of a small Linear."""
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, recipe=recipe, layer_id=3)
    x = torch.randn(16, 64, requires_grad=True)
    y = lin(x)
    (y * torch.linspace(-1, 1, 32)).sum().backward()
    return [t.detach().view(torch.int32) for t in (y, x.grad, lin.weight.grad)]


def test_a_recipe_of_configs_equals_the_knobs_one_and_trains_to_its_bits():
    sugar = ft.Recipe("ufp4", seed=5, per_pass={"bwd_dw": {"rounding": "rtne"}})
    ufp4 = dict(ft.Recipe("ufp4").configs)
    typed = ft.Recipe("ufp4", seed=5, configs={("bwd_dw", o): ufp4[("bwd_dw", o)].replace(rounding=Rounding.rtne)
                                               for o in ("a", "b")})
    assert typed == sugar and hash(typed) == hash(sugar) and typed.key == sugar.key
    # Knobs alone and QuantConfigs from keywords alone; a config's own seed and stream are the step's to set.
    knobs = ft.Recipe(format="e1m2", rht=16, rounding="sr", seed=2)
    keywords = ft.Recipe(configs={op: QuantConfig(format="e1m2", rht=16, rounding="sr", seed=77, stream=1)
                                  for op in PAIRS}, seed=2)
    assert keywords == knobs and keywords.name == knobs.name == "custom"
    for a, b in ((sugar, typed), (knobs, keywords)):
        for x, y in zip(step_bits(a), step_bits(b)):
            assert torch.equal(x, y)
    # The control: another setting moves the bits.
    assert not all(torch.equal(x, y) for x, y in zip(step_bits(sugar), step_bits(ft.Recipe("ufp4", seed=5))))


def test_the_key_alone_gives_the_recipe():
    # An enum member as a knob, a typed config, sync checks: the key spells literals only.
    r = ft.Recipe("nvfp4", seed=2**64 - 1, mode="fast", check_finite="sync", rounding=Rounding.sr,
                  per_pass={"fwd_y": {"rht": 16}})
    key, settings = r.key, [repr(c) for _, c in r.configs]
    assert repr(r) == key and recipe_of_key(key) == r
    # In another process, where no Recipe was ever made:
    code = ("import sys, fp4lab.torch\nfrom fp4lab.torch.recipe import recipe_of_key\n"
            "r = recipe_of_key(sys.argv[1])\nprint(r.key == sys.argv[1], r.mode, r.seed, r.check_finite)\n"
            "print('\\n'.join(repr(c) for _, c in r.configs))")
    out = subprocess.run([sys.executable, "-c", code, key], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"True fast {2**64 - 1} sync"] + settings
    # Here, after the recipe is gone: nothing holds it, and the operator reads the same recipe from the key.
    x, w, step = torch.randn(8, 64), torch.randn(16, 64), torch.tensor(4)
    want = torch.ops.fp4lab.qgemm(x, w, step, key, 5, "bwd_dx", "x")
    gone = weakref.ref(r)
    del r
    gc.collect()
    assert gone() is None
    assert torch.equal(torch.ops.fp4lab.qgemm(x, w, step, key, 5, "bwd_dx", "x").view(torch.int32),
                       want.view(torch.int32))


GOOD = "fp4lab.torch.Recipe('ufp4', mode='exact', seed=0)"


@pytest.mark.parametrize("key, why", [
    ("", "not a Recipe call"),
    ("fp4lab.torch.Recipe(", "not a Recipe call"),
    ("__import__('os').system('true')", "not a Recipe call"),
    ("fp4lab.torch.Recipe('ufp4', mode='exact', seed=0, block=32)", "gives block="),
    ("fp4lab.torch.Recipe('ufp4', mode='exact', seed=0, **{})", "gives **="),
    ("fp4lab.torch.Recipe(__import__('os').getcwd(), mode='exact', seed=0)", "the name is not a literal"),
    ("fp4lab.torch.Recipe('ufp4', mode='exact', seed=True)", "seed is a bool"),
    ("fp4lab.torch.Recipe('ufp4', mode='slow', seed=0)", "mode must be 'exact' or 'fast'"),
    ("fp4lab.torch.Recipe('ufp5', mode='exact', seed=0)", "unknown recipe 'ufp5'"),
    ("fp4lab.torch.Recipe('ufp4', seed=0, mode='exact')", "spells its key \"" + GOOD),
    (GOOD[:-1] + ", configs={('fwd_y', 'a'): print('x')})", "is not an fp4lab.QuantConfig(...) call"),
    (GOOD[:-1] + ", configs={('fwd_y', 'c'): fp4lab.QuantConfig()})", "configs key ('fwd_y', 'c') is not"),
    (GOOD[:-1] + ", configs={('fwd_y', 'a'): fp4lab.QuantConfig(format='e9m9')})", "unknown format 'e9m9'"),
    (GOOD[:-1] + ", configs={('fwd_y', 'a'): fp4lab.QuantConfig(block=open('x'))})", "block is not a literal"),
    (GOOD[:-1] + ", configs={('fwd_y', 'a'): fp4lab.QuantConfig()})",
     "Recipe(): fwd_y: operand B was rotated by RHT-16 (signs te) and operand A was not"),
    ("fp4lab.torch.Recipe(" + "[" * 100000 + ")", "longer than 65536 characters"),
])
def test_a_key_that_is_not_a_recipes_is_a_one_line_error(key, why):
    with pytest.raises(ValueError) as e:
        recipe_of_key(key)
    text = str(e.value)
    assert text.startswith("no fp4lab.torch.Recipe has the key ") and why in text, text
    assert "\n" not in text and len(text) < 700


class RecipeUnpickler(pickle.Unpickler):
    """Builds nothing but recipes and their QuantConfigs: loading a payload runs no other code."""

    def find_class(self, module, name):
        if (module, name) in (("fp4lab.torch.recipe", "Recipe"), ("fp4lab._core", "QuantConfig"),
                              ("copyreg", "__newobj__")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a recipe")


def loads(payload):
    return RecipeUnpickler(io.BytesIO(payload)).load()


def test_equality_hashing_and_pickles_follow_the_settings():
    r = ft.Recipe("nvfp4", seed=3, per_operand={("bwd_dx", "a"): {"rounding": "rtne"}})
    # Two spellings of the same settings are one value; a changed field is another.
    assert ft.Recipe("nvfp4", block=16) == ft.Recipe("nvfp4") and len({ft.Recipe("nvfp4", block=16),
                                                                       ft.Recipe("nvfp4")}) == 1
    others = [ft.Recipe("nvfp4", seed=4, per_operand={("bwd_dx", "a"): {"rounding": "rtne"}}),
              ft.Recipe("nvfp4", seed=3, mode="fast", per_operand={("bwd_dx", "a"): {"rounding": "rtne"}}),
              ft.Recipe("nvfp4", seed=3), ft.Recipe(configs=ft.Recipe("nvfp4").configs, seed=3)]
    assert all(o != r for o in others) and len({r, *others}) == 5
    assert dataclasses.replace(r, seed=4) == others[0]
    assert [f.name for f in dataclasses.fields(r)] == ["name", "mode", "seed", "check_finite", "configs"]
    with pytest.raises(AttributeError, match="immutable"):
        r.configs = ()
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = loads(pickle.dumps(r, protocol=protocol))
        assert back == r and back.key == r.key and back.config("bwd_dx", "a", layer=2, step=7) == \
            r.config("bwd_dx", "a", layer=2, step=7)
    # A pickle is data: settings the constructor refuses do not load.
    payload = pickle.dumps(r, protocol=4)
    with pytest.raises(ValueError, match="mode must be 'exact' or 'fast', not 'exacz'"):
        loads(payload.replace(b"exact", b"exacz"))
    with pytest.raises(ValueError, match="block size must be 16 or 32, not 8"):
        loads(pickle.dumps(ft.Recipe("mxfp4"), protocol=4).replace(b"K\x20", b"K\x08"))
    # torch.load(weights_only=True) refuses a recipe, unless the caller allows its two classes.
    buf = io.BytesIO()
    torch.save({"recipe": r}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buf, weights_only=True)
    buf.seek(0)
    with torch.serialization.safe_globals([ft.Recipe, QuantConfig]):
        assert torch.load(buf, weights_only=True)["recipe"] == r


def test_configs_take_only_operands_and_quant_configs():
    for kw, err, text in [
            (dict(configs="ab"), TypeError, "Recipe(): configs must be a dict from"),
            (dict(configs={("fwd_y",): QuantConfig()}), ValueError, "Recipe(): configs key ('fwd_y',) is not"),
            (dict(configs={("fwd_y", "a"): {"rht": 16}}), TypeError,
             "Recipe(): configs[('fwd_y', 'a')] must be an fp4lab.QuantConfig, not dict"),
            (dict(configs={}, rht=16), ValueError, "Recipe(): give configs or knobs"),
            (dict(name="bf16", configs={("fwd_y", "a"): QuantConfig(rht=16)}), ValueError, "the bf16 recipe is plain")]:
        with pytest.raises(err) as e:
            ft.Recipe(**kw)
        assert str(e.value).startswith(text) and "\n" not in str(e.value), str(e.value)


def test_the_original_sr_draw_is_a_recipe_knob_its_key_spells_and_its_bits_follow():
    """docs/spec.md §4: the presets draw SR under philox4; sr_draw="philox1" (the draw of every run before it)
    reaches every operand, its key reads back, and a training step's SR operands (dY under ufp4) change bits while
    the forward, all RTNE, does not."""
    new, old = ft.Recipe("ufp4", seed=5), ft.Recipe("ufp4", seed=5, sr_draw="philox1")
    assert all(c.sr_draw is fp4lab.SrDraw.philox4 for _, c in new.configs)
    assert all(c.sr_draw is fp4lab.SrDraw.philox1 for _, c in old.configs)
    assert new != old and "sr_draw='philox1'" in old.key and recipe_of_key(old.key) == old
    y_new, dx_new, dw_new = step_bits(new)
    y_old, dx_old, dw_old = step_bits(old)
    assert torch.equal(y_new, y_old)
    assert not torch.equal(dx_new, dx_old) and not torch.equal(dw_new, dw_old)


def test_the_philox16_draw_reaches_every_operand_and_moves_only_the_sr_operands_bits():
    """docs/spec.md §4: sr_draw="philox16" (8 bits an element, a Philox block per sixteen) is a third recipe knob,
    spelled in the key; a training step's dY (SR under ufp4) changes bits against philox4, the forward does not."""
    base, d16 = ft.Recipe("ufp4", seed=5), ft.Recipe("ufp4", seed=5, sr_draw="philox16")
    assert all(c.sr_draw is fp4lab.SrDraw.philox16 for _, c in d16.configs)
    assert "sr_draw='philox16'" in d16.key and recipe_of_key(d16.key) == d16
    y4, dx4, dw4 = step_bits(base)
    y16, dx16, dw16 = step_bits(d16)
    assert torch.equal(y4, y16)
    assert not torch.equal(dx4, dx16) and not torch.equal(dw4, dw16)
