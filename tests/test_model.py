"""Model core (issue: model core): every check is against an independent computation:
a naive loop, a closed form, or an identity from SPEC §1–§4."""
import math

import pytest
import torch
import torch.nn as nn

from attention import SSMax, alibi_slopes, reference_attention
from attention_bam import ggd_bias, bam_attention_ref
from attention_fire import FIREBias
from attention_tapa import tapa_scores, tapa_attention_ref
from model import GPT, GPTConfig, POS_VARIANTS
from position_embeddings import apply_rope, sinusoidal_embedding

VARIANTS = [(pos, ss) for pos in POS_VARIANTS for ss in (False, True)]
EXTRAPOLATING = [v for v in VARIANTS if v[0] != "learned"]


def tiny(pos, ssmax=False, **kw):
    args = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, pos=pos, ssmax=ssmax, bias=True)
    args.update(kw)
    torch.manual_seed(0)
    m = GPT(GPTConfig(**args))
    with torch.no_grad():  # make the prior and SSMax non-trivial so mistakes show
        for name, p in m.named_parameters():
            if name.endswith("ssmax.scale"):
                p.uniform_(0.5, 1.5)
    return m.eval()


# ---------------------------------------------------------------- SPEC §1, §4

def test_alibi_slopes_closed_form():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** (-k) for k in range(1, 9)]))
    assert torch.allclose(alibi_slopes(16), torch.tensor([2.0 ** (-0.5 * k) for k in range(1, 17)]))
    # 6 heads: the 4 slopes of H=4 (2^-2k), then every other slope of H=8 (2^-1, 2^-3)
    assert torch.allclose(alibi_slopes(6), torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))
    with pytest.raises(ValueError):
        alibi_slopes(0)


@pytest.mark.parametrize("shape", [-0.5, 0.3, 1.0, 2.0])
@pytest.mark.parametrize("with_loc", [False, True])
def test_ggd_bias_against_naive_loop(shape, with_loc):
    H, q_pos, k_pos = 3, torch.arange(5, 9), torch.arange(0, 9)
    log_scale = torch.log(torch.tensor([0.5, 0.1, 0.02]))
    shapes = torch.full((H,), shape)
    loc = torch.tensor([0.0, 0.3, -0.2]) if with_loc else None
    b = ggd_bias(q_pos, k_pos, log_scale, shapes, loc)
    assert b.shape == (H, 4, 9)
    for h in range(H):
        c = math.exp(log_scale[h].item())
        mu = 0.0 if loc is None else math.exp(loc[h].item()) - math.exp(-loc[h].item())
        for a, i in enumerate(q_pos.tolist()):
            for j in k_pos.tolist():
                expected = -c * (abs((j - i) - mu) + 1e-5) ** shape
                assert b[h, a, j].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    if shape < 0 and not with_loc:  # the diagonal gets −c·ε^β, a large negative bias
        assert b[0, 0, 5].item() == pytest.approx(-0.5 * 1e-5 ** shape, rel=1e-5)


def naive_attention(q, k, v, q_offset, bias=None, ssmax=None, bias_in_ssmax=True):
    """One query at a time, plain Python softmax over the visible keys (SPEC §1, §2)."""
    B, H, Tq, D = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for r in range(Tq):
                i = q_offset + r
                z = torch.stack([q[b, h, r] @ k[b, h, j] / math.sqrt(D) for j in range(i + 1)])
                bb = torch.tensor([bias(h, i, j) for j in range(i + 1)]) if bias else torch.zeros(i + 1)
                if ssmax is not None:
                    f = ssmax[h] * math.log(i + 1)
                    z = f * (z + bb) if bias_in_ssmax else f * z + bb
                else:
                    z = z + bb
                p = torch.exp(z - z.max())
                out[b, h, r] = (p / p.sum()) @ v[b, h, : i + 1]
    return out


