"""
TAPA: token-aware phase attention (SPEC §3; Eq. 12 of the TAPA paper, v1).

    score(i, j) = (q_A·k_A / √(θD)) · cos(2π · |i − j|^α · q_P·k_P / √((1 − θ)D))

The first θ·D dims of each head are the amplitude part, the rest the phase
part. θ and α are fixed hyperparameters: TAPA adds no parameters and uses no
RoPE. The 2π is part of the formula.
"""

import math

import torch

from attention import reference_attention

TAPA_PHASES = ("quadratic", "linear")


def tapa_split(head_dim, theta):
    """Number of amplitude dims round(θ·D) for head dim D; the phase part gets the rest.

    Raises ValueError unless both parts have at least one dim.
    """
    d_amp = int(round(theta * head_dim))
    if not 0 < d_amp < head_dim:
        raise ValueError(f"tapa_theta={theta} leaves no amplitude or no phase dims for head dim {head_dim}; "
                         f"choose 0 < theta < 1 with round(theta*head_dim) in 1..{head_dim - 1}")
    return d_amp


def check_tapa_settings(config):
    """TAPA's keys of a model.GPTConfig: tapa_phase, tapa_theta (both parts of the head get dims) and
    tapa_alpha >= 0. Raises ValueError naming the fix."""
    if config.tapa_phase not in TAPA_PHASES:
        raise ValueError(f"unknown tapa_phase {config.tapa_phase!r}; valid: {', '.join(TAPA_PHASES)}")
    tapa_split(config.n_embd // config.n_head, config.tapa_theta)
    if not config.tapa_alpha >= 0:
        raise ValueError(f"tapa_alpha must be >= 0 (|i − j|^alpha is infinite at i = j otherwise), "
                         f"got {config.tapa_alpha}")


def tapa_scores(q, k, q_pos, k_pos, theta=0.5, alpha=0.1, phase="quadratic"):
    """Pre-softmax TAPA scores, SPEC §3 (Eq. 12), for every (i, j): no causal mask here.

    q: (B, H, Tq, D), k: (B, H, Tk, D); q_pos: (Tq,), k_pos: (Tk,) absolute positions.
    phase "quadratic": φ_ij = q_P·k_P/√((1−θ)D); "linear" (ablation):
    φ_ij = (Σ q_P + Σ k_P)/√((1−θ)D). Returns fp32 (B, H, Tq, Tk):
    (q_A·k_A/√(θD)) · cos(2π·|i − j|^α·φ_ij). Raises ValueError for an unknown phase.
    """
    if phase not in TAPA_PHASES:
        raise ValueError(f"tapa_phase must be one of {TAPA_PHASES}, got {phase!r}")
    D = q.shape[-1]
    d_amp = tapa_split(D, theta)
    q, k = q.float(), k.float()
    qa, qp = q[..., :d_amp], q[..., d_amp:]
    ka, kp = k[..., :d_amp], k[..., d_amp:]
    amplitude = (qa / math.sqrt(d_amp)) @ ka.transpose(-2, -1)  # (B, H, Tq, Tk)
    if phase == "quadratic":
        phi = (qp / math.sqrt(D - d_amp)) @ kp.transpose(-2, -1)  # (B, H, Tq, Tk)
    else:
        phi = (qp.sum(-1)[..., :, None] + kp.sum(-1)[..., None, :]) / math.sqrt(D - d_amp)
    w = 2 * math.pi * (q_pos[:, None] - k_pos[None, :]).abs().float().pow(alpha)  # (Tq, Tk), 0 on the diagonal
    return amplitude * torch.cos(w * phi)


def tapa_attention_ref(q, k, v, theta=0.5, alpha=0.1, phase="quadratic", q_offset=0,
                       ssmax_scale=None, dropout_p=0.0, chunk_size=256, doc_start=None):
    """TAPA attention (SPEC §3), PyTorch reference and oracle for kernels.py.

    q: (B, H, Tq, D) at positions q_offset.., k, v: (B, H, Tk, D); causal softmax
    over tapa_scores (lower-right aligned through q_offset). With ssmax_scale (H,),
    the scores are multiplied by s_h·log(n_i) (SPEC §2), n_i = i + 1. With doc_start (B, Tq)
    (packed documents, attention.document_starts) query i sees only the keys
    doc_start[b, i] <= j <= i and n_i = i − doc_start[b, i] + 1; the scores, functions of |i − j|,
    are unchanged. Returns (B, H, Tq, D). Raises ValueError as attention.reference_attention.
    """
    def score_fn(qc, kc, q_pos, k_pos):
        return tapa_scores(qc, kc, q_pos, k_pos, theta, alpha, phase)
    return reference_attention(q, k, v, q_offset=q_offset, score_fn=score_fn,
                               ssmax_scale=ssmax_scale, dropout_p=dropout_p, chunk_size=chunk_size, doc_start=doc_start)
