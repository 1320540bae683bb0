"""fp4lab.torch models as PyTorch state: recipes and configs that pickle, copies (deepcopy, torch.save, EMA) that
compute the same bits, the SR step in the state dict (a resumed run continues bit for bit), activation
checkpointing drawing the same SR bits as a plain backward, layer ids from qualified names; convert's report
(what it converted, what it left and why), attention under a recipe, errors that name the module, one-line
argument errors, double backward refused, and a quiet interpreter exit."""
import copy
import hashlib
import io
import logging
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as tc
from torch import nn

import fp4lab
import fp4lab.torch as ft


class Block(nn.Module):
    def __init__(self, d=64, f=128):
        super().__init__()
        self.fc1 = nn.Linear(d, f)
        self.fc2 = nn.Linear(f, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, layers=2, checkpoint=None):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(64, 16)
        self.checkpoint = checkpoint  # None, or use_reentrant for torch.utils.checkpoint

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.checkpoint is None else tc.checkpoint(b, x, use_reentrant=self.checkpoint)
        return self.head(x)


def make_net(recipe="ufp4", seed=0, **kw):
    torch.manual_seed(seed)
    return ft.convert(Net(**kw), ft.Recipe(recipe, seed=5), include=r"^blocks\.")


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(64, 64, generator=g), torch.randn(64, 16, generator=g)


def train(model, opt, steps, start=0):
    """Losses and every gradient of each step, as bit patterns."""
    out = []
    for i in range(start, start + steps):
        x, t = batch(i)
        x.requires_grad_(True)
        loss = (model(x) - t).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        out.append([loss.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()])
        opt.step()
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for sa, sb in zip(a, b):
        for ta, tb in zip(sa, sb):
            assert torch.equal(ta.view(torch.int32), tb.view(torch.int32))


def step_of(m):
    return [l.step for l in m.modules() if isinstance(l, ft.Linear)]


# ---- recipes and configs as data --------------------------------------------------------------------------

def test_recipe_is_a_value():
    r = ft.Recipe("nvfp4", mode="fast", seed=3, per_pass={"fwd_y": {"rht": 0}},
                  per_operand={("bwd_dx", "a"): {"rounding": "rtne"}}, check_finite="deferred", block=16)
    again = eval(repr(r), {"fp4lab": fp4lab})
    assert again == r and hash(again) == hash(r) and repr(again) == repr(r)
    assert ft.Recipe(format="e1m2", rht=16) == eval(repr(ft.Recipe(format="e1m2", rht=16)), {"fp4lab": fp4lab})
    assert ft.Recipe("ufp4") != ft.Recipe("ufp4", seed=1)
    for other in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r)):
        assert other == r
        for p in ("fwd_y", "bwd_dx", "bwd_dw"):
            for o in ("a", "b"):
                assert other.config(p, o, layer=7, step=2).to_dict() == r.config(p, o, layer=7, step=2).to_dict()
    with pytest.raises(AttributeError, match="immutable"):
        r.seed = 4


def test_recipes_nothing_holds_are_forgotten_and_their_keys_still_work():
    # The operators find a recipe by its key; recipes made and dropped (a model per trial of a sweep) must not pile
    # up in the process, and a key outliving its recipe (a compiled graph's constant) still names the same recipe.
    import gc
    import weakref
    made = [weakref.ref(ft.Recipe("ufp4", seed=1000 + seed, per_pass={"fwd_y": {"rht": 0}})) for seed in range(200)]
    gc.collect()
    assert all(w() is None for w in made)  # nothing in the package holds them
    x, w, step = torch.randn(8, 64), torch.randn(16, 64), torch.tensor(3)
    r = ft.Recipe("nvfp4", seed=7, per_operand={("bwd_dx", "a"): {"rounding": "rtne"}})
    key, want = r.key, torch.ops.fp4lab.qgemm(x, w, step, r.key, 5, "fwd_y", "x")
    del r
    gc.collect()
    got = torch.ops.fp4lab.qgemm(x, w, step, key, 5, "fwd_y", "x")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    with pytest.raises(ValueError, match="no fp4lab.torch.Recipe has the key"):
        torch.ops.fp4lab.qgemm(x, w, step, "fp4lab.torch.Recipe('nope')", 5, "fwd_y", "x")


