"""FineWeb / FineWeb-Edu as GPT-2 BPE tokens: sharded, resumable, then train.bin / val.bin.

    python data/fineweb.py --name sample-10BT --max_tokens 1e9         # -> data/fineweb_sample-10BT/
    python data/fineweb.py --dataset edu --name sample-10BT            # -> data/fineweb-edu_sample-10BT/
    python data/fineweb.py --data_files a.parquet b.jsonl --out_dir data/fineweb_local   # offline

Documents come from the parquet files of HuggingFaceFW/fineweb(-edu) on the Hugging Face
hub, read through huggingface_hub.HfFileSystem (HTTP range requests: only the row groups
that are needed are fetched, so --max_tokens downloads only a part), or from local
parquet / jsonl files with a "text" column. Worker processes tokenize each document as
[EOT] + GPT-2 ids. Tokens go to uint16 shards of --shard_size tokens (nanoGPT / llm.c
style): val_000000.bin is the first shard, then train_000000.bin, train_000001.bin, ...
Each shard is written atomically and progress.json records the finished shards and where
the stream stands (document index + token offset), so re-running the same command skips
them. At the end the shards are concatenated into train.bin / val.bin (what train.py
reads), and meta.json is written. The shards take as much disk again: once done they may
be deleted (a re-run then starts over).
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `data.*`
import argparse
import json
import multiprocessing as mp
import shutil

import numpy as np
from tqdm import tqdm

from configurator import InputError, MissingFileError, positive_int, run_script, write_atomic, write_json
from data.tokenizer import get_tokenizer, write_meta, write_split

REPOS = {"fineweb": "HuggingFaceFW/fineweb", "edu": "HuggingFaceFW/fineweb-edu"}


def hub_files(dataset, name):
    """(sorted parquet paths, opener) for config `name` of REPOS[dataset] on the hub.

    "sample-10BT" -> sample/10BT/*.parquet, "CC-MAIN-2024-10" -> data/CC-MAIN-2024-10/*.parquet.
    Raises SystemExit with a hint to use --data_files when the hub cannot be reached.
    """
    from huggingface_hub import HfFileSystem
    fs = HfFileSystem()
    sub = name.replace("-", "/", 1) if name.startswith("sample-") else f"data/{name}"
    pattern = f"datasets/{REPOS[dataset]}/{sub}/*.parquet"
    try:
        files = sorted(fs.glob(pattern))
    except Exception as e:  # offline, proxy, auth ...
        raise SystemExit(f"could not list {pattern} on the Hugging Face hub ({e}); offline? use --data_files")
    if not files:
        raise SystemExit(f"no parquet files match {pattern}; check --dataset / --name")
    return files, fs.open


def iter_texts(files, skip=0, opener=open):
    """Yield the "text" of every document of `files` (parquet or jsonl), in order, after the first `skip`.

    Whole parquet row groups inside the skipped part are not read.
    """
    import pyarrow.parquet as pq
    for path in files:
        if str(path).endswith(".parquet"):
            with opener(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                for g in range(pf.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    if skip >= n:
                        skip -= n
                        continue
                    yield from pf.read_row_group(g, columns=["text"]).column("text").to_pylist()[skip:]
                    skip = 0
        elif str(path).endswith((".jsonl", ".json")):
            with opener(path, "rb") as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        if skip:
                            skip -= 1
                        else:
                            yield jsonl_text(line, path, n)
        else:
            raise InputError(f"{path}: expected a .parquet or .jsonl file")


def jsonl_text(line, path, n):
    """The "text" of line n of the jsonl file `path`; InputError naming the file and line if it has none."""
    try:
        text = json.loads(line)["text"]
    except (ValueError, KeyError, TypeError) as e:  # not JSON, no "text", not an object
        reason = "no \"text\" field" if isinstance(e, KeyError) else f"not a JSON object ({type(e).__name__})"
        raise InputError(f"{path} line {n}: {reason}; every line must be a JSON object with a \"text\" "
                         "string") from None
    if not isinstance(text, str):
        raise InputError(f"{path} line {n}: \"text\" is a {type(text).__name__}, not a string")
    return text


_TOK = None


def _init_worker():
    global _TOK
    _TOK = get_tokenizer("gpt2")


def tokenize_doc(text):
    """[EOT] + GPT-2 ids of one document, as a uint16 array (runs in a worker)."""
    return np.array([_TOK.eot] + _TOK.encode(text), dtype=np.uint16)


def shard_name(i):
    """File stem of shard i: val_000000 for i = 0, else train_{i-1:06d}."""
    return "val_000000" if i == 0 else f"train_{i - 1:06d}"


def _save(out_dir, st):
    write_json(os.path.join(out_dir, "progress.json"), st)


def _load_progress(out_dir, config, max_tokens):
    """The saved progress if it matches `config` and its shards exist, else a fresh one."""
    fresh = {"config": config, "shards": 0, "docs": 0, "offset": 0, "tokens": 0, "complete": None}
    try:
        with open(os.path.join(out_dir, "progress.json")) as f:
            st = json.load(f)
    except FileNotFoundError:
        return fresh
    n = (st.get("complete") or {}).get("shards", st["shards"])
    ok = st["config"] == config and (max_tokens is None or st["tokens"] <= max_tokens) and all(
        os.path.isfile(os.path.join(out_dir, shard_name(i) + ".bin")) for i in range(n))
    if not ok:
        print(f"{out_dir}/progress.json does not match this run: starting over")
    return st if ok else fresh


def _tokenize_to_shards(st, texts, out_dir, shard_size, max_tokens, num_proc, chunksize):
    """Tokenize `texts` (already past st["docs"] documents) into shards from st["shards"] on."""
    limit = float("inf") if max_tokens is None else max_tokens
    shard, doc, offset, total = st["shards"], st["docs"], st["offset"], st["tokens"]
    buf, fill = np.empty(shard_size, dtype=np.uint16), 0
    get_tokenizer("gpt2")  # fail here, with its message: a worker whose initializer fails is restarted forever
    with mp.Pool(num_proc, initializer=_init_worker) as pool, \
            tqdm(total=max_tokens, initial=total, unit="tok", unit_scale=True, desc="tokenizing") as bar:
        for ids in pool.imap(tokenize_doc, texts, chunksize=chunksize):
            pos, offset = offset, 0  # a resumed document restarts at the saved offset
            while pos < len(ids) and total < limit:
                take = int(min(shard_size - fill, len(ids) - pos, limit - total))
                buf[fill:fill + take] = ids[pos:pos + take]
                fill, pos, total = fill + take, pos + take, total + take
                bar.update(take)
                if fill == shard_size:
                    write_split(out_dir, shard_name(shard), buf)
                    shard, fill, done = shard + 1, 0, pos == len(ids)
                    st.update(shards=shard, docs=doc + done, offset=0 if done else pos, tokens=total)
                    _save(out_dir, st)
            if total >= limit:
                break
            doc += 1
    if fill:  # the last, partial shard
        write_split(out_dir, shard_name(shard), buf[:fill])
        shard += 1
    st["complete"] = {"max_tokens": max_tokens, "shards": shard, "tokens": total}
    _save(out_dir, st)


def _concat(out_dir, stems, split):
    path = os.path.join(out_dir, f"{split}.bin")

    def concat(tmp):
        with open(tmp, "wb") as f:
            for s in stems:
                with open(os.path.join(out_dir, s + ".bin"), "rb") as g:
                    shutil.copyfileobj(g, f, 1 << 24)
    write_atomic(path, concat)
    return os.path.getsize(path) // 2


def prepare(out_dir, data_files=None, dataset="fineweb", name="sample-10BT", shard_size=10**8,
            max_tokens=None, num_proc=None, chunksize=16):
    """Tokenize FineWeb (or local `data_files`) into out_dir; resumable. Returns the meta dict.

    data_files: list of local .parquet / .jsonl paths with a "text" column (then dataset /
    name are ignored), else the hub config `name` of REPOS[dataset]. Stops after
    max_tokens tokens (None: all). Raises MissingFileError for a missing data file, InputError
    for a file that is not .parquet/.jsonl (or a jsonl line without "text"), if shard_size < 1,
    if max_tokens <= shard_size or if the data is smaller than one shard (there would be no
    train tokens).
    """
    missing = [f for f in data_files or [] if not os.path.isfile(f)]
    if missing:
        raise MissingFileError(f"data file(s) not found: {', '.join(missing)} (--data_files takes .parquet/.jsonl paths)")
    other = [f for f in data_files or [] if not f.endswith((".parquet", ".jsonl", ".json"))]
    if other:
        raise InputError(f"--data_files takes .parquet or .jsonl files (a \"text\" column), not {', '.join(other)}")
    if shard_size < 1:
        raise InputError(f"shard_size must be >= 1 token, got {shard_size}")
    if max_tokens is not None and max_tokens <= shard_size:
        raise InputError(f"max_tokens ({max_tokens}) must exceed shard_size ({shard_size}): shard 0 is val")
    if data_files:
        source = [os.path.abspath(f) for f in data_files]
        cmd = "python data/fineweb.py --data_files " + " ".join(source)
    else:
        source, cmd = f"{REPOS[dataset]}/{name}", f"python data/fineweb.py --dataset {dataset} --name {name}"
    cmd += f" --shard_size {shard_size} --out_dir {out_dir}" + (f" --max_tokens {max_tokens}" if max_tokens else "")
    os.makedirs(out_dir, exist_ok=True)
    st = _load_progress(out_dir, {"source": source, "shard_size": shard_size}, max_tokens)
    done = st["complete"]
    if done and done["max_tokens"] == max_tokens:
        print(f"{out_dir}: all {done['shards']} shards already done")
    else:
        if st["shards"]:
            print(f"{out_dir}: resuming after {st['shards']} finished shards ({st['tokens']:,} tokens)")
        st["complete"] = None
        _save(out_dir, st)
        files, opener = (source, open) if data_files else hub_files(dataset, name)  # hub listing only if needed
        texts = iter_texts(files, st["docs"], opener)
        _tokenize_to_shards(st, texts, out_dir, shard_size, max_tokens, num_proc or os.cpu_count(), chunksize)
    n = st["complete"]["shards"]
    if n < 2:
        raise InputError(f"only {st['complete']['tokens']:,} tokens, less than one shard: lower --shard_size")
    for f in os.listdir(out_dir):  # shards left over from an earlier, longer run
        if f.startswith("train_") and f.endswith(".bin") and int(f[6:-4]) >= n - 1:
            os.remove(os.path.join(out_dir, f))
    val = _concat(out_dir, [shard_name(0)], "val")
    train = _concat(out_dir, [shard_name(i) for i in range(1, n)], "train")
    print(f"{out_dir}: train {train:,} tokens, val {val:,} tokens ({n} shards)")
    return write_meta(out_dir, "gpt2", dataset=source, train_tokens=train, val_tokens=val,
                      shard_size=shard_size, n_shards=n, prepare=cmd)


def main():
    num = lambda s: int(float(s))  # accepts 1e9
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(REPOS), default="fineweb", help="edu: HuggingFaceFW/fineweb-edu")
    p.add_argument("--name", default="sample-10BT", help="hub config, e.g. sample-10BT, sample-100BT")
    p.add_argument("--data_files", nargs="+", default=None, help="local .parquet/.jsonl files instead of the hub")
    p.add_argument("--out_dir", default=None, help="default data/<fineweb|fineweb-edu>_<name> (data/fineweb_local)")
    p.add_argument("--shard_size", type=num, default=10**8, help="tokens per shard")
    p.add_argument("--max_tokens", type=num, default=None, help="stop after this many tokens")
    p.add_argument("--num_proc", type=positive_int, default=None, help="tokenizer processes (default: all cores)")
    p.add_argument("--chunksize", type=positive_int, default=16, help="documents per worker task")
    a = p.parse_args()
    prefix = "fineweb-edu" if a.dataset == "edu" else "fineweb"
    out_dir = a.out_dir or os.path.join("data", "fineweb_local" if a.data_files else f"{prefix}_{a.name}")
    prepare(out_dir, a.data_files, a.dataset, a.name, a.shard_size, a.max_tokens, a.num_proc, a.chunksize)


if __name__ == "__main__":
    run_script(main)  # nanoPE's own errors (a bad option, missing input) as one line, no traceback
