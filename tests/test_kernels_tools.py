"""
kernels.py around the kernels: the errors that name the fix, bench.py (its smoke run, its FlexAttention
baselines against the reference, its plot, the sm_90 machine code), and the model wired to the kernels
(attn_impl='triton' equals attn_impl='torch', with the KV cache and with packed documents). Set-up:
kernel_helpers.py.
"""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from attention_bam import bam_attention_ref
from kernel_helpers import (DEVICE, ON_GPU, ROOT, assert_close, bam_unit, each_document_alone, make_qkv, packed)


@pytest.mark.parametrize("make_call,error,match", [
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 160)), ValueError, "head dim 160"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 136)), ValueError, "head dim 136"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 8)), ValueError, "head dim 8"),
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 16)[:2], torch.randn(1, 2, 9, 16, device=DEVICE)), ValueError, "shape mismatch"),
    (lambda: bam_unit(make_qkv(1, 2, 8, 8, 16)[0], *make_qkv(1, 2, 8, 8, 32)[1:]), ValueError, "shape mismatch"),
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 16), q_offset=1), ValueError, "Tk >= q_offset"),
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 16), H=3), ValueError, r"shape \(H,\)"),
    (lambda: kernels.bam_attention(*make_qkv(1, 2, 8, 8, 16), torch.zeros(2, device="meta"), torch.ones(2, device=DEVICE)),
     ValueError, "one device"),
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 16), loc=torch.zeros(2, device=DEVICE, requires_grad=True)), ValueError, "loc"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), theta=0.99), ValueError, "theta"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), alpha=-1.0), ValueError, "alpha"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), phase="cubic"), ValueError, "phase"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), ssmax_scale=torch.ones(3, device=DEVICE)), ValueError,
     r"ssmax_scale must have shape \(H,\)"),
    (lambda: bam_unit(*make_qkv(1, 2, 4, 8, 16), q_offset=4, doc_start=packed([[2, 2]])), ValueError, "q_offset = 0"),
    (lambda: bam_unit(make_qkv(1, 2, 4, 8, 16)[0], *make_qkv(1, 2, 8, 8, 16)[1:], doc_start=packed([[2, 2]])),
     ValueError, "Tq = Tk"),
    (lambda: kernels.tapa_attention(*make_qkv(1, 2, 8, 8, 16), doc_start=packed([[3, 4]])), ValueError,
     r"doc_start must be an integer tensor of shape \(B, T\) = \(1, 8\)"),
    (lambda: bam_unit(*make_qkv(1, 2, 8, 8, 16), doc_start=packed([[3, 5]]).float()), ValueError, "document_starts"),
])
def test_errors(make_call, error, match):
    with pytest.raises(error, match=match):
        make_call()


def test_error_cpu_without_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRET", False)
    q, k, v = (x.detach().cpu() for x in make_qkv(1, 2, 8, 8, 16))
    expected = "set TRITON_INTERPRET=1 to run the kernels on CPU, or use attn_impl='torch'"
    with pytest.raises(RuntimeError, match=expected):
        bam_unit(q, k, v)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.tapa_attention(q, k, v)


def test_error_without_triton(monkeypatch):
    monkeypatch.setattr(kernels, "HAS_TRITON", False)
    with pytest.raises(ImportError, match="pip install triton"):
        bam_unit(*make_qkv(1, 2, 8, 8, 16))


def test_bench_smoke(tmp_path):
    """bench.py --smoke runs one tiny size (on CPU: under the interpreter) through the benchmark's code path,
    and writes the table to --out and the figure beside it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # bench.py decides
    res = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--smoke", "--methods", "sdpa_flash", "bam",
                          "bam_ssmax", "tapa", "ref_bam", "bam_doc", "tapa_doc", "--out", str(tmp_path / "bench.md")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| bam |" in res.stdout and "| tapa |" in res.stdout and "error" not in res.stdout, res.stdout
    report = (tmp_path / "bench.md").read_text()
    assert all(f"| 40 | 16 | 1×2 | {m} |" in report
               for m in ("bam", "bam_ssmax", "tapa", "ref_bam", "bam_doc", "tapa_doc")), report
    assert (tmp_path / "bench.png").stat().st_size > 10_000  # the figure beside it


@pytest.mark.parametrize("name", ["flex_bam", "flex_bam_ssmax", "flex_bam_doc", "bam_doc"])
def test_bench_flex_baselines_computebam_unit(name):
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

