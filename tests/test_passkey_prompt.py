"""The SPEC section 5 passkey prompt generator and the synthetic passkey set (data/passkey.py).

Expected prompts are written out by hand here, and decoded prompts are parsed with plain
string operations, so the checks do not reuse the generator's own logic.
"""
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data import passkey as pk
from data.tokenizer import get_tokenizer, read_meta

ROOT = Path(__file__).resolve().parent.parent
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
         "I will quiz you about the important information there.")
SENTS = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."]
QUESTION = "What is the pass key? The pass key is"
PROMPT_RE = re.compile(r"(.*?) ?The pass key is (\d+)\. Remember it\. (\d+) is the pass key\.(.*) "
                       r"What is the pass key\? The pass key is$", re.S)


def parse(text):
    """Decoded prompt -> (filler sentences before the key, key, filler sentences after)."""
    assert text.startswith(INTRO + " ")
    m = PROMPT_RE.fullmatch(text[len(INTRO) + 1:])
    assert m and m.group(2) == m.group(3), text[:300]
    sentences = lambda s: [x.strip() for x in re.findall(r"[^.]+\.", s)]  # filler sentences have one "."
    return sentences(m.group(1)), int(m.group(2)), sentences(m.group(4))


def test_constants_are_the_spec_texts():
    assert pk.INTRO == INTRO and list(pk.FILLER) == SENTS and pk.QUESTION == QUESTION
    assert pk.KEY_SENTENCE.format(K=123) == "The pass key is 123. Remember it. 123 is the pass key."


def test_prompt_text_by_hand():
    tok = get_tokenizer("byte")
    key = "The pass key is 12345. Remember it. 12345 is the pass key."
    cases = {  # depth -> expected prompt; 7 filler sentences, key after round(7 * depth)
        0.5: f"{INTRO} The grass is green. The sky is blue. The sun is yellow. Here we go. {key} "
             "There and back again. The grass is green. The sky is blue. " + QUESTION,
        0.0: f"{INTRO} {key} The grass is green. The sky is blue. The sun is yellow. Here we go. "
             "There and back again. The grass is green. The sky is blue. " + QUESTION,
        1.0: f"{INTRO} The grass is green. The sky is blue. The sun is yellow. Here we go. "
             f"There and back again. The grass is green. The sky is blue. {key} " + QUESTION,
        0.2: f"{INTRO} The grass is green. {key} The sky is blue. The sun is yellow. Here we go. "
             "There and back again. The grass is green. The sky is blue. " + QUESTION,
    }
    for depth, want in cases.items():
        length = len(want.encode()) + len(" 12345")
        for slack in (0, len(" The sun is yellow.") - 1):  # anything short of one more sentence
            prompt, answer = pk.passkey_prompt(tok, length + slack, depth, 12345)
            assert tok.decode(prompt) == want and tok.decode(answer) == " 12345"
    zero = f"{INTRO} {key} {QUESTION} 12345"
    assert pk.passkey_min_length("byte", 5) == len(zero.encode())
    assert tok.decode(sum(pk.passkey_prompt(tok, len(zero.encode()), 0.5, 12345), [])) == zero


def check_lengths_and_depths(tok, lengths, depths=(0.0, 0.1, 0.25, 1 / 3, 0.5, 0.77, 1.0)):
    longest = max(len(tok.encode(" " + s)) for s in SENTS)
    rng = random.Random(1)
    for length in lengths:
        for depth in depths:
            key = pk.random_key(rng, rng.choice([5, 6]))
            prompt, answer = pk.passkey_prompt(tok, length, depth, key)
            assert length - longest < len(prompt) + len(answer) <= length
            assert answer == tok.encode(f" {key}")
            before, k, after = parse(tok.decode(prompt))
            n = len(before) + len(after)
            assert k == key and before + after == [SENTS[i % 5] for i in range(n)]  # whole sentences, in order
            assert len(before) == int(depth * n + 0.5)  # key at the requested depth


@pytest.fixture(params=["byte", "gpt2"])
def tok(request):
    """Both tokenizers; gpt2 through conftest's gpt2_tokenizer (skips on a fresh offline machine)."""
    return request.getfixturevalue("gpt2_tokenizer") if request.param == "gpt2" else get_tokenizer("byte")


