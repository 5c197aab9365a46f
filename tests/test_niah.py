"""RULER NIAH (SPEC §9): each task's prompts against its definition, parsed back with plain
regular expressions; RULER's recall scorer on hand cases; niah.py end to end (a perfect reader scores 1, a partly
wrong one its fraction, a tiny GPT through the CLI, resume); bad input; the synthetic training set."""
import json
import random
import re
import subprocess
import sys

import numpy as np
import pytest

import niah
from configurator import InputError
from data import niah as gen
from data.batches import get_batch, prepare_data
from data.passkey import FILLER
from data.tokenizer import get_tokenizer
from conftest import ROOT, make_tiny_gpt
from test_passkey import CopyStub, save_ckpt

RULER = {  # scripts/synthetic.yaml: haystack, key, value, num_needle_k, num_needle_v, num_needle_q
    "single_1": ("noise", "word", "number", 1, 1, 1), "single_2": ("essay", "word", "number", 1, 1, 1),
    "single_3": ("essay", "word", "uuid", 1, 1, 1), "multikey_1": ("essay", "word", "number", 4, 1, 1),
    "multikey_2": ("needle", "word", "number", 1, 1, 1), "multikey_3": ("needle", "uuid", "uuid", 1, 1, 1),
    "multivalue": ("essay", "word", "number", 1, 4, 1), "multiquery": ("essay", "word", "number", 4, 1, 4)}
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: ([\w-]+)\.")
VALUE = {"number": r"\d{7}", "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
         "word": r"[a-z]+"}
LINE = re.compile(r"Line (\d+) says (?:la )*\.")  # the stand-in essay's lines
BYTE = get_tokenizer("byte")


@pytest.fixture
def essay(tmp_path, monkeypatch):
    """A stand-in essay whose lines (of 14-38 bytes) are numbered, so a haystack can be parsed back."""
    path = tmp_path / "essay.txt"
    path.write_text("\n\n".join(f"Line {i} says " + "la " * (i % 9) + "." for i in range(500)))
    monkeypatch.setattr(gen, "ESSAY_PATHS", [str(path)])
    monkeypatch.setattr(gen, "_ESSAY", [])


def parse(task, prompt, answer):
    """Check a decoded prompt's frame; returns (query keys, sentences after the cut tail, answer values)."""
    hay, key, value, n_keys, n_values, n_queries = RULER[task]
    kind, many = value, n_values * n_queries > 1
    intro = (f"Some special magic {kind}s are hidden in the text. Memorize them." if many
             else f"A special magic {kind} is hidden in the text. Memorize it.")
    m = re.fullmatch(rf"{re.escape(intro)}(.*) What (?:are all|is) the special magic {kind}s? for (.+)\? "
                     rf"The special magic {kind}s? for (.+) (?:are|is)", prompt, re.S)
    assert m and m.group(2) == m.group(3), prompt[-300:]
    keys = re.split(r", and |, ", m.group(2))
    assert len(keys) == n_queries and (n_queries == 1 or m.group(2).count(", and ") == 1)
    assert all(re.fullmatch(VALUE[key], k) for k in keys)
    values = answer[1:].split(", ")
    assert answer.startswith(" ") and all(re.fullmatch(VALUE[value], v) for v in values)
    body = m.group(1)
    full = {"noise": "|".join(map(re.escape, FILLER)), "essay": LINE.pattern, "needle": NEEDLE.pattern}[hay]
    cut = re.search(rf"(?:^|(?<=[. ]))(?= (?:{full}|{NEEDLE.pattern}))", body).start()  # a sentence's cut tail first
    assert cut == 0 or body[:cut] == " " or (body[0] == " " and body[cut - 1] == "." and "." not in body[:cut - 1])
    body = body[cut:]
    sentences = re.findall(r" ([^.]+\.)", body)
    assert "".join(" " + s for s in sentences) == body
    return keys, sentences, values