def test_quant_config_pickles():
    x = np.random.default_rng(0).standard_normal((32, 64), dtype=np.float32)
    for cfg in (fp4lab.config("nvfp4", pass_="bwd_dx", operand="a", seed=9, stream=3),
                fp4lab.config("ufp4", pass_="fwd_y", operand="b"), fp4lab.config(format="int4", rht=32, rht_seed=2)):
        back = pickle.loads(pickle.dumps(cfg))
        assert type(back) is fp4lab.QuantConfig and back.to_dict() == cfg.to_dict()
        qa, qb = fp4lab.quantize_with(x, cfg), fp4lab.quantize_with(x, back)
        assert np.array_equal(qa.codes, qb.codes) and np.array_equal(qa.scales.view(np.uint32),
                                                                      qb.scales.view(np.uint32))


# ---- copies -----------------------------------------------------------------------------------------------

def copies(m):
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    yield "deepcopy", copy.deepcopy(m)
    yield "torch.save", torch.load(buf, weights_only=False)
    yield "AveragedModel", torch.optim.swa_utils.AveragedModel(m).module


def test_copies_compute_the_same_bits():
    m = make_net("nvfp4")
    train(m, torch.optim.SGD(m.parameters(), lr=0.05), 2)  # the step is 2 now, in the copies too
    for how, c in copies(m):
        assert step_of(c) == step_of(m) == [2] * 4, how
        assert [l.layer_id for l in c.modules() if isinstance(l, ft.Linear)] == \
               [l.layer_id for l in m.modules() if isinstance(l, ft.Linear)]
        ref = copy.deepcopy(m)
        a = train(ref, torch.optim.SGD(ref.parameters(), lr=0.0), 1, start=2)
        b = train(c, torch.optim.SGD(c.parameters(), lr=0.0), 1, start=2)
        assert_same(a, b)


def test_ema_of_a_converted_model_updates():
    m = make_net("ufp4")
    ema = torch.optim.swa_utils.AveragedModel(m, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    w = []
    for i in range(2):  # the first update copies, the second averages
        train(m, opt, 1, start=i)
        ema.update_parameters(m)
        w.append(m.blocks[0].fc1.weight.detach().clone())
    assert isinstance(ema.module.blocks[0].fc1, ft.Linear)
    assert torch.equal(ema.module.blocks[0].fc1.weight, torch.lerp(w[0], w[1], 1 - 0.9))
    with torch.no_grad():
        assert ema(batch(0)[0]).shape == (64, 16)


# ---- the step in the state dict ----------------------------------------------------------------------------

def test_resume_from_state_dict_is_bit_exact():
    n, k = 3, 2
    m = make_net("ufp4")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    train(m, opt, n)
    ck = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, ck)
    ck.seek(0)
    want = train(m, opt, k, start=n)

    fresh = make_net("ufp4", seed=1)  # other initial weights, step 0: everything comes from the checkpoint
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    state = torch.load(ck, weights_only=True)
    fresh.load_state_dict(state["model"])
    opt2.load_state_dict(state["opt"])
    assert step_of(fresh) == [n] * 4
    assert_same(want, train(fresh, opt2, k, start=n))

    # Without the step (set to 0 here) the SR bits of the backward differ: the step is what made it exact.
    stale = make_net("ufp4", seed=1)
    sd = {key: (torch.tensor(0) if key.endswith("_extra_state") else v) for key, v in state["model"].items()}
    stale.load_state_dict(sd)
    opt3 = torch.optim.AdamW(stale.parameters(), lr=1e-2)
    opt3.load_state_dict(state["opt"])
    got = train(stale, opt3, 1, start=n)
    assert not torch.equal(got[0][2], want[0][2])


