"""A LLaMA in plain PyTorch with Hugging Face's modeling semantics
(LlamaForCausalLM, Qwen2ForCausalLM), for tools/torch-ref check: strata's
training steps on a random-init LLaMA shape (--model llama:...) held to
the same steps here, with torch.optim.AdamW.

Written from transformers' modeling_llama / modeling_qwen2 and
modeling_rope_utils as they define the model, not from strata's code:
nn.Linear weights (out, in); RMSNorm in fp32, weight * (x * rsqrt(mean(x^2)
+ eps)); rotary embeddings with inv_freq = 1 / theta^(arange(0, hd, 2) /
hd) in fp32, rope_scaling "linear" (inv_freq / factor) and "llama3"
(_compute_llama3_parameters), cos/sin of cat(freqs, freqs), q * cos +
rotate_half(q) * sin; repeat_kv for grouped-query attention, causal
softmax(q k^T / sqrt(hd)) v; down_proj(silu(gate_proj(x)) * up_proj(x));
q/k/v biases (Qwen2), no o_proj bias; lm_head tied to embed_tokens or
its own."""
import math
import os
import shutil
import struct
import sys
import tempfile

KEYS = ("layers", "dim", "heads", "kv-heads", "ffn", "vocab", "ctx")


class Cfg:
    pass


