"""
kernels.py with packed documents (doc_start, issue 16): bam_attention and tapa_attention on packed rows equal
their references on each document alone, output and every gradient; key tiles of earlier documents are
skipped (forward and backward); the GPU's tile sizes. Set-up: kernel_helpers.py.
"""
import pytest
import torch

import kernels
from attention_bam import bam_attention_ref
from attention_tapa import tapa_attention_ref
from kernel_helpers import (DEVICE, DOC_LENGTHS, ON_GPU, RTOL, bam_params, bam_unit, check_against_ref,
                            each_document_alone, make_qkv, packed, use_gpu_tiles)

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
    out = bam_unit(q, k, v, doc_start=doc_start)
    assert torch.isfinite(out[:, :, 16:]).all() and torch.isnan(out[:, :, :16]).all()
    q, k, v = make_qkv(1, 2, T, T, 16)
    grad_out = torch.randn(1, 2, T, 16, device=DEVICE)
    grad_out[:, :, 16:] = float("nan")  # every query tile but the first
    for out in (bam_unit(q, k, v, doc_start=doc_start), kernels.tapa_attention(q, k, v, doc_start=doc_start)):
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


