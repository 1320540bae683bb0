"""fp4lab.torch under hostile use: an attention converted with options it would drop, inputs and state dicts
nn.Linear takes or refuses, malformed recipes, a layer called twice in a checkpointed step, monitors sharing a file
or losing their disk, and a GPU operand asked for without a GPU. Each answer is nn.Linear's (or nn.Module's) or a
one-line error naming what is wrong."""
import copy
import json
import resource
import signal

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as tc
from torch import nn

import fp4lab
import fp4lab.torch as ft
from fp4lab._files import DataError
from test_torch_state import golden_linear


def one_line(e) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


def equal(a, b) -> bool:
    return a is b is None or (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


# ---- MultiheadAttention.from_mha: every option carried over, or refused --------------------------------------

@pytest.mark.parametrize("recipe", ["bf16", "ufp4"])
@pytest.mark.parametrize("option", [{"add_bias_kv": True}, {"add_zero_attn": True},
                                    {"add_bias_kv": True, "add_zero_attn": True}])
def test_from_mha_refuses_the_options_it_cannot_compute(option, recipe):
    mha = nn.MultiheadAttention(64, 4, **option)
    with pytest.raises(ValueError) as e:
        ft.MultiheadAttention.from_mha(mha, recipe)
    assert "add_bias_kv" in one_line(e) and "add_zero_attn" in one_line(e)
    with pytest.raises(TypeError):
        ft.MultiheadAttention.from_mha(nn.Linear(64, 64), recipe)


OPTIONS = {"plain": {}, "no-bias": {"bias": False}, "kdim-vdim": {"kdim": 32, "vdim": 48},
           "batch-first": {"batch_first": True}, "dropout": {"dropout": 0.25}}


@pytest.mark.parametrize("name", OPTIONS)
def test_from_mha_carries_every_option(name, monkeypatch):
    """The converted attention computes what nn.MultiheadAttention computes: bit for bit under the passthrough
    recipe, and with F.linear swapped for the golden quantised GEMM under nvfp4 (dropout in training mode too)."""
    kw = OPTIONS[name]
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 4, **kw)
    g = torch.Generator().manual_seed(1)
    shape = lambda e: (2, 16, e) if ref.batch_first else (16, 2, e)  # noqa: E731
    q = torch.randn(*shape(64), generator=g).requires_grad_(True)
    k = torch.randn(*shape(kw.get("kdim", 64)), generator=g)
    v = torch.randn(*shape(kw.get("vdim", 64)), generator=g)
    for recipe in ("bf16", "nvfp4"):
        ours = ft.MultiheadAttention.from_mha(copy.deepcopy(ref), recipe)
        assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
        torch.manual_seed(7)
        got = ours(q, k, v)
        with monkeypatch.context() as mp:
            if recipe != "bf16":
                mp.setattr(torch.nn.functional, "linear", golden_linear(recipe))
            torch.manual_seed(7)
            want = ref(q, k, v)
        assert equal(got[0], want[0]) and equal(got[1], want[1]), (name, recipe)


# ---- fp4lab.torch.Linear: nn.Linear's answers --------------------------------------------------------------