@pytest.mark.parametrize("q_offset,Tq,Tk", [(0, 7, 7), (4, 3, 7), (2, 3, 9)])
@pytest.mark.parametrize("use_ssmax", [False, True])
def test_bam_reference_attention_against_naive_loop(q_offset, Tq, Tk, use_ssmax):
    torch.manual_seed(1)
    B, H, D = 2, 2, 8
    q, k, v = torch.randn(B, H, Tq, D), torch.randn(B, H, Tk, D), torch.randn(B, H, Tk, D)
    log_scale, shape = torch.log(torch.tensor([0.3, 0.05])), torch.tensor([-0.5, 1.7])
    s = torch.tensor([0.7, 1.3]) if use_ssmax else None

    def bias(h, i, j):
        return -math.exp(log_scale[h].item()) * (abs(j - i) + 1e-5) ** shape[h].item()

    expected = naive_attention(q, k, v, q_offset, bias, s)
    got = bam_attention_ref(q, k, v, log_scale, shape, ssmax_scale=s, q_offset=q_offset, chunk_size=2)
    assert torch.allclose(got, expected, atol=1e-5)


def test_ssmax_factor_is_s_log_n_with_cache_offset():
    s = SSMax(3)
    with torch.no_grad():
        s.scale.copy_(torch.tensor([0.5, 1.0, 2.0]))
    q_pos = torch.arange(10, 14)  # a chunk after 10 cached tokens
    f = s(q_pos)
    for h, sh in enumerate([0.5, 1.0, 2.0]):
        for a, i in enumerate(range(10, 14)):
            assert f[h, a, 0].item() == pytest.approx(sh * math.log(i + 1))


def test_ssmax_init_sets_every_head_and_layer():
    """config.ssmax_init is s_h at init (SPEC §2): the factor at position i is ssmax_init·log(i + 1)."""
    m = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=3, n_embd=24, pos="bam", ssmax=True,
                      ssmax_init=0.25))
    for block in m.transformer.h:
        f = block.attn.ssmax(torch.arange(5))
        for i in range(5):
            assert torch.allclose(f[:, i, 0], torch.full((3,), 0.25 * math.log(i + 1)))


def test_ssmax_on_baselines_scales_qk_only_and_adds_alibi_after():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    slopes, s = torch.tensor([0.5, 0.25]), torch.tensor([0.8, 1.2])
    expected = naive_attention(q, k, v, 5, lambda h, i, j: -slopes[h].item() * abs(j - i), s, bias_in_ssmax=False)
    got = reference_attention(q, k, v, 5, bias_fn=lambda qp, kp: -slopes[:, None, None] * (kp[None] - qp[:, None]).abs(),
                              ssmax_scale=s, bias_in_ssmax=False)
    assert torch.allclose(got, expected, atol=1e-5)


# ---------------------------------------------------------------- identities of SPEC §1

def test_bam_at_init_equals_alibi():
    alibi, bam = tiny("alibi"), tiny("bam")
    missing, unexpected = bam.load_state_dict(alibi.state_dict(), strict=False)
    assert all(".pos_bias." in n for n in missing) and not unexpected
    x = torch.randint(0, 37, (2, 12))
    la, _ = alibi(x, x)
    lb, _ = bam(x, x)
    assert torch.allclose(la, lb, atol=1e-4)


def test_bam_with_zero_scale_equals_nope():
    nope, bam = tiny("nope"), tiny("bam", bam_shape_init=0.7)
    bam.load_state_dict(nope.state_dict(), strict=False)
    with torch.no_grad():
        for block in bam.transformer.h:
            block.attn.pos_bias.log_scale.fill_(-1e4)  # c = exp(-1e4) = 0: uniform prior
    x = torch.randint(0, 37, (2, 12))
    assert torch.allclose(nope(x, x)[0], bam(x, x)[0], atol=1e-5)


