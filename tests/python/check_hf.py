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
                                 next-token loss (for hf_interop import);
                                 and DIR/llama3_rope_fp64, a Llama
                                 3.2-shaped model with rope_type "llama3"
                                 (factor 32, original context 64) in float64,
                                 whose expect.json holds transformers'
                                 float64 logits over 128 positions
                                 (make_llama3_rope), its float64 inverse
                                 frequencies, and its float32 logits; and
                                 DIR/llama3_2_tied_fp64, the same with tied
                                 embeddings (tie_word_embeddings, as Llama
                                 3.2 1B and 3B: no lm_head.weight saved)

A tied export (tie_word_embeddings true in config.json) must hold no
lm_head.weight, and transformers must build it tied: its LM head is the
embedding's tensor.

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


def rope_config(cfg):
    """(theta, rope scaling dict or None) of a config.json, in either of
    transformers' spellings: rope_theta and rope_scaling (< 5), or
    rope_parameters (5 on)."""
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise SystemExit(f"check_hf: rope_type {kind!r} is not checked here")
    return theta, scaling


def numpy_llama3_inv_freq(inv_freq, s):
    """Llama 3.1's frequency scaling, written from Meta's description
    (llama-models' apply_scaling): wavelengths 2 pi / f shorter than
    L / high_freq_factor are kept, longer than L / low_freq_factor divided
    by factor, and those between blended linearly in L / wavelength."""
    L = s["original_max_position_embeddings"]
    lo, hi, factor = s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    out = []
    for f in inv_freq:
        w = 2 * np.pi / f
        if w < L / hi:
            out.append(f)
        elif w > L / lo:
            out.append(f / factor)
        else:
            a = (L / w - lo) / (hi - lo)
            out.append((1 - a) * f / factor + a * f)
    return np.array(out)


def numpy_llama_logits(cfg, W, ids):
    """LlamaForCausalLM's forward pass in float64: (T, V) logits."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = H // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta, scaling = rope_config(cfg)
    T = len(ids)
    inv_freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if scaling is not None:
        inv_freq = numpy_llama3_inv_freq(inv_freq, scaling)
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
    tied = bool(cfg.get("tie_word_embeddings", False))
    ok = True
    if tied and "lm_head.weight" in W:
        print("check_hf: config.json ties the embeddings but the folder holds lm_head.weight")
        ok = False
    ok = compare("NumPy float64 forward of the safetensors", numpy_llama_logits(cfg, W, ids),
                 want, mean_loss(numpy_llama_logits(cfg, W, ids), ids), exp["loss"]) and ok
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
    if tied:  # transformers built one matrix: the head is the embedding
        same = m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
        print(f"check_hf: tie_word_embeddings {m.config.tie_word_embeddings}, LM head "
              f"{'is' if same else 'IS NOT'} the embedding's tensor in transformers")
        ok = ok and same and bool(m.config.tie_word_embeddings)
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
    ok = make_llama3_rope(os.path.join(d, "llama3_rope_fp64"))
    return make_llama3_rope(os.path.join(d, "llama3_2_tied_fp64"), tied=True) and ok


def transformers_llama3_inv_freq_float64(config):
    """transformers' _compute_llama3_parameters evaluated in float64: its
    module's `torch` is swapped, for the call, for one whose torch.float
    names float64, so its own expressions run on float64 base frequencies
    (they are float32 otherwise)."""
    import torch
    import transformers.modeling_rope_utils as mru

    class Float64Torch:
        float = torch.float64

        def __getattr__(self, name):
            return getattr(torch, name)

    saved = mru.torch
    mru.torch = Float64Torch()
    try:
        inv_freq, _ = mru._compute_llama3_parameters(config, None)
    finally:
        mru.torch = saved
    if inv_freq.dtype != torch.float64:
        raise SystemExit("check_hf: this transformers computes the llama3 frequencies in "
                         f"{inv_freq.dtype}, not float64")
    return inv_freq


def lift_float32_islands(model, inv_freq):
    """LlamaForCausalLM computes two things in float32 whatever the model's
    dtype: LlamaRMSNorm (it casts the input to float32) and
    LlamaRotaryEmbedding (its angles t * inv_freq, from float32 inverse
    frequencies). For a float64 reference, the same formulas in float64:
    x * rsqrt(mean(x^2) + eps) * weight, and cos/sin of t * inv_freq with
    transformers' own llama3 frequencies computed in float64."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    rot = model.model.rotary_emb
    rot.inv_freq = inv_freq

    def rope(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * rot.inv_freq.to(torch.float64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * rot.attention_scaling).to(x.dtype),
                (emb.sin() * rot.attention_scaling).to(x.dtype))

    rot.forward = rope
    for mod in model.modules():
        if isinstance(mod, LlamaRMSNorm):
            def norm(h, mod=mod):
                return mod.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) +
                                                     mod.variance_epsilon))
            mod.forward = norm


