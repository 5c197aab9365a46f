"""
kernels.py (fused Triton GGD-BAM / TAPA attention) against the PyTorch references
bam_attention_ref and tapa_attention_ref: outputs and every gradient.

The kernels run on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1,
set below before triton is imported), with 16×16 tiles, so T = 37 covers partial
tiles; one test also runs the GPU tile sizes under the interpreter. On a CUDA machine,
`TRITON_INTERPRET=0 python3 -m pytest tests/test_kernels.py` runs the same checks on the
compiled kernels and CUDA tensors instead.

Tolerances: max|kernel − ref| <= rtol · max|ref| per tensor, with rtol = 1e-4 for
fp32 and 3e-2 for fp16/bf16 inputs (compared against the fp32 reference run on the
same rounded inputs).
"""
import os
import sys

ON_GPU = os.environ.get("TRITON_INTERPRET") == "0"  # opt-in: compiled kernels on CUDA tensors
# the interpreter only works if it is on when triton is first imported (triton's own helpers are @jit too)
TRITON_IMPORTED_TOO_EARLY = not ON_GPU and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton/kernels are imported: kernels then run on CPU tensors

import functools
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

CI = os.environ.get("CI") == "true"
try:
    import triton  # noqa: F401
except ImportError:
    if CI:
        raise ImportError("triton is required under CI=true (pip install triton)")
    pytest.skip("triton is not installed (pip install triton); the fused kernels cannot be tested",
                allow_module_level=True)
for problem, reason in [(TRITON_IMPORTED_TOO_EARLY, "triton was imported (by conftest.py or another test module) before "
                         "this module set TRITON_INTERPRET=1, so the kernels cannot run on CPU: set TRITON_INTERPRET=1 "
                         "in tests/conftest.py when there is no GPU, or run this file alone"),
                        (ON_GPU and not torch.cuda.is_available(), "TRITON_INTERPRET=0 needs a CUDA GPU")]:
    if problem:
        if CI:
            raise RuntimeError(reason)
        pytest.skip(reason, allow_module_level=True)

import triton.language as tl

import kernels
from attention import document_starts, ssmax_factor
from attention_bam import bam_attention_ref
from attention_tapa import tapa_attention_ref

DEVICE = "cuda" if ON_GPU else "cpu"
ROOT = Path(__file__).resolve().parent.parent
RTOL = {torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 3e-2}


def assert_close(actual, expected, rtol, what):
    err = (actual.float() - expected.float()).abs().max().item()
    scale = expected.float().abs().max().item()
    assert err <= rtol * max(scale, 1e-6), f"{what}: max abs err {err:.3g} > {rtol:g} · max|ref| {scale:.3g}"


def make_qkv(B, H, Tq, Tk, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(DEVICE, dtype).requires_grad_() for T in (Tq, Tk, Tk))
    return q, k, v


def bam_params(H, shape, ssmax, seed=1):
    """Per-head prior parameters with non-trivial values: c in [0.1, 0.5], β near `shape`, s near 1."""
    g = torch.Generator().manual_seed(seed)
    log_scale = torch.log(0.1 + 0.4 * torch.rand(H, generator=g)).to(DEVICE).requires_grad_()
    shape = (shape + 0.05 * torch.randn(H, generator=g)).to(DEVICE).requires_grad_()
    ssmax_scale = (0.7 + 0.6 * torch.rand(H, generator=g)).to(DEVICE).requires_grad_() if ssmax else None
    return log_scale, shape, ssmax_scale


def check_against_ref(fn, ref_fn, inputs, rtol):
    """Forward output and the gradients of every tensor in `inputs` that requires grad."""
    out = fn(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    ref_inputs = [x.detach().float().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) and x.dim() == 4
                  else x for x in inputs]
    ref = ref_fn(*ref_inputs)
    assert out.dtype == inputs[0].dtype and out.shape == ref.shape
    assert_close(out, ref, rtol, "output")
    wrt = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(out, [inputs[i] for i in wrt], grad_out.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, [ref_inputs[i] for i in wrt], grad_out)
    for i, g, rg in zip(wrt, grads, ref_grads):
        assert g.shape == rg.shape
        assert_close(g, rg, rtol, f"grad of input {i}")


# ----------------------------------------------------------------------------- GGD-BAM

@triton.jit
def _ssmax_factor_probe(pos_ptr, out_ptr, s, BLOCK: tl.constexpr):
    """Writes kernels._ssmax_factor of BLOCK query positions: the kernels' SSMax factor on its own."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, kernels._ssmax_factor(tl.load(pos_ptr + offs), s, True, BLOCK))


def test_kernel_ssmax_factor_equals_attention_ssmax_factor():
    """One SSMax factor: the kernels' _ssmax_factor equals attention.ssmax_factor, which every torch path uses."""
    pos = torch.tensor([0, 1, 2, 7, 100, 319, 4095, 65535] * 2, dtype=torch.int32, device=DEVICE)
    out = torch.empty(16, device=DEVICE)
    for s in (0.17, 1.0, 2.5):
        _ssmax_factor_probe[(1,)](pos, out, s, BLOCK=16)
        expected = ssmax_factor(torch.tensor([s], device=DEVICE), pos.long())[0, :, 0]
        assert torch.allclose(out, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("D", [16, 64])
@pytest.mark.parametrize("ssmax", [False, True])
@pytest.mark.parametrize("shape", [-0.5, 0.5, 1.0, 2.0])
def test_bam_matches_reference(shape, ssmax, D):
    q, k, v = make_qkv(2, 2, 37, 37, D)  # 37: not a multiple of the 16-wide tiles
    log_scale, shape_t, ssmax_scale = bam_params(2, shape, ssmax)

    def fn(q, k, v, ls, sh, ss):
        return kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss)

    def ref(q, k, v, ls, sh, ss):
        return bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss, chunk_size=16)
    check_against_ref(fn, ref, [q, k, v, log_scale, shape_t, ssmax_scale], RTOL[torch.float32])