def test_linear_refuses_what_nn_linear_refuses_in_its_words():
    for x in (torch.tensor(1.0), torch.randn(4, 0), torch.randn(4, 0, requires_grad=True), torch.randn(32, 63),
              torch.ones(32, 64, dtype=torch.int64), torch.ones(32, 64, dtype=torch.bool),
              torch.ones(32, 64, dtype=torch.complex64)):
        lin = ft.Linear(64, 32, recipe="ufp4")
        with pytest.raises(Exception) as want:
            nn.Linear(64, 32)(x)
        with pytest.raises(Exception) as got:
            lin(x)
        assert type(got.value) is type(want.value) and str(got.value) == str(want.value), (x.shape, got.value)
        assert lin.step == 0  # nothing was drawn
    # A float dtype the quantisers do not read (nn.Linear would refuse it against FP32 weights too): one line.
    lin = ft.Linear(64, 32, recipe="ufp4")
    with pytest.raises(TypeError) as e:
        lin(torch.ones(32, 64, dtype=torch.float64))
    assert one_line(e).startswith("Linear(64, 32): a torch.float64 input") and lin.step == 0


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("dims", [(0, 32), (64, 0), (0, 0)])
def test_linear_with_a_zero_size_dimension_is_nn_linear(dims):
    """A layer of width 0 computes nothing to quantise: its output and gradients are nn.Linear's, empty or zero
    (sums over nothing) plus the bias."""
    torch.manual_seed(0)
    ref = nn.Linear(*dims)
    nn.init.normal_(ref.bias)
    ours = ft.Linear.from_linear(copy.deepcopy(ref), "ufp4")
    for tokens in (32, 3, 0):
        x = torch.randn(tokens, dims[0])
        outs = []
        for m in (ref, ours):
            m.zero_grad()
            xi = x.clone().requires_grad_(True)
            y = m(xi)
            y.backward(torch.ones_like(y))
            outs.append((y, xi.grad, m.weight.grad, m.bias.grad))
        for a, b in zip(*outs):
            assert equal(a, b), (dims, tokens)


