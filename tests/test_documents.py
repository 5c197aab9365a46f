"""Document-masked attention (issue 16, SPEC §2): packed windows of several documents."""

import pytest
import torch

from attention import document_starts
from attention_bam import bam_attention_ref
from attention_tapa import tapa_attention_ref
from conftest import make_tiny_gpt
from data.batches import document_ids
from model import POS_VARIANTS


def test_document_starts_against_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    doc_ids = torch.cumsum(torch.rand(4, 37, generator=g) < 0.2, dim=1) + 3  # (B, T), non-decreasing
    doc_ids[0] = 7  # one row without a boundary: a document that began before the window
    starts = document_starts(doc_ids)
    for b in range(doc_ids.shape[0]):
        for i in range(doc_ids.shape[1]):
            j = i
            while j > 0 and doc_ids[b, j - 1] == doc_ids[b, i]:
                j -= 1
            assert starts[b, i].item() == j


def test_document_starts_rejects_decreasing_ids():
    with pytest.raises(ValueError, match="non-decreasing"):
        document_starts(torch.tensor([[0, 1, 0]]))


# ---------------------------------------------------------------- the model: packed == each document alone

VARIANTS = [(pos, ssmax, "quadratic") for pos in POS_VARIANTS for ssmax in (False, True)] + \
    [("tapa", ssmax, "linear") for ssmax in (False, True)]
SPLITS = [[5, 1, 12, 7, 9], [1, 3, 15, 1, 9, 5]]  # two rows of 34 tokens: lengths 1 and odd ones, a boundary at 0


def tiny_gpt(pos, ssmax, phase="quadratic"):
    """conftest.make_tiny_gpt at block_size 64, vocab 50, 2 heads: SSMax s, BAM β and FIRE's L moved off their init."""
    return make_tiny_gpt(pos, ssmax, block_size=64, vocab_size=50, n_head=2, tapa_phase=phase)


def packed_batch(splits, seed=0):
    """(idx, doc_ids), each (B, T), of rows that pack documents of the given lengths (one row per list)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50, (len(splits), sum(splits[0])), generator=g)
    doc_ids = torch.stack([torch.repeat_interleave(torch.arange(len(s)), torch.tensor(s)) for s in splits])
    return idx, doc_ids


@pytest.mark.parametrize("pos,ssmax,phase", VARIANTS)
def test_packed_documents_equal_each_document_alone(pos, ssmax, phase):
    """A packed forward with doc_ids gives, at every position, the logits of each document run alone from
    position 0 (SPEC §2: masked attention, n inside the document, positions inside the document)."""
    model = tiny_gpt(pos, ssmax, phase)
    idx, doc_ids = packed_batch(SPLITS)
    with torch.no_grad():
        packed, _ = model(idx, doc_ids=doc_ids + 7, keep_last=None)  # ids need not start at 0
        for b, lengths in enumerate(SPLITS):
            start = 0
            for n in lengths:
                alone, _ = model(idx[b:b + 1, start:start + n], keep_last=None)
                assert torch.allclose(packed[b, start:start + n], alone[0], atol=1e-5), (b, start, n)
                start += n
        # and the documents matter: without doc_ids the later documents' logits differ
        plain, _ = model(idx, keep_last=None)
    assert not torch.allclose(plain[:, 6:], packed[:, 6:], atol=1e-3)


@pytest.mark.parametrize("oracle", ["bam", "tapa"])
def test_kernel_oracles_take_doc_start_across_chunks(oracle):
    """bam_attention_ref and tapa_attention_ref (the Triton kernels' oracles) with doc_start, on chunks of 5
    queries that cut through documents: each document's output equals the document run alone, SSMax included."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 34, 8, generator=g) for _ in range(3))
    s = torch.rand(2, generator=g) + 0.5
    if oracle == "bam":
        log_scale, shape = torch.log(torch.tensor([0.3, 0.1])), torch.tensor([0.5, 1.2])
        attend = lambda q, k, v, **kw: bam_attention_ref(q, k, v, log_scale, shape, ssmax_scale=s, chunk_size=5, **kw)
    else:
        attend = lambda q, k, v, **kw: tapa_attention_ref(q, k, v, ssmax_scale=s, chunk_size=5, **kw)
    _, doc_ids = packed_batch(SPLITS)
    packed = attend(q, k, v, doc_start=document_starts(doc_ids))
    for b, lengths in enumerate(SPLITS):
        for start, n in zip(torch.tensor([0] + lengths[:-1]).cumsum(0).tolist(), lengths):
            part = slice(start, start + n)
            alone = attend(q[b:b + 1, :, part], k[b:b + 1, :, part], v[b:b + 1, :, part])
            assert torch.allclose(packed[b, :, part], alone[0], atol=1e-5), (b, start, n)


def record_sdpa(monkeypatch):
    """Wrap F.scaled_dot_product_attention: returns the list of (is_causal, attn_mask shape or None) of its calls."""
    import torch.nn.functional as F
    calls, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((is_causal, None if attn_mask is None else tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def test_sdpa_path_masks_chunks_never_t_by_t(monkeypatch):
    """pos='nope' (an SDPA layer) with document boundaries at T = 600: the masks SDPA gets cover at most 256
    queries (B·chunk·T memory, not T×T), and the output still equals the documents run alone."""
    model = tiny_gpt("nope", False)
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 50, (1, 600), generator=g)
    doc_ids = (torch.arange(600) >= 290).long()[None]  # a boundary inside the second chunk of queries
    calls = record_sdpa(monkeypatch)
    with torch.no_grad():
        packed, _ = model(idx, doc_ids=doc_ids, keep_last=None)
    assert calls and all(not causal and shape[-2] <= 256 and shape[0] == 1 and shape[1] == 1
                         for causal, shape in calls), calls
    with torch.no_grad():
        for part in (slice(0, 290), slice(290, 600)):
            alone, _ = model(idx[:, part], keep_last=None)
            assert torch.allclose(packed[0, part], alone[0], atol=1e-5)


def test_a_batch_without_eot_is_one_document(monkeypatch):
    """A batch without EOT: document_ids gives one document per row, and the model's output equals its output
    without doc_ids, on the fused is_causal path of SDPA (pos='rope')."""
    model = tiny_gpt("rope", False)
    idx = torch.randint(0, 49, (2, 40), generator=torch.Generator().manual_seed(3))  # EOT = 49 never occurs
    doc_ids = document_ids(idx, eot=49)
    assert torch.equal(doc_ids, torch.zeros_like(idx))
    calls = record_sdpa(monkeypatch)
    with torch.no_grad():
        with_ids, _ = model(idx, doc_ids=doc_ids, keep_last=None)
        assert calls and all(causal and shape is None for causal, shape in calls), calls
        without, _ = model(idx, keep_last=None)
    assert torch.equal(with_ids, without)


def test_document_errors():
    model = tiny_gpt("bam", True)
    idx = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="drop cache= or doc_ids="):
        model(idx, cache=model.new_cache(), doc_ids=torch.zeros_like(idx))
    with pytest.raises(ValueError, match="non-decreasing"):
        model(idx, doc_ids=torch.tensor([[0, 0, 1, 1, 0, 2]]))
    with pytest.raises(ValueError, match="idx's shape"):
        model(idx, doc_ids=torch.zeros(1, 5, dtype=torch.long))
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="KV cache takes no documents"):
        bam_attention_ref(q[:, :, 2:], q, q, torch.zeros(2), torch.ones(2), q_offset=2,
                          doc_start=torch.zeros(1, 2, dtype=torch.long))