def parse(text, fail2):
    """--model llama:layers=L,dim=C,heads=H,kv-heads=K,ffn=F,vocab=V,ctx=T
    [,head-dim=D,rope-theta=X,tied=0|1,bias=0|1,eps=X,rope-scaling=...], as
    strata reads it (docs/model.md)."""
    body = text[len("llama:"):]
    try:
        kv = dict(item.split("=", 1) for item in body.split(","))
        c = Cfg()
        c.L, c.C, c.H, c.K, c.F, c.V, c.ctx = (int(kv.pop(k)) for k in KEYS)
        c.hd = int(kv.pop("head-dim", c.C // c.H))
        c.theta = float(kv.pop("rope-theta", 10000.0))
        c.tied = kv.pop("tied", "0") == "1"
        c.bias = kv.pop("bias", "0") == "1"
        c.eps = float(kv.pop("eps", 1e-5))
        c.scaling = None
        sc = kv.pop("rope-scaling", None)
        if sc:
            parts = sc.split(":")
            if parts[0] == "linear" and len(parts) == 2:
                c.scaling = ("linear", float(parts[1]))
            elif parts[0] == "llama3" and len(parts) == 5:
                c.scaling = ("llama3", float(parts[1]), float(parts[2]), float(parts[3]),
                             int(parts[4]))
            else:
                raise ValueError(sc)
        if kv:
            raise KeyError(sorted(kv))
    except (ValueError, KeyError) as e:
        fail2(f"--model {text}: llama:layers=L,dim=C,heads=H,kv-heads=K,ffn=F,vocab=V,ctx=T"
              f"[,head-dim=D,rope-theta=X,tied=0|1,bias=0|1,eps=X,rope-scaling=...] ({e})")
    if min(c.L, c.C, c.H, c.K, c.F, c.V, c.ctx, c.hd) < 1 or c.H % c.K or c.hd % 2:
        fail2(f"--model {text}: dims must be positive, kv-heads divide heads, head-dim even")
    return c


def names(c):
    """Hugging Face's tensor names, in strata's layout order."""
    out = ["model.embed_tokens.weight"]
    for i in range(c.L):
        q = f"model.layers.{i}."
        out.append(q + "input_layernorm.weight")
        for proj in ("q", "k", "v"):
            out.append(q + f"self_attn.{proj}_proj.weight")
            if c.bias:
                out.append(q + f"self_attn.{proj}_proj.bias")
        out += [q + "self_attn.o_proj.weight", q + "post_attention_layernorm.weight",
                q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight", q + "mlp.down_proj.weight"]
    out.append("model.norm.weight")
    if not c.tied:
        out.append("lm_head.weight")
    return out


def decayed(name):
    """strata decays the matrices and the embedding, not norms or biases."""
    return name.endswith(".weight") and "norm" not in name


def inv_freq(torch, c):
    """modeling_rope_utils: _compute_default_rope_parameters, then linear
    or llama3 scaling."""
    inv = 1.0 / (c.theta ** (torch.arange(0, c.hd, 2, dtype=torch.int64).float() / c.hd))
    if c.scaling and c.scaling[0] == "linear":
        inv = inv / c.scaling[1]
    elif c.scaling and c.scaling[0] == "llama3":
        _, factor, low, high, old_ctx = c.scaling
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def rotate_half(torch, x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(torch, x, w, eps):
    v = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(v + eps))


def logits(torch, p, c, idx, seg=None):
    """The logits (B,T,V) of idx (B,T); seg (B,T): query t attends to keys
    [seg[t], t] only (packed documents, a block-diagonal causal mask), the
    positions still 0..T-1."""
    F = torch.nn.functional
    B, T = idx.shape
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = pos[:, None] * inv_freq(torch, c)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (T, hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if seg is not None:
        mask = (mask[None] & (torch.arange(T)[None, None, :] >= seg[:, :, None]))[:, None]
    x = p["model.embed_tokens.weight"][idx]
    for i in range(c.L):
        q = f"model.layers.{i}."
        h = rms_norm(torch, x, p[q + "input_layernorm.weight"], c.eps)
        def proj(n, heads):
            b = p.get(q + f"self_attn.{n}_proj.bias")
            return F.linear(h, p[q + f"self_attn.{n}_proj.weight"], b).view(
                B, T, heads, c.hd).transpose(1, 2)
        qh, kh, vh = proj("q", c.H), proj("k", c.K), proj("v", c.K)
        qh = qh * cos + rotate_half(torch, qh) * sin
        kh = kh * cos + rotate_half(torch, kh) * sin
        rep = c.H // c.K  # repeat_kv
        kh = kh[:, :, None].expand(B, c.K, rep, T, c.hd).reshape(B, c.H, T, c.hd)
        vh = vh[:, :, None].expand(B, c.K, rep, T, c.hd).reshape(B, c.H, T, c.hd)
        att = (qh @ kh.transpose(-2, -1)) / math.sqrt(c.hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ vh).transpose(1, 2).reshape(B, T, c.H * c.hd)
        x = x + F.linear(y, p[q + "self_attn.o_proj.weight"])
        h = rms_norm(torch, x, p[q + "post_attention_layernorm.weight"], c.eps)
        g = F.silu(F.linear(h, p[q + "mlp.gate_proj.weight"]))
        x = x + F.linear(g * F.linear(h, p[q + "mlp.up_proj.weight"]),
                         p[q + "mlp.down_proj.weight"])
    x = rms_norm(torch, x, p["model.norm.weight"], c.eps)
    return F.linear(x, p["model.embed_tokens.weight" if c.tied else "lm_head.weight"])


def loss(torch, p, c, idx, targets):
    out = logits(torch, p, c, idx)
    return torch.nn.functional.cross_entropy(out.reshape(-1, c.V), targets.reshape(-1))


def loss_sum(torch, p, c, idx, labels, seg=None):
    """The sum of the cross-entropy over the labels that are not -100 (a
    loss mask, as transformers' labels)."""
    out = logits(torch, p, c, idx, seg)
    return torch.nn.functional.cross_entropy(out.reshape(-1, c.V), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")


def mask_of(n):
    """A loss mask over n tokens: "prompts" of 23 tokens, then 11 counted."""
    return bytes(1 if i % 34 >= 23 else 0 for i in range(n))


def write_masked_shard(path, tokens, mask):
    """An llm.c shard with strata's extension (docs/formats.md, "Token
    datasets"): header [3] = "STRA", [4] = flags 1 (a loss mask), the
    tokenizer hash and document count 0; the uint16 tokens, then one mask
    byte per token."""
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2], hdr[3], hdr[4] = 20240520, 1, len(tokens), 0x41525453, 1
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        f.write(mask)
    return path


def masked_batch(torch, tokens, mask, B, T, step):
    """llm.c's contiguous batch of loader step `step`, and its labels: the
    target of input j of a row starting at s is -100 where mask[s+1+j] is 0."""
    n = len(tokens)
    x, y = [], []
    for b in range(B):
        s = (step * B + b) * T
        x.append([tokens[(s + j) % n] for j in range(T)])
        y.append([tokens[(s + j + 1) % n] if mask[(s + j + 1) % n] else -100
                  for j in range(T)])
    return torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)


def check_one(torch, args, precision, ref):
    """tools/torch-ref's check_one for a LLaMA: strata trains 6 steps from
    its random init and saves; from that checkpoint (--init) it trains
    --steps more with llm.c's contiguous batches; PyTorch runs the same
    steps from the same model.safetensors. ref is the torch-ref module
    (its runner, readers and table)."""
    c = parse(args.model, ref.fail2)
    model = args.model
    B, T, steps = 4, min(32, c.ctx), args.steps
    # --mask: the steps on a masked shard, 2 micro-batches of 2 rows each,
    # the loss the mean over the step's counted targets (docs/finetune.md)
    masked = getattr(args, "mask", False)
    A = 2 if masked else 1
    # --packing: short documents packed in rows, attention kept to each
    packing = getattr(args, "packing", False)
    bf16 = precision == "bf16"
    lr, wd, betas, eps = 1e-2, 0.5, (0.9, 0.95), 1e-3  # as GPT-2's check, for the same reasons
    work = tempfile.mkdtemp(prefix="torch-ref-llama.", dir=args.work)
    try:
        data = ref.write_text(os.path.join(work, "data.txt"))
        common = ref.strata_train(args, model, data, B, T, work)
        ref.run(common + ["--steps", "6", "--lr", "1e-2", "--save", os.path.join(work, "a")],
                os.path.join(work, "a.log"))
        init = os.path.join(work, "a", "latest")
        metrics = os.path.join(work, "m.jsonl")
        tokens = ref.read_tokens(data)
        mask = mask_of(len(tokens))
        if masked:
            shard = write_masked_shard(os.path.join(work, "masked.bin"), tokens, mask)
            common = ref.strata_train(args, model, shard, B // A, T, work) + [
                "--grad-accum", str(A)]
        if packing:
            starts = ref.doc_starts(len(tokens))
            shard = ref.write_docs_shard(os.path.join(work, "docs.bin"), tokens, starts)
            common = ref.strata_train(args, model, shard, B, T, work) + [
                "--samples", "documents", "--packing", "isolated"]
        ref.run(common + ["--init", init, "--steps", str(steps), "--shuffle", "off",
                          "--precision", precision, "--lr", str(lr), "--lr-schedule",
                          "constant", "--warmup", "0", "--clip", "0", "--wd", str(wd),
                          "--beta1", str(betas[0]), "--beta2", str(betas[1]), "--eps", str(eps),
                          "--metrics", metrics, "--save", os.path.join(work, "b")],
                os.path.join(work, "b.log"))
        with open(metrics) as f:
            rows = [ref.read_metrics_row(line) for line in f if line.strip()]
        p0 = ref.read_safetensors(torch, os.path.join(init, "model.safetensors"))
        p_strata = ref.read_safetensors(torch, os.path.join(work, "b", "latest",
                                                            "model.safetensors"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    ns = names(c)
    if sorted(p0) != sorted(ns):
        print(f"FAIL names: the checkpoint has {sorted(set(p0) ^ set(ns))} beyond or short "
              "of Hugging Face's", file=sys.stderr)
        return 1
    p = {n: p0[n].clone().requires_grad_(True) for n in ns}
    opt = torch.optim.AdamW([{"params": [p[n] for n in ns if decayed(n)], "weight_decay": wd},
                             {"params": [p[n] for n in ns if not decayed(n)],
                              "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)
    if len(rows) != steps:
        print(f"FAIL metrics: {len(rows)} rows, want {steps}", file=sys.stderr)
        return 1
    table = ref.Table()
    batches = ref.doc_batches(torch, tokens, starts, B, T, steps) if packing else None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        if bf16:
            w = {n: p[n].detach().bfloat16().float().requires_grad_(True) for n in ns}
        else:
            w = p
        if masked:  # the step's counted targets over its A micro-batches
            mbs = [masked_batch(torch, tokens, mask, B // A, T, s * A + a) for a in range(A)]
            count = sum(int((y != -100).sum()) for _, y in mbs)
            lv = sum(loss_sum(torch, w, c, x, y) for x, y in mbs) / count
        elif packing:  # the mean over the counted targets, as labels -100
            x, y, seg = batches[s]
            lv = loss_sum(torch, w, c, x, y, seg) / max(int((y != -100).sum()), 1)
        else:
            x, y = ref.contiguous_batch(torch, tokens, B, T, s)
            lv = loss(torch, w, c, x, y)
        lv.backward()
        if bf16:
            for n in ns:
                p[n].grad = w[n].grad
        bar = 1e-6 if s == 0 else 1e-4
        table.scalar(f"step {s + 1} loss", rows[s]["loss"], float(lv), bar)
        table.scalar(f"step {s + 1} gradient norm", rows[s]["grad_norm"],
                     ref.grad_norm(p.values()), bar)
        opt.step()
    worst, worst_name = 0.0, ""
    for n in ns:
        e = ref.rel(p_strata[n] - p0[n], p[n].detach() - p0[n])
        if math.isnan(e) or e > worst:
            worst, worst_name = e, n
            if math.isnan(e):
                break
    total = ref.rel(torch.cat([(p_strata[n] - p0[n]).flatten() for n in ns]),
                    torch.cat([(p[n].detach() - p0[n]).flatten() for n in ns]))
    bar_total, bar_worst = (1e-4, 3e-4) if bf16 else (3e-5, 1e-4)
    table.row("update, all tensors", "", total, bar_total)
    table.row("update, worst tensor", f"{worst_name[-28:]:>29}", worst, bar_worst)
    print(f"torch-ref check: {'FAIL' if table.fails else 'ok'} ({steps} steps of {model}, "
          f"B={B} T={T}{', masked, 2 micro-batches' if masked else ''}"
          f"{', isolated documents' if packing else ''}, W {precision}, AdamW lr {lr} wd {wd}; strata on {args.device}, "
          f"PyTorch {torch.__version__} on cpu)")
    return 1 if table.fails else 0
