"""
Fused Triton attention kernels for GGD-BAM (+SSMax) and TAPA (+SSMax), FlashAttention-2 style.

    bam_attention   SPEC §1 (GGD prior b_h(i, j)) and §2 (SSMax factor f_i)
    tapa_attention  SPEC §3 (Eq. 12 of the TAPA paper; quadratic or linear phase) and §2

Both take doc_start (packed documents, SPEC §2) and any head dim D from 16 to 128.
The oracles are bam_attention_ref (attention_bam.py) and tapa_attention_ref
(attention_tapa.py); tests/test_kernels*.py compare outputs and gradients.

Tiling. One forward program owns BLOCK_M query rows of one (batch, head) and
walks over key tiles of BLOCK_N keys with an online softmax (running max m,
running sum l, fp32 accumulator), so no T×T tensor ever exists. The positional
terms (the GGD bias, the TAPA phase weight) are computed per tile from the
absolute positions i = q_offset + row and j = key. Key tiles that lie wholly
past the tile's last query (beyond the causal diagonal) are never visited; those
wholly before its first query need no causal mask, and the forward runs them in a
loop of their own (_causal_key_range; one `if` in a single loop cost more).
The forward saves the log-sum-exp per row (base 2: the softmax runs on exp2).

Head dims. Every D-wide tile (q, k, v, dO, the accumulators) is BLOCK_D = the next power
of 2 (at least 16) wide, with the columns D .. BLOCK_D−1 masked on loads (zeros) and
stores (_tile): no padded copy of q, k, v exists, and 1/√D uses the true D. TAPA loads
q and k as two tiles, the amplitude columns 0 .. d_amp−1 and the phase columns
d_amp .. D−1, each padded the same way (_load_split), so the split stays exact for any
D (48 = 24 + 24 in two 32-wide tiles). Below D = 16 the dots (tl.dot needs K >= 16)
would mostly multiply padding: such heads are refused (use the torch path).

Packed documents (doc_start). With doc_start (B, T) (attention.document_starts; only for
training-shaped calls, q_offset = 0 and Tq = Tk), query i of batch row b sees the keys
doc_start[b, i] <= j <= i, SSMax's n_i = i − doc_start[b, i] + 1, and the positional
terms keep depending on i − j alone. The wrapper turns doc_start into one (2, B, T) int32
table (_doc_table): doc_start, and per key j the start of the next document (doc_end, one
past the last query that sees j). Because doc_start is non-decreasing, a query tile's
smallest doc_start is its first row's and its largest its last row's: the forward starts
at the key tile holding the first row's doc_start (the tiles before it, other documents
only, are skipped), runs the tiles before the last row's doc_start with the document
mask, the tiles from there to the diagonal with no mask at all, then the diagonal tiles
with both masks (_doc_key_tiles). The backward's dq loop skips the same leading tiles;
its dk/dv loop stops at the doc_end of the key tile's last key (_doc_query_end): query
tiles of later documents are skipped. A row may see no key in its first tiles, so its
running max then starts at the lowest finite fp32 rather than −inf (_online_softmax_init).

The backward recomputes P tile by tile. Program pid of the backward grid does
two jobs, as in the Triton fused-attention tutorial: (1) dk, dv for key tile pid,
looping over the query tiles that see it; (2) dq for query tile pid, looping over
the key tiles it sees (plus the per-head parameter gradients: BAM's log_scale, shape
and ssmax_scale, TAPA's ssmax_scale). Causal work of (1) shrinks with pid while (2)
grows, so programs are balanced. No atomics: the per-head sums are written as partial
sums into a (3, B·H, programs) buffer (TAPA: (B·H, programs)), one slot per program,
and summed by torch, so every gradient is deterministic.
That is why the backward stays one kernel with two jobs per program, not separate
dk/dv and dq kernels: the programs stay balanced, and each gradient (dq, dk, dv, each
slot of the per-head sums) is written by exactly one program.

On CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1 set before
this module is imported), with 16×16 tiles so that the tests exercise the tails.

Layout, grouped by method: shared helpers (launch options, fast math, tile loads and
stores, the causal and document key ranges, the SSMax factor, the online-softmax step,
input checks, the doc_start table),
then GGD-BAM (_bam_logits, kernels, _BAMAttention, bam_attention), then TAPA
(_tapa_terms, kernels, _TAPAAttention, tapa_attention).

To change the prior (the GGD bias b_h(i, j)), edit these places:
  1. _bam_logits: b from Δ = j − i and the per-head parameters (and what it returns for the gradients).
  2. _bam_bwd, part (2): the hand-derived per-head gradient sums (p_b, p_bl, ... → g_b, g_bl, g_z)
     and their stores into DPRM; dq and dk need no change while b depends on positions only.
  3. The packed parameter layout: PRM, (4, H) = c, β, μ, s, stacked in _BAMAttention.forward, loaded at
     the top of _bam_fwd and _bam_bwd and passed through _bam_fwd_step to _bam_logits; DPRM,
     (3, B·H, programs), allocated and summed in _BAMAttention.backward, which returns one gradient
     per argument of forward.
  4. bam_attention: its signature, the (name, tensor) pairs it checks with _check_inputs, the
     _BAMAttention.apply call.
  5. model.py: CausalSelfAttention.attend_triton, which calls kernels.bam_attention with the
     GGDPrior's parameters.
Then compare with the oracle (attention_bam.ggd_bias, bam_attention_ref): tests/test_kernels.py.
"""

import contextlib
import math
import os

import torch

from attention_bam import BIAS_FLOOR, GGD_EPS
from configurator import InputError  # a ValueError: a setting the kernels cannot run (one line in the scripts)
from attention_tapa import TAPA_PHASES, tapa_split

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice
    HAS_TRITON = True