@pytest.mark.parametrize("task", list(RULER))
def test_generator_follows_the_definition(essay, task):
    hay, key, value, n_keys, n_values, n_queries = RULER[task]
    assert gen.TASKS[task] == RULER[task]
    need = gen.niah_min_length(BYTE, task)
    for length in (need, 512, 2000, 6000):
        for depth in (0.0, 0.3, 0.5, 1.0):
            rng = random.Random(f"{task}{length}{depth}")
            prompt, answer, info = gen.niah_prompt(BYTE, task, length, depth, rng)
            assert len(prompt) + len(answer) == length  # within 1%: exactly
            keys, sentences, values = parse(task, BYTE.decode(prompt), BYTE.decode(answer))
            needles = [(i, NEEDLE.fullmatch(s)) for i, s in enumerate(sentences) if NEEDLE.fullmatch(s)]
            mine = [(i, n) for i, n in needles if hay != "needle" or n.group(2) in keys]  # the task's needles
            units = [s for i, s in enumerate(sentences) if i not in dict(mine)]  # the haystack's sentences
            assert len(mine) == n_keys * n_values and {n.group(1) for _, n in mine} == {value + "s"}
            assert len({n.group(2) for _, n in mine}) == n_keys and len({n.group(3) for _, n in mine}) == len(mine)
            # every asked key has its n_values needles, each once; the answer names them (prompt order), asked order
            assert values == [n.group(3) for k in keys for _, n in mine if n.group(2) == k]
            assert all(sum(n.group(0) == s for s in sentences) == 1 for _, n in mine)
            # the asked needle sits after int(depth * n + 0.5) of the n haystack sentences
            at = next(i for i, n in mine if n.group(0) == info["needle"])
            assert info["slot"] == sum(1 for i in range(at) if i not in dict(mine)) == int(depth * len(units) + 0.5)
            if hay == "noise" and units:  # RULER's noise sentences (passkey's filler), in their cycle
                assert all(s == FILLER[(FILLER.index(units[0]) + j) % len(FILLER)] for j, s in enumerate(units))
            elif hay == "essay":  # consecutive lines of the essay
                lines = [int(LINE.fullmatch(s).group(1)) for s in units]
                assert all((b - a) % 500 == 1 for a, b in zip(lines, lines[1:]))
            else:  # distractor needles: other keys, other values
                assert all(NEEDLE.fullmatch(s) for s in units)
                assert not {NEEDLE.fullmatch(s).group(2) for s in units} & set(keys)
                assert not {NEEDLE.fullmatch(s).group(3) for s in units} & {n.group(3) for _, n in mine}
            if task == "multikey_1":  # three distractor keys with needles of their own, not asked
                assert len({n.group(2) for _, n in mine} - set(keys)) == 3
    again = gen.niah_prompt(BYTE, task, 2000, 0.3, random.Random(7))
    assert again == gen.niah_prompt(BYTE, task, 2000, 0.3, random.Random(7))  # deterministic by seed
    assert again[:2] != gen.niah_prompt(BYTE, task, 2000, 0.3, random.Random(8))[:2]


def test_real_essay_is_consecutive_shakespeare(shakespeare_path, monkeypatch):
    monkeypatch.setattr(gen, "ESSAY_PATHS", [str(shakespeare_path)])
    monkeypatch.setattr(gen, "_ESSAY", [])
    text = re.sub(r"\s+", " ", open(shakespeare_path).read())
    for task in ("single_2", "multivalue"):
        prompt, answer, info = gen.niah_prompt(BYTE, task, 3000, 0.5, random.Random(1))
        assert len(prompt) + len(answer) == 3000
        body = re.split(r"Memorize (?:it|them)\.", BYTE.decode(prompt), 1)[1].rsplit(" What ", 1)[0]  # the haystack
        for n in info["needles"]:
            body = body.replace(" " + n, "")
        assert len(body) > 2000 and body[1:] in text  # the essay's own text (the cut tail's first byte a space)


def test_essay_missing_offline_is_one_line(tmp_path, monkeypatch):
    import data.shakespeare
    monkeypatch.setattr(gen, "ESSAY_PATHS", [str(tmp_path / "a.txt"), str(tmp_path / "b" / "input.txt")])
    monkeypatch.setattr(gen, "_ESSAY", [])
    monkeypatch.setattr(data.shakespeare, "URL", "http://127.0.0.1:9/input.txt")  # nothing listens there
    with pytest.raises(FileNotFoundError, match="needs tiny Shakespeare.*copy it to"):
        gen.niah_prompt(BYTE, "single_2", 600, 0.5, random.Random(0))


def test_recall_is_rulers_string_match_all():
    assert niah.recall(["1234567"], " 1234567") == 1.0
    assert niah.recall(["1234567", "7654321"], " 7654321 and 1234567") == 1.0  # any order, any text around
    assert niah.recall(["1234567", "7654321"], " 1234567, 7654320") == 0.5
    assert niah.recall(["AbC-1"], "the abc-1.") == 1.0 and niah.recall(["1"], None) == 0.0
    answer = BYTE.encode(" 1234567, 7654321")
    right = list(answer)
    assert niah.teacher_forced_recall(BYTE, answer, right, ["1234567", "7654321"]) == 1.0
    comma = right[:8] + [ord(";")] + right[9:]  # the separator is no value's
    assert niah.teacher_forced_recall(BYTE, answer, comma, ["1234567", "7654321"]) == 1.0
    digit = right[:-1] + [ord("0")]
    assert niah.teacher_forced_recall(BYTE, answer, digit, ["1234567", "7654321"]) == 0.5


