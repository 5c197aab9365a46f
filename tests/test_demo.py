"""The CPU demo's promise: the checkpoint of `python train.py` with no arguments retrieves the
passkey at its training length in at least 95% of 100 prompts, and far past it: at 8x in at least
90% and at 32x in at least FAR_32X of 20 prompts (SPEC §5 prompts, teacher-forced, depths evenly
spaced; README's table). Its wall time is printed, not asserted (README states the measured figure).

This is the one slow test (the whole demo and its evaluation, about 12 minutes on 2 cores): CI runs it (CI=true);
a plain `python -m pytest` skips it unless asked: NANOPE_DEMO_TEST=1 python -m pytest tests/test_demo.py
"""
import os
import subprocess
import sys
import time

import pytest

from checkpoint import load_checkpoint
from passkey import run_passkey

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAR_32X = 0.8  # the target; measured 100% with the current recipe (seeds 1337, 1, 2; 1 thread): README
RUN_DEMO = os.environ.get("NANOPE_DEMO_TEST") == "1" or os.environ.get("CI") == "true"


@pytest.mark.skipif(not RUN_DEMO, reason="trains the full CPU demo (~12 min); CI runs it, "
                                         "or set NANOPE_DEMO_TEST=1")
def test_demo_retrieves_passkey_at_training_length(tmp_path):
    t0 = time.time()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's default threads, as a newcomer's
    subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), f"--out_dir={tmp_path}"], cwd=ROOT, env=env,
                   check=True)
    minutes = (time.time() - t0) / 60
    model, ckpt = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    results = run_passkey(model, "byte", [ckpt["config"]["block_size"]], depths=5, samples=20, seed=123,
                          progress=False)
    accuracy = sum(r["correct"] for r in results) / len(results)
    print(f"demo: {minutes:.1f} min of training, passkey accuracy at 1x {accuracy:.0%} ({len(results)} prompts)")
    assert accuracy >= 0.95
    # far past the training length: the README's protocol (5 depths from 0 to 1, 4 keys each)
    block_size = ckpt["config"]["block_size"]
    for multiple, floor in ((8, 0.9), (32, FAR_32X)):
        results = run_passkey(model, "byte", [multiple * block_size], depths=5, samples=4, seed=0, progress=False)
        far = sum(r["correct"] for r in results) / len(results)
        print(f"demo: passkey accuracy at {multiple}x {far:.0%} ({len(results)} prompts)")
        assert far >= floor