except ImportError:  # keep the module importable; the wrappers raise a clear error
    import types
    HAS_TRITON = False
    triton = types.SimpleNamespace(jit=lambda fn: fn, cdiv=lambda a, b: -(-a // b))
    tl = types.SimpleNamespace(constexpr=lambda value=None: value)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
HEAD_DIMS = range(16, 129)  # any head dim 16 .. 128: the tiles are padded to a power of 2 (_block_d)
LOG2E = tl.constexpr(1.4426950408889634)  # the softmax runs on exp2: exp(z) = exp2(z·log2 e)
LN2 = tl.constexpr(0.6931471805599453)
TWO_PI = tl.constexpr(6.283185307179586)
FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)  # the lowest finite fp32: the running max of a row without keys yet
BIAS_FLOOR = tl.constexpr(BIAS_FLOOR)  # the GGD bias is floored at −1e30, as in attention_bam.ggd_bias
# Compiled for a GPU, log2/cos/sin of the tiles use the hardware approximations (one MUFU instruction
# each: lg2.approx, cos.approx, sin.approx, as tl.exp2 already does with ex2.approx). tl.log2/cos/sin
# call libdevice's accurate versions (1-2 ulp): 15-40 instructions an element, and cos/sin a slow
# path through local memory for large angles. The interpreter cannot call libdevice and keeps tl.*.
FAST_MATH = tl.constexpr(HAS_TRITON and not INTERPRET)


# ----------------------------------------------------------------------------- shared helpers

def _launch_kwargs(q):
    """Tile sizes and launch options for q's dtype: (forward kwargs, backward kwargs).

    fp16/bf16 on a GPU: 128×64 forward tiles, (32, 128, 128, 32) backward tiles, 8 warps, 3 stages,
    for every head dim. Compiled for sm_90 (on the CPU, no GPU run yet) the dots are wgmma (HGMMA),
    log2/cos/sin one MUFU op each (FAST_MATH), nothing spills to local memory except in the TAPA
    backward at D = 128 (11 words; 22 with doc_start and SSMax), and shared memory takes at most
    128 KiB (docs/sass.md). A head dim that is no power of 2 uses the tiles of the next one.
    fp32: exact ("ieee", not TF32) dots, which need small tiles to fit in registers; this path is
    for checks, not speed. The interpreter gets 16×16 tiles (tl.dot's minimum) so that small
    tests cover tile tails.
    """
    if INTERPRET:
        (bm, bn), (bm1, bn1, bm2, bn2), warps, stages = (16, 16), (16, 16, 16, 16), 1, 1
    elif q.dtype == torch.float32:
        (bm, bn), (bm1, bn1, bm2, bn2), warps, stages = (32, 32), (16, 32, 32, 16), 4, 2
    else:
        (bm, bn), (bm1, bn1, bm2, bn2), warps, stages = (128, 64), (32, 128, 128, 32), 8, 3
    # enable_fp_fusion: a·b + c as one FMA, said explicitly (triton 3.10 turns it off by default)
    common = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True,
                  DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32")
    return (dict(BLOCK_M=bm, BLOCK_N=bn, **common),
            dict(BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2, **common))


@triton.jit
def _log2(x):
    """log2 of an fp32 tile: lg2.approx on a GPU (error 2^-22 near 1, 2 ulp elsewhere), tl.log2 in the interpreter."""
    return libdevice.fast_log2f(x) if FAST_MATH else tl.log2(x)


@triton.jit
def _cos(x):
    """cos of an fp32 tile (radians): cos.approx on a GPU (absolute error about 2^-21 plus about |x|·2^-23
    from reducing x to a turn, a few times x's own fp32 rounding), tl.cos in the interpreter."""
    return libdevice.fast_cosf(x) if FAST_MATH else tl.cos(x)


@triton.jit
def _sin(x):
    """sin of an fp32 tile (radians), as _cos."""
    return libdevice.fast_sinf(x) if FAST_MATH else tl.sin(x)


@triton.jit
def _tile(rows, n_rows, ROW_LEN: tl.constexpr, COL0: tl.constexpr, N_COLS: tl.constexpr, WIDTH: tl.constexpr):
    """Offsets and mask of a (len(rows), WIDTH) tile of a row-major (n_rows, ROW_LEN) matrix,
    columns COL0 .. COL0+N_COLS−1 (WIDTH >= N_COLS is a power of 2; the padding is masked)."""
    cols = tl.arange(0, WIDTH)
    offs = rows[:, None] * ROW_LEN + COL0 + cols[None, :]
    mask = rows[:, None] < n_rows
    if N_COLS < WIDTH:
        mask = mask & (cols[None, :] < N_COLS)
    return offs, mask


@triton.jit
def _load(ptr, rows, n_rows, ROW_LEN: tl.constexpr, COL0: tl.constexpr, N_COLS: tl.constexpr, WIDTH: tl.constexpr):
    """The tile of _tile, loaded with zeros in the padding."""
    offs, mask = _tile(rows, n_rows, ROW_LEN, COL0, N_COLS, WIDTH)
    return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def _store(ptr, x, rows, n_rows, ROW_LEN: tl.constexpr, COL0: tl.constexpr, N_COLS: tl.constexpr,
           WIDTH: tl.constexpr):
    """Store the tile x (fp32) into the rows/columns of _tile, cast to ptr's dtype."""
    offs, mask = _tile(rows, n_rows, ROW_LEN, COL0, N_COLS, WIDTH)
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _causal_key_range(first_pos, Tk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query tile at absolute positions first_pos .. first_pos+BLOCK_M−1: (lo, hi), with the key tiles
    from 0 to lo seen whole by every row (no causal mask needed) and those from lo to hi crossing the diagonal;
    keys from hi on are masked for every row. lo is a multiple of BLOCK_N."""
    return (first_pos + 1) // BLOCK_N * BLOCK_N, tl.minimum(first_pos + BLOCK_M, Tk)


@triton.jit
def _doc_starts(DOC_START, rows, n_rows, HAS_DOC: tl.constexpr, BLOCK: tl.constexpr):
    """doc_start of the query rows (BLOCK,) (DOC_START points at this batch row's T entries): the first key
    each row sees. 0 for padded rows and without documents."""
    if HAS_DOC:
        ds = tl.load(DOC_START + rows, mask=rows < n_rows, other=0)
    else:
        ds = tl.zeros([BLOCK], tl.int32)
    return ds


@triton.jit
def _doc_first_key_tile(DOC_START, start_m, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr):
    """The first key tile (a multiple of BLOCK_N) the query tile from row start_m can see: the tile holding the
    doc_start of its first row, the smallest of the tile since doc_start is non-decreasing. 0 without documents."""
    first = 0
    if HAS_DOC:
        first = tl.load(DOC_START + start_m) // BLOCK_N * BLOCK_N
    return first


@triton.jit
def _doc_key_tiles(DOC_START, start_m, Tq, lo, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr):
    """The forward's split of the key tiles before lo (those below the causal diagonal) for the query tile from
    row start_m: (first, mid). Tiles before first hold other documents only (skipped); those from first to mid
    hold keys before some row's doc_start (document mask); those from mid to lo lie inside every row's document
    (no mask). mid is the doc_start of the tile's last row (the largest) rounded up to a tile, at most lo.
    (0, 0) without documents."""
    first = 0
    mid = 0
    if HAS_DOC:
        first = _doc_first_key_tile(DOC_START, start_m, BLOCK_N, HAS_DOC)
        last_start = tl.load(DOC_START + tl.minimum(start_m + BLOCK_M, Tq) - 1)
        mid = tl.minimum((last_start + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo)
    return first, mid


@triton.jit
def _doc_query_end(DOC_END, start_n, Tq, Tk, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr):
    """One past the last query row that sees a key of the tile start_n .. start_n+BLOCK_N−1: the end of the
    document of the tile's last key (DOC_END holds, per key, the start of the next document, or T). Tq without
    documents."""
    end = Tq
    if HAS_DOC:
        end = tl.load(DOC_END + tl.minimum(start_n + BLOCK_N, Tk) - 1)
    return end


@triton.jit
def _ssmax_factor(pos_i, s, HAS_SSMAX: tl.constexpr, BLOCK: tl.constexpr):
    """SSMax factor f_i = s·log(n_i) with n_i = pos_i + 1, pos_i (BLOCK,) the query's position in its document
    (its absolute position without documents), or 1 without SSMax."""
    f = tl.full([BLOCK], 1.0, tl.float32)
    if HAS_SSMAX:
        f = s * tl.log((pos_i + 1).to(tl.float32))
    return f


@triton.jit
def _online_softmax_init(HAS_DOC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The forward's running max m_i, running sum l_i and accumulator acc before the first key tile. m_i starts
    at −inf without documents: key 0 lies in the first tile every row visits, so m_i is finite after it. With
    documents a row may see no key in its first tiles (its document starts in a later one), and −inf − (−inf)
    would give NaN: m_i then starts at the lowest finite fp32 instead, which every unmasked logit exceeds (they
    are finite: the GGD bias is floored at −1e30), so that it drops out at the row's first key."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if HAS_DOC:
        m_i = tl.full([BLOCK_M], FP32_LOWEST, tl.float32)
    return m_i, tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M, BLOCK_D], tl.float32)


@triton.jit
def _online_softmax_step(z, v, m_i, l_i, acc, DOT_PREC: tl.constexpr):
    """One key tile of the forward's online softmax (base 2): logits z (BLOCK_M, BLOCK_N), values v
    (BLOCK_N, BLOCK_D); updates the running max m_i, running sum l_i and accumulator acc."""
    m_new = tl.maximum(m_i, tl.max(z, 1))
    p = tl.exp2(z - m_new[:, None])
    rescale = tl.exp2(m_i - m_new)
    l_i = l_i * rescale + tl.sum(p, 1)
    acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _bwd_preprocess(O, DO, DELTA, n_rows, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """DELTA[r] = rowsum(dO ∘ O)[r] in fp32, for O, dO viewed as (n_rows, D)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    o = _load(O, rows, n_rows, D, 0, D, BLOCK_D).to(tl.float32)
    do = _load(DO, rows, n_rows, D, 0, D, BLOCK_D).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=rows < n_rows)


def _block_d(D):
    """The power-of-2 width of the head-dim tiles for head dim D (columns D .. BLOCK_D−1 are masked)."""
    return max(16, triton.next_power_of_2(D))


def _check_inputs(q, k, v, q_offset, params=()):
    """Validate q, k, v (and the (H,) per-head tensors in params: (name, tensor) pairs)."""
    if not HAS_TRITON:
        raise ImportError("kernels.py needs triton: pip install triton (Linux + CUDA), or use attn_impl='torch'")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Tq, D = q.shape
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
                         f"need q (B, H, Tq, D) and k, v both (B, H, Tk, D)")
    if D not in HEAD_DIMS:
        raise InputError(f"head dim {D} is not supported by the Triton kernels (supported: {HEAD_DIMS[0]} .. "
                         f"{HEAD_DIMS[-1]}); change n_embd/n_head, or use attn_impl='torch'")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q, k, v must share one dtype among float32/float16/bfloat16; "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(q_offset, int) or q_offset < 0 or k.shape[2] < q_offset + Tq:
        raise ValueError(f"need a Python int q_offset >= 0 with Tk >= q_offset + Tq; got q_offset={q_offset!r} "
                         f"({type(q_offset).__name__}), Tq={Tq}, Tk={k.shape[2]}")
    for name, p in params:
        if p.shape != (H,):
            raise ValueError(f"{name} must have shape (H,) = ({H},), got {tuple(p.shape)}")
    devices = {t.device for t in (q, k, v)} | {p.device for _, p in params}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}; "
                         f"move them with .to(q.device)")
    if q.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(f"the Triton kernels need CUDA tensors, got {q.device}: set TRITON_INTERPRET=1 to run "
                           f"the kernels on CPU, or use attn_impl='torch' (set it before kernels is imported)")


