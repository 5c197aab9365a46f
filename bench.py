"""
Speed and memory of the fused attention kernels (kernels.py) against the baselines.

    python3 bench.py                                   # T = 1k..64k, D = 64 and 128, bf16
    python3 bench.py --seqlens 1024 8192 --head-dims 64 --out docs/bench.md
    python3 bench.py --smoke                           # one tiny size; on CPU under TRITON_INTERPRET=1
    python3 bench.py --sass --head-dims 48 64 128      # no GPU needed: compile for sm_90, count instructions

Methods, all causal over the window: sdpa_flash (F.scaled_dot_product_attention, flash backend: the baseline),
bam and bam_ssmax (kernels.bam_attention, SPEC §1/§2), tapa (kernels.tapa_attention, SPEC §3),
flex_bam and flex_bam_ssmax (torch.compile'd FlexAttention with the GGD bias as a score_mod
over the captured learnable (H,) tensors, and a causal block mask), and ref_bam
(attention_bam.bam_attention_ref with one chunk, i.e. the fully materialized T×T attention,
shown as OOM when it does not fit). TAPA has no FlexAttention version: a score_mod only sees
the full q·k score, and TAPA needs the amplitude and phase half dot products separately.

Packed documents (--docs N per window, equal lengths, default 8: 2k-token documents in a 16k
window), causal within each document: bam_doc (bam_attention with SSMax and doc_start, the BAM
authors' setting), tapa_doc (tapa_attention with doc_start) and flex_bam_doc (FlexAttention with
the same score_mod, n_i counted in the document, and a document mask_mod). Their ×sdpa is still
against plain causal sdpa_flash over the whole window, which does more work.

Shapes follow the FlashAttention-2 benchmarks: 16k tokens per batch (B = max(1, 16384 // T))
and model width 2048 (H = 2048 // D), so B·H = 512 at T = 1k, D = 64, and B = 1 from T = 16k on.
Times are medians of triton.testing.do_bench (ms); the forward is timed under torch.no_grad().
"×sdpa" is the time over sdpa_flash's in the same run. Peak memory: torch.cuda.max_memory_allocated
during one fwd+bwd call minus the memory allocated before it (inputs not counted), in MiB.
Rows are printed (and --out rewritten) as they are measured: a run cut short leaves a partial table.

--sass compiles the four bf16 kernels for an H100/H200 (sm_90) with triton's bundled ptxas, on any
machine, and counts instructions in their machine code: a static check of a kernel change
(tensor-core dots, MUFU ops, local memory, shared memory), not a timing.
"""

import argparse
import os
import re
import statistics
import sys
import time

METHODS = ["sdpa_flash", "bam", "bam_ssmax", "tapa", "flex_bam", "flex_bam_ssmax", "ref_bam",
           "bam_doc", "tapa_doc", "flex_bam_doc"]
SMOKE_METHODS = ["bam", "bam_ssmax", "tapa", "ref_bam", "bam_doc", "tapa_doc"]  # our kernels and the reference


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024 * 2 ** i for i in range(7)],
                   help="sequence lengths T (default 1024 .. 65536)")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], help="head dims D")
    p.add_argument("--methods", nargs="+", default=None, choices=METHODS, help="subset of methods (default: all)")
    p.add_argument("--tokens", type=int, default=16384, help="B = max(1, tokens // T)")
    p.add_argument("--width", type=int, default=2048, help="H = width // D")
    p.add_argument("--docs", type=int, default=8, help="documents per window for the *_doc methods (equal lengths)")
    p.add_argument("--out", default=None, help="also write the report (markdown) to this file, and its plots to "
                                               "a PNG beside it")
    p.add_argument("--smoke", action="store_true",
                   help="one tiny size (T = 40, D = 16; --seqlens and --head-dims do not apply), to check that "
                        "the script runs (CPU ok)")
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and count machine instructions (no GPU)")
    return p.parse_args()


