"""Shared test set-up: offline tokenizer cache and the tiny Shakespeare text.

In this project's CI (CI=true) the files in ../shared must be there; on a user's
fresh machine the tests fetch what they need or skip with a reason.
"""
import os
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

# kernels.py runs on CPU tensors under the Triton interpreter; it must be set before triton is imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if (SHARED / "tiktoken_cache").is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken_cache"))


def skip_or_fail(reason):
    """Skip on a user's machine; under CI a missing resource is a failure, never a skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: ../shared must provide it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shakespeare_path(tmp_path_factory):
    """Path to tinyshakespeare.txt: ../shared/data, else downloaded, else skip."""
    local = SHARED / "data" / "tinyshakespeare.txt"
    if local.is_file():
        return local
    dest = tmp_path_factory.mktemp("shakespeare") / "input.txt"
    try:
        urllib.request.urlretrieve(SHAKESPEARE_URL, dest)
    except OSError as e:
        skip_or_fail(f"tiny Shakespeare not in ../shared and download failed: {e}")
    return dest


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    """The GPT-2 BPE tokenizer (tiktoken r50k_base), offline from ../shared when present."""
    from data.tokenizer import get_tokenizer
    try:
        return get_tokenizer("gpt2")
    except Exception as e:  # no cache and no network
        skip_or_fail(f"GPT-2 BPE (tiktoken r50k_base) could not be loaded: {e}")


# The test models are tiny: one thread is faster than two fighting over small tensors, here and in the scripts
# the tests run (train.py, passkey.py, torchrun ...: they inherit the environment), and robust to a busy CPU.
# The demo's test alone trains with torch's default, as `python train.py` does.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items):
    """The demo's test (10-12 minutes of training on torch's default threads) goes last: the other tests share both
    cores first (~4 min), then the demo trains alone, as a newcomer's would. The suite's total is about the same
    either way (1,014 s with the demo last, 1,048 s with it first, on machines at 116-168 GFLOP/s); what this buys
    is a demo time in the test's output that is a newcomer's, not one slowed by the other worker."""
    items.sort(key=lambda item: item.path.name == "test_demo.py")  # a stable sort: the others keep their order


def make_tiny_gpt(pos="bam", ssmax=True, block_size=32, vocab_size=257, n_head=4, **config):
    """A 2-layer GPT in eval mode (byte-level by default) whose positional parameters are moved off their init:
    SSMax s, the BAM shape β, FIRE's threshold L (3, so that its normaliser depends on the query position), so
    that a wrong n, distance or position shows in the logits. Shared by the eval and document tests."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=2, n_head=n_head, n_embd=32, pos=pos,
                      ssmax=ssmax, **config))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("pos_bias.shape"):
                p.uniform_(0.3, 1.5)
            if name.endswith("ssmax.scale"):
                p.uniform_(0.5, 1.5)
            if name.endswith("pos_bias.threshold"):
                p.fill_(3.0)
    return m.eval()
