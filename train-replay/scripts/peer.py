"""What the PyTorch peers of the main job share: the steps timed as the job times them, and
the JSON line it reads back (the fields of `train-replay train --json`)."""

import json
import math
import resource
import time


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss():
    """The process's peak resident memory, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_steps(step, steps):
    """Runs `step(i)` for each of `steps` steps; the losses, and the steady state (the second
    half of the steps, as the job measures it): (steps, seconds, minor faults)."""
    warmup = min(steps // 2, steps - 1)
    losses = []
    for i in range(steps):
        if i == warmup:
            faults, started = minor_faults(), time.perf_counter()
        losses.append(step(i))
    return losses, (steps - warmup, time.perf_counter() - started, minor_faults() - faults)


def finite(x):
    """A loss for JSON, which has no NaN: `null` where it is not finite."""
    return x if math.isfinite(x) else None


def report(name, losses, steady, baseline_rss, kept=0, **extra):
    """Prints the run's JSON line: `name`, the first and last losses and the first `kept`,
    the steady state's rate and faults, the peak RSS and the RSS before the first step."""
    measured, seconds, faults = steady
    line = {
        "allocator": name,
        "first_loss": finite(losses[0]),
        "last_loss": finite(losses[-1]),
        "steps_per_s": measured / seconds,
        "faults_per_step": faults / measured,
        "peak_rss": peak_rss(),
        "baseline_rss": baseline_rss,
        "losses": [finite(x) for x in losses[:kept]],
    }
    line.update(extra)
    print(json.dumps(line))


def training_arguments(parser, steps, batch, layers, every, lr):
    """The flags both recipes take, with each one's defaults (the job's for that model)."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--checkpoint-every", type=int, default=every)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=7)