@pytest.mark.parametrize("Tq,Tk,q_offset", [(5, 29, 24), (5, 29, 10), (1, 29, 28), (20, 40, 0)])
def test_bam_q_offset_and_loc(Tq, Tk, q_offset):
    q, k, v = make_qkv(1, 2, Tq, Tk, 32)
    log_scale, shape, ssmax_scale = bam_params(2, 0.7, ssmax=True)
    loc = torch.tensor([0.3, -0.2], device=DEVICE)  # μ ≈ ±0.6: off-integer centre; loc itself gets no gradient

    def fn(q, k, v, ls, sh, ss):
        return kernels.bam_attention(q, k, v, ls, sh, loc=loc, ssmax_scale=ss, q_offset=q_offset)

    def ref(q, k, v, ls, sh, ss):
        return bam_attention_ref(q, k, v, ls, sh, loc=loc, ssmax_scale=ss, q_offset=q_offset, chunk_size=8)
    check_against_ref(fn, ref, [q, k, v, log_scale, shape, ssmax_scale], RTOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bam_low_precision(dtype):
    # bf16 runs in fp32 under the interpreter (its tl.dot garbles bf16); fp16 exercises the kernels' casts
    q, k, v = make_qkv(1, 2, 37, 37, 64, dtype=dtype)
    log_scale, shape, ssmax_scale = bam_params(2, 0.5, ssmax=True)

    def fn(q, k, v, ls, sh, ss):
        return kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss)

    def ref(q, k, v, ls, sh, ss):
        return bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss)
    check_against_ref(fn, ref, [q, k, v, log_scale, shape, ssmax_scale], RTOL[dtype])


def test_bam_non_contiguous_inputs():
    # model.py-style (B, T, H, D) tensors transposed to (B, H, T, D)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 21, 2, 16, generator=g).to(DEVICE).transpose(1, 2).requires_grad_() for _ in range(3))
    log_scale, shape, _ = bam_params(2, 1.0, ssmax=False)
    check_against_ref(lambda *a: kernels.bam_attention(*a), lambda *a: bam_attention_ref(*a),
                      [q, k, v, log_scale, shape], RTOL[torch.float32])


def check_against_float64_ref(q, k, v, log_scale, shape, ssmax_scale, rtol):
    """Kernel (fp32) against bam_attention_ref run in float64: output and every gradient, each within
    rtol of max(max|float64 value|, max|dv|) (a true gradient can be 0; dv never is)."""
    inputs = [x for x in (q, k, v, log_scale, shape, ssmax_scale) if x is not None]
    out = kernels.bam_attention(q, k, v, log_scale, shape, ssmax_scale=ssmax_scale)
    ref_inputs = [x.detach().double().requires_grad_() for x in inputs]
    ref = bam_attention_ref(*ref_inputs[:5], ssmax_scale=ref_inputs[5] if ssmax_scale is not None else None)
    assert torch.isfinite(out).all()
    assert_close(out, ref, rtol, "output")
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_out.double())
    floor = ref_grads[2].abs().max().item()
    for name, g, rg in zip(["q", "k", "v", "log_scale", "shape", "ssmax_scale"], grads, ref_grads):
        err = (g.double() - rg).abs().max().item()
        assert err <= rtol * max(rg.abs().max().item(), floor), f"grad of {name}: max abs err {err:.3g}"


def check_against_ref64(fn, ref_fn, inputs, rtol):
    """fn (fp32 inputs) against ref_fn on float64 copies: the output and the gradient of every input that
    requires grad, each within rtol of max(max|float64 value|, max|dv|) (a true gradient can be 0; dv never is)."""
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    out = fn(*inputs)
    ref_inputs = [x.detach().double().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                  for x in inputs]
    ref = ref_fn(*ref_inputs)
    assert out.dtype == inputs[0].dtype and torch.isfinite(out).all()
    assert_close(out, ref, rtol, "output")
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    grads = torch.autograd.grad(out, wrt, grad_out)
    ref_grads = torch.autograd.grad(ref, [r for r in ref_inputs if isinstance(r, torch.Tensor) and r.requires_grad],
                                    grad_out.double())
    floor = ref_grads[2].abs().max().item()
    for i, (g, rg) in enumerate(zip(grads, ref_grads)):
        err = (g.double() - rg).abs().max().item()
        assert g.shape == rg.shape and err <= rtol * max(rg.abs().max().item(), floor), \
            f"grad of input {i}: max abs err {err:.3g}"