def _doc_table(doc_start, q, k, q_offset):
    """doc_start (B, T) from attention.document_starts → the kernels' (2, B, T) int32 table: row 0 doc_start
    (the first key each query sees), row 1 doc_end (per key j, the start of the next document, or T: one past
    the last query that sees j; the backward's dk/dv loop stops there). int32 because the kernels' positions
    are int32 (T < 2^31) and a (2, B, T) table is small next to q; one contiguous tensor, made here once per
    call. Without documents: a 1-element placeholder (never read). The values are not checked (that would
    cost a GPU sync per call): doc_start must be non-decreasing with doc_start[b, i] <= i, as
    document_starts returns it."""
    if doc_start is None:
        return torch.zeros(2, 1, device=q.device, dtype=torch.int32)
    B, _, Tq, _ = q.shape
    if q_offset != 0 or k.shape[2] != Tq:
        raise InputError(f"doc_start needs training-shaped calls, q_offset = 0 and Tq = Tk; got q_offset={q_offset}, "
                         f"Tq={Tq}, Tk={k.shape[2]}: pass doc_start=None with a KV cache")
    if (not isinstance(doc_start, torch.Tensor) or doc_start.shape != (B, Tq) or doc_start.is_floating_point()
            or doc_start.dtype == torch.bool):
        got = f"{tuple(doc_start.shape)} {doc_start.dtype}" if isinstance(doc_start, torch.Tensor) else repr(doc_start)
        raise InputError(f"doc_start must be an integer tensor of shape (B, T) = ({B}, {Tq}), got {got}: "
                         f"use attention.document_starts(doc_ids)")
    if doc_start.device != q.device:
        raise InputError(f"doc_start is on {doc_start.device}, q on {q.device}: move it with .to(q.device)")
    ds = doc_start.to(torch.int32)
    t = torch.arange(Tq, device=q.device, dtype=torch.int32)
    begins = torch.where(ds == t, t, Tq)  # (B, T): t where a document begins, else T
    after = torch.cat([begins[:, 1:], torch.full((B, 1), Tq, device=q.device, dtype=torch.int32)], dim=1)
    doc_end = after.flip(1).cummin(dim=1).values.flip(1)  # (B, T): the first document start after j, or T
    return torch.stack([ds, doc_end]).contiguous()  # (2, B, T)


def _device_of(q):
    """Triton launches on the current CUDA device: make it q's (cuda:1 without torch.cuda.set_device).
    The backward needs no guard: autograd runs it on the device of its tensors."""
    return torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext()


def _row_sums(o, do):
    """rowsum(dO ∘ O) in fp32, (B·H·Tq,): the Δ of the FlashAttention backward."""
    n_rows, D = o.numel() // o.shape[-1], o.shape[-1]
    delta = torch.empty(n_rows, device=o.device, dtype=torch.float32)
    _bwd_preprocess[(triton.cdiv(n_rows, 64),)](o, do, delta, n_rows, D=D, BLOCK_D=_block_d(D), BLOCK=64)
    return delta


# ----------------------------------------------------------------------------- GGD-BAM
# The per-head parameters travel packed: PRM is (4, H) = c = exp(log_scale), β, μ, s (s = 1 without SSMax),
# and the backward writes the gradients of log_scale, shape and ssmax_scale into DPRM, (3, B·H, programs).

@triton.jit
def _bam_logits(x, y, delta, f2, c, beta, mu, sm_scale, eps, DOT_PREC: tl.constexpr):
    """One tile of GGD-BAM logits, rows x against rows y: q against k, or k against q for a
    transposed tile, with delta = j − i and f2 = f·log2 e broadcast the same way.
    Returns z = f2·(s + b) (logits in log2 units), s = x·yᵀ/√D, the bias b = −c·(|Δ − μ| + ε)^β
    computed as exp2(β·log2(|Δ − μ| + ε)) and floored at BIAS_FLOOR, and log2(|Δ − μ| + ε) (for d/dβ)."""
    s = tl.dot(x, tl.trans(y), input_precision=DOT_PREC) * sm_scale
    log2_dist = _log2(tl.abs(delta.to(tl.float32) - mu) + eps)
    b = tl.maximum(-c * tl.exp2(beta * log2_dist), BIAS_FLOOR)
    return f2 * (s + b), s, b, log2_dist