# ---------------------------------------------------------------- train.py: document_mask

def train_tiny(tmp_path, data_dir, *args):
    import train
    cfg = train.get_config(["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                            "--eval_iters=1", "--device=cpu", "--warmup_iters=1", f"--out_dir={tmp_path / 'out'}",
                            f"--dataset={data_dir}", "--max_iters=3", "--eval_interval=3", *args], train.demo_config())
    return train.train(cfg)


def test_fineweb_training_gets_the_eot_document_ids(tmp_path, gpt2_tokenizer, monkeypatch):
    """data/fineweb.py tokenizes a small jsonl ([EOT] + tokens per document); training a few steps with
    document_mask=True hands the model, at every forward (training and evaluation), doc_ids that count the EOTs
    of its own input up to each position."""
    import json
    from data import fineweb
    from model import GPT
    words = "the cat sat on a mat while seven quiet dogs watched it from far away".split()
    texts = [" ".join(words[(3 * d) % 7:(3 * d) % 7 + 1 + d % 9]) for d in range(120)]  # 1 to 9 words each
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    fineweb.prepare(str(tmp_path / "fw"), [str(tmp_path / "docs.jsonl")], shard_size=300, num_proc=1)
    seen, forward = [], GPT.forward

    def recording(self, idx, *args, doc_ids=None, **kwargs):
        seen.append((idx.clone(), doc_ids))
        return forward(self, idx, *args, doc_ids=doc_ids, **kwargs)
    monkeypatch.setattr(GPT, "forward", recording)
    train_tiny(tmp_path, str(tmp_path / "fw"), "--document_mask=True", "--pos=learned", "--ssmax=True")
    assert len(seen) == 3 + 2 * 2  # 3 steps, 2 evaluations of 2 splits
    for idx, doc_ids in seen:
        for row, ids in zip(idx.tolist(), doc_ids.tolist()):
            count, expected = 0, []
            for token in row:
                count += token == gpt2_tokenizer.eot
                expected.append(count)
            assert ids == expected
    assert max(int(doc_ids.max()) for _, doc_ids in seen) >= 3  # several documents in a window


def test_document_mask_is_refused_on_the_passkey_set(tmp_path):
    from data.passkey import build_dataset
    build_dataset("byte", 256, n_train=8, n_val=4, seed=0, out_dir=str(tmp_path / "pk"))
    with pytest.raises(ValueError, match="pads its passkey prompts with EOT.*--document_mask=False"):
        train_tiny(tmp_path, str(tmp_path / "pk"), "--document_mask=True", "--block_size=256")
    assert not (tmp_path / "out").exists()  # refused before anything is written
