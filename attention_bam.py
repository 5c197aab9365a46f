"""
GGD-BAM: attention with a Generalized-Gaussian positional prior (SPEC §1),
scalable softmax (SSMax, SPEC §2), ALiBi slopes (SPEC §4), and the chunked
reference attention that every non-SDPA variant of model.py runs on.

Notation (SPEC): query position i, key position j <= i, distance Δ = j − i.
All positions are absolute, so the same code serves training, chunked
prefill and token-by-token decoding with a KV cache.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

GGD_EPS = 1e-5  # ε in b = −c·(|Δ − μ| + ε)^β (SPEC §1)
# A floor for the GGD bias. With shape β < −7.7 the diagonal's −c·ε^β overflows fp32 to −inf, and query 0, which
# sees only that key, would get NaN (0·inf under SSMax, or a softmax over −inf alone). A floored logit still gets
# P = 0 wherever any other key is visible, and P = 1 where it is the only key, as the exact value would.
BIAS_FLOOR = -1e30


def alibi_slopes(n_head):
    """ALiBi slopes, SPEC §1/§4 (Press et al. 2022).

    For n_head a power of 2: slope_k = 2^(−8k/n_head), k = 1..n_head. Otherwise
    the slopes of the nearest lower power of 2, then every other slope of the
    power of 2 twice as large, until there are n_head of them.
    Returns a float32 tensor of shape (n_head,). Raises ValueError if n_head < 1.
    """
    if n_head < 1:
        raise ValueError(f"n_head must be >= 1, got {n_head}")

    def power_of_2_slopes(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    n = 2 ** int(math.floor(math.log2(n_head)))
    slopes = power_of_2_slopes(n)
    if n < n_head:
        slopes += power_of_2_slopes(2 * n)[0::2][: n_head - n]
    return torch.tensor(slopes, dtype=torch.float32)


def ggd_bias(q_pos, k_pos, log_scale, shape, loc=None):
    """The GGD-BAM prior b_h(i, j) = −exp(log_scale_h)·(|Δ − μ_h| + ε)^shape_h, SPEC §1.

    q_pos: (Tq,) and k_pos: (Tk,) absolute positions (integer or float tensors).
    log_scale, shape: (H,) per-head parameters θ_scale and β; loc: (H,) θ_loc or
    None (= 0), with μ = exp(loc) − exp(−loc). Δ = k_pos − q_pos, ε = 1e-5.
    Returns a (H, Tq, Tk) tensor in the parameters' dtype; it is defined for
    every (i, j), the causal mask is applied by the caller. shape < 0 is allowed
    (the diagonal then gets the large negative bias −c·ε^β, floored at BIAS_FLOOR).
    """
    delta = (k_pos[None, :] - q_pos[:, None]).to(log_scale.dtype)  # (Tq, Tk)
    dist = delta[None]  # (1, Tq, Tk)
    if loc is not None:
        mu = torch.exp(loc) - torch.exp(-loc)  # (H,)
        dist = dist - mu[:, None, None]
    dist = dist.abs() + GGD_EPS
    return (-torch.exp(log_scale)[:, None, None] * dist.pow(shape[:, None, None])).clamp(min=BIAS_FLOOR)


def alibi_bias(q_pos, k_pos, slopes):
    """ALiBi bias b_h(i, j) = −slope_h·|Δ|, SPEC §4. Shapes as in ggd_bias: (H, Tq, Tk)."""
    delta = (k_pos[None, :] - q_pos[:, None]).to(slopes.dtype)
    return -slopes[:, None, None] * delta.abs()[None]


def per_head_shape_init(shape_init, n_head):
    """β of every head at init (SPEC §1, the authors' options), as a float32 tensor (n_head,).

    shape_init: a number (every head), "linear" = linspace(0, 1, n_head) (head 0 flat, the
    last head Laplace = ALiBi), or a list/tuple of n_head numbers. Raises ValueError otherwise.
    """
    if shape_init == "linear":
        return torch.linspace(0.0, 1.0, n_head)
    values = list(shape_init) if isinstance(shape_init, (list, tuple)) else [shape_init] * n_head
    try:
        beta = torch.tensor([float(x) for x in values], dtype=torch.float32)
    except (TypeError, ValueError):
        beta = None
    if beta is None or len(beta) != n_head or not torch.isfinite(beta).all():
        raise ValueError(f"bam_shape_init must be a number, 'linear' or {n_head} numbers (one per head), "
                         f"got {shape_init!r}")
    return beta


class GGDPrior(nn.Module):
    """Learnable GGD-BAM prior of one layer (or of all layers when shared), SPEC §1.

    Parameters (trainable, no weight decay): log_scale (H,) = θ_scale and
    shape (H,) = β. loc (H,) = θ_loc is a frozen buffer at 0, so the module adds
    exactly 2·H parameters. scale_init "alibi" sets c = exp(log_scale) to the ALiBi
    slopes, so that with shape_init = 1 BAM equals ALiBi at initialisation; a
    number sets every head's c to it. shape_init: see per_head_shape_init.
    Each parameter carries `optim_group` ("bam_scale", "bam_shape"): train.py gives
    those groups no weight decay and their own learning-rate multiplier.
    Raises ValueError for a non-positive scale or a malformed shape_init.
    """

    def __init__(self, n_head, shape_init=1.0, scale_init="alibi"):
        super().__init__()
        if scale_init == "alibi":
            scale = alibi_slopes(n_head)
        else:
            try:
                scale = torch.full((n_head,), float(scale_init))
            except ValueError:
                scale = torch.zeros(1)
            if not (scale > 0).all():
                raise ValueError(f"bam_scale_init must be 'alibi' or a number > 0, got {scale_init!r}")
        self.log_scale = nn.Parameter(torch.log(scale))
        self.shape = nn.Parameter(per_head_shape_init(shape_init, n_head))
        self.log_scale.optim_group, self.shape.optim_group = "bam_scale", "bam_shape"
        self.register_buffer("loc", torch.zeros(n_head))

    def forward(self, q_pos, k_pos):
        """Bias of shape (H, Tq, Tk) for absolute positions q_pos (Tq,), k_pos (Tk,)."""
        return ggd_bias(q_pos, k_pos, self.log_scale, self.shape, self.loc)


def ssmax_factor(scale, q_pos, dtype=None):
    """The SSMax factor f_i = s_h·log(n_i), n_i = i + 1 keys seen by the query at absolute position i (SPEC §2).

    scale: (H,) s_h; q_pos: (Tq,) positions. Returns (H, Tq, 1) in `dtype` (default scale's). The one
    definition every torch path uses (kernels.py computes the same in its kernels; tests compare them).
    """
    dtype = dtype or scale.dtype
    return scale.to(dtype)[:, None, None] * torch.log(q_pos.to(dtype) + 1)[None, :, None]


class SSMax(nn.Module):
    """Scalable softmax, SPEC §2: the logits of query i are multiplied by s_h·log(n_i).

    n_i = number of keys query i sees = absolute position + 1 (plain causal mask,
    also with a KV cache). s (H,) is learnable, no weight decay, init `init`: 1.0
    as in the BAM code, or about 1/mean(ln n) over the training context (0.168 for
    1024 in third-party code), which keeps the factor near 1 at the training length.
    """

    def __init__(self, n_head, init=1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.full((n_head,), float(init)))
        self.scale.optim_group = "ssmax"  # no weight decay, own learning-rate multiplier (train.py)

    def forward(self, q_pos):
        """Factor s_h·log(q_pos + 1) of shape (H, Tq, 1) for positions q_pos (Tq,)."""
        return ssmax_factor(self.scale, q_pos)


def distance_bias(bias_fn, q_offset, tq, tk, device):
    """The bias of queries q_offset..q_offset+tq−1 against keys 0..tk−1 as a (H, tq, tk) tensor.

    bias_fn(q_pos, k_pos) -> (H, len(q_pos), len(k_pos)) must depend on the distance
    k_pos − q_pos only (true of ALiBi and GGD-BAM). It is evaluated once on the
    tq + tk − 1 distinct distances, and the (tq, tk) Toeplitz matrix is read from that
    1-D profile through a sliding window: no pow per (i, j) pair.
    """
    # r[m] = bias at distance i − j = (q_offset + tq − 1) − m, for m = 0 .. tq+tk−2
    dist = torch.arange(q_offset + tq - 1, q_offset - tk, -1, device=device)
    r = bias_fn(torch.zeros(1, device=device), -dist)[:, 0]  # (H, tq+tk−1)
    # window w of r is the row of query a = tq − 1 − w: flip the windows into query order
    return r.unfold(-1, tk, 1).flip(-2)  # (H, tq, tk)


def reference_attention(q, k, v, q_offset=0, bias_fn=None, ssmax_scale=None,
                        bias_in_ssmax=True, score_fn=None, dropout_p=0.0, chunk_size=256):
    """Causal attention with a positional bias and/or SSMax, one chunk of queries at a time.

    q: (B, H, Tq, D) at absolute positions q_offset .. q_offset+Tq−1;
    k, v: (B, H, Tk, D) at positions 0 .. Tk−1; causal: key j is seen by query i
    iff j <= i (lower-right aligned when q_offset = Tk − Tq).
    Logits z_ij = q·k/√D plus bias_fn(q_pos, k_pos) → (H, tq, tk) if given (a function
    of k_pos − q_pos only: see distance_bias). With ssmax_scale (H,), SSMax multiplies
    by f_i = s_h·log(i + 1) either (q·k/√D + b) (bias_in_ssmax, BAM, SPEC §2) or
    q·k/√D alone with the bias added after (ALiBi and the other baselines).
    score_fn(q, k, q_pos, k_pos) → (B, H, tq, tk) replaces q·k/√D + b (TAPA).
    Memory: scores of at most (B, H, chunk_size, Tk), never Tq × Tk.
    Returns (B, H, Tq, D) in v's dtype. Raises ValueError if Tk < q_offset + Tq.
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk < q_offset + Tq:
        raise ValueError(f"need keys for positions up to {q_offset + Tq - 1}, got Tk={Tk}")
    out = torch.empty_like(q, dtype=v.dtype)
    for c0 in range(0, Tq, chunk_size):
        c1 = min(c0 + chunk_size, Tq)
        t0, tq, tk = q_offset + c0, c1 - c0, q_offset + c1  # keys past the chunk's last query are all masked
        q_pos = torch.arange(t0, t0 + tq, device=q.device)  # (tq,)
        qc, kc, vc = q[:, :, c0:c1], k[:, :, :tk], v[:, :, :tk]
        # SSMax factor f_i = s_h·log(i + 1), and the causal mask: only the last tq keys can lie in a query's future
        f = None
        if ssmax_scale is not None:
            f = ssmax_factor(ssmax_scale, q_pos, q.dtype)  # (H, tq, 1)
        future = torch.ones(tq, tq, dtype=torch.bool, device=q.device).triu(1)  # (tq, tq)
        if score_fn is not None:  # explicit scores (TAPA), softmax in fp32
            z = score_fn(qc, kc, q_pos, torch.arange(tk, device=q.device)).float()  # (B, H, tq, tk)
            z = z if f is None else f.float() * z
            z = torch.cat([z[..., :t0], z[..., t0:].masked_fill(future, float("-inf"))], dim=-1)
            att = F.dropout(F.softmax(z, dim=-1), p=dropout_p) if dropout_p > 0 else F.softmax(z, dim=-1)
            out[:, :, c0:c1] = (att @ vc.float()).to(v.dtype)
            continue
        # z = f·(q·k/√D + b) = (f·q)·k/√D + f·b: SSMax folds into q and the bias, SDPA does the rest
        mask = torch.zeros(1, tq, tk, device=q.device, dtype=q.dtype)  # (1 or H, tq, tk)
        if bias_fn is not None:
            mask = distance_bias(bias_fn, t0, tq, tk, q.device)
        if f is not None:
            qc = qc * f
            if bias_fn is not None and bias_in_ssmax:
                mask = f * mask
        mask = mask.to(q.dtype)  # a fresh tensor here, so the in-place causal fill is safe for autograd
        if q.dtype == torch.float16:  # a large negative bias (a GGD shape < 0) overflows fp16 to −inf, and query 0
            mask.clamp_(min=torch.finfo(torch.float16).min)  # (one key) would get NaN; fp32/bf16: BIAS_FLOOR
        mask[..., t0:].masked_fill_(future, float("-inf"))
        out[:, :, c0:c1] = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask[None], dropout_p=dropout_p)
    return out


def bam_attention_ref(q, k, v, log_scale, shape, loc=None, ssmax_scale=None, q_offset=0, chunk_size=256):
    """GGD-BAM attention (SPEC §1, with SSMax SPEC §2), PyTorch reference and oracle for kernels.py.

    q: (B, H, Tq, D), k, v: (B, H, Tk, D); log_scale, shape, loc, ssmax_scale: (H,).
    z_ij = f_i·(q·k/√D + b_h(i, j)) with f_i = s_h·log(i + 1) under SSMax, else f_i = 1;
    causal softmax (lower-right aligned through q_offset). Returns (B, H, Tq, D).
    Differentiable in every input, the prior parameters included.
    """
    return reference_attention(
        q, k, v, q_offset=q_offset, ssmax_scale=ssmax_scale, chunk_size=chunk_size,
        bias_fn=lambda qp, kp: ggd_bias(qp, kp, log_scale, shape, loc))
