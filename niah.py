"""
RULER's needle-in-a-haystack suite (SPEC §9): eight retrieval tasks beside passkey, at the same
lengths and in the same tables. Prompts come from data/niah.py, the generator of the training set
(--dataset=niah_byte_512), in the checkpoint's tokenizer.

    python niah.py --out_dir=out --tasks=single_1,multikey_1 --lengths=1x,8x --depths=5 --samples=2
    python niah.py --ckpt=out/ckpt.pt --mode=teacher_forced

The score is RULER's (string_match_all): the fraction of the expected values found in the model's answer,
case-insensitive, averaged over the prompts. --mode=generate (the default, RULER's): greedy decoding of as many tokens
as the expected answer has, the values searched for in the decoded text. --mode=teacher_forced (every task): one
pass over prompt + the expected answer in the training set's format (" v1, v2, ..."); a value counts if the argmax
is right at each of its tokens, given the gold answer before it. It fixes the order of the values (multivalue: as
they appear in the prompt; multiquery: as the question asks), so it suits a model trained on data/niah.py's set;
generation suits any model.

Long prompts are prefilled through the KV cache in chunks of --chunk tokens (evaluate.py, shared with passkey.py).
Writes --out (JSON, rewritten after every batch: the same command goes on from where a run was cut short), a CSV
beside it and one PNG with a length x depth heatmap per task; prints a table per task and one of every task by
length, with averages.
"""
import random
import time

from checkpoint import checkpoint_digest
from configurator import InputError, run_script
from data.niah import TASKS, niah_min_length, niah_prompt
from evaluate import (accuracy_table, eval_parser, format_table, load_eval, plot_heatmap, resume, run_jobs,
                     tokenizer_and_depths, write_results)


def recall(expected, text):
    """RULER's string_match_all for one prompt: the fraction of the strings `expected` that occur in `text`,
    case-insensitive (0.0 for text None)."""
    text = (text or "").lower()
    return sum(e.lower() in text for e in expected) / len(expected)


def teacher_forced_recall(tokenizer, answer, pred, expected):
    """The fraction of the strings `expected` whose every token is predicted right under teacher forcing.

    answer: the expected answer's token ids (its text holds the strings in order); pred: the argmax ids at the
    same positions. A string counts if each token that overlaps its characters has pred == answer there."""
    ends = [len(tokenizer.decode(answer[:i + 1])) for i in range(len(answer))]  # each token's end in the text
    text, start, hits = tokenizer.decode(answer), 0, 0
    for e in expected:
        lo = text.index(e, start)
        start = hi = lo + len(e)
        span = [i for i, end in enumerate(ends) if end > lo and (i == 0 or ends[i - 1] < hi)]
        hits += all(pred[i] == answer[i] for i in span)
    return hits / len(expected)


def run_niah(model, tokenizer, tasks, lengths, depths=5, samples=2, seed=0, mode="generate", chunk=4096,
             device="cpu", progress=True, ctx=None, batch_size=5, done=(), save=None):
    """RULER NIAH scores of `model` for each task × length × depth × sample.

    tokenizer: a data.tokenizer object or its name; tasks: names in data.niah.TASKS; lengths: prompt + answer
    tokens (each prompt has exactly that many); depths: a number of equidistant depths or a list in [0, 1]. The
    prompt of (task, length, depth index, sample) comes from a Random seeded by them and `seed`. Returns a list of
    dicts (task, length, n_tokens, depth, sample, query, expected (the values, space-separated), answer,
    predicted, correct), in that order; correct is the prompt's score in [0, 1] (recall, or teacher_forced_recall),
    None (n/a) for pos='learned' past block_size. done, save, batch_size, progress: as in passkey.run_passkey
    (a run cut short goes on; evaluate.run_jobs). Raises InputError (a ValueError) for an unknown task or mode, or
    a length below a task's minimum (the message names it).
    """
    tokenizer, depths = tokenizer_and_depths(tokenizer, depths)
    for task in tasks:
        if task not in TASKS:
            raise InputError(f"unknown NIAH task {task!r}; valid: {', '.join(TASKS)}")
        need = niah_min_length(tokenizer, task)
        if min(lengths) < need:
            raise InputError(f"length {min(lengths)} is below the minimum {need} tokens of NIAH task {task} "
                             f"({tokenizer.name} tokenizer): use --lengths >= {need}, or leave {task} out of --tasks")

    def make(job):
        task, L, d, s = job
        prompt, answer, info = niah_prompt(tokenizer, task, L, depths[d], random.Random(f"{seed}:{task}:{L}:{d}:{s}"))
        expected = info["expected"]
        score = (lambda pred: teacher_forced_recall(tokenizer, answer, pred, expected)) if mode == "teacher_forced" \
            else (lambda pred: recall(expected, tokenizer.decode(pred)))
        return prompt, answer, lambda pred: dict(
            task=task, length=L, n_tokens=len(prompt) + len(answer), depth=depths[d], sample=s, query=info["query"],
            expected=" ".join(expected), answer=tokenizer.decode(answer),
            predicted=None if pred is None else tokenizer.decode(pred), correct=None if pred is None else score(pred))
    jobs = [(L, (task, L, d, s)) for task in tasks for L in lengths for d in range(len(depths)) for s in range(samples)]
    scored = {(r["task"], r["length"], depths.index(r["depth"]), r["sample"]): r for r in done}
    return run_jobs(model, jobs, scored, make, mode, chunk, device, progress, ctx, batch_size, save, desc="niah")


