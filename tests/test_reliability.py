"""Nothing lost, nothing silent (issue 17): a diverged run stops and keeps its good checkpoint; a failed command
leaves out_dir as it was; resume keeps the schedule, falls back to ckpt.pt.prev and trims log.txt; a full disk
is one line and leaves no .tmp; the evaluation scripts check their output first; every user mistake is one line."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import numpy as np
import pytest
import torch

import passkey
import train
from checks import NonFiniteError
from configurator import InputError, run_script
from conftest import make_tiny_gpt
from data.tokenizer import write_meta, write_split
from checkpoint import load_checkpoint
from model import GPT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = train.demo_config()  # the CPU demo's settings: what `python train.py` runs
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--device=cpu", "--warmup_iters=2", "--learning_rate=3e-3", "--bam_shape_init=[1, 'linear']"]  # the demo's is 4 heads


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A byte-level dataset of random tokens (train 6,000, val 1,000)."""
    out = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    write_split(str(out), "train", rng.integers(0, 256, 6000))
    write_split(str(out), "val", rng.integers(0, 256, 1000))
    write_meta(str(out), "byte", prepare="python data/shakespeare.py --tokenizer byte")
    return out


def config(out_dir, data_dir, *args):
    return train.get_config(TINY + [f"--out_dir={out_dir}", f"--dataset={data_dir}"] + list(args), DEFAULTS)


def run(out_dir, data_dir, *args):
    return train.train(config(out_dir, data_dir, *args))


def main(monkeypatch, *argv):
    """train.py's main() with this command line (the path of `python train.py ...`, without a subprocess)."""
    monkeypatch.setattr(sys, "argv", ["train.py"] + [str(a) for a in argv])
    train.main()


