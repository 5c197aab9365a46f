"""Document-masked attention (issue 16, SPEC §2): packed windows of several documents."""

import pytest
import torch

from attention import document_starts


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
