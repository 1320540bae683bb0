"""Numerics monitor: on every N-th training step, per quantised GEMM of a model's fp4lab layers, the SQNR, amax,
flush-to-zero and saturation of each quantised operand and the SQNR of the GEMM's output against the unquantised
product, one JSON object per line (and TensorBoard scalars when tensorboard is importable).

    with ft.monitor(model, every=100, out="numerics.jsonl"):
        train(model)

The layers call the monitor with the operands they have just quantised (``fp4lab.torch.ops.observers``); an
unsampled step costs one modulo per GEMM and runs unobserved; a sampled step recomputes the dequantised operands and
an FP64 reference product where the operands are (on the GPU, with FP64 sums in torch's CUDA reduction order, so a
GPU record may differ from the host's in the last bits of its statistics)."""
from __future__ import annotations

import atexit
import decimal
import fcntl
import json
import math
import os
from typing import Any, Dict, Optional

import numpy as np
import torch
from torch import nn

from fp4lab import _core, _files
from fp4lab._files import DataError

from . import ops as _ops
from .attention import MultiheadAttention
from .moe import Experts, Router
from ._layer import in_backward as _in_backward
from .linear import Conv1D, Linear

__all__ = ["monitor", "Monitor", "operand_stats"]

_max_code_cache: Dict[str, np.ndarray] = {}
_held: set = set()  # (device, inode) of the files this process's open monitors write


def _saturating_codes(fmt: str) -> np.ndarray:
    """A 16-entry table: True for the codes at the grid's largest magnitude."""
    t = _max_code_cache.get(fmt)
    if t is None:
        mags = np.abs(np.asarray(_core.decode_table(fmt), dtype=np.float64))
        t = _max_code_cache[fmt] = np.zeros(16, dtype=bool)
        t[:len(mags)] = mags == mags.max()
    return t


def _sqnr_db(ref: np.ndarray, x: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ref − x)²) in FP64; +inf when x equals ref, nan for an all-zero ref."""
    ref = ref.astype(np.float64, copy=False)
    d = ref - x.astype(np.float64, copy=False)
    return _log10_db(float(np.sum(ref * ref)), float(np.sum(d * d)))


def _log10_db(sig: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf if sig > 0.0 else math.nan
    # log10 from the decimal module (exact to 40 digits, then one rounding), not libm's, whose last bit follows the
    # CPU: the same operands give the same record on any machine (docs/spec.md §6.1).
    return 10.0 * float(decimal.Context(prec=40).log10(decimal.Decimal(sig / noise))) if sig > 0.0 else -math.inf


def _host(q):
    return q.to_host() if isinstance(q, _ops.QTensorCUDA) else q


def operand_stats(x: torch.Tensor, q, cfg) -> Dict[str, float]:
    """The statistics of one quantised operand ``q`` (of ``x`` under ``cfg``): SQNR (dB) of the dequantised operand
    against the input as the quantiser saw it (after the RHT, which keeps the energy, where the recipe rotates),
    the input's amax, the fraction of nonzero inputs flushed to zero and the fraction of elements at the grid's
    largest magnitude."""
    q = _host(q)
    # A copy: numpy() on the operand itself would mark a parameter's storage as not resizable (FSDP2 resizes it).
    xf = x.detach().to("cpu", torch.float32, memory_format=torch.contiguous_format, copy=True).numpy()
    ref = np.asarray(_core.rotate(xf, cfg)).reshape(xf.shape)
    dq = np.asarray(q.dequantize())
    codes = np.asarray(q.codes)
    n = ref.size
    return {
        "sqnr_db": _sqnr_db(ref, dq),
        "amax": float(np.max(np.abs(xf))) if n else 0.0,
        "frac_zero": float(np.count_nonzero((dq == 0) & (ref != 0))) / n,
        "frac_sat": float(np.count_nonzero(_saturating_codes(q.format)[codes & 15])) / n,
    }


def _sqnr_sums_device(ref64: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Σref² and Σ(ref − x)² of CUDA tensors, in FP64 on the device, as a tensor (torch's reduction order, so the
    last bits may differ from the host's). ``ref64`` is an FP64 scratch tensor the caller gives up: the difference is
    formed in it in place, so each sum is one pass over memory (cuBLAS's dot) and no other FP64 copy is made."""
    r = ref64.view(-1)
    sig = torch.dot(r, r)
    r.sub_(x.reshape(-1))  # x promotes to FP64 in the same pass
    return torch.stack((sig, torch.dot(r, r)))


