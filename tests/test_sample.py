"""sample.py from checkpoints of 3-step train.py runs: generation past block_size for a
variant that extrapolates, and the clear error for pos=learned."""
import subprocess
import sys
from pathlib import Path

import pytest

import sample
from data.shakespeare import prepare

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 32


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def checkpoints(shakespeare_path, tmp_path_factory):
    """{pos: out_dir} for 3-step training runs of tiny rope and learned models on byte-level Shakespeare."""
    tmp = tmp_path_factory.mktemp("sample")
    data = tmp / "shakespeare_byte"
    prepare(Path(shakespeare_path).read_text(encoding="utf-8"), "byte", str(data))
    outs = {pos: tmp / f"out-{pos}" for pos in ("rope", "learned")}
    procs = [subprocess.Popen(  # both runs at once
        [sys.executable, "train.py", f"--out_dir={out}", f"--dataset={data}", f"--pos={pos}", "--ssmax=False",
         "--max_iters=3", "--eval_interval=3", "--eval_iters=1", "--batch_size=2", f"--block_size={BLOCK}",
         "--n_layer=1", "--n_head=2", "--n_embd=16", "--warmup_iters=1", "--device=cpu", "--compile=False"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for pos, out in outs.items()]
    for p, out in zip(procs, outs.values()):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert (out / "ckpt.pt").is_file()
    return outs


def test_sample_past_block_size(checkpoints, tmp_path, capsys):
    r = run("sample.py", f"--out_dir={checkpoints['rope']}", "--start=ROMEO:", "--num_samples=2",
            f"--max_new_tokens={3 * BLOCK}", "--temperature=1.0", "--top_k=20", "--seed=1", "--device=cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    samples = r.stdout.split("---------------\n")
    assert len(samples) == 3 and all(s.startswith("ROMEO:") for s in samples[:2])
    assert all(len(s.encode()) >= 3 * BLOCK for s in samples[:2])  # byte tokens: past block_size
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("JULIET:\n")
    sample.main([f"--ckpt={checkpoints['rope'] / 'ckpt.pt'}", f"--start=FILE:{prompt}", "--num_samples=1",
                 "--max_new_tokens=40", "--top_k=0", "--device=cpu"])
    assert capsys.readouterr().out.startswith("JULIET:\n")


def test_learned_past_block_size_fails_clearly(checkpoints, capsys):
    args = [f"--out_dir={checkpoints['learned']}", "--start=ROMEO:", "--num_samples=1", "--device=cpu"]
    sample.main(args + [f"--max_new_tokens={BLOCK - 10}"])  # within block_size: fine
    assert capsys.readouterr().out.startswith("ROMEO:")
    with pytest.raises(SystemExit) as e:
        sample.main(args + [f"--max_new_tokens={BLOCK}"])
    assert "learned" in str(e.value) and f"block_size={BLOCK}" in str(e.value)
