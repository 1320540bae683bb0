"""fp4lab.torch under torch.compile (inductor, CPU): a converted model's training step compiles into one graph
(fullgraph=True, no graph break), is compiled once rather than once per SR step, and gives the losses, gradients
and updated parameters of eager mode bit for bit in exact mode; compiled inference equals eager; the operators
pass torch.library's own checks."""
import copy

import pytest
import torch
from torch import nn

import fp4lab.torch as ft


class MLP(nn.Module):
    # ReLU rather than GELU: inductor computes GELU's erf its own way, which is no part of fp4lab's bits.
    def __init__(self, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(32, 64, bias=bias)
        self.fc2 = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class AttentionBlock(nn.Module):
    def __init__(self, need_weights=False):
        super().__init__()
        self.att = nn.MultiheadAttention(32, 2, batch_first=True)
        self.fc = nn.Linear(32, 32)
        self.need_weights = need_weights

    def forward(self, x):
        h = x + self.att(x, x, x, need_weights=self.need_weights)[0]
        return self.fc(torch.relu(h))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32)


def train_steps(model, opt, x, t, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - t).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def compiles() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def check_compiled_training(make, x, t, recipe, backend="inductor"):
    torch.manual_seed(0)
    eager = make()
    ft.convert(eager, recipe)
    model = copy.deepcopy(eager)
    explained = torch._dynamo.explain(copy.deepcopy(model))(x)  # a copy: explain runs a forward, which takes a step
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch._dynamo.reset()
    for step in range(3):
        (le,) = train_steps(eager, opt_e, x, t, 1)
        before = compiles()
        (lc,) = train_steps(compiled, opt_c, x, t, 1)
        if step > 0:
            assert compiles() == before, f"step {step} compiled again"
        assert torch.equal(bits(le), bits(lc)), (step, le, lc)
        for (n, p), q in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(bits(p.grad), bits(q.grad)), (step, n)
            assert torch.equal(bits(p), bits(q)), (step, n)
    steps = [m.step for m in model.modules() if isinstance(m, (ft.Linear, ft.MultiheadAttention))]
    assert steps == [m.step for m in eager.modules() if isinstance(m, (ft.Linear, ft.MultiheadAttention))]
    assert recipe == "bf16" or set(steps) == {3}
    return eager, model, compiled


@pytest.mark.parametrize("recipe", ft.RECIPES)
def test_training_step_compiles_whole_and_matches_eager_bit_for_bit(recipe):
    assert set(ft.RECIPES) >= {"bf16", "ufp4", "e2m1-ref", "nvfp4", "mxfp4"}
    x, t = torch.randn(64, 32), torch.randn(64, 32)
    # Under bf16 the layers are plain F.linear, whose bias gradient inductor sums in an order of its own: that
    # model has no bias. Under the fp4lab recipes the bias gradient keeps eager's order (fp4lab::column_sum).
    eager, model, compiled = check_compiled_training(lambda: MLP(bias=recipe != "bf16"), x, t, recipe)
    # Inference: eval mode without grad, no step taken.
    eager.eval(), model.eval()
    with torch.no_grad():
        ye, yc = eager(x), compiled(x)
    assert torch.equal(bits(ye), bits(yc))
    if recipe != "bf16":
        assert model.fc1.step == 3


def test_attention_training_step_compiles_whole_and_matches_eager_bit_for_bit():
    x, t = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    eager, model, _ = check_compiled_training(AttentionBlock, x, t, "nvfp4")
    assert isinstance(model.att, ft.MultiheadAttention) and model.att.step == 3


def test_attention_with_weights_traces_to_eager_bits():
    # With the weights asked for, the attention is an explicit softmax, which inductor computes in bits of its own;
    # the traced graph itself, run on eager kernels (aot_eager: the same forward and backward graphs), is eager's.
    x, t = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    check_compiled_training(lambda: AttentionBlock(need_weights=True), x, t, "ufp4", backend="aot_eager")