_sat_mask_cache: Dict[str, int] = {}


def _saturating_mask(fmt: str) -> int:
    """The codes at the grid's largest magnitude as a 16-bit mask (bit c for code c)."""
    m = _sat_mask_cache.get(fmt)
    if m is None:
        m = _sat_mask_cache[fmt] = int(sum(1 << int(c) for c in np.flatnonzero(_saturating_codes(fmt))))
    return m


def _operand_sums_device(x: torch.Tensor, q: "_ops.QTensorCUDA", cfg) -> torch.Tensor:
    """operand_stats' raw figures for an operand quantised on the GPU, computed there (rotation by the CUDA kernel,
    the golden model's bits; dequantised values by the CUDA dequantiser; the figures by one kernel pass in a fixed
    order): Σref², Σ(ref − dq)², amax, the count of flushed and of saturated elements. Nothing here waits for the
    device."""
    xf = x.detach().to(torch.float32).contiguous()
    ref = xf
    with torch.cuda.device(xf.device):
        stream = _ops.launch(xf)[1]
        if cfg.to_dict()["rht"]:
            ref = torch.empty_like(xf)
            _core.cuda_rotate(xf, ref, cfg, stream)
        dq = _ops.dequantize_as(q, torch.float32)
        out = torch.empty(5, dtype=torch.float64, device=xf.device)
        _core.cuda_operand_stats(xf, ref, dq, q.packed_codes.reshape(-1), _saturating_mask(q.format), out, stream)
    return out


def _operand_stats_of(v, n: int) -> Dict[str, float]:
    sig, noise, amax, zero, nsat = v
    return {"sqnr_db": _log10_db(sig, noise), "amax": amax, "frac_zero": zero / n, "frac_sat": nsat / n}


def _json_float(v: float) -> Any:
    # JSON has no inf/nan; strings keep the line valid and the value readable.
    return v if math.isfinite(v) else str(v)