@triton.jit
def _bam_fwd_step(q, K, V, start_n, pos_i, ds_i, f2, c, beta, mu, sm_scale, eps, m_i, l_i, acc, Tk,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_DOC: tl.constexpr):
    """The forward's work on key tile start_n .. start_n+BLOCK_N−1: logits, causal mask if CAUSAL, document
    mask (keys before the row's doc_start ds_i) if HAS_DOC, softmax step."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load(K, offs_n, Tk, D, 0, D, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
    z, _, _, _ = _bam_logits(q, k, offs_n[None, :] - pos_i[:, None], f2[:, None], c, beta, mu, sm_scale, eps,
                             DOT_PREC)  # (BLOCK_M, BLOCK_N)
    if CAUSAL:
        z = tl.where(offs_n[None, :] <= pos_i[:, None], z, float("-inf"))  # (also masks j >= Tk)
    if HAS_DOC:
        z = tl.where(offs_n[None, :] >= ds_i[:, None], z, float("-inf"))
    return _online_softmax_step(z, v, m_i, l_i, acc, DOT_PREC)


@triton.jit
def _bam_fwd(Q, K, V, O, LSE, PRM, DOC_START, q_offset, Tq, Tk, H, sm_scale, eps, HAS_SSMAX: tl.constexpr,
             HAS_DOC: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    h = bh % H  # PRM is (4, H): c = exp(log_scale), β, μ, s
    c, beta, mu, s = tl.load(PRM + h), tl.load(PRM + H + h), tl.load(PRM + 2 * H + h), tl.load(PRM + 3 * H + h)
    Q, O, LSE, K, V = Q + bh * Tq * D, O + bh * Tq * D, LSE + bh * Tq, K + bh * Tk * D, V + bh * Tk * D
    DOC_START += (bh // H) * Tq  # this batch row's doc_start (read only with HAS_DOC, where Tq = Tk)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    pos_i = q_offset + offs_m  # absolute query positions, (BLOCK_M,)
    ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M)  # first key of each row (0 without documents)
    q = _load(Q, offs_m, Tq, D, 0, D, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    f2 = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M) * LOG2E

    # running max (log2 units), running sum of exp2(z − m_i), accumulator (BLOCK_M, BLOCK_D)
    m_i, l_i, acc = _online_softmax_init(HAS_DOC, BLOCK_M, BLOCK_D)
    lo, hi = _causal_key_range(q_offset + start_m, Tk, BLOCK_M, BLOCK_N)
    first, mid = _doc_key_tiles(DOC_START, start_m, Tq, lo, BLOCK_M, BLOCK_N, HAS_DOC)  # (0, 0) without documents
    if HAS_DOC:  # key tiles below the diagonal holding the start of some row's document: document mask only
        for start_n in range(first, mid, BLOCK_N):
            m_i, l_i, acc = _bam_fwd_step(q, K, V, start_n, pos_i, ds_i, f2, c, beta, mu, sm_scale, eps, m_i, l_i,
                                          acc, Tk, D, BLOCK_D, BLOCK_N, DOT_PREC, CAUSAL=False, HAS_DOC=True)
    for start_n in range(mid, lo, BLOCK_N):  # key tiles every row of the tile sees whole: no mask
        m_i, l_i, acc = _bam_fwd_step(q, K, V, start_n, pos_i, ds_i, f2, c, beta, mu, sm_scale, eps, m_i, l_i, acc,
                                      Tk, D, BLOCK_D, BLOCK_N, DOT_PREC, CAUSAL=False, HAS_DOC=False)
    for start_n in range(lo, hi, BLOCK_N):  # key tiles across the diagonal
        m_i, l_i, acc = _bam_fwd_step(q, K, V, start_n, pos_i, ds_i, f2, c, beta, mu, sm_scale, eps, m_i, l_i, acc,
                                      Tk, D, BLOCK_D, BLOCK_N, DOT_PREC, CAUSAL=True, HAS_DOC=HAS_DOC)
    _store(O, acc / l_i[:, None], offs_m, Tq, D, 0, D, BLOCK_D)
    tl.store(LSE + offs_m, m_i + tl.log2(l_i), mask=offs_m < Tq)


@triton.jit
def _bam_bwd(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, PRM, DPRM, DOC_START, DOC_END, q_offset, Tq, Tk, H, sm_scale,
             eps, HAS_SSMAX: tl.constexpr, HAS_DOC: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
             DOT_PREC: tl.constexpr):
    # z = f·(s + b), dS = dL/dz = P∘(dP − rowsum(dO∘O)): dq = (dS·f)/√D @ k, dk = (dS·f)ᵀ/√D @ q,
    # dlog_scale = Σ dS·f·b, dshape = Σ dS·f·b·ln(dist), dssmax = Σ dS·log(n_i)·(s + b)
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    h = bh % H
    c, beta, mu, s = tl.load(PRM + h), tl.load(PRM + H + h), tl.load(PRM + 2 * H + h), tl.load(PRM + 3 * H + h)
    Q, DO, DQ, LSE, DELTA = Q + bh * Tq * D, DO + bh * Tq * D, DQ + bh * Tq * D, LSE + bh * Tq, DELTA + bh * Tq
    K, V, DK, DV = K + bh * Tk * D, V + bh * Tk * D, DK + bh * Tk * D, DV + bh * Tk * D
    DOC_START += (bh // H) * Tq
    DOC_END += (bh // H) * Tq

    # (1) dk, dv for keys start_n .. start_n+BLOCK_N1−1; tiles here are transposed, (keys, queries)
    start_n = pid * BLOCK_N1
    if start_n < Tk:
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        k = _load(K, offs_n, Tk, D, 0, D, BLOCK_D)  # (BLOCK_N1, BLOCK_D)
        v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
        dk = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
        lo = tl.maximum(start_n - q_offset, 0) // BLOCK_M1 * BLOCK_M1  # first query tile that sees key start_n
        hi = _doc_query_end(DOC_END, start_n, Tq, Tk, BLOCK_N1, HAS_DOC)  # queries from hi on see none of the tile
        for start_m in range(lo, hi, BLOCK_M1):
            offs_m = start_m + tl.arange(0, BLOCK_M1)
            pos_i = q_offset + offs_m
            ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M1)
            q = _load(Q, offs_m, Tq, D, 0, D, BLOCK_D)  # (BLOCK_M1, BLOCK_D)
            do = _load(DO, offs_m, Tq, D, 0, D, BLOCK_D)
            lse = tl.load(LSE + offs_m, mask=offs_m < Tq, other=0.0)
            Di = tl.load(DELTA + offs_m, mask=offs_m < Tq, other=0.0)
            f = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M1)
            zT, _, _, _ = _bam_logits(k, q, offs_n[:, None] - pos_i[None, :], f[None, :] * LOG2E, c, beta, mu,
                                      sm_scale, eps, DOT_PREC)  # (BLOCK_N1, BLOCK_M1)
            maskT = (offs_n[:, None] <= pos_i[None, :]) & (offs_m[None, :] < Tq)
            if HAS_DOC:
                maskT = maskT & (offs_n[:, None] >= ds_i[None, :])
            pT = tl.exp2(tl.where(maskT, zT - lse[None, :], float("-inf")))
            dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PREC)
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            # dS; a query at its document's start (query 0 without documents) sees one key, so its dS is exactly
            # 0 (left to rounding, it would be amplified by the huge diagonal bias −c·ε^β of a β < 0 head in
            # the per-head sums)
            dsT = tl.where(pos_i[None, :] > ds_i[None, :], pT * (dpT - Di[None, :]), 0.0)
            dk += tl.dot((dsT * f[None, :]).to(q.dtype), q, input_precision=DOT_PREC)
        _store(DK, dk * sm_scale, offs_n, Tk, D, 0, D, BLOCK_D)
        _store(DV, dv, offs_n, Tk, D, 0, D, BLOCK_D)

    # (2) dq for queries start_m .. start_m+BLOCK_M2−1, and this tile's share of the per-head sums
    start_m = pid * BLOCK_M2
    if start_m < Tq:
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        pos_i = q_offset + offs_m
        ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M2)
        row_ok = offs_m < Tq
        q = _load(Q, offs_m, Tq, D, 0, D, BLOCK_D)  # (BLOCK_M2, BLOCK_D)
        do = _load(DO, offs_m, Tq, D, 0, D, BLOCK_D)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=0.0)
        Di = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        log_n = tl.log((pos_i - ds_i + 1).to(tl.float32))
        f = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M2)
        dq = tl.zeros([BLOCK_M2, BLOCK_D], tl.float32)
        # Per-head sums, g_x = Σ_j dS·x = Σ_j P·dP·x − Δ_i·Σ_j P·x for x = b, b·log2(dist), s + b, with Δ_i
        # taken as this row's own Σ_j P·dP / Σ_j P (equal to rowsum(dO∘O) in exact arithmetic), so that
        # Σ_j dS = 0 holds to fp32 rounding. rowsum(dO∘O) from an O stored in bf16 is off by ~2^-9 per row,
        # and the recomputed P sums to 1 only up to the rounding of its logits (large under sharp attention
        # or a large bias); either error, times Σ_j P·x, would add up over every row (dq and dk keep Di).
        p_sum = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P
        pdp_sum = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·dP
        pdp_b = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·dP·b
        p_b = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·b
        pdp_bl = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·dP·b·log2(dist)
        p_bl = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·b·log2(dist)
        pdp_z = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·dP·(s + b)
        p_z = tl.zeros([BLOCK_M2], tl.float32)  # Σ_j P·(s + b)
        first = _doc_first_key_tile(DOC_START, start_m, BLOCK_N2, HAS_DOC)
        hi = tl.minimum(q_offset + start_m + BLOCK_M2, Tk)
        for start_n in range(first, hi, BLOCK_N2):
            offs_n = start_n + tl.arange(0, BLOCK_N2)
            k = _load(K, offs_n, Tk, D, 0, D, BLOCK_D)  # (BLOCK_N2, BLOCK_D)
            v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
            z, qk, b, log2_dist = _bam_logits(q, k, offs_n[None, :] - pos_i[:, None], f[:, None] * LOG2E, c, beta,
                                              mu, sm_scale, eps, DOT_PREC)  # (BLOCK_M2, BLOCK_N2)
            mask = (offs_n[None, :] <= pos_i[:, None]) & row_ok[:, None]
            if HAS_DOC:
                mask = mask & (offs_n[None, :] >= ds_i[:, None])
            p = tl.exp2(tl.where(mask, z - lse[:, None], float("-inf")))
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            ds = tl.where(pos_i[:, None] > ds_i[:, None], p * (dp - Di[:, None]), 0.0)  # see (1) for one key
            dq += tl.dot((ds * f[:, None]).to(k.dtype), k, input_precision=DOT_PREC)
            pdp = p * dp
            bl = b * log2_dist  # one rounding for both sums, so that a one-hot row cancels exactly
            p_sum += tl.sum(p, 1)
            pdp_sum += tl.sum(pdp, 1)
            pdp_b += tl.sum(pdp * b, 1)
            p_b += tl.sum(p * b, 1)
            pdp_bl += tl.sum(pdp * bl, 1)
            p_bl += tl.sum(p * bl, 1)
            if HAS_SSMAX:
                pdp_z += tl.sum(pdp * (qk + b), 1)
                p_z += tl.sum(p * (qk + b), 1)
        _store(DQ, dq * sm_scale, offs_m, Tq, D, 0, D, BLOCK_D)
        keep = row_ok & (pos_i > ds_i)  # a query with one key has dS = 0 (see (1)), padded rows have none
        delta_i = pdp_sum / tl.where(keep, p_sum, 1.0)  # Δ_i
        g_b = tl.where(keep, pdp_b - delta_i * p_b, 0.0)  # Σ_j dS·b            → dlog_scale = Σ_i f_i·g_b
        g_bl = tl.where(keep, pdp_bl - delta_i * p_bl, 0.0)  # Σ_j dS·b·log2(dist) → dshape = ln 2·Σ_i f_i·g_bl
        g_z = tl.where(keep, pdp_z - delta_i * p_z, 0.0)  # Σ_j dS·(s + b)      → dssmax = Σ_i log(n_i)·g_z
        slot = DPRM + bh * tl.num_programs(0) + pid  # DPRM is (3, B·H, programs), zero-filled
        n_slots = tl.num_programs(1) * tl.num_programs(0)
        tl.store(slot, tl.sum(f * g_b, 0))
        tl.store(slot + n_slots, tl.sum(f * g_bl, 0) * LN2)
        tl.store(slot + 2 * n_slots, tl.sum(log_n * g_z, 0))


class _BAMAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_scale, shape, mu, ssmax_scale, q_offset, doc, has_doc):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        (B, H, Tq, D), Tk = q.shape, k.shape[2]
        s = ssmax_scale if ssmax_scale is not None else torch.ones_like(shape)
        prm = torch.stack([log_scale.exp(), shape, mu, s]).float().contiguous()  # (4, H): c, β, μ, s
        o = torch.empty_like(q)
        lse = torch.empty(B * H, Tq, device=q.device, dtype=torch.float32)  # log2-sum-exp2 per row
        ctx.flags = dict(HAS_SSMAX=ssmax_scale is not None, HAS_DOC=has_doc,
                         D=D, BLOCK_D=_block_d(D))
        fwd, _ = _launch_kwargs(q)
        _bam_fwd[(triton.cdiv(Tq, fwd["BLOCK_M"]), B * H)](
            q, k, v, o, lse, prm, doc[0], q_offset, Tq, Tk, H, 1.0 / math.sqrt(D), GGD_EPS, **ctx.flags, **fwd)
        ctx.save_for_backward(q, k, v, o, lse, prm, doc)
        ctx.q_offset = q_offset
        ctx.dtypes = (log_scale.dtype, shape.dtype, s.dtype)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # no double backward: a clear error, not a wrong gradient
    def backward(ctx, do):
        q, k, v, o, lse, prm, doc = ctx.saved_tensors
        (B, H, Tq, D), Tk = q.shape, k.shape[2]
        _, bwd = _launch_kwargs(q)
        n_prog = max(triton.cdiv(Tk, bwd["BLOCK_N1"]), triton.cdiv(Tq, bwd["BLOCK_M2"]))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dprm = torch.zeros(3, B * H, n_prog, device=q.device, dtype=torch.float32)  # per-program partial sums
        do = do.contiguous()
        _bam_bwd[(n_prog, B * H)](
            q, k, v, do, dq, dk, dv, lse, _row_sums(o, do), prm, dprm, doc[0], doc[1], ctx.q_offset, Tq, Tk, H,
            1.0 / math.sqrt(D), GGD_EPS, **ctx.flags, **bwd)
        d_log_scale, d_shape, d_ssmax = dprm.view(3, B, H, n_prog).sum(dim=(1, 3))  # deterministic order
        d_ssmax = d_ssmax.to(ctx.dtypes[2]) if ctx.flags["HAS_SSMAX"] else None
        return dq, dk, dv, d_log_scale.to(ctx.dtypes[0]), d_shape.to(ctx.dtypes[1]), None, d_ssmax, None, None, None


def bam_attention(q, k, v, log_scale, shape, loc=None, ssmax_scale=None, q_offset=0, doc_start=None):
    """GGD-BAM attention (SPEC §1), optionally with SSMax (SPEC §2), as a fused Triton kernel.

    q: (B, H, Tq, D) at absolute positions q_offset .. q_offset+Tq−1; k, v: (B, H, Tk, D) at
    positions 0 .. Tk−1; causal (key j seen by query i iff j <= i; lower-right aligned when
    q_offset = Tk − Tq). log_scale, shape, loc, ssmax_scale: (H,) tensors (loc, ssmax_scale optional).
    Logits z_ij = f_i·(q·k/√D + b_h(i, j)), b_h = −exp(log_scale_h)·(|j − i − μ_h| + 1e-5)^shape_h,
    μ_h = exp(loc_h) − exp(−loc_h), f_i = ssmax_scale_h·log(n_i) (or 1 without SSMax); softmax
    in fp32. n_i = i + 1 keys seen. D any integer in 16 .. 128 (padded to a power of 2 inside the
    kernel); fp32/fp16/bf16. Returns (B, H, Tq, D) in q's dtype.

    doc_start: None, or (B, T) integer (attention.document_starts) for packed documents (training
    calls only: q_offset = 0, Tq = Tk): query i of row b then sees keys doc_start[b, i] <= j <= i,
    n_i = i − doc_start[b, i] + 1, and b_h still depends on j − i only. Key tiles of earlier
    documents are skipped, forward and backward.

    Differentiable in q, k, v, log_scale, shape and ssmax_scale, not in loc (a frozen buffer in
    SPEC §1; a loc that requires grad is refused). The per-head gradients are deterministic:
    partial sums per program, summed by torch (no atomics). Must equal
    attention_bam.bam_attention_ref (on each document alone). Under TRITON_INTERPRET=1, bf16 inputs
    are computed in fp32.
    Raises ValueError (InputError) for an unsupported head dim, mismatched shapes/dtypes/devices, a
    parameter not of shape (H,), Tk < q_offset + Tq, a loc requiring grad, or a doc_start not (B, T)
    integer or with q_offset != 0 or Tq != Tk; RuntimeError for CPU tensors without TRITON_INTERPRET=1;
    ImportError without triton.
    """
    params = [("log_scale", log_scale), ("shape", shape)]
    params += [(n, p) for n, p in (("loc", loc), ("ssmax_scale", ssmax_scale)) if p is not None]
    _check_inputs(q, k, v, q_offset, params)
    doc = _doc_table(doc_start, q, k, q_offset)
    if loc is not None and loc.requires_grad and torch.is_grad_enabled():
        raise ValueError("bam_attention does not differentiate loc (a frozen buffer, SPEC §1): pass loc.detach(), "
                         "or use attention_bam.bam_attention_ref")
    if INTERPRET and q.dtype == torch.bfloat16:  # the interpreter's tl.dot garbles bf16 (triton 3.9): use fp32
        return bam_attention(q.float(), k.float(), v.float(), log_scale, shape, loc, ssmax_scale, q_offset,
                             doc_start).bfloat16()
    mu = (torch.exp(loc) - torch.exp(-loc)).detach() if loc is not None else torch.zeros_like(shape).detach()
    with _device_of(q):
        return _BAMAttention.apply(q, k, v, log_scale, shape, mu, ssmax_scale, q_offset, doc, doc_start is not None)


# ----------------------------------------------------------------------------- TAPA
# q and k are loaded as two tiles each: the amplitude part (dims 0 .. D_AMP−1, zero padded to
# DA columns) and the phase part (dims D_AMP .. D−1, padded to DP); v and dO as one BLOCK_D-wide tile.
# With SSMax, PRM is (H,) = s, and the backward writes the gradient of ssmax_scale into DPRM, (B·H, programs).

@triton.jit
def _load_split(ptr, rows, n_rows, D: tl.constexpr, D_AMP: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr):
    """The amplitude part (columns 0 .. D_AMP−1, padded to DA) and the phase part (columns
    D_AMP .. D−1, padded to DP) of rows of a (n_rows, D) matrix, as two tiles (TAPA)."""
    return _load(ptr, rows, n_rows, D, 0, D_AMP, DA), _load(ptr, rows, n_rows, D, D_AMP, D - D_AMP, DP)


@triton.jit
def _store_split(ptr, xa, xp, rows, n_rows, D: tl.constexpr, D_AMP: tl.constexpr, DA: tl.constexpr,
                 DP: tl.constexpr):
    """Store the two tiles of _load_split back into their columns."""
    _store(ptr, xa, rows, n_rows, D, 0, D_AMP, DA)
    _store(ptr, xp, rows, n_rows, D, D_AMP, D - D_AMP, DP)


@triton.jit
def _tapa_terms(xa, xp, ya, yp, dist, amp_scale, ph_scale, alpha, w_diag, DOT_PREC: tl.constexpr,
                LINEAR: tl.constexpr):
    """One tile of TAPA terms, rows (xa | xp) against rows (ya | yp) (q against k, or k against q),
    dist = |i − j| in the same orientation. Returns the amplitude a = xa·yaᵀ/√d_amp, the weight
    w = 2π·dist^α (w_diag at dist = 0) and the angle w·φ, φ = xp·ypᵀ/√(D − d_amp) (quadratic phase) or
    (Σ xp + Σ yp)/√(D − d_amp) (LINEAR; the padded columns are 0, so the sums are exact); score = a·cos(w·φ)."""
    amp = tl.dot(xa, tl.trans(ya), input_precision=DOT_PREC) * amp_scale
    if LINEAR:
        phi = (tl.sum(xp.to(tl.float32), 1)[:, None] + tl.sum(yp.to(tl.float32), 1)[None, :]) * ph_scale
    else:
        phi = tl.dot(xp, tl.trans(yp), input_precision=DOT_PREC) * ph_scale
    dist_pow = tl.exp2(alpha * _log2(tl.maximum(dist, 1).to(tl.float32)))  # dist^α, as exp2(α·log2 dist)
    w = tl.where(dist == 0, w_diag, TWO_PI * dist_pow)
    return amp, w, w * phi


@triton.jit
def _tapa_fwd_step(q_a, q_p, K, V, start_n, pos_i, ds_i, f2, amp_scale, ph_scale, alpha, w_diag, m_i, l_i, acc,
                   Tk, D: tl.constexpr, BLOCK_D: tl.constexpr, D_AMP: tl.constexpr, DA: tl.constexpr,
                   DP: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_DOC: tl.constexpr, HAS_SSMAX: tl.constexpr, LINEAR: tl.constexpr):
    """The forward's work on key tile start_n .. start_n+BLOCK_N−1, as _bam_fwd_step; f2 = f·log2 e (SSMax)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_a, k_p = _load_split(K, offs_n, Tk, D, D_AMP, DA, DP)
    v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
    amp, _, angle = _tapa_terms(q_a, q_p, k_a, k_p, pos_i[:, None] - offs_n[None, :], amp_scale, ph_scale,
                                alpha, w_diag, DOT_PREC, LINEAR)  # (BLOCK_M, BLOCK_N)
    if HAS_SSMAX:
        z = amp * _cos(angle) * f2[:, None]
    else:
        z = amp * _cos(angle) * LOG2E
    if CAUSAL:
        z = tl.where(offs_n[None, :] <= pos_i[:, None], z, float("-inf"))
    if HAS_DOC:
        z = tl.where(offs_n[None, :] >= ds_i[:, None], z, float("-inf"))
    return _online_softmax_step(z, v, m_i, l_i, acc, DOT_PREC)


