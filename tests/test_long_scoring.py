"""The exact fast path for long prompts (issue 25, docs/spec.md §5): far keys left out by skip_far, the last
layer's queries at the scored positions only (keep_last), and passkey runs that resume. Every fast result is
checked against the plain computation (every key, every query) in float64."""
import json
import math

import pytest
import torch

import attention
import evaluate
import passkey
from attention import ALiBi, first_needed_key, far_key_profile, reference_attention, ssmax_factor
from attention_bam import GGDPrior
from configurator import NanoPEError, resume_or_new, write_atomic
from data.passkey import passkey_min_length, passkey_prompt
from data.tokenizer import get_tokenizer
from conftest import make_tiny_gpt
from test_passkey import CopyStub

B, H, T, D = 2, 4, 300, 16


def local_bias(kind):
    """A Toeplitz bias module that makes far keys negligible within T = 300: BAM with β from sub- to
    super-linear (inside SSMax), or ALiBi with steeper slopes than its own (added after SSMax)."""
    if kind == "alibi":
        alibi = ALiBi(H).double()
        alibi.slopes = torch.tensor([2.0, 1.5, 1.0, 0.8], dtype=torch.float64)
        return alibi
    prior = GGDPrior(H, shape_init=1.0, scale_init=2.0).double()
    with torch.no_grad():
        prior.shape.copy_(torch.tensor([0.8, 1.0, 1.3, 2.0]))
    return prior


@pytest.mark.parametrize("kind", ["bam", "alibi"])
@pytest.mark.parametrize("ssmax", [False, True])
@pytest.mark.parametrize("q_offset", [0, 37])
def test_skip_far_equals_every_key(kind, ssmax, q_offset):
    """skip_far gives the full attention's output, and it does leave keys out: NaN in the values of the keys
    it skips reaches no output (with every key, the same NaN would)."""
    torch.manual_seed(0)
    Tq = T - q_offset
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64) for n in (Tq, T, T))
    bias = local_bias(kind)
    s = torch.tensor([0.3, 0.5, 0.8, 1.2], dtype=torch.float64) if ssmax else None
    kw = dict(q_offset=q_offset, bias_fn=bias, ssmax_scale=s, bias_in_ssmax=bias.in_ssmax, bias_toeplitz=True,
              chunk_size=32)
    with torch.no_grad():
        full = reference_attention(q, k, v, **kw)
        # the first key the last chunk needs, by the bound; every earlier key gets NaN values
        c0 = (Tq - 1) // 32 * 32
        t0 = q_offset + c0
        q_pos = torch.arange(t0, q_offset + Tq)
        b0, R = far_key_profile(bias, T, "cpu")  # (H,), (H, T)
        f = None if s is None else ssmax_factor(s, q_pos, q.dtype)  # (H, tq, 1)
        v_nan = v.clone()
        firsts = []
        for h in range(H):  # each head from its own first key
            firsts.append(first_needed_key(q[:, h:h + 1, c0:], k[:, h:h + 1, t0:], q_pos, None if f is None else
                                           f[h:h + 1], b0[h:h + 1], R[h:h + 1], k[:, h:h + 1].norm(dim=-1).amax(
                                               dim=(0, 2)), bias.in_ssmax))
            v_nan[:, h, :firsts[-1]] = float("nan")
        assert min(firsts) > 50 and len(set(firsts)) > 1  # local enough to leave keys out; a head's own number
        fast = reference_attention(q, k, v_nan, skip_far=True, **kw)
    torch.testing.assert_close(fast[:, :, c0:], full[:, :, c0:], rtol=1e-12, atol=1e-12)
    assert reference_attention(q, k, v_nan, **kw)[:, :, c0:].isnan().all()  # the plain path does read them
    torch.testing.assert_close(reference_attention(q, k, v, skip_far=True, **kw), full, rtol=1e-12, atol=1e-12)


def test_skip_far_keeps_every_key_for_a_flat_head():
    """A head with β <= 0 (flat or anti-local) gives no bound: nothing is left out."""
    prior = GGDPrior(H, shape_init=[-0.5, 0.0, 1.0, 1.0], scale_init=0.5).double()
    torch.manual_seed(1)
    q, k = torch.randn(1, H, 32, D, dtype=torch.float64), torch.randn(1, H, 300, D, dtype=torch.float64)
    b0, R = far_key_profile(prior, 300, "cpu")
    a = first_needed_key(q, k[:, :, -32:], torch.arange(268, 300), None, b0, R, k.norm(dim=-1).amax(dim=(0, 2)),
                         True)
    assert a == 0


VARIANTS = [(pos, ssmax) for pos in ["nope", "sinusoidal", "learned", "rope", "alibi", "bam", "fire", "tapa"]
            for ssmax in (False, True)]


