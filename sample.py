"""
Sample from a trained nanoPE model (nanoGPT's sample.py, with the KV cache).

    python sample.py --out_dir=out --start="To be" --num_samples=3 --max_new_tokens=200
    python sample.py --ckpt=out/ckpt.pt --start=FILE:prompt.txt --max_new_tokens=4096

Generation may run past block_size for every variant that extrapolates; pos=learned
stops there with an error. Decodes with the checkpoint's tokenizer.
"""
import argparse
import os
import sys
from contextlib import nullcontext

import torch

from configurator import positive_int, run_script
from data.tokenizer import get_tokenizer
from checkpoint import load_checkpoint


def read_start(start):
    """The prompt text: `start` itself, or the contents of the file for "FILE:path"."""
    if start.startswith("FILE:"):
        with open(start[5:], encoding="utf-8") as f:
            return f.read()
    return start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", help="checkpoint path (default <out_dir>/ckpt.pt)")
    p.add_argument("--out_dir", default="out", help="training output folder holding ckpt.pt")
    p.add_argument("--start", default="\n", help='prompt text, or "FILE:path" to read it from a file')
    p.add_argument("--num_samples", type=positive_int, default=3)
    p.add_argument("--max_new_tokens", type=positive_int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; lower is more deterministic")
    p.add_argument("--top_k", type=int, default=200, help="keep the top_k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   default="bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32",
                   help="autocast dtype on cuda (cpu runs float32)")
    p.add_argument("--prefill_chunk", type=positive_int, default=1024, help="prompt tokens per prefill forward")
    args = p.parse_args(argv)
    if args.temperature <= 0 or args.top_k < 0:
        p.error("need --temperature > 0 and --top_k >= 0 (0: all tokens)")

    torch.manual_seed(args.seed)
    if "cuda" in args.device:
        torch.cuda.manual_seed(args.seed)
        torch.backends.cuda.matmul.allow_tf32 = True
    use_amp = "cuda" in args.device and args.dtype != "float32"
    ctx = torch.autocast("cuda", dtype=getattr(torch, args.dtype)) if use_amp else nullcontext()

    model, ckpt = load_checkpoint(args.ckpt or os.path.join(args.out_dir, "ckpt.pt"), args.device)
    model.eval()
    tok = get_tokenizer(ckpt.get("tokenizer", "byte"))
    ids = tok.encode(read_start(args.start)) or [tok.eot]  # an empty prompt starts from end-of-text
    x = torch.tensor(ids, dtype=torch.long, device=args.device)[None]  # (1, T)
    cfg = model.config
    if x.size(1) + args.max_new_tokens > model.max_length:
        sys.exit(f"sample.py: pos='learned' cannot generate past block_size={cfg.block_size} "
                 f"({x.size(1)} prompt + {args.max_new_tokens} new tokens); lower --max_new_tokens "
                 f"or use a variant that extrapolates")
    with torch.no_grad(), ctx:
        for _ in range(args.num_samples):
            y = model.generate(x, args.max_new_tokens, temperature=args.temperature,
                               top_k=args.top_k or None, prefill_chunk=args.prefill_chunk, vocab_size=tok.vocab_size)
            print(tok.decode(y[0].tolist()))
            print("---------------")


if __name__ == "__main__":
    run_script(main)
