"""Passkey-retrieval prompts (SPEC section 5) and a synthetic passkey training set.

Prompt = INTRO, filler, key sentence at a depth, more filler, QUESTION; answer " K".
Pieces are joined by single spaces. Each piece is tokenized on its own (every piece
after the first with its leading space) and the ids are concatenated, so the answer
tokens are always the ids of " K", the same in training data and evaluation.

    python data/passkey.py --tokenizer byte --length 512 --n_train 20000 --n_val 500 --seed 0

writes data/passkey_byte_512/{train,val}.bin: examples of exactly length+1 tokens
(prompt + answer, right-padded with EOT) back to back; meta.json["example_len"] = length+1.
--min_length 300 makes prompts of several lengths (300..length) in one set; train.py
makes such a set on the fly for --dataset=passkey_byte_300-512.
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `data.*`
import argparse
import random

import numpy as np
from tqdm import tqdm

from configurator import InputError, positive_int, run_script
from data.tokenizer import get_tokenizer, write_meta, write_split

INTRO = ("There is an important info hidden inside a lot of irrelevant text. "
         "Find it and memorize them. I will quiz you about the important information there.")
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
KEY_SENTENCE = "The pass key is {K}. Remember it. {K} is the pass key."
QUESTION = "What is the pass key? The pass key is"

_PIECES = {}  # tokenizer name -> token ids of the fixed pieces


def _tok(tokenizer):
    return get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


def _pieces(tok):
    """Token ids of INTRO, " "+QUESTION and each " "+FILLER sentence, computed once per tokenizer."""
    if tok.name not in _PIECES:
        _PIECES[tok.name] = {"intro": tok.encode(INTRO), "question": tok.encode(" " + QUESTION),
                             "filler": [tok.encode(" " + s) for s in FILLER]}
    return _PIECES[tok.name]


def _filler(sents, start, count):
    """Ids of `count` filler sentences cycling in order, starting at sentence index `start`."""
    r = start % len(sents)
    rot = sents[r:] + sents[:r]
    q, m = divmod(count, len(sents))
    return sum(rot, []) * q + sum(rot[:m], [])


def random_key(rng, n_digits=5):
    """Uniform random n_digits-digit int in [10**(n_digits-1), 10**n_digits - 1] from random.Random `rng`."""
    return rng.randint(10 ** (n_digits - 1), 10 ** n_digits - 1)


def passkey_min_length(tokenizer, n_digits=5):
    """Smallest length (prompt + answer tokens) that fits any n_digits key with zero filler.

    = intro + key sentence + question + answer. A key " K" is counted as n_digits+1
    tokens: exact for "byte", an upper bound for BPE ("gpt2"), so any length >= this
    works for every key. `tokenizer` is a name or a tokenizer object.
    """
    tok = _tok(tokenizer)
    p, k = _pieces(tok), "1" * n_digits
    key_sent = len(tok.encode(" " + KEY_SENTENCE.format(K=k))) - 2 * len(tok.encode(" " + k))
    return len(p["intro"]) + key_sent + len(p["question"]) + 3 * (n_digits + 1)


def passkey_prompt(tokenizer, length, depth, key):
    """Build one passkey prompt (SPEC section 5) of about `length` tokens.

    Returns (prompt_ids, answer_ids), lists of ints, answer_ids = encode(" K"), with
    length - (tokens of the longest filler sentence) < len(prompt_ids) + len(answer_ids) <= length.
    Filler is whole sentences cycling in FILLER order; the key sentence comes after
    int(depth * n_filler + 0.5) of the n_filler sentences (depth 0: right after the
    intro, 1: right before the question). Raises ValueError if depth is outside
    [0, 1] or length < passkey_min_length(tokenizer, len(str(key))).
    """
    tok = _tok(tokenizer)
    if not 0.0 <= depth <= 1.0:
        raise InputError(f"depth must be in [0, 1], got {depth}")
    key = int(key)
    n_digits = len(str(key))
    min_len = passkey_min_length(tok, n_digits)
    if length < min_len:
        raise InputError(f"length {length} is below the minimum passkey length {min_len} "
                         f"({tok.name} tokenizer, {n_digits}-digit key)")
    p = _pieces(tok)
    key_ids, answer = tok.encode(" " + KEY_SENTENCE.format(K=key)), tok.encode(f" {key}")
    budget = length - len(p["intro"]) - len(key_ids) - len(p["question"]) - len(answer)
    lens = [len(s) for s in p["filler"]]
    q, rem = divmod(budget, sum(lens))
    n = q * len(lens)
    for L in lens:  # then whole sentences while they fit
        if L > rem:
            break
        rem, n = rem - L, n + 1
    k = int(depth * n + 0.5)
    prompt = p["intro"] + _filler(p["filler"], 0, k) + key_ids + _filler(p["filler"], k, n - k) + p["question"]
    return prompt, answer


def passkey_depths(n):
    """n equidistant depths from 0 (start of the filler) to 1 (end); n=1 gives [0.5] (the middle)."""
    if n < 1:
        raise InputError(f"need n >= 1 depths, got {n}")
    return [0.5] if n == 1 else [i / (n - 1) for i in range(n)]


def make_examples(tokenizer, length, n, rng, n_digits=5, desc=None, min_length=None):
    """uint16 array (n, length + 1): each row prompt + answer right-padded with EOT.

    Keys from random_key(rng, n_digits), depths uniform in [0, 1) from rng. With min_length,
    each prompt's length is drawn uniformly from min_length..length (prompts of several
    lengths in one set; the padding is left out of the loss by train.get_batch).
    """
    tok = _tok(tokenizer)
    out = np.full((n, length + 1), tok.eot, dtype=np.uint16)
    for i in tqdm(range(n), desc=desc, disable=n < 2000):
        key = random_key(rng, n_digits)
        n_tokens = length if min_length is None else rng.randint(min_length, length)
        prompt, answer = passkey_prompt(tok, n_tokens, rng.random(), key)
        ex = prompt + answer
        out[i, :len(ex)] = ex
    return out


def write_examples(out_dir, name, seed, n_train, n_val, make):
    """Write out_dir/train.bin and val.bin of a synthetic set: make(n, rng, desc) -> a (n, example_len) array, rng a
    random.Random of its own per split ("<name>-<split>-<seed>"), desc a progress bar's label."""
    for split, n in (("train", n_train), ("val", n_val)):
        examples = make(n, random.Random(f"{name}-{split}-{seed}"), f"{name} {split} prompts")
        write_split(out_dir, split, examples.ravel())