def packed_doc_ids(B, T, n_docs, device):
    """(B, T) document ids of n_docs documents of (nearly) equal length in each window, every row alike."""
    import torch
    return (torch.arange(T, device=device) * n_docs // T).expand(B, T).contiguous()


def make_methods(names, H, T, device, B=1, n_docs=8):
    """name -> (fn(q, k, v) -> out, its learnable (H,) tensors), for the requested methods. The *_doc methods
    take q, k, v of batch size B holding n_docs packed documents per row (packed_doc_ids)."""
    import torch
    import torch.nn.functional as F

    import kernels
    from attention import alibi_slopes, document_starts
    from attention_bam import GGD_EPS, bam_attention_ref

    log_scale = torch.log(alibi_slopes(H)).to(device).requires_grad_()  # ALiBi init, β = 1 (SPEC §1)
    shape = torch.ones(H, device=device, requires_grad=True)
    ssmax = torch.ones(H, device=device, requires_grad=True)
    methods = {}
    if "sdpa_flash" in names:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(q, k, v):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        methods["sdpa_flash"] = (sdpa, [])
    methods["bam"] = (lambda q, k, v: kernels.bam_attention(q, k, v, log_scale, shape), [log_scale, shape])
    methods["bam_ssmax"] = (lambda q, k, v: kernels.bam_attention(q, k, v, log_scale, shape, ssmax_scale=ssmax),
                            [log_scale, shape, ssmax])
    methods["tapa"] = (kernels.tapa_attention, [])
    doc_ids = packed_doc_ids(B, T, n_docs, device)
    doc_start = document_starts(doc_ids)  # (B, T)
    methods["bam_doc"] = (lambda q, k, v: kernels.bam_attention(q, k, v, log_scale, shape, ssmax_scale=ssmax,
                                                                doc_start=doc_start), [log_scale, shape, ssmax])
    methods["tapa_doc"] = (lambda q, k, v: kernels.tapa_attention(q, k, v, doc_start=doc_start), [])
    if any(n.startswith("flex_") for n in names):
        import torch._dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        torch._dynamo.config.recompile_limit = 64  # one compile per shape and grad mode; 8 would fall back to eager
        flex = torch.compile(flex_attention)
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, T, T, device=device)

        def same_doc(b, h, q_idx, kv_idx):  # causal within the query's document
            return (kv_idx <= q_idx) & (doc_ids[b, kv_idx] == doc_ids[b, q_idx])
        doc_mask = create_block_mask(same_doc, B, None, T, T, device=device) if "flex_bam_doc" in names else None

        def ggd(h, q_idx, kv_idx):  # b = −c·(|Δ| + ε)^β, loc = 0
            dist = (kv_idx - q_idx).abs().to(torch.float32) + GGD_EPS
            return -torch.exp(log_scale[h]) * torch.pow(dist, shape[h])

        def bam_mod(score, b, h, q_idx, kv_idx):  # score = q·k/√D
            return score + ggd(h, q_idx, kv_idx)

        def bam_ssmax_mod(score, b, h, q_idx, kv_idx):
            return ssmax[h] * torch.log((q_idx + 1).to(torch.float32)) * (score + ggd(h, q_idx, kv_idx))
        methods["flex_bam"] = (lambda q, k, v: flex(q, k, v, score_mod=bam_mod, block_mask=block_mask),
                               [log_scale, shape])
        methods["flex_bam_ssmax"] = (lambda q, k, v: flex(q, k, v, score_mod=bam_ssmax_mod, block_mask=block_mask),
                                     [log_scale, shape, ssmax])

        def bam_ssmax_doc_mod(score, b, h, q_idx, kv_idx):  # n_i counts the keys of the query's document
            n = (q_idx - doc_start[b, q_idx] + 1).to(torch.float32)
            return ssmax[h] * torch.log(n) * (score + ggd(h, q_idx, kv_idx))
        methods["flex_bam_doc"] = (lambda q, k, v: flex(q, k, v, score_mod=bam_ssmax_doc_mod, block_mask=doc_mask),
                                   [log_scale, shape, ssmax])
    methods["ref_bam"] = (lambda q, k, v: bam_attention_ref(q, k, v, log_scale, shape, chunk_size=T),
                          [log_scale, shape])
    return {n: methods[n] for n in names}


SASS_OPS = ["HGMMA", "HMMA", "MUFU.EX2", "MUFU.LG2", "MUFU.COS", "MUFU.SIN", "LDL", "STL"]


