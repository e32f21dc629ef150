"""The RoPE-scaling fixtures: existing fixture models with <arch>.rope.scaling.* keys added,
and an independent NumPy forward pass with the scaling (from the YaRN paper and Hugging Face's
formulation) to cross-check llama.cpp's reference logits for them.

  PYTHONPATH=LLAMA_CPP/gguf-py python3 rope_scaling.py make DIR        # writes the .gguf files
  golden DIR/M.gguf ids64.txt 32 DIR/M                                  # llama.cpp's logits (README)
  PYTHONPATH=LLAMA_CPP/gguf-py python3 rope_scaling.py check DIR        # NumPy against them
  PYTHONPATH=LLAMA_CPP/gguf-py python3 rope_scaling.py reference DIR    # NumPy's own logits, for the
      fixtures whose keys llama.cpp does not read (yarn_beta_fast, yarn_beta_slow, yarn_attn_factor)

Needs NumPy (Debian python3-numpy) and llama.cpp's gguf-py; neither is needed by the tests.
"""
import math, sys
import numpy as np
import gguf

# name: (source fixture, architecture, keys added or replaced under "<arch>.")
FIXTURES = {
    "qwen2-yarn": ("qwen2-bias", "qwen2", {
        "context_length": (gguf.GGUFValueType.UINT32, 16384),
        "rope.scaling.type": (gguf.GGUFValueType.STRING, "yarn"),
        "rope.scaling.factor": (gguf.GGUFValueType.FLOAT32, 4.0),
        "rope.scaling.original_context_length": (gguf.GGUFValueType.UINT32, 4096),
    }),
    # the keys llama.cpp's converter writes from a Hugging Face YaRN configuration with beta_fast,
    # beta_slow and attention_factor, which its loader does not read for these architectures: the
    # reference logits are NumPy's (`reference`)
    "qwen2-yarn-betas": ("qwen2-bias", "qwen2", {
        "context_length": (gguf.GGUFValueType.UINT32, 16384),
        "rope.scaling.type": (gguf.GGUFValueType.STRING, "yarn"),
        "rope.scaling.factor": (gguf.GGUFValueType.FLOAT32, 4.0),
        "rope.scaling.original_context_length": (gguf.GGUFValueType.UINT32, 4096),
        "rope.scaling.yarn_beta_fast": (gguf.GGUFValueType.FLOAT32, 16.0),
        "rope.scaling.yarn_beta_slow": (gguf.GGUFValueType.FLOAT32, 2.0),
        "rope.scaling.yarn_attn_factor": (gguf.GGUFValueType.FLOAT32, 1.2),
    }),
    "llama-linear": ("llama-gqa", "llama", {
        "rope.scaling.type": (gguf.GGUFValueType.STRING, "linear"),
        "rope.scaling.factor": (gguf.GGUFValueType.FLOAT32, 2.0),
        "rope.scaling.attn_factor": (gguf.GGUFValueType.FLOAT32, 0.9),
    }),
}


def make(dir_):
    for name, (src, arch, keys) in FIXTURES.items():
        r = gguf.GGUFReader(f"{dir_}/{src}.gguf")
        w = gguf.GGUFWriter(f"{dir_}/{name}.gguf", arch)
        new = {f"{arch}.{k}": v for k, v in keys.items()}
        for field in r.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF."):
                continue
            t = field.types[0]
            sub = field.types[-1] if t == gguf.GGUFValueType.ARRAY else None
            if field.name in new:
                t, val = new.pop(field.name)
                sub = None
            else:
                val = field.contents()
            w.add_key_value(field.name, val, t, sub_type=sub)
        for k, (t, val) in new.items():
            w.add_key_value(k, val, t)
        for t in r.tensors:
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in r.tensors:
            w.write_tensor_data(t.data)
        w.close()
        print("wrote", name)


def load(path):
    r = gguf.GGUFReader(path)
    T = {t.name: np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
         if len(t.shape) > 1 else np.array(t.data, dtype=np.float32) for t in r.tensors}
    f = lambda k: r.fields[k].contents() if k in r.fields else None
    arch = f("general.architecture")
    c = dict(arch=arch, L=f(f"{arch}.block_count"), H=f(f"{arch}.attention.head_count"),
             KV=f(f"{arch}.attention.head_count_kv"), eps=f(f"{arch}.attention.layer_norm_rms_epsilon"),
             theta=f(f"{arch}.rope.freq_base"), d=f(f"{arch}.embedding_length"),
             ctx=f(f"{arch}.context_length"), type=f(f"{arch}.rope.scaling.type") or "linear",
             factor=f(f"{arch}.rope.scaling.factor") or 1.0,
             orig=f(f"{arch}.rope.scaling.original_context_length") or f(f"{arch}.context_length"),
             attn=f(f"{arch}.rope.scaling.attn_factor") or 1.0,
             beta_fast=f(f"{arch}.rope.scaling.yarn_beta_fast") or 32.0,
             beta_slow=f(f"{arch}.rope.scaling.yarn_beta_slow") or 1.0,
             attention_factor=f(f"{arch}.rope.scaling.yarn_attn_factor"))
    kl = f(f"{arch}.attention.key_length")
    c["hd"] = int(kl) if kl is not None else c["d"] // c["H"]
    return T, c


