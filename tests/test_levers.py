"""The extrapolation levers (issue 14): per-head shape init of the BAM prior, learning-rate multipliers of the
positional parameters, their logging, the passkey set's padding outside the loss, and the key-attention
diagnostic. Each is checked against an independent computation (closed forms of AdamW's first step, a naive
softmax, the raw token stream)."""
import itertools
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from configurator import InputError
import train
from attention_bam import GGDPrior, ggd_bias, per_head_shape_init
from data.batches import get_batch
from data.passkey import build_dataset, passkey_prompt
from data.tokenizer import get_tokenizer
from model import GPT, GPTConfig
from passkey import key_attention, key_positions

DEFAULTS = train.demo_config()  # the CPU demo's settings: what `python train.py` runs


# ---------------------------------------------------------------- per-head shape init (SPEC §1)

def test_shape_init_options():
    assert per_head_shape_init(0.5, 3).tolist() == [0.5, 0.5, 0.5]
    assert torch.allclose(per_head_shape_init("linear", 4), torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]))
    assert per_head_shape_init([0, -0.5, 2], 3).tolist() == [0.0, -0.5, 2.0]
    for bad in ("flat", [1.0, 2.0], [1, "x", 2], float("nan")):
        with pytest.raises(ValueError, match="bam_shape_init must be a number, 'linear' or 3 numbers"):
            per_head_shape_init(bad, 3)
    with pytest.raises(ValueError, match="bam_shape_init"):  # GPTConfig checks it before any model is built
        GPTConfig(pos="bam", n_head=4, n_embd=32, bam_shape_init=[1, 2])


def test_linear_init_has_a_flat_head_and_an_alibi_head():
    """linspace(0, 1, H): head 0 has β = 0, a bias constant in the distance (NoPE up to a constant);
    the last head has β = 1 with its ALiBi slope, i.e. exactly ALiBi's bias."""
    prior = GGDPrior(4, "linear")
    b = prior(torch.arange(40, 41), torch.arange(0, 41))[:, 0]  # (H, 41): query 40 against keys 0..40
    assert torch.allclose(b[0], b[0, :1].expand(41), atol=1e-5)
    slope = math.exp(prior.log_scale[3].item())
    assert torch.allclose(b[3], -slope * (40 - torch.arange(41.0)), atol=1e-4)


@pytest.mark.parametrize("arg,expected", [("--bam_shape_init=linear", "linear"), ("--bam_shape_init=0.25", 0.25),
                                          ("--bam_shape_init=[0,0.5,1,1]", [0, 0.5, 1, 1])])
def test_shape_init_from_the_command_line(arg, expected):
    cfg = train.get_config([arg], DEFAULTS)
    assert cfg["bam_shape_init"] == expected
    model = GPT(GPTConfig(**{k: cfg[k] for k in train.MODEL_KEYS if k in cfg and k != "vocab_size"}, vocab_size=257))
    for block in model.transformer.h:
        assert torch.allclose(block.attn.pos_bias.shape, per_head_shape_init(expected, cfg["n_head"]))


def test_shape_init_expression_on_the_command_line_names_the_fix():
    """A list with 1/3 in it (Python in a config file, not a literal on the command line) is refused, saying so."""
    with pytest.raises(InputError, match=r"not a Python literal.*1/3 as 0.3333"):
        train.get_config(["--bam_shape_init=[1, [0, 1/3, 1/2, 1]]"], DEFAULTS)


def test_one_entry_per_layer_the_last_serving_the_rest():
    """[1, "linear"] (the demo's): layer 0 all β = 1, every later layer linspace(0, 1, H), for any n_layer and
    n_head; a list of numbers alone stays one value per head, for every layer."""
    for n_layer, n_head in ((1, 2), (2, 4), (3, 8)):
        model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=n_layer, n_head=n_head, n_embd=32, pos="bam",
                              bam_shape_init=[1, "linear"]))
        shapes = model.prior_state()["shape"]
        assert shapes[0] == [1.0] * n_head
        for row in shapes[1:]:
            assert torch.allclose(torch.tensor(row), torch.linspace(0, 1, n_head))
    model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, pos="bam",
                          bam_shape_init=[0, 0.5, 1, 1]))
    assert model.prior_state()["shape"] == [[0.0, 0.5, 1.0, 1.0]] * 2
    with pytest.raises(ValueError, match="one entry per layer"):
        GPTConfig(n_head=4, n_embd=32, pos="bam", bam_shape_init=[1, "linear"], bam_global_prior=True)