@pytest.mark.parametrize("pos,ssmax,extra", [(pos, ssmax, {}) for pos, ssmax in VARIANTS] + [
    ("bam", True, dict(ssmax_max_n=[100, None])), ("alibi", True, dict(ssmax_layers=[1]))])
def test_answer_logits_equal_full_forward_in_float64(pos, ssmax, extra, monkeypatch):
    """evaluate.answer_logits (chunked prefill + KV cache, far keys skipped, the last layer at the answer
    positions only) equals one plain forward with gradients on (every key and query), in float64."""
    firsts = []  # the first key of each chunk that skip_far computed (BAM, ALiBi)

    def recording(*args):
        firsts.append(first_needed_key(*args))
        return firsts[-1]
    monkeypatch.setattr(attention, "first_needed_key", recording)
    tok = get_tokenizer("byte")
    model = make_tiny_gpt(pos, ssmax, block_size=512, **extra).double()
    if pos == "bam":  # a local prior, so that keys are skipped at this length
        with torch.no_grad():
            for layer in model.transformer.h:
                layer.attn.pos_bias.shape.fill_(1.0)
                layer.attn.pos_bias.log_scale.fill_(math.log(0.5))
    prompt, answer = passkey_prompt(tok, 480, 0.3, 24680)
    got = evaluate.answer_logits(model, [prompt], [answer], chunk=96)[0]  # (A, V)
    with torch.enable_grad():
        full, _ = model(torch.tensor([prompt + answer]), keep_last=None)  # (1, T, V)
    P, A = len(prompt), len(answer)
    torch.testing.assert_close(got, full[0, P - 1:P + A - 1].detach(), rtol=1e-10, atol=1e-10)
    if pos == "bam":
        assert max(firsts) > 100  # far keys were left out


@pytest.mark.parametrize("pos,ssmax", [("bam", True), ("alibi", False), ("rope", True), ("tapa", False)])
def test_keep_last_equals_full_forward(pos, ssmax):
    """model(idx, keep_last=k) with and without a cache: the last layer at k queries equals the full forward's
    last k logits."""
    model = make_tiny_gpt(pos, ssmax, block_size=128).double()
    idx = torch.randint(0, 257, (2, 90))
    with torch.enable_grad():
        full, _ = model(idx, keep_last=None)
    with torch.no_grad():
        for keep in (1, 5, 90):
            got, _ = model(idx, keep_last=keep)
            torch.testing.assert_close(got, full[:, -keep:].detach(), rtol=1e-10, atol=1e-10)
        cache = model.new_cache()
        model(idx[:, :50], cache=cache, keep_last=1)
        got, _ = model(idx[:, 50:], cache=cache, keep_last=7)
    torch.testing.assert_close(got, full[:, -7:].detach(), rtol=1e-10, atol=1e-10)


class Interrupt(Exception):
    pass


def test_run_passkey_resumes_where_it_stopped(tmp_path):
    """A run cut after its second batch goes on from there and ends with the uninterrupted run's results;
    the prompts already scored are not scored again."""
    tok = get_tokenizer("byte")
    lengths = [passkey_min_length(tok), 600]
    kw = dict(depths=3, samples=2, seed=5, chunk=64, progress=False, batch_size=2)
    whole = passkey.run_passkey(CopyStub(), tok, lengths, **kw)
    saved = []

    def save_then_cut(results):
        saved.append(list(results))
        if len(saved) == 2:
            raise Interrupt
    with pytest.raises(Interrupt):
        passkey.run_passkey(CopyStub(), tok, lengths, save=save_then_cut, **kw)
    done = saved[-1]
    assert 0 < len(done) < len(whole)

    class Counting(CopyStub):
        rows = 0

        def forward(self, idx, **kw):
            if kw.get("cache") is not None and kw["cache"][0] is None:  # a new prompt batch
                Counting.rows += idx.shape[0]
            return super().forward(idx, **kw)
    resumed = passkey.run_passkey(Counting(), tok, lengths, done=done, **kw)
    assert resumed == whole
    assert Counting.rows == len(whole) - len(done)


def test_resume_or_new_keeps_other_settings_apart(tmp_path):
    out = str(tmp_path / "passkey.json")
    settings = {"ckpt_sha256": "ab", "lengths": [320], "depths": 5}
    with open(out, "w") as f:
        json.dump({"meta": {"settings": settings, "finished": False}, "results": [{"length": 320}]}, f)
    path, done = resume_or_new(out, settings, overwrite=False)
    assert path == out and done == [{"length": 320}]  # same settings, unfinished: resumed
    path, done = resume_or_new(out, {**settings, "depths": 3}, overwrite=False)
    assert path != out and done == []  # other settings: a new file beside it, the old one kept


def test_write_atomic_failure_leaves_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")

    def fail(tmp):
        with open(tmp, "w") as f:
            f.write("part")
        raise OSError(28, "No space left on device")
    with pytest.raises(NanoPEError, match="No space left"):
        write_atomic(str(path), fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
