"""The golden model's scale codecs (models/include/fp4lab/scale.hpp) against ml_dtypes' float8_e4m3fn and
float8_e8m0fnu, an independent implementation: every E4M3 and E8M0 code decoded, and E4M3 encoding (RTNE) at
every midpoint between neighbouring E4M3 values, one FP32 ulp either side, and on random values."""
import ml_dtypes
import numpy as np

from fp4lab import _core


def test_e4m3_decode_every_code():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)  # 0x7F / 0xFF are NaN
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = _core.e4m3_decode(codes)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_ue4m3_encode_midpoints_and_random():
    pos = np.arange(0, 0x7F, dtype=np.uint8)  # every non-negative finite code, in increasing value
    vals = pos.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)  # exact in FP32 (few significant bits)
    assert np.array_equal(mids.astype(np.float64), (vals[:-1] + vals[1:]) / 2)
    rng = np.random.default_rng(0)
    x = np.concatenate([vals.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                        np.nextafter(mids, np.float32(np.inf)),
                        np.exp2(rng.uniform(-12, np.log2(448), 200_000)).astype(np.float32)])
    x = x[(x > 0) & (x <= 448)]
    want = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # RTNE, ties to the even code
    got = _core.ue4m3_encode(np.ascontiguousarray(x))
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:5]]


def test_ue4m3_encode_saturates_and_zero():
    got = _core.ue4m3_encode(np.array([0.0, 448.0, 460.0, 1e30], np.float32))
    assert list(got) == [0, 0x7E, 0x7E, 0x7E]  # 448 is the largest finite E4M3 (0x7E)


def test_e8m0_every_code():
    codes = np.arange(0, 255, dtype=np.uint8)  # 0xFF is NaN
    want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    got = _core.e8m0_decode(codes)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for e in range(-127, 128):
        assert _core.e8m0_encode_exp(e) == int(np.array([2.0 ** e], np.float32).astype(ml_dtypes.float8_e8m0fnu)
                                               .view(np.uint8)[0]), e
