#!/usr/bin/env python3
"""Peer benchmark: tessera's training step against PyTorch eager on the CPU.

The same model (a Llama of the same config and weight layout: RMSNorm with
epsilon inside the square root, rotate-half RoPE, grouped-query attention,
SwiGLU, untied LM head, no biases), the same batch and thread count, the
same step: forward, backward, global-norm clip at 1.0 and AdamW. PyTorch
runs with torch.set_num_threads(N) and F.scaled_dot_product_attention;
its AdamW is tried fused and foreach, and the faster one is the reference.
bf16_mixed is compared against torch.autocast("cpu", dtype=torch.bfloat16)
(bf16 GEMM inputs, float32 weights and optimizer state on both sides).

Before timing, each configuration is checked: tessera dumps its initial
weights and the windows of its first step (benchmarks/peer_step --dump);
PyTorch loads them and computes the loss of the same batch, which must
equal tessera's first-step loss to 1e-5 relative in fp32 (2e-2 under
bf16, where the two round differently).

Then R rounds, interleaved (tessera, then PyTorch, in each round, so both
see the same load): each side runs its warm-up steps and S timed steps and
reports the median step time. The table gives the median over the rounds
of each side's medians and of the per-round ratio of tokens/s. Both sides
run with the OpenMP runtime's default wait policy (or the caller's
OMP_WAIT_POLICY, which both then read).

  benchmarks/peer_pytorch.py [--rounds 5] [--threads 2] [--quick] [--case TEXT]

Writes benchmarks/peer_pytorch.json and benchmarks/peer_pytorch.md. Exits
0 with a message (and writes nothing) where PyTorch is not installed.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("peer_pytorch: PyTorch is not installed (pip install torch): skipped")
    sys.exit(0)


# ---------------------------------------------------------------- the model
class Llama(torch.nn.Module):
    """A Llama with tessera's parameter names and shapes (nn.Linear (out, in))."""

    def __init__(self, c):
        super().__init__()
        H, F_, V = c["dim"], c["ffn_dim"], c["vocab"]
        self.c = c
        hd = H // c["n_heads"]
        kv = c["n_kv_heads"] * hd
        self.embedding = torch.nn.Parameter(torch.empty(V, H))
        self.blocks = torch.nn.ModuleList()
        for _ in range(c["n_layers"]):
            b = torch.nn.Module()
            b.attn_norm = torch.nn.Parameter(torch.ones(H))
            b.wq = torch.nn.Linear(H, H, bias=False)
            b.wk = torch.nn.Linear(H, kv, bias=False)
            b.wv = torch.nn.Linear(H, kv, bias=False)
            b.wo = torch.nn.Linear(H, H, bias=False)
            b.mlp_norm = torch.nn.Parameter(torch.ones(H))
            b.w_gate = torch.nn.Linear(H, F_, bias=False)
            b.w_up = torch.nn.Linear(H, F_, bias=False)
            b.w_down = torch.nn.Linear(F_, H, bias=False)
            self.blocks.append(b)
        self.final_norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def tensor(self, name):
        """The parameter tessera calls `name` (blocks.3.attn.wq, final_norm, ...)."""
        if name == "embedding":
            return self.embedding
        if name == "final_norm":
            return self.final_norm
        if name == "lm_head":
            return self.lm_head.weight
        _, l, *rest = name.split(".")
        b = self.blocks[int(l)]
        leaf = rest[-1]
        obj = getattr(b, leaf)
        return obj if isinstance(obj, torch.nn.Parameter) else obj.weight

    def rope(self, T, device):
        hd = self.c["dim"] // self.c["n_heads"]
        inv = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        return ang.cos().float(), ang.sin().float()

    @staticmethod
    def rms(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w

    @staticmethod
    def rotate(x, cos, sin):  # x (B, nh, T, hd): rotate-half form
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        c = torch.cat([cos, cos], -1)
        s = torch.cat([sin, sin], -1)
        return x * c + torch.cat([-x2, x1], -1) * s

    def forward(self, idx, targets):
        c = self.c
        B, T = idx.shape
        nh, nkv = c["n_heads"], c["n_kv_heads"]
        hd = c["dim"] // nh
        cos, sin = self.rope(T, idx.device)
        x = self.embedding[idx]
        for b in self.blocks:
            h = self.rms(x, b.attn_norm, c["norm_eps"])
            q = b.wq(h).view(B, T, nh, hd).transpose(1, 2)
            k = b.wk(h).view(B, T, nkv, hd).transpose(1, 2)
            v = b.wv(h).view(B, T, nkv, hd).transpose(1, 2)
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            if nkv != nh:
                k = k.repeat_interleave(nh // nkv, dim=1)
                v = v.repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + b.wo(a.transpose(1, 2).reshape(B, T, nh * hd))
            h = self.rms(x, b.mlp_norm, c["norm_eps"])
            x = x + b.w_down(F.silu(b.w_gate(h)) * b.w_up(h))
        x = self.rms(x, self.final_norm, c["norm_eps"])
        logits = self.lm_head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def load_peer(folder):
    with open(os.path.join(folder, "peer.json")) as f:
        peer = json.load(f)
    model = Llama(peer["config"])
    raw = open(os.path.join(folder, "weights.bin"), "rb").read()
    flat = torch.frombuffer(bytearray(raw), dtype=torch.float32)
    with torch.no_grad():
        for t in peer["tensors"]:
            n = math.prod(t["shape"])
            model.tensor(t["name"]).copy_(flat[t["offset"]:t["offset"] + n].view(t["shape"]))
    w = torch.tensor(peer["tokens"], dtype=torch.long).view(peer["B"], peer["T"] + 1)
    return peer, model, w[:, :-1].contiguous(), w[:, 1:].contiguous()


# ------------------------------------------------------------ PyTorch steps
def torch_steps(model, idx, tgt, bf16, warmup, steps, impl):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if impl == "fused" else {"foreach": True}))
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= warmup:
            times.append(dt)
    return statistics.median(times)