@pytest.mark.parametrize("D", [24, 48, 80, 96])
def test_bam_head_dims_not_power_of_2(D):
    """Any head dim up to 128: the kernel pads the head dim to a power of 2 (a column mask, no padded copy);
    48 and 96 are the FineWeb presets' heads (768/16, 1536/16). Float64 reference, every gradient."""
    q, k, v = make_qkv(1, 2, 37, 37, D)
    log_scale, shape, ssmax_scale = bam_params(2, 0.7, ssmax=True)
    check_against_ref64(lambda q, k, v, ls, sh, ss: kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss),
                        lambda q, k, v, ls, sh, ss: bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss),
                        [q, k, v, log_scale, shape, ssmax_scale], 1e-4)


@pytest.mark.parametrize("q_gain,log_scale,shape,ssmax", [(8.0, [-1.0, 0.0], [0.5, 0.5], True),
                                                         (1.0, [20.0, 20.0], [1.0, 1.0], False)])
def test_bam_per_head_gradients_sharp_attention(q_gain, log_scale, shape, ssmax):
    """Sharp attention (large q·k, or a huge bias c = e^20 that leaves each row one key) makes the logits large,
    and the recomputed P then sums to 1 only up to their rounding. The per-head sums take Δ_i = Σ P·dP / Σ P,
    so that Σ_j dS = 0 still holds (with Δ_i = Σ P·dP, dssmax was off by 2.7e-4 of its size, and dshape of a
    one-key-per-row head came out −0.1 where the true value is 0)."""
    q, k, v = make_qkv(1, 2, 80, 80, 32)
    q = (q.detach() * q_gain).requires_grad_()
    params = [torch.tensor(x, device=DEVICE, requires_grad=True) for x in (log_scale, shape)]
    s = torch.tensor([1.0, 1.2], device=DEVICE, requires_grad=True) if ssmax else None
    check_against_float64_ref(q, k, v, *params, s, 1e-4)


@pytest.mark.parametrize("ssmax", [False, True])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # the interpreter's numpy: the point
def test_bam_very_negative_shape_stays_finite(ssmax):
    """shape β = −8: the diagonal bias −c·ε^β overflows fp32 (ε^β = 1e40). Query 0 sees only that key, so its
    output is v[0] (float64 reference); the kernel floors the bias at −1e30 instead of giving NaN."""
    q, k, v = make_qkv(1, 2, 37, 37, 16)
    log_scale = torch.zeros(2, device=DEVICE, requires_grad=True)
    shape = torch.tensor([-8.0, 0.5], device=DEVICE, requires_grad=True)
    s = torch.tensor([1.0, 0.8], device=DEVICE, requires_grad=True) if ssmax else None
    check_against_float64_ref(q, k, v, log_scale, shape, s, 1e-4)


def test_no_double_backward():
    """The backward kernels are not differentiable themselves: create_graph=True must raise, not return a dq
    without a graph (which would silently drop a gradient penalty)."""
    q, k, v = make_qkv(1, 2, 20, 20, 16)
    for out in [_bam(q, k, v), kernels.tapa_attention(q, k, v)]:
        gq, = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable"):
            (out.sum() + gq.pow(2).sum()).backward()  # a loss with a gradient penalty


# ----------------------------------------------------------------------------- TAPA

@pytest.mark.parametrize("D", [16, 64])
@pytest.mark.parametrize("theta,alpha", [(0.5, 0.1), (0.3, 0.5)])
def test_tapa_matches_reference(theta, alpha, D):
    q, k, v = make_qkv(2, 2, 37, 37, D)
    check_against_ref(lambda q, k, v: kernels.tapa_attention(q, k, v, theta=theta, alpha=alpha),
                      lambda q, k, v: tapa_attention_ref(q, k, v, theta=theta, alpha=alpha, chunk_size=16),
                      [q, k, v], RTOL[torch.float32])


@pytest.mark.parametrize("D,theta,phase", [(24, 0.5, "quadratic"), (48, 0.5, "quadratic"), (48, 0.3, "linear"),
                                           (80, 0.5, "linear"), (96, 0.5, "quadratic")])
def test_tapa_head_dims_not_power_of_2(D, theta, phase):
    """Head dims that are no power of 2: the amplitude and phase parts are loaded as two tiles, each padded to
    a power of 2 (D = 48, theta = 0.3: 14 amplitude dims in a 16-wide tile, 34 phase dims in a 64-wide one).
    With SSMax; float64 reference, every gradient (ssmax_scale's included)."""
    q, k, v = make_qkv(1, 2, 37, 37, D)
    s = torch.tensor([0.8, 1.3], device=DEVICE, requires_grad=True)
    check_against_ref64(
        lambda q, k, v, s: kernels.tapa_attention(q, k, v, theta=theta, ssmax_scale=s, phase=phase),
        lambda q, k, v, s: tapa_attention_ref(q, k, v, theta=theta, ssmax_scale=s, phase=phase, chunk_size=16),
        [q, k, v, s], 1e-4)


@pytest.mark.parametrize("phase,ssmax,Tq,Tk,q_offset", [("quadratic", True, 37, 37, 0), ("linear", False, 37, 37, 0),
                                                        ("linear", True, 37, 37, 0), ("linear", True, 5, 29, 24)])
