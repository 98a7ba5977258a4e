#!/usr/bin/env python3
"""The main job's GPT recipe in PyTorch on the CPU: the peer of `train-replay train --model gpt`.

A decoder-only transformer in GPT-2's layout, as nanoGPT writes it: token and learned position
embeddings, pre-LayerNorm blocks of causal self-attention (F.scaled_dot_product_attention) and
a 4x MLP with GELU (tanh form), a final LayerNorm, the output projection tied to the token
embedding, softmax cross-entropy over the bytes of a text, AdamW (betas 0.9 and 0.95, weight
decay on the matrices and embeddings only). The batches are the ones the job draws: the same
text split the same way, the same offsets from the same seed (see `offsets`). `--tokens FILE`
reads the tokens the job made of its text instead (little-endian 32-bit ids, as `compare` and
`sweep` write them for `--tokenizer gpt2`), so both train on the same token ids; the logits are
nanoGPT's, whole. With `--load
FILE` it starts from weights the job wrote (`train-replay train --model gpt --save-init
FILE`), so that the two train the same model on the same batches; `--losses N` prints the
first N losses. `--checkpoint-every k` wraps every k blocks in torch.utils.checkpoint (0: none);
`--compile` runs the model through torch.compile first and reports its compile time apart.
Prints one JSON line with the fields of `train-replay train --json`, and `baseline_rss`: the
process's peak RSS once the model and the optimizer exist, before the first step (the
interpreter and its libraries, the weights and the optimizer's state).

    python3 train-replay/scripts/torch_gpt.py --threads 2 --steps 20
"""

import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from peer import peak_rss, report, run_steps, training_arguments

MASK = (1 << 64) - 1
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "shakespeare.txt")


def mix(x):
    """SplitMix64's finaliser: the job's batch offsets come from it (`data::mix`)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def offsets(seed, stream, index, rows, span):
    """The first byte of each of `rows` windows of batch `index` in `stream` (0: training, 1:
    validation), each below `span`."""
    base = mix(mix(mix(seed) ^ stream) ^ index)
    return [mix(base ^ row) % span for row in range(rows)]


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class Segment(nn.Module):
    """Blocks whose activations are recomputed in the backward pass: only the segment's input
    is kept."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class GPT(nn.Module):
    def __init__(self, vocab, context, width, heads, layers, every):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(context, width)
        self.transformer.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(width)
        # The checkpointed segments, made once (a plain list: the blocks stay registered
        # under `transformer.h` alone, nanoGPT's names), so that a compiled forward sees the
        # same modules on every call.
        blocks = list(self.transformer.h)
        self.segments = [Segment(blocks[i : i + every]) for i in range(0, len(blocks), every)] if every else []

    def forward(self, idx, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        if self.segments:
            for segment in self.segments:
                x = checkpoint(segment, x, use_reentrant=False)
        else:
            for block in self.transformer.h:
                x = block(x)
        x = self.transformer.ln_f(x)
        logits = x @ self.transformer.wte.weight.t()  # tied
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def init_weights(model, layers):
    """nanoGPT's: normal(0, 0.02), the residual projections scaled by 1/sqrt(2 x layers)."""
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
        elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or "ln_f.weight" in name:
            nn.init.ones_(p)
        elif p.dim() >= 2:
            nn.init.normal_(p, 0.0, 0.02)
        else:
            nn.init.zeros_(p)


def load(model, path):
    """Weights written by the job (or by `safetensors.torch.save_model`, which may keep the tied
    embedding as `lm_head.weight`)."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    if "lm_head.weight" in tensors:
        tied = tensors.pop("lm_head.weight")
        tensors.setdefault("transformer.wte.weight", tied)
    own = model.state_dict()
    for name, tensor in tensors.items():
        if name not in own:
            raise SystemExit(f"error: {path}: unknown tensor {name}")
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise SystemExit(
                f"error: {path}: {name} is {list(tensor.shape)}, the model's is {list(own[name].shape)}"
            )
    missing = sorted(set(own) - set(tensors))
    if missing:
        raise SystemExit(f"error: {path}: missing {', '.join(missing)}")
    model.load_state_dict(tensors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    training_arguments(parser, steps=300, batch=16, layers=4, every=0, lr=1e-3)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--tokens", help="the text's token ids, little-endian int32 (not --data)")
    parser.add_argument("--load")
    parser.add_argument("--losses", type=int, default=0)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print what torch.compile makes of the model (graphs, graph breaks and why) and exit",
    )
    args = parser.parse_args()
    counts = (args.steps, args.batch, args.context, args.width, args.heads, args.layers, args.threads)
    if min(counts) < 1 or args.checkpoint_every < 0 or args.width % args.heads:
        parser.error("every count must be at least 1 and the width a multiple of the heads")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.tokens:
        with open(args.tokens, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.int32).long()
    else:
        with open(args.data, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if int(data.max()) >= args.vocab:
        parser.error(f"the text holds the token {int(data.max())}, past --vocab {args.vocab}")
    train = data[: len(data) * 9 // 10]
    model = GPT(args.vocab, args.context, args.width, args.heads, args.layers, args.checkpoint_every)
    init_weights(model, args.layers)
    if args.load:
        load(model, args.load)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
    )
    # The interpreter, its libraries, the weights and the optimizer, before any step (or
    # compilation) runs.
    baseline_rss = peak_rss()
    span = len(train) - args.context
    windows = torch.arange(args.context + 1)

    def batch(index):
        starts = torch.tensor(offsets(args.seed, 0, index, args.batch, span))
        rows = train[starts[:, None] + windows]
        return rows[:, :-1], rows[:, 1:]

    if args.explain:
        x, y = batch(0)
        explained = torch._dynamo.explain(model)(x, y)
        print(f"graphs: {explained.graph_count}, graph breaks: {explained.graph_break_count}")
        for reason in explained.break_reasons:
            print(f"break: {reason.reason}")
        return

    forward = model
    compile_s = None
    if args.compile:
        started = time.perf_counter()
        forward = torch.compile(model)
        x, y = batch(0)
        forward(x, y).backward()  # compiles the forward and the backward pass
        model.zero_grad(set_to_none=True)
        compile_s = time.perf_counter() - started

    def step(index):
        x, y = batch(index)
        loss = forward(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    losses, steady = run_steps(step, args.steps)
    name = "pytorch-compiled" if args.compile else "pytorch"
    report(name, losses, steady, baseline_rss, kept=args.losses, compile_s=compile_s)


if __name__ == "__main__":
    main()