def test_checkpoints_without_the_step_load_strictly():
    torch.manual_seed(0)
    plain = Net()
    m = ft.convert(copy.deepcopy(plain), "ufp4")
    ft.set_step(m, 4)
    m.load_state_dict(plain.state_dict(), strict=True)  # nn.Linear's keys only: the step stays
    assert step_of(m) == [4] * 5
    sd = {k: v for k, v in m.state_dict().items() if not k.endswith("_extra_state")}
    m.load_state_dict(sd, strict=True)
    m.load_state_dict(ft.convert(Net(), "ufp4").state_dict())  # a step of 0 from the checkpoint
    assert step_of(m) == [0] * 5
    with pytest.raises(RuntimeError, match="Unexpected key.*_extra_state"):
        plain.load_state_dict(m.state_dict())  # a plain model still refuses keys it does not have


def test_set_step_still_sets_the_key():
    a, b = make_net("ufp4"), make_net("ufp4")
    train(a, torch.optim.SGD(a.parameters(), lr=0.0), 3)  # lr 0: only the step moves
    ft.set_step(b, 3)
    assert step_of(b) == [3] * 4 and b.state_dict()["blocks.0.fc1._extra_state"].item() == 3
    assert_same(train(a, torch.optim.SGD(a.parameters(), lr=0.0), 1, start=3),
                train(b, torch.optim.SGD(b.parameters(), lr=0.0), 1, start=3))


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_draws_the_same_bits(reentrant):
    plain, ckpt = make_net("ufp4"), make_net("ufp4", checkpoint=reentrant)
    a = train(plain, torch.optim.SGD(plain.parameters(), lr=0.05), 3)
    b = train(ckpt, torch.optim.SGD(ckpt.parameters(), lr=0.05), 3)
    assert_same(a, b)
    assert step_of(plain) == step_of(ckpt) == [3] * 4


# ---- layer ids ---------------------------------------------------------------------------------------------

def test_layer_ids_come_from_qualified_names():
    m1, m2 = make_net("ufp4"), make_net("ufp4")
    ids = {n: l.layer_id for n, l in m1.named_modules() if isinstance(l, ft.Linear)}
    assert ids == {n: ft.layer_id_of(n) for n in ("blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2")}
    assert len(set(ids.values())) == 4 and all(0 <= i < 2 ** 29 for i in ids.values())
    assert ft.layer_id_of("blocks.0.fc1") == int.from_bytes(hashlib.sha256(b"blocks.0.fc1").digest()[:4], "big") >> 3
    # Two models built apart draw the same bits.
    assert_same(train(m1, torch.optim.SGD(m1.parameters(), lr=0.05), 2),
                train(m2, torch.optim.SGD(m2.parameters(), lr=0.05), 2))
    # Two convert calls on parts of one model do not collide.
    torch.manual_seed(0)
    m3 = Net()
    ft.convert(m3, "ufp4", include=r"^blocks\.0\.")
    ft.convert(m3, "ufp4", include=r"^blocks\.1\.")
    assert {n: l.layer_id for n, l in m3.named_modules() if isinstance(l, ft.Linear)} == ids
    # A second convert keeps the ids it finds.
    ft.convert(m3, "nvfp4", include=r"^blocks\.")
    assert {n: l.layer_id for n, l in m3.named_modules() if isinstance(l, ft.Linear)} == ids


# ---- convert's report --------------------------------------------------------------------------------------

