"""
A GPT language model with a choice of positional encoding, in nanoGPT's style:
GPT-2 blocks (pre-LayerNorm, fused qkv projection, tied lm_head, `bias` flag).

config.pos selects the positional variant (SPEC §1, §3, §4, §8):
    nope        no positional signal
    sinusoidal  fixed sin/cos (base 10000) added to the token embeddings, at their scale
    learned     GPT-2's learned wpe (cannot go past block_size)
    rope        rotary embedding of q and k (base config.rope_base)
    alibi       −slope_h·|i − j| added to the logits
    bam         GGD-BAM: learnable Generalized-Gaussian prior on the logits
    tapa        token-aware phase attention (amplitude × cos(phase))
    fire        FIRE: a learned MLP of the normalised distance added to the logits
config.ssmax adds scalable softmax (SPEC §2) to any of them.

The switch point is check_variant_settings, position_embedding, attention_parts and shared_prior
below, the only place that names a variant: a variant's own file checks its keys and declares what
it adds to the token embeddings, how it transforms q and k, and the bias or score it puts
on the logits. Everything else (the choice of SDPA, weight decay, the longest input) follows
from those declarations. A new variant is one file plus one branch there (and its name in
POS_VARIANTS).

Positions are absolute everywhere, so a KV cache (`cache=` in forward) gives
chunked prefill and token-by-token decoding past block_size for every variant
that extrapolates.

Packed documents (`doc_ids=` in forward, SPEC §2): attention stays inside each document, SSMax
counts n inside it, learned and sinusoidal embeddings take the position inside the document, and
FIRE's normaliser too; the relative variants (RoPE, ALiBi, BAM, TAPA) see the same distances
inside a document as alone and are unchanged. Each document then gets the logits it would get
alone from position 0.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import ALiBi, SSMax, check_ssmax_settings, document_starts, has_ssmax, reference_attention
from attention_bam import GGDPrior, check_bam_settings, layer_shape_init
from attention_fire import FIREBias
from attention_tapa import check_tapa_settings, tapa_scores
from configurator import InputError  # a ValueError: one line in the scripts
from position_embeddings import SinusoidalEmbedding, apply_rope, check_rope_settings

POS_VARIANTS = ("nope", "sinusoidal", "learned", "rope", "alibi", "bam", "tapa", "fire")
ATTN_IMPLS = ("torch", "triton")


@dataclass
class GPTConfig:
    block_size: int = 1024      # training context length
    vocab_size: int = 50304     # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True           # bias in Linear and LayerNorm layers, as GPT-2
    pos: str = "rope"           # one of POS_VARIANTS
    ssmax: bool = False         # scalable softmax (SPEC §2), with any pos
    ssmax_init: float = 1.0     # s_h at init: 1.0 in the BAM code, ~1/mean(ln n) in others (SPEC §2)
    ssmax_layers: object = None  # None: SSMax in every layer; a list of layer indices (negative from the end)
    ssmax_max_n: object = None  # SSMax counts at most N keys, n_i = min(i + 1, N): an int, or one per layer (the
                                # last entry serves the layers past the list's end)
    rope_base: float = 10000.0
    bam_shape_init: object = 1.0        # β at init: a number (1 = ALiBi), "linear", one per head, or one entry per layer
    bam_scale_init: object = "alibi"    # c at init: "alibi" slopes or a number > 0
    bam_global_prior: bool = False      # one prior shared by all layers (authors' code)
    tapa_theta: float = 0.5     # fraction of each head's dims used for amplitude
    tapa_alpha: float = 0.1     # exponent of |i − j| in the phase
    tapa_phase: str = "quadratic"       # or "linear" (the paper's ablation)
    attn_impl: str = "torch"    # "triton": fused kernels of kernels.py

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.pos not in POS_VARIANTS:
            raise ValueError(f"unknown pos {self.pos!r}; valid: {', '.join(POS_VARIANTS)}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"unknown attn_impl {self.attn_impl!r}; valid: {', '.join(ATTN_IMPLS)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        check_ssmax_settings(self)  # SSMax's keys (attention.py)
        check_variant_settings(self)  # the variant's own keys (the switch point, below)


def rename_prior_keys(module, state_dict, prefix, *args):
    """Load-state-dict pre-hook of CausalSelfAttention: <prefix>prior.* (the GGD prior's keys before the
    bias slot was named pos_bias) become <prefix>pos_bias.*, so earlier checkpoints still load."""
    for key in [k for k in state_dict if k.startswith(prefix + "prior.")]:
        state_dict[prefix + "pos_bias." + key[len(prefix + "prior."):]] = state_dict.pop(key)


# ---------------------------------------------------------------- the switch point: what each variant contributes

def check_variant_settings(config):
    """The keys of config.pos, checked by the variant's own code, and whether kernels.py has it
    (attn_impl='triton'). Raises ValueError naming the fix."""
    if config.pos == "rope":
        check_rope_settings(config)
    if config.pos == "bam":
        check_bam_settings(config)
    if config.pos == "tapa":
        check_tapa_settings(config)
    if config.attn_impl == "triton" and config.pos not in ("bam", "tapa"):
        raise ValueError(f"attn_impl='triton' has kernels for pos='bam' and 'tapa' only, not {config.pos!r}: "
                         f"use attn_impl='torch'")


def position_embedding(config):
    """What config.pos adds to the token embeddings: a module pos (T,) -> (T, C), or None.

    The module also takes (B, T) positions -> (B, T, C): the positions inside packed documents.

    An nn.Embedding (pos='learned') bounds the model's length to its number of rows (GPT.max_length).
    """
    if config.pos == "learned":
        return nn.Embedding(config.block_size, config.n_embd)
    if config.pos == "sinusoidal":
        return SinusoidalEmbedding(config.n_embd)
    return None


def attention_parts(config, layer, shared_prior=None):
    """What config.pos contributes to one attention layer: (rotate, pos_bias, score), each None if absent.

    rotate(x, pos) -> x: a transform of q and of k (B, H, T, D) at absolute positions pos (T,) (rope).
    pos_bias(q_pos, k_pos) -> (H, Tq, Tk): a module whose output is added to the logits, with the class
        attributes `toeplitz` and `in_ssmax` of attention.py (alibi, bam, fire). Its parameters carry an
        `optim_group` marker if they need no weight decay (GPT.configure_optimizers).
    score(q, k, q_pos, k_pos) -> (B, H, Tq, Tk): replaces q·k/√D on the logits (tapa).
    layer: the layer's index (bam_shape_init may differ per layer); shared_prior: the GGD prior shared by
    all layers (bam_global_prior), else None.
    A layer with none of the three and no SSMax runs on SDPA's fused causal kernels.
    """
    if config.pos == "rope":
        return functools.partial(apply_rope, base=config.rope_base), None, None
    if config.pos == "alibi":
        return None, ALiBi(config.n_head), None
    if config.pos == "bam":
        shape_init = layer_shape_init(config.bam_shape_init, layer)
        return None, shared_prior or GGDPrior(config.n_head, shape_init, config.bam_scale_init), None
    if config.pos == "fire":
        return None, FIREBias(config.n_head, config.block_size), None
    if config.pos == "tapa":
        return None, None, functools.partial(tapa_scores, theta=config.tapa_theta, alpha=config.tapa_alpha,
                                             phase=config.tapa_phase)
    return None, None, None


def shared_prior(config):
    """The one GGD prior every layer shares (pos='bam' with bam_global_prior=True, the authors' code), passed to
    attention_parts; None when each layer has its own."""
    if config.pos == "bam" and config.bam_global_prior:
        return GGDPrior(config.n_head, config.bam_shape_init, config.bam_scale_init)
    return None


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with the positional variant of config.pos.

    forward(x, t0, kv=None, doc_start=None, keep_last=None): x (B, T, C) holds the tokens at absolute
    positions t0 .. t0+T−1; kv is this layer's cached (k, v), each (B, H, t0, hs), or None; doc_start
    (B, T) (attention.document_starts, packed documents; not with kv) or None; keep_last: attend with
    the queries of the last keep_last positions only (the keys and values of all T still count).
    Returns (y, (k, v)) with y (B, T, C), or (B, keep_last, C), and the keys/values of positions
    0 .. t0+T−1.
    """

    def __init__(self, config, layer=0, shared_prior=None):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.config = config
        self.rotate, self.pos_bias, self.score = attention_parts(config, layer, shared_prior)
        self.ssmax = SSMax(config.n_head, config.ssmax_init) if has_ssmax(config, layer) else None
        caps = config.ssmax_max_n
        self.ssmax_max_n = caps[min(layer, len(caps) - 1)] if isinstance(caps, (list, tuple)) else caps  # None: no cap
        # checkpoints written before the bias slot was named pos_bias hold the GGD prior under "prior."
        self.register_load_state_dict_pre_hook(rename_prior_keys)

    def forward(self, x, t0, kv=None, doc_start=None, keep_last=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.rotate is not None:
            pos = torch.arange(t0, t0 + T, device=x.device)
            q, k = self.rotate(q, pos), self.rotate(k, pos)
        if kv is not None:
            k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)  # (B, nh, t0+T, hs)
        if keep_last is not None:  # only these queries: the ones whose output is used (the last layer's logits)
            q, t0, T = q[:, :, T - keep_last:], t0 + T - keep_last, keep_last  # (B, nh, keep_last, hs)
        y = self.attend(q, k, v, t0, doc_start=doc_start)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y)), (k, v)

    def attend(self, q, k, v, t0, doc_start=None):
        """Causal attention of q (B, nh, T, hs) at positions t0.. over k, v (B, nh, t0+T, hs).

        SDPA's fused causal kernels when the layer declares no bias, no score and no SSMax; otherwise
        attention.reference_attention with the layer's pos_bias and score (attention_parts).
        doc_start (B, T) (packed documents, t0 = 0): a query sees only the keys of its own document.
        On the SDPA path a batch without a document boundary (doc_start all 0: every row is one document,
        perhaps begun before the window) keeps the fused is_causal kernels; a batch with one goes through
        reference_attention for all its rows: SDPA on chunks of queries with a (B, 1, chunk, T) mask, so
        memory grows as B·chunk·T, never T×T. (One decision per batch, not per row: no data-dependent
        shapes for torch.compile, and the masked kernels are exact for a row without a boundary too.)
        """
        dropout_p = self.dropout if self.training else 0.0
        s = self.ssmax.scale if self.ssmax is not None else None
        if self.config.attn_impl == "triton":
            return self.attend_triton(q, k, v, t0, s, doc_start)
        if self.pos_bias is None and self.score is None and s is None and q.shape[2] == k.shape[2] and (
                doc_start is None or not doc_start.any()):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        b = self.pos_bias  # SSMax scales (q·k/√D + b) for BAM, only q·k/√D for ALiBi, FIRE and the others (SPEC §2)
        in_ssmax, toeplitz = getattr(b, "in_ssmax", False), getattr(b, "toeplitz", False)
        # with no gradient taken (evaluation), keys whose weight a local prior makes negligible are left out, exactly
        return reference_attention(q, k, v, t0, bias_fn=b, ssmax_scale=s, ssmax_max_n=self.ssmax_max_n,
                                   score_fn=self.score, dropout_p=dropout_p,
                                   bias_in_ssmax=in_ssmax, bias_toeplitz=toeplitz, doc_start=doc_start,
                                   skip_far=not torch.is_grad_enabled())

    def attend_triton(self, q, k, v, t0, ssmax_scale, doc_start=None):
        """The fused kernels of kernels.py (CUDA, or CPU under TRITON_INTERPRET=1): BAM and TAPA (either phase),
        with or without SSMax, doc_start (B, T) or None. Raises InputError for attention dropout in training."""
        import kernels  # imported here so the model runs where triton is not installed
        cfg = self.config
        if self.training and self.dropout > 0:
            raise InputError("attn_impl='triton' has no attention dropout; set dropout=0.0 or attn_impl='torch'")
        if isinstance(self.pos_bias, GGDPrior):
            p = self.pos_bias
            return kernels.bam_attention(q, k, v, p.log_scale, p.shape, p.loc, ssmax_scale, q_offset=t0,
                                         doc_start=doc_start)
        return kernels.tapa_attention(q, k, v, cfg.tapa_theta, cfg.tapa_alpha, q_offset=t0, ssmax_scale=ssmax_scale,
                                      phase=cfg.tapa_phase, doc_start=doc_start)