def test_tapa_ssmax_and_linear_phase(phase, ssmax, Tq, Tk, q_offset):
    """TAPA with SSMax (the score times s_h·log(i + 1)) and the linear-phase ablation, forward and every
    gradient, ssmax_scale's included (returned through autograd), against tapa_attention_ref."""
    q, k, v = make_qkv(2, 2, Tq, Tk, 32)
    s = torch.tensor([0.8, 1.3], device=DEVICE, requires_grad=True) if ssmax else None

    def fn(q, k, v, s):
        return kernels.tapa_attention(q, k, v, q_offset=q_offset, ssmax_scale=s, phase=phase)

    def ref(q, k, v, s):
        return tapa_attention_ref(q, k, v, phase=phase, q_offset=q_offset, ssmax_scale=s, chunk_size=16)
    check_against_ref(fn, ref, [q, k, v, s], RTOL[torch.float32])


@pytest.mark.parametrize("Tq,Tk,q_offset", [(5, 29, 24), (5, 29, 10), (1, 29, 28)])
def test_tapa_q_offset(Tq, Tk, q_offset):
    q, k, v = make_qkv(1, 2, Tq, Tk, 32)
    check_against_ref(lambda q, k, v: kernels.tapa_attention(q, k, v, q_offset=q_offset),
                      lambda q, k, v: tapa_attention_ref(q, k, v, q_offset=q_offset, chunk_size=8),
                      [q, k, v], RTOL[torch.float32])


def test_tapa_low_precision():
    q, k, v = make_qkv(1, 2, 37, 37, 64, dtype=torch.float16)
    check_against_ref(lambda q, k, v: kernels.tapa_attention(q, k, v),
                      lambda q, k, v: tapa_attention_ref(q, k, v), [q, k, v], RTOL[torch.float16])


def test_tapa_honours_theta_and_alpha():
    q, k, v = make_qkv(1, 2, 37, 37, 32)
    with torch.no_grad():
        base = kernels.tapa_attention(q, k, v)
        for theta, alpha in [(0.5, 0.5), (0.25, 0.1), (0.5, 0.0)]:
            out = kernels.tapa_attention(q, k, v, theta=theta, alpha=alpha)
            assert (out - base).abs().max() > 1e-3, f"theta={theta}, alpha={alpha} gave the default output"
            assert_close(out, tapa_attention_ref(q, k, v, theta=theta, alpha=alpha), 1e-4, f"theta={theta}")


# ----------------------------------------------------------------------------- packed documents (doc_start)

# Two rows of T = 40 with 16-wide tiles: a one-token document and odd lengths; row 1's documents start at 15 and
# 31, one key before a tile boundary (the first key tile a query tile visits is the one holding its first row's
# doc_start); row 2's start on a boundary (16) and end one row past one (33: the dk/dv loop of key tile 16 must
# still visit query tile 32); query tile 32 of both rows skips key tile 0.
DOC_LENGTHS = [[5, 1, 9, 16, 9], [16, 17, 7]]


def packed(lengths):
    """doc_start (B, T) of rows of documents with these lengths, through attention.document_starts."""
    doc_ids = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in lengths])
    return document_starts(doc_ids).to(DEVICE)


def each_document_alone(ref_fn, lengths):
    """The packed (B, H, T, D) output built from ref_fn run on every document's slice alone, from position 0.
    Its gradients are those of the documents alone; for the per-head (H,) parameters autograd sums them over
    the documents, the packed kernel's per-head gradient must equal that sum."""
    def packed_ref(q, k, v, *params):
        rows = []
        for b, row in enumerate(lengths):
            starts = [sum(row[:d]) for d in range(len(row))]
            rows.append(torch.cat([ref_fn(q[b:b + 1, :, a:a + n], k[b:b + 1, :, a:a + n], v[b:b + 1, :, a:a + n],
                                          *params) for a, n in zip(starts, row)], dim=2))
        return torch.cat(rows, dim=0)
    return packed_ref


@pytest.mark.parametrize("shape,ssmax", [(0.5, False), (0.5, True), (1.5, True), (-0.5, True)])
def test_bam_documents_match_each_document_alone(shape, ssmax):
    """bam_attention with doc_start on packed documents equals bam_attention_ref on each document alone: the
    output and every gradient (log_scale's, shape's and ssmax_scale's summed over the documents). SSMax's n
    counts the keys of the query's own document; the bias depends on i − j only."""
    T = sum(DOC_LENGTHS[0])
    q, k, v = make_qkv(2, 2, T, T, 16)
    log_scale, shape_t, ssmax_scale = bam_params(2, shape, ssmax)
    doc_start = packed(DOC_LENGTHS)

    def fn(q, k, v, ls, sh, ss):
        return kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss, doc_start=doc_start)

    def alone(q, k, v, ls, sh, ss):
        return bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss, chunk_size=16)
    check_against_ref(fn, each_document_alone(alone, DOC_LENGTHS), [q, k, v, log_scale, shape_t, ssmax_scale],
                      RTOL[torch.float32])


@pytest.mark.parametrize("phase,ssmax", [("quadratic", False), ("quadratic", True), ("linear", False),
                                         ("linear", True)])