def test_linear_on_the_meta_device_gives_nn_linears_shape():
    ref = nn.Linear(64, 32, device="meta")
    ours = ft.Linear(64, 32, recipe="ufp4", device="meta")
    for x in (torch.empty(4, 64, device="meta"), torch.empty(2, 64, 64, device="meta", requires_grad=True)):
        for autocast in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y, want = ours(x), ref(x)
            assert y.is_meta and y.shape == want.shape and y.dtype == want.dtype
            assert y.requires_grad == want.requires_grad
    # BF16 activations with FP32 weights, as the layer takes them on a device: a BF16 output.
    assert ours(torch.empty(16, 64, device="meta", dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert ours.step == 0  # shapes only: no step drawn


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 64)


@pytest.mark.parametrize("value", [2.7, True, torch.tensor(2.7), torch.tensor(True), torch.tensor([3, 4]),
                                   torch.tensor(-1), -1, 2**63, "3", None, torch.tensor(3.0, dtype=torch.float64),
                                   np.True_, np.float64(3.0), torch.empty((), dtype=torch.int64, device="meta")])
def test_a_foreign_extra_state_is_refused_by_its_key(value):
    m = ft.convert(TwoLayers(), "ufp4")
    ft.set_step(m, 9)
    sd = m.state_dict()
    sd["fc2._extra_state"] = value
    with pytest.raises(ValueError) as e:
        m.load_state_dict(sd)
    assert isinstance(e.value, DataError) and one_line(e).startswith("fc2._extra_state: ")
    assert m.fc2.step == 9


def test_the_steps_a_state_dict_may_hold():
    m = ft.convert(TwoLayers(), "ufp4")
    for value in (torch.tensor(5), torch.tensor(6, dtype=torch.int32), 7, np.int64(8), 2**63 - 1):
        sd = m.state_dict()
        sd["fc1._extra_state"] = value
        m.load_state_dict(sd)
        assert m.fc1.step == int(value)


@pytest.mark.parametrize("kw", [
    {"per_pass": [("fwd_y", {"rht": 0})]}, {"per_pass": "fwd_y"}, {"per_pass": {"fwd_y": 3}},
    {"per_pass": {"fwd_y": [("rht", 0)]}}, {"per_pass": {"fwd_y": {1: 0}}}, {"per_pass": {("fwd_y",): {}}},
    {"per_operand": {"fwd_y": {"rht": 0}}}, {"per_operand": {("fwd_y", "a", "b"): {}}}, {"per_operand": {5: {}}},
    {"per_operand": {("fwd_y", "a"): 5}}, {"per_operand": {("fwd_y", "a"): "rht"}},
    {"per_operand": [(("fwd_y", "a"), {})]}, {"per_operand": {"ab": {}}}])
def test_a_malformed_recipe_names_the_argument(kw):
    with pytest.raises((TypeError, ValueError)) as e:
        ft.Recipe("ufp4", **kw)
    arg = next(iter(kw))
    assert one_line(e).startswith(f"Recipe(): {arg}"), one_line(e)


# ---- a layer called twice in a step, checkpointed --------------------------------------------------------

def _structures(lin, reentrant):
    c = (lambda f, *a: f(*a)) if reentrant is None else \
        (lambda f, *a: tc.checkpoint(f, *a, use_reentrant=reentrant))  # noqa: E731
    return {
        "one-region": lambda x: c(lambda t: lin(torch.relu(lin(t))), x),
        "two-regions": lambda x: c(lin, torch.relu(c(lin, x))),
        "one-of-two": lambda x: lin(torch.relu(c(lin, x))),
        "side-by-side": lambda x: c(lin, x) * c(lin, x.flip(0)),
        "three-calls": lambda x: c(lambda t: lin(torch.relu(lin(t))), torch.relu(c(lin, x))),
    }


def _train_twice(structure, reentrant, retain=False):
    torch.manual_seed(0)
    lin = ft.Linear(64, 64, recipe=ft.Recipe("ufp4", seed=5))
    out = []
    for step in range(2):
        x = torch.randn(64, 64, generator=torch.Generator().manual_seed(step), requires_grad=True)
        loss = _structures(lin, reentrant)[structure](x).pow(2).mean()
        lin.zero_grad()
        loss.backward(retain_graph=retain)
        if retain:  # a second backward through the same graph recomputes the regions again
            loss.backward()
        out += [loss.detach(), x.grad, lin.weight.grad.clone(), lin.bias.grad.clone()]
    return out, lin.step


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("structure", ["one-region", "two-regions", "one-of-two", "side-by-side", "three-calls"])
def test_a_layer_used_twice_draws_the_same_bits_checkpointed(structure, reentrant):
    """ufp4 rounds gradients stochastically, keyed by each call's step: a recomputed call takes its original's,
    whichever region it is in and in whatever order the regions are recomputed."""
    (plain, plain_step), (ckpt, ckpt_step) = _train_twice(structure, None), _train_twice(structure, reentrant)
    assert ckpt_step == plain_step == 2 * (3 if structure == "three-calls" else 2)
    assert all(torch.equal(a, b) for a, b in zip(plain, ckpt))


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_retained_graph_recomputes_with_the_same_bits(reentrant):
    assert all(torch.equal(a, b) for a, b in zip(_train_twice("one-region", None, retain=True)[0],
                                                 _train_twice("one-region", reentrant, retain=True)[0]))


@pytest.mark.parametrize("outer", [False, True])
@pytest.mark.parametrize("inner", [False, True])
def test_nested_checkpoints_draw_the_same_bits(outer, inner):
    """Regions within regions, under a recipe that rounds every operand stochastically (the forward's keys show in
    the loss): each recomputation, the outer one's and the inner one's within it, keys each call as its original."""
    recipe = ft.Recipe("ufp4", rounding="sr", seed=5)

    def run(nested):
        torch.manual_seed(0)
        lin = ft.Linear(64, 64, recipe=recipe)
        c = lambda f, t, r: tc.checkpoint(f, t, use_reentrant=r)  # noqa: E731
        twice = lambda t: lin(torch.relu(lin(t)))  # noqa: E731
        out = []
        for step in range(2):
            x = torch.randn(64, 64, generator=torch.Generator().manual_seed(step), requires_grad=True)
            y = c(lambda t: lin(torch.relu(c(twice, t, inner))), x, outer) if nested else lin(torch.relu(twice(x)))
            loss = y.pow(2).mean()
            lin.zero_grad()
            loss.backward()
            # An inner reentrant checkpoint runs a backward of its own, which adds its weight gradients apart (in
            # another order than one backward adds them, with nn.Linear too): compared where torch adds as one.
            out += [loss.detach(), x.grad] + ([] if inner else [lin.weight.grad.clone()])
        return out, lin.step
    (plain, plain_step), (ckpt, ckpt_step) = run(False), run(True)
    assert plain_step == ckpt_step == 6 and all(torch.equal(a, b) for a, b in zip(plain, ckpt))


@pytest.mark.parametrize("reentrant", [False, True])
def test_an_attention_layer_used_twice_draws_the_same_bits_checkpointed(reentrant):
    def run(checkpoint):
        torch.manual_seed(0)
        layer = ft.convert(nn.TransformerEncoderLayer(64, 4, dim_feedforward=64, dropout=0.0, batch_first=True),
                           "ufp4")
        x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        f = lambda t: layer(layer(t))  # noqa: E731
        y = tc.checkpoint(f, x, use_reentrant=reentrant) if checkpoint else f(x)
        y.pow(2).mean().backward()
        return [x.grad] + [p.grad for p in layer.parameters()], layer.self_attn.step
    (a, sa), (b, sb) = run(False), run(True)
    assert sa == sb == 2 and all(torch.equal(p, q) for p, q in zip(a, b))


# ---- the numerics monitor's file ---------------------------------------------------------------------------

def _model():
    torch.manual_seed(0)
    return ft.convert(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32)), "ufp4")


