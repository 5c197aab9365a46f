"""passkey.py (SPEC §5): scoring against stub models whose answers are known, chunked
prefill against a full forward, determinism, output files and the minimum length."""
import math
import json
import os
from dataclasses import asdict, dataclass

import pytest
import torch

import evaluate
import passkey
from data.passkey import passkey_min_length, passkey_prompt
from data.tokenizer import get_tokenizer
from conftest import make_tiny_gpt


@dataclass
class StubConfig:
    pos: str = "rope"
    block_size: int = 64
    vocab_size: int = 257


class CopyStub(torch.nn.Module):
    """An induction-head "model": predicts the token that followed the latest earlier
    occurrence of the last n tokens (it finds the key by copying), with model.forward's
    signature and a cache that holds the tokens seen. wrong=True adds 1 (mod 10) to
    every digit it predicts, so it always names a wrong key."""

    def __init__(self, vocab_size=257, n=8, wrong=False, digits=None):
        super().__init__()
        self.config = StubConfig(vocab_size=vocab_size)
        self.n, self.wrong = n, wrong
        self.digits = digits or {ord(str(d)): ord(str((d + 1) % 10)) for d in range(10)}

    max_length = math.inf  # like model.GPT.max_length: any length

    def new_cache(self):
        return [None]  # filled with one token history per batch row

    def predict(self, hist, p):
        suffix = hist[p - self.n + 1:p + 1]
        for j in range(p - 1, self.n - 2, -1):
            if hist[j - self.n + 1:j + 1] == suffix:
                t = hist[j + 1]
                return self.digits.get(t, t) if self.wrong else t
        return 0

    def forward(self, idx, targets=None, cache=None, keep_last=1):
        B, T = idx.shape
        seen = cache[0] if cache is not None and cache[0] is not None else [[] for _ in range(B)]
        hists = [h + row for h, row in zip(seen, idx.tolist())]
        if cache is not None:
            cache[0] = hists
        k = T if keep_last is None else min(keep_last, T)
        logits = torch.zeros(B, k, self.config.vocab_size)
        for b, hist in enumerate(hists):
            for r, p in enumerate(range(len(hist) - k, len(hist))):
                logits[b, r, self.predict(hist, p)] = 1.0
        return logits, None


@pytest.fixture(scope="module")
def byte_tok():
    return get_tokenizer("byte")


@pytest.mark.parametrize("mode", ["teacher_forced", "generate"])
def test_copy_stub_scores_all_and_wrong_digit_scores_none(byte_tok, mode):
    m = passkey_min_length(byte_tok)
    lengths = [m, m + 150, 700]
    right = passkey.run_passkey(CopyStub(), byte_tok, lengths, depths=3, samples=2, mode=mode, chunk=50,
                                progress=False)
    assert len(right) == 3 * 3 * 2 and all(r["correct"] for r in right)
    assert all(r["predicted"] == f" {r['key']}" for r in right)
    wrong = passkey.run_passkey(CopyStub(wrong=True), byte_tok, lengths, depths=3, samples=2, mode=mode,
                                chunk=50, progress=False)
    assert not any(r["correct"] for r in wrong)
    _, by_length = evaluate.accuracy_table(right)
    assert all(a == 1.0 for a in by_length.values())


@pytest.mark.parametrize("mode", ["teacher_forced", "generate"])
def test_multi_token_key_with_bpe(gpt2_tokenizer, mode):
    prompt, answer = passkey_prompt(gpt2_tokenizer, 400, 0.3, 12345)
    assert len(answer) > 1  # a BPE key spans several tokens: every one must be right
    def score(model):
        if mode == "teacher_forced":
            return evaluate.score_teacher_forced(model, [prompt], [answer], chunk=64)[0]
        return evaluate.score_generate(model, prompt, answer, chunk=64)
    ok, pred = score(CopyStub(50257, n=4))
    assert ok and pred == answer
    # wrong at the last answer token only: still wrong as a whole
    other = next(t for t in (gpt2_tokenizer.encode(d)[0] for d in "0123456789") if t != answer[-1])
    last = {answer[-1]: other}  # a single-digit token in place of the key's last token
    ok, pred = score(CopyStub(50257, n=4, wrong=True, digits=last))
    assert not ok and pred[:-1] == answer[:-1]


def tiny_gpt(pos="bam", ssmax=True, block_size=64):
    return make_tiny_gpt(pos, ssmax, block_size)


