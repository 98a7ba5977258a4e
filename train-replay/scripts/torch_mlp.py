#!/usr/bin/env python3
"""The main job's recipe in PyTorch on the CPU, for a same-machine comparison.

MLP 128 -> 6 x 512 -> 10 (ReLU), batch 512, softmax cross-entropy against the labels of a
fixed random linear teacher, Adam (lr 0.002), the input of every second layer kept and the
rest recomputed in the backward pass (torch.utils.checkpoint), 60 steps, the second half
timed. Prints one JSON line with the same fields as `train-replay train --json`.

    python3 train-replay/scripts/torch_mlp.py --threads 2
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from peer import peak_rss, report, run_steps, training_arguments

INPUT, CLASSES = 128, 10


class Segment(nn.Module):
    """Layers whose inputs are recomputed: only the segment's own input is kept."""

    def __init__(self, layers, last):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.last = last

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if not (self.last and i + 1 == len(self.layers)):
                x = F.relu(x)
        return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp"], default="mlp", help="the MLP (the only model here)")
    training_arguments(parser, steps=60, batch=512, layers=6, every=2, lr=2e-3)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    if min(args.steps, args.batch, args.hidden, args.layers, args.checkpoint_every, args.threads) < 1:
        parser.error("every count must be at least 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dims = [INPUT] + [args.hidden] * args.layers + [CLASSES]
    linears = [nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
    for layer in linears:
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
    every = args.checkpoint_every
    segments = nn.ModuleList(
        Segment(linears[i : i + every], i + every >= len(linears))
        for i in range(0, len(linears), every)
    )
    teacher = torch.randn(INPUT, CLASSES)
    optimizer = torch.optim.Adam(segments.parameters(), lr=args.lr)
    # The interpreter, its libraries, the weights and the optimizer, before any step.
    baseline_rss = peak_rss()

    def step():
        x = torch.randn(args.batch, INPUT)
        labels = (x @ teacher).argmax(dim=1)
        h = x
        for segment in segments[:-1]:
            h = checkpoint(segment, h, use_reentrant=False)
        logits = segments[-1](h)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    losses, steady = run_steps(lambda _: step(), args.steps)
    report("pytorch", losses, steady, baseline_rss, allocs_per_step=None)


if __name__ == "__main__":
    main()