# ---------------------------------------------------------------- optimizer groups and multipliers

def test_marked_parameters_get_their_own_groups_without_weight_decay():
    """Groups come from the `optim_group` marker on the parameters, not from their names: a prior stored under
    another attribute name is still found."""
    model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, pos="bam", ssmax=True))
    for block in model.transformer.h:  # rename the modules: nothing may depend on ".prior." in a name
        block.attn.my_bias = block.attn.pos_bias
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu", {"bam_shape": 3.0, "ssmax": 0.0})
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"decay", "no_decay", "bam_shape", "bam_scale", "ssmax"}
    for name, mult in (("bam_shape", 3.0), ("bam_scale", 1.0), ("ssmax", 0.0)):
        assert groups[name]["weight_decay"] == 0.0 and groups[name]["lr_mult"] == mult
        assert len(groups[name]["params"]) == 2  # one tensor per layer
    assert all(p.dim() >= 2 for p in groups["decay"]["params"])
    n_params = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n_params == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="multipliers must be >= 0"):
        model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu", {"ssmax": -1.0})


def test_lr_multipliers_scale_the_first_adamw_step(tmp_path):
    """AdamW's first step moves every parameter with a non-zero gradient by lr·m̂/(√v̂ + eps) = lr·sign(g) (up to
    eps: 0.2% here), plus weight decay, which the positional groups do not have. So after one iteration each β moves by
    exactly lr_0·bam_shape_lr_mult, each log c by lr_0·bam_scale_lr_mult and each s by lr_0·ssmax_lr_mult, where
    lr_0 = learning_rate / (warmup_iters + 1) (get_lr at iteration 0). The values at iteration 0 come from the
    checkpoint's prior_history, which is also what log.txt prints."""
    lr, warmup = 1e-2, 4
    cfg = train.get_config(["--n_layer=2", "--n_head=4", "--n_embd=32", "--batch_size=2", "--eval_iters=1",
                            "--max_iters=1", "--eval_interval=1", f"--learning_rate={lr}", f"--warmup_iters={warmup}",
                            "--bam_shape_lr_mult=5", "--bam_scale_lr_mult=0", "--ssmax_lr_mult=2",
                            "--bam_shape_init=linear", f"--out_dir={tmp_path}"], DEFAULTS)
    train.train(cfg)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    (it0, before), (it1, after) = ckpt["prior_history"]
    assert (it0, it1) == (0, 1)
    lr0 = lr / (warmup + 1)
    for key, mult in (("shape", 5.0), ("scale", 0.0), ("ssmax", 2.0)):
        moved = np.abs(np.array(after[key]) - np.array(before[key]))
        if key == "scale":  # c = exp(log c) does not move with a multiplier of 0
            assert np.array_equal(np.array(after[key]), np.array(before[key]))
        else:
            assert np.allclose(moved, lr0 * mult, rtol=1e-2), (key, moved)  # eps: |g| is small
    state = ckpt["model"]
    assert torch.allclose(state["transformer.h.1.attn.pos_bias.shape"], torch.tensor(after["shape"][1]))
    log = (tmp_path / "log.txt").read_text()
    assert "BAM shape beta: layer 0: 0 0.333 0.667 1 | layer 1: 0 0.333 0.667 1" in log  # iteration 0
    assert (tmp_path / "priors.png").stat().st_size > 10_000


# ---------------------------------------------------------------- the passkey set: padding outside the loss