def test_set_step_reaches_the_compiled_graph_without_a_recompilation():
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    eager = ft.convert(MLP(), "nvfp4")
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, fullgraph=True)
    torch._dynamo.reset()
    compiled(x).sum().backward()
    before = compiles()
    for s in (7, 1000):
        ft.set_step(model, s)
        ft.set_step(eager, s)
        model.zero_grad(), eager.zero_grad()
        compiled(x).sum().backward()
        eager(x).sum().backward()
        assert torch.equal(bits(model.fc1.weight.grad), bits(eager.fc1.weight.grad))
        assert model.fc1.step == s + 1
    assert compiles() == before
    # The SR step matters: another step gives other gradients.
    g = model.fc1.weight.grad.clone()
    ft.set_step(model, 7)
    model.zero_grad()
    compiled(x).sum().backward()
    assert not torch.equal(g, model.fc1.weight.grad)


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_cuda_training_step_compiles_whole_and_matches_eager_bit_for_bit(recipe):
    # On CUDA the operators run the kernels on the device (quantiser, contract GEMM, dequantiser); eager mode runs
    # the same kernels through the layers' own buffers.
    x, t = torch.randn(64, 32).cuda(), torch.randn(64, 32).cuda()
    check_compiled_training(lambda: MLP().cuda(), x, t, recipe)


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_cuda_fast_bf16_step_compiles_to_eager_bits(recipe):
    # A BF16 fast model: eager mode reads X, W and dY once for both of their GEMMs (fast_pair) and checks the GEMM
    # outputs from the operands' bounds; the compiled graph quantises each operand in its own operator
    # (fp4lab::fast_qmatmul). The losses, gradients and parameters are the same bits. aot_eager runs the traced
    # forward and backward graphs on eager kernels (inductor would compute the BF16 loss in an order of its own).
    torch.manual_seed(0)
    eager = ft.convert(MLP().cuda().to(torch.bfloat16), ft.Recipe(recipe, mode="fast"))
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(64, 32, device="cuda").to(torch.bfloat16).requires_grad_(True)
    t = torch.randn(64, 32, device="cuda").to(torch.bfloat16)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        seen = []
        for m, opt in ((eager, opt_e), (compiled, opt_c)):
            x.grad = None
            (loss,) = train_steps(m, opt, x, t, 1)
            seen.append((loss, x.grad.clone()))
        (le, ge), (lc, gc) = seen
        assert torch.equal(le.view(torch.int16), lc.view(torch.int16)), (step, le, lc)
        assert torch.equal(ge.view(torch.int16), gc.view(torch.int16)), step
        for (n, p), q in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(p.grad.view(torch.int16), q.grad.view(torch.int16)), (step, n)
            assert torch.equal(p.view(torch.int16), q.view(torch.int16)), (step, n)
    ft.check_finite()


def test_fast_mode_compiles_whole():
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    eager = ft.convert(MLP(), ft.Recipe("ufp4", mode="fast"))
    model = copy.deepcopy(eager)
    explained = torch._dynamo.explain(copy.deepcopy(model))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    ye, yc = eager(x), compiled(x)
    ye.sum().backward(), yc.sum().backward()
    # Fast mode is torch's FP32 matmul on the dequantised operands: close to eager, not promised bit for bit.
    torch.testing.assert_close(ye, yc)
    torch.testing.assert_close(eager.fc1.weight.grad, model.fc1.weight.grad)


def test_operators_pass_torch_library_checks():
    r = ft.Recipe("nvfp4")
    x, w, step = torch.randn(16, 32), torch.randn(48, 32), torch.tensor(3)
    qa = torch.ops.fp4lab.quantize(x, step, r.key, 5, "fwd_y", "a", "x")
    qb = torch.ops.fp4lab.quantize(w, step, r.key, 5, "fwd_y", "b", "w")
    assert [q.dtype for q in qa] == [torch.uint8, torch.float32, torch.float32]
    assert qa[0].shape == (16, 32) and qa[1].shape == (16, 2) and qa[2].shape == ()
    for op, args in ((torch.ops.fp4lab.quantize.default, (x, step, r.key, 5, "fwd_y", "a", "x")),
                     (torch.ops.fp4lab.gemm.default, (*qa, *qb, r.key, "fwd_y")),
                     (torch.ops.fp4lab.dequantize.default, (*qa, r.key, "fwd_y", "a")),
                     (torch.ops.fp4lab.fake_quantize.default, (x, step, r.key, 5, "fwd_y", "a", "x")),
                     (torch.ops.fp4lab.qgemm.default, (x, w, step, r.key, 5, "fwd_y", "x")),
                     (torch.ops.fp4lab.fast_qmatmul.default, (x, w, step, r.key, 5, "fwd_y", "x")),
                     (torch.ops.fp4lab.column_sum.default, (x,))):
        torch.library.opcheck(op, args)
    # The operators compute what the eager functions do.
    cfg = lambda o: r.config("fwd_y", o, layer=5, step=3)  # noqa: E731
    ha, hb = ft.quantize(x, cfg("a")), ft.quantize(w, cfg("b"))
    assert torch.equal(qa[0], torch.tensor(ha.codes)) and torch.equal(qa[1], torch.tensor(ha.scales))
    assert torch.equal(bits(torch.ops.fp4lab.gemm(*qa, *qb, r.key, "fwd_y")), bits(ft.gemm(ha, hb)))
    assert torch.equal(bits(torch.ops.fp4lab.dequantize(*qa, r.key, "fwd_y", "a")), bits(ft.dequantize(ha)))
    assert torch.equal(bits(torch.ops.fp4lab.qgemm(x, w, step, r.key, 5, "fwd_y", "x")), bits(ft.gemm(ha, hb)))
    assert torch.equal(bits(torch.ops.fp4lab.fake_quantize(x, step, r.key, 5, "fwd_y", "a", "x")),
                       bits(ft.dequantize(ha)))
    assert torch.equal(bits(torch.ops.fp4lab.fast_qmatmul(x, w, step, r.key, 5, "fwd_y", "x")),
                       bits(ft.product(ha, hb, "fast")))


def test_operator_faults_name_the_layer_and_operand():
    r = ft.Recipe("nvfp4")
    with pytest.raises(ValueError, match=r"^blocks\.0\.fc1: fwd_y operand a \[16, 20\]: "):
        torch.ops.fp4lab.quantize(torch.randn(16, 20), torch.tensor(0), r.key, 0, "fwd_y", "a", "blocks.0.fc1")
