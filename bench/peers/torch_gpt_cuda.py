"""PyTorch's side of bench/bench_cuda_gpt.cpp: GPT training steps on a CUDA device, eager, float32 or bf16.

  python3 torch_gpt_cuda.py [--policy none|per-block] [--layers 12] [--width 768] [--heads 12]
                            [--seq 1024] [--batch 8] [--vocab 50304] [--steps 5] [--warmup 3] [--tf32]
                            [--optimizer sgd|adamw] [--profile-steps N] [--dtype f32|bf16]

--dtype bf16 runs the forward and the loss under torch.autocast(dtype=torch.bfloat16) with float32
parameters, gradients and optimizer state (remat's --dtype bf16; SDPA then takes its fused bf16
kernels, flash attention where the device has it).

The model is torch_runner.py's GPT (remat::nn::GPT's structure and names: pre-norm blocks, fused
qkv, exact GELU, untied lm_head) with nanoGPT's attention (scaled_dot_product_attention,
is_causal=True). TF32 is off unless --tf32 (matmul and cuDNN), as in remat. A step: zero_grad
(set_to_none), forward, mean cross entropy, backward, the update (SGD lr 1e-4 without momentum, or
AdamW lr 1e-4 with PyTorch's default implementation), loss.item(). With --profile-steps N, N more
steps run under torch.profiler after the measured ones: a second JSON line ("kind": "profile")
gives per step each CUDA kernel's (and memcpy's, memset's) device seconds and launches, the kernel
launches, and the host synchronisations (the CUDA runtime's *Synchronize calls).
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
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
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
        if a.dtype == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return forward_loss()
        return forward_loss()

    def forward_loss():
        h = model.wte(ids) + model.wpe(positions)
        for blk in blocks:
            h = checkpoint(blk, h, use_reentrant=False) if a.policy == "per-block" else blk(h)
        logits = model.lm_head(model.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    if a.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss.item()

    times, losses, peak = [], [], 0
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
    med = sorted(times)[len(times) // 2]
    print(json.dumps({
        "system": "pytorch", "policy": a.policy, "device": torch.cuda.get_device_name(0), "version": torch.__version__,
        "layers": a.layers, "width": a.width, "heads": a.heads, "seq": a.seq, "batch": a.batch, "vocab": a.vocab,
        "tf32": a.tf32, "optimizer": a.optimizer, "dtype": a.dtype, "step_seconds": times, "median_seconds": med,
        "peak_total_bytes": peak, "losses": losses,
    }))
    if a.profile_steps > 0:
        print(json.dumps(profile(torch, step, a)))
    return 0


def profile(torch, step, a):
    """Per step: device seconds and launches per CUDA kernel (memcpy, memset) name, kernel launches and
    host synchronisations, over a.profile_steps steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.profile_steps):
            step()
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / a.profile_steps
    kernels, launches, syncs = {}, 0, 0
    for e in prof.events():
        device = str(getattr(e, "device_type", "")).lower()
        if "cuda" in device:
            us = e.time_range.elapsed_us()  # a device event's own interval
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += us * 1e-6
            if not e.name.startswith("Memcpy") and not e.name.startswith("Memset"):
                launches += 1
        elif "Synchronize" in e.name and e.name.startswith("cuda"):
            syncs += 1
    n = a.profile_steps
    return {
        "system": "pytorch", "kind": "profile", "policy": a.policy, "dtype": a.dtype, "step_seconds": seconds,
        "launches_per_step": launches / n, "synchronizations_per_step": syncs / n,
        "kernels": sorted(({"name": name, "launches": v[0] / n, "seconds": v[1] / n} for name, v in kernels.items()),
                          key=lambda k: -k["seconds"]),
    }


if __name__ == "__main__":
    sys.exit(main())