def loop_bodies(sass):
    """Instructions in each loop body of a SASS listing: from a label to a branch back to it (the trailing
    one-instruction self-loop after EXIT excluded)."""
    labels, n, sizes = {}, 0, []
    for line in sass.splitlines():
        line = line.strip()
        if re.fullmatch(r"[\w.$]+:", line):
            labels[line[:-1]] = n
        elif line.endswith(";"):
            n += 1
            back = re.search(r"BRA (\S+);", line)
            if back and back.group(1) in labels and n - labels[back.group(1)] > 1:
                sizes.append(n - labels[back.group(1)])
    return sizes


def sm90_machine_code(D, doc=False, tapa_ssmax=False, linear=False):
    """Compile the bf16 kernels of head dim D for sm_90 (H100/H200) on this machine, no GPU needed, with
    the launch options kernels.py uses, and count instructions in their machine code (SASS).
    BAM is compiled with SSMax, TAPA without (tapa_ssmax=True: with), both without documents (doc=True: with
    doc_start), TAPA with the quadratic phase (linear=True: the linear one).

    Returns {kernel name: {"instructions": n (NOP padding included), op: n for op in SASS_OPS,
    "loops": [instructions of each loop body, in code order], "shared_KiB": x}}: HGMMA are
    Hopper's wgmma tensor-core dots (HMMA the older, slower path), MUFU the special-function unit
    (exp2/log2/cos/sin; 16 results per clock per SM, against 128 FMAs), LDL/STL local-memory loads
    and stores (register spills). Counts are of the whole kernel, loop bodies once.
    Raises ImportError without triton's NVIDIA backend; needs TRITON_INTERPRET unset or 0.
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import kernels
    if kernels.INTERPRET:
        raise RuntimeError("sm90_machine_code compiles the kernels: unset TRITON_INTERPRET")
    fwd, bwd = kernels._launch_kwargs(torch.empty(1, 1, 1, D, dtype=torch.bfloat16))
    d_amp = kernels.tapa_split(D, 0.5)
    tapa = dict(HAS_SSMAX=tapa_ssmax, HAS_DOC=doc, LINEAR=linear, D=D, BLOCK_D=kernels._block_d(D), D_AMP=d_amp,
                DA=kernels._block_d(d_amp), DP=kernels._block_d(D - d_amp))
    bam = dict(HAS_SSMAX=True, HAS_DOC=doc, D=D, BLOCK_D=kernels._block_d(D))
    stats = {}
    for fn, consts, kw in [(kernels._bam_fwd, bam, fwd), (kernels._bam_bwd, bam, bwd),
                           (kernels._tapa_fwd, tapa, fwd), (kernels._tapa_bwd, tapa, bwd)]:
        options = {k: v for k, v in kw.items() if k in ("num_warps", "num_stages", "enable_fp_fusion")}
        consts = dict(consts, **{k: v for k, v in kw.items() if k not in options})
        # arguments: constexprs, the ints q_offset, Tq, Tk, H, the other capitalized ones pointers, else fp32
        pointer = {"LSE": "*fp32", "DELTA": "*fp32", "PRM": "*fp32", "DPRM": "*fp32", "DOC_START": "*i32",
                   "DOC_END": "*i32"}
        sig = {n: "constexpr" if n in consts else "i32" if n in ("q_offset", "Tq", "Tk", "H") else
               pointer.get(n, "*bf16") if n.isupper() else "fp32" for n in fn.arg_names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n][0] == "*"}
        k = triton.compile(ASTSource(fn, sig, consts, aligned), target=GPUTarget("cuda", 90, 32), options=options)
        sass = k.asm["sass"]  # disassembly: one instruction a line, each ending in ";", and "LBBn:" labels
        opcodes = re.findall(r"\b(?:HGMMA|HMMA|MUFU\.[A-Z0-9]+|LDL|STL)\b", sass)
        stats[fn.__name__] = dict(instructions=sass.count(";"), **{op: opcodes.count(op) for op in SASS_OPS},
                                  loops=loop_bodies(sass), shared_KiB=k.metadata.shared / 1024)
    return stats


def time_ms(fn, cuda, grad_to_none=None):
    """Median time of fn() in ms: do_bench on a GPU, a few wall-clock runs on CPU (smoke only)."""
    if cuda:
        import triton.testing
        return triton.testing.do_bench(fn, grad_to_none=grad_to_none, return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def peak_mib(fn, cuda):
    """Extra memory (MiB) allocated at the peak of one fn() call; None on CPU."""
    import torch
    if not cuda:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def measure(fn, params, q, k, v, cuda, skip):
    """[fwd ms, fwd+bwd ms, fwd+bwd peak MiB] of one method; "OOM" where it ran out of memory,
    or where it did at a shorter T (skip holds "fwd"/"bwd" then)."""
    import torch
    dout = torch.randn_like(q)
    leaves = [q, k, v] + params

    def fwd():
        with torch.no_grad():
            return fn(q, k, v)

    def fwd_bwd():
        fn(q, k, v).backward(dout)

    res = []
    for kind, run in (("fwd", fwd), ("bwd", fwd_bwd)):
        if kind in skip:
            res += ["OOM"] * (1 if kind == "fwd" else 2)
            continue
        try:
            run()  # compile / warm up
            for t in leaves:
                t.grad = None
            mem = peak_mib(run, cuda) if kind == "bwd" else None
            res += [time_ms(run, cuda, grad_to_none=leaves)] + ([mem] if kind == "bwd" else [])
        except torch.cuda.OutOfMemoryError:
            skip.add(kind)
            res += ["OOM"] * (1 if kind == "fwd" else 2)
        if cuda:
            torch.cuda.empty_cache()
    return res


def fmt(x, spec):
    return "-" if x is None else (x if isinstance(x, str) else format(x, spec))


def write_report(lines, out):
    """Write the report's lines (markdown) to the file out, replacing it."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot_report(records, path):
    """Save the measurements as a PNG at path: one row of panels per head dim D, against T (log x), a line per
    method: fwd and fwd+bwd time over sdpa_flash's (the issue's targets 1.10 and 1.15 dotted) and fwd+bwd peak
    MiB (log y). records: (D, T, method, fwd ×sdpa, fwd+bwd ×sdpa, MiB), None where there is no number."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r[0] for r in records})
    methods = list(dict.fromkeys(r[2] for r in records))  # in the order measured
    fig, axes = plt.subplots(len(dims), 3, figsize=(15, 4 * len(dims)), squeeze=False)
    for panels, D in zip(axes, dims):
        for ax, col, label in zip(panels, (3, 4, 5), ("fwd time / sdpa_flash", "fwd+bwd time / sdpa_flash",
                                                       "fwd+bwd peak MiB")):
            for i, name in enumerate(methods):
                pts = [(r[1], r[col]) for r in records if r[0] == D and r[2] == name and r[col] is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=name, ls="--" if "flex" in name else "-")
            if col < 5:
                for target in (1.10, 1.15):
                    ax.axhline(target, color="grey", lw=0.8, ls=":")
            else:
                ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length T")
            ax.set_title(f"D = {D}: {label}", fontsize=10)
            ax.grid(alpha=0.3)
        panels[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sass_report(args):
    """--sass: the table of sm90_machine_code for each of args.head_dims."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("bench.py --sass compiles the kernels: run it without TRITON_INTERPRET=1")
    import triton

    import kernels
    if set(args.head_dims) - set(kernels.HEAD_DIMS):
        sys.exit(f"bench.py --sass: the kernels support head dims {kernels.HEAD_DIMS}, got {args.head_dims}")
    lines = ["# Machine code of the kernels for sm_90 (compiled on the CPU, not timed)", "",
             f"- triton {triton.__version__}, bf16, launch options of kernels._launch_kwargs",
             f"- command: `{os.path.basename(sys.executable)} {' '.join(sys.argv)}`",
             "- counts of SASS instructions in the whole kernel (each loop body once); loop bodies: instructions per "
             "iteration of each loop (forward: the unmasked key tiles, then the diagonal ones; backward: dk/dv, "
             "then dq); shared memory in KiB",
             "- variants: causal = BAM with SSMax, TAPA without, no documents (what the loop counts above describe); "
             "doc = with doc_start, both with SSMax (forward loops: the document-masked key tiles, the unmasked "
             "ones, the diagonal ones)", "",
             "| kernel | variant | D | instructions | loop bodies | " + " | ".join(SASS_OPS) + " | shared KiB |",
             "|---|---|---|---|---|" + "---|" * len(SASS_OPS) + "---|"]
    for variant, kw in (("causal", {}), ("doc", dict(doc=True, tapa_ssmax=True))):
        for D in args.head_dims:
            for name, s in sm90_machine_code(D, **kw).items():
                lines.append(f"| {name} | {variant} | {D} | {s['instructions']} | {', '.join(map(str, s['loops']))} | "
                             + " | ".join(str(s[op]) for op in SASS_OPS) + f" | {s['shared_KiB']:.1f} |")
    print("\n".join(lines))
    if args.out:
        write_report(lines, args.out)
        print(f"wrote {args.out}")


