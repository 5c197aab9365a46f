"""
The attention core shared by every positional variant (docs/spec.md): the chunked
reference attention with its bias and score hooks, scalable softmax (SSMax, SPEC §2)
and ALiBi (SPEC §4). The variants' own parts live in their files: the GGD prior in
attention_bam.py, TAPA's score in attention_tapa.py, FIRE's bias in attention_fire.py.

A logit bias is a module or function bias_fn(q_pos, k_pos) -> (H, Tq, Tk) of the
absolute query and key positions. Two class attributes tell reference_attention how to
use it (both default to False when absent, the safe choice):
    toeplitz   True if the bias depends on k_pos − q_pos only (ALiBi, GGD-BAM): it is then
               evaluated on the Tq + Tk − 1 distinct distances (distance_bias), not per (i, j)
    in_ssmax   True if SSMax scales the bias too (BAM, SPEC §2); False: added after the scaling
A bias that is not Toeplitz (FIRE) may depend on where the query's document starts; with packed
documents it is called as bias_fn(q_pos, k_pos, doc_start=(B, Tq)) and returns (B, H, Tq, Tk).

Packed documents (SPEC §2): doc_start (B, T) from document_starts masks every key outside the
query's own document and makes SSMax count n_i inside that document.

Notation: query position i, key position j <= i, distance Δ = j − i. Positions are
absolute, so the same code serves training, chunked prefill and decoding with a KV cache.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- ALiBi (SPEC §4)

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


def alibi_bias(q_pos, k_pos, slopes):
    """ALiBi bias b_h(i, j) = −slope_h·|Δ|, SPEC §4. q_pos (Tq,), k_pos (Tk,), slopes (H,) -> (H, Tq, Tk)."""
    delta = (k_pos[None, :] - q_pos[:, None]).to(slopes.dtype)
    return -slopes[:, None, None] * delta.abs()[None]


class ALiBi(nn.Module):
    """The ALiBi bias of one layer as a logit-bias module (no parameters; the slopes are a buffer that is
    not saved). Toeplitz; with SSMax the bias is added after the scaling (SPEC §2)."""
    toeplitz, in_ssmax = True, False

    def __init__(self, n_head):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def forward(self, q_pos, k_pos):
        """Bias (H, Tq, Tk) for absolute positions q_pos (Tq,), k_pos (Tk,)."""
        return alibi_bias(q_pos, k_pos, self.slopes)


# ---------------------------------------------------------------- documents in a packed window (SPEC §2)

def document_starts(doc_ids):
    """The window position of the first token of each token's document: (B, T) int64.

    doc_ids: (B, T) integer document ids, non-decreasing along T; equal ids mean the same document.
    A document that began before the window starts at position 0. Query i then sees the keys
    doc_start[b, i] <= j <= i, and SSMax's n_i = i − doc_start[b, i] + 1 (SPEC §2: n counts the keys
    inside the query's own document). Every attention path (reference, SDPA, the Triton kernels) takes
    doc_start, not doc_ids. Raises ValueError if doc_ids is not 2-D or decreases along T.
    """
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be (B, T), got shape {tuple(doc_ids.shape)}")
    if (doc_ids[:, 1:] < doc_ids[:, :-1]).any():
        raise ValueError("doc_ids must be non-decreasing along T (one id per document, in order)")
    B, T = doc_ids.shape
    new_doc = torch.ones_like(doc_ids, dtype=torch.bool)  # (B, T): True where a document begins
    new_doc[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    t = torch.arange(T, device=doc_ids.device).expand(B, T)
    return torch.where(new_doc, t, 0).cummax(dim=1).values  # (B, T)


# ---------------------------------------------------------------- SSMax (SPEC §2)

def ssmax_factor(scale, q_pos, dtype=None):
    """The SSMax factor f_i = s_h·log(n_i), n_i = q_pos_i + 1 keys seen by query i (SPEC §2).

    scale: (H,) s_h. q_pos: the query's position counted from the first key it can see, so that
    n_i = q_pos_i + 1: its absolute position (Tq,) under a plain causal mask or a KV cache, or its
    position inside its document (B, Tq) with packed documents (i − doc_start[b, i]).
    Returns (H, Tq, 1) for (Tq,) positions, (B, H, Tq, 1) for (B, Tq), in `dtype` (default scale's).
    The one definition every path uses: kernels._ssmax_factor computes the same inside the Triton
    kernels, and tests/test_kernels.py::test_kernel_ssmax_factor_equals_attention_ssmax_factor compares the two.
    """
    dtype = dtype or scale.dtype
    log_n = torch.log(q_pos.to(dtype) + 1)[..., None, :, None]  # (1, Tq, 1) or (B, 1, Tq, 1)
    return scale.to(dtype)[:, None, None] * log_n


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


def check_ssmax_settings(config):
    """SSMax's keys of a model.GPTConfig: ssmax_layers (layer indices, needs ssmax=True) and ssmax_max_n (the cap on
    n: an int >= 1, or one per layer; not in kernels.py). Raises ValueError naming the fix."""
    if config.ssmax_layers is not None:
        layers = config.ssmax_layers
        if not config.ssmax:
            raise ValueError(f"ssmax_layers={layers!r} needs ssmax=True")
        if not isinstance(layers, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and -config.n_layer <= i < config.n_layer for i in layers):
            raise ValueError(f"ssmax_layers must be a list of layer indices in [-{config.n_layer}, {config.n_layer}) "
                             f"(n_layer = {config.n_layer}; -1 is the last layer), got {layers!r}")
    if config.ssmax_max_n is not None:
        caps = config.ssmax_max_n  # no effect without SSMax (the CPU demo's config sets it for every pos)
        positive = lambda n: isinstance(n, int) and not isinstance(n, bool) and n >= 1
        if not (positive(caps) or isinstance(caps, (list, tuple)) and len(caps) >= 1 and all(
                n is None or positive(n) for n in caps)):
            raise ValueError(f"ssmax_max_n must be an int >= 1 or one entry per layer (an int >= 1 or None; "
                             f"layers past the list's end take its last entry), e.g. [1280, None], got {caps!r}")
        if config.attn_impl == "triton" and config.ssmax:
            raise ValueError("ssmax_max_n is not in kernels.py's SSMax: use attn_impl=torch, or ssmax_max_n=None")


def has_ssmax(config, layer):
    """True if layer `layer` uses SSMax: config.ssmax, in every layer or in those of config.ssmax_layers."""
    layers = config.ssmax_layers
    return config.ssmax and (layers is None or layer in [i % config.n_layer for i in layers])


# ---------------------------------------------------------------- the reference attention

def distance_bias(bias_fn, q_offset, tq, tk, device):
    """The bias of queries q_offset..q_offset+tq−1 against keys 0..tk−1 as a (H, tq, tk) tensor.

    bias_fn(q_pos, k_pos) -> (H, len(q_pos), len(k_pos)) must depend on the distance
    k_pos − q_pos only (a `toeplitz` bias: ALiBi, GGD-BAM). It is evaluated once on the
    tq + tk − 1 distinct distances, and the (tq, tk) Toeplitz matrix is read from that
    1-D profile through a sliding window: no pow per (i, j) pair.
    """
    # r[m] = bias at distance i − j = (q_offset + tq − 1) − m, for m = 0 .. tq+tk−2
    dist = torch.arange(q_offset + tq - 1, q_offset - tk, -1, device=device)
    r = bias_fn(torch.zeros(1, device=device), -dist)[:, 0]  # (H, tq+tk−1)
    # window w of r is the row of query a = tq − 1 − w: flip the windows into query order
    return r.unfold(-1, tk, 1).flip(-2)  # (H, tq, tk)


# skip_far (reference_attention) leaves out keys whose summed weight is below e^−SKIP_MARGIN (4e-18) of the query's
# own key's: under float64's rounding (1.1e-16), so the output is the full attention's.
SKIP_MARGIN = 40.0


def far_key_profile(bias_fn, tk, device):
    """What skip_far needs of a Toeplitz bias over keys 0..tk−1: (b0, R). b0 (H,): the bias at distance 0;
    R (H, tk): R[h, d] = the largest bias of head h at any distance >= d (a suffix maximum of the profile, so
    no monotonicity in the distance is assumed)."""
    r = bias_fn(torch.zeros(1, device=device), -torch.arange(tk, device=device))[:, 0]  # (H, tk): bias at distance d
    return r[:, 0], r.flip(-1).cummax(-1).values.flip(-1)


def first_needed_key(qc, k_own, q_pos, f, b0, R, k_norm_max, bias_in_ssmax):
    """The first key the queries at positions q_pos (tq,) need, with a Toeplitz bias: for every query, all keys
    farther back weigh less than e^−SKIP_MARGIN times its own key (j = i), summed. A bound, not a guess.

    qc (B, H, tq, D) the queries, k_own (B, H, tq, D) the keys at the same positions; f (H, tq, 1) SSMax's
    factor or None; b0, R from far_key_profile; k_norm_max (H,) the largest |k| of the keys.
    Logits z = fq·q·k/√D + fb·b (fq = f, or 1 without SSMax; fb = fq if the bias is inside SSMax, BAM, else 1).
    A key at distance >= d has z <= |fq|·|q|·max|k|/√D + fb·R[h, d] (Cauchy-Schwarz); the query's own key has
    z_own exactly; the n_i = q_pos + 1 keys of query i weigh at most n_i·exp(bound − z_own) relative to it
    (docs/spec.md §5, "Scoring very long prompts").
    Returns an int key position, 0 where no key can be left out (or where fb <= 0: a negative SSMax s).
    """
    D = qc.shape[-1]
    fq = torch.ones(1, device=qc.device, dtype=qc.dtype) if f is None else f[..., 0]  # (H, tq) or (1,)
    fb = fq if bias_in_ssmax else torch.ones_like(fq)
    if (fb <= 0).any():
        return 0
    own = fq * (qc * k_own).sum(-1) / math.sqrt(D) + fb * b0[:, None]  # (B, H, tq): the logit of key j = i
    reach = fq.abs() * qc.norm(dim=-1) * k_norm_max[:, None] / math.sqrt(D)  # (B, H, tq): bound on |fq·q·k/√D|
    # a distance d can be left out when log(n_i) + reach + fb·R[d] − own < −SKIP_MARGIN for every query: R[d] < t
    t = ((own - SKIP_MARGIN - torch.log(q_pos.to(qc.dtype) + 1) - reach) / fb).amin(dim=(0, 2))  # (H,)
    if not torch.isfinite(t).all():
        return 0
    d = torch.searchsorted(-R.to(t.dtype).contiguous(), -t[:, None], right=True)  # (H, 1): first d with R[d] < t
    return max(0, int(q_pos[0]) - int(d.max()) + 1)


def reference_attention(q, k, v, q_offset=0, bias_fn=None, ssmax_scale=None, bias_in_ssmax=True,
                        bias_toeplitz=False, score_fn=None, dropout_p=0.0, chunk_size=256, doc_start=None,
                        skip_far=False, ssmax_max_n=None):
    """Causal attention with a positional bias and/or SSMax, one chunk of queries at a time.

    q: (B, H, Tq, D) at absolute positions q_offset .. q_offset+Tq−1;
    k, v: (B, H, Tk, D) at positions 0 .. Tk−1; causal: key j is seen by query i
    iff j <= i (lower-right aligned when q_offset = Tk − Tq).
    Logits z_ij = q·k/√D plus bias_fn(q_pos, k_pos) → (H, tq, tk) if given. The bias may depend on
    both positions (FIRE); bias_toeplitz=True declares it a function of k_pos − q_pos alone, which is
    then evaluated through distance_bias. With ssmax_scale (H,), SSMax multiplies by f_i = s_h·log(n_i)
    either (q·k/√D + b) (bias_in_ssmax, BAM, SPEC §2) or q·k/√D alone with the bias added after
    (ALiBi, FIRE and the other baselines). score_fn(q, k, q_pos, k_pos) → (B, H, tq, tk) replaces
    q·k/√D + b (TAPA). The bias of a future key (j > i) is computed and then masked.
    doc_start: (B, T) int, from document_starts, or None. With it (packed documents, SPEC §2) query i
    of row b sees the keys doc_start[b, i] <= j <= i only, and SSMax's n_i = i − doc_start[b, i] + 1;
    a bias that is not Toeplitz is called with doc_start= the chunk's (B, tq) (see the module
    docstring). Without it n_i = i + 1.
    ssmax_max_n: SSMax counts at most this many keys, n_i = min(n_i, ssmax_max_n) (None: no cap).
    skip_far (a Toeplitz bias, no score_fn, no doc_start, no dropout): each chunk of queries leaves out the
    keys so far back that the bias makes their summed weight provably < e^−40 of each query's own key
    (first_needed_key): exact to float64 rounding, and linear in Tk for a local head (ALiBi, BAM with β > 0,
    where evaluation of long prompts is dominated by the first layers); each head on its own, from the
    first key its prior needs. The model sets it when no gradient is taken; with gradients every key is
    computed.
    Memory: scores of at most (B, H, chunk_size, Tk), never Tq × Tk.
    Returns (B, H, Tq, D) in v's dtype. Raises ValueError if Tk < q_offset + Tq, or if doc_start is
    given with a KV cache (q_offset > 0 or Tk != Tq) or with a shape other than (B, Tq).
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk < q_offset + Tq:
        raise ValueError(f"need keys for positions up to {q_offset + Tq - 1}, got Tk={Tk}")
    if doc_start is not None and (q_offset != 0 or Tk != Tq or tuple(doc_start.shape) != (B, Tq)):
        raise ValueError(f"doc_start (packed documents) needs a whole window: q_offset=0, Tk=Tq and doc_start of "
                         f"shape (B, Tq)=({B}, {Tq}); got q_offset={q_offset}, Tk={Tk}, doc_start "
                         f"{tuple(doc_start.shape)}. A KV cache takes no documents")
    skip = skip_far and bias_fn is not None and bias_toeplitz and score_fn is None and doc_start is None \
        and dropout_p == 0
    if skip and H > 1:  # one head at a time, so that each leaves out as many keys as its own prior allows
        return torch.cat([reference_attention(
            q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], q_offset, lambda qp, kp, h=h: bias_fn(qp, kp)[h:h + 1],
            None if ssmax_scale is None else ssmax_scale[h:h + 1], bias_in_ssmax, True, chunk_size=chunk_size,
            skip_far=True, ssmax_max_n=ssmax_max_n) for h in range(H)], dim=1)  # (B, H, Tq, D)
    if skip:  # once per call: the bias profile and the largest key norm
        b0, R = far_key_profile(bias_fn, Tk, q.device)
        k_norm_max = k.norm(dim=-1).amax(dim=(0, 2))  # (H,)
    out = torch.empty_like(q, dtype=v.dtype)
    for c0 in range(0, Tq, chunk_size):
        c1 = min(c0 + chunk_size, Tq)
        t0, tq, tk = q_offset + c0, c1 - c0, q_offset + c1  # keys past the chunk's last query are all masked
        q_pos = torch.arange(t0, t0 + tq, device=q.device)  # (tq,)
        qc = q[:, :, c0:c1]
        # n_i − 1: the query's position counted from the first key it sees; keys of earlier documents are masked
        n_minus_1, ds = q_pos, None
        if doc_start is not None:
            ds = doc_start[:, c0:c1]  # (B, tq)
            n_minus_1 = q_pos[None, :] - ds  # (B, tq)
        # SSMax factor f_i = s_h·log(n_i), and the causal mask: only the last tq keys can lie in a query's future
        f = None
        if ssmax_scale is not None:  # n_i = min(n_i, ssmax_max_n) when capped
            n_counted = n_minus_1 if ssmax_max_n is None else n_minus_1.clamp(max=ssmax_max_n - 1)
            f = ssmax_factor(ssmax_scale, n_counted, q.dtype)  # (H, tq, 1), or (B, H, tq, 1) with documents
        a = first_needed_key(qc, k[:, :, t0:tk], q_pos, f, b0, R, k_norm_max, bias_in_ssmax) if skip else 0
        k_pos = torch.arange(a, tk, device=q.device)  # (tk − a,): the keys this chunk attends to
        kc, vc = k[:, :, a:tk], v[:, :, a:tk]
        other_doc = None if ds is None else (k_pos[None, None, :] < ds[:, :, None])[:, None]  # (B, 1, tq, tk)
        future = torch.ones(tq, tq, dtype=torch.bool, device=q.device).triu(1)  # (tq, tq)
        if score_fn is not None:  # explicit scores (TAPA), softmax in fp32 (fp64 for fp64 inputs)
            acc = torch.promote_types(q.dtype, torch.float32)
            z = score_fn(qc, kc, q_pos, k_pos).to(acc)  # (B, H, tq, tk)
            z = z if f is None else f.to(acc) * z
            z = torch.cat([z[..., :t0 - a], z[..., t0 - a:].masked_fill(future, float("-inf"))], dim=-1)
            if other_doc is not None:
                z = z.masked_fill(other_doc, float("-inf"))
            att = F.dropout(F.softmax(z, dim=-1), p=dropout_p) if dropout_p > 0 else F.softmax(z, dim=-1)
            out[:, :, c0:c1] = (att @ vc.to(acc)).to(v.dtype)
            continue
        # z = f·(q·k/√D + b) = (f·q)·k/√D + f·b: SSMax folds into q and the bias, SDPA does the rest
        mask = torch.zeros(1, 1, tq, tk - a, device=q.device, dtype=q.dtype)  # (1 or B, 1 or H, tq, tk − a)
        if bias_fn is not None:
            # a fresh tensor either way, so the in-place fills below are safe for autograd (a bias module's
            # output may be saved for its own backward)
            if bias_toeplitz:  # a function of the distance: keys a..tk−1 seen from t0 are keys 0.. seen from t0 − a
                mask = distance_bias(bias_fn, t0 - a, tq, tk - a, q.device)[None]  # (1, H, tq, tk − a)
            elif ds is not None:
                mask = bias_fn(q_pos, k_pos, doc_start=ds).clone()  # (B, H, tq, tk)
            else:
                mask = bias_fn(q_pos, k_pos).clone()[None]  # (1, H, tq, tk)
        if f is not None:
            qc = qc * f
            if bias_fn is not None and bias_in_ssmax:
                mask = f * mask
        mask = mask.to(q.dtype)
        if q.dtype == torch.float16:  # a large negative bias (a GGD shape < 0) overflows fp16 to −inf, and query 0
            mask.clamp_(min=torch.finfo(torch.float16).min)  # (one key) would get NaN; fp32/bf16: BIAS_FLOOR
        mask[..., t0 - a:].masked_fill_(future, float("-inf"))
        if other_doc is not None:  # every query still sees itself: no row is all −inf
            mask = mask.masked_fill(other_doc, float("-inf"))  # (B, 1 or H, tq, tk)
        out[:, :, c0:c1] = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, dropout_p=dropout_p)
    return out