@pytest.mark.parametrize("chunk", [7, 100, 1000])
def test_chunked_prefill_matches_full_forward(byte_tok, chunk):
    model = tiny_gpt()
    prompt, answer = passkey_prompt(byte_tok, passkey_min_length(byte_tok) + 40, 0.5, 54321)
    got = evaluate.answer_logits(model, [prompt], [answer], chunk=chunk)[0]  # (A, V)
    with torch.no_grad():
        full, _ = model(torch.tensor([prompt + answer]), keep_last=None)  # (1, T, V)
    P, A = len(prompt), len(answer)
    assert got.shape == (A, 257)
    torch.testing.assert_close(got, full[0, P - 1:P + A - 1], rtol=1e-4, atol=1e-4)
    [(ok, pred)] = evaluate.score_teacher_forced(model, [prompt], [answer], chunk=chunk)
    assert pred == full[0, P - 1:P + A - 1].argmax(-1).tolist() and ok == (pred == answer)
    ok_g, pred_g = evaluate.score_generate(model, prompt, answer, chunk=chunk)
    with torch.no_grad():  # greedy by hand: full forward over the growing sequence
        seq = list(prompt)
        for _ in answer:
            seq.append(model(torch.tensor([seq]))[0][0, -1].argmax().item())
    assert pred_g == seq[P:]


@pytest.mark.parametrize("pos,ssmax", [("bam", True), ("alibi", False), ("rope", True)])
def test_batched_prompts_of_different_lengths_match_one_at_a_time(byte_tok, pos, ssmax):
    """Right padding in a batch changes no answer logit: each row equals its own full forward."""
    model = make_tiny_gpt(pos, ssmax, 64)
    m = passkey_min_length(byte_tok)
    pairs = [passkey_prompt(byte_tok, m + extra, depth, key)
             for extra, depth, key in [(0, 0.0, 11111), (57, 0.4, 90210), (120, 1.0, 55501)]]
    got = evaluate.answer_logits(model, [p for p, _ in pairs], [a for _, a in pairs], chunk=40)
    assert len({len(p) for p, _ in pairs}) == 3  # three different prompt lengths in one batch
    for (prompt, answer), g in zip(pairs, got):
        with torch.no_grad():
            full, _ = model(torch.tensor([prompt + answer]), keep_last=None)
        P, A = len(prompt), len(answer)
        torch.testing.assert_close(g, full[0, P - 1:P + A - 1], rtol=1e-4, atol=1e-4)


def test_determinism_and_output_files(byte_tok, tmp_path):
    m = passkey_min_length(byte_tok)
    a = passkey.run_passkey(CopyStub(), byte_tok, [m, 500], depths=2, samples=2, seed=3, progress=False)
    b = passkey.run_passkey(CopyStub(), byte_tok, [m, 500], depths=2, samples=2, seed=3, progress=False)
    c = passkey.run_passkey(CopyStub(), byte_tok, [500], depths=2, samples=2, seed=3, progress=False)
    d = passkey.run_passkey(CopyStub(), byte_tok, [500], depths=2, samples=2, seed=4, progress=False)
    assert a == b
    assert [r["key"] for r in a if r["length"] == 500] == [r["key"] for r in c]  # same prompts, any length list
    assert [r["key"] for r in c] != [r["key"] for r in d]
    assert len({r["key"] for r in a}) > 1
    paths = evaluate.write_results(a, str(tmp_path / "pk.json"), {"title": "test"})
    assert all(os.path.getsize(p) > 0 for p in paths)
    assert json.load(open(paths[0]))["results"] == a
    assert open(paths[1]).readline().strip() == "length,n_tokens,depth,sample,key,answer,predicted,correct"


def test_below_minimum_length_is_rejected(byte_tok):
    m = passkey_min_length(byte_tok)
    with pytest.raises(ValueError, match=f"minimum {m}"):
        passkey.run_passkey(CopyStub(), byte_tok, [m - 1, 500], progress=False)


def save_ckpt(model, path):
    torch.save({"model": model.state_dict(), "model_args": asdict(model.config), "iter_num": 0,
                "best_val_loss": 0.0, "config": {"dataset": "none"}, "tokenizer": "byte"}, path)