def _train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        loss = (model(torch.randn(32, 64, generator=g)) - torch.randn(32, 32, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_monitors_on_one_file_are_refused(tmp_path):
    model, out = _model(), tmp_path / "m.jsonl"
    first = ft.monitor(model, every=1, out=out)
    with pytest.raises(DataError) as e:
        ft.monitor(model, every=1, out=str(out))
    assert one_line(e).startswith(f"{out}: ")
    _train(model, 2)
    first.close()
    per_step = 2 * (2 + 3)  # operands a and b of two layers' GEMMs (the first layer has no dgrad: x needs none)
    assert first.records == len(_lines(out)) == 2 * per_step
    with ft.monitor(model, every=1, out=out) as again:  # the file is free once the first is closed
        _train(model, 1)
    assert again.records == len(_lines(out)) == per_step


def test_monitor_outputs_follow_the_output_rules(tmp_path):
    model = _model()
    for out in (tmp_path, "/dev/null", tmp_path / "missing" / "m.jsonl"):
        with pytest.raises(DataError) as e:
            ft.monitor(model, out=out)
        assert one_line(e).startswith(f"{out}: ")
    assert ft.ops.observers == []


def test_a_failed_monitor_write_is_one_error_and_the_count_is_the_file(tmp_path):
    """A full disk (here: the file size limit, a real failing write) stops the monitor with one DataError naming
    the file; the file keeps whole records, as many as the monitor counts, and close() after it is quiet."""
    model, out = _model(), tmp_path / "m.jsonl"
    mon = ft.monitor(model, every=1, out=out)
    _train(model, 1)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (out.stat().st_size + 1500, limit[1]))
        with pytest.raises(DataError) as e:
            _train(model, 2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert one_line(e).startswith(f"{out}: write failed")
    mon.close()
    mon.close()
    assert ft.ops.observers == []
    assert out.read_text().endswith("\n") and mon.records == len(_lines(out)) >= 10
    _train(model, 1)  # training goes on without the monitor
    assert mon.records == len(_lines(out))


# ---- a GPU operand without a GPU -------------------------------------------------------------------------

def test_qtensorcuda_without_cuda_is_one_line(monkeypatch):
    from fp4lab.torch import ops
    if not (fp4lab._core.cuda_built and torch.cuda.is_available()):
        with pytest.raises(RuntimeError) as e:
            ft.QTensorCUDA()
        assert "CUDA" in one_line(e)
    # A build without CUDA has no device operand type at all.
    monkeypatch.setattr(ops, "_cuda_fault", None, raising=False)
    monkeypatch.setattr(fp4lab._core, "cuda_built", False)
    monkeypatch.delattr(fp4lab._core, "CudaQTensor", raising=False)
    with pytest.raises(RuntimeError) as e:
        ft.QTensorCUDA()
    assert one_line(e) == ("fp4lab.torch.QTensorCUDA needs a CUDA build of fp4lab and a CUDA device: this fp4lab was "
                           "built without CUDA")
