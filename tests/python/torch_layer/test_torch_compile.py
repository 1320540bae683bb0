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
    # outputs from the operands' bounds; so does the compiled graph, through its own operators (fp4lab::fast_pair,
    # one a tensor, and fp4lab::fast_mm, one a GEMM). The losses, gradients and parameters are the same bits. The
    # traced forward and backward graphs run on eager kernels (aot_eager's; inductor would compute the BF16 loss in
    # an order of its own).
    torch.manual_seed(0)
    eager = ft.convert(MLP().cuda().to(torch.bfloat16), ft.Recipe(recipe, mode="fast"))
    model = copy.deepcopy(eager)
    graphs = []
    compiled = torch.compile(model, fullgraph=True, backend=recording_aot_eager(graphs))
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
    # Forward: X and W of both layers, each read once for its two GEMMs; backward: dY of both layers. No operand is
    # quantised alone, and six GEMMs take the pairs' operands.
    fwd, bwd = graphs
    assert ops_in(fwd) == {"fast_pair": 4, "fast_mm": 2}, fwd
    assert ops_in(bwd) == {"fast_pair": 2, "fast_mm": 4}, bwd


def recording_aot_eager(graphs: list):
    """aot_eager's backend (the traced forward and backward graphs run on eager kernels) that keeps each graph's
    code in ``graphs``."""
    from torch._dynamo.backends.common import aot_autograd

    def keep(gm, _inputs):
        graphs.append(gm.code)
        return gm
    return aot_autograd(fw_compiler=keep, bw_compiler=keep)


def ops_in(code: str) -> dict:
    """How often each fp4lab operator is called in a graph's code."""
    import re
    found: dict = {}
    for name in re.findall(r"torch\.ops\.fp4lab\.(\w+)\.default", code):
        found[name] = found.get(name, 0) + 1
    found.pop("take_step", None)
    found.pop("column_sum", None)
    return found


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_compiled_fast_output_checks_read_the_pairs_bounds(output_checks):
    # The compiled graph's GEMM output checks read the bounds fp4lab::fast_pair gives beside its operands: a step's
    # three GEMMs take the product check (no plain scan), and an output that does overflow BF16 is still found and
    # reported at the next check. An operand quantised alone has no bounds, and its GEMM is scanned: with an input
    # that needs no gradient, W (no Wᵀ to make) in the forward and dYᵀ (no dY) in the backward.
    seen = output_checks.seen
    torch.manual_seed(0)
    layer = ft.convert(nn.Linear(64, 96).cuda().to(torch.bfloat16), ft.Recipe("ufp4", mode="fast"))
    assert layer.recipe.check_finite == "deferred"
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16).cuda()
    dy = torch.randn(2, 64, 96, generator=g).to(torch.bfloat16).cuda()
    compiled(x.clone().requires_grad_(True)).backward(dy)
    assert seen == ["product"] * 3
    seen.clear()
    compiled(x).backward(dy)
    assert seen == ["scan", "scan"]
    ft.check_finite()  # nothing flagged
    output_checks.overflow_is_reported(layer, compiled, x, dy)


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


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4", "mxfp4"])
def test_cuda_pair_operators_pass_torch_library_checks_and_give_eager_bits(recipe):
    # fp4lab::fast_pair gives fake_quantize_both's two operands (one read where the grid fits, two passes otherwise:
    # MXFP4's blocks of 32), and fp4lab::fast_mm multiplies them as fp4lab::fast_qmatmul does.
    r = ft.Recipe(recipe, mode="fast")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(128, 64, generator=g).to(torch.bfloat16).cuda()
    w = torch.randn(96, 64, generator=g).to(torch.bfloat16).cuda()
    step = torch.tensor(5)
    pairs = {}
    for name, t, ops in (("x", x, "fwd_y.a,bwd_dw.b"), ("w", w, "fwd_y.b,bwd_dx.b")):
        args = (t, step, r.key, 3, ops, name)
        torch.library.opcheck(torch.ops.fp4lab.fast_pair.default, args)
        pairs[name] = torch.ops.fp4lab.fast_pair(*args)
    (xa, xt, bx, bxt), (wb, wt, bw, bwt) = pairs["x"], pairs["w"]
    cfg = lambda p, o: r.config(p, o, layer=3, step=5)  # noqa: E731
    for (y, yt), t, c, ct in (((xa, xt), x, cfg("fwd_y", "a"), cfg("bwd_dw", "b")),
                              ((wb, wt), w, cfg("fwd_y", "b"), cfg("bwd_dx", "b"))):
        ey, eyt = ft.fake_quantize_both(t, c, ct, check_finite="deferred")
        assert torch.equal(y.view(torch.int16), ey.view(torch.int16))
        assert torch.equal(yt.view(torch.int16), eyt.view(torch.int16))
    # Bounds where one kernel read the tensor for both, or where one pass and a transposing copy made the two (NVFP4's
    # W, in 16x16 tiles, the same values both ways): one FP32 word per 64x128 tile; none where the two passes ran
    # (MXFP4's blocks of 32). The copy's words are the largest magnitude of their tile's values.
    assert bx.dtype == bw.dtype == torch.float32
    assert bx.numel() == bxt.numel() == (0 if recipe == "mxfp4" else 2)
    assert bw.numel() == bwt.numel() == (0 if recipe == "mxfp4" else 2)
    if recipe == "nvfp4":
        assert torch.equal(wt.view(torch.int16), wb.t().contiguous().view(torch.int16))
        tiles = [wb[r:r + 64].abs().float().amax() for r in (0, 64)]
        assert torch.equal(bw.view(torch.int32), torch.stack(tiles).view(torch.int32))
        assert torch.equal(bwt.view(torch.int32), bw.view(torch.int32))
    args = (xa, wb, bx, bw, r.key)
    torch.library.opcheck(torch.ops.fp4lab.fast_mm.default, args)
    assert torch.equal(torch.ops.fp4lab.fast_mm(*args).view(torch.int16),
                       torch.ops.fp4lab.fast_qmatmul(x, w, step, r.key, 3, "fwd_y", "x").view(torch.int16))
    ft.check_finite()


