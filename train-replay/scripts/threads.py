#!/usr/bin/env python3
"""The main job's memory and speed against its thread count, as a Markdown table.

Runs `train-replay train --json` (and, with --torch, the same recipe in PyTorch,
`torch_mlp.py`) at each thread count, all alternated over --rounds, and prints the medians:
peak live, peak reserved, peak RSS, steps/s and the last loss (which must not move). Every
other flag goes to both trainings, e.g.:

    cargo build --release -p train-replay
    python3 train-replay/scripts/threads.py --rounds 3 --torch ~/torch/bin/python -- \\
        --model mlp --batch 2048 --layers 6 --steps 10 --checkpoint-every 1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def run(command):
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.path.join(HERE, "../../target/release/train-replay"))
    parser.add_argument("--torch", metavar="PYTHON", help="also run the PyTorch recipe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2,4,8,16,32")
    parser.add_argument("training", nargs="*", help="flags for both trainings (after --)")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    runs = {}
    for _ in range(args.rounds):
        for threads in counts:
            flags = args.training + ["--threads", str(threads)]
            runs.setdefault(("ferropool", threads), []).append(
                run([args.bin, "train", "--json"] + flags)
            )
            if args.torch:
                script = os.path.join(HERE, "torch_mlp.py")
                runs.setdefault(("pytorch", threads), []).append(run([args.torch, script] + flags))

    def median(name, threads, field, scale=1.0):
        values = [r[field] for r in runs[(name, threads)] if r.get(field) is not None]
        return statistics.median(values) / scale if values else None

    header = "| threads | peak live | peak reserved | peak RSS | steps/s | last loss |"
    rule = "|---|---|---|---|---|---|"
    if args.torch:
        header += " PyTorch peak RSS | PyTorch steps/s | ferropool against it |"
        rule += "---|---|---|"
    print(header)
    print(rule)
    for threads in counts:
        live = median("ferropool", threads, "peak_live_bytes", MIB)
        reserved = median("ferropool", threads, "peak_reserved_bytes", MIB)
        rss = median("ferropool", threads, "peak_rss", MIB)
        speed = median("ferropool", threads, "steps_per_s")
        losses = {r["last_loss"] for r in runs[("ferropool", threads)]}
        loss = ", ".join(str(v) for v in sorted(losses))
        row = f"| {threads} | {live:.1f} MiB | {reserved:.1f} MiB | {rss:.1f} MiB | {speed:.2f} | {loss} |"
        if args.torch:
            torch_rss = median("pytorch", threads, "peak_rss", MIB)
            torch_speed = median("pytorch", threads, "steps_per_s")
            row += f" {torch_rss:.0f} MiB | {torch_speed:.2f} | {speed / torch_speed:.2f}x |"
        print(row)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
