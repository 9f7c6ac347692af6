#!/usr/bin/env python3
"""Records the reference Lion and Adafactor trajectories tessera's optimizer
tests hold it to (tests/optim/lion.cpp, tests/optim/adafactor.cpp).

  optimizer_reference.py make DIR    (needs torch, lion-pytorch and
                                     transformers) writes DIR/trajectories.json:
                                     three parameter tensors in float64 (a 7 x 5
                                     matrix, a norm gain of 6 whose weight decay
                                     is excluded, a 3 x 8 matrix), ten steps of
                                     seeded gradients, the learning rate of each
                                     step, and each run's parameters after every
                                     step: Lion from lion-pytorch
                                     (lion_pytorch.Lion) and
                                     transformers.optimization.Adafactor with
                                     scale_parameter, relative_step and
                                     warmup_init off, without (beta1=None) and
                                     with a first moment (beta1=0.9), all with
                                     weight decay > 0 in one param group and 0
                                     in another for the norm gain (as tessera's
                                     ranges' decay flag excludes it), plus
                                     Adafactor's row, column and vector
                                     statistics after every step and Lion's
                                     momentum after the last.

The committed copy is tests/python/fixtures/optimizers_fp64/trajectories.json
(`optimizer_reference.py make tests/python/fixtures/optimizers_fp64`, with
torch 2.15, transformers 5.25 and lion-pytorch 0.2.5).

Inputs are rounded to 6 significant digits before use, so the file holds
them exactly in a few characters each; outputs are written with Python's
repr, which reads back (nlohmann-json's strtod) as the same float64.

Before writing, it checks lion-pytorch against Lion as Algorithm 1 of Chen
et al. 2023 writes it (theta -= lr (sign(c) + lambda theta), tessera's
form), transcribed here in NumPy: lion-pytorch decays first,
theta *= 1 - lr lambda, then theta -= lr sign(c), the same value in
exact arithmetic but rounded differently; the two must agree to 1e-12
relative, and no update direction c may lie within rounding of 0 (where
the two orders could give a different sign) unless it is exactly 0.

Exit status 0 on success, 1 when a check fails, 2 on bad arguments, 77 when
torch, lion-pytorch or transformers is missing.
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import lion_pytorch
    import transformers
    from lion_pytorch import Lion
    from transformers.optimization import Adafactor
except ImportError as e:
    print(f"optimizer_reference: {e.name} is not installed "
          "(pip install torch lion-pytorch transformers): skipped")
    sys.exit(77)

SEED = 20261207
STEPS = 10
# name, shape, weight decay applies
TENSORS = [("w1", (7, 5), True), ("norm", (6,), False), ("w2", (3, 8), True)]
LION_LR = [1e-3, 2e-3, 3e-3, 3e-3, 2.5e-3, 2e-3, 1.5e-3, 1e-3, 5e-4, 1e-4]
ADAFACTOR_LR = [1e-2, 2e-2, 3e-2, 3e-2, 2.5e-2, 2e-2, 1.5e-2, 1e-2, 5e-3, 1e-3]


def six_digits(t):
    """t (float64) rounded to 6 significant digits, as the file stores it."""
    return torch.tensor([float(f"{x:.6g}") for x in t.flatten().tolist()],
                        dtype=torch.float64).reshape(t.shape)


def draw():
    """Initial parameters and ten steps of gradients (float64, 6 digits).
    Gradients span four decades (10^-3 to 10); one element of each tensor
    has an exact zero gradient at step 1, where Lion's direction is
    sign(0) = 0 and Adafactor's statistic is eps1."""
    gen = torch.Generator().manual_seed(SEED)
    params0 = [six_digits(torch.randn(s, dtype=torch.float64, generator=gen))
               for _, s, _ in TENSORS]
    grads = []
    for t in range(STEPS):
        step = []
        for _, s, _ in TENSORS:
            mag = 10.0 ** (4 * torch.rand(s, dtype=torch.float64, generator=gen) - 3)
            g = six_digits(torch.randn(s, dtype=torch.float64, generator=gen) * mag)
            if t == 0:
                g.view(-1)[2] = 0.0
            step.append(g)
        grads.append(step)
    return params0, grads


def groups(params, wd):
    """Two param groups: weight decay wd for the matrices, 0 for the norm gain."""
    return [{"params": [p for p, (_, _, d) in zip(params, TENSORS) if d], "weight_decay": wd},
            {"params": [p for p, (_, _, d) in zip(params, TENSORS) if not d], "weight_decay": 0.0}]


def flat(t):
    return t.detach().flatten().tolist()