@pytest.mark.skipif(not (torch.cuda.is_available() and ft.ops._core.cuda_built),
                    reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_compiled_fast_layer_takes_new_token_counts_whole():
    # A second and third token count make torch.compile trace the layer with symbolic sizes (automatic dynamic
    # shapes): fullgraph=True still compiles it whole, once more, and each step gives eager's bits. The pair
    # operator's fake sizes its bounds by the kernels' own tile (_bound_tile), which equals their word count.
    import fp4lab.torch.ops as ops
    r = ft.Recipe("ufp4", mode="fast")
    cfg, cfg_t = (r.config(p, o, layer=0, step=0) for p, o in (("fwd_y", "a"), ("bwd_dw", "b")))
    tr, tc, most = ops._bound_tile(cfg, cfg_t)
    for rows, cols in ((1, 1), (64, 128), (65, 129), (8192, 2816), (most, 16), (most + 1, 16)):
        want = ops._core.cuda_fake_quantize_both_bound_words(rows, cols)
        assert want == -(-cols // tc) * -(-rows // tr), (rows, cols)
        assert ops._core.cuda_fake_quantize_both_bounded(True, cfg, cfg_t, rows) == (rows <= most)
    torch.manual_seed(0)
    eager = ft.convert(nn.Linear(64, 96).cuda().to(torch.bfloat16), r)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    for n in (128, 256, 384):
        x = torch.randn(n, 64, device="cuda").to(torch.bfloat16)
        eager.zero_grad()
        model.zero_grad()
        ye, yc = eager(x.clone().requires_grad_(True)), compiled(x.clone().requires_grad_(True))
        assert torch.equal(ye.view(torch.int16), yc.view(torch.int16)), n
        ye.float().square().sum().backward()
        yc.float().square().sum().backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(p.grad.view(torch.int16), q.grad.view(torch.int16)), (n, name)
    ft.check_finite()


def test_pair_fake_sizes_its_bounds_from_symbolic_shapes(monkeypatch):
    # A dynamic-shape graph (a second token count under torch.compile) traces fp4lab::fast_pair's fake with symbolic
    # sizes: the bounds' words must be an expression of them (a size of their own that only the backward reads stops
    # a whole-graph compile), equal at each concrete shape to what the kernels' functions give. The CUDA-only
    # functions stand in here as kernels.hpp defines them: one word per 64x128 tile of x, bounds for at most 65535
    # tiles of rows.
    import sympy
    from torch.fx.experimental.proxy_tensor import make_fx
    import fp4lab.torch.ops as ops
    words = lambda r, c: -(-c // 128) * -(-r // 64)  # noqa: E731
    monkeypatch.setattr(ops._core, "cuda_built", True, raising=False)
    monkeypatch.setattr(ops._core, "cuda_fake_quantize_both_bound_words", words, raising=False)
    monkeypatch.setattr(ops._core, "cuda_fake_quantize_both_bounded",
                        lambda bf16, c, ct, rows: bf16 and -(-rows // 64) <= 65535, raising=False)
    ops._bound_tile.cache_clear()
    r = ft.Recipe("ufp4", mode="fast")

    def pair(x, step):
        return torch.ops.fp4lab.fast_pair(x, step, r.key, 3, "fwd_y.a,bwd_dw.b", "L")

    try:
        gm = make_fx(pair, tracing_mode="symbolic")(torch.empty(128, 64, dtype=torch.bfloat16), torch.tensor(5))
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        y, yt, by, byt = (n.meta["val"] for n in out)
        rows, cols = y.shape
        assert tuple(yt.shape) == (cols, rows)
        expr = by.shape[0].node.expr
        assert by.shape[0].node.expr == byt.shape[0].node.expr
        names = {str(v) for v in expr.free_symbols}
        assert names == {str(rows.node.expr), str(cols.node.expr)}, expr  # no symbol of its own
        for rv, cv in ((128, 64), (8192, 1024), (100, 130), (64 * 65535, 16)):
            got = expr.subs({rows.node.expr: rv, cols.node.expr: cv})
            assert got == sympy.Integer(words(rv, cv)), (rv, cv, got)
        assert ops._bound_tile(*(r.config(p, o, layer=0, step=0) for p, o in (("fwd_y", "a"), ("bwd_dw", "b")))) \
            == (64, 128, 64 * 65535)
    finally:
        ops._bound_tile.cache_clear()


def test_operator_faults_name_the_layer_and_operand():
    r = ft.Recipe("nvfp4")
    with pytest.raises(ValueError, match=r"^blocks\.0\.fc1: fwd_y operand a \[16, 20\]: "):
        torch.ops.fp4lab.quantize(torch.randn(16, 20), torch.tensor(0), r.key, 0, "fwd_y", "a", "blocks.0.fc1")


def test_the_operator_table_lists_every_operator():
    # docs/python.md's table of the operators names each registered fp4lab operator once, with its arguments.
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "python.md").read_text()
    listed = re.findall(r"^\| `fp4lab::(\w+)\(([^)]*)\)` \|", doc, re.M)
    registered = {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("fp4lab::")}
    assert sorted(name for name, _ in listed) == sorted(registered)
    for name, args in listed:
        schema = getattr(torch.ops.fp4lab, name).default._schema
        assert [a.strip() for a in args.split(",")] == [a.name for a in schema.arguments], name