def test_tapa_documents_match_each_document_alone(phase, ssmax):
    """tapa_attention with doc_start equals tapa_attention_ref on each document alone (|i − j| is unchanged,
    n_i counts the query's document): the output and every gradient, ssmax_scale's summed over the documents."""
    T = sum(DOC_LENGTHS[0])
    q, k, v = make_qkv(2, 2, T, T, 16)
    s = torch.tensor([0.8, 1.3], device=DEVICE, requires_grad=True) if ssmax else None
    doc_start = packed(DOC_LENGTHS)

    def fn(q, k, v, s):
        return kernels.tapa_attention(q, k, v, ssmax_scale=s, phase=phase, doc_start=doc_start)

    def alone(q, k, v, s):
        return tapa_attention_ref(q, k, v, phase=phase, ssmax_scale=s, chunk_size=16)
    check_against_ref(fn, each_document_alone(alone, DOC_LENGTHS), [q, k, v, s], RTOL[torch.float32])


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")  # the interpreter's numpy: the point
def test_documents_skip_key_tiles(monkeypatch):
    """Key tiles wholly before a query tile's documents are not visited, forward and backward: NaN in keys and
    values of an earlier document, or in the output gradient of a later document, stays out of the rows and
    keys that never meet (a visited tile would spread the NaN: 0·NaN = NaN in the dots). 16×16 tiles on a GPU
    too (the interpreter's): which tiles are skipped depends on the tile sizes."""
    if ON_GPU:
        fwd, bwd = kernels._launch_kwargs(torch.empty(1, 1, 1, 16, device=DEVICE))
        tiles = (dict(fwd, BLOCK_M=16, BLOCK_N=16), dict(bwd, BLOCK_M1=16, BLOCK_N1=16, BLOCK_M2=16, BLOCK_N2=16))
        monkeypatch.setattr(kernels, "_launch_kwargs", lambda q: tiles)
    T = sum(DOC_LENGTHS[1])  # row 2 alone: documents [0, 16), [16, 33), [33, 40)
    q, k, v = (x.detach() for x in make_qkv(1, 2, T, T, 16))
    k[:, :, :16], v[:, :, :16] = float("nan"), float("nan")  # the first document, key tile 0
    doc_start = packed(DOC_LENGTHS[1:])
    out = _bam(q, k, v, doc_start=doc_start)
    assert torch.isfinite(out[:, :, 16:]).all() and torch.isnan(out[:, :, :16]).all()
    q, k, v = make_qkv(1, 2, T, T, 16)
    grad_out = torch.randn(1, 2, T, 16, device=DEVICE)
    grad_out[:, :, 16:] = float("nan")  # every query tile but the first
    for out in (_bam(q, k, v, doc_start=doc_start), kernels.tapa_attention(q, k, v, doc_start=doc_start)):
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
        assert torch.isfinite(dk[:, :, :16]).all() and torch.isfinite(dv[:, :, :16]).all()
        assert torch.isfinite(dq[:, :, :16]).all()


def test_documents_gpu_tiles(monkeypatch):
    """doc_start with the GPU's large, unequal tiles (forward 128×64, backward 32×128 and 128×32), D = 48:
    documents that start inside, on and across tile boundaries, and key tiles skipped. bf16 inputs on a GPU,
    fp32 inputs with the bf16 tiles under the interpreter."""
    lengths = [[40, 1, 23, 77, 9], [64, 86]]
    T = sum(lengths[0])
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    if not ON_GPU:
        use_gpu_tiles(monkeypatch, 48, torch.bfloat16)
    q, k, v = make_qkv(2, 1, T, T, 48, dtype=dtype)
    log_scale, shape, s = bam_params(1, 0.5, ssmax=True)
    doc_start = packed(lengths)
    check_against_ref(lambda q, k, v, ls, sh, s: kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=s,
                                                                       doc_start=doc_start),
                      each_document_alone(lambda q, k, v, ls, sh, s: bam_attention_ref(q, k, v, ls, sh,
                                                                                       ssmax_scale=s), lengths),
                      [q, k, v, log_scale, shape, s], RTOL[dtype])
    check_against_ref(lambda q, k, v, s: kernels.tapa_attention(q, k, v, ssmax_scale=s, doc_start=doc_start),
                      each_document_alone(lambda q, k, v, s: tapa_attention_ref(q, k, v, ssmax_scale=s), lengths),
                      [q, k, v, s], max(RTOL[dtype], 2e-4))  # cos(w·φ) amplifies the rounding of φ


# ----------------------------------------------------------------------------- GPU tiles, errors, bench

