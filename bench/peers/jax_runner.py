"""One JAX (jit, CPU) configuration of the peer benchmarks, in its own process.

  python jax_runner.py --model mlp|gpt|gpt-large --policy none|per-block|dots
                       --init FILE [--steps 5] [--warmup 2] [--lr 1e-4]

The weights and inputs come from the same file as PyTorch's (written by remat_runner
--save-init), read with numpy. The models are the same functions as remat's and PyTorch's.
Attention is jax.nn.dot_product_attention(is_causal=True) where this JAX has it (--attention
explicit, or an older JAX: scores, -inf mask, softmax).

Policies:
  none       no rematerialisation
  per-block  jax.checkpoint around every block
  dots       jax.checkpoint(block, policy=jax.checkpoint_policies.checkpoint_dots): keep the
             outputs of every dot (matmuls, batched ones included), recompute the rest

A step is one jitted function: forward, loss, backward (jax.value_and_grad) and the SGD update,
with the parameters donated (updated in place, as the other systems do). It is compiled during
setup, before the memory baseline is read.
"""

import argparse
import math
import os
import time

from common import MODELS, MemoryProbe, emit, fail, split_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--policy", required=True, choices=["none", "per-block", "dots"])
    ap.add_argument("--init", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--attention", choices=["fused", "explicit"], default="fused")
    a = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        import jax.numpy as jnp
        from safetensors.numpy import load_file
    except Exception as e:  # noqa: BLE001
        fail("jax", a.model, a.policy, f"import: {e}")

    spec = MODELS[a.model]
    attention = a.attention if hasattr(jax.nn, "dot_product_attention") else "explicit"
    tensors = load_file(a.init)
    params_np, inputs_np = split_inputs(tensors)
    params = {k: jnp.asarray(v) for k, v in params_np.items()}
    inputs = {k: jnp.asarray(v) for k, v in inputs_np.items()}
    del tensors, params_np, inputs_np

    def linear(p, prefix, x):
        y = x @ p[prefix + ".weight"].T
        b = p.get(prefix + ".bias")
        return y if b is None else y + b

    def layer_norm(p, prefix, x, eps=1e-5):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * p[prefix + ".weight"] + p[prefix + ".bias"]

    if spec["kind"] == "mlp":
        n = spec["depth"]

        def block(p, h, i):
            return jnp.tanh(linear(p, f"layers.{i}.fc", h))
    else:
        n = spec["layers"]
        heads = spec["heads"]

        def block(p, x, i):
            pre = f"blocks.{i}."
            b, t, c = x.shape
            d = c // heads
            hx = layer_norm(p, pre + "ln1", x)
            q, k, v = jnp.split(linear(p, pre + "attn.qkv", hx), 3, axis=-1)
            q, k, v = (z.reshape(b, t, heads, d).transpose(0, 2, 1, 3) for z in (q, k, v))
            if attention == "fused":
                # jax.nn.dot_product_attention takes [B, T, H, D]
                y = jax.nn.dot_product_attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                                                  v.transpose(0, 2, 1, 3), is_causal=True).reshape(b, t, c)
            else:
                scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(d))
                mask = jnp.triu(jnp.ones((t, t), dtype=bool), 1)
                scores = jnp.where(mask, -jnp.inf, scores)
                att = jax.nn.softmax(scores, axis=-1)
                y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
            h = x + linear(p, pre + "attn.proj", y)
            m = linear(p, pre + "mlp.proj", jax.nn.gelu(linear(p, pre + "mlp.fc", layer_norm(p, pre + "ln2", h)),
                                                         approximate=False))
            return h + m

    if a.policy == "none":
        run_block = block
    elif a.policy == "per-block":
        run_block = jax.checkpoint(block, static_argnums=(2,))
    else:
        run_block = jax.checkpoint(block, static_argnums=(2,), policy=jax.checkpoint_policies.checkpoint_dots)

    def loss_fn(p, inp):
        if spec["kind"] == "mlp":
            h = inp["x"]
            for i in range(n):
                h = run_block(p, h, i)
            return jnp.mean(jnp.square(h))
        ids, targets = inp["ids"], inp["targets"]
        h = p["wte.weight"][ids] + p["wpe.weight"][: ids.shape[1]]
        for i in range(n):
            h = run_block(p, h, i)
        logits = linear(p, "lm_head", layer_norm(p, "ln_f", h))
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(logz - picked)

    lr = a.lr

    def step(p, inp):
        loss, grads = jax.value_and_grad(loss_fn)(p, inp)
        return jax.tree_util.tree_map(lambda w, g: w - lr * g, p, grads), loss

    compiled = jax.jit(step, donate_argnums=(0,)).lower(params, inputs).compile()

    probe = MemoryProbe()
    times, cpu_times, losses = [], [], []
    for i in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        params, loss = compiled(params, inputs)
        jax.block_until_ready((params, loss))
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(float(loss))
        if i >= a.warmup:
            times.append(dt)
            cpu_times.append(dc)
    emit({
        "system": "jax", "model": a.model, "policy": a.policy, "threads": len(os.sched_getaffinity(0)),
        "steps": a.steps, "warmup": a.warmup, "step_seconds": times, "step_cpu_seconds": cpu_times, "losses": losses,
        "first_loss": losses[0], "rss_peak_growth_bytes": probe.growth_bytes(),
        "rss_base_bytes": probe.rss_base_kib * 1024, "hwm_reset": probe.hwm_reset,
        "version": jax.__version__, "attention": attention,
    })


if __name__ == "__main__":
    main()