def test_miss_table_splits_fetch_from_copy(byte_tok):
    r = lambda L, key, pred: dict(length=L, answer=f" {key}", predicted=f" {pred}", correct=pred == key)
    results = [r(320, "47940", "37940"), r(320, "20020", "30020"), r(320, "12345", "12345"),  # first digit only
               r(640, "84965", "30000"), r(640, "70820", "70822"), r(640, "11111", "11"),  # later digits; short
               r(960, "55555", "55555")]
    lines = passkey.miss_table(results, block_size=320).splitlines()
    assert len(lines) == 3  # header, 1x, 2x; no row for 3x, where nothing missed
    assert lines[1].split() == ["320", "1x", "|", "2", "2", "0", "|", "'3'", "x", "2"]
    # 2x: 30000 has all five wrong (the first and later ones), 70822 the last, "11" three missing (' ')
    assert lines[2].split()[:7] == ["640", "2x", "|", "3", "0", "3", "|"]
    assert lines[2].split()[-3:] == ["'0'", "x", "4"]  # wrong characters: 3 and four 0s, one 2, three spaces
    assert passkey.miss_table([r(320, "12345", "12345")]) == ""
    # from a scored run: a stub that names every digit wrong misses every prompt at every position
    m = passkey_min_length(byte_tok)
    wrong = passkey.run_passkey(CopyStub(wrong=True), byte_tok, [m, m + 150], depths=2, samples=2, chunk=50,
                                progress=False)
    rows = [line.split() for line in passkey.miss_table(wrong).splitlines()[1:]]
    assert [(row[2], row[3], row[4]) for row in rows] == [("4", "0", "4")] * 2


def test_cli(tmp_path, capsys):
    save_ckpt(tiny_gpt(block_size=256), tmp_path / "ckpt.pt")
    passkey.main(["--out_dir", str(tmp_path), "--lengths", "1x,300", "--depths", "2", "--samples", "1",
                  "--chunk", "128", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "1x" in out and "all" in out
    res = json.load(open(tmp_path / "passkey.json"))
    assert [r["length"] for r in res["results"]] == [256, 256, 300, 300]
    assert (tmp_path / "passkey.png").stat().st_size > 0 and (tmp_path / "passkey.csv").is_file()
    with pytest.raises(SystemExit):
        passkey.main(["--out_dir", str(tmp_path), "--lengths", "100", "--device", "cpu"])
    assert f"minimum {passkey_min_length(get_tokenizer('byte'))}" in capsys.readouterr().err


def test_learned_past_block_size_is_na(byte_tok):
    model = tiny_gpt(pos="learned", ssmax=False, block_size=256)
    res = passkey.run_passkey(model, byte_tok, [256, 512], depths=1, samples=1, progress=False)
    assert res[0]["correct"] is not None and res[1]["correct"] is None
    assert "n/a" in evaluate.format_table(res, 256)


def test_plots_cli_joins_files_of_one_name(tmp_path, monkeypatch):
    """plots.py: results files given under one name make one line over the lengths of all of them (1x-64x from the
    sweep's scoring, 128x-1,024x from a far-end run), each length's accuracy the mean of its prompts."""
    import plots
    block = 320

    def results(path, scores):  # {multiple of block: [correct per prompt]}
        rows = [dict(length=m * block, depth=0.0, correct=c) for m, cs in scores.items() for c in cs]
        path.write_text(json.dumps(dict(meta=dict(block_size=block), results=rows)))
        return str(path)
    near = results(tmp_path / "near.json", {1: [1, 1, 1, 1], 64: [1, 0, 1, 1]})
    far = results(tmp_path / "far.json", {128: [1, 0], 1024: [0, 0]})
    other = results(tmp_path / "other.json", {1: [0, 1]})
    drawn = {}
    monkeypatch.setattr(plots, "plot_lines", lambda table, lengths, *args: drawn.update(table=table, lengths=lengths))
    plots.main([f"bam={near}", f"bam={far}", f"alibi={other}", "--out", str(tmp_path / "x.png")])
    assert drawn["lengths"] == [1, 64, 128, 1024]
    assert drawn["table"] == {"bam": [1.0, 0.75, 0.5, 0.0], "alibi": [0.5, None, None, None]}


def test_plots_cli_bad_inputs_name_the_fix(tmp_path):
    """plots.py: a missing file, a JSON that is not passkey.py's (sweep-lm.json), a folder that does not exist for
    --out: one-line errors (InputError, MissingFileError) that name the fix, not tracebacks."""
    import plots
    from configurator import InputError, MissingFileError
    good = tmp_path / "passkey.json"
    good.write_text(json.dumps(dict(meta=dict(block_size=8), results=[dict(length=8, depth=0.0, correct=1)])))
    other = tmp_path / "sweep-lm.json"
    other.write_text(json.dumps(dict(setting={}, variants={})))
    with pytest.raises(MissingFileError, match="passkey.py --out"):
        plots.main([str(tmp_path / "none.json"), "--out", str(tmp_path / "x.png")])
    with pytest.raises(InputError, match="not a passkey.py results JSON"):
        plots.main([str(other), "--out", str(tmp_path / "x.png")])
    with pytest.raises(InputError, match="folder that exists"):
        plots.main([str(good), "--out", str(tmp_path / "no" / "x.png")])
