"""PyTorch's side of bench/bench_cuda_gpt.cpp: GPT training steps on a CUDA device, eager, float32.

  python3 torch_gpt_cuda.py [--policy none|per-block] [--layers 12] [--width 768] [--heads 12]
                            [--seq 1024] [--batch 8] [--vocab 50304] [--steps 5] [--warmup 3] [--tf32]

The model is torch_runner.py's GPT (remat::nn::GPT's structure and names: pre-norm blocks, fused
qkv, exact GELU, untied lm_head) with nanoGPT's attention (scaled_dot_product_attention,
is_causal=True). TF32 is off unless --tf32 (matmul and cuDNN), as in remat. A step: zero_grad
(set_to_none), forward, mean cross entropy, backward, SGD (lr 1e-4, no momentum), loss.item().
Policies: none (PyTorch keeps every activation: remat's save-all) and per-block
(torch.utils.checkpoint around every block: remat's every-layer). Memory: torch.cuda.
max_memory_allocated over the measured steps minus what was allocated before them (the model and
inputs), the analogue of remat's peak total bytes. One JSON line on stdout.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", choices=["none", "per-block"], default="none")
    for name, default in (("layers", 12), ("width", 768), ("heads", 12), ("seq", 1024), ("batch", 8),
                          ("vocab", 50304), ("steps", 5), ("warmup", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
    from torch_runner import build

    if not torch.cuda.is_available():
        print(json.dumps({"system": "pytorch", "policy": a.policy, "error": "torch.cuda.is_available() is False"}))
        return 1
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(1)
    dev = torch.device("cuda:0")
    spec = dict(kind="gpt", vocab=a.vocab, layers=a.layers, width=a.width, heads=a.heads, seq=a.seq)
    model = build(torch, spec, "sdpa").to(dev)
    model.train()
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    positions = torch.arange(a.seq, device=dev)
    blocks = list(model.blocks)

    def loss_fn():
        h = model.wte(ids) + model.wpe(positions)
        for blk in blocks:
            h = checkpoint(blk, h, use_reentrant=False) if a.policy == "per-block" else blk(h)
        logits = model.lm_head(model.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    times, losses, peak = [], [], 0
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
    med = sorted(times)[len(times) // 2]
    print(json.dumps({
        "system": "pytorch", "policy": a.policy, "device": torch.cuda.get_device_name(0), "version": torch.__version__,
        "layers": a.layers, "width": a.width, "heads": a.heads, "seq": a.seq, "batch": a.batch, "vocab": a.vocab,
        "tf32": a.tf32, "step_seconds": times, "median_seconds": med, "peak_total_bytes": peak, "losses": losses,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