def test_passkey_padding_is_not_in_the_loss(tmp_path):
    """Targets that are EOT padding become −1; the model's loss is then the mean cross-entropy over the real
    targets alone, recomputed here from the raw token stream."""
    meta = build_dataset("byte", 300, n_train=12, n_val=4, seed=0, out_dir=str(tmp_path))
    raw = np.fromfile(tmp_path / "train.bin", dtype=np.uint16).reshape(12, 301).astype(np.int64)
    assert (raw == 256).any()  # the set does hold padding
    x, y = get_batch(str(tmp_path), "train", 6, 300, meta, "cpu", torch.Generator().manual_seed(0))
    for row_x, row_y in zip(x, y):
        ex = raw[[i for i in range(12) if np.array_equal(raw[i, :300], row_x.numpy())][0]]
        target = torch.from_numpy(ex[1:])
        assert torch.equal(row_y == -1, target == 256)
        assert torch.equal(row_y[row_y != -1], target[target != 256])
    model = GPT(GPTConfig(block_size=300, vocab_size=257, n_layer=1, n_head=2, n_embd=16, pos="bam"))
    logits, loss = model(x, y)
    keep = y != -1
    manual = F.cross_entropy(logits[keep], y[keep])
    assert loss.item() == pytest.approx(manual.item(), rel=1e-6)


# ---------------------------------------------------------------- the key-attention diagnostic

def naive_key_mass(model, ids, key_pos, start):
    """Layer 0's attention mass on key_pos, by hand: q, k from the block's own weights, the GGD bias and SSMax
    factor of SPEC §1–2, a softmax over the visible keys of every answer-predicting query i >= start: (H, T - start)."""
    attn, H = model.transformer.h[0].attn, model.config.n_head
    x = model.transformer.h[0].ln_1(model.transformer.wte(ids))[0]  # (T, C): bam adds nothing to the embeddings
    q, k, _ = attn.c_attn(x).split(model.config.n_embd, dim=1)
    D = model.config.n_embd // H
    T = ids.shape[1]
    mass = torch.zeros(H, T - start)
    for h in range(H):
        qh, kh = q[:, h * D:(h + 1) * D], k[:, h * D:(h + 1) * D]
        for i in range(start, T):
            z = torch.stack([qh[i] @ kh[j] / math.sqrt(D) for j in range(i + 1)])
            b = ggd_bias(torch.tensor([i]), torch.arange(i + 1), attn.pos_bias.log_scale, attn.pos_bias.shape)[h, 0]
            p = torch.softmax(attn.ssmax.scale[h] * math.log(i + 1) * (z + b), dim=0)
            mass[h, i - start] = p[key_pos].sum()
    return mass


@torch.no_grad()
def test_key_attention_equals_a_naive_softmax():
    tok = get_tokenizer("byte")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=320, vocab_size=257, n_layer=2, n_head=4, n_embd=32, pos="bam", ssmax=True,
                          bam_shape_init=[-0.3, 0.0, 0.5, 1.0])).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(20)  # sharper attention than at init, so a wrong mask would show
            block.attn.ssmax.scale.uniform_(0.5, 1.5)
    key, length = 12345, 340
    prompt, answer = passkey_prompt(tok, length, 0.3, key)
    pos = key_positions(tok, prompt, key)
    assert [chr(prompt[p]) for p in pos] == list("1234512345")
    mass, _ = key_attention(model, tok, length, 0.3, key, chunk=128)  # chunked prefill through the KV cache
    ids = torch.tensor([prompt + answer[:-1]])
    expected = naive_key_mass(model, ids, pos, len(prompt) - 1)
    assert mass.shape == (2, 4, len(answer)) and torch.allclose(mass[0], expected, atol=1e-5), (mass[0], expected)
    assert ((mass >= 0) & (mass <= 1)).all()
    # the diagnostic leaves the model as it was
    assert not any("attend" in vars(b.attn) for b in model.transformer.h)


def test_attention_report_splits_fetch_and_copy(monkeypatch):
    """passkey.py --attention: "fetch" is the mass at the query of the key's first token (byte answer " NNNNN":
    position 1, after the space), "copy" the mean over the later answer positions (2-5)."""
    import passkey
    known = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6) / 100  # (n_layer, n_head, len(answer))
    monkeypatch.setattr(passkey, "key_attention", lambda *args: (known, True))
    model = GPT(GPTConfig(block_size=320, vocab_size=257, n_layer=2, n_head=4, n_embd=32, pos="bam"))
    report = passkey.attention_report(model, get_tokenizer("byte"), [340], [0.3], block_size=340)
    for layer, head in itertools.product(range(2), range(4)):
        fetch, copy = re.search(rf"^{layer}\.{head} +(\S+) / (\S+)$", report, flags=re.M).groups()
        assert float(fetch) == round(known[layer, head, 1].item(), 3)
        assert float(copy) == round(known[layer, head, 2:].mean().item(), 3)