def main():
    args = parse_args()
    if args.sass:
        return sass_report(args)
    import torch
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        sys.exit("bench.py needs a CUDA GPU (none found). Run `python3 bench.py --smoke` to check the script on CPU.")
    if args.smoke and not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before kernels/triton are imported
    import triton
    device = "cuda" if cuda else "cpu"
    seqlens, head_dims, names, dtype = args.seqlens, args.head_dims, args.methods or METHODS, torch.bfloat16
    if args.smoke:  # tiny: T = 40 (not a multiple of the tiles), D = 16, B = 1, H = 2
        seqlens, head_dims = [40], [16]
        if not cuda:  # the interpreter computes bf16 in fp32 anyway; our kernels and the reference only
            names, dtype = [n for n in names if n in SMOKE_METHODS], torch.float32
            if not names:
                sys.exit(f"bench.py --smoke on CPU runs only {', '.join(SMOKE_METHODS)} (the baselines need a GPU)")

    header = ["# Attention kernels benchmark", "",
              f"- device: {torch.cuda.get_device_name() if cuda else 'CPU (TRITON_INTERPRET=1, smoke test)'}",
              f"- torch {torch.__version__}, triton {triton.__version__}, {str(dtype).replace('torch.', '')}, causal",
              f"- command: `{os.path.basename(sys.executable)} {' '.join(sys.argv)}`",
              "- shapes: B=1, H=2" if args.smoke else f"- shapes: B = max(1, {args.tokens} // T), H = {args.width} // D",
              f"- *_doc methods: {args.docs} packed documents of equal length per window (doc_start; FlexAttention: "
              f"a document mask_mod); ×sdpa is against causal sdpa_flash over the whole window",
              "- times: median ms; ×sdpa: time / sdpa_flash time; peak: extra MiB allocated during one fwd+bwd", "",
              "| T | D | B×H | method | fwd ms | fwd ×sdpa | fwd+bwd ms | fwd+bwd ×sdpa | peak MiB |",
              "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    rows, records, t_start = [], [], time.time()
    png = os.path.splitext(args.out)[0] + ".png" if args.out else None
    for D in head_dims:
        skip = {n: set() for n in names}  # measurements that ran out of memory at a shorter T
        for T in seqlens:
            B, H = (1, 2) if args.smoke else (max(1, args.tokens // T), max(1, args.width // D))
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=dtype).requires_grad_()
                       for _ in range(3))
            base = None
            for name, (fn, params) in make_methods(names, H, T, device, B=B, n_docs=args.docs).items():
                try:
                    res = measure(fn, params, q, k, v, cuda, skip[name])
                except Exception as e:  # report and go on: one failing baseline should not stop the table
                    res = [f"error: {type(e).__name__}"] * 3
                    print(f"{name} T={T} D={D}: {type(e).__name__}: {e}", file=sys.stderr)
                if name == "sdpa_flash":
                    base = res
                ratio = [res[i] / base[i] if base and isinstance(res[i], float) and isinstance(base[i], float)
                         else None for i in (0, 1)]
                row = (f"| {T} | {D} | {B}×{H} | {name} | {fmt(res[0], '.3f')} | {fmt(ratio[0], '.2f')} | "
                       f"{fmt(res[1], '.3f')} | {fmt(ratio[1], '.2f')} | {fmt(res[2], '.0f')} |")
                rows.append(row)
                records.append((D, T, name, *ratio, res[2] if isinstance(res[2], float) else None))
                print(row, flush=True)
                if args.out:  # after every row: a run stopped by a time limit keeps what it measured
                    write_report(header + rows, args.out)
            if png:  # the figure after every length (a fraction of a second)
                plot_report(records, png)
            del q, k, v
    footer = ["", f"(total {time.time() - t_start:.0f} s)"]
    print("\n".join(footer))
    if args.out:
        write_report(header + rows + footer, args.out)
        print(f"wrote {args.out}, {png}")


if __name__ == "__main__":
    main()