def use_gpu_tiles(monkeypatch, D, gpu_dtype):
    """Under the interpreter, launch with the GPU's tiles for head dim D and inputs of gpu_dtype."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    gpu_kwargs = kernels._launch_kwargs(torch.empty(1, 1, 1, D, dtype=gpu_dtype))
    monkeypatch.setattr(kernels, "INTERPRET", True)
    monkeypatch.setattr(kernels, "_launch_kwargs", lambda q: gpu_kwargs)


def test_bam_per_head_gradients_fp16_long(monkeypatch):
    """The per-head gradients (log_scale, shape, ssmax_scale) sum dS over all i, j. Taking the softmax
    backward's Δ_i = rowsum(dO∘O) from the fp16 output O would add its rounding up over the rows: 1.6e-2 of
    max|ref| for dssmax at T = 1000 (PyTorch's own fp16 path: 8e-3). The kernel takes Δ_i = Σ_j P·dP in those
    sums (exact in exact arithmetic), which keeps every gradient within 2e-3 (4 fp16 roundings)."""
    if not ON_GPU:
        use_gpu_tiles(monkeypatch, 128, torch.float16)
    q, k, v = make_qkv(1, 2, 1000, 1000, 128, dtype=torch.float16)
    log_scale, shape, ssmax_scale = bam_params(2, 0.5, ssmax=True)
    check_against_ref(lambda q, k, v, ls, sh, ss: kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss),
                      lambda q, k, v, ls, sh, ss: bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss),
                      [q, k, v, log_scale, shape, ssmax_scale], 2e-3)


@pytest.mark.parametrize("D,gpu_dtype", [(64, torch.bfloat16), (128, torch.bfloat16), (64, torch.float32)])
def test_gpu_tile_sizes(D, gpu_dtype, monkeypatch):
    """The GPU tile table (large, unequal tiles) over several tiles, with tails and a q_offset: on a GPU with
    inputs of gpu_dtype (plus T = 1000), on CPU under the interpreter with fp32 inputs and the GPU's tiles."""
    dtype = gpu_dtype if ON_GPU else torch.float32
    if not ON_GPU:
        use_gpu_tiles(monkeypatch, D, gpu_dtype)
    for Tq, Tk, q_offset in [(150, 150, 0), (70, 200, 100)] + ([(1000, 1000, 0)] if ON_GPU else []):
        q, k, v = make_qkv(1, 2, Tq, Tk, D, dtype=dtype)
        log_scale, shape, ssmax_scale = bam_params(2, 0.5, ssmax=True)
        check_against_ref(
            lambda q, k, v, ls, sh, ss: kernels.bam_attention(q, k, v, ls, sh, ssmax_scale=ss, q_offset=q_offset),
            lambda q, k, v, ls, sh, ss: bam_attention_ref(q, k, v, ls, sh, ssmax_scale=ss, q_offset=q_offset),
            [q, k, v, log_scale, shape, ssmax_scale], RTOL[dtype])
        check_against_ref(lambda q, k, v: kernels.tapa_attention(q, k, v, q_offset=q_offset),
                          lambda q, k, v: tapa_attention_ref(q, k, v, q_offset=q_offset),
                          [q, k, v], max(RTOL[dtype], 2e-4))  # cos(w·φ) amplifies rounding of φ by w ≈ 2π·T^0.1


def _bam(q, k, v, H=2, **kw):
    return kernels.bam_attention(q, k, v, torch.zeros(H, device=q.device), torch.ones(H, device=q.device), **kw)


@pytest.mark.parametrize("make_call,error,match", [
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 160)), ValueError, "head dim 160"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 136)), ValueError, "head dim 136"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 8)), ValueError, "head dim 8"),
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 16)[:2], torch.randn(1, 2, 9, 16, device=DEVICE)), ValueError, "shape mismatch"),
    (lambda: _bam(make_qkv(1, 2, 8, 8, 16)[0], *make_qkv(1, 2, 8, 8, 32)[1:]), ValueError, "shape mismatch"),
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 16), q_offset=1), ValueError, "Tk >= q_offset"),
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 16), H=3), ValueError, r"shape \(H,\)"),
    (lambda: kernels.bam_attention(*make_qkv(1, 2, 8, 8, 16), torch.zeros(2, device="meta"), torch.ones(2, device=DEVICE)),
     ValueError, "one device"),
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 16), loc=torch.zeros(2, device=DEVICE, requires_grad=True)), ValueError, "loc"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), theta=0.99), ValueError, "theta"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), alpha=-1.0), ValueError, "alpha"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), phase="cubic"), ValueError, "phase"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), ssmax_scale=torch.ones(3, device=DEVICE)), ValueError,
     r"ssmax_scale must have shape \(H,\)"),
    (lambda: _bam(*make_qkv(1, 2, 4, 8, 16), q_offset=4, doc_start=packed([[2, 2]])), ValueError, "q_offset = 0"),
    (lambda: _bam(make_qkv(1, 2, 4, 8, 16)[0], *make_qkv(1, 2, 8, 8, 16)[1:], doc_start=packed([[2, 2]])),
     ValueError, "Tq = Tk"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), doc_start=packed([[3, 4]])), ValueError,
     r"doc_start must be an integer tensor of shape \(B, T\) = \(1, 8\)"),
    (lambda: _bam(*make_qkv(1, 2, 8, 8, 16), doc_start=packed([[3, 5]]).float()), ValueError, "document_starts"),
])
def test_errors(make_call, error, match):
    with pytest.raises(error, match=match):
        make_call()


def test_error_cpu_without_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRET", False)
    q, k, v = (x.detach().cpu() for x in make_qkv(1, 2, 8, 8, 16))
    expected = "set TRITON_INTERPRET=1 to run the kernels on CPU, or use attn_impl='torch'"
    with pytest.raises(RuntimeError, match=expected):
        _bam(q, k, v)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.tapa_attention(q, k, v)


def test_error_without_triton(monkeypatch):
    monkeypatch.setattr(kernels, "HAS_TRITON", False)
    with pytest.raises(ImportError, match="pip install triton"):
        _bam(*make_qkv(1, 2, 8, 8, 16))