def snapshot(folder):
    """{relative path: bytes} of every file under folder."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


def weights(path):
    return torch.load(path, weights_only=True)["model"]


# ---------------------------------------------------------------- 1. non-finite loss

def test_diverged_resume_stops_and_keeps_the_good_checkpoint(tmp_path, data_dir):
    """The issue's command: a good run resumed with learning_rate=1e3 goes NaN. It exits with status 1 and one line
    naming the iteration, the cause and the last good checkpoint, which is left byte for byte as it was."""
    out = tmp_path / "run"
    run(out, data_dir, "--max_iters=4", "--eval_interval=2")
    good = (out / "ckpt.pt").read_bytes()
    r = subprocess.run([sys.executable, "train.py", f"--out_dir={out}", "--init_from=resume", "--max_iters=20",
                        "--learning_rate=1e3", "--warmup_iters=0", "--log_interval=1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last.startswith("train.py: non-finite") and "at iteration" in last and "learning_rate=1000" in last
    assert f"{out / 'ckpt.pt'} (iteration 4)" in last
    assert (out / "ckpt.pt").read_bytes() == good
    assert all(torch.isfinite(w).all() for w in weights(out / "ckpt.pt").values())


def test_diverged_scratch_run_saves_nothing_nonfinite(tmp_path, data_dir):
    with pytest.raises(NonFiniteError, match="this run saved no checkpoint"):
        run(tmp_path, data_dir, "--max_iters=20", "--eval_interval=10", "--learning_rate=1e3", "--warmup_iters=0")
    for path in tmp_path.glob("ckpt.pt*"):  # whatever was saved before the divergence is finite
        assert all(torch.isfinite(w).all() for w in weights(path).values())


GPT_FORWARD = GPT.forward


def nan_loss_at(monkeypatch, bad_steps):
    """Make the training loss NaN at these training forwards (1-based); evaluations are untouched."""
    forward, calls = GPT_FORWARD, []

    def nan_forward(self, idx, targets=None, **kwargs):
        logits, loss = forward(self, idx, targets, **kwargs)
        if self.training and targets is not None:
            calls.append(1)
            if len(calls) in bad_steps:
                loss = loss * float("nan")
        return logits, loss
    monkeypatch.setattr(GPT, "forward", nan_forward)


def test_max_bad_steps_skips_a_few_then_stops(tmp_path, data_dir, monkeypatch):
    """Off by default: one NaN step stops the run at the next log step. With max_bad_steps=2 two NaN steps are
    skipped (no update: the weights stay finite) and the run finishes; a third stops it."""
    nan_loss_at(monkeypatch, {3, 5})
    with pytest.raises(NonFiniteError, match="non-finite training loss .* at iteration 4"):
        run(tmp_path / "a", data_dir, "--max_iters=6", "--eval_interval=6", "--log_interval=2")
    nan_loss_at(monkeypatch, {3, 5})
    run(tmp_path / "b", data_dir, "--max_iters=6", "--eval_interval=6", "--log_interval=2", "--max_bad_steps=2")
    assert (tmp_path / "b" / "log.txt").read_text().count("step skipped") == 2
    assert all(torch.isfinite(w).all() for w in weights(tmp_path / "b" / "ckpt.pt").values())
    nan_loss_at(monkeypatch, {2, 3, 5})
    with pytest.raises(NonFiniteError, match="more than max_bad_steps=2"):
        run(tmp_path / "c", data_dir, "--max_iters=6", "--eval_interval=6", "--max_bad_steps=2")


def test_evaluation_scripts_refuse_nonfinite_weights(tmp_path):
    model = make_tiny_gpt()
    state = model.state_dict()
    state["lm_head.weight"][0, 0] = float("nan")
    torch.save({"model": state, "model_args": asdict(model.config), "tokenizer": "byte"}, tmp_path / "ckpt.pt")
    with pytest.raises(InputError, match="NaN or infinite weights"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))


# ---------------------------------------------------------------- 2. checkpoints survive failed commands

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, data_dir):
    """An out_dir holding a run at iteration 4 (ckpt.pt) and an earlier one at iteration 2 (ckpt.pt.prev), the
    two with the same settings (so the earlier one resumed to 4 equals the later one)."""
    out = tmp_path_factory.mktemp("two_runs")
    run(out, data_dir, "--max_iters=2", "--eval_interval=2")
    run(out, data_dir, "--max_iters=4", "--eval_interval=2")
    return out


@pytest.mark.parametrize("args, error, message", [
    (["--pos=foo"], InputError, "unknown pos 'foo'"),
    (["--learning_rate=-1"], InputError, "learning_rate > 0"),
    (["--dropout=1.5"], InputError, "dropout < 1"),
    (["--device=foo"], InputError, "not a torch device"),
    (["--block_size=9000"], InputError, "fewer than block_size"),
    ([], InputError, "holds a run .ckpt.pt. and an earlier one"),  # a new run would have to replace ckpt.pt.prev
])
def test_a_failed_scratch_command_leaves_out_dir_as_it_was(tmp_path, data_dir, two_runs, args, error, message):
    out = tmp_path / "out"
    shutil.copytree(two_runs, out)
    before = snapshot(out)
    with pytest.raises(error, match=message):
        run(out, data_dir, "--max_iters=4", *args)
    assert snapshot(out) == before


@pytest.mark.parametrize("arg, message", [("--pos=foo", "unknown pos 'foo'"), ("--batch_size=0", "batch_size must be"),
                                          ("--n_head=3", "divisible by n_head=3")])
def test_train_py_names_a_bad_setting_before_printing_the_settings(tmp_path, monkeypatch, capsys, arg, message):
    """python train.py with a bad setting: the one-line error comes first, not after the whole config's JSON."""
    with pytest.raises(InputError, match=message):
        main(monkeypatch, f"--out_dir={tmp_path}", arg)
    assert capsys.readouterr().out == "" and os.listdir(tmp_path) == []