def run(make, lrs, params0, grads, state_names):
    """Runs the optimizer `make(params)` for ten steps at `lrs`; returns each
    step's parameters and the named state of each tensor (None where a
    tensor has no such state)."""
    params = [p.clone().requires_grad_(True) for p in params0]
    opt = make(params)
    out = {"params": []}
    for name in state_names:
        out[name] = []
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lrs[t]
        for p, g in zip(params, grads[t]):
            p.grad = g.clone()
        opt.step()
        out["params"].append([flat(p) for p in params])
        for name in state_names:
            out[name].append([flat(opt.state[p][name]) if name in opt.state[p] else None
                              for p in params])
    return out


def lion_paper(params0, grads, lrs, beta1, beta2, wd):
    """Algorithm 1 of Chen et al. 2023 in NumPy float64 (tessera's form):
    c = beta1 m + (1 - beta1) g; theta -= lr (sign(c) + lambda theta);
    m = beta2 m + (1 - beta2) g. Returns each step's parameters and the
    smallest |c| that is not exactly 0, relative to |beta1 m| + |(1 - beta1) g|
    (the size of its rounding error)."""
    theta = [p.numpy().copy() for p in params0]
    m = [np.zeros_like(x) for x in theta]
    out, smallest = [], math.inf
    for t in range(STEPS):
        for i, (_, _, decays) in enumerate(TENSORS):
            g = grads[t][i].numpy()
            c = beta1 * m[i] + (1 - beta1) * g
            size = np.abs(beta1 * m[i]) + np.abs((1 - beta1) * g)
            nz = c != 0
            if nz.any():
                smallest = min(smallest, float(np.min(np.abs(c[nz]) / size[nz])))
            lam = wd if decays else 0.0
            theta[i] = theta[i] - lrs[t] * (np.sign(c) + lam * theta[i])
            m[i] = beta2 * m[i] + (1 - beta2) * g
        out.append([x.flatten().tolist() for x in theta])
    return out, smallest


def worst_rel(a, b):
    """Largest |a - b| / max(|b|, 1e-3) over nested per-step, per-tensor lists."""
    w = 0.0
    for sa, sb in zip(a, b):
        for ta, tb in zip(sa, sb):
            x, y = np.array(ta), np.array(tb)
            w = max(w, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-3))))
    return w


def make(d):
    torch.set_default_dtype(torch.float64)
    params0, grads = draw()
    runs = []

    lion = {"beta1": 0.9, "beta2": 0.99, "weight_decay": 1.0}
    got = run(lambda ps: Lion(groups(ps, lion["weight_decay"]), lr=LION_LR[0],
                              betas=(lion["beta1"], lion["beta2"])),
              LION_LR, params0, grads, ["exp_avg"])
    paper, smallest_c = lion_paper(params0, grads, LION_LR, lion["beta1"], lion["beta2"],
                                   lion["weight_decay"])
    err = worst_rel(got["params"], paper)
    print(f"optimizer_reference: lion-pytorch against Algorithm 1 (decay folded into the "
          f"step): worst relative difference {err:.3g}; smallest nonzero |c| {smallest_c:.3g} "
          "of its terms' size")
    if err > 1e-12 or smallest_c < 1e-9:
        print("optimizer_reference: lion-pytorch and the paper's form differ beyond rounding")
        return False
    runs.append({"name": "lion", "optimizer": "lion", "config": lion, "lr": LION_LR,
                 "params": got["params"], "exp_avg_final": got["exp_avg"][-1]})

    for name, beta1 in (("adafactor", None), ("adafactor_beta1", 0.9)):
        cfg = {"beta1": beta1, "clip_threshold": 1.0, "decay_rate": -0.8,
               "eps": [1e-30, 1e-3], "weight_decay": 0.1}
        got = run(lambda ps: Adafactor(groups(ps, cfg["weight_decay"]), lr=ADAFACTOR_LR[0],
                                       eps=tuple(cfg["eps"]), clip_threshold=cfg["clip_threshold"],
                                       decay_rate=cfg["decay_rate"], beta1=beta1,
                                       scale_parameter=False, relative_step=False,
                                       warmup_init=False),
                  ADAFACTOR_LR, params0, grads, ["exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"])
        runs.append({"name": name, "optimizer": "adafactor", "config": cfg, "lr": ADAFACTOR_LR,
                     **got})

    doc = {
        "generator": "tests/python/optimizer_reference.py make",
        "versions": {"torch": torch.__version__, "lion_pytorch": _version("lion-pytorch"),
                     "transformers": transformers.__version__},
        "seed": SEED,
        "tensors": [{"name": n, "shape": list(s), "decay": dec} for n, s, dec in TENSORS],
        "params0": [flat(p) for p in params0],
        "grads": [[flat(g) for g in step] for step in grads],
        "runs": runs,
    }
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "trajectories.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"optimizer_reference: wrote {path} ({os.path.getsize(path)} bytes)")
    return True


def _version(dist):
    from importlib.metadata import version
    return version(dist)


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        print(__doc__)
        sys.exit(2)
    sys.exit(0 if make(sys.argv[2]) else 1)


if __name__ == "__main__":
    main()
