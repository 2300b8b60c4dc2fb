"""What every save of the harness shares: the test shape (our tests' scaled
LLaMA: 15,206,912 parameters), the batch of the one optimizer step before a
save, the LLaMA module the torch-based saves train (torchtitan's names), and a
port for their processes' rendezvous."""
from __future__ import annotations

import socket

#: the test shape, as our layouts' ModelShape names it
SHAPE = {"num_layers": 2, "hidden_size": 512, "ffn_hidden_size": 1792, "vocab_size": 8192,
         "num_attention_heads": 8, "num_kv_heads": 2}
LAYERS, HIDDEN, FFN, VOCAB, HEADS, KV_HEADS = (SHAPE[k] for k in (
    "num_layers", "hidden_size", "ffn_hidden_size", "vocab_size", "num_attention_heads", "num_kv_heads"))


def shape(model_datatype: str, optimizer_datatype: str) -> dict:
    """The manifest's shape: the test shape and the datatypes the save used."""
    return {**SHAPE, "model_datatype": model_datatype, "optimizer_datatype": optimizer_datatype}


def every_token(vocab: int, seed: int, rows: int = 16):
    """A batch (rows x about vocab / rows tokens) holding every token id at least
    once, so that every embedding row has a gradient and Adam's moments are nowhere
    zero, as after real training: a few random tokens leave most rows' moments
    zero, and those compress far better than a trained checkpoint does."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.randperm(vocab, generator=g), torch.randint(0, vocab, (rows,), generator=g)])
    return ids[: rows * (len(ids) // rows)].reshape(rows, -1)


def llama():
    """torchtitan's llama3 Transformer's parameters, names and registration order at
    the test shape (no RoPE: it has no parameters): untied embedding and output,
    RMSNorm, grouped-query attention, SwiGLU. forward(tokens) gives the logits,
    forward(tokens, labels) the loss."""
    import torch.nn as nn
    import torch.nn.functional as F

    head_dim = HIDDEN // HEADS

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(HIDDEN, HEADS * head_dim, bias=False)
            self.wk = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.wv = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.wo = nn.Linear(HEADS * head_dim, HIDDEN, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            rep = HEADS // KV_HEADS
            q = self.wq(x).view(b, s, HEADS, head_dim).transpose(1, 2)
            k = self.wk(x).view(b, s, KV_HEADS, head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
            v = self.wv(x).view(b, s, KV_HEADS, head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
            self.w2 = nn.Linear(FFN, HIDDEN, bias=False)
            self.w3 = nn.Linear(HIDDEN, FFN, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.feed_forward = FeedForward()
            self.attention_norm = nn.RMSNorm(HIDDEN)
            self.ffn_norm = nn.RMSNorm(HIDDEN)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
            self.norm = nn.RMSNorm(HIDDEN)
            self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, tokens, labels=None):
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h)
            logits = self.output(self.norm(h))
            if labels is None:
                return logits
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))

    return Transformer()


def free_port() -> int:
    """A free loopback port for the save's processes to meet on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