def test_a_new_run_moves_the_earlier_checkpoint_only_when_it_saves(tmp_path, data_dir):
    """ckpt.pt of the earlier run stays in place until the new run writes its first checkpoint (an evaluation-only
    run never does); then it is ckpt.pt.prev."""
    run(tmp_path, data_dir, "--max_iters=2", "--eval_interval=2")
    first = (tmp_path / "ckpt.pt").read_bytes()
    run(tmp_path, data_dir, "--max_iters=2", "--eval_only=True")
    assert (tmp_path / "ckpt.pt").read_bytes() == first and not (tmp_path / "ckpt.pt.prev").exists()
    run(tmp_path, data_dir, "--max_iters=2", "--eval_interval=2", "--seed=2")
    assert (tmp_path / "ckpt.pt.prev").read_bytes() == first


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "not a checkpoint"])
def test_resume_falls_back_to_prev(tmp_path, data_dir, two_runs, monkeypatch, capsys, damage):
    """ckpt.pt missing or unreadable: resume says so and goes on from ckpt.pt.prev (the run at iteration 2); resumed
    to 4 it equals the run that ckpt.pt held (same settings)."""
    out = tmp_path / "out"
    shutil.copytree(two_runs, out)
    later = weights(out / "ckpt.pt")
    data = (out / "ckpt.pt").read_bytes()
    {"missing": lambda p: p.unlink(), "empty": lambda p: p.write_bytes(b""),
     "truncated": lambda p: p.write_bytes(data[:len(data) // 2]),
     "not a checkpoint": lambda p: p.write_text("hello")}[damage](out / "ckpt.pt")
    main(monkeypatch, f"--out_dir={out}", "--init_from=resume", "--max_iters=4")
    assert f"going on from {out / 'ckpt.pt.prev'}" in capsys.readouterr().out
    resumed = weights(out / "ckpt.pt")
    assert all(torch.equal(resumed[k], later[k]) for k in later)


def test_resume_with_neither_checkpoint_readable_names_both(tmp_path, data_dir, two_runs):
    out = tmp_path / "out"
    shutil.copytree(two_runs, out)
    (out / "ckpt.pt").write_bytes(b"")
    (out / "ckpt.pt.prev").write_text("hello")
    with pytest.raises(InputError, match=r"neither checkpoint can be read: .*ckpt.pt is empty.*ckpt.pt.prev"):
        run(out, data_dir, "--max_iters=4", "--init_from=resume")


# ---------------------------------------------------------------- 3. resume keeps the schedule

def test_resume_20_plus_20_equals_40_straight(tmp_path, data_dir, monkeypatch):
    """With the default schedule and a short warmup, a run of 20 iterations resumed with --max_iters=40 ends with
    the weights and evaluations of a run of 40: the schedule does not depend on max_iters."""
    common = TINY + [f"--dataset={data_dir}", "--warmup_iters=5", "--eval_interval=10"]
    main(monkeypatch, *common, f"--out_dir={tmp_path / 'a'}", "--max_iters=40")
    main(monkeypatch, *common, f"--out_dir={tmp_path / 'b'}", "--max_iters=20")
    main(monkeypatch, f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=40")
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in "ab")
    assert b["iter_num"] == 40 and a["history"] == b["history"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# ---------------------------------------------------------------- 4. disk full

@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")])
def test_disk_full_is_one_line_and_leaves_no_tmp(tmp_path, data_dir, monkeypatch, error):
    """The second checkpoint write fails half-way (torch reports a full disk as OSError or as its zip writer's
    RuntimeError): one line naming the path and the space, the partial .tmp removed, the first checkpoint intact."""
    save, calls = torch.save, []

    def save_then_fail(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 1:
            return save(obj, f, *args, **kwargs)
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise error
    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(SystemExit) as e:
        run_script(lambda: run(tmp_path, data_dir, "--max_iters=4", "--eval_interval=2"))
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1 and f"could not write {tmp_path / 'ckpt.pt'}" in msg and "free" in msg
    assert not list(tmp_path.glob("*.tmp"))
    monkeypatch.setattr(torch, "save", save)
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter_num"] == 2


# ---------------------------------------------------------------- 5. evaluation outputs

def test_passkey_keeps_an_earlier_result(tmp_path):
    model = make_tiny_gpt(block_size=256)
    torch.save({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "tokenizer": "byte"},
               tmp_path / "ckpt.pt")
    args = ["--out_dir", str(tmp_path), "--lengths", "300", "--depths", "1", "--samples", "1", "--device", "cpu"]
    passkey.main(args)
    first = (tmp_path / "passkey.json").read_bytes()
    passkey.main(args + ["--seed", "1"])
    assert (tmp_path / "passkey.json").read_bytes() == first
    assert json.load(open(tmp_path / "passkey-2.json"))["meta"]["seed"] == 1
    passkey.main(args + ["--seed", "2", "--overwrite"])
    assert json.load(open(tmp_path / "passkey.json"))["meta"]["seed"] == 2


# ---------------------------------------------------------------- 6 (and 5). one line, no traceback

@pytest.fixture(scope="module")
def cli_results(tmp_path_factory, data_dir):
    """Each mistake of the issue as a command, all run (in parallel) once: {name: (script, CompletedProcess)}."""
    t = tmp_path_factory.mktemp("cli")
    bad = {}
    for name, change in [("empty_train", lambda d: (d / "train.bin").write_bytes(b"")),
                         ("empty_val", lambda d: (d / "val.bin").write_bytes(b"")),
                         ("bad_meta", lambda d: (d / "meta.json").write_text('{"tokenizer": "byte",'))]:
        bad[name] = t / name
        shutil.copytree(data_dir, bad[name])
        change(bad[name])
    (t / "syntax.py").write_text("n_layer = 2\nn_embd = = 64\n")
    run(t / "good", data_dir, "--max_iters=2", "--eval_interval=2")
    good = t / "good" / "ckpt.pt"
    (t / "empty.pt").write_bytes(b"")
    (t / "text.pt").write_text("not a checkpoint")
    (t / "truncated.pt").write_bytes(good.read_bytes()[:2000])
    (t / "resume").mkdir()
    (t / "resume" / "ckpt.pt").write_bytes(good.read_bytes()[:2000])
    state = torch.load(good, weights_only=True)
    state["model"]["lm_head.weight"][0, 0] = float("nan")
    torch.save(state, t / "nan.pt")
    (t / "a_file").write_text("")
    (t / "docs.csv").write_text("text\nhello\n")
    (t / "docs.jsonl").write_text('{"text": "hello"}\n{"body": "no text field"}\n')
    tiny = TINY + [f"--dataset={data_dir}", f"--out_dir={t / 'out'}"]
    commands = {
        "empty train.bin": ("train.py", TINY + [f"--dataset={bad['empty_train']}", f"--out_dir={t / 'o1'}"],
                            "train.bin holds 0 tokens"),
        "empty val.bin": ("train.py", TINY + [f"--dataset={bad['empty_val']}", f"--out_dir={t / 'o2'}"],
                          "val.bin holds 0 tokens"),
        "config syntax error": ("train.py", [str(t / "syntax.py")] + tiny, f"config file {t / 'syntax.py'}, line 2"),
        "empty .pt": ("passkey.py", ["--ckpt", str(t / "empty.pt")], "is empty"),
        "not a checkpoint": ("sample.py", ["--ckpt", str(t / "text.pt")], "not a PyTorch checkpoint"),
        "truncated .pt": ("eval_ppl.py", ["--ckpt", str(t / "truncated.pt")], "truncated"),
        "truncated on resume": ("train.py", [f"--out_dir={t / 'resume'}", "--init_from=resume"],
                                "truncated, damaged or not a PyTorch checkpoint"),
        "malformed meta.json": ("train.py", TINY + [f"--dataset={bad['bad_meta']}", f"--out_dir={t / 'o3'}"],
                                "meta.json is not valid JSON"),
        "missing split": ("eval_ppl.py", ["--ckpt", str(good), "--split=test"], "no test split"),
        "device foo": ("train.py", tiny + ["--device=foo"], "device='foo' is not a torch device"),
        "out_dir is a file": ("train.py", TINY + [f"--dataset={data_dir}", f"--out_dir={t / 'a_file'}"], "is a file"),
        "negative learning rate": ("train.py", tiny + ["--learning_rate=-1"], "need learning_rate > 0"),
        "fineweb csv": ("data/fineweb.py", ["--data_files", str(t / "docs.csv"), "--out_dir", str(t / "fw1")],
                        "takes .parquet or .jsonl files"),
        "fineweb jsonl without text": ("data/fineweb.py", ["--data_files", str(t / "docs.jsonl"), "--out_dir",
                                                           str(t / "fw2"), "--num_proc=1", "--shard_size=4"],
                                       'line 2: no "text" field'),
        "nan weights in sample.py": ("sample.py", ["--ckpt", str(t / "nan.pt")], "NaN or infinite weights"),
        "passkey --out in a file": ("passkey.py", ["--ckpt", str(good), "--out", str(t / "a_file" / "p.json")],
                                    "is a file"),
        "eval_ppl --out in a file": ("eval_ppl.py", ["--ckpt", str(good), "--out", str(t / "a_file" / "p.json")],
                                     "is a file"),
    }

    def go(item):
        script, args, _ = item
        return subprocess.run([sys.executable, script] + args, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        done = dict(zip(commands, pool.map(go, commands.values())))
    return {name: (script, message, done[name]) for name, (script, _, message) in commands.items()}, t


CLI_CASES = ["empty train.bin", "empty val.bin", "config syntax error", "empty .pt", "not a checkpoint",
             "truncated .pt", "truncated on resume", "malformed meta.json", "missing split", "device foo", "out_dir is a file",
             "negative learning rate", "fineweb csv", "fineweb jsonl without text", "nan weights in sample.py",
             "passkey --out in a file", "eval_ppl --out in a file"]


@pytest.mark.parametrize("case", CLI_CASES)
def test_mistakes_are_one_line_without_traceback(cli_results, case):
    results, t = cli_results
    script, message, r = results[case]
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last.startswith(f"{os.path.basename(script)}: ") and message in last, r.stderr[-3000:]
    if case == "truncated on resume":  # the fallback is named
        assert "ckpt.pt.prev" in last
    for out in ("o1", "o2", "o3", "out", "fw1"):  # nothing was written for a refused command
        assert not (t / out).exists()


# ---------------------------------------------------------------- 7. log.txt after kill -9 + resume

class Killed(BaseException):
    """Stands for kill -9: nothing of train() runs after it."""


def test_log_is_trimmed_to_the_resumed_checkpoint(tmp_path, data_dir, monkeypatch):
    """A run killed while writing its checkpoint at 6 (its evaluation at 6 is already in log.txt), resumed from the
    checkpoint at 4: log.txt then holds the evaluations of an uninterrupted run, each once."""
    common = ["--eval_interval=2", "--max_iters=8"]
    run(tmp_path / "a", data_dir, *common)
    save, calls = torch.save, []

    def save_then_die(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the checkpoint at iteration 6
            raise Killed
        return save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save_then_die)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Killed):
        run(tmp_path / "b", data_dir, *common)
    signal.signal(signal.SIGINT, handler)  # a killed train() cannot put back its Ctrl-C handler
    monkeypatch.setattr(torch, "save", save)
    assert "step 6:" in (tmp_path / "b" / "log.txt").read_text()
    run(tmp_path / "b", data_dir, *common, "--init_from=resume")

    def evaluations(folder):
        return [line for line in (folder / "log.txt").read_text().splitlines() if line.startswith("step ")]
    assert evaluations(tmp_path / "b") == evaluations(tmp_path / "a")


# ---------------------------------------------------------------- runs that collide (issue 28)

def test_an_out_dir_in_use_refuses_a_second_run_and_a_killed_runs_lock_is_taken_over(tmp_path, data_dir):
    """Real processes: while one train.py runs in out_dir, a second one there (new or resumed) stops at once with
    one line naming the first; after kill -9 of the first, the next run takes out_dir over and says so."""
    out = tmp_path / "out"
    cmd = [sys.executable, "train.py"] + TINY + [f"--out_dir={out}", f"--dataset={data_dir}"]
    first = subprocess.Popen(cmd + ["--max_iters=1000000", "--eval_interval=5"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until the first run holds out_dir and has a checkpoint (at most 60 s)
            if (out / "running.json").exists() and (out / "ckpt.pt").exists():
                break
            assert first.poll() is None, "the first run ended early"
            time.sleep(0.1)
        assert json.loads((out / "running.json").read_text())["pid"] == first.pid
        log_before = (out / "log.txt").read_text()
        for extra in (["--max_iters=2"], ["--max_iters=2000000", "--init_from=resume"]):
            second = subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert second.returncode != 0
            err = second.stderr.strip().splitlines()
            assert len(err) == 1 and "in use by another run" in err[0] and f"pid {first.pid}" in err[0], err
        assert json.loads((out / "running.json").read_text())["pid"] == first.pid
        assert (out / "log.txt").read_text().startswith(log_before)  # not cut back by the resumed run
        assert "nanoPE:" not in (out / "log.txt").read_text()[len(log_before):]  # no other run's header
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (out / "running.json").exists()  # kill -9: nothing was cleaned up
    third = subprocess.run(cmd + ["--max_iters=2", "--eval_interval=2"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert "taking over" in third.stdout and f"pid {first.pid}" in third.stdout
    assert not (out / "running.json").exists() and (out / "ckpt.pt").is_file()  # released at the end


def torchrun_cmd(out, data_dir, *args, script="train.py"):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script] + TINY + \
        [f"--out_dir={out}", f"--dataset={data_dir}", "--gradient_accumulation_steps=2"] + list(args)


# a train.py whose rank 1 turns its loss to NaN from its 7th training forward on (rank 0's stays finite)
NAN_ON_RANK_1 = """import os, sys
sys.path.insert(0, {root!r})
import model, train
from configurator import run_script
if os.environ["RANK"] == "1":
    forward, calls = model.GPT.forward, []
    def nan_forward(self, idx, targets=None, **kwargs):
        logits, loss = forward(self, idx, targets, **kwargs)
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) > 6:
                loss = loss * float("nan")
        return logits, loss
    model.GPT.forward = nan_forward
run_script(train.main)
"""


def test_ddp_a_rank_with_nan_stops_every_rank_and_the_last_checkpoint_resumes(tmp_path, data_dir):
    """torchrun, 2 processes (gloo): NaN on rank 1 alone ends the job (no hang) with the one-line NaN message; the
    last checkpoint is finite and a resumed run goes on from it."""
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(NAN_ON_RANK_1.format(root=ROOT))
    out = tmp_path / "out"
    r = subprocess.run(torchrun_cmd(out, data_dir, "--max_iters=100", "--eval_interval=4", "--log_interval=1",
                                    script=str(script)), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith(f"{script.name}:")]
    assert lines and "non-finite" in lines[0], r.stderr[-3000:]
    assert "train.py\", line" not in r.stderr  # the ranks print one line (torchrun adds its own report)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert 0 < ckpt["iter_num"] < 8 and all(torch.isfinite(p).all() for p in ckpt["model"].values())
    r = subprocess.run(torchrun_cmd(out, data_dir, "--init_from=resume", f"--max_iters={ckpt['iter_num'] + 2}"),
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == ckpt["iter_num"] + 2


def test_ddp_a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes(tmp_path, data_dir):
    """torchrun, 2 processes (gloo): kill -9 of rank 1 ends the whole job within a minute; the checkpoint is intact
    and a resumed run (which takes over out_dir from the dead rank 0) goes on from it."""
    out = tmp_path / "out"
    job = subprocess.Popen(torchrun_cmd(out, data_dir, "--max_iters=1000000", "--eval_interval=5"), cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until a checkpoint is there (at most 120 s)
            if (out / "ckpt.pt").exists() and (out / "running.json").exists():
                break
            assert job.poll() is None, job.stderr.read()[-2000:]
            time.sleep(0.1)
        rank0 = json.loads((out / "running.json").read_text())["pid"]
        ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        rank1 = [int(p) for p in ranks if int(p) != rank0]
        assert len(rank1) == 1, ranks
        os.kill(rank1[0], signal.SIGKILL)
        job.wait(timeout=60)  # the job ends: no rank left waiting for the dead one
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    saved = torch.load(out / "ckpt.pt", weights_only=True)  # intact: written whole or not at all
    r = subprocess.run(torchrun_cmd(out, data_dir, "--init_from=resume", f"--max_iters={saved['iter_num'] + 2}"),
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == saved["iter_num"] + 2


def limit_file_size(n_bytes):
    """For a subprocess: files it writes may not grow past n_bytes (the OS refuses the write, as a full disk
    does: EFBIG instead of ENOSPC), and the refusal is an error, not a SIGXFSZ kill."""
    def apply():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, n_bytes))
    return apply


@pytest.mark.parametrize("script", ["passkey.py", "eval_ppl.py"])
def test_evaluation_output_refused_by_the_os_is_one_line_and_leaves_no_partial_file(tmp_path, data_dir, script):
    """A real process whose result files the OS refuses (a file-size limit, as a full disk): one line, exit 1,
    and no JSON, PNG or temporary file left that could pass for a result."""
    model = make_tiny_gpt(block_size=256)
    torch.save({"model": model.state_dict(), "model_args": asdict(model.config), "config": {"dataset": str(data_dir)},
                "tokenizer": "byte"}, tmp_path / "ckpt.pt")
    res = tmp_path / "res"
    res.mkdir()
    args = {"passkey.py": ["--lengths=300", "--depths=1", "--samples=1"], "eval_ppl.py": ["--lengths=1x",
                                                                                          "--max_windows=1"]}[script]
    r = subprocess.run([sys.executable, script, f"--ckpt={tmp_path / 'ckpt.pt'}", f"--out={res / 'r.json'}",
                        "--device=cpu"] + args, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       preexec_fn=limit_file_size(200))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: could not write") and "r.json" in last and "free some space" in last, last
    assert list(res.iterdir()) == []


def test_passkey_killed_then_the_same_command_goes_on_and_ends_as_an_uninterrupted_run(tmp_path):
    """Real processes: passkey.py killed (kill -9) after its first batches; the same command again scores only
    the prompts left and writes the results of an uninterrupted run."""
    model = make_tiny_gpt(block_size=256)
    torch.save({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "tokenizer": "byte"},
               tmp_path / "ckpt.pt")
    args = [sys.executable, "passkey.py", f"--ckpt={tmp_path / 'ckpt.pt'}", "--lengths=300,400,500", "--depths=5",
            "--samples=12", "--batch_size=1", "--device=cpu"]
    subprocess.run(args + [f"--out={tmp_path / 'whole.json'}"], cwd=ROOT, check=True, capture_output=True,
                   timeout=300)
    out = tmp_path / "cut.json"
    job = subprocess.Popen(args + [f"--out={out}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):  # until a few batches are written (at most 300 s)
            if out.exists() and len(json.loads(out.read_text())["results"]) >= 5:
                break
            assert job.poll() is None, "passkey.py ended before it could be killed"
            time.sleep(0.1)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    cut = json.loads(out.read_text())
    assert cut["meta"]["finished"] is False and 5 <= len(cut["results"]) < 180
    r = subprocess.run(args + [f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"after the {len(cut['results'])} prompts it scored" in r.stdout, r.stderr
    whole, again = json.loads((tmp_path / "whole.json").read_text()), json.loads(out.read_text())
    assert again["meta"]["finished"] is True and again["results"] == whole["results"]