def test_convert_transformer_encoder_layer(caplog):
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)
    with caplog.at_level(logging.INFO, logger="fp4lab.torch"):
        out = ft.convert(enc, "ufp4")
    assert out is enc
    rep = {e.name: e for e in enc.fp4lab_report}
    assert [e.name for e in enc.fp4lab_report if e.action == "converted"] == \
           ["self_attn", "self_attn.out_proj", "linear1", "linear2"]
    assert isinstance(enc.self_attn, ft.MultiheadAttention) and isinstance(enc.self_attn.out_proj, ft.Linear)
    assert enc.self_attn.out_proj.layer_id == ft.layer_id_of("self_attn.out_proj")
    assert isinstance(enc.linear1, ft.Linear) and isinstance(enc.linear2, ft.Linear)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("linear1 [Linear]: converted" in r.getMessage() for r in caplog.records)
    # Its fused inference path would compute with the weights directly, past the converted modules: it is off.
    assert rep[""].action == "fused path off"
    enc.eval()
    x = torch.randn(2, 32, 64)
    with torch.no_grad():
        q = enc(x)
        ft.convert(enc, "bf16")
        assert not torch.equal(enc(x), q)  # the recipe reaches the output: the converted modules ran
        # The control: with the hook gone the fused path runs, and the recipe makes no difference.
        enc._forward_pre_hooks.clear()
        fused = enc(x)
        ft.convert(enc, "ufp4")
        enc._forward_pre_hooks.clear()
        assert torch.equal(enc(x), fused)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True), 2)
    ft.convert(stack, "ufp4")
    assert not stack.use_nested_tensor
    assert [e.name for e in stack.fp4lab_report if e.action == "fused path off"] == ["", "layers.0", "layers.1"]


def golden_linear(recipe):
    """F.linear with both operands quantised as fwd_y quantises them (round to nearest: no SR key)."""
    def linear(x, w, b=None):
        x2 = x.detach().reshape(-1, x.shape[-1]).float().numpy()
        qa = fp4lab.quantize_with(np.ascontiguousarray(x2), fp4lab.config(recipe, pass_="fwd_y", operand="a"))
        qb = fp4lab.quantize_with(np.ascontiguousarray(w.detach().float().numpy()),
                                  fp4lab.config(recipe, pass_="fwd_y", operand="b"))
        y = torch.from_numpy(fp4lab.gemm(qa, qb)).to(x.dtype)
        if b is not None:
            y = y + b.detach().to(x.dtype)
        return y.reshape(*x.shape[:-1], w.shape[0])
    return linear


@pytest.mark.parametrize("case", ["self", "self-weights", "cross", "kv-apart", "kdim", "causal"])
def test_attention_is_torch_attention_with_quantised_projections(case, monkeypatch):
    """fp4lab's MultiheadAttention against nn.MultiheadAttention's own code (F.multi_head_attention_forward) with
    F.linear swapped for the golden model's quantised GEMM: the same bits, outputs and attention weights."""
    torch.manual_seed(0)
    kd = 32 if case == "kdim" else None
    ref = nn.MultiheadAttention(64, 4, dropout=0.0, batch_first=case != "self-weights", kdim=kd, vdim=kd)
    ours = ft.convert(copy.deepcopy(ref), "nvfp4")
    assert isinstance(ours, ft.MultiheadAttention)
    g = torch.Generator().manual_seed(3)
    shape = lambda e: (2, 16, e) if ref.batch_first else (16, 2, e)  # noqa: E731
    q = torch.randn(*shape(64), generator=g).requires_grad_(True)  # grad on: no fused path in either
    k = v = q
    kw = {"need_weights": case == "self-weights"}
    if case in ("cross", "kv-apart", "kdim"):
        k = v = torch.randn(*shape(kd or 64), generator=g)
    if case in ("kv-apart", "kdim"):
        v = torch.randn(*shape(kd or 64), generator=g)
    if case in ("self", "self-weights", "causal"):
        kpm = torch.zeros(2, 16)
        kpm[1, 12:] = float("-inf")
        kw.update(key_padding_mask=kpm, attn_mask=nn.Transformer.generate_square_subsequent_mask(16))
    if case == "causal":
        kw = {"attn_mask": nn.Transformer.generate_square_subsequent_mask(16), "is_causal": True,
              "need_weights": False}
    got = ours(q, k, v, **kw)
    monkeypatch.setattr(torch.nn.functional, "linear", golden_linear("nvfp4"))
    want = ref(q, k, v, **kw)
    assert torch.equal(got[0], want[0])
    assert (got[1] is None) == (want[1] is None) and (got[1] is None or torch.equal(got[1], want[1]))
    assert ours.step == 1 and ours.out_proj.step == 1