def build_dataset(tokenizer_name, length, n_train, n_val, seed, out_dir, n_digits=5, min_length=None):
    """Write a synthetic passkey set to out_dir/{train,val}.bin + meta.json.

    Each example is exactly length + 1 tokens (prompt + answer + EOT padding), so a
    block_size = length window x = ex[:-1], y = ex[1:] covers it; meta["example_len"]
    = length + 1 tells train.py to sample windows at example starts. With min_length, the
    prompts have lengths min_length..length (more padding; it is not in the loss). Train and
    val use separate random streams derived from `seed`. Returns the meta dict. Raises
    InputError if min_length is below the template's minimum or above length.
    """
    if min_length is not None and not passkey_min_length(tokenizer_name, n_digits) <= min_length <= length:
        raise InputError(f"min_length={min_length} must lie between the template's minimum "
                         f"{passkey_min_length(tokenizer_name, n_digits)} and length={length}")
    write_examples(out_dir, "passkey", seed, n_train, n_val,
                   lambda n, rng, desc: make_examples(tokenizer_name, length, n, rng, n_digits, desc, min_length))
    cmd = (f"python data/passkey.py --tokenizer {tokenizer_name} --length {length} --n_train {n_train} "
           f"--n_val {n_val} --seed {seed} --n_digits {n_digits}"
           + ("" if min_length is None else f" --min_length {min_length}"))
    return write_meta(out_dir, tokenizer_name, dataset="passkey", example_len=length + 1, length=length,
                      min_length=min_length, n_train=n_train, n_val=n_val, seed=seed, n_digits=n_digits, prepare=cmd)


def dataset_parser(doc, name):
    """The options of the synthetic sets' scripts (data/passkey.py, data/niah.py); name: the folders' prefix."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte")
    p.add_argument("--length", type=positive_int, default=512, help="tokens per example without the final pad (= block_size)")
    p.add_argument("--n_train", type=positive_int, default=20000)
    p.add_argument("--n_val", type=positive_int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_length", type=positive_int, default=None,
                   help="prompts of several lengths: each drawn from min_length..length (padding is not in the loss)")
    p.add_argument("--out_dir", default=None, help=f"default data/{name}_<tokenizer>_<length>")
    return p


def main():
    p = dataset_parser(__doc__, "passkey")
    p.add_argument("--n_digits", type=positive_int, default=5)
    args = p.parse_args()
    out_dir = args.out_dir or os.path.join("data", f"passkey_{args.tokenizer}_{args.length}")
    meta = build_dataset(args.tokenizer, args.length, args.n_train, args.n_val, args.seed, out_dir, args.n_digits,
                         args.min_length)
    print(f"{args.n_train:,} train / {args.n_val:,} val examples of {meta['example_len']} tokens in {out_dir}")


if __name__ == "__main__":
    run_script(main)  # nanoPE's own errors (a bad option, missing input) as one line, no traceback
