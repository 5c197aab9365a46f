"""eval_ppl.py (SPEC §6): full-window and sliding-window loss against explicit loops over
windows with a plain full forward, and the CLI's table, JSON, plot and n/a for learned."""
import json
import math
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval_ppl
from data.tokenizer import write_meta, write_split
from conftest import make_tiny_gpt


def tiny_gpt(pos="bam", ssmax=True, block_size=32):
    return make_tiny_gpt(pos, ssmax, block_size)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 257, size=400).astype(np.uint16)


@pytest.mark.parametrize("pos,ssmax", [("bam", True), ("rope", False)])
def test_stride_equal_window_is_mean_of_window_losses(tokens, pos, ssmax):
    model, L = tiny_gpt(pos, ssmax), 48
    losses = []
    with torch.no_grad():  # by hand: model(x, y) on each non-overlapping window, averaged
        for s in range(0, len(tokens) - L, L):
            w = torch.from_numpy(tokens[s:s + L + 1].astype(np.int64))[None]
            losses.append(model(w[:, :-1], w[:, 1:])[1].item())
    expected = sum(losses) / len(losses)
    for stride, chunk, bs in [(None, 1024, 1), (L, 10, 1), (L, 16, 3)]:
        loss, ppl, n = eval_ppl.evaluate_ppl(model, tokens, L, stride=stride, chunk=chunk, batch_size=bs)
        assert n == len(losses) * L
        assert loss == pytest.approx(expected, rel=1e-5) and ppl == pytest.approx(math.exp(expected), rel=1e-5)


def test_sliding_window_scores_last_stride_tokens(tokens):
    model, L, S = tiny_gpt(), 40, 12
    starts = list(range(0, len(tokens) - L, S))
    total, n_hand = 0.0, 0
    with torch.no_grad():  # by hand: full forward per window, CE on all of window 0, the last S of the others
        for i, s in enumerate(starts):
            w = torch.from_numpy(tokens[s:s + L + 1].astype(np.int64))
            logits, _ = model(w[None, :-1], keep_last=None)  # (1, L, V)
            k = L if i == 0 else S
            total += F.cross_entropy(logits[0, -k:], w[1:][-k:], reduction="sum").item()
            n_hand += k
    loss, ppl, n = eval_ppl.evaluate_ppl(model, tokens, L, stride=S, chunk=16, batch_size=2)
    assert n == n_hand == L + (len(starts) - 1) * S
    assert loss == pytest.approx(total / n_hand, rel=1e-5)
    # every target token scored exactly once: the scored targets are tokens[1 : L + (W-1)·S + 1]
    assert n == starts[-1] + L
    loss3, _, n3 = eval_ppl.evaluate_ppl(model, tokens, L, stride=S, max_windows=3)
    assert n3 == L + 2 * S
    with pytest.raises(ValueError):
        eval_ppl.evaluate_ppl(model, tokens, L, stride=L + 1)
    with pytest.raises(ValueError):
        eval_ppl.evaluate_ppl(model, tokens[:L], L)


def test_cli_table_json_plot_and_learned_na(tmp_path, tokens, capsys):
    data = tmp_path / "data"
    write_split(str(data), "train", tokens)
    write_split(str(data), "val", tokens)
    write_meta(str(data), "byte")
    for name, pos in [("a", "bam"), ("b", "learned")]:
        (tmp_path / name).mkdir()
        m = tiny_gpt(pos, pos == "bam")
        torch.save({"model": m.state_dict(), "model_args": asdict(m.config), "iter_num": 0, "best_val_loss": 0.0,
                    "config": {"dataset": str(data)}, "tokenizer": "byte"}, tmp_path / name / "ckpt.pt")
    out = tmp_path / "res.json"
    eval_ppl.main(["--out_dirs", str(tmp_path / "a"), str(tmp_path / "b"), "--lengths", "1x,2x,100",
                   "--max_windows", "2", "--device", "cpu", "--out", str(out)])
    text = capsys.readouterr().out
    assert "a (bam+ssmax)" in text and "b (learned)" in text and "n/a" in text
    rows = json.load(open(out))["results"]
    assert len(rows) == 6
    na = [(r["label"], r["length"]) for r in rows if r["ppl"] is None]
    assert na == [("b (learned)", 64), ("b (learned)", 100)]
    assert all(r["n_scored"] == 2 * r["length"] for r in rows if r["ppl"] is not None)
    assert (tmp_path / "res.png").stat().st_size > 0


def test_cut_short_then_the_same_command_goes_on(tmp_path, tokens, monkeypatch):
    """eval_ppl.py stopped after its second row (Ctrl-C) goes on from there when run again: the rows equal an
    uninterrupted run's and the rows it had are not evaluated again. Other settings are kept apart."""
    data = tmp_path / "data"
    write_split(str(data), "train", tokens)
    write_split(str(data), "val", tokens)
    write_meta(str(data), "byte")
    m = tiny_gpt("bam", True)
    torch.save({"model": m.state_dict(), "model_args": asdict(m.config), "iter_num": 0, "best_val_loss": 0.0,
                "config": {"dataset": str(data)}, "tokenizer": "byte"}, tmp_path / "ckpt.pt")
    args = ["--ckpt", str(tmp_path / "ckpt.pt"), "--lengths", "1x,2x,100", "--max_windows", "2", "--device", "cpu"]
    eval_ppl.main(args + ["--out", str(tmp_path / "whole.json")])
    whole = json.load(open(tmp_path / "whole.json"))["results"]
    calls, real = [], eval_ppl.evaluate_ppl

    def cut_after_two(*a, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(a[2])
        return real(*a, **kw)
    monkeypatch.setattr(eval_ppl, "evaluate_ppl", cut_after_two)
    out = tmp_path / "ppl.json"
    with pytest.raises(KeyboardInterrupt):
        eval_ppl.main(args + ["--out", str(out)])
    cut = json.load(open(out))
    assert cut["meta"]["finished"] is False and len(cut["results"]) == 2 and not (tmp_path / "ppl.png").exists()
    calls.clear()
    monkeypatch.setattr(eval_ppl, "evaluate_ppl", lambda *a, **kw: (calls.append(a[2]), real(*a, **kw))[1])
    eval_ppl.main(args + ["--out", str(out)])
    assert calls == [100]  # only the row it did not have
    again = json.load(open(out))
    assert again["meta"]["finished"] is True and again["results"] == whole and (tmp_path / "ppl.png").is_file()
    eval_ppl.main(args[:3] + ["1x"] + args[4:] + ["--out", str(out)])  # other lengths: a new file, the old kept
    assert json.load(open(out)) == again and len(json.load(open(tmp_path / "ppl-2.json"))["results"]) == 1