def test_passkey_set_of_several_lengths(tmp_path):
    """passkey_<tok>_<min>-<max>: each prompt's length is drawn from min..max and padded to max + 1 tokens; the
    prompt (up to the question) is a real passkey prompt of about its own length."""
    tok = get_tokenizer("byte")
    meta = build_dataset("byte", 600, n_train=40, n_val=4, seed=0, out_dir=str(tmp_path), min_length=300)
    assert meta["example_len"] == 601 and meta["min_length"] == 300
    raw = np.fromfile(tmp_path / "train.bin", dtype=np.uint16).reshape(40, 601)
    lengths = (raw != tok.eot).sum(1)  # prompt + answer tokens of each example
    assert lengths.min() >= 300 - 25 and lengths.max() <= 600 and lengths.max() - lengths.min() > 150
    question = tok.encode(" What is the pass key? The pass key is")
    for row, n in zip(raw, lengths):
        assert list(row[n - 6 - len(question):n - 6]) == question  # then " K": 6 bytes
    with pytest.raises(ValueError, match="min_length=700 must lie between"):
        build_dataset("byte", 600, n_train=4, n_val=4, seed=0, out_dir=str(tmp_path / "x"), min_length=700)


# ---------------------------------------------------------------- training windows longer than block_size

def test_train_block_size_phase_on_longer_prompts(tmp_path):
    """A run on 320-token prompts, resumed for a phase on prompts of 320..640 tokens with --train_block_size=640:
    the batches are 640 tokens long, the model keeps block_size 320 (passkey.py's 1x), and the phase trains."""
    short, long = tmp_path / "passkey_byte_320", tmp_path / "passkey_byte_320-640"
    build_dataset("byte", 320, n_train=16, n_val=4, seed=0, out_dir=str(short))
    build_dataset("byte", 640, n_train=16, n_val=4, seed=0, out_dir=str(long), min_length=320)
    tiny = ["--n_layer=1", "--n_head=4", "--n_embd=32", "--batch_size=2", "--eval_iters=1", "--eval_interval=2",
            "--device=cpu", f"--out_dir={tmp_path / 'out'}"]
    train.train(train.get_config(tiny + ["--max_iters=2", f"--dataset={short}"], DEFAULTS))
    cfg = train.resume_config(tiny + ["--max_iters=4", f"--dataset={long}", "--train_block_size=640",
                                      "--init_from=resume"], train.default_config(), str(tmp_path / "out"))
    run = train.Run(cfg)
    run.setup()
    run.load_data()
    x, y, _ = run.data.batch("train")
    assert x.shape == y.shape == (2, 640)
    train.train(cfg)
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 4 and ckpt["model_args"]["block_size"] == 320
    assert ckpt["config"]["train_block_size"] == 640
    assert "1,280 tokens per iteration" in (tmp_path / "out" / "log.txt").read_text()  # 2 prompts x 640
    # the window must match the prompts; learned positions cannot train past block_size
    with pytest.raises(InputError, match="examples of 640 tokens.*not train_block_size=960: use --train_block_size=640"):
        train.train(dict(cfg, train_block_size=960, max_iters=6))
    with pytest.raises(InputError, match="pos='learned'.*train_block_size=640 must not exceed"):
        train.train(train.get_config(tiny + ["--pos=learned", "--ssmax=False", f"--dataset={long}",
                                             "--train_block_size=640", f"--out_dir={tmp_path / 'l'}"], DEFAULTS))