def inv_freq_and_scale(c, T):
    """Frequencies per rotated pair and the magnitude of cos and sin."""
    hd, base, factor = c["hd"], c["theta"], c["factor"]
    inv = 1.0 / base ** (np.arange(0, hd, 2) / hd)
    if "rope_freqs.weight" in T:
        inv = inv / T["rope_freqs.weight"]
    if c["type"] == "none":
        return inv, c["attn"]
    if c["type"] == "linear":
        return inv / factor, c["attn"]
    assert c["type"] == "yarn"
    # YaRN: the correction range in pair indices, from the wavelengths that turn beta_fast = 32
    # and beta_slow = 1 times over the original context; extrapolate (keep) below it, interpolate
    # (divide by factor) above it, blend linearly inside it.
    dim = lambda turns: hd * math.log(c["orig"] / (turns * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(dim(c["beta_fast"])), 0), min(math.ceil(dim(c["beta_slow"])), hd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(hd // 2) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    inv = (inv / factor) * (1 - keep) + inv * keep
    magnitude = c["attention_factor"] or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv, c["attn"] * magnitude


def forward(T, c, ids):
    n = len(ids); hd, H, KV = c["hd"], c["H"], c["KV"]
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * w
    inv, mscale = inv_freq_and_scale(c, T)
    ang = np.outer(np.arange(n), inv); cos, sin = np.cos(ang) * mscale, np.sin(ang) * mscale
    neox = c["arch"] in ("qwen2", "qwen3")

    def rope(x):  # n, heads, hd
        cc, ss = cos[:, None, :], sin[:, None, :]
        if neox:
            a, b = x[..., :hd // 2], x[..., hd // 2:]
            return np.concatenate([a * cc - b * ss, a * ss + b * cc], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x); out[..., 0::2] = a * cc - b * ss; out[..., 1::2] = a * ss + b * cc
        return out

    x = T["token_embd.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(c["L"]):
        p = f"blk.{l}."; y = rms(x, T[p + "attn_norm.weight"])
        q = y @ T[p + "attn_q.weight"].T; k = y @ T[p + "attn_k.weight"].T; v = y @ T[p + "attn_v.weight"].T
        if p + "attn_q.bias" in T:
            q += T[p + "attn_q.bias"]; k += T[p + "attn_k.bias"]; v += T[p + "attn_v.bias"]
        q = q.reshape(n, H, hd); k = k.reshape(n, KV, hd); v = v.reshape(n, KV, hd)
        q, k = rope(q), rope(k)
        k = np.repeat(k, H // KV, 1); v = np.repeat(v, H // KV, 1)
        a = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        a = np.exp(a - a.max(-1, keepdims=True)); a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(n, H * hd)
        x = x + o @ T[p + "attn_output.weight"].T
        y = rms(x, T[p + "ffn_norm.weight"]); g = y @ T[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (y @ T[p + "ffn_up.weight"].T)) @ T[p + "ffn_down.weight"].T
    x = rms(x, T["output_norm.weight"])
    return x @ T.get("output.weight", T["token_embd.weight"]).T


NUMPY_REFERENCE = {"qwen2-yarn-betas"}


def reference(dir_):
    """NAME.tokens.txt and NAME.logits.f32 as golden.c writes them, from NumPy: the source's 64
    prompt ids, 32 greedy ids, (64 + 32) rows of float32 logits."""
    for name in NUMPY_REFERENCE:
        src = FIXTURES[name][0]
        T, c = load(f"{dir_}/{name}.gguf")
        prompt = [int(t) for t in open(f"{dir_}/{src}.tokens.txt").read().split("\n")[0].split()]
        ids = list(prompt)
        for _ in range(32):
            ids.append(int(forward(T, c, ids)[-1].argmax()))
        logits = forward(T, c, ids)
        # row i: the logits after token i; golden.c writes 64 + 32 rows, the last after the 32nd greedy id
        logits.astype(np.float32).tofile(f"{dir_}/{name}.logits.f32")
        with open(f"{dir_}/{name}.tokens.txt", "w") as f:
            f.write(" ".join(map(str, prompt)) + "\n" + " ".join(map(str, ids[64:])) + "\n")
        print("wrote", name, "reference")


def check(dir_):
    for name, (src, _, _) in FIXTURES.items():
        if name in NUMPY_REFERENCE:
            continue
        T, c = load(f"{dir_}/{name}.gguf")
        lines = open(f"{dir_}/{name}.tokens.txt").read().split("\n")
        ids = [int(t) for t in lines[0].split()] + [int(t) for t in lines[1].split()]
        ref = forward(T, c, ids)
        gold = np.fromfile(f"{dir_}/{name}.logits.f32", dtype=np.float32).reshape(len(ids), -1)
        base = np.fromfile(f"{dir_}/{src}.logits.f32", dtype=np.float32).reshape(len(ids), -1)
        err = np.abs(ref - gold).max() / np.abs(ref).max()
        moved = np.abs(base[:64] - gold[:64]).max() / np.abs(gold).max()
        print(f"{name}: max rel err vs llama.cpp {err:.2e}, argmax agree {(ref.argmax(-1) == gold.argmax(-1)).mean():.3f};"
              f" prompt logits moved by the scaling {moved:.2e} of the largest")


if __name__ == "__main__":
    {"make": make, "check": check, "reference": reference}[sys.argv[1]](sys.argv[2])
