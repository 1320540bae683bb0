"""What the torch layer's tests share."""
import pytest
import torch


class OutputChecks:
    """The deferred GEMM output checks CUDA steps launch, in order (``seen``): "product" (the check from the
    operands' bounds, which scans only where they prove nothing) or "scan" (the plain scan)."""

    def __init__(self, monkeypatch):
        import fp4lab.torch.ops as ops
        self.seen: list = []
        real_p, real_s = ops._core.cuda_flag_nonfinite_product, ops._core.cuda_flag_nonfinite
        monkeypatch.setattr(ops._core, "cuda_flag_nonfinite_product",
                            lambda *a: self.seen.append("product") or real_p(*a))
        monkeypatch.setattr(ops._core, "cuda_flag_nonfinite", lambda *a: self.seen.append("scan") or real_s(*a))

    def overflow_is_reported(self, layer, model, x, dy):
        """With ``layer``'s weight and x scaled by 1e20 (|y| up to about 64·1e40, past BF16's largest, 3.4e38), a
        step of ``model`` takes the product check at its three GEMMs, and check_finite() reports the overflow."""
        import fp4lab.torch as ft
        with torch.no_grad():
            layer.weight.mul_(1e20)
        self.seen.clear()
        y = model((x * 1e20).requires_grad_(True))
        assert not bool(torch.isfinite(y).all())
        y.backward(dy)
        assert self.seen == ["product"] * 3
        with pytest.raises(ValueError, match="output of a quantised GEMM overflowed"):
            ft.check_finite()


@pytest.fixture
def output_checks(monkeypatch):
    return OutputChecks(monkeypatch)