def test_last_phase_equals_a_resumed_run(tmp_path):
    """The phase_ keys run the resumed phase of the test above inside one run: 4 iterations with the phase from
    iteration 2 (batches of 2 windows of 640 tokens at lr 3e-3) give the same weights as a run of 2 iterations
    resumed to 4 with --dataset, --train_block_size, --batch_size and --min_lr, and as the one-run version stopped at
    3 and resumed to 4 (inside the phase)."""
    short, long = tmp_path / "passkey_byte_320", tmp_path / "passkey_byte_320-640"
    build_dataset("byte", 320, n_train=16, n_val=4, seed=0, out_dir=str(short))
    build_dataset("byte", 640, n_train=16, n_val=4, seed=0, out_dir=str(long), min_length=320)
    tiny = ["--n_layer=1", "--n_head=4", "--n_embd=32", "--batch_size=3", "--eval_iters=1", "--eval_interval=1",
            "--device=cpu", "--warmup_iters=0", "--lr_decay_iters=2", f"--dataset={short}"]
    phase = ["--phase_from=2", f"--phase_dataset={long}", "--phase_train_block_size=640", "--phase_batch_size=2",
             "--phase_lr=3e-3"]

    def weights(out):
        return torch.load(tmp_path / out / "ckpt.pt", weights_only=True)["model"]

    train.train(train.get_config(tiny + phase + ["--max_iters=4", f"--out_dir={tmp_path / 'one'}"], DEFAULTS))
    log = (tmp_path / "one" / "log.txt").read_text()
    assert "phase from iteration 2 (phase_from=2)" in log and "2 windows of 640 tokens (1,280 tokens per" in log
    train.train(train.get_config(tiny + ["--max_iters=2", f"--out_dir={tmp_path / 'two'}"], DEFAULTS))
    train.train(train.resume_config(tiny + ["--max_iters=4", f"--dataset={long}", "--train_block_size=640",
                                            "--batch_size=2", "--min_lr=3e-3", "--init_from=resume"],
                                    train.default_config(), str(tmp_path / "two")))
    train.train(train.get_config(tiny + phase + ["--max_iters=3", f"--out_dir={tmp_path / 'cut'}"], DEFAULTS))
    train.train(train.resume_config(["--max_iters=4", "--init_from=resume"], train.default_config(),
                                    str(tmp_path / "cut")))
    one, two, cut = weights("one"), weights("two"), weights("cut")
    for name in one:
        assert torch.equal(one[name], two[name]) and torch.equal(one[name], cut[name]), name
    # the phase's settings are checked before anything is written
    for bad, match in ((["--phase_from=1", "--phase_dataset="], "phase_from=1 needs the phase's data: set --phase_dataset"),
                       (phase + ["--phase_batch_size=0"], "phase_batch_size must be >= 1"),
                       (phase + ["--phase_train_block_size=960"], "not phase_train_block_size=960: use "
                                                                  "--phase_train_block_size=640"),
                       (phase + ["--pos=learned", "--ssmax=False"], r"phase_train_block_size=640 must not exceed it "
                                                                    r"\(or --phase_from=None")):
        with pytest.raises(InputError, match=match):
            train.train(train.get_config(tiny + bad + ["--max_iters=4", f"--out_dir={tmp_path / 'bad'}"], DEFAULTS))
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------- SSMax in some layers only (issue 25)

def test_ssmax_layers_puts_ssmax_in_those_layers_only():
    """ssmax_layers=[-1]: SSMax in the last layer only. Check: with the last layer's s = 1/log(n) its factor is 1 at
    the last position, so the logits there equal those of the same weights without SSMax (the earlier layers
    must then have none)."""
    cfg = dict(n_layer=3, n_head=2, n_embd=16, block_size=32, vocab_size=257, pos="bam")
    torch.manual_seed(0)
    some = GPT(GPTConfig(**cfg, ssmax=True, ssmax_layers=[-1]))
    assert [b.attn.ssmax is not None for b in some.transformer.h] == [False, False, True]
    assert [b.attn.ssmax is not None for b in GPT(GPTConfig(**cfg, ssmax=True, ssmax_layers=[0, 2])).transformer.h] \
        == [True, False, True]
    plain = GPT(GPTConfig(**cfg))
    plain.load_state_dict({k: v for k, v in some.state_dict().items() if "ssmax" not in k})
    x = torch.randint(0, 257, (1, 20))
    with torch.no_grad():
        some.transformer.h[2].attn.ssmax.scale.fill_(1 / math.log(20))
        a, _ = some(x)
        b, _ = plain(x)
        some.transformer.h[2].attn.ssmax.scale.fill_(2 / math.log(20))
        c, _ = some(x)
    torch.testing.assert_close(a[:, -1], b[:, -1])
    assert not torch.allclose(c[:, -1], b[:, -1])  # the last layer's SSMax does act