@triton.jit
def _tapa_fwd(Q, K, V, O, LSE, PRM, DOC_START, q_offset, Tq, Tk, H, amp_scale, ph_scale, alpha, w_diag,
              HAS_SSMAX: tl.constexpr, HAS_DOC: tl.constexpr, LINEAR: tl.constexpr, D: tl.constexpr,
              BLOCK_D: tl.constexpr, D_AMP: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    s = 1.0
    if HAS_SSMAX:
        s = tl.load(PRM + bh % H)
    Q, O, LSE, K, V = Q + bh * Tq * D, O + bh * Tq * D, LSE + bh * Tq, K + bh * Tk * D, V + bh * Tk * D
    DOC_START += (bh // H) * Tq

    offs_m = start_m + tl.arange(0, BLOCK_M)
    pos_i = q_offset + offs_m
    ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M)
    f2 = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M) * LOG2E
    q_a, q_p = _load_split(Q, offs_m, Tq, D, D_AMP, DA, DP)
    m_i, l_i, acc = _online_softmax_init(HAS_DOC, BLOCK_M, BLOCK_D)
    lo, hi = _causal_key_range(q_offset + start_m, Tk, BLOCK_M, BLOCK_N)
    first, mid = _doc_key_tiles(DOC_START, start_m, Tq, lo, BLOCK_M, BLOCK_N, HAS_DOC)  # as in _bam_fwd
    if HAS_DOC:  # key tiles holding the start of some row's document: document mask only
        for start_n in range(first, mid, BLOCK_N):
            m_i, l_i, acc = _tapa_fwd_step(q_a, q_p, K, V, start_n, pos_i, ds_i, f2, amp_scale, ph_scale, alpha,
                                           w_diag, m_i, l_i, acc, Tk, D, BLOCK_D, D_AMP, DA, DP, BLOCK_N, DOT_PREC,
                                           CAUSAL=False, HAS_DOC=True, HAS_SSMAX=HAS_SSMAX, LINEAR=LINEAR)
    for start_n in range(mid, lo, BLOCK_N):  # key tiles every row of the tile sees whole: no mask
        m_i, l_i, acc = _tapa_fwd_step(q_a, q_p, K, V, start_n, pos_i, ds_i, f2, amp_scale, ph_scale, alpha, w_diag,
                                       m_i, l_i, acc, Tk, D, BLOCK_D, D_AMP, DA, DP, BLOCK_N, DOT_PREC,
                                       CAUSAL=False, HAS_DOC=False, HAS_SSMAX=HAS_SSMAX, LINEAR=LINEAR)
    for start_n in range(lo, hi, BLOCK_N):  # key tiles across the diagonal
        m_i, l_i, acc = _tapa_fwd_step(q_a, q_p, K, V, start_n, pos_i, ds_i, f2, amp_scale, ph_scale, alpha, w_diag,
                                       m_i, l_i, acc, Tk, D, BLOCK_D, D_AMP, DA, DP, BLOCK_N, DOT_PREC,
                                       CAUSAL=True, HAS_DOC=HAS_DOC, HAS_SSMAX=HAS_SSMAX, LINEAR=LINEAR)
    _store(O, acc / l_i[:, None], offs_m, Tq, D, 0, D, BLOCK_D)
    tl.store(LSE + offs_m, m_i + tl.log2(l_i), mask=offs_m < Tq)


