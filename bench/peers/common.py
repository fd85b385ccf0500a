"""Shared by torch_runner.py and jax_runner.py: the model shapes, memory probes, JSON output.

Memory is measured the same way in every system (the C++ runner does the same in C++):
  rss_peak_growth_bytes = VmHWM at the end - VmHWM right after setup, where "setup" is the model,
  inputs and optimizer built (and, for JAX, the step compiled) and nothing run yet; before the
  baseline is read the high-water mark is reset to the current RSS by writing 5 to
  /proc/self/clear_refs, so setup transients (reading the weight file, compiling) do not hide the
  memory the steps take.
"""

import json
import statistics
import sys

# The shapes; the C++ runner (remat_runner.cpp, spec_for) holds the same numbers.
MODELS = {
    "mlp": dict(kind="mlp", depth=64, width=512, batch=128),
    "gpt": dict(kind="gpt", vocab=114, layers=4, width=128, heads=4, seq=64, batch=32),
    "gpt-large": dict(kind="gpt", vocab=114, layers=8, width=256, heads=8, seq=256, batch=20),
    # CIFAR pre-activation ResNets (remat::nn::ResNet): 3 stages of `blocks` blocks, 32x32 images
    "resnet": dict(kind="resnet", stages=3, blocks=3, width=16, classes=10, batch=32),
    "resnet-110": dict(kind="resnet", stages=3, blocks=18, width=16, classes=10, batch=32),
    # nanoGPT's CPU configuration of shakespeare_char (config/train_shakespeare_char.py with
    # --device=cpu --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128)
    "nanogpt": dict(kind="gpt", vocab=65, layers=4, width=128, heads=4, seq=64, batch=12),
}


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    def __init__(self):
        self.hwm_reset = reset_hwm()
        self.rss_base_kib = status_kib("VmRSS")
        self.hwm_base_kib = status_kib("VmHWM")

    def growth_bytes(self):
        return (status_kib("VmHWM") - self.hwm_base_kib) * 1024


def split_inputs(tensors):
    """The init file holds the parameters under their module names and the inputs as input.*."""
    params = {k: v for k, v in tensors.items() if not k.startswith("input.")}
    inputs = {k[len("input."):]: v for k, v in tensors.items() if k.startswith("input.")}
    return params, inputs


def emit(record):
    times = record.get("step_seconds", [])
    if times:
        record["median_step_seconds"] = statistics.median(times)
    if record.get("step_cpu_seconds"):
        record["median_step_cpu_seconds"] = statistics.median(record["step_cpu_seconds"])
    print(json.dumps(record), flush=True)


def fail(system, model, policy, error):
    print(json.dumps({"system": system, "model": model, "policy": policy, "error": str(error)}), flush=True)
    sys.exit(1)
