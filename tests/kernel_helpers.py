"""
Shared set-up of the kernel tests (test_kernels*.py): the Triton interpreter switched on before triton is
imported, the import guard (skip on a user's machine without triton, fail under CI=true), and the helpers that
compare a kernel with its PyTorch reference (output and every gradient).

The kernels run on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1) with 16×16 tiles; on a
CUDA machine `TRITON_INTERPRET=0 python3 -m pytest tests/test_kernels*.py` runs the same checks on the compiled
kernels and CUDA tensors instead.

Tolerances: max|kernel − ref| <= rtol · max|ref| per tensor, with rtol = 1e-4 for fp32 and 3e-2 for fp16/bf16
inputs (compared against the fp32 reference run on the same rounded inputs).
"""
import os
import sys

ON_GPU = os.environ.get("TRITON_INTERPRET") == "0"  # opt-in: compiled kernels on CUDA tensors
# the interpreter only works if it is on when triton is first imported (triton's own helpers are @jit too)
TRITON_IMPORTED_TOO_EARLY = not ON_GPU and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton/kernels are imported: kernels then run on CPU tensors

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

import kernels
from attention import document_starts

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


def use_gpu_tiles(monkeypatch, D, gpu_dtype):
    """Under the interpreter, launch with the GPU's tiles for head dim D and inputs of gpu_dtype."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    gpu_kwargs = kernels._launch_kwargs(torch.empty(1, 1, 1, D, dtype=gpu_dtype))
    monkeypatch.setattr(kernels, "INTERPRET", True)
    monkeypatch.setattr(kernels, "_launch_kwargs", lambda q: gpu_kwargs)


def bam_unit(q, k, v, H=2, **kw):
    """bam_attention with c = 1 and β = 1 in every one of the H heads (the tests of errors and tile skipping)."""
    return kernels.bam_attention(q, k, v, torch.zeros(H, device=q.device), torch.ones(H, device=q.device), **kw)
