"""Tokenizers, token files, tiny Shakespeare and FineWeb preparation (data/*.py).

Every check compares against an independent computation (Python's UTF-8 codec,
tiktoken called directly, the documents encoded one by one), not the code's own output.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import fineweb, shakespeare
from data.tokenizer import get_tokenizer, read_meta, write_meta, write_split

ROOT = Path(__file__).resolve().parent.parent
TEXT = "Hello, world! Ünïcödé → 日本語 😀\n\tend <|endoftext|> tail"


def tiktoken_ids(texts):
    import tiktoken
    enc = tiktoken.get_encoding("r50k_base")
    return [enc.encode_ordinary(t) for t in texts]


def load(path):
    return np.fromfile(path, dtype=np.uint16).tolist()


# ---------------------------------------------------------------- tokenizers

def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    assert (tok.name, tok.eot, tok.vocab_size) == ("byte", 256, 257)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.decode([256] + ids + [256]) == TEXT  # eot is dropped
    assert tok.decode([72, 0xFF, 105]) == "H\ufffdi"  # invalid byte -> replacement char


def test_gpt2_tokenizer_round_trip(gpt2_tokenizer):
    tok = gpt2_tokenizer
    assert (tok.name, tok.eot, tok.vocab_size) == ("gpt2", 50256, 50257)
    assert tok.encode("Hello world") == [15496, 995]  # known GPT-2 ids
    ids = tok.encode(TEXT)
    assert ids == tiktoken_ids([TEXT])[0] and 50256 not in ids  # special text stays ordinary
    assert tok.decode(ids) == TEXT
    assert tok.decode([15496, 50300, 995]) == "Hello world"  # a padding id of the model's 50304 rows is dropped


def test_data_dir_of_a_dataset_name(tmp_path, monkeypatch):
    """--dataset: a folder relative to the working directory, else data/<name> in the repository, from anywhere."""
    from data.tokenizer import data_dir_of
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert data_dir_of("mine") == "mine"
    assert data_dir_of("shakespeare_byte") == str(ROOT / "data" / "shakespeare_byte")


def test_unknown_tokenizer():
    with pytest.raises(ValueError, match="byte.*gpt2"):
        get_tokenizer("llama")


def test_write_split_and_meta(tmp_path):
    ids = [0, 1, 256, 50256, 65535]
    path = write_split(tmp_path, "train", ids)
    assert load(path) == ids and os.listdir(tmp_path) == ["train.bin"]  # no tmp file left
    with pytest.raises(ValueError, match="65536"):
        write_split(tmp_path, "val", [1, 65536])
    with pytest.raises(ValueError):
        write_split(tmp_path, "val", [-1])
    meta = write_meta(tmp_path, "byte", example_len=513)
    assert json.loads((tmp_path / "meta.json").read_text()) == meta == {
        "tokenizer": "byte", "vocab_size": 257, "example_len": 513}
    assert read_meta(tmp_path) == meta


def test_read_meta_missing_data_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python data/shakespeare.py"):
        read_meta(tmp_path)
    write_meta(tmp_path, "gpt2", prepare="python data/fineweb.py --name sample-10BT")
    with pytest.raises(FileNotFoundError, match="python data/fineweb.py --name sample-10BT"):
        read_meta(tmp_path)  # meta.json but no train.bin


# ---------------------------------------------------------------- Shakespeare

def test_shakespeare_byte(shakespeare_path, tmp_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    counts = shakespeare.prepare(text, "byte", tmp_path)
    train, val = load(tmp_path / "train.bin"), load(tmp_path / "val.bin")
    assert train + val == list(text.encode("utf-8"))  # the whole text, in order
    assert counts == {"train": len(train), "val": len(val)}
    assert bytes(val).decode("utf-8") == text[int(0.9 * len(text)):]  # the last 10% of characters
    assert read_meta(tmp_path)["tokenizer"] == "byte"


def test_shakespeare_gpt2(shakespeare_path, gpt2_tokenizer, tmp_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    shakespeare.prepare(text, "gpt2", tmp_path)
    train, val = load(tmp_path / "train.bin"), load(tmp_path / "val.bin")
    cut = int(0.9 * len(text))
    assert [train, val] == tiktoken_ids([text[:cut], text[cut:]])
    assert abs(len(train) + len(val) - len(tiktoken_ids([text])[0])) <= 2  # only the cut differs
    assert gpt2_tokenizer.decode(val) == text[cut:]
    assert read_meta(tmp_path)["vocab_size"] == 50257


def test_shakespeare_cli(shakespeare_path, tmp_path):
    out = tmp_path / "sh"
    r = subprocess.run([sys.executable, "data/shakespeare.py", "--tokenizer", "byte", "--input",
                        str(shakespeare_path), "--out_dir", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "tokens" in r.stdout
    assert (out / "train.bin").stat().st_size + (out / "val.bin").stat().st_size == 2 * Path(
        shakespeare_path).stat().st_size


# ---------------------------------------------------------------- FineWeb

@pytest.fixture(scope="module")
def docs_files(shakespeare_path, tmp_path_factory):
    """600 short documents: 400 in a parquet file (row groups of 50), 200 in a jsonl file."""
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    docs = [d for d in text.split("\n\n") if d.strip()][:598] + ["", "naïve café — 日本 <|endoftext|>"]
    d = tmp_path_factory.mktemp("docs")
    pq.write_table(pa.table({"id": list(range(400)), "text": docs[:400]}), d / "a.parquet", row_group_size=50)
    (d / "b.jsonl").write_text("".join(json.dumps({"text": t, "n": 1}) + "\n" for t in docs[400:]))
    return docs, [str(d / "a.parquet"), str(d / "b.jsonl")]


def expected_stream(docs):
    return [t for ids in tiktoken_ids(docs) for t in [50256] + ids]


def shard_stats(out):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(out.glob("*_0*.bin"))}


def test_fineweb_shards(docs_files, gpt2_tokenizer, tmp_path):
    docs, files = docs_files
    want = expected_stream(docs)
    meta = fineweb.prepare(tmp_path, files, shard_size=2000, num_proc=2)
    n = -(-len(want) // 2000)
    names = ["val_000000.bin"] + [f"train_{i:06d}.bin" for i in range(n - 1)]
    assert sorted(p.name for p in tmp_path.glob("*_0*.bin")) == sorted(names)
    shards = [load(tmp_path / s) for s in names]
    assert all(len(s) == 2000 for s in shards[:-1]) and sum(shards, []) == want
    assert load(tmp_path / "val.bin") == want[:2000] and load(tmp_path / "train.bin") == want[2000:]
    assert want.count(50256) == len(docs)  # EOT before each document; typed "<|endoftext|>" is plain text
    assert meta["tokenizer"] == "gpt2" and meta["train_tokens"] == len(want) - 2000
    assert read_meta(tmp_path) == meta


def test_fineweb_max_tokens_and_resume(docs_files, gpt2_tokenizer, tmp_path):
    docs, files = docs_files
    want = expected_stream(docs)
    doc_ends = np.cumsum([len(ids) + 1 for ids in tiktoken_ids(docs)])

    fineweb.prepare(tmp_path, files, shard_size=2000, max_tokens=9000, num_proc=2)  # stops early
    assert load(tmp_path / "val.bin") + load(tmp_path / "train.bin") == want[:9000]
    first = shard_stats(tmp_path)
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["shards"] == 4 and 50 < progress["docs"] < 400  # inside the parquet, past a row group

    fineweb.prepare(tmp_path, files, shard_size=2000, max_tokens=9000, num_proc=2)  # same run: nothing redone
    assert shard_stats(tmp_path) == first

    stop = int(doc_ends[450]) + 10  # resume inside the jsonl file next time
    fineweb.prepare(tmp_path, files, shard_size=2000, max_tokens=stop, num_proc=2)
    second = shard_stats(tmp_path)
    assert all(second[k] == first[k] for k in ["val_000000.bin"] + [f"train_{i:06d}.bin" for i in range(3)])
    assert load(tmp_path / "val.bin") + load(tmp_path / "train.bin") == want[:stop]
    assert json.loads((tmp_path / "progress.json").read_text())["docs"] > 400

    meta = fineweb.prepare(tmp_path, files, shard_size=2000, num_proc=2)  # the rest
    assert load(tmp_path / "val.bin") + load(tmp_path / "train.bin") == want
    third = shard_stats(tmp_path)
    partial = max(k for k in second if k.startswith("train_"))
    assert all(third[k] == second[k] for k in second if k != partial)  # all full shards kept
    assert meta["train_tokens"] + meta["val_tokens"] == len(want)

    with pytest.raises(ValueError, match="shard_size"):
        fineweb.prepare(tmp_path, files, shard_size=2000, max_tokens=2000)


def test_fineweb_cli(docs_files, gpt2_tokenizer, tmp_path):
    docs, files = docs_files
    r = subprocess.run([sys.executable, "data/fineweb.py", "--data_files", *files, "--out_dir", str(tmp_path),
                        "--shard_size", "5e3", "--max_tokens", "12e3", "--num_proc", "2"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load(tmp_path / "val.bin") + load(tmp_path / "train.bin") == expected_stream(docs)[:12000]
    assert "--data_files" in read_meta(tmp_path)["prepare"]