@triton.jit
def _tapa_bwd(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, PRM, DPRM, DOC_START, DOC_END, q_offset, Tq, Tk, H, amp_scale,
              ph_scale, alpha, w_diag, HAS_SSMAX: tl.constexpr, HAS_DOC: tl.constexpr, LINEAR: tl.constexpr,
              D: tl.constexpr, BLOCK_D: tl.constexpr, D_AMP: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr,
              BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
              DOT_PREC: tl.constexpr):
    # z = f·score, score = a·cos(wφ): dS = dL/dz = P∘(dP − Δ); dscore = dS·f; dscore/da = cos(wφ),
    # dscore/dφ = −a·w·sin(wφ); a and φ are scaled dot products (φ a scaled sum for the linear phase,
    # whose gradient is the same for every phase column); dssmax = Σ dS·log(n_i)·score
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    s = 1.0
    if HAS_SSMAX:
        s = tl.load(PRM + bh % H)
    Q, DO, DQ, LSE, DELTA = Q + bh * Tq * D, DO + bh * Tq * D, DQ + bh * Tq * D, LSE + bh * Tq, DELTA + bh * Tq
    K, V, DK, DV = K + bh * Tk * D, V + bh * Tk * D, DK + bh * Tk * D, DV + bh * Tk * D
    DOC_START += (bh // H) * Tq
    DOC_END += (bh // H) * Tq

    # (1) dk (both parts) and dv for key tile pid; tiles are transposed, (keys, queries)
    start_n = pid * BLOCK_N1
    if start_n < Tk:
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        k_a, k_p = _load_split(K, offs_n, Tk, D, D_AMP, DA, DP)
        v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
        dk_a = tl.zeros([BLOCK_N1, DA], tl.float32)
        dk_p = tl.zeros([BLOCK_N1, DP], tl.float32)
        dv = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
        lo = tl.maximum(start_n - q_offset, 0) // BLOCK_M1 * BLOCK_M1
        hi = _doc_query_end(DOC_END, start_n, Tq, Tk, BLOCK_N1, HAS_DOC)
        for start_m in range(lo, hi, BLOCK_M1):
            offs_m = start_m + tl.arange(0, BLOCK_M1)
            pos_i = q_offset + offs_m
            ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M1)
            q_a, q_p = _load_split(Q, offs_m, Tq, D, D_AMP, DA, DP)
            do = _load(DO, offs_m, Tq, D, 0, D, BLOCK_D)
            lse = tl.load(LSE + offs_m, mask=offs_m < Tq, other=0.0)
            Di = tl.load(DELTA + offs_m, mask=offs_m < Tq, other=0.0)
            ampT, wT, angleT = _tapa_terms(k_a, k_p, q_a, q_p, pos_i[None, :] - offs_n[:, None], amp_scale, ph_scale,
                                           alpha, w_diag, DOT_PREC, LINEAR)  # (BLOCK_N1, BLOCK_M1)
            cosT = _cos(angleT)
            maskT = (offs_n[:, None] <= pos_i[None, :]) & (offs_m[None, :] < Tq)
            if HAS_DOC:
                maskT = maskT & (offs_n[:, None] >= ds_i[None, :])
            zT = ampT * cosT * LOG2E
            if HAS_SSMAX:
                f = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M1)
                zT = zT * f[None, :]
            pT = tl.exp2(tl.where(maskT, zT - lse[None, :], float("-inf")))
            dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PREC)
            dsT = pT * (tl.dot(v, tl.trans(do), input_precision=DOT_PREC) - Di[None, :])
            if HAS_SSMAX:
                dsT = dsT * f[None, :]  # the gradient of the score
            dk_a += tl.dot((dsT * cosT * amp_scale).to(q_a.dtype), q_a, input_precision=DOT_PREC)
            dphiT = -dsT * ampT * wT * _sin(angleT) * ph_scale  # the gradient of xp·ypᵀ (or of Σ xp + Σ yp)
            if LINEAR:
                dk_p += tl.sum(dphiT, 1)[:, None]  # (BLOCK_N1, 1) onto every phase column
            else:
                dk_p += tl.dot(dphiT.to(q_p.dtype), q_p, input_precision=DOT_PREC)
        _store_split(DK, dk_a, dk_p, offs_n, Tk, D, D_AMP, DA, DP)
        _store(DV, dv, offs_n, Tk, D, 0, D, BLOCK_D)

    # (2) dq (both parts) for query tile pid, and with SSMax this tile's share of dssmax
    start_m = pid * BLOCK_M2
    if start_m < Tq:
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        pos_i = q_offset + offs_m
        ds_i = _doc_starts(DOC_START, offs_m, Tq, HAS_DOC, BLOCK_M2)
        row_ok = offs_m < Tq
        q_a, q_p = _load_split(Q, offs_m, Tq, D, D_AMP, DA, DP)
        do = _load(DO, offs_m, Tq, D, 0, D, BLOCK_D)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=0.0)
        Di = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        f = _ssmax_factor(pos_i - ds_i, s, HAS_SSMAX, BLOCK_M2)
        dq_a = tl.zeros([BLOCK_M2, DA], tl.float32)
        dq_p = tl.zeros([BLOCK_M2, DP], tl.float32)
        # dssmax = Σ_i log(n_i)·(Σ_j P·dP·score − Δ_i·Σ_j P·score), Δ_i = Σ_j P·dP / Σ_j P, as in _bam_bwd
        p_sum = tl.zeros([BLOCK_M2], tl.float32)
        pdp_sum = tl.zeros([BLOCK_M2], tl.float32)
        pdp_z = tl.zeros([BLOCK_M2], tl.float32)
        p_z = tl.zeros([BLOCK_M2], tl.float32)
        first = _doc_first_key_tile(DOC_START, start_m, BLOCK_N2, HAS_DOC)
        hi = tl.minimum(q_offset + start_m + BLOCK_M2, Tk)
        for start_n in range(first, hi, BLOCK_N2):
            offs_n = start_n + tl.arange(0, BLOCK_N2)
            k_a, k_p = _load_split(K, offs_n, Tk, D, D_AMP, DA, DP)
            v = _load(V, offs_n, Tk, D, 0, D, BLOCK_D)
            amp, w, angle = _tapa_terms(q_a, q_p, k_a, k_p, pos_i[:, None] - offs_n[None, :], amp_scale, ph_scale,
                                        alpha, w_diag, DOT_PREC, LINEAR)  # (BLOCK_M2, BLOCK_N2)
            cos = _cos(angle)
            mask = (offs_n[None, :] <= pos_i[:, None]) & row_ok[:, None]
            if HAS_DOC:
                mask = mask & (offs_n[None, :] >= ds_i[:, None])
            score = amp * cos
            z = score * LOG2E
            if HAS_SSMAX:
                z = z * f[:, None]
            p = tl.exp2(tl.where(mask, z - lse[:, None], float("-inf")))
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            ds = p * (dp - Di[:, None])
            if HAS_SSMAX:
                pdp = p * dp
                p_sum += tl.sum(p, 1)
                pdp_sum += tl.sum(pdp, 1)
                pdp_z += tl.sum(pdp * score, 1)
                p_z += tl.sum(p * score, 1)
                ds = ds * f[:, None]  # the gradient of the score
            dq_a += tl.dot((ds * cos * amp_scale).to(k_a.dtype), k_a, input_precision=DOT_PREC)
            dphi = -ds * amp * w * _sin(angle) * ph_scale
            if LINEAR:
                dq_p += tl.sum(dphi, 1)[:, None]
            else:
                dq_p += tl.dot(dphi.to(k_p.dtype), k_p, input_precision=DOT_PREC)
        _store_split(DQ, dq_a, dq_p, offs_m, Tq, D, D_AMP, DA, DP)
        if HAS_SSMAX:
            keep = row_ok & (pos_i > ds_i)  # a query with one key has dS = 0, padded rows have none
            delta_i = pdp_sum / tl.where(keep, p_sum, 1.0)
            g_z = tl.where(keep, pdp_z - delta_i * p_z, 0.0)  # Σ_j dS·score
            log_n = tl.log((pos_i - ds_i + 1).to(tl.float32))
            tl.store(DPRM + bh * tl.num_programs(0) + pid, tl.sum(log_n * g_z, 0))  # DPRM: (B·H, programs)