def test_bench_smoke(tmp_path):
    """bench.py --smoke runs one tiny size (on CPU: under the interpreter) through the benchmark's code path,
    and writes the table to --out and the figure beside it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # bench.py decides
    t0 = time.time()
    res = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--smoke", "--methods", "sdpa_flash", "bam",
                          "bam_ssmax", "tapa", "ref_bam", "bam_doc", "tapa_doc", "--out", str(tmp_path / "bench.md")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| bam |" in res.stdout and "| tapa |" in res.stdout and "error" not in res.stdout, res.stdout
    report = (tmp_path / "bench.md").read_text()
    assert all(f"| 40 | 16 | 1×2 | {m} |" in report
               for m in ("bam", "bam_ssmax", "tapa", "ref_bam", "bam_doc", "tapa_doc")), report
    assert (tmp_path / "bench.png").stat().st_size > 10_000  # the figure beside it
    assert time.time() - t0 < 180


@pytest.mark.parametrize("name", ["flex_bam", "flex_bam_ssmax", "flex_bam_doc", "bam_doc"])
def test_bench_flex_baselines_compute_bam(name):
    """bench.py's FlexAttention baselines (a score_mod over the captured learnable (H,) tensors, a causal or
    document block mask) equal bam_attention_ref (on each document alone for the *_doc methods: 3 documents in
    each of 2 rows), so the benchmark compares like with like. Forward only on CPU (FlexAttention has no CPU
    backward); on a GPU also every gradient, the captured tensors' included."""
    import bench
    B, T, H, D = 2, 40, 2, 16
    fn, params = bench.make_methods([name], H, T, DEVICE, B=B, n_docs=3)[name]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the ALiBi init (β = 1, s = 1)
        for p in params:
            p.add_(0.2 * torch.randn(p.shape, generator=g).to(DEVICE))
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(DEVICE).requires_grad_(ON_GPU) for _ in range(3))
    ssmax = params[2] if len(params) == 3 else None
    ref_fn = functools.partial(bam_attention_ref, log_scale=params[0], shape=params[1], ssmax_scale=ssmax)
    if name.endswith("_doc"):
        lengths = torch.bincount(bench.packed_doc_ids(1, T, 3, "cpu")[0]).tolist()
        ref_fn = each_document_alone(ref_fn, [lengths] * B)
    with torch.set_grad_enabled(ON_GPU):
        out, ref = fn(q, k, v), ref_fn(q, k, v)
    assert_close(out, ref, 1e-4, "output")
    if ON_GPU:
        grads = torch.autograd.grad(out, [q, k, v] + params, torch.ones_like(out))
        ref_grads = torch.autograd.grad(ref, [q, k, v] + params, torch.ones_like(ref))
        for i, (a, b) in enumerate(zip(grads, ref_grads)):
            assert_close(a, b, 1e-3, f"grad {i}")


def test_bench_plot(tmp_path):
    """bench.plot_report draws ratios, memory and the gaps (OOM) of a GPU-shaped run: two head dims, five lengths."""
    import bench
    records = [(D, T, name, 1 + i / 10, 1.1 + i / 10, None if name == "ref_bam" and T > 4096 else float(T * (i + 1)))
               for D in (64, 128) for T in (1024, 2048, 4096, 8192, 16384)
               for i, name in enumerate(["sdpa_flash", "bam", "tapa", "flex_bam", "ref_bam"])]
    bench.plot_report(records, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 20_000


def test_kernels_compile_for_sm90():
    """The interpreter does not compile: build the bf16 kernels (D = 64; and D = 48 with doc_start, TAPA with
    SSMax and the linear phase, which the interpreter's loose typing would not catch) for an H100 (sm_90) on the
    CPU and read their machine code (bench.sm90_machine_code): the dots are Hopper's wgmma (HGMMA), log2/cos/sin
    one MUFU op each (kernels.FAST_MATH), nothing goes through local memory (no register spills, no
    libdevice slow path of cos/sin), shared memory fits the 227 KiB of a Hopper SM."""
    try:
        import triton.backends.nvidia.compiler  # noqa: F401
    except ImportError as e:
        pytest.skip(f"triton has no NVIDIA backend here: {e}")
    env = dict(os.environ, TRITON_INTERPRET="0")
    # the default kernels at D = 64; then D = 48 (padded to 64) with documents, TAPA with SSMax and the linear phase
    code = ("import bench, json; print(json.dumps([bench.sm90_machine_code(64), "
            "bench.sm90_machine_code(48, doc=True, tapa_ssmax=True, linear=True)]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    for doc, stats in zip((False, True), json.loads(res.stdout.strip().splitlines()[-1])):
        assert sorted(stats) == ["_bam_bwd", "_bam_fwd", "_tapa_bwd", "_tapa_fwd"]
        for name, s in stats.items():
            needed = ["HGMMA", "MUFU.EX2", "MUFU.LG2"] + (["MUFU.COS"] if "tapa" in name else [])
            needed += ["MUFU.SIN"] if name == "_tapa_bwd" else []
            assert all(s[op] > 0 for op in needed), (name, s)
            assert s["HMMA"] == s["LDL"] == s["STL"] == 0, (name, s)
            assert 0 < s["shared_KiB"] <= 227, (name, s)
            if name.endswith("_fwd") and not doc:  # the key tiles below the diagonal run a loop without the causal
                assert len(s["loops"]) == 2 and s["loops"][0] < s["loops"][1], (name, s["loops"])  # mask: shorter
            if name.endswith("_fwd") and doc:  # document-masked tiles, then unmasked ones (shortest), then diagonal
                assert len(s["loops"]) == 3 and s["loops"][1] < min(s["loops"][0], s["loops"][2]), (name, s["loops"])


def test_sass_loop_bodies():
    """bench.loop_bodies on a hand-written listing: a 3-instruction loop, a 2-instruction one, and the
    self-loop after EXIT that is not counted."""
    import bench
    sass = "\n".join(["MOV R1, R2;", "LBB0:", "IADD R1, R1, 1;", "ISETP.LT P0, R1, 8;", "@P0 BRA LBB0;",
                      "LBB1:", "FADD R2, R2, 1;", "@P1 BRA LBB1;", "EXIT;", "LBB2:", "BRA LBB2;"])
    assert bench.loop_bodies(sass) == [3, 2]


# ---------------------------------------------------------------- wired into the model

@pytest.mark.parametrize("pos,ssmax", [("bam", True), ("bam", False), ("tapa", False)])
def test_model_triton_impl_matches_torch_impl(pos, ssmax):
    """attn_impl='triton' gives the logits and gradients of attn_impl='torch', also with the KV cache."""
    from model import GPT, GPTConfig
    if ON_GPU:
        pytest.skip("CPU wiring check")
    args = dict(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=32, pos=pos, ssmax=ssmax)
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**args))
    fused = GPT(GPTConfig(**args, attn_impl="triton"))
    fused.load_state_dict(ref.state_dict())
    x = torch.randint(0, 37, (1, 21))  # past block_size
    la, loss_a = ref(x, x)
    lb, loss_b = fused(x, x)
    assert torch.allclose(la, lb, atol=1e-4)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), (_, pb) in zip(ref.named_parameters(), fused.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-4, rtol=1e-3), name
    cache = fused.new_cache()
    fused(x[:, :13], cache=cache)
    step, _ = fused(x[:, 13:14], cache=cache)  # decoding one token: q_offset = 13
    assert torch.allclose(step[0, -1], la[0, 13], atol=1e-4)


