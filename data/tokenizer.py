"""Tokenizers and the on-disk token format shared by every data script.

A data folder data/<name>/ holds train.bin and val.bin (flat uint16 token ids,
read by train.py through np.memmap) and meta.json
({"tokenizer": name, "vocab_size": n, ...extra}).
"""
import json
import os

import numpy as np

from configurator import InputError, MissingFileError, write_json, write_atomic

VOCAB_SIZES = {"byte": 257, "gpt2": 50257}
PREPARE_COMMANDS = [
    "python data/shakespeare.py --tokenizer byte",
    "python data/shakespeare.py --tokenizer gpt2",
    "python data/passkey.py --tokenizer byte --length 512 --n_train 20000 --n_val 500 --seed 0",
    "python data/fineweb.py --name sample-10BT --max_tokens 1e9",
]


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus an end-of-text id 256 (vocab_size 257)."""
    name, eot, vocab_size = "byte", 256, 257

    def encode(self, text):
        """str -> list[int] of UTF-8 byte values (never produces eot)."""
        return list(text.encode("utf-8"))

    def decode(self, ids):
        """list[int] -> str; eot is dropped, invalid UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE via tiktoken "r50k_base": eot 50256, vocab_size 50257.

    Offline if TIKTOKEN_CACHE_DIR points at a cache holding r50k_base.
    """
    name, eot, vocab_size = "gpt2", 50256, 50257

    def __init__(self):
        import tiktoken
        try:
            self.enc = tiktoken.get_encoding("r50k_base")
        except Exception as e:  # tiktoken downloads the BPE files on first use
            raise InputError(f"could not load the GPT-2 BPE (tiktoken r50k_base): {type(e).__name__}. It is downloaded "
                             f"on first use; offline, set TIKTOKEN_CACHE_DIR to a folder holding its cache") from e

    def encode(self, text):
        """str -> list[int]; "<|endoftext|>" in the text is encoded as plain text."""
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        """list[int] -> str (eot decodes to "<|endoftext|>"); ids past the vocabulary (the model's padding,
        50257..50303, which only an untrained model predicts) are dropped."""
        return self.enc.decode([i for i in ids if i < self.vocab_size])


TOKENIZERS = {"byte": ByteTokenizer, "gpt2": GPT2Tokenizer}  # classes: .eot and .vocab_size without loading


def get_tokenizer(name):
    """Return the tokenizer called `name` ("byte" or "gpt2"); InputError (a ValueError) otherwise."""
    if name not in TOKENIZERS:
        raise InputError(f"unknown tokenizer {name!r}; valid names: {sorted(TOKENIZERS)}")
    return TOKENIZERS[name]()


def write_split(out_dir, split, ids):
    """Write ids (sequence of ints or int array) to out_dir/<split>.bin as flat uint16.

    Atomic (configurator.write_atomic). Raises InputError if an id is
    outside 0..65535. Returns the path written.
    """
    arr = np.asarray(ids)
    if arr.size and (arr.min() < 0 or arr.max() >= 2**16):
        raise InputError(f"ids must be in [0, 65536) to fit uint16, got range [{arr.min()}, {arr.max()}]")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{split}.bin")
    write_atomic(path, arr.astype(np.uint16).tofile)
    return path


def write_meta(out_dir, tokenizer_name, **extra):
    """Write out_dir/meta.json = {"tokenizer", "vocab_size", **extra}; returns the dict.

    Pass prepare="python data/..." so read_meta can say how to rebuild the folder.
    """
    meta = {"tokenizer": tokenizer_name, "vocab_size": VOCAB_SIZES[tokenizer_name], **extra}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "meta.json")
    write_json(path, meta, indent=2)
    return meta


def data_dir_of(dataset):
    """The folder of a --dataset value: the path itself if it is a folder (relative to the working
    directory), else data/<dataset> in the repository (wherever the script is run from)."""
    if os.path.isdir(dataset):
        return dataset
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), dataset)


def read_meta(data_dir):
    """Return the meta.json dict of data_dir.

    Raises MissingFileError (a FileNotFoundError), naming the command that makes the data,
    if meta.json or train.bin is missing; InputError if meta.json is not a JSON object with a
    known "tokenizer" and an int "vocab_size".
    """
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        cmds = "\n  ".join(PREPARE_COMMANDS)
        raise MissingFileError(f"no {path}: prepare the data first (from the repo root), e.g.\n  {cmds}")
    with open(path) as f:
        try:
            meta = json.load(f)
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            meta = f"not valid JSON ({e})"
    if not isinstance(meta, dict) or meta.get("tokenizer") not in VOCAB_SIZES or \
            not isinstance(meta.get("vocab_size"), int):
        problem = meta if isinstance(meta, str) else 'not {"tokenizer": "byte" or "gpt2", "vocab_size": int, ...}'
        raise InputError(f"{path} is {problem}: prepare the data again, e.g. {' or '.join(PREPARE_COMMANDS[:2])}")
    if not os.path.isfile(os.path.join(data_dir, "train.bin")):
        hint = meta.get("prepare", " or ".join(PREPARE_COMMANDS))
        raise MissingFileError(f"no train.bin in {data_dir}: prepare the data first with: {hint}")
    return meta
