"""Hugging Face model directories as transformers writes them, for the
checkpoint tests, from the formats' definitions and with no strata code:
safetensors files (8-byte little-endian header length, JSON header, data),
the shard split of huggingface_hub's split_state_dict_into_shards() and the
index save_pretrained() writes (json.dumps(indent=2, sort_keys=True) + "\\n").
Tensors are PyTorch's (Debian's python3-torch); transformers is not needed."""
import json
import struct


def _dtype_name(t):
    import torch  # only where tensors are made: reading needs no torch
    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.bool: "BOOL", torch.int32: "I32"}[t.dtype]


def tensor_bytes(t):
    import torch
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bit patterns
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch tensor), written in that order."""
    hdr, off, blobs = {}, 0, []
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, t in tensors:
        b = tensor_bytes(t)
        hdr[name] = {"dtype": _dtype_name(t), "shape": list(t.shape),
                     "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}, __metadata__ left out, and the
    names in data order."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
    out = {}
    for k in order:
        a, b = hdr[k]["data_offsets"]
        out[k] = (hdr[k]["dtype"], hdr[k]["shape"], raw[8 + n + a:8 + n + b])
    return out, order


def split(sizes, max_bytes):
    """huggingface_hub's split: [(name, size)] in order -> list of shards
    (lists of names) in the order they are appended."""
    shards, cur, cur_bytes = [], [], 0
    for name, size in sizes:
        if size > max_bytes:
            shards.append([name])
            continue
        if cur and cur_bytes + size > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += size
    if cur:
        shards.append(cur)
    return shards


def shard_names(n, stem="model"):
    if n == 1:
        return [stem + ".safetensors"]
    return ["%s-%05d-of-%05d.safetensors" % (stem, i + 1, n) for i in range(n)]


def index_text(weight_map, total_size):
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


def write_sharded(d, tensors, max_bytes, metadata=None):
    """Write tensors (list of (name, tensor)) into d as save_pretrained()
    does: one model.safetensors when it fits, else shards and the index.
    Returns the file names."""
    sizes = [(name, len(tensor_bytes(t))) for name, t in tensors]
    shards = split(sizes, max_bytes)
    names = shard_names(len(shards))
    by = dict(tensors)
    for fname, members in zip(names, shards):
        write_safetensors(f"{d}/{fname}", [(m, by[m]) for m in members], metadata)
    if len(shards) > 1:
        wm = {m: fname for fname, members in zip(names, shards) for m in members}
        with open(f"{d}/model.safetensors.index.json", "w") as f:
            f.write(index_text(wm, sum(s for _, s in sizes)))
    return names


def gpt2_config(L, C, H, V, T):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C,
            "n_layer": L, "n_head": H, "vocab_size": V, "n_positions": T, "n_ctx": T,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
            "tie_word_embeddings": True}


def gpt2_tensors(L, C, V, T, seed, dtype, buffers=True):
    """A GPT2LMHeadModel state_dict in its order, with transformers' names
    ("transformer." prefix, the tied lm_head.weight, and with buffers the
    attn.bias masks and attn.masked_bias of older files), random values."""
    import torch
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    out = [("transformer.wte.weight", r(V, C)), ("transformer.wpe.weight", r(T, C, std=0.01))]
    for l in range(L):
        p = f"transformer.h.{l}."
        out += [(p + "ln_1.weight", (1 + r(C, std=0.1).float()).to(dtype)),
                (p + "ln_1.bias", r(C))]
        if buffers:
            out += [(p + "attn.bias", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)),
                    (p + "attn.masked_bias", torch.tensor(-1e4, dtype=torch.float32))]
        out += [(p + "attn.c_attn.weight", r(C, 3 * C)), (p + "attn.c_attn.bias", r(3 * C)),
                (p + "attn.c_proj.weight", r(C, C)), (p + "attn.c_proj.bias", r(C)),
                (p + "ln_2.weight", (1 + r(C, std=0.1).float()).to(dtype)),
                (p + "ln_2.bias", r(C)),
                (p + "mlp.c_fc.weight", r(C, 4 * C)), (p + "mlp.c_fc.bias", r(4 * C)),
                (p + "mlp.c_proj.weight", r(4 * C, C)), (p + "mlp.c_proj.bias", r(C))]
    out += [("transformer.ln_f.weight", (1 + r(C, std=0.1).float()).to(dtype)),
            ("transformer.ln_f.bias", r(C))]
    out.append(("lm_head.weight", out[0][1]))
    return out


def llama_config(L, C, H, K, F, V, T, qwen=False, tied=False, theta=500000.0, scaling=None):
    """config.json as LlamaConfig / Qwen2Config.save_pretrained() write it
    (the keys strata reads and the ones around them)."""
    c = {"architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
         "model_type": "qwen2" if qwen else "llama", "hidden_size": C,
         "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
         "num_key_value_heads": K, "vocab_size": V, "max_position_embeddings": T,
         "rms_norm_eps": 1e-06 if qwen else 1e-05, "rope_theta": theta,
         "rope_scaling": scaling, "tie_word_embeddings": tied, "hidden_act": "silu",
         "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
         "transformers_version": "4.46.0"}
    if qwen:
        c.update({"use_sliding_window": False, "sliding_window": T, "max_window_layers": L,
                  "attention_dropout": 0.0})
    else:
        c.update({"attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
                  "pretraining_tp": 1, "bos_token_id": 1, "eos_token_id": 2})
    return c


def llama_tensors(L, C, H, K, F, V, seed, dtype, qwen=False, tied=False, buffers=False,
                  theta=10000.0):
    """A LlamaForCausalLM / Qwen2ForCausalLM state_dict in its order with
    transformers' names and random values: Qwen2's q/k/v biases, the tied
    lm_head.weight (a copy of embed_tokens) when tied, and with buffers
    the rotary_emb.inv_freq buffers older files hold."""
    import torch
    g = torch.Generator().manual_seed(seed)
    hd = C // H

    def r(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm():
        return (1 + r(C, std=0.1).float()).to(dtype)

    out = [("model.embed_tokens.weight", r(V, C, std=0.1))]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", r(H * hd, C, std=0.1))]
        if qwen:
            out += [(p + "self_attn.q_proj.bias", r(H * hd, std=0.1))]
        out += [(p + "self_attn.k_proj.weight", r(K * hd, C, std=0.1))]
        if qwen:
            out += [(p + "self_attn.k_proj.bias", r(K * hd, std=0.1))]
        out += [(p + "self_attn.v_proj.weight", r(K * hd, C, std=0.1))]
        if qwen:
            out += [(p + "self_attn.v_proj.bias", r(K * hd, std=0.1))]
        out += [(p + "self_attn.o_proj.weight", r(C, H * hd, std=0.1))]
        if buffers:
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
            out += [(p + "self_attn.rotary_emb.inv_freq", inv)]
        out += [(p + "mlp.gate_proj.weight", r(F, C, std=0.1)),
                (p + "mlp.up_proj.weight", r(F, C, std=0.1)),
                (p + "mlp.down_proj.weight", r(C, F, std=0.1)),
                (p + "input_layernorm.weight", norm()),
                (p + "post_attention_layernorm.weight", norm())]
    out += [("model.norm.weight", norm())]
    out.append(("lm_head.weight", out[0][1] if tied else r(V, C, std=0.1)))
    return out