@pytest.mark.parametrize("value, message", [
    ([2], r"ssmax_layers must be a list of layer indices in \[-2, 2\)"),
    ([True], "ssmax_layers must be a list"),
    ("1", "ssmax_layers must be a list"),
])
def test_bad_ssmax_layers_name_the_fix(value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(n_layer=2, ssmax=True, ssmax_layers=value)
    with pytest.raises(ValueError, match="needs ssmax=True"):
        GPTConfig(n_layer=2, ssmax=False, ssmax_layers=[1])


def test_ssmax_layers_from_the_command_line():
    assert train.get_config(["--ssmax_layers=[1]"], DEFAULTS)["ssmax_layers"] == [1]
    assert train.get_config(["--ssmax_layers=None"], DEFAULTS)["ssmax_layers"] is None
    with pytest.raises(InputError, match="ssmax_layers expects list"):
        train.get_config(["--ssmax_layers=1"], DEFAULTS)


# ---------------------------------------------------------------- SSMax's n capped (issue 25)

def test_ssmax_max_n_equals_a_naive_softmax():
    """reference_attention with ssmax_max_n = N: z_ij = s·log(min(i + 1, N))·(q·k/√D + b_ij) (BAM), by a naive
    loop."""
    from attention import reference_attention
    torch.manual_seed(0)
    B, H, T, D, N = 1, 2, 40, 8, 11
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    prior = GGDPrior(H, shape_init=[0.5, 1.0], scale_init=0.3).double()
    s = torch.tensor([0.4, 0.9], dtype=torch.float64)
    got = reference_attention(q, k, v, bias_fn=prior, ssmax_scale=s, bias_in_ssmax=True, bias_toeplitz=True,
                              chunk_size=16, ssmax_max_n=N)
    want = torch.empty_like(got)
    with torch.no_grad():
        b = prior(torch.arange(T), torch.arange(T))  # (H, T, T): the prior itself is tested in test_model.py
    for h in range(H):
        for i in range(T):
            f = s[h] * math.log(min(i + 1, N))
            z = torch.tensor([f * (q[0, h, i] @ k[0, h, j] / math.sqrt(D) + b[h, i, j]) for j in range(i + 1)],
                             dtype=torch.float64)
            want[0, h, i] = torch.softmax(z, 0) @ v[0, h, :i + 1]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_ssmax_max_n_changes_nothing_up_to_n():
    """A model with ssmax_max_n = [N, None] is the same model on windows of at most N tokens (so a run trained on
    them trains exactly as without the cap), and differs past N in the capped layer only."""
    cfg = dict(n_layer=2, n_head=2, n_embd=16, block_size=64, vocab_size=257, pos="bam", ssmax=True)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**cfg))
    capped = GPT(GPTConfig(**cfg, ssmax_max_n=[24, None]))
    capped.load_state_dict(plain.state_dict())
    assert [b.attn.ssmax_max_n for b in capped.transformer.h] == [24, None]
    assert [b.attn.ssmax_max_n for b in GPT(GPTConfig(**dict(cfg, n_layer=3), ssmax_max_n=[24, None])).transformer.h] \
        == [24, None, None]  # the last entry serves the layers past the list's end
    x = torch.randint(0, 257, (2, 60))
    with torch.no_grad():
        a, _ = plain(x, keep_last=None)
        b, _ = capped(x, keep_last=None)
    torch.testing.assert_close(a[:, :24], b[:, :24], rtol=0, atol=0)
    assert not torch.allclose(a[:, 30:], b[:, 30:])


@pytest.mark.parametrize("value, message", [
    (0, "ssmax_max_n must be an int >= 1"), ([], "one entry per layer"), ("many", "ssmax_max_n must be"),
    ([1280, 0], "ssmax_max_n must be")])
def test_bad_ssmax_max_n_names_the_fix(value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(n_layer=2, ssmax=True, ssmax_max_n=value)
    GPTConfig(n_layer=2, ssmax=False, ssmax_max_n=1280)  # no effect without SSMax: the demo's config sets it
    with pytest.raises(ValueError, match="use attn_impl=torch"):
        GPTConfig(n_layer=2, ssmax=True, ssmax_max_n=1280, attn_impl="triton")