def make_llama3_rope(out, tied=False):
    """A Llama 3.2-shaped model (grouped-query, rope_theta 500000, llama3
    RoPE scaling with factor 32, low/high frequency factors 1 and 4) at a
    small size: hd 16, so its 8 frequencies fall in all three bands of the
    scaling for an original context of 64 (wavelengths 6.3 < 16: kept; 32.4
    in [16, 64]: blended; 167 and longer: divided by 32). Saved in float64
    by save_pretrained; expect.json holds the 128 tokens (positions 64 to
    127 lie past original_max_position_embeddings), transformers' float64
    logits (lift_float32_islands) and their loss, the float64 inverse
    frequencies, and under "float32" the logits and loss of the folder
    loaded as it stands in float32. `tied`: tie_word_embeddings, as Llama
    3.2 1B and 3B (another seed: other weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3212 if tied else 3202)
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=32,
                      max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling=scaling, tie_word_embeddings=tied, initializer_range=0.1,
                      attn_implementation="sdpa")
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    m = m.to(torch.float64)
    m.save_pretrained(out, safe_serialization=True)
    if tied and m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr():
        raise SystemExit("check_hf: transformers did not tie the LM head to the embedding")
    g = torch.Generator().manual_seed(64)
    ids = torch.randint(0, 32, (128,), generator=g)
    m64 = LlamaForCausalLM.from_pretrained(out, dtype=torch.float64,
                                           attn_implementation="sdpa").eval()
    inv_freq = transformers_llama3_inv_freq_float64(m64.config)
    lift_float32_islands(m64, inv_freq)
    m32 = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        r64 = m64(ids[None], labels=ids[None])
        r32 = m32(ids[None], labels=ids[None])
    # The float64 reference against the independent NumPy forward pass of
    # the same files (numpy_llama_logits): 1e-12 of the largest logit.
    with open(os.path.join(out, "config.json")) as f:
        saved_cfg = json.load(f)
    _, W = load_folder(out)
    ref = numpy_llama_logits(saved_cfg, W, ids.numpy())
    got = r64.logits[0].numpy()
    err = float(np.max(np.abs(ref - got))) / float(np.max(np.abs(ref)))
    print(f"check_hf: llama3 float64 reference vs the NumPy forward pass: {err:.2e}")
    if err > 1e-12:
        raise SystemExit("check_hf: transformers' float64 logits differ from NumPy's")
    # The loss of the float64 logits (transformers' loss_function casts
    # the logits to float32 first).
    with open(os.path.join(out, "expect.json"), "w") as f:
        json.dump({"tokens": ids.tolist(),
                   "logits": [[float(x) for x in row] for row in r64.logits[0].tolist()],
                   "loss": mean_loss(got, ids.numpy()),
                   "inv_freq": [float(x) for x in inv_freq.tolist()],
                   "float32": {
                       "logits": [[float(f"{x:.9g}") for x in row]
                                  for row in r32.logits[0].tolist()],
                       "loss": float(r32.loss)}}, f)
    print(f"check_hf: saved {out} (float64, llama3 RoPE scaling, tied {tied}, "
          f"{saved_cfg.get('transformers_version')})")
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
