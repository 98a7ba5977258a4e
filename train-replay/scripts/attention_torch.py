"""PyTorch's fused CPU attention at the shape of `cargo bench -p train-replay --bench attention`
(16 sequences of 256, 8 heads of 32, causal, f32, one thread), best of 12, to set beside it:
`python3 train-replay/scripts/attention_torch.py`. The input is the `q | k | v` projection of
a GPT block (batch x seq rows of 3 x width), split into heads as nanoGPT does."""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
B, T, H, D = 16, 256, 8, 32
C = H * D
qkv = (torch.arange(B * T * 3 * C, dtype=torch.float32) * 7919 % 1000 / 1000 - 0.5).view(B, T, 3 * C)
dout = (torch.arange(B * T * C, dtype=torch.float32) * 104729 % 1000 / 1000 - 0.5).view(B, T, C)


def heads(x):
    return x.view(B, T, H, D).transpose(1, 2)


fwd = bwd = float("inf")
for _ in range(12):
    x = qkv.clone().requires_grad_(True)
    t = time.perf_counter()
    q, k, v = x.split(C, dim=2)
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    fwd = min(fwd, time.perf_counter() - t)
    t = time.perf_counter()
    y.backward(dout)
    bwd = min(bwd, time.perf_counter() - t)
print(f"PyTorch {torch.__version__} SDPA: forward {fwd * 1e3:.2f} ms, backward {bwd * 1e3:.2f} ms")