class _TAPAAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, d_amp, alpha, q_offset, ssmax_scale, linear, doc, has_doc):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        (B, H, Tq, D), Tk = q.shape, k.shape[2]
        o = torch.empty_like(q)
        lse = torch.empty(B * H, Tq, device=q.device, dtype=torch.float32)
        prm = (ssmax_scale if ssmax_scale is not None else torch.ones(H, device=q.device)).float().contiguous()
        w_diag = 2 * math.pi if alpha == 0 else 0.0  # w = 2π·|i − j|^α at i = j (0^0 = 1)
        ctx.args = (q_offset, Tq, Tk, H, 1.0 / math.sqrt(d_amp), 1.0 / math.sqrt(D - d_amp), alpha, w_diag)
        ctx.flags = dict(HAS_SSMAX=ssmax_scale is not None, HAS_DOC=has_doc, LINEAR=linear, D=D,
                         BLOCK_D=_block_d(D), D_AMP=d_amp, DA=_block_d(d_amp), DP=_block_d(D - d_amp))
        fwd, _ = _launch_kwargs(q)
        _tapa_fwd[(triton.cdiv(Tq, fwd["BLOCK_M"]), B * H)](q, k, v, o, lse, prm, doc[0], *ctx.args, **ctx.flags,
                                                              **fwd)
        ctx.save_for_backward(q, k, v, o, lse, prm, doc)
        ctx.s_dtype = ssmax_scale.dtype if ssmax_scale is not None else None
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # no double backward: a clear error, not a wrong gradient
    def backward(ctx, do):
        q, k, v, o, lse, prm, doc = ctx.saved_tensors
        (B, H, Tq, _), Tk = q.shape, k.shape[2]
        _, bwd = _launch_kwargs(q)
        n_prog = max(triton.cdiv(Tk, bwd["BLOCK_N1"]), triton.cdiv(Tq, bwd["BLOCK_M2"]))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dprm = torch.zeros(B * H, n_prog, device=q.device, dtype=torch.float32)  # per-program partial sums
        do = do.contiguous()
        _tapa_bwd[(n_prog, B * H)](q, k, v, do, dq, dk, dv, lse, _row_sums(o, do), prm, dprm, doc[0], doc[1],
                                   *ctx.args, **ctx.flags, **bwd)
        d_ssmax = dprm.view(B, H, n_prog).sum(dim=(0, 2)).to(ctx.s_dtype) if ctx.flags["HAS_SSMAX"] else None
        return dq, dk, dv, None, None, None, d_ssmax, None, None, None


