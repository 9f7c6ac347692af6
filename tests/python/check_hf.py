#!/usr/bin/env python3
"""Checks tessera's Hugging Face checkpoints from the Python side.

  check_hf.py check-export DIR   DIR is a tessera export (hf_interop export):
                                 reads its safetensors with the `safetensors`
                                 package, runs an independent float64 NumPy
                                 forward pass of LlamaForCausalLM's equations
                                 and, when transformers is installed, loads
                                 DIR with LlamaForCausalLM in float32; both
                                 must give tessera's logits on the fixed
                                 sequence (DIR/tessera_expect.json) to 1e-5
                                 of the largest logit, and its loss
  check_hf.py make DIR           (needs transformers) saves small random
                                 grouped-query LlamaForCausalLM models with
                                 save_pretrained under DIR/fp32 (one file) and
                                 DIR/bf16_tied_sharded (bfloat16, tied
                                 embeddings, shards), each with expect.json:
                                 a fixed sequence, transformers' float32
                                 logits at each position and the mean
                                 next-token loss (for hf_interop import)

Exit status 0 when everything agrees, 1 when something differs, 2 on bad
input, 77 when numpy or safetensors is missing (the check is skipped).
"""
import glob
import json
import os
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:  # the ctest driver reports this as skipped
    print(f"check_hf: {e.name} is not installed (pip install numpy safetensors): skipped")
    sys.exit(77)


def load_folder(d):
    """config.json and every tensor of the folder's safetensors (float64)."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    tensors = {}
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise SystemExit(f"check_hf: no safetensors in {d}")
    for path in files:
        for k, v in load_file(path).items():
            tensors[k] = v.astype(np.float64)
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        if set(wm) != set(tensors):
            raise SystemExit(f"check_hf: {index} lists {sorted(set(wm) ^ set(tensors))} "
                             "differently from the files")
    return cfg, tensors


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def numpy_llama_logits(cfg, W, ids):
    """LlamaForCausalLM's forward pass in float64: (T, V) logits."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = H // nh
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    T = len(ids)
    inv_freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]

    def rope(x):  # rotate-half, (T, heads, hd)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], axis=-1) * sin

    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd))
        k = rope((h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd))
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        k = np.repeat(k, nh // nkv, axis=1)  # query head j uses key/value head j // (nh/nkv)
        v = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def mean_loss(logits, ids):
    z = logits[:-1] - logits[:-1].max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    return float(np.mean(lse - z[np.arange(len(ids) - 1), ids[1:]]))


def compare(name, got, want, loss, want_loss):
    err = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    lrel = abs(loss - want_loss) / want_loss
    ok = err <= 1e-5 * scale and lrel <= 1e-5
    print(f"check_hf: {name}: logits max error {err:.3g} of the largest {scale:.3g} "
          f"({err / scale:.2e}), loss {loss:.9f} vs tessera's {want_loss:.9f} ({lrel:.2e}) "
          f"{'ok' if ok else 'DIFFERS'}")
    return ok


def check_export(d):
    with open(os.path.join(d, "tessera_expect.json")) as f:
        exp = json.load(f)
    ids = np.array(exp["tokens"])
    want = np.array(exp["logits"], dtype=np.float64)
    cfg, W = load_folder(d)
    ok = compare("NumPy float64 forward of the safetensors", numpy_llama_logits(cfg, W, ids),
                 want, mean_loss(numpy_llama_logits(cfg, W, ids), ids), exp["loss"])
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError:
        print("check_hf: transformers is not installed: LlamaForCausalLM not checked")
        return ok
    m = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = m(torch.tensor(ids)[None], labels=torch.tensor(ids)[None])
    got = out.logits[0].double().numpy()
    ok = compare("transformers LlamaForCausalLM (float32)", got, want, float(out.loss),
                 exp["loss"]) and ok
    return ok


def make(d):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def save(sub, dtype, tied, shard):
        torch.manual_seed(1234 + len(sub))
        cfg = LlamaConfig(hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                          max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                          tie_word_embeddings=tied, initializer_range=0.1)
        m = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # norm gains off 1, so a misplaced norm shows
            for n, p in m.named_parameters():
                if "norm" in n:
                    p.copy_(1 + 0.3 * torch.randn_like(p))
        m = m.to(dtype)
        out = os.path.join(d, sub)
        m.save_pretrained(out, safe_serialization=True, max_shard_size=shard)
        ids = torch.tensor([(i * 37 + 11) % 128 for i in range(20)])
        # The reference: the saved files loaded afresh in float32 (a model
        # cast with .to() would keep RoPE's inv_freq buffer rounded to bf16).
        m32 = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            r = m32(ids[None], labels=ids[None])
        with open(os.path.join(out, "expect.json"), "w") as f:
            logits = [[float(f"{x:.9g}") for x in row] for row in r.logits[0].tolist()]
            json.dump({"tokens": ids.tolist(), "logits": logits, "loss": float(r.loss)}, f)
        print(f"check_hf: saved {out} ({dtype}, tied {tied}, "
              f"{len(glob.glob(os.path.join(out, '*.safetensors')))} file(s))")

    save("fp32", torch.float32, False, "5GB")
    save("bf16_tied_sharded", torch.bfloat16, True, "8KB")
    return True


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check-export", "make"):
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[2]
    if not os.path.isdir(d) and sys.argv[1] == "check-export":
        print(f"check_hf: {d} is not a folder", file=sys.stderr)
        return 2
    ok = check_export(d) if sys.argv[1] == "check-export" else make(d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
