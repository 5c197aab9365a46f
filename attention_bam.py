"""
GGD-BAM: attention with a Generalized-Gaussian positional prior (SPEC §1), on the
generic core of attention.py (chunked reference attention, SSMax, ALiBi slopes).

Notation (SPEC): query position i, key position j <= i, distance Δ = j − i.
All positions are absolute, so the same code serves training, chunked
prefill and token-by-token decoding with a KV cache.
"""

import torch
import torch.nn as nn

from attention import alibi_slopes, reference_attention

GGD_EPS = 1e-5  # ε in b = −c·(|Δ − μ| + ε)^β (SPEC §1)
# A floor for the GGD bias. With shape β < −7.7 the diagonal's −c·ε^β overflows fp32 to −inf, and query 0, which
# sees only that key, would get NaN (0·inf under SSMax, or a softmax over −inf alone). A floored logit still gets
# P = 0 wherever any other key is visible, and P = 1 where it is the only key, as the exact value would.
BIAS_FLOOR = -1e30


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
        raise ValueError(f"bam_shape_init must be a number, 'linear' or {n_head} numbers (one per head, n_head = "
                         f"{n_head}), got {shape_init!r}: give {n_head} numbers, or 'linear' "
                         f"(e.g. --bam_shape_init=\"[1, 'linear']\" with the CPU demo's config, whose list is for 4 heads)")
    return beta


def is_per_layer(shape_init):
    """True if bam_shape_init gives one entry per layer: a list holding a list or a word, e.g. [1, "linear"]
    or [[1, 1, 1, 1], [0, 1, 1, 1]]. A list of numbers alone is one value per head."""
    return isinstance(shape_init, (list, tuple)) and any(isinstance(x, (list, tuple, str)) for x in shape_init)


def layer_shape_init(shape_init, layer):
    """The bam_shape_init of one layer. A per-layer list gives entry `layer` (a number, "linear" or one value
    per head); layers past its end take its last entry. Any other value serves every layer."""
    return shape_init[min(layer, len(shape_init) - 1)] if is_per_layer(shape_init) else shape_init


def check_bam_settings(config):
    """BAM's keys of a model.GPTConfig: bam_shape_init (per layer or not, n_head values), bam_scale_init, and
    bam_global_prior (one prior for every layer, so one shape_init). Raises ValueError naming the fix."""
    per_layer = is_per_layer(config.bam_shape_init)
    if per_layer and config.bam_global_prior:
        raise ValueError(f"bam_shape_init gives one entry per layer ({config.bam_shape_init!r}) but "
                         f"bam_global_prior=True shares one prior: give one value for all layers")
    for layer in range(config.n_layer if per_layer else 1):  # each raises ValueError if malformed
        GGDPrior(config.n_head, layer_shape_init(config.bam_shape_init, layer), config.bam_scale_init)


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
    A logit bias of attention.py: Toeplitz (a function of Δ alone), scaled by SSMax too (SPEC §2).
    """
    toeplitz, in_ssmax = True, True

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


def bam_attention_ref(q, k, v, log_scale, shape, loc=None, ssmax_scale=None, q_offset=0, chunk_size=256,
                      doc_start=None):
    """GGD-BAM attention (SPEC §1, with SSMax SPEC §2), PyTorch reference and oracle for kernels.py.

    q: (B, H, Tq, D), k, v: (B, H, Tk, D); log_scale, shape, loc, ssmax_scale: (H,).
    z_ij = f_i·(q·k/√D + b_h(i, j)) with f_i = s_h·log(n_i) under SSMax, else f_i = 1;
    causal softmax (lower-right aligned through q_offset). n_i = i + 1, or with doc_start (B, Tq)
    (packed documents, attention.document_starts) i − doc_start[b, i] + 1, and query i then sees only
    the keys doc_start[b, i] <= j <= i; the prior, a function of j − i, is unchanged.
    Returns (B, H, Tq, D). Differentiable in every input, the prior parameters included.
    Raises ValueError as attention.reference_attention (doc_start only with q_offset=0 and Tk=Tq).
    """
    return reference_attention(
        q, k, v, q_offset=q_offset, ssmax_scale=ssmax_scale, chunk_size=chunk_size, bias_toeplitz=True,
        bias_fn=lambda qp, kp: ggd_bias(qp, kp, log_scale, shape, loc), doc_start=doc_start)