def tapa_attention(q, k, v, theta=0.5, alpha=0.1, q_offset=0, ssmax_scale=None, phase="quadratic", doc_start=None):
    """TAPA attention (SPEC §3), optionally with SSMax (SPEC §2), as a fused Triton kernel.

    q: (B, H, Tq, D) at positions q_offset.., k, v: (B, H, Tk, D); causal as in bam_attention.
    score_ij = (q_A·k_A/√d_amp)·cos(2π·|i − j|^alpha·φ_ij), d_amp = round(theta·D)
    (attention_tapa.tapa_split: the first d_amp dims are the amplitude part), φ_ij = q_P·k_P/√(D − d_amp)
    for phase "quadratic", (Σ q_P + Σ k_P)/√(D − d_amp) for phase "linear" (the paper's ablation), as
    attention_tapa.tapa_scores. ssmax_scale: None or (H,) s_h; the score is then multiplied by
    f_i = s_h·log(n_i). Then a causal fp32 softmax on the score (no extra 1/√D). doc_start: None or (B, T)
    from attention.document_starts, as in bam_attention (q_offset = 0, Tq = Tk; n_i counts the keys of the
    query's document; |i − j| is unchanged). D any integer in 16 .. 128.
    Returns (B, H, Tq, D) in q's dtype; differentiable in q, k, v and ssmax_scale (deterministic per-program
    partial sums). Must equal attention_tapa.tapa_attention_ref (on each document alone). |i − j|^alpha is
    exp2(alpha·log2|i − j|): for alpha > 1 (the paper uses 0.1) its rounding, times the large angle,
    makes the result a few times less accurate than the reference's pow (still ~4e-4 in fp32 at alpha = 2).
    Raises ValueError (InputError) for an unsupported head dim, a theta leaving an empty part, alpha < 0,
    an unknown phase, an ssmax_scale not of shape (H,), mismatched shapes/dtypes/devices, Tk < q_offset + Tq,
    or a doc_start not (B, T) integer or with q_offset != 0 or Tq != Tk; RuntimeError for CPU tensors
    without TRITON_INTERPRET=1; ImportError without triton.
    """
    _check_inputs(q, k, v, q_offset, [("ssmax_scale", ssmax_scale)] if ssmax_scale is not None else [])
    if alpha < 0:
        raise InputError(f"tapa alpha must be >= 0 (|i − j|^alpha is infinite at i = j otherwise), got {alpha}")
    if phase not in TAPA_PHASES:
        raise InputError(f"tapa phase must be one of {TAPA_PHASES}, got {phase!r}")
    doc = _doc_table(doc_start, q, k, q_offset)
    if INTERPRET and q.dtype == torch.bfloat16:  # as in bam_attention
        return tapa_attention(q.float(), k.float(), v.float(), theta, alpha, q_offset, ssmax_scale, phase,
                              doc_start).bfloat16()
    with _device_of(q):
        return _TAPAAttention.apply(q, k, v, tapa_split(q.shape[-1], theta), float(alpha), q_offset, ssmax_scale,
                                    phase == "linear", doc, doc_start is not None)