def by_task(results):
    """{task: its results}, the tasks in the order they come."""
    out = {}
    for r in results:
        out.setdefault(r["task"], []).append(r)
    return out


def format_summary(results, block_size=None):
    """Text table: one row per length, the mean score of each task and their average; a last row "all" (n/a where
    no prompt applies)."""
    per_task = {task: accuracy_table(rs)[1] for task, rs in by_task(results).items()}  # {task: {length: score}}
    lengths = sorted({r["length"] for r in results})

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    fmt = lambda a: "n/a" if a is None else f"{100 * a:.0f}%"
    lines = [f"{'length':>8} {'x':>6} | " + " ".join(f"{t:>10}" for t in per_task) + " |    average"]
    for L in lengths + ["all"]:
        cells = [per_task[t][L] if L != "all" else mean(per_task[t].values()) for t in per_task]
        mult = f"{L / block_size:g}x" if block_size and L != "all" else ""
        lines.append(f"{L:>8} {mult:>6} | " + " ".join(f"{fmt(c):>10}" for c in cells) + f" | {fmt(mean(cells)):>10}")
    return "\n".join(lines)


def plot_grid(results, path, meta):
    """One PNG at `path`: a length × depth heatmap of the scores (%) per task (evaluate.plot_heatmap), 4 a row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = by_task(results)
    cols = min(4, len(groups))
    rows = (len(groups) + cols - 1) // cols
    n_len, n_depth = len({r["length"] for r in results}), len({r["depth"] for r in results})
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(cols * max(4.5, 1.5 + 0.8 * n_len), rows * (1.8 + 0.45 * n_depth)))
    for ax, (task, rs) in zip(axes.flat, groups.items()):
        plot_heatmap(rs, None, task, meta.get("block_size"), ax=ax, label="score")
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    fig.suptitle(meta.get("title", "RULER NIAH score (%)"), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = eval_parser(__doc__, "niah", "generate")
    p.add_argument("--tasks", default="all", help=f"comma-separated names from {', '.join(TASKS)}; all: the eight")
    args = p.parse_args(argv)
    tasks = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",")]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:  # before the checkpoint is loaded
        p.error(f"unknown task {unknown[0]!r} in --tasks: use all or names from {', '.join(TASKS)}")
    ev = load_eval(p, args, "niah")
    settings = dict(ckpt_sha256=checkpoint_digest(ev.ckpt_path), tasks=tasks, lengths=ev.lengths, depths=ev.depths,
                    samples=args.samples, seed=args.seed, mode=args.mode, dtype=args.dtype)
    out, done = resume(ev, settings, args.overwrite)
    cfg, bs = ev.model.config, ev.block_size
    meta = dict(ckpt=ev.ckpt_path, pos=cfg.pos, ssmax=cfg.ssmax, block_size=bs, tokenizer=ev.tokenizer.name,
                iter_num=ev.ckpt.get("iter_num"), mode=args.mode, seed=args.seed, tasks=tasks,
                title=f"RULER NIAH score (%), {ev.name}, block_size {bs}, {args.mode}", settings=settings)
    try:
        results = run_niah(ev.model, ev.tokenizer, tasks, ev.lengths, ev.depths, args.samples, args.seed, args.mode,
                           args.chunk, args.device, ctx=ev.ctx, batch_size=args.batch_size, done=done,
                           save=lambda rs: write_results(rs, out, meta, finished=False, plot=plot_grid))
    except ValueError as e:
        p.error(str(e))
    print(f"\nRULER NIAH score, {ev.name}, {ev.ckpt_path}, block_size {bs}, mode {args.mode}, {args.samples} "
          f"samples per cell, {time.time() - ev.t0:.1f} s")
    for task, rs in by_task(results).items():
        print(f"\n{task}\n{format_table(rs, bs)}")
    print(f"\nevery task\n{format_summary(results, bs)}")
    print("wrote " + ", ".join(write_results(results, out, meta, plot=plot_grid)))


if __name__ == "__main__":
    run_script(main)
