"""train.py: configurator, learning, exact resume, weights_only checkpoints, 2-process DDP."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import train
from data.shakespeare import prepare
from checkpoint import load_checkpoint
from model import POS_VARIANTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = train.demo_config()  # the CPU demo's settings: what `python train.py` runs
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--device=cpu", "--warmup_iters=2", "--learning_rate=3e-3", "--bam_shape_init=[1, 'linear']"]  # the demo's is 4 heads


# ---------------------------------------------------------------- configurator

def test_overrides_and_types():
    cfg = train.get_config(["--pos=alibi", "--ssmax=False", "--n_layer=3", "--learning_rate=1",
                            "--lr_decay_iters=500", "--bam_scale_init=0.05"], DEFAULTS)
    assert cfg["pos"] == "alibi" and cfg["ssmax"] is False and cfg["n_layer"] == 3
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["lr_decay_iters"] == 500  # a key whose default is None can be set
    assert train.get_config(["--min_lr=1", "--wandb_run_name=run 1", "--vocab_size=None"], DEFAULTS)["min_lr"] == 1.0
    assert cfg["bam_scale_init"] == 0.05  # a number, a word ("alibi") or a list: GPTConfig checks it
    assert cfg["max_iters"] == DEFAULTS["max_iters"]


@pytest.mark.parametrize("arg,message", [
    ("--n_layers=3", "unknown key 'n_layers'; valid keys: .*n_layer"),
    ("--n_layer=3.5", "n_layer expects int"),
    ("--ssmax=maybe", "ssmax expects True or False"),
    ("--learning_rate=fast", "learning_rate expects float"),
    ("--pos", "malformed argument"),
    ("--vocab_size=abc", "vocab_size expects int"),  # keys whose default is None are typed too
    ("--min_lr=low", "min_lr expects float"),
])
def test_bad_arguments_are_refused(arg, message):
    with pytest.raises(ValueError, match=message):
        train.get_config([arg], DEFAULTS)


def test_config_file_then_override(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("import math\nn_layer = 6\nlearning_rate = 1\npos = 'rope'\n")
    cfg = train.get_config([str(f), "--n_layer=2"], DEFAULTS)
    assert (cfg["n_layer"], cfg["learning_rate"], cfg["pos"]) == (2, 1.0, "rope")
    f.write_text("n_layerz = 6\n")
    with pytest.raises(ValueError, match="unknown key 'n_layerz' in"):
        train.get_config([str(f)], DEFAULTS)
    with pytest.raises(FileNotFoundError):
        train.get_config([str(tmp_path / "missing.py")], DEFAULTS)


def test_every_model_field_can_be_set_from_the_command_line():
    """model.GPTConfig is the one source of model keys: every field is a train.py key, and --field=value (a value
    other than its default) reaches the arguments the model is built with."""
    from dataclasses import fields
    from model import GPTConfig
    change = {bool: lambda d: not d, int: lambda d: d + 3, float: lambda d: d + 0.25, str: lambda d: d + "x"}
    unset = {"ssmax_layers": [1], "ssmax_max_n": [100, None]}  # a None default: a value of the key's own kind
    for f in fields(GPTConfig):
        assert f.name in train.CONFIG_KEYS
        value = unset[f.name] if f.default is None else change[type(f.default)](f.default)
        cfg = train.get_config([f"--{f.name}={value}"], DEFAULTS)
        args = train.model_args_of(cfg, {"vocab_size": 257})
        assert args[f.name] == value != f.default, f.name
    assert train.default_config()["pos"] == GPTConfig.pos  # the defaults are GPTConfig's, the demo's come on top
    assert DEFAULTS["pos"] == "bam" and DEFAULTS["bias"] is False


def test_presets_parse():
    for name in sorted(os.listdir(os.path.join(ROOT, "config"))):
        if name.endswith(".py"):
            train.get_config([os.path.join(ROOT, "config", name)], DEFAULTS)


@pytest.mark.parametrize("script,args,message", [
    ("train.py", ["--nlayer=2"], "unknown key 'nlayer'"),  # the configurator
    ("train.py", ["--init_from=resume", "--out_dir=no-such-dir"], "no checkpoint at"),  # train()
    ("train.py", ["--n_layer=0"], "n_layer"),  # GPTConfig in model.py
    ("train.py", ["--device=cpu", "--dtype=float16"], "needs a CUDA device"),
    ("train.py", ["--bam_scale_init=foo"], "bam_scale_init must be 'alibi' or a number > 0"),
    ("train.py", ["--max_iters=-1"], "max_iters >= 0"),
    ("passkey.py", ["--out_dir=no-such-dir"], "train one first"),  # checkpoint.load_checkpoint
    ("sample.py", ["--out_dir=no-such-dir"], "train one first"),
    ("passkey.py", ["--samples=0"], "expected an integer >= 1"),  # argparse (status 2)
    ("sample.py", ["--top_k=-1"], "--top_k >= 0"),
    ("data/shakespeare.py", ["--input=no-such-file.txt", "--out_dir=no-such-dir"], "--input no-such-file.txt not found"),
    ("data/passkey.py", ["--length=10", "--out_dir=no-such-dir"], "below the minimum passkey length"),
    ("data/passkey.py", ["--n_train=0"], "expected an integer >= 1"),
    ("data/fineweb.py", ["--data_files", "no-such-file.parquet", "--out_dir=no-such-dir"], "not found"),
])
def test_cli_reports_errors_cleanly(script, args, message):
    """nanoPE's own errors end the script with one line (configurator.run_script: status 1; argparse: 2), no traceback."""
    r = subprocess.run([sys.executable, script] + args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode in (1, 2) and f"{os.path.basename(script)}: " in r.stderr and message in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_run_script_keeps_library_tracebacks():
    """configurator.run_script decides by type: nanoPE's own errors (NanoPEError, InputError, MissingFileError) end
    the script with one line; any other exception, a plain ValueError included (a library's), keeps its traceback,
    wherever it was raised (also here, in the repository)."""
    from configurator import InputError, MissingFileError, NanoPEError, run_script

    def library():
        raise ValueError("raised in a library")
    with pytest.raises(ValueError, match="raised in a library"):
        run_script(library)

    for error in (InputError, MissingFileError, NanoPEError):
        def main():
            raise error("bad setting: use --x=1")
        with pytest.raises(SystemExit, match="bad setting: use --x=1"):
            run_script(main)
    assert issubclass(InputError, ValueError) and issubclass(MissingFileError, FileNotFoundError)

    def interrupted():
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as e:  # Ctrl-C: status 130, no traceback
        run_script(interrupted)
    assert e.value.code == 130


def test_lr_schedule_closed_form():
    cfg = dict(DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, decay_lr=True)
    assert train.get_lr(0, cfg) == pytest.approx(1 / 11)
    assert train.get_lr(10, cfg) == pytest.approx(1.0)
    assert train.get_lr(60, cfg) == pytest.approx(0.1 + 0.5 * 0.9)  # halfway through the cosine
    assert train.get_lr(500, cfg) == pytest.approx(0.1)


# ---------------------------------------------------------------- training

@pytest.fixture(scope="module")
def shakespeare_byte(tmp_path_factory, shakespeare_path):
    out = tmp_path_factory.mktemp("shakespeare_byte")
    prepare(shakespeare_path.read_text(encoding="utf-8"), "byte", str(out))
    return str(out)


def run(args, out_dir, data_dir):
    cfg = train.get_config(TINY + [f"--out_dir={out_dir}", f"--dataset={data_dir}"] + args, DEFAULTS)
    return train.train(cfg)


def test_few_steps_lower_the_loss(tmp_path, shakespeare_byte):
    losses = run(["--max_iters=60", "--eval_interval=60", "--pos=rope", "--ssmax=False"], tmp_path, shakespeare_byte)
    log = (tmp_path / "log.txt").read_text()
    first = float(log.split("step 0: train loss ")[1].split(",")[0])
    assert first > 5.0  # ln(257) = 5.55 at init
    assert losses["train"] < first - 1.5


def test_ctrl_c_checkpoints_and_resumes_exactly(tmp_path, shakespeare_byte, monkeypatch):
    """Ctrl-C between evaluations: the iteration finishes, a checkpoint is written there, and resuming from it
    ends where an uninterrupted run ends."""
    import signal
    handler_before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under nohup / a background job
    common = ["--eval_interval=4", "--lr_decay_iters=8", "--pos=bam", "--ssmax=True", "--dropout=0.1",
              "--max_iters=8"]
    full = run(common, tmp_path / "a", shakespeare_byte)
    get_lr = train.get_lr

    def get_lr_then_ctrl_c(it, cfg):  # Ctrl-C while iteration 5 runs
        if it == 5:
            signal.raise_signal(signal.SIGINT)
        return get_lr(it, cfg)
    monkeypatch.setattr(train, "get_lr", get_lr_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):  # after saving, train() stops its caller too
        run(common, tmp_path / "b", shakespeare_byte)
    monkeypatch.setattr(train, "get_lr", get_lr)
    assert signal.getsignal(signal.SIGINT) is handler_before  # train() put the handler back
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["iter_num"] == 6
    assert "interrupted: saved" in (tmp_path / "b" / "log.txt").read_text()
    resumed = run(common + ["--init_from=resume"], tmp_path / "b", shakespeare_byte)
    assert resumed["val"] == pytest.approx(full["val"], abs=1e-5)
    ma, _ = load_checkpoint(str(tmp_path / "a" / "ckpt.pt"))
    mb, _ = load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))
    for (name, pa), (_, pb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert torch.allclose(pa, pb, atol=1e-6), name


def test_ctrl_c_before_the_first_step_saves_nothing(tmp_path, shakespeare_byte, monkeypatch):
    """Ctrl-C during the evaluation at iteration 0: no step was taken, so no checkpoint (one at iteration 0 would
    evaluate again on resume, draw other batches and not resume exactly)."""
    import signal
    import data.batches
    get_batch, calls = data.batches.get_batch, []

    def get_batch_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the first batch of the first evaluation
            signal.raise_signal(signal.SIGINT)
        return get_batch(*args, **kwargs)
    monkeypatch.setattr(data.batches, "get_batch", get_batch_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run(["--max_iters=8", "--eval_interval=4"], tmp_path, shakespeare_byte)
    assert not (tmp_path / "ckpt.pt").exists()
    assert "before any step of this run: nothing to save" in (tmp_path / "log.txt").read_text()


def test_resume_equals_uninterrupted_run(tmp_path, shakespeare_byte):
    common = ["--eval_interval=4", "--lr_decay_iters=8", "--pos=bam", "--ssmax=True", "--dropout=0.1"]
    full = run(common + ["--max_iters=8"], tmp_path / "a", shakespeare_byte)
    run(common + ["--max_iters=4"], tmp_path / "b", shakespeare_byte)  # "killed" after its checkpoint at 4
    resumed = run(common + ["--max_iters=8", "--init_from=resume"], tmp_path / "b", shakespeare_byte)
    assert resumed["val"] == pytest.approx(full["val"], abs=1e-5)
    ma, _ = load_checkpoint(str(tmp_path / "a" / "ckpt.pt"))
    mb, _ = load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))
    for (name, pa), (_, pb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert torch.allclose(pa, pb, atol=1e-6), name


def test_cli_resume_keeps_the_runs_settings(tmp_path, shakespeare_byte, monkeypatch, capsys):
    """`python train.py --out_dir=D --init_from=resume` goes on with the settings of the run in D (its dataset,
    sizes, schedule), not the demo defaults; what the command line names (here max_iters) changes. The result
    equals an uninterrupted run. Resuming a finished run trains nothing and leaves its checkpoint as it was."""
    full = run(["--eval_interval=4", "--lr_decay_iters=8", "--max_iters=8"], tmp_path / "a", shakespeare_byte)
    run(["--eval_interval=4", "--lr_decay_iters=8", "--max_iters=4"], tmp_path / "b", shakespeare_byte)
    argv = [f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=8"]
    monkeypatch.setattr(sys, "argv", ["train.py"] + argv)
    train.main()
    ckpt = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 8 and ckpt["config"]["dataset"] == shakespeare_byte
    assert ckpt["config"]["learning_rate"] == 3e-3 and ckpt["config"]["max_iters"] == 8  # TINY's, and the new
    assert ckpt["history"][-1][2] == pytest.approx(full["val"], abs=1e-5)
    before = (tmp_path / "b" / "ckpt.pt").read_bytes()
    train.main()  # again: the run is finished
    assert "nothing to train" in capsys.readouterr().out
    assert (tmp_path / "b" / "ckpt.pt").read_bytes() == before


def test_eval_only_on_a_resumed_run_evaluates_and_saves_nothing(tmp_path, shakespeare_byte):
    run(["--max_iters=2", "--eval_interval=2"], tmp_path, shakespeare_byte)
    before = (tmp_path / "ckpt.pt").read_bytes()
    for max_iters in (2, 4):  # a finished run, and one that could go on: neither trains
        losses = run([f"--max_iters={max_iters}", "--init_from=resume", "--eval_only=True"], tmp_path, shakespeare_byte)
        assert losses["val"] > 0
    assert (tmp_path / "log.txt").read_text().count("step 2:") == 3  # the run's own evaluation, then two more
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_a_new_run_keeps_the_earlier_checkpoint(tmp_path, shakespeare_byte, capsys):
    """init_from=scratch into an out_dir that holds a run: that run's checkpoint is kept as ckpt.pt.prev."""
    run(["--max_iters=2", "--eval_interval=2"], tmp_path, shakespeare_byte)
    first = (tmp_path / "ckpt.pt").read_bytes()
    run(["--max_iters=2", "--eval_interval=2", "--seed=2"], tmp_path, shakespeare_byte)
    assert (tmp_path / "ckpt.pt.prev").read_bytes() == first and (tmp_path / "ckpt.pt").read_bytes() != first
    assert "ckpt.pt.prev" in capsys.readouterr().out


def test_help_lists_the_keys(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    train.main()
    out = capsys.readouterr().out
    assert "Train a nanoPE GPT" in out and all(f"--{k}=" in out for k in train.CONFIG_KEYS)


def test_checkpoint_loads_with_weights_only(tmp_path, shakespeare_byte):
    run(["--max_iters=2", "--eval_interval=2", "--pos=tapa"], tmp_path, shakespeare_byte)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 2 and ckpt["tokenizer"] == "byte" and ckpt["model_args"]["pos"] == "tapa"
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left no temporary file
    model, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert model.config.pos == "tapa"


def test_resume_refuses_a_dataset_in_another_tokenizer(tmp_path, shakespeare_byte, shakespeare_path, gpt2_tokenizer):
    run(["--max_iters=2", "--eval_interval=2"], tmp_path, shakespeare_byte)
    gpt2_dir = tmp_path / "gpt2data"
    prepare(shakespeare_path.read_text(encoding="utf-8")[:20000], "gpt2", str(gpt2_dir))
    with pytest.raises(ValueError, match="'byte' tokenizer"):
        run(["--max_iters=4", "--init_from=resume"], tmp_path, str(gpt2_dir))


def test_missing_data_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python data/shakespeare.py"):
        run(["--max_iters=1"], tmp_path, str(tmp_path / "nothing_here"))


@pytest.mark.parametrize("arg, message", [("--dtype=float64", "dtype must be auto, float32"),
                                          ("--batch_size=0", "batch_size must be >= 1"),
                                          ("--log_interval=0", "log_interval must be >= 1"),
                                          ("--n_layer=0", "n_layer must be a positive integer"),
                                          ("--vocab_size=0", "vocab_size=0 is smaller than the dataset")])
def test_bad_run_settings_are_refused(tmp_path, shakespeare_byte, arg, message):
    with pytest.raises(ValueError, match=message):
        run(["--max_iters=1", arg], tmp_path, shakespeare_byte)


def test_passkey_set_relative_path_and_block_size_check(tmp_path):
    from data.passkey import build_dataset
    data_dir = tmp_path / "passkey_byte_256"
    build_dataset("byte", 256, n_train=8, n_val=4, seed=0, out_dir=str(data_dir))
    rel = os.path.relpath(data_dir)  # a path relative to the working directory, not under data/
    run(["--max_iters=1", "--eval_interval=1", "--block_size=256"], tmp_path / "ok", rel)
    assert (tmp_path / "ok" / "ckpt.pt").is_file()
    with pytest.raises(ValueError, match="examples of 256 tokens.*passkey_byte_300"):
        run(["--max_iters=1", "--block_size=300"], tmp_path / "long", rel)
    with pytest.raises(ValueError, match="examples of 256 tokens.*--block_size=256"):  # would never see the key
        run(["--max_iters=1", "--block_size=64"], tmp_path / "short", rel)


def test_resume_keeps_the_checkpoint_model_and_says_so(tmp_path, shakespeare_byte, capsys):
    run(["--max_iters=2", "--eval_interval=2"], tmp_path, shakespeare_byte)
    run(["--max_iters=4", "--eval_interval=2", "--init_from=resume", "--n_layer=3"], tmp_path, shakespeare_byte)
    out = capsys.readouterr().out
    assert "ignoring n_layer=3 (checkpoint: 2)" in out and "resuming" in out and "at iteration 2 of 4" in out
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["n_layer"] == ckpt["model_args"]["n_layer"] == 2


def test_ddp_two_processes_gloo_resumes_exactly(tmp_path, shakespeare_byte):
    """torchrun with 2 processes (gloo): it trains, and a run resumed at iteration 2 equals the uninterrupted one,
    which needs each process to go on with its own random state (with rank 0's everywhere, both would draw the
    same batches)."""
    def torchrun(out_dir, *args):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"] + \
            TINY + [f"--out_dir={out_dir}", f"--dataset={shakespeare_byte}", "--eval_interval=2", "--lr_decay_iters=4",
                    "--gradient_accumulation_steps=2", "--dropout=0.1"] + list(args)
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return torch.load(out_dir / "ckpt.pt", weights_only=True)
    full = torchrun(tmp_path / "a", "--max_iters=4")
    log = (tmp_path / "a" / "log.txt").read_text()
    assert "2 process(es)" in log and "step 4:" in log and full["iter_num"] == 4 and len(full["rng_states"]) == 2
    torchrun(tmp_path / "b", "--max_iters=2")
    resumed = torchrun(tmp_path / "b", "--max_iters=4", "--init_from=resume")
    assert resumed["iter_num"] == 4
    for name, p in full["model"].items():
        assert torch.allclose(p, resumed["model"][name], atol=1e-6), name


def test_rng_states_of_another_world_size_seed_new_streams():
    """distributed.Process.set_rng_states: the states of as many processes as the run has are this rank's to go on
    with (the next draws equal those after the save); from another number of processes, new streams seeded
    seed + rank + world·iter_num (torch.manual_seed's draws), and it says so (False)."""
    import distributed
    proc = distributed.Process("cpu", "cpu", "float32", None, ddp=False, rank=0, world=1)
    torch.manual_seed(5)
    saved = proc.rng_states()
    after_save = torch.rand(3)
    torch.rand(7)  # the stream moves on
    assert proc.set_rng_states(saved, seed=1337, iter_num=40) is True and torch.equal(torch.rand(3), after_save)
    two = saved * 2  # written by 2 processes
    assert proc.set_rng_states(two, seed=1337, iter_num=40) is False
    fresh = torch.rand(3)
    torch.manual_seed(1337 + 0 + 1 * 40)
    assert torch.equal(fresh, torch.rand(3))


def test_readme_and_help_agree(capsys, monkeypatch):
    """Every --key that the README's train.py commands and variant table name is one `python train.py --help` lists,
    and the table's `--pos` rows are exactly the variants --help offers (model.POS_VARIANTS)."""
    readme = (pathlib.Path(train.__file__).parent / "README.md").read_text()
    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    train.main()
    out = capsys.readouterr().out
    listed = set(re.findall(r"^  --(\w+)=", out, flags=re.M))
    lines = [line for line in readme.splitlines() if "train.py" in line or line.startswith("| `")]
    named = {k for line in lines for k in re.findall(r"--(\w+)=", line)}
    named -= {"nproc_per_node", "key"}  # torchrun's own key; the --key=value placeholder
    assert named and named <= listed, f"the README names keys --help does not list: {sorted(named - listed)}"
    offered = re.search(r"^  --pos=\w+ +\(one of: ([\w, ]+)\)$", out, flags=re.M).group(1).split(", ")
    table = re.findall(r"^\| `(\w+)` \|", readme, flags=re.M)
    assert table == offered == list(POS_VARIANTS), f"README's variant table {table}, --help {offered}"


def test_readme_sections_it_quotes_exist():
    """The README stays one a newcomer finishes (at most 150 lines: the lab notes live in docs/). Every `[...](docs/F.md), "Section"` of the README names a heading of F (the heading begins with the quote), so a
    newcomer following a link finds the section; and every docs/ file the README links to exists."""
    root = pathlib.Path(train.__file__).parent
    readme = (root / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md past 150 lines: move the detail to docs/"
    for path in set(re.findall(r"\]\((docs/[^)#]+)\)", readme)):
        assert (root / path).is_file(), f"README links to {path}, which does not exist"
    quoted = re.findall(r"\]\((docs/[\w.-]+\.md)\), \"([^\"]+)\"", readme)
    assert quoted
    for path, section in quoted:
        headings = re.findall(r"^#+ (.+)$", (root / path).read_text(), flags=re.M)
        assert any(h.startswith(section) for h in headings), f"README quotes {path}, \"{section}\": no such heading"
