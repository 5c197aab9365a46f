"""
The classic position embeddings of SPEC §4, beside the other variants' files: the fixed sinusoid of Vaswani et al.,
added to the token embeddings (pos='sinusoidal'), and the rotary embedding of Su et al., applied to q and k
(pos='rope'). GPT-2's learned embedding is an nn.Embedding in model.position_embedding; ALiBi is in attention.py.
"""
import math

import torch
import torch.nn as nn


# The sinusoid is added at the token embeddings' scale. sin/cos have rms 1/√2: added as they are to embeddings
# initialised with std 0.02 they would outweigh them 35 to 1 (on tiny Shakespeare that model trailed NoPE, ppl 28.6
# against 12.0, docs/results.md). Vaswani et al. bring the two to the same scale by multiplying the embeddings
# by √d_model (their init has std d_model^−1/2); with nanoGPT's init the same balance is the sinusoid at rms 0.02.
SINUSOIDAL_SCALE = 0.02 * math.sqrt(2)


def sinusoidal_embedding(pos, dim, base=10000.0):
    """Fixed sinusoidal position embedding (Vaswani et al.), SPEC §4.

    pos: (T,) positions, or (B, T) (positions inside packed documents). Returns (T, dim) or
    (B, T, dim) fp32: even dims sin(pos·ω_k), odd dims cos(pos·ω_k), ω_k = base^(−2k/dim).
    """
    omega = base ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim)  # (dim/2,)
    angle = pos.float()[..., None] * omega  # (..., T, dim/2)
    emb = torch.zeros(*pos.shape, dim, device=pos.device)
    emb[..., 0::2] = torch.sin(angle)
    emb[..., 1::2] = torch.cos(angle[..., : dim // 2])
    return emb


def apply_rope(x, pos, base):
    """Rotary position embedding (Su et al.), SPEC §4, half-split (GPT-NeoX/LLaMA) layout.

    x: (B, H, T, D) with D even; pos: (T,) absolute positions. Returns x rotated
    by angle pos·base^(−2k/D) in each (k, k + D/2) plane, same shape and dtype.
    """
    D = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)  # (D/2,)
    angle = pos.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.float()[..., : D // 2], x.float()[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def check_rope_settings(config):
    """RoPE rotates pairs of dims: the head dim n_embd // n_head must be even. Raises ValueError."""
    if (config.n_embd // config.n_head) % 2 != 0:
        raise ValueError(f"rope needs an even head dim n_embd // n_head, got {config.n_embd} // {config.n_head}: "
                         f"change n_embd or n_head")


class SinusoidalEmbedding(nn.Module):
    """The fixed sinusoid of sinusoidal_embedding at the token embeddings' scale: pos (T,) -> (T, dim), or
    (B, T) -> (B, T, dim). No parameters."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, pos):
        return SINUSOIDAL_SCALE * sinusoidal_embedding(pos, self.dim)