@pytest.mark.parametrize("pos,ssmax,phase,n_embd", [("bam", True, "quadratic", 32), ("bam", False, "quadratic", 96),
                                                   ("tapa", True, "quadratic", 32), ("tapa", False, "linear", 32),
                                                   ("tapa", True, "linear", 96)])
def test_model_triton_impl_with_documents_matches_torch_impl(pos, ssmax, phase, n_embd):
    """Packed documents (doc_ids) through the model: attn_impl='triton' gives the logits and every parameter
    gradient of attn_impl='torch' (issue 16), for TAPA with SSMax and the linear phase too, and for head dim 48
    (n_embd 96, 2 heads) where the kernels pad the head dim."""
    from model import GPT, GPTConfig
    if ON_GPU:
        pytest.skip("CPU wiring check")
    args = dict(block_size=32, vocab_size=37, n_layer=2, n_head=2, n_embd=n_embd, pos=pos, ssmax=ssmax,
                tapa_phase=phase)
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**args))
    with torch.no_grad():  # move SSMax s and the BAM shape off their init, so that a wrong n or Δ shows
        for name, p in ref.named_parameters():
            if name.endswith("ssmax.scale") or name.endswith("pos_bias.shape"):
                p.uniform_(0.5, 1.5)
    fused = GPT(GPTConfig(**args, attn_impl="triton"))
    fused.load_state_dict(ref.state_dict())
    x = torch.randint(0, 37, (2, 21))
    doc_ids = torch.tensor([[0] * 5 + [1] + [2] * 9 + [3] * 6, [4] * 13 + [5] * 8])  # lengths 5, 1, 9, 6 and 13, 8
    la, loss_a = ref(x, x, doc_ids=doc_ids)
    lb, loss_b = fused(x, x, doc_ids=doc_ids)
    assert torch.allclose(la, lb, atol=1e-4)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), (_, pb) in zip(ref.named_parameters(), fused.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-4, rtol=1e-3), name
    alone, _ = ref(x[:1, 6:15], keep_last=None)  # the third document of row 0, run alone from position 0
    assert torch.allclose(lb[0, 6:15], alone[0], atol=1e-4)


def test_model_triton_impl_refuses_what_the_kernels_lack():
    """Variants without a kernel, and attention dropout in training (TAPA with SSMax or linear phase and packed
    documents have kernels since issue 16)."""
    from model import GPT, GPTConfig
    with pytest.raises(ValueError, match="pos='bam' and 'tapa' only"):
        GPT(GPTConfig(pos="rope", attn_impl="triton", n_layer=1, n_head=2, n_embd=32, vocab_size=11))
    m = GPT(GPTConfig(pos="tapa", dropout=0.1, attn_impl="triton", n_layer=1, n_head=2, n_embd=32, vocab_size=11))
    with pytest.raises(ValueError, match="no attention dropout.*attn_impl='torch'"):
        m(torch.zeros(1, 4, dtype=torch.long))


def test_kernels_on_cpu_without_interpreter_name_the_fix():
    code = ("import torch, kernels; q = torch.randn(1, 1, 4, 16); "
            "kernels.bam_attention(q, q, q, torch.zeros(1), torch.ones(1))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "TRITON_INTERPRET=1" in r.stderr