def test_teacher_forced_recall_with_bpe(gpt2_tokenizer):
    answer = gpt2_tokenizer.encode(" 1234567, 7654321")
    pred = list(answer)
    pred[-1] = (pred[-1] + 1) % 50000
    assert niah.teacher_forced_recall(gpt2_tokenizer, answer, list(answer), ["1234567", "7654321"]) == 1.0
    assert niah.teacher_forced_recall(gpt2_tokenizer, answer, pred, ["1234567", "7654321"]) == 0.5


class Reader(CopyStub):
    """A perfect reader: finds the keys the answer prefix names and their values in the needles (prompt order) and
    answers " v1, v2, ..." byte by byte. wrong_from=i: the values from the i-th on have every digit shifted."""

    def __init__(self, wrong_from=None):
        super().__init__()
        self.wrong_from = wrong_from

    def predict(self, hist, p):
        text = BYTE.decode(hist[:p + 1])
        at = text.rfind(" The special magic ")
        m = re.fullmatch(r" The special magic \w+ for (.+?) (?:is|are)( .*)?", text[at:], re.S) if at > 0 else None
        if not m:
            return 0
        values = [v for k in re.split(r", and |, ", m.group(1)) for v in re.findall(rf"for {k} is: ([\w-]+)\.", text)]
        shift = str.maketrans("0123456789abcdef", "123456789abcdef0")
        if self.wrong_from is not None:
            values = values[:self.wrong_from] + [v.translate(shift) for v in values[self.wrong_from:]]
        answer, done = " " + ", ".join(values), m.group(2) or ""
        return ord(answer[len(done)]) if len(done) < len(answer) else 0


@pytest.mark.parametrize("mode", ["generate", "teacher_forced"])
def test_perfect_reader_scores_one_and_a_partial_one_its_fraction(essay, mode):
    kw = dict(tasks=list(RULER), lengths=[464, 1500], depths=2, samples=1, mode=mode, chunk=64, progress=False)
    for wrong_from, want in ((None, {1: 1.0, 4: 1.0}), (1, {1: 1.0, 4: 0.25}), (0, {1: 0.0, 4: 0.0})):
        res = niah.run_niah(Reader(wrong_from), BYTE, **kw)
        assert len(res) == 8 * 2 * 2
        assert all(r["correct"] == want[len(r["expected"].split())] for r in res), wrong_from
    assert all(r["predicted"] == r["answer"] for r in niah.run_niah(Reader(), BYTE, **kw))


def test_cli_end_to_end_and_resume(tmp_path, capsys):
    save_ckpt(make_tiny_gpt(block_size=256), tmp_path / "ckpt.pt")
    argv = ["--out_dir", str(tmp_path), "--tasks", "single_1,multikey_2", "--lengths", "1x,300", "--depths", "2",
            "--samples", "2", "--chunk", "128", "--device", "cpu"]
    niah.main(argv)
    first = capsys.readouterr().out
    assert "single_1" in first and "multikey_2" in first and "average" in first
    saved = json.load(open(tmp_path / "niah.json"))
    results = saved["results"]
    assert saved["meta"]["finished"] and saved["meta"]["settings"]["tasks"] == ["single_1", "multikey_2"]
    assert [(r["task"], r["length"]) for r in results[::4]] == [("single_1", 256), ("single_1", 300),
                                                                ("multikey_2", 256), ("multikey_2", 300)]
    assert all(0 <= r["correct"] <= 1 and isinstance(r["predicted"], str) for r in results)
    assert (tmp_path / "niah.png").stat().st_size > 0
    assert open(tmp_path / "niah.csv").readline().strip() == \
        "task,length,n_tokens,depth,sample,query,expected,answer,predicted,correct"
    saved["meta"]["finished"], saved["results"] = False, results[:5]  # a run cut short after 5 prompts
    json.dump(saved, open(tmp_path / "niah.json", "w"))
    niah.main(argv)
    second = capsys.readouterr().out
    assert "going on after the 5 prompts" in second
    assert json.load(open(tmp_path / "niah.json"))["results"] == results
    table = lambda out: out.split("samples per cell")[1].split("\n", 1)[1]  # the tables, the files written
    assert table(second) == table(first)