@pytest.mark.parametrize("dtype,shape", [(torch.float16, -1.0), (torch.float32, -8.0)])
@pytest.mark.parametrize("use_ssmax", [False, True])
def test_bam_negative_shape_stays_finite(dtype, shape, use_ssmax):
    """A shape β < 0 gives the diagonal the bias −c·ε^β: 1e5·c at β = −1 (beyond fp16), 1e40·c at β = −8 (beyond
    fp32). Query 0 sees only that key, so its output is v[0]; the rest must match the float64 computation."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g) for _ in range(3))
    log_scale, shape_t = torch.zeros(2), torch.tensor([shape, 0.5])
    s = torch.tensor([1.0, 0.8]) if use_ssmax else None
    out = bam_attention_ref(q.to(dtype), k.to(dtype), v.to(dtype), log_scale, shape_t, ssmax_scale=s)
    ref = bam_attention_ref(q.double(), k.double(), v.double(), log_scale.double(), shape_t.double(),
                            ssmax_scale=s.double() if use_ssmax else None)
    assert torch.isfinite(out).all()
    assert torch.allclose(ref[:, :, 0], v[:, :, 0].double())
    assert torch.allclose(out.double(), ref, atol=2e-3 if dtype == torch.float16 else 1e-5)


# ---------------------------------------------------------------- SPEC §3

@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_tapa_scores_against_naive_loop(phase):
    torch.manual_seed(3)
    B, H, D, theta, alpha = 1, 2, 8, 0.5, 0.1
    q, k = torch.randn(B, H, 3, D), torch.randn(B, H, 6, D)
    q_pos, k_pos = torch.arange(3, 6), torch.arange(6)
    got = tapa_scores(q, k, q_pos, k_pos, theta, alpha, phase)
    da = 4
    for h in range(H):
        for a, i in enumerate(q_pos.tolist()):
            for j in k_pos.tolist():
                qa, qp, ka, kp = q[0, h, a, :da], q[0, h, a, da:], k[0, h, j, :da], k[0, h, j, da:]
                amp = float(qa @ ka) / math.sqrt(theta * D)
                phi = float(qp @ kp) if phase == "quadratic" else float(qp.sum() + kp.sum())
                phi /= math.sqrt((1 - theta) * D)
                expected = amp * math.cos(2 * math.pi * abs(i - j) ** alpha * phi)
                assert got[0, h, a, j].item() == pytest.approx(expected, rel=1e-4, abs=1e-5)
                if i == j:  # cos term is 1 on the diagonal: the score is the amplitude alone
                    assert got[0, h, a, j].item() == pytest.approx(amp, rel=1e-5, abs=1e-6)


def test_tapa_theta_splits_amplitude_first():
    q = torch.zeros(1, 1, 1, 8)
    q[..., :2] = 1.0  # only amplitude dims for theta=0.25
    k = q.clone()
    s = tapa_scores(q, k, torch.tensor([0]), torch.tensor([0]), theta=0.25)
    assert s.item() == pytest.approx(2 / math.sqrt(2))


def test_tapa_attention_ref_with_offset_matches_full():
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    full = tapa_attention_ref(q, k, v, chunk_size=3)
    tail = tapa_attention_ref(q[:, :, 6:], k, v, q_offset=6)
    assert torch.allclose(full[:, :, 6:], tail, atol=1e-6)


# ---------------------------------------------------------------- SPEC §4 baselines

def test_rope_depends_on_relative_position_only():
    torch.manual_seed(5)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    dots = [(apply_rope(q, torch.tensor([i]), 10000.0) * apply_rope(k, torch.tensor([i - 3]), 10000.0)).sum()
            for i in (3, 10, 500)]
    assert torch.allclose(torch.stack(dots), dots[0].expand(3), atol=1e-4)


def test_sinusoidal_closed_form():
    e = sinusoidal_embedding(torch.tensor([0, 7]), 8)
    for k in range(4):
        w = 10000 ** (-2 * k / 8)
        assert e[1, 2 * k].item() == pytest.approx(math.sin(7 * w), abs=1e-6)
        assert e[1, 2 * k + 1].item() == pytest.approx(math.cos(7 * w), abs=1e-6)
    assert torch.allclose(e[0, 1::2], torch.ones(4))


def test_sinusoidal_model_adds_the_scaled_sinusoid():
    """The first block's input is wte(idx) + 0.02·√2·PE: the sinusoid at the token embeddings' init std (rms 0.02)."""
    m = tiny("sinusoidal", dropout=0.0)
    seen = []
    m.transformer.drop.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    idx = torch.randint(0, 37, (1, 9))
    m(idx)
    pe = torch.tensor([[math.sin(t * 10000 ** (-2 * (d // 2) / 32)) if d % 2 == 0 else
                        math.cos(t * 10000 ** (-2 * (d // 2) / 32)) for d in range(32)] for t in range(9)])
    assert torch.allclose(seen[0][0], m.transformer.wte(idx)[0] + 0.02 * math.sqrt(2) * pe, atol=1e-6)


# ---------------------------------------------------------------- the whole model

@pytest.mark.parametrize("pos,ssmax", VARIANTS)
def test_causality(pos, ssmax):
    m = tiny(pos, ssmax)
    x = torch.randint(0, 37, (1, 14))
    y = x.clone()
    y[0, 9] = (x[0, 9] + 1) % 37
    lx, _ = m(x, keep_last=None)
    ly, _ = m(y, keep_last=None)
    assert torch.allclose(lx[:, :9], ly[:, :9], atol=1e-5)
    assert not torch.allclose(lx[:, 9:], ly[:, 9:], atol=1e-5)


@pytest.mark.parametrize("pos,ssmax", VARIANTS)
def test_cache_prefill_and_decode_equal_full_forward(pos, ssmax):
    m = tiny(pos, ssmax)
    T = 16 if pos == "learned" else 40  # past block_size=16 for the variants that extrapolate
    x = torch.randint(0, 37, (2, T))
    full, _ = m(x, keep_last=None)  # (B, T, V)
    cache, pieces = m.new_cache(), []
    for c0, c1 in [(0, 5), (5, 12), (12, 13)] + [(t, t + 1) for t in range(13, T)]:
        logits, _ = m(x[:, c0:c1], cache=cache, keep_last=None)
        pieces.append(logits)
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-4)


def test_logits_of_last_positions_only_without_targets():
    m = tiny("bam", True)
    x = torch.randint(0, 37, (2, 20))
    last, loss = m(x)
    assert last.shape == (2, 1, 37) and loss is None
    full, _ = m(x, keep_last=None)
    assert torch.allclose(last[:, 0], full[:, -1], atol=1e-5)


def count(cfg_kw):
    return sum(p.numel() for p in GPT(GPTConfig(**cfg_kw)).parameters())


def test_parameter_counts():
    base = dict(block_size=8, vocab_size=11, n_layer=12, n_head=16, n_embd=32)
    nope = count(dict(base, pos="nope"))
    assert count(dict(base, pos="bam")) - nope == 2 * 16 * 12 == 384
    assert count(dict(base, pos="bam", bam_global_prior=True)) - nope == 2 * 16
    assert count(dict(base, pos="nope", ssmax=True)) - nope == 16 * 12
    assert count(dict(base, pos="tapa")) == nope
    assert count(dict(base, pos="alibi")) == nope == count(dict(base, pos="rope"))


def test_no_weight_decay_on_prior_and_ssmax():
    m = tiny("bam", True)
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    for name, p in m.named_parameters():
        if ".pos_bias." in name or ".ssmax." in name or p.dim() < 2:
            assert id(p) in no_decay, name
        else:
            assert id(p) not in no_decay, name


def test_learned_past_block_size_raises():
    m = tiny("learned")
    with pytest.raises(ValueError, match="block_size=16"):
        m(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size=16"):
        m.generate(torch.zeros(1, 10, dtype=torch.long), 7)


def test_generate_samples_only_the_tokenizers_ids():
    """vocab_size = the tokenizer's size: the model's padding rows (GPT-2: 50257 of 50304) are never sampled."""
    m = tiny("rope")
    torch.manual_seed(0)
    out = m.generate(torch.zeros(2, 3, dtype=torch.long), 40, temperature=50.0, vocab_size=5)
    assert out[:, 3:].max() < 5 and out[:, 3:].max() >= 1
    assert m.generate(torch.zeros(2, 3, dtype=torch.long), 40, temperature=50.0)[:, 3:].max() >= 5  # all 37 without


@pytest.mark.parametrize("pos, bad, message", [
    ("tapa", dict(tapa_alpha=-0.1), "tapa_alpha must be >= 0"),
    ("tapa", dict(tapa_phase="cubic"), "unknown tapa_phase 'cubic'"),
    ("tapa", dict(tapa_theta=0.01), "leaves no amplitude"),
    ("rope", dict(n_embd=30, n_head=2), "even head dim"),  # head dim 15
    ("bam", dict(bam_scale_init=0), "bam_scale_init must be 'alibi' or a number > 0"),
    ("bam", dict(bam_shape_init=[1, "linear"], bam_global_prior=True), "give one value for all layers"),
    ("alibi", dict(attn_impl="triton"), "use attn_impl='torch'"),
])
def test_each_variant_checks_its_own_keys(pos, bad, message):
    """A variant's bad key is refused by GPTConfig, naming the fix; the same key is ignored by the other
    variants, which do not read it (the checks live with each variant: model.check_variant_settings)."""
    base = dict(n_layer=2, n_head=4, n_embd=32)
    with pytest.raises(ValueError, match=message):
        GPTConfig(**dict(base, pos=pos, **bad))
    other = "bam" if pos == "alibi" else "nope" if "n_embd" not in bad else "alibi"
    GPTConfig(**dict(base, pos=other, **bad))


def test_unknown_pos_lists_valid_names():
    with pytest.raises(ValueError, match="nope, sinusoidal, learned, rope, alibi, bam, tapa, fire"):
        GPTConfig(pos="xpos")


@pytest.mark.parametrize("pos", ["rope", "bam", "tapa", "fire"])
def test_generate_past_block_size_matches_greedy_full_forward(pos):
    m = tiny(pos, True)
    x = torch.randint(0, 37, (1, 12))
    out = m.generate(x, 10, top_k=1, prefill_chunk=5)  # top_k=1: greedy
    assert out.shape == (1, 22)
    logits, _ = m(out[:, :-1], keep_last=None)
    assert torch.equal(logits[0, 11:].argmax(-1), out[0, 12:])


# ---------------------------------------------------------------- SPEC §8: FIRE

def naive_fire(fire, h, i, j):
    """b_h(i, j) = f(ψ(i − j)/ψ(max(L, i))), ψ(x) = log(c·x + 1), f a one-hidden-layer ReLU MLP: by hand."""
    c, L = math.exp(fire.log_c.item()), fire.threshold.item()
    x = math.log(c * (i - j) + 1) / math.log(c * max(L, i) + 1)
    hidden = [max(0.0, w * x + b) for w, b in zip(fire.w1.tolist(), fire.b1.tolist())]
    return fire.b2[h].item() + sum(w * u for w, u in zip(fire.w2[h].tolist(), hidden))


@pytest.mark.parametrize("q0", [3, 30])  # queries below and past the threshold L = 16
def test_fire_bias_against_naive_loop(q0):
    torch.manual_seed(6)
    fire = FIREBias(3, train_length=16)
    with torch.no_grad():
        fire.log_c.fill_(math.log(0.7))
    q_pos, k_pos = torch.arange(q0, q0 + 4), torch.arange(q0 + 4)
    b = fire(q_pos, k_pos)
    assert b.shape == (3, 4, q0 + 4)
    for h in range(3):
        for a, i in enumerate(q_pos.tolist()):
            for j in range(i + 1):
                assert b[h, a, j].item() == pytest.approx(naive_fire(fire, h, i, j), rel=1e-5, abs=1e-5)
    x = fire.normalized_distance(q_pos, k_pos)
    assert ((x >= 0) & (x <= 1)).all()
    if q0 > 16:  # past L the normaliser is ψ(i): the first key is at normalised distance 1 for every query
        assert torch.allclose(x[:, 0], torch.ones(4))


def test_fire_parameters_are_marked_and_count():
    base = dict(block_size=8, vocab_size=11, n_layer=3, n_head=4, n_embd=32)
    assert count(dict(base, pos="fire")) - count(dict(base, pos="nope")) == 3 * (32 + 32 + 4 * 32 + 4 + 2)
    m = GPT(GPTConfig(**base, pos="fire"))
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    fire = [g for g in opt.param_groups if g["name"] == "fire"]
    assert len(fire) == 1 and fire[0]["weight_decay"] == 0.0 and len(fire[0]["params"]) == 3 * 6


# ---------------------------------------------------------------- the switch point: declarations, not names

class Tilt(nn.Module):
    """A bias no variant uses, b_h(i, j) = −w_h·(i − j)²/10, with a 2-D parameter (which would be decayed
    without its marker). It declares neither `toeplitz` nor `in_ssmax`: the safe defaults apply."""

    def __init__(self, n_head):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.1, 0.4, n_head)[:, None])  # (H, 1)
        self.w.optim_group = "tilt"

    def forward(self, q_pos, k_pos):
        d = (q_pos[:, None] - k_pos[None, :]).float()
        return -self.w[:, :, None] * d[None] ** 2 / 10  # (H, Tq, Tk)


def test_a_new_bias_module_is_applied_and_not_decayed():
    """The attention path chooses SDPA from the layer's declarations: a bias module put in the pos_bias slot of a
    NoPE model (under any class name) is applied, with SSMax too, and its marked parameter gets no weight decay."""
    m = tiny("nope", ssmax=True)
    plain = m(torch.arange(12)[None] % 37, keep_last=None)[0]
    for block in m.transformer.h:
        block.attn.pos_bias = Tilt(4)
    attn = m.transformer.h[0].attn
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 9, 8), torch.randn(1, 4, 9, 8)
    s = attn.ssmax.scale.detach()
    w = attn.pos_bias.w.detach()[:, 0]
    expected = naive_attention(q, k, v, 6, lambda h, i, j: -w[h].item() * (i - j) ** 2 / 10, s, bias_in_ssmax=False)
    assert torch.allclose(attn.attend(q, k, v, 6), expected, atol=1e-5)
    assert not torch.allclose(m(torch.arange(12)[None] % 37, keep_last=None)[0], plain, atol=1e-3)
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["tilt"]["weight_decay"] == 0.0 and len(groups["tilt"]["params"]) == 2
    assert all(p.dim() >= 2 for p in groups["decay"]["params"])
    assert not any(p is block.attn.pos_bias.w for block in m.transformer.h for p in groups["decay"]["params"])


def test_checkpoints_with_the_old_prior_keys_load():
    """Checkpoints written before the bias slot was named pos_bias hold the GGD prior under '.prior.'."""
    a, b = tiny("bam"), tiny("bam", bam_shape_init=0.3)
    old = {k.replace(".pos_bias.", ".prior."): v for k, v in a.state_dict().items()}
    assert any(".prior." in k for k in old)
    b.load_state_dict(old)  # strict
    for x, y in zip(a.transformer.h, b.transformer.h):
        assert torch.equal(x.attn.pos_bias.shape, y.attn.pos_bias.shape)


def test_max_length_comes_from_the_position_table():
    assert tiny("learned").max_length == 16
    assert all(tiny(pos).max_length == math.inf for pos in POS_VARIANTS if pos != "learned")


def test_every_spec_citation_resolves_to_a_section_of_docs_spec():
    """Each "SPEC §N" (or "SPEC §N/§M", "§N–§M") in the code names a section "## N." of docs/spec.md."""
    import glob
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sections = set(re.findall(r"^## (\d+)\. ", open(os.path.join(root, "docs", "spec.md")).read(), re.M))
    cited = set()
    for path in glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "data", "*.py")):
        for ref in re.findall(r"SPEC ((?:§\d+(?:[/–-]§?\d+)*(?:, )?)+)", open(path).read()):
            cited.update(re.findall(r"\d+", ref))
    assert cited and cited <= sections, cited - sections
    assert sections == {str(n) for n in range(1, 10)}