def test_attention_trains_reproducibly():
    def run(checkpoint=False):
        torch.manual_seed(0)
        m = ft.convert(nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True), "ufp4")
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        out = []
        for i in range(2):
            x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(i)).requires_grad_(True)
            y = tc.checkpoint(m, x, use_reentrant=False) if checkpoint else m(x)
            loss = y.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            out.append([loss.detach()] + [p.grad.clone() for p in m.parameters()])
            opt.step()
        return m, out
    (m1, a), (m2, b), (m3, c) = run(), run(), run(checkpoint=True)
    assert_same(a, b)
    assert_same(a, c)  # activation checkpointing draws the same SR bits
    assert m3.self_attn.step == m3.self_attn.out_proj.step == 2
    assert m1.self_attn.in_proj_weight.grad.abs().sum() > 0
    assert m1.state_dict()["self_attn._extra_state"].item() == 2
    ft.set_step(m2, 7)
    assert m2.self_attn.step == m2.self_attn.out_proj.step == m2.linear1.step == 7
    # A deep copy and a state dict carry the attention's step too.
    c = copy.deepcopy(m1)
    assert c.self_attn.step == 2 and c.self_attn._projections[0].owner is c.self_attn
    assert c.self_attn._projections[0].layer_id == ft.layer_id_of("self_attn.in_proj.0")


def test_convert_leaves_a_shared_module_and_bad_shapes():
    shared = nn.Linear(64, 64)
    m = nn.ModuleDict({"a": shared, "b": shared, "odd": nn.Linear(40, 64), "ok": nn.Linear(64, 32),
                       "skip": nn.Linear(64, 64)})
    ft.convert(m, "ufp4", exclude="skip")
    rep = {e.name: e for e in m.fp4lab_report}
    assert rep["a"].action == "left" and "2 names (a, b)" in rep["a"].reason
    assert m["a"] is m["b"] is shared  # still one module, unquantised under both names
    assert rep["odd"].action == "left"
    assert rep["odd"].reason == ("fwd_y operand a [tokens, 40]: reduction dimension 40 is not a multiple of the block "
                                 "size 16")
    assert type(m["odd"]) is nn.Linear
    assert rep["ok"].action == "converted" and isinstance(m["ok"], ft.Linear)
    assert rep["skip"].action == "left" and rep["skip"].reason == "not matched by include/exclude"
    assert "ok [Linear]: converted (fp4lab.torch.Recipe('ufp4', mode='exact', seed=0))" in str(m.fp4lab_report)
    # A weight tied to another module: converted, and the tie named.
    tied = nn.ModuleDict({"emb": nn.Embedding(32, 64), "head": nn.Linear(64, 32, bias=False)})
    tied["head"].weight = tied["emb"].weight
    ft.convert(tied, "ufp4")
    e, emb = tied.fp4lab_report  # the embedding too: it holds a weight matrix, and says why it is not converted
    assert e.name == "head" and e.action == "converted" and e.reason.endswith("; its weight is also emb.weight")
    assert emb.name == "emb" and emb.action == "no matmul" and emb.reason.endswith("; head.weight is the same parameter")
    assert tied["head"].weight is tied["emb"].weight


def test_convert_a_lone_linear():
    torch.manual_seed(0)
    lin = nn.Linear(64, 64)
    q = ft.convert(lin, "nvfp4")
    assert isinstance(q, ft.Linear) and q.weight is lin.weight and q.bias is lin.bias
    assert q.layer_id == ft.layer_id_of("") and q.fp4lab_report.converted == [""]
    x = torch.randn(32, 64)
    assert torch.equal(q(x), ft.Linear.from_linear(lin, "nvfp4", layer_id=ft.layer_id_of(""))(x))