class MLP(nn.Module):
    """GPT-2 feed-forward block: (B, T, C) -> (B, T, C) through 4·C GELU units."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config, layer=0, shared_prior=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer, shared_prior)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, t0, kv=None, doc_start=None, keep_last=None):
        """x (B, T, C) -> (B, T, C), or the last keep_last positions only (B, keep_last, C); and the
        layer's (k, v) of every position (CausalSelfAttention.forward)."""
        a, kv = self.attn(self.ln_1(x), t0, kv, doc_start, keep_last)
        x = (x if keep_last is None else x[:, -keep_last:]) + a
        return x + self.mlp(self.ln_2(x)), kv


class GPT(nn.Module):
    """GPT-2 style language model; see the module docstring for the positional variants."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        shared = shared_prior(config)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, layer, shared) for layer in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        wpe = position_embedding(config)
        if wpe is not None:  # GPT-2's name for the learned table; the sinusoid has no parameters
            self.transformer["wpe"] = wpe
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # scaled init of the residual projections (GPT-2)
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def max_length(self):
        """The longest sequence (in tokens, cache included) this model can run: the rows of a learned position
        table (block_size for pos='learned': it has embeddings for those positions only), unbounded (math.inf)
        otherwise."""
        wpe = self.transformer["wpe"] if "wpe" in self.transformer else None
        return wpe.num_embeddings if isinstance(wpe, nn.Embedding) else math.inf

    def get_num_params(self, non_embedding=True):
        """Number of parameters (each shared tensor once); minus wpe if non_embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= sum(p.numel() for p in self.transformer.wpe.parameters())
        return n

    def new_cache(self):
        """An empty KV cache for forward(..., cache=): one (k, v) slot per layer."""
        return [None] * self.config.n_layer

    def forward(self, idx, targets=None, cache=None, keep_last=1, doc_ids=None):
        """Logits (and loss) for the tokens idx.

        idx: (B, T) token ids. Without cache they sit at positions 0..T−1; with a
        cache (from new_cache(), extended in place) at t0..t0+T−1, t0 = tokens cached.
        targets: (B, T) ids, −1 ignored -> logits (B, T, V) and the mean cross-entropy.
        Without targets: logits of the last keep_last positions, (B, keep_last, V)
        (keep_last=None: all T), and loss None. The last layer then attends with those queries only (the
        other positions' outputs of the last layer reach no logit; its keys and values still count and
        are cached), so a long prefill pays the last layer's attention for keep_last queries, not T.
        doc_ids: (B, T) integer document ids of packed documents (SPEC §2), non-decreasing along T, equal
        ids = one document; a document that begins before the window counts from position 0. Each
        document then attends only within itself, SSMax's n and the learned/sinusoidal positions (and
        FIRE's normaliser) count from its first token: its logits are those of the document run alone.
        Raises ValueError for pos='learned' past block_size, InputError (a ValueError) for doc_ids with
        a cache or of another shape than idx, ValueError for decreasing doc_ids.
        """
        B, T = idx.size()
        t0 = 0 if cache is None or cache[0] is None else cache[0][0].shape[2]
        if t0 + T > self.max_length:
            raise ValueError(f"pos={self.config.pos!r} has embeddings for block_size={self.max_length} positions, "
                             f"asked for {t0 + T}; use a variant that extrapolates or a shorter input")
        pos = torch.arange(t0, t0 + T, device=idx.device)  # (T,)
        doc_start = None
        if doc_ids is not None:
            if cache is not None:
                raise InputError("doc_ids (packed documents) are for whole windows: drop cache= or doc_ids=")
            if doc_ids.shape != idx.shape:
                raise InputError(f"doc_ids must have idx's shape {tuple(idx.shape)}, got {tuple(doc_ids.shape)}")
            doc_start = document_starts(doc_ids)  # (B, T), once for every layer
            pos = pos - doc_start  # (B, T): the position inside each token's document
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(pos).to(x.dtype)  # (T, C) or (B, T, C)
        x = self.transformer.drop(x)
        # without targets the last layer needs its queries at the kept positions only (its keys and values at all)
        last_keep = min(keep_last, T) if targets is None and keep_last is not None and doc_ids is None else None
        for layer, block in enumerate(self.transformer.h):
            keep = last_keep if layer == self.config.n_layer - 1 else None
            x, kv = block(x, t0, None if cache is None else cache[layer], doc_start, keep)
            if cache is not None:
                cache[layer] = kv
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        if keep_last is not None:
            x = x[:, -keep_last:]
        return self.lm_head(x), None

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, lr_mults=None):
        """AdamW with weight decay on matrices only (SPEC §1, §2).

        Parameters marked with an `optim_group` attribute (the BAM prior's "bam_shape" and
        "bam_scale", SSMax's "ssmax", FIRE's "fire") get a group of their own with no weight decay and a
        learning rate of lr_mults[group] (default 1) times the base rate; every group holds
        its multiplier as "lr_mult" (train.py sets lr = base · lr_mult at each step).
        Biases and norms get no decay either. Raises ValueError for a negative multiplier.
        """
        lr_mults = lr_mults or {}
        if any(m < 0 for m in lr_mults.values()):
            raise ValueError(f"learning-rate multipliers must be >= 0, got {lr_mults}")
        decay, no_decay, marked = [], [], {}
        for p in self.parameters():
            if not p.requires_grad:
                continue
            group = getattr(p, "optim_group", None)
            if group is not None:
                marked.setdefault(group, []).append(p)
            else:
                (decay if p.dim() >= 2 else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": weight_decay, "lr_mult": 1.0, "name": "decay"},
                  {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0, "name": "no_decay"}]
        groups += [{"params": ps, "weight_decay": 0.0, "lr_mult": float(lr_mults.get(g, 1.0)), "name": g}
                   for g, ps in sorted(marked.items())]
        fused = device_type == "cuda"
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate, betas=betas, fused=fused)

    def prior_state(self):
        """Per-layer positional parameters, for logs and plots: a dict of lists (n_layer × n_head),
        "shape" = β and "scale" = c of the BAM prior (pos='bam'), "ssmax" = s (ssmax=True; None for a layer
        that ssmax_layers leaves out); {} if none."""
        out = {}
        for block in self.transformer.h:
            attn = block.attn
            if isinstance(attn.pos_bias, GGDPrior):
                out.setdefault("shape", []).append(attn.pos_bias.shape.tolist())
                out.setdefault("scale", []).append(attn.pos_bias.log_scale.exp().tolist())
            if self.config.ssmax:  # None for a layer without it (ssmax_layers)
                out.setdefault("ssmax", []).append(None if attn.ssmax is None else attn.ssmax.scale.tolist())
        return out

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prefill_chunk=1024, vocab_size=None):
        """Sample max_new_tokens tokens after idx (B, T) with the KV cache; returns (B, T + max_new_tokens).

        The prompt is prefilled in chunks of prefill_chunk tokens. No cropping:
        variants that extrapolate go past block_size; pos='learned' raises ValueError.
        temperature > 0; top_k keeps the k most likely tokens; vocab_size: sample only ids
        below it (the tokenizer's size: GPT-2's 50257 is padded to 50304 in the model).
        """
        if idx.size(1) + max_new_tokens > self.max_length:
            raise ValueError(f"pos={self.config.pos!r} cannot generate past block_size={self.max_length} "
                             f"({idx.size(1)} prompt + {max_new_tokens} new tokens)")
        cache = self.new_cache()
        for c0 in range(0, idx.size(1), prefill_chunk):
            logits, _ = self(idx[:, c0:c0 + prefill_chunk], cache=cache)
        for _ in range(max_new_tokens):
            logits = logits[:, -1, :vocab_size] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, _ = self(idx_next, cache=cache)
        return idx