def tessera_steps(bin_path, case, warmup, steps, dump=None):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t.json")
        cmd = [bin_path, "--preset", case["preset"], "--precision", case["precision"],
               "--micro-batch", str(case["B"]), "--seq", str(case["T"]),
               "--warmup", str(warmup), "--steps", str(steps), "--json", out]
        if case.get("layers"):
            cmd += ["--layers", str(case["layers"])]
        if dump:
            cmd += ["--dump", dump]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"peer_pytorch: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
        with open(out) as f:
            return json.load(f)["median_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/host/benchmarks/peer_step"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks"))
    ap.add_argument("--quick", action="store_true", help="small preset only, 2 rounds")
    ap.add_argument("--case", default="", help="run only the cases whose name contains this")
    a = ap.parse_args()
    if a.rounds < 1 or a.threads < 1:
        print(f"peer_pytorch: --rounds {a.rounds} and --threads {a.threads} must be >= 1",
              file=sys.stderr)
        sys.exit(2)
    if not os.access(a.bin, os.X_OK):
        print(f"peer_pytorch: {a.bin} is missing: build the host preset first", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # No OMP_WAIT_POLICY of its own: PyTorch's OpenMP runtime read the
    # environment at import, so one set here would slow tessera's side only
    # (passive: every parallel region wakes its threads from sleep). One set
    # in the caller's environment applies to both.
    cases = [
        {"name": "small preset, fp32, G = B = 16, T = 128", "preset": "small",
         "precision": "fp32", "B": 16, "T": 128, "warmup": 3, "steps": 10},
        {"name": "small preset, bf16_mixed vs torch bf16 autocast", "preset": "small",
         "precision": "bf16_mixed", "B": 16, "T": 128, "warmup": 3, "steps": 10},
        {"name": "llama2_7b shapes, 1 layer, B = 1, T = 256, fp32", "preset": "llama2_7b",
         "layers": 1, "precision": "fp32", "B": 1, "T": 256, "warmup": 1, "steps": 2},
    ]
    rounds = a.rounds
    if a.quick:
        cases, rounds = cases[:1], min(rounds, 2)
    cases = [c for c in cases if a.case in c["name"]]
    if not cases:
        print(f"peer_pytorch: no case name contains --case '{a.case}'", file=sys.stderr)
        sys.exit(2)
    results = []
    for case in cases:
        bf16 = case["precision"] == "bf16_mixed"
        with tempfile.TemporaryDirectory() as d:
            tessera_steps(a.bin, case, 1, 1, dump=d)
            peer, model, idx, tgt = load_peer(d)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, tgt).item()
        rel = abs(loss - peer["loss"]) / abs(peer["loss"])
        tol = 2e-2 if bf16 else 1e-5
        print(f"peer_pytorch: {case['name']}: loss tessera {peer['loss']:.7f}, PyTorch {loss:.7f}, "
              f"relative difference {rel:.2e} (limit {tol:g})", flush=True)
        if not rel <= tol:
            sys.exit(f"peer_pytorch: the two models disagree on the same batch: not timed")
        state = {k: v.clone() for k, v in model.state_dict().items()}
        # Which AdamW is faster here: fused or foreach (one short run each).
        impls = {}
        for impl in ("fused", "foreach"):
            model.load_state_dict(state)
            impls[impl] = torch_steps(model, idx, tgt, bf16, 1, 2 if case["steps"] > 2 else 1, impl)
        impl = min(impls, key=impls.get)
        rows = []
        for r in range(rounds):
            t_s = tessera_steps(a.bin, case, case["warmup"], case["steps"])
            model.load_state_dict(state)
            p_s = torch_steps(model, idx, tgt, bf16, case["warmup"], case["steps"], impl)
            rows.append({"tessera_s": t_s, "pytorch_s": p_s, "speedup": p_s / t_s})
            print(f"peer_pytorch: {case['name']}: round {r + 1}/{rounds}: tessera {t_s:.4f} s, "
                  f"PyTorch ({impl} AdamW) {p_s:.4f} s, tessera/PyTorch tokens/s {p_s / t_s:.3f}",
                  flush=True)
        tokens = case["B"] * case["T"]
        t_med = statistics.median(x["tessera_s"] for x in rows)
        p_med = statistics.median(x["pytorch_s"] for x in rows)
        results.append({**case, "loss_tessera": peer["loss"], "loss_pytorch": loss,
                        "loss_rel_diff": rel, "pytorch_adamw": impl, "pytorch_adamw_trial_s": impls,
                        "rounds": rows, "tessera_median_s": t_med, "pytorch_median_s": p_med,
                        "tessera_tokens_per_s": tokens / t_med, "pytorch_tokens_per_s": tokens / p_med,
                        "speedup_median_of_rounds": statistics.median(x["speedup"] for x in rows),
                        "speedup_of_medians": p_med / t_med})
    meta = {"date": date.today().isoformat(), "threads": a.threads, "torch": torch.__version__,
            "rounds": rounds, "command": " ".join(["benchmarks/peer_pytorch.py"] + sys.argv[1:]),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                         if l.startswith("model name")), "unknown")}
    os.makedirs(a.out_dir, exist_ok=True)
    jpath = os.path.join(a.out_dir, "peer_pytorch.json")
    with open(jpath + ".tmp", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    os.replace(jpath + ".tmp", jpath)
    lines = [f"tessera against PyTorch {torch.__version__} eager, {a.threads} threads, {rounds} "
             f"interleaved rounds, {meta['date']} ({meta['cpu']}); `{meta['command']}`:", "",
             "| step | tessera, median (s) | PyTorch eager, median (s) | PyTorch AdamW | "
             "tessera/PyTorch tokens/s (median of rounds) | loss rel. diff |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['tessera_median_s']:.4f} | {r['pytorch_median_s']:.4f} | "
                     f"{r['pytorch_adamw']} | {r['speedup_median_of_rounds']:.2f} | "
                     f"{r['loss_rel_diff']:.1e} |")
    mpath = os.path.join(a.out_dir, "peer_pytorch.md")
    with open(mpath + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(mpath + ".tmp", mpath)
    print("\n".join(lines))
    print(f"peer_pytorch: wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
