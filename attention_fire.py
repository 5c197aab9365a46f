"""
FIRE: functional interpolation for relative positions (SPEC §8; Li et al., ICLR 2024,
"Functional Interpolation for Relative Positions Improves Long Context Transformers").

    b_h(i, j) = f_θ(ψ(i − j) / ψ(max(L, i)))_h,   ψ(x) = log(c·x + 1)

a learned bias on the logits. f_θ maps one scalar to one value per head. Dividing by
ψ(max(L, i)) puts the input in [0, 1] at every query position i: a model that trained on
short sequences meets no input outside that range on long ones. Because the bias depends on
i and not only on i − j, it is not a Toeplitz bias (attention.py evaluates it per (i, j)).

Defaults taken here:
- f_θ: one hidden layer of 32 units with ReLU (the paper's MLP), outputs one value per head;
  PyTorch's nn.Linear initialisation (uniform ±1/√fan_in). The parameters are kept as plain
  tensors so that GPT._init_weights (std 0.02 for every nn.Linear) leaves this init alone.
- c: learnable, init 1, kept positive as c = exp(log_c).
- L: learnable threshold, init the training length block_size: during training every query
  has i < L, so the normaliser is the constant ψ(L); past it ψ(i) takes over and interpolates.
  The paper's own initial L could not be checked when this was written: verify it against the
  paper before quoting a FIRE result as the paper's configuration.
- One FIRE module per layer (like the per-layer BAM prior).
- No weight decay on any FIRE parameter (optim_group "fire"): like the BAM prior, these are a
  handful of positional parameters shared by every (i, j), and decay would pull L and c to 0.
- With SSMax the bias is added after the scaling, as for the other baselines (SPEC §2).
- Packed documents (SPEC §2): i in ψ(max(L, i)) is the query's position inside its own document
  (i − doc_start), so a document packed after others gets the bias it would get alone from
  position 0; ψ(i − j) needs no change (both positions shift alike).
"""

import math

import torch
import torch.nn as nn

FIRE_HIDDEN = 32  # hidden width of f_θ


class FIREBias(nn.Module):
    """FIRE's bias for one layer, a logit bias of attention.py (not Toeplitz; not scaled by SSMax).

    n_head: outputs of f_θ; train_length: L at init (the training context, block_size).
    Parameters (all marked optim_group "fire": no weight decay): w1, b1 (hidden,) and w2 (H, hidden),
    b2 (H,) of f_θ; log_c (scalar) with c = exp(log_c); threshold (scalar) = L.
    Raises ValueError if train_length < 1.
    """
    toeplitz, in_ssmax = False, False

    def __init__(self, n_head, train_length, hidden=FIRE_HIDDEN):
        super().__init__()
        if train_length < 1:
            raise ValueError(f"FIRE needs a training length >= 1 for its threshold L, got {train_length}")
        bound = 1 / math.sqrt(hidden)  # nn.Linear's init: uniform ±1/√fan_in (fan_in 1 for the first layer)
        self.w1 = nn.Parameter(torch.empty(hidden).uniform_(-1, 1))
        self.b1 = nn.Parameter(torch.empty(hidden).uniform_(-1, 1))
        self.w2 = nn.Parameter(torch.empty(n_head, hidden).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.empty(n_head).uniform_(-bound, bound))
        self.log_c = nn.Parameter(torch.zeros(()))
        self.threshold = nn.Parameter(torch.tensor(float(train_length)))
        for p in self.parameters():
            p.optim_group = "fire"

    def normalized_distance(self, q_pos, k_pos, doc_start=None):
        """ψ(i − j) / ψ(max(L, i')) for every (i, j): (Tq, Tk), or (B, Tq, Tk) with doc_start; in [0, 1] for j <= i.

        i' is the query's absolute position i, or with doc_start (B, Tq), the window position where each
        query's document starts, its position inside its document i − doc_start[b, i].
        A future key (j > i, masked by the caller) gets distance 0, so nothing here is NaN; L is
        floored at 1 so that ψ(max(L, i')) > 0 even at i' = 0."""
        i = q_pos.to(self.log_c.dtype)[:, None]  # (Tq, 1)
        dist = (i - k_pos.to(i.dtype)[None, :]).clamp(min=0)  # (Tq, Tk)
        i_in_doc = i if doc_start is None else i[None] - doc_start.to(i.dtype)[:, :, None]  # (Tq, 1) or (B, Tq, 1)
        c = self.log_c.exp()
        return torch.log1p(c * dist) / torch.log1p(c * torch.maximum(self.threshold.clamp(min=1), i_in_doc))

    def forward(self, q_pos, k_pos, doc_start=None):
        """Bias f_θ(ψ(i − j)/ψ(max(L, i'))) for absolute positions q_pos (Tq,), k_pos (Tk,): (H, Tq, Tk), or
        (B, H, Tq, Tk) with doc_start (B, Tq) (packed documents: i' is the position inside the document).

        The hidden units are summed one at a time: memory (B, H, Tq, Tk), never (hidden, Tq, Tk)."""
        x = self.normalized_distance(q_pos, k_pos, doc_start)[..., None, :, :]  # (1, Tq, Tk) or (B, 1, Tq, Tk)
        out = self.b2[:, None, None].expand(*x.shape[:-3], -1, *x.shape[-2:])  # (H, Tq, Tk) or (B, H, Tq, Tk)
        for u in range(self.w1.shape[0]):
            out = out + self.w2[:, u, None, None] * torch.relu(self.w1[u] * x + self.b1[u])
        return out
