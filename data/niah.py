"""RULER's needle-in-a-haystack tasks (SPEC §9): prompts and a synthetic training set.

Prompt = INTRO, a haystack with the needle sentence(s) "One of the special magic numbers for {key} is: {value}."
(the asked one at the asked depth), QUESTION, ANSWER_PREFIX; answer " v1, v2, ...". The templates are compact
byte-level versions of RULER's (scripts/data/synthetic/constants.py); TASKS holds RULER's eight task settings
(scripts/synthetic.yaml). Every piece is tokenized on its own with a leading space and the ids are concatenated
(data/passkey.py's convention), so a prompt has exactly the asked number of tokens.

    python data/niah.py --tokenizer byte --length 512 --n_train 20000 --n_val 500 --seed 0

writes data/niah_byte_512/{train,val}.bin: examples of exactly length+1 tokens (prompt + answer + one EOT, outside
the loss), the eight tasks in turn; train.py makes such a set on the fly for --dataset=niah_byte_512
(niah_byte_512-1024: prompts of 512..1024 tokens, right-padded with EOT).
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `data.*`
import itertools
import uuid
from collections import namedtuple

import numpy as np
from tqdm import tqdm

from configurator import InputError, MissingFileError, run_script
from data.passkey import FILLER, dataset_parser, write_examples
from data.tokenizer import get_tokenizer, write_meta

# RULER's scripts/synthetic.yaml: haystack (noise: the passkey filler; essay: text; needle: distractor needles),
# key and value type, keys with a needle, values per key, keys asked (RULER's num_needle_k/v/q)
Task = namedtuple("Task", "haystack key value n_keys n_values n_queries")
TASKS = {
    "single_1": Task("noise", "word", "number", 1, 1, 1),
    "single_2": Task("essay", "word", "number", 1, 1, 1),
    "single_3": Task("essay", "word", "uuid", 1, 1, 1),
    "multikey_1": Task("essay", "word", "number", 4, 1, 1),
    "multikey_2": Task("needle", "word", "number", 1, 1, 1),
    "multikey_3": Task("needle", "uuid", "uuid", 1, 1, 1),
    "multivalue": Task("essay", "word", "number", 1, 4, 1),
    "multiquery": Task("essay", "word", "number", 4, 1, 4),
}
# keys: short words (RULER draws adjective-noun pairs from wonderwords' lists; short ones keep a 4-key question small)
WORDS = tuple("""ant ape bat bear bee boar bug bull calf carp cat clam cod colt cow crab crow cub deer doe dog dove
duck eel elk emu ewe fawn fish flea fly foal fox frog gnat goat gull hare hawk hen hog ibis jay kid kite koi lamb
lark lion lynx mink mole moth mule newt owl ox pig pony pug puma ram rat rook seal slug snail swan tick toad tuna
wasp wolf worm wren yak""".split())
# the templates: [0] one value asked, [1] several (RULER's singular/plural forms); {kind}: number or uuid
INTRO = ("A special magic {kind} is hidden in the text. Memorize it.",
         "Some special magic {kind}s are hidden in the text. Memorize them.")
NEEDLE = "One of the special magic {kind}s for {key} is: {value}."
QUESTION = ("What is the special magic {kind} for {query}?", "What are all the special magic {kind}s for {query}?")
ANSWER_PREFIX = ("The special magic {kind} for {query} is", "The special magic {kind}s for {query} are")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the essay haystack: tiny Shakespeare from ../shared/data, else data/shakespeare.py's copy, else downloaded (the last)
ESSAY_PATHS = [os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"),
               os.path.join(ROOT, "data", "shakespeare_gpt2", "input.txt"),
               os.path.join(ROOT, "data", "shakespeare_byte", "input.txt")]
_ESSAY = []  # its non-empty lines, read once


def essay_lines():
    """The non-empty lines of tiny Shakespeare, stripped (the essay haystack's sentences): from the first of
    ESSAY_PATHS that exists, else downloaded to the last. Raises MissingFileError naming the fix offline."""
    if not _ESSAY:
        path = next((p for p in ESSAY_PATHS if os.path.isfile(p)), None)
        from data.shakespeare import load_text
        try:
            text = load_text(path, cache=ESSAY_PATHS[-1])
        except SystemExit as e:  # the download failed
            raise MissingFileError(f"the essay haystack needs tiny Shakespeare ({e}): copy it to {ESSAY_PATHS[0]} "
                                   f"or {ESSAY_PATHS[-1]}") from None
        _ESSAY.extend(line.strip() for line in text.splitlines() if line.strip())
    return _ESSAY


def random_value(rng, kind):
    """A random key or value of `kind` from random.Random rng: a 7-digit number (RULER's), a uuid4, or a WORDS word."""
    if kind == "number":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return rng.choice(WORDS)


def _draw(rng, kind, n, avoid):
    """n distinct random values of `kind`, none in the set `avoid` (which they join)."""
    out = []
    while len(out) < n:
        v = random_value(rng, kind)
        if v not in avoid:
            out.append(v)
            avoid.add(v)
    return out


def query_text(keys):
    """RULER's query: "a", or "a, b, and c"."""
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def _parts(tok, task, keys, values, asked):
    """Token ids of the fixed pieces: (intro, {(key index, value): needle ids}, question + answer prefix, answer)."""
    t, enc = TASKS[task], lambda s: tok.encode(" " + s)
    many = t.n_values * t.n_queries > 1
    query = query_text([keys[k] for k in asked])
    needles = {(k, v): enc(NEEDLE.format(kind=t.value, key=keys[k], value=v)) for k in range(len(keys))
               for v in values[k]}
    question = enc(QUESTION[many].format(kind=t.value, query=query)) + \
        enc(ANSWER_PREFIX[many].format(kind=t.value, query=query))
    answer = enc(", ".join(v for k in asked for v in values[k]))
    return tok.encode(INTRO[many].format(kind=t.value)), needles, question, answer


def niah_min_length(tokenizer, task):
    """Smallest length (prompt + answer tokens) that fits every prompt of `task`: its template with an empty
    haystack and the longest keys and values. Exact for "byte"; for BPE an estimate (niah_prompt checks each)."""
    tok, t = _tok(tokenizer), TASKS[task]
    longest = {"word": max(WORDS, key=len), "number": "9" * 7, "uuid": str(uuid.UUID(int=0, version=4))}
    keys, values = [longest[t.key]] * t.n_keys, [[longest[t.value]] * t.n_values for _ in range(t.n_keys)]
    intro, needles, question, answer = _parts(tok, task, keys, values, range(t.n_queries))
    return len(intro) + t.n_keys * t.n_values * len(next(iter(needles.values()))) + len(question) + len(answer)


def _haystack(tok, units, budget):
    """(front, whole): the last `budget` tokens of the stream of texts `units`, which end at a text's end. whole:
    the ids of the whole texts, each " " + text; front: the first text's cut tail, its first token a space (the
    tail's own, or one in place of the first), [] if the cut falls between texts; len(front) + theirs = budget."""
    whole, total = [], 0
    while total < budget:
        whole.append(tok.encode(" " + next(units)))
        total += len(whole[-1])
    excess = total - budget
    while whole and excess >= len(whole[0]):
        excess -= len(whole.pop(0))
    if not excess:
        return [], whole
    tail = whole[0][excess:]
    return (tail if tok.decode(tail[:1]).startswith(" ") else tok.encode(" ") + tail[1:]), whole[1:]


def niah_prompt(tokenizer, task, length, depth, rng):
    """One prompt of `task` (a TASKS name) with exactly `length` tokens of prompt + answer.

    The asked needle (the first asked key's first value) goes after int(depth * n + 0.5) of the haystack's n whole
    sentences (depth 0: right after the intro and a cut sentence's tail, 1: right before the question); the other
    needles (RULER: all of them) at uniformly random sentence boundaries, in random order. Keys, values, the essay's
    starting line and the distractors come from random.Random rng; distractor keys and values differ from the
    task's. Returns (prompt ids, answer ids, info): info = dict(query (the asked keys' text), expected (the values
    the answer names: per asked key in the asked order, its values in prompt order), needle (the asked needle's
    text), slot (its slot), n_sentences (n), needles (the task's needle texts in prompt order)). Raises InputError
    (one line) for an unknown task, a depth outside [0, 1] or a length below the task's minimum.
    """
    tok = _tok(tokenizer)
    if task not in TASKS:
        raise InputError(f"unknown NIAH task {task!r}; valid: {', '.join(TASKS)}")
    if not 0.0 <= depth <= 1.0:
        raise InputError(f"depth must be in [0, 1], got {depth}")
    t, used = TASKS[task], set()
    keys = _draw(rng, t.key, t.n_keys, used)
    values = [_draw(rng, t.value, t.n_values, used) for _ in keys]
    asked = rng.sample(range(t.n_keys), t.n_queries)
    intro, needles, question, answer = _parts(tok, task, keys, values, asked)
    main = (asked[0], values[asked[0]][0])
    others = [nd for nd in needles if nd != main]
    rng.shuffle(others)
    budget = length - len(intro) - sum(map(len, needles.values())) - len(question) - len(answer)
    if budget < 0:
        need = max(length - budget, niah_min_length(tok, task))
        raise InputError(f"length {length} is below the minimum {need} tokens of NIAH task {task} ({tok.name} "
                         f"tokenizer): use --lengths >= {need}")
    if t.haystack == "noise":
        units = itertools.cycle(FILLER)
    elif t.haystack == "essay":
        lines = essay_lines()
        start = rng.randrange(len(lines))
        units = (lines[(start + i) % len(lines)] for i in itertools.count())
    else:  # distractor needles: keys and values none of the task's
        units = (NEEDLE.format(kind=t.value, key=_draw(rng, t.key, 1, set(keys))[0],
                               value=_draw(rng, t.value, 1, set(used))[0]) for _ in itertools.count())
    front, whole = _haystack(tok, units, budget)
    slots = [[] for _ in range(len(whole) + 1)]  # slots[i]: the needles after i whole sentences
    slot = int(depth * len(whole) + 0.5)
    slots[slot].append(main)
    for nd in others:
        slots[rng.randint(0, len(whole))].append(nd)
    prompt = intro + front
    for i, here in enumerate(slots):
        prompt += sum((needles[nd] for nd in here), []) + (whole[i] if i < len(whole) else [])
    in_order = [nd for here in slots for nd in here]
    expected = [v for k in asked for kk, v in in_order if kk == k]
    answer = tok.encode(" " + ", ".join(expected))  # the same length as before: only the order may differ
    text = lambda nd: NEEDLE.format(kind=t.value, key=keys[nd[0]], value=nd[1])
    info = dict(query=query_text([keys[k] for k in asked]), expected=expected, needle=text(main), slot=slot,
                n_sentences=len(whole), needles=[text(nd) for nd in in_order])
    return prompt + question, answer, info


def _tok(tokenizer):
    return get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


def make_examples(tokenizer, length, n, rng, tasks=tuple(TASKS), desc=None, min_length=None):
    """uint16 array (n, length + 1): row i a prompt of tasks[i % len(tasks)] + its answer, right-padded with EOT.

    Depths uniform in [0, 1) from rng. With min_length, each prompt's length is drawn from min_length..length
    (the padding is left out of the loss by data.batches.get_batch)."""
    tok = _tok(tokenizer)
    out = np.full((n, length + 1), tok.eot, dtype=np.uint16)
    for i in tqdm(range(n), desc=desc, disable=n < 2000):
        n_tokens = length if min_length is None else rng.randint(min_length, length)
        prompt, answer, _ = niah_prompt(tok, tasks[i % len(tasks)], n_tokens, rng.random(), rng)
        out[i, :n_tokens] = prompt + answer
    return out


def build_dataset(tokenizer_name, length, n_train, n_val, seed, out_dir, min_length=None, tasks=tuple(TASKS)):
    """Write a synthetic NIAH set (the tasks in turn) to out_dir/{train,val}.bin + meta.json, like
    data/passkey.build_dataset: examples of exactly length + 1 tokens, meta["example_len"] = length + 1. Train and
    val use separate random streams derived from `seed`. Returns the meta dict. Raises InputError if a prompt of
    (min_)length cannot hold some task's template (the message names the minimum)."""
    need = max(niah_min_length(tokenizer_name, task) for task in tasks)
    if not need <= (min_length or length) <= length:
        span = f"{min_length}..{length}" if min_length else length
        raise InputError(f"NIAH prompts of {span} tokens: every task needs at least {need} ({tokenizer_name} "
                         f"tokenizer) and min_length <= length; use --length >= {need}")
    write_examples(out_dir, "niah", seed, n_train, n_val,
                   lambda n, rng, desc: make_examples(tokenizer_name, length, n, rng, tasks, desc, min_length))
    cmd = (f"python data/niah.py --tokenizer {tokenizer_name} --length {length} --n_train {n_train} --n_val {n_val} "
           f"--seed {seed}" + ("" if min_length is None else f" --min_length {min_length}"))
    return write_meta(out_dir, tokenizer_name, dataset="niah", example_len=length + 1, length=length,
                      min_length=min_length, tasks=list(tasks), n_train=n_train, n_val=n_val, seed=seed, prepare=cmd)


def main():
    args = dataset_parser(__doc__, "niah").parse_args()
    out_dir = args.out_dir or os.path.join("data", f"niah_{args.tokenizer}_{args.length}")
    meta = build_dataset(args.tokenizer, args.length, args.n_train, args.n_val, args.seed, out_dir, args.min_length)
    print(f"{args.n_train:,} train / {args.n_val:,} val examples of {meta['example_len']} tokens in {out_dir}")


if __name__ == "__main__":
    run_script(main)  # nanoPE's own errors (a bad option, missing input) as one line, no traceback