def test_bad_input_is_one_line(tmp_path, capsys):
    for argv, msg in ((["--tasks", "single_9"], "unknown task 'single_9'"),
                      (["--lengths", "2y"], "bad length '2y'"), (["--lengths", "100"], "minimum 204")):
        if "--lengths" in argv:
            save_ckpt(make_tiny_gpt(block_size=256), tmp_path / "ckpt.pt")
        with pytest.raises(SystemExit):
            niah.main(["--out_dir", str(tmp_path), "--tasks", "single_1", "--device", "cpu"] + argv)
        assert msg in capsys.readouterr().err
    with pytest.raises(InputError, match="unknown NIAH task 'x'"):
        niah.run_niah(Reader(), BYTE, ["x"], [600], progress=False)
    with pytest.raises(InputError, match="depth must be in"):
        gen.niah_prompt(BYTE, "single_1", 600, 1.5, random.Random(0))
    r = subprocess.run([sys.executable, "niah.py", f"--out_dir={tmp_path / 'none'}"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "ckpt.pt" in r.stderr


def test_dataset_examples(essay, tmp_path):
    """Examples of exactly length + 1 tokens, the tasks in turn, each ending in its answer; padding out of the loss."""
    meta = gen.build_dataset("byte", 512, 16, 8, 0, str(tmp_path / "a"))
    rows = np.fromfile(tmp_path / "a" / "train.bin", dtype=np.uint16).reshape(16, 513)
    assert meta["example_len"] == 513 and (rows[:, 512] == BYTE.eot).all() and (rows[:, :512] < 256).all()
    for i, row in enumerate(rows):
        prompt, answer = re.fullmatch(r"(.* (?:is|are))( .*)", BYTE.decode(row[:512].tolist()), re.S).groups()
        parse(list(RULER)[i % 8], prompt, answer)  # the frame of task i % 8, the answer at the very end
    meta = gen.build_dataset("byte", 512, 32, 8, 0, str(tmp_path / "b"), min_length=470)
    rows = np.fromfile(tmp_path / "b" / "train.bin", dtype=np.uint16).reshape(32, 513)
    n = (rows != BYTE.eot).sum(1)
    assert (470 <= n).all() and (n <= 512).all() and all((r[k:] == BYTE.eot).all() for r, k in zip(rows, n))
    x, y = get_batch(str(tmp_path / "b"), "train", 32, 512, meta, "cpu")
    for xr, yr in zip(x, y):  # the targets past the answer's last token are padding: -1, out of the loss
        k = int((yr == -1).sum())
        assert k >= 1 and (yr[-k:] == -1).all() and xr[-k] != BYTE.eot and (xr[len(xr) - k + 1:] == BYTE.eot).all()
    with pytest.raises(InputError, match="at least 464"):
        gen.build_dataset("byte", 320, 4, 4, 0, str(tmp_path / "c"))


def test_prepare_data_makes_the_set_on_the_fly(essay, tmp_path):
    folder = tmp_path / "niah_byte_480"
    folder.mkdir()
    data_dir, meta = prepare_data(str(folder))
    assert meta["dataset"] == "niah" and meta["example_len"] == 481 and len(meta["tasks"]) == 8
    assert (folder / "train.bin").stat().st_size == 20000 * 481 * 2


def test_preset_trains_on_passkey_prompts_then_on_niah_prompts(essay, tmp_path):
    """config/niah_demo.py in one run: 320-byte passkey windows first (where the copy forms), then, from
    phase_from, 512-byte NIAH windows of block_size (niah.py's 1x); here with a tiny model and phase_from=2."""
    import train
    from data.passkey import build_dataset
    passkey_dir, niah_dir = tmp_path / "passkey_byte_320", tmp_path / "niah_byte_512"
    build_dataset("byte", 320, n_train=16, n_val=4, seed=0, out_dir=str(passkey_dir))
    gen.build_dataset("byte", 512, 16, 8, 0, str(niah_dir))
    cfg = train.get_config([str(ROOT / "config" / "niah_demo.py"), "--n_layer=1", "--n_embd=32", "--eval_iters=1",
                            "--device=cpu", "--max_iters=3", "--phase_from=2", "--eval_interval=1",
                            f"--dataset={passkey_dir}", f"--phase_dataset={niah_dir}",
                            f"--out_dir={tmp_path / 'out'}"], train.default_config())
    assert (cfg["train_block_size"], cfg["block_size"], cfg["phase_train_block_size"]) == (320, 512, 512)
    train.train(cfg)
    log = (tmp_path / "out" / "log.txt").read_text()
    assert "2,560 tokens per iteration" in log and f"phase from iteration 2 (phase_from=2): {niah_dir}" in log
    assert "8 windows of 512 tokens (4,096 tokens per iteration)" in log
