"""Tiny Shakespeare (~1.1M characters) as train.bin / val.bin, byte-level or GPT-2 BPE.

    python data/shakespeare.py --tokenizer byte          # -> data/shakespeare_byte/
    python data/shakespeare.py --tokenizer gpt2 --input /path/to/input.txt

The first 90% of the characters is train, the last 10% is val (nanoGPT split).
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `data.*`
import argparse
import urllib.request

from configurator import MissingFileError, run_script
from data.tokenizer import get_tokenizer, write_meta, write_split

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def prepare(text, tokenizer_name, out_dir, train_frac=0.9):
    """Tokenize `text` and write out_dir/{train,val}.bin + meta.json.

    Split by characters: train = text[:int(train_frac*len)], val = the rest; each
    half is tokenized on its own. Returns {"train": n_train_tokens, "val": n_val_tokens}.
    """
    tok = get_tokenizer(tokenizer_name)
    cut = int(len(text) * train_frac)
    counts = {}
    for split, part in (("train", text[:cut]), ("val", text[cut:])):
        ids = tok.encode(part)
        write_split(out_dir, split, ids)
        counts[split] = len(ids)
    write_meta(out_dir, tokenizer_name, dataset="shakespeare", train_tokens=counts["train"],
               val_tokens=counts["val"], prepare=f"python data/shakespeare.py --tokenizer {tokenizer_name}")
    return counts


def load_text(path=None, cache=None):
    """The text of `path`, else of `cache` if present, else downloaded from URL (saved to cache).

    Raises FileNotFoundError if `path` does not exist, SystemExit with a hint to pass --input
    when the download fails (offline).
    """
    if path is None and cache and os.path.isfile(cache):
        path = cache
    if path is None:
        try:
            with urllib.request.urlopen(URL, timeout=30) as r:
                text = r.read().decode("utf-8")
        except OSError as e:
            raise SystemExit(f"could not download {URL} ({e}); offline? pass --input PATH to a local copy")
        if cache:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            with open(cache, "w", encoding="utf-8") as f:
                f.write(text)
        return text
    if not os.path.isfile(path):
        raise MissingFileError(f"--input {path} not found (a tinyshakespeare text; without --input it is downloaded)")
    with open(path, encoding="utf-8") as f:
        return f.read()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte")
    p.add_argument("--input", default=None, help="local tinyshakespeare text (else downloaded)")
    p.add_argument("--out_dir", default=None, help="default data/shakespeare_<tokenizer>")
    args = p.parse_args()
    out_dir = args.out_dir or os.path.join("data", f"shakespeare_{args.tokenizer}")
    text = load_text(args.input, cache=os.path.join(out_dir, "input.txt"))
    counts = prepare(text, args.tokenizer, out_dir)
    print(f"{len(text):,} characters -> train {counts['train']:,} tokens, val {counts['val']:,} tokens in {out_dir}")


if __name__ == "__main__":
    run_script(main)  # nanoPE's own errors (a bad option, missing input) as one line, no traceback
