#!/usr/bin/env python3
"""float32 against bf16, and the AVX2 level against the AVX-512 level, in one run: `remat train`
at one GPT shape (default the mid shape: 6 layers, width 384, 6 heads, T 256, batch 4), the
configurations interleaved round by round so that load from other processes falls on all of them.

  bench/run_width.py [--remat build/remat] [--rounds 2] [--threads 2] [--policy save-all]
                     [--torch PYTHON]   (a Python with torch: PyTorch's float32 and bf16-autocast
                                         steps in the same rounds, bench/peers/torch_width.py)

Each run is one training step and the report's probe: the policy's step and save-all's, 5 steps
each in turns on one batch (JSON probe_step_seconds, save_all_step_seconds: medians of 5; a run's
time is the smaller). Prints a Markdown report: the CPU (model name, remat's cpu_features), per
configuration the median over rounds of the runs' step times, the ratios, and how busy other processes kept the CPUs
(`others`: machine busy time from /proc/stat minus the run's own CPU time, over its wall time)."""
import argparse, json, os, platform, resource, statistics, subprocess, sys, time

CONFIGS = [("avx2", "f32"), ("avx512", "f32"), ("avx2", "bf16"), ("avx512", "bf16")]


def busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def run_torch(args, dtype):
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [args.torch, os.path.join(here, "peers", "torch_width.py"), "--dtype", dtype, "--threads", str(args.threads),
           "--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads), "--seq",
           str(args.seq), "--batch", str(args.batch)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=os.path.join(here, "peers")).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"probe_step_seconds": r["step_seconds_median"], "save_all_step_seconds": r["step_seconds_median"],
            "cpu": {"bf16_products": f"torch {r['torch']}, {r['isa']}"}, "grad_digest": ""}


def run(args, level, dtype):
    if level == "pytorch":
        return measured(lambda: run_torch(args, dtype))
    cmd = [args.remat, "train", "--threads", str(args.threads), "--layers", str(args.layers), "--width",
           str(args.width), "--heads", str(args.heads), "--seq", str(args.seq), "--batch", str(args.batch),
           "--steps", "1", "--policy", args.policy, "--dtype", dtype, "--json", "--quiet"]
    env = dict(os.environ, REMAT_CPU_LEVEL=level)

    def remat():
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        return [json.loads(l) for l in out.splitlines() if l.startswith("{") and "step_seconds_median" in l][-1]
    return measured(remat)


def measured(body):
    """body()'s result, and how many CPUs other processes kept busy meanwhile."""
    before, hz = busy_jiffies()
    own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    result = body()
    wall = time.monotonic() - t0
    own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after, _ = busy_jiffies()
    own = (own1.ru_utime + own1.ru_stime) - (own0.ru_utime + own0.ru_stime)
    others = max(0.0, (after - before) / hz - own) / wall
    return result, others


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remat", default="build/remat")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policy", default="save-all")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--torch", default="")
    args = ap.parse_args()
    configs = CONFIGS + ([("pytorch", "f32"), ("pytorch", "bf16")] if args.torch else [])
    steps = {c: [] for c in configs}
    others = {c: [] for c in configs}
    info = {}
    for _ in range(args.rounds):
        for c in configs:
            r, o = run(args, *c)
            # both are save-all's median of 5 steps on one batch (under save-all): the less disturbed one
            steps[c].append(min(r["probe_step_seconds"], r["save_all_step_seconds"]))
            print(f"{c}: probe {r['probe_step_seconds']:.3f} s, save-all {r['save_all_step_seconds']:.3f} s, "
                  f"others {o:.2f}", file=sys.stderr, flush=True)
            others[c].append(o)
            info[c] = r
    cpu = info[("avx512", "f32")]["cpu"]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; remat's cpu_features: widest level {cpu['widest']}, "
          f"features {' '.join(cpu['features'])}")
    print(f"\n`remat train --threads {args.threads} --layers {args.layers} --width {args.width} --heads {args.heads} "
          f"--seq {args.seq} --batch {args.batch} --steps 1 --policy {args.policy} --dtype DTYPE --json` with "
          f"`REMAT_CPU_LEVEL=LEVEL`; {args.rounds} rounds, the configurations in turn in each round; per run the "
          f"smaller of the probe's two medians of 5 steps on one batch (JSON `probe_step_seconds`, "
          f"`save_all_step_seconds`; PyTorch: median of 5 steps after 2), here the median over rounds.\n")
    print("| level (or system) | dtype | bf16 products | median step s | runs (s) | others (CPUs busy) | grad digest |")
    print("|---|---|---|---:|---|---|---|")
    med = {}
    for c in configs:
        med[c] = statistics.median(steps[c])
        print(f"| {c[0]} | {c[1]} | {info[c]['cpu']['bf16_products']} | {med[c]:.3f} | "
              f"{', '.join(f'{s:.3f}' for s in steps[c])} | {', '.join(f'{o:.2f}' for o in others[c])} | "
              f"{info[c].get('grad_digest', '')} |")
    print("\n| ratio | value |\n|---|---:|")
    print(f"| bf16 / f32 at avx512 | {med[('avx512', 'bf16')] / med[('avx512', 'f32')]:.3f} |")
    print(f"| bf16 / f32 at avx2 | {med[('avx2', 'bf16')] / med[('avx2', 'f32')]:.3f} |")
    print(f"| avx512 / avx2, f32 | {med[('avx512', 'f32')] / med[('avx2', 'f32')]:.3f} |")
    print(f"| avx512 / avx2, bf16 | {med[('avx512', 'bf16')] / med[('avx2', 'bf16')]:.3f} |")
    if args.torch:
        print(f"| PyTorch bf16 autocast / PyTorch f32 | {med[('pytorch', 'bf16')] / med[('pytorch', 'f32')]:.3f} |")
        print(f"| remat f32 (avx512) / PyTorch f32 | {med[('avx512', 'f32')] / med[('pytorch', 'f32')]:.3f} |")
        print(f"| remat bf16 (avx512) / PyTorch bf16 autocast | {med[('avx512', 'bf16')] / med[('pytorch', 'bf16')]:.3f} |")


if __name__ == "__main__":
    main()