class Monitor:
    """The handle ``monitor`` returns: ``close()`` (or leaving its ``with`` block) stops recording, writes what is
    pending and closes the files. ``records`` counts the lines written; on the GPU a sampled step's lines are written
    at the first GEMM of a later step, at ``flush()`` or at ``close()``."""

    def __init__(self, model: nn.Module, every: int, out: str, tensorboard: Optional[str] = None,
                 micro_batches: int = 1):
        for what, v in (("every", every), ("micro_batches", micro_batches)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"monitor(): {what} must be a positive int, not {v!r}")
        self.every, self.micro_batches = every, micro_batches
        _files.check_outputs([out])  # the command line's output rule: a file (not a folder or a device) one can write
        self.out = os.fspath(out)
        self.records = 0
        self._file = None
        # The GEMMs this monitor watches: the model's fp4lab Linears and attention in-projections, by name.
        self._names: Dict[int, str] = {}
        for name, m in model.named_modules():
            if isinstance(m, (Linear, Conv1D, Router)):
                self._names[id(m)] = m.name or name or m._label()
            if isinstance(m, MultiheadAttention):
                for p in m._projections:
                    self._names[id(p)] = p._label()
            if isinstance(m, Experts):  # each expert's two GEMMs, named <experts>.gate_up_proj.<e> and .down_proj.<e>
                for pair in m._gemms:
                    for g in pair:
                        self._names[id(g)] = g._label()
        self._pending: list = []  # (step, layer, pass, shapes, labels, FP64 sums on the GPU) not yet read back
        self._file = self._open(self.out)
        self._size = 0  # the bytes of the records written whole: what a failed write cuts the file back to
        self._tb = None
        try:
            # The event file writer itself, not SummaryWriter: a GEMM's scalars go out as one event (SummaryWriter
            # makes one per scalar, about 90 µs each: 0.09 s for the 960 scalars of a sampled step of a 96-GEMM model).
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard.writer import FileWriter
            self._tb, self._summary = FileWriter(str(tensorboard or self.out + ".tb")), Summary
        except ImportError:  # tensorboard is optional: the JSONL is the record
            pass
        except BaseException:
            self._stop()  # the JSONL closed and let go
            raise
        _ops.observers.append(self)
        atexit.register(self.close)  # a program that never closes it still gets its last sampled step's records

    @staticmethod
    def _open(path: str):
        """The file, held by this monitor alone (a lock, taken before it is emptied), unbuffered: each GEMM's records
        go out in one write, and a failed write is seen at once."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise DataError(f"{path}: cannot open for writing ({e.strerror or e})") from None
        try:
            st = os.fstat(fd)
            held = (st.st_dev, st.st_ino) in _held
            if not held:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's monitor
                except BlockingIOError:
                    held = True
                except OSError:
                    pass  # a file system without locks: this process's monitors are still told apart
            if held:
                raise DataError(f"{path}: another monitor is writing this file (close it first, or choose another "
                                "file)")
            os.ftruncate(fd, 0)
            _held.add((st.st_dev, st.st_ino))
            f = os.fdopen(fd, "wb", buffering=0)
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError):
                raise DataError(f"{path}: cannot open for writing ({e.strerror or e})") from None
            raise
        f.key = (st.st_dev, st.st_ino)
        return f

    def _emit(self, lines: list) -> None:
        """Appends whole records, one per line; a failed write cuts the file back to the records before it, stops the
        monitor and raises a DataError naming the file (once: close() after it does not raise)."""
        data = "".join(lines).encode("utf-8")
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += self._file.write(view[done:])
        except OSError as e:
            try:
                os.ftruncate(self._file.fileno(), self._size)
            except OSError:
                pass
            self._stop()
            raise DataError(f"{self.out}: write failed ({e.strerror or e}); the monitor stopped with the "
                            f"{self.records} records written before it") from None
        self._size += len(data)
        self.records += len(lines)

    def _stop(self) -> None:
        """Stops watching and closes the files (the JSONL's lock goes with it)."""
        atexit.unregister(self.close)
        self._pending = []
        if self in _ops.observers:
            _ops.observers.remove(self)
        if self._file is not None and not self._file.closed:
            _held.discard(self._file.key)
            try:
                self._file.close()
            except OSError:
                pass
        if self._tb is not None:
            tb, self._tb = self._tb, None
            tb.close()

    def wants(self, layer, step: int) -> bool:
        """Whether the GEMMs of ``layer`` at ``step`` are recorded (the others run unobserved). The first GEMM of a
        later step writes the records the GPU computed at a sampled one."""
        if self._pending and self._pending[-1][0] != step:
            self.flush()
        return self._sampled(step) and id(getattr(layer, "gemm", layer)) in self._names  # gemm: sr_shard's expert

    def _sampled(self, sr_step: int) -> bool:
        """The first micro-batch of every ``every``-th optimizer step (the SR step counts micro-batches)."""
        return sr_step % self.micro_batches == 0 and (sr_step // self.micro_batches) % self.every == 0

    def __call__(self, layer, step: int, pass_: str, a, b, qa, qb, y, cfg) -> None:
        if not self.wants(layer, step):
            return
        name = self._names[id(getattr(layer, "gemm", layer))]
        if not getattr(layer, "owner", layer).training:
            return  # an evaluation forward: it repeats the step it is at, and is no training step
        if pass_ == "fwd_y" and _in_backward():
            return  # an activation-checkpoint recomputation repeats the forward already recorded
        # On the GPU the statistics are computed there and read back once per sampled step (the first GEMM of a
        # later step, or close()), so the device never waits on the host in between.
        if isinstance(qa, _ops.QTensorCUDA):
            gemm = _sqnr_sums_device(a.detach().to(torch.float64) @ b.detach().to(torch.float64).t(), y.detach())
            sums = torch.cat((gemm, _operand_sums_device(a, qa, cfg(pass_, "a")),
                              _operand_sums_device(b, qb, cfg(pass_, "b"))))
            self._pending.append((step, name, pass_, a.shape, b.shape, cfg(pass_, "a").label,
                                  cfg(pass_, "b").label, sums))
            return
        ref = a.detach().to("cpu", torch.float64) @ b.detach().to("cpu", torch.float64).t()
        gemm_sqnr = _sqnr_db(ref.numpy(), y.detach().to("cpu", torch.float64).numpy())
        stats = {op: operand_stats(x, q, cfg(pass_, op)) for op, x, q in (("a", a, qa), ("b", b, qb))}
        lines, values = self._records(step, name, pass_, {"a": (a.shape, cfg(pass_, "a").label),
                                                          "b": (b.shape, cfg(pass_, "b").label)}, stats, gemm_sqnr)
        self._emit(lines)
        self._scalars(step, values)

    def _records(self, step: int, name: str, pass_: str, ops: Dict[str, tuple], stats: Dict[str, Dict[str, float]],
                 gemm_sqnr: float) -> tuple:
        """The JSONL lines of one GEMM, and its TensorBoard scalars."""
        lines: list = []
        values: list = []  # TensorBoard scalars of this GEMM, written as one event
        for op, (shape, label) in ops.items():
            rec = {"step": int(step) // self.micro_batches, "sr_step": int(step), "layer": name, "pass": pass_,
                   "operand": op, "shape": list(shape), "label": label}
            st = stats[op]
            st["gemm_sqnr_db"] = gemm_sqnr
            rec.update({k: _json_float(v) for k, v in st.items()})
            lines.append(json.dumps(rec) + "\n")
            values += [self._summary.Value(tag=f"{name}/{pass_}/{op}/{k}", simple_value=v)
                       for k, v in st.items() if math.isfinite(v)] if self._tb is not None else []
        return lines, values

    def _scalars(self, step: int, values: list) -> None:
        if values and self._tb is not None:
            self._tb.add_summary(self._summary(value=values), int(step) // self.micro_batches)

    def flush(self) -> None:
        """Writes the records computed on the GPU and not yet read back (one read-back for all of them)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # One read-back per device (a model may be split across GPUs).
        by_device: Dict[torch.device, list] = {}
        for i, p in enumerate(pending):
            by_device.setdefault(p[-1].device, []).append(i)
        values: list = [None] * len(pending)
        for idx in by_device.values():
            for i, v in zip(idx, torch.stack([pending[i][-1] for i in idx]).tolist()):
                values[i] = v
        lines, events = [], []
        for (step, name, pass_, sa, sb, la, lb, _), v in zip(pending, values):
            stats = {"a": _operand_stats_of(v[2:7], math.prod(sa)), "b": _operand_stats_of(v[7:12], math.prod(sb))}
            more, scalars = self._records(step, name, pass_, {"a": (sa, la), "b": (sb, lb)}, stats,
                                          _log10_db(v[0], v[1]))
            lines += more
            events.append((step, scalars))
        self._emit(lines)
        for step, scalars in events:
            self._scalars(step, scalars)

    def close(self) -> None:
        atexit.unregister(self.close)
        try:
            if not self._file.closed:
                self.flush()
        finally:  # a failed read-back (a CUDA fault) must not leave the monitor watching or the file open
            self._stop()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def monitor(model: nn.Module, every: int = 100, out: str = "fp4lab_monitor.jsonl",
            tensorboard: Optional[str] = None, micro_batches: int = 1) -> Monitor:
    """Records the numerics of ``model``'s quantised GEMMs on every ``every``-th optimizer step (steps 0, every,
    2·every, …) to the JSONL file ``out``, one object per (step, layer, pass, operand). The layers count training
    forwards (their SR step), so with gradient accumulation give ``micro_batches``, the forwards per optimizer
    step: optimizer step s is SR steps s·micro_batches … (s+1)·micro_batches − 1, and its first micro-batch is
    recorded. Each object holds ``step`` (the optimizer step), ``sr_step`` (the layers' SR step of the recorded
    micro-batch), ``layer`` (qualified name), ``pass`` (fwd_y, bwd_dx, bwd_dw), ``operand`` (a, b), ``shape``,
    ``label`` (the quantiser's settings), ``sqnr_db``, ``amax``, ``frac_zero``, ``frac_sat`` and
    ``gemm_sqnr_db`` (the pass's output against the FP64 product of the unquantised operands; the same for a and
    b). Forwards in eval mode and activation-checkpoint recomputations are not recorded. Also to TensorBoard
    (``tensorboard`` or ``out + ".tb"``) when it is importable. Layers under the bf16 recipe quantise nothing and
    record nothing. ``out`` is held to the command line's output rules (a DataError naming it, before anything is
    recorded) and written by one monitor at a time; a failed write (a full disk) raises one DataError naming it and
    stops the monitor, the file holding the ``records`` written whole before it. Returns a ``Monitor``: call
    ``close()`` or use it as a context manager."""
    return Monitor(model, every, out, tensorboard, micro_batches)
