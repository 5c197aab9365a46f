"""
kernels.py (fused Triton GGD-BAM and TAPA attention) against the PyTorch references bam_attention_ref and
tapa_attention_ref: outputs and every gradient, with partial tiles (T = 37 on 16×16 tiles), q_offset, low
precision, head dims that are no power of 2, and the GPU's tile sizes. The set-up (the Triton interpreter on
CPU tensors; TRITON_INTERPRET=0 on a CUDA machine) and the tolerances are in kernel_helpers.py. Packed documents:
test_kernels_documents.py; errors, bench.py and the model's attn_impl='triton': test_kernels_tools.py.
"""
import pytest
import torch
import triton
import triton.language as tl

import kernels
from attention import ssmax_factor
from attention_bam import bam_attention_ref
from attention_tapa import tapa_attention_ref
from kernel_helpers import (DEVICE, ON_GPU, RTOL, assert_close, bam_params, bam_unit, check_against_ref, make_qkv,
                            use_gpu_tiles)

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
    for out in [bam_unit(q, k, v), kernels.tapa_attention(q, k, v)]:
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


# ----------------------------------------------------------------------------- GPU tiles, errors, bench

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


