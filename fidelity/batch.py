"""The training batch the harness's saves take their one optimizer step on."""
from __future__ import annotations


def every_token(vocab: int, seed: int, rows: int = 16):
    """A batch (rows x about vocab / rows tokens) holding every token id at least
    once, so that every embedding row has a gradient and Adam's moments are nowhere
    zero, as after real training: a few random tokens leave most rows' moments
    zero, and those compress far better than a trained checkpoint does."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.randperm(vocab, generator=g), torch.randint(0, vocab, (rows,), generator=g)])
    return ids[: rows * (len(ids) // rows)].reshape(rows, -1)