def test_convert_again_changes_the_recipe():
    m = make_net("ufp4")
    ft.set_step(m, 2)
    ids = [l.layer_id for l in m.modules() if isinstance(l, ft.Linear)]
    ft.convert(m, "nvfp4")
    rep = {e.name: e for e in m.fp4lab_report}
    assert rep["blocks.0.fc1"].action == "recipe changed"
    assert "was fp4lab.torch.Recipe('ufp4'" in rep["blocks.0.fc1"].reason
    assert rep["head"].action == "converted"
    assert all(l.recipe == ft.Recipe("nvfp4") for l in m.modules() if isinstance(l, ft.Linear))
    assert [l.layer_id for l in m.modules() if isinstance(l, ft.Linear)][:4] == ids and step_of(m)[:4] == [2] * 4
    # The same bits as a model converted to nvfp4 once.
    torch.manual_seed(0)
    once = ft.convert(Net(), "nvfp4")
    ft.set_step(once, 2)
    ft.set_step(m.head, 2)
    assert_same(train(m, torch.optim.SGD(m.parameters(), lr=0.0), 1),
                train(once, torch.optim.SGD(once.parameters(), lr=0.0), 1))
    ft.convert(m, "nvfp4")
    assert all(e.action == "unchanged" for e in m.fp4lab_report)


# ---- errors ------------------------------------------------------------------------------------------------

def test_errors_name_the_module():
    m = make_net("mxfp4")
    x = torch.randn(64, 64, requires_grad=True)
    y = m(x)
    dy = torch.randn_like(y)
    dy[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"^blocks\.1\.fc2: bwd_dx operand a \[64, 64\]: .*NaN"):
        y.backward(dy)
    x = torch.randn(64, 64)
    x[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^blocks\.0\.fc1: fwd_y operand a \[64, 64\]: .*Inf"):
        m(x)
    with pytest.raises(ValueError, match=r"^Linear\(64, 32\): fwd_y operand a \[16, 64\]: .*NaN"):
        ft.Linear(64, 32, recipe="ufp4")(torch.full((16, 64), float("nan")))


def test_argument_errors_are_one_line():
    x = np.zeros((4, 16), np.float32)
    cases = [(lambda: fp4lab.config("ufp4", pass_=3), TypeError, "config(): pass_ must be a str, not int"),
             (lambda: fp4lab.config(5), TypeError, "config(): recipe must be a str, not int"),
             (lambda: fp4lab.quantize_with(x, "ufp4"), TypeError,
              "quantize_with(): cfg must be a QuantConfig (from fp4lab.config), not str"),
             (lambda: ft.quantize(torch.zeros(4, 16), 3), TypeError,
              "quantize(): cfg must be a QuantConfig or a recipe name, not int"),
             (lambda: ft.Recipe(3), TypeError, "Recipe(): name must be a str or None, not int"),
             (lambda: fp4lab._one_line_errors(fp4lab._core.quantize_f32)(x, 3), TypeError,
              "quantize_f32(): arguments of types (ndarray, int) do not fit quantize_f32(x: ndarray[dtype=float32, "
              "shape=(*, *), order='C', device='cpu', writable=False], config: fp4lab._core.QuantConfig)")]
    for f, kind, text in cases:
        with pytest.raises(kind) as e:
            f()
        assert str(e.value) == text


def test_double_backward_is_refused():
    lin = ft.Linear(64, 64, recipe="ufp4")
    x = torch.randn(64, 64, requires_grad=True)
    (g,) = torch.autograd.grad(lin(x).pow(2).sum(), x)  # a first derivative is fine
    assert g.shape == x.shape
    with pytest.raises(RuntimeError, match=r"Linear\(64, 64\): double backward \(create_graph=True\) through an "
                                           "fp4lab Linear is not supported"):
        torch.autograd.grad(lin(x).pow(2).sum(), x, create_graph=True)


QUIET = r"""
import torch, fp4lab.torch as ft
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
ft.convert(m, "ufp4")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(64, 64)).pow(2).mean().backward()
opt.step()
y = m(torch.randn(64, 64))  # a graph alive at exit, as a script's last forward often is
"""


def test_interpreter_exit_is_quiet():
    r = subprocess.run([sys.executable, "-c", QUIET], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""