def test_lengths_and_depths(tok):
    m = pk.passkey_min_length(tok, 6)
    check_lengths_and_depths(tok, list(range(m, m + 250, 3)) + [512, 1000, 4096, 32_768, 100_000])


def test_long_prompt(tok):  # 512k tokens: built by list arithmetic, fast
    check_lengths_and_depths(tok, [512 * 1024], depths=(0.3,))


def test_min_length_and_errors(tok):
    m = pk.passkey_min_length(tok, 5)
    rng = random.Random(0)
    for _ in range(50):  # any 5-digit key fits in the minimum length
        p, a = pk.passkey_prompt(tok, m, rng.random(), pk.random_key(rng))
        assert len(p) + len(a) <= m
    with pytest.raises(ValueError, match=str(m)):
        pk.passkey_prompt(tok, m - 1, 0.5, 12345)
    with pytest.raises(ValueError, match="depth"):
        pk.passkey_prompt("byte", 1000, 1.1, 12345)
    with pytest.raises(ValueError, match="depth"):
        pk.passkey_prompt("byte", 1000, -0.1, 12345)


def test_random_key_and_depths():
    rng = random.Random(0)
    keys = [pk.random_key(rng) for _ in range(2000)]
    assert all(10_000 <= k <= 99_999 for k in keys) and len(set(keys)) > 1900
    assert {pk.random_key(rng, 1) for _ in range(500)} == set(range(1, 10))
    assert pk.passkey_depths(5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert pk.passkey_depths(1) == [0.5] and pk.passkey_depths(2) == [0.0, 1.0]
    with pytest.raises(ValueError):
        pk.passkey_depths(0)


def check_dataset(out, tok, length, n_train, n_val):
    meta = read_meta(out)
    assert meta["example_len"] == length + 1 and meta["tokenizer"] == tok.name
    keys = []
    for split, n in (("train", n_train), ("val", n_val)):
        data = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        assert data.size == n * (length + 1)
        for ex in data.reshape(n, length + 1).tolist():
            assert ex[-1] == tok.eot  # right-padded: a block_size=length window covers prompt + answer
            end = max(i for i, t in enumerate(ex) if t != tok.eot) + 1
            assert tok.eot not in ex[:end]
            text = tok.decode(ex[:end])
            cut = text.rindex(QUESTION) + len(QUESTION)
            _, key, _ = parse(text[:cut])
            assert text[cut:] == f" {key}" and ex[end - len(tok.encode(f' {key}')):end] == tok.encode(f" {key}")
            assert 10_000 <= key <= 99_999
            keys.append((split, key))
    return keys


def test_build_dataset_byte(tmp_path):
    tok = get_tokenizer("byte")
    pk.build_dataset("byte", 300, 200, 30, 0, tmp_path / "a")
    keys = check_dataset(tmp_path / "a", tok, 300, 200, 30)
    train, val = [k for s, k in keys if s == "train"], [k for s, k in keys if s == "val"]
    assert train[:30] != val  # separate random streams
    pk.build_dataset("byte", 300, 200, 30, 0, tmp_path / "b")
    pk.build_dataset("byte", 300, 200, 30, 1, tmp_path / "c")
    a, b, c = [(tmp_path / d / "train.bin").read_bytes() for d in "abc"]
    assert a == b and a != c  # reproducible from the seed


def test_build_dataset_gpt2(gpt2_tokenizer, tmp_path):
    pk.build_dataset("gpt2", 200, 40, 10, 0, tmp_path)
    check_dataset(tmp_path, gpt2_tokenizer, 200, 40, 10)


def test_passkey_cli(tmp_path):
    r = subprocess.run([sys.executable, "data/passkey.py", "--tokenizer", "byte", "--length", "512", "--n_train",
                        "20000", "--n_val", "500", "--seed", "0", "--out_dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert read_meta(tmp_path)["example_len"] == 513
    assert (tmp_path / "train.bin").stat().st_size == 20000 * 513 * 2
