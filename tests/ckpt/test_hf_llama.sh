#!/usr/bin/env bash
# LLaMA-family Hugging Face directories as transformers writes them, through
# --init, `strata plan --model DIR` and `strata info --ckpt DIR`:
#   - a LlamaForCausalLM (grouped-query attention, an untied head, llama3
#     rope scaling) and a Qwen2ForCausalLM (q/k/v biases, a tied head with
#     the redundant lm_head.weight copy, rotary_emb.inv_freq buffers,
#     linear rope scaling under the older key "type") made
#     here with PyTorch, in BF16, F16 and F32, in shards with the index;
#   - plan and info describe each; --init (without --model: the model
#     config.json says) gives the first loss of PyTorch's own conversion of
#     the same tensors to fp32 saved as one F32 file, bit for bit; and that
#     loss is tools/torch_llama.py's (Hugging Face's modeling semantics in
#     plain PyTorch) on the same weights and batch;
#   - refusals: a rope_scaling type, an architecture strata does not know, a
#     missing tensor, a wrong shape: exit 2, one line naming the key.
# Needs a python3 with torch (Debian's python3-torch): exit 77 without it.
set -u
strata=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # absolute: one check runs elsewhere
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-hfllama-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
data=/usr/share/common-licenses/GPL-3
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$here:$here/../../tools${PYTHONPATH:+:$PYTHONPATH}" # hfdir, torch_llama
. "$here/../cli/check.sh"
need_torch

first_loss() { # metrics file: its first step's loss
	python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$1"
}
# the two shapes: strata's --model text of each (tools/torch_llama.py reads it)
llama=llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,rope-theta=500000,tied=0,bias=0,eps=1e-05,rope-scaling=llama3:8:1:4:32
qwen=llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,rope-theta=10000,tied=1,bias=1,eps=1e-06,rope-scaling=linear:2

python3 - "$work" <<'PY' || fail=1
import json, os, sys, torch
import hfdir
w = sys.argv[1]
L, C, H, K, F, V, T = 2, 64, 4, 2, 96, 256, 64
l3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32, "rope_type": "llama3"}
for fam, qwen in (("llama", False), ("qwen", True)):
    theta = 10000.0 if qwen else 500000.0
    cfg = hfdir.llama_config(L, C, H, K, F, V, T, qwen=qwen, tied=qwen, theta=theta,
                             scaling={"type": "linear", "factor": 2.0} if qwen else l3)
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
        d = f"{w}/{fam}-{name}"
        os.mkdir(d)
        t = hfdir.llama_tensors(L, C, H, K, F, V, seed=11, dtype=dtype, qwen=qwen, tied=qwen,
                                buffers=qwen, theta=theta)
        json.dump(cfg, open(f"{d}/config.json", "w"), indent=2, sort_keys=True)
        size = sum(len(hfdir.tensor_bytes(x)) for _, x in t)
        files = hfdir.write_sharded(d, t, size // 3 + 1, metadata={"format": "pt"})
        assert len(files) >= 3, files
        # PyTorch's own conversion of the model's tensors to fp32, one file
        # (no inv_freq buffers, no tied copy of the embedding)
        r = f"{w}/ref-{fam}-{name}"
        os.mkdir(r)
        json.dump(cfg, open(f"{r}/config.json", "w"))
        hfdir.write_safetensors(f"{r}/model.safetensors",
                                [(k, x.float()) for k, x in t if "inv_freq" not in k and
                                 not (qwen and k == "lm_head.weight")])
PY

run=(--data "$data" --seq 32 --batch 2 --shuffle off --steps 1 --seed 3)
for fam in llama qwen; do
	if [ $fam = llama ]; then
		arch=LlamaForCausalLM desc="LLaMA, 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 96, vocab 256, ctx 64, rope theta 500000, llama3 x8, untied head"
		model=$llama tensors=21 mix="BF16 21"
	else
		arch=Qwen2ForCausalLM desc="LLaMA (q/k/v biases), 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 96, vocab 256, ctx 64, rope theta 10000, linear x2, tied head"
		model=$qwen tensors=29 mix="BF16 27, F32 2"
	fi
	check "plan-$fam" 0 "$strata" plan --model "$work/$fam-bf16" --seq 32 --batch 2
	grep -qF "$desc" "$work/out" || { echo "FAIL plan --model $fam: $(head -3 "$work/out")"; fail=1; }
	# a directory named without a '/': not a preset, so the directory
	(cd "$work" && "$strata" plan --model "$fam-bf16" --seq 32 --batch 2) 2>&1 | grep -qF "$desc" ||
		{ echo "FAIL plan --model $fam-bf16 (relative)"; fail=1; }
	check "info-$fam" 0 "$strata" info --ckpt "$work/$fam-bf16"
	grep -qF "architecture: $arch" "$work/out" && grep -qF "model: $desc" "$work/out" &&
		grep -qF "every tensor there with its shape" "$work/out" &&
		grep -Eq "files: [0-9]+ values in $tensors tensors \($mix\), in [0-9]+ shards \(model.safetensors.index.json\)" "$work/out" ||
		{ echo "FAIL info --ckpt $fam"; cat "$work/out"; fail=1; }
	for dt in bf16 f16 f32; do
		check "init-$fam-$dt" 0 "$strata" train --init "$work/$fam-$dt" "${run[@]}" \
			--metrics "$work/$fam-$dt.jsonl"
		check "init-ref-$fam-$dt" 0 "$strata" train --init "$work/ref-$fam-$dt" "${run[@]}" \
			--metrics "$work/ref-$fam-$dt.jsonl"
		a=$(first_loss "$work/$fam-$dt.jsonl") b=$(first_loss "$work/ref-$fam-$dt.jsonl")
		[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok   $fam $dt shards: loss $a, as from PyTorch's fp32" ||
			{ echo "FAIL --init $fam $dt: $a, PyTorch's fp32 gives $b"; fail=1; }
		# with --model given, the same
		check "init-$fam-$dt-model" 0 "$strata" train --model "$model" --init "$work/$fam-$dt" \
			"${run[@]}" --metrics "$work/m-$fam-$dt.jsonl"
		c=$(first_loss "$work/m-$fam-$dt.jsonl")
		[ "$a" = "$c" ] || { echo "FAIL --init $fam $dt with --model: $c, without $a"; fail=1; }
		# the same weights and batch in tools/torch_llama.py, at fp32 (the
		# default --precision bf16 rounds the working weights to bf16)
		check "init-$fam-$dt-fp32" 0 "$strata" train --init "$work/$fam-$dt" "${run[@]}" \
			--precision fp32 --metrics "$work/fp32-$fam-$dt.jsonl"
		a=$(first_loss "$work/fp32-$fam-$dt.jsonl")
		python3 - "$work/ref-$fam-$dt/model.safetensors" "$model" "$data" "$a" <<'PY' || fail=1
import math, sys, torch
import torch_llama
path, model, data, got = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
c = torch_llama.parse(model, lambda m: sys.exit(m))
import struct, json
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
hdr = json.loads(raw[8:8 + n])
p = {}
for k, t in hdr.items():
    if k != "__metadata__":
        a, b = t["data_offsets"]
        p[k] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(t["shape"])
assert sorted(p) == sorted(torch_llama.names(c)), set(p) ^ set(torch_llama.names(c))
tok = list(open(data, "rb").read())
B, T = 2, 32  # llm.c's contiguous order, step 1: row b starts at b*T
rows = torch.tensor([tok[b * T:b * T + T + 1] for b in range(B)], dtype=torch.long)
with torch.no_grad():
    want = float(torch_llama.loss(torch, p, c, rows[:, :-1], rows[:, 1:]))
e = abs(got - want) / abs(want)
print(f"{'ok  ' if e < 1e-5 else 'FAIL'} torch_llama.py: loss {want:.7f}, strata {got:.7f}, rel. error {e:.1e}")
sys.exit(0 if e < 1e-5 else 1)
PY
	done
done

# --- export --format hf: the architecture, PyTorch's fp32 values, the same loss
for fam in llama qwen; do
	arch=LlamaForCausalLM
	[ $fam = qwen ] && arch=Qwen2ForCausalLM
	check "export-$fam" 0 "$strata" export --ckpt "$work/$fam-f16" --out "$work/ex-$fam" \
		--shard-size 64K
	grep -q "as a Hugging Face $arch directory (LLaMA) in [0-9]* shards" "$work/out" ||
		{ echo "FAIL export $fam: $(cat "$work/out")"; fail=1; }
	python3 - "$work" "$fam" "$arch" <<'PY' || fail=1
import json, sys
import hfdir
w, fam, arch = sys.argv[1:]
c = json.load(open(f"{w}/ex-{fam}/config.json"))
src = json.load(open(f"{w}/{fam}-f16/config.json"))
assert c["architectures"] == [arch], c
for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "vocab_size", "rms_norm_eps",
          "rope_theta", "rope_scaling", "tie_word_embeddings"):
    want = src.get(k)
    if k == "rope_scaling" and want and "type" in want:  # the older key, as
        want = dict(want)                                  # transformers reads it
        want["rope_type"] = want.pop("type")
    assert c.get(k) == want, (k, c.get(k), want)
wm = json.load(open(f"{w}/ex-{fam}/model.safetensors.index.json"))["weight_map"]
got = {}
for f in sorted(set(wm.values())):
    got.update(hfdir.read_safetensors(f"{w}/ex-{fam}/{f}")[0])
ref, _ = hfdir.read_safetensors(f"{w}/ref-{fam}-f16/model.safetensors")
assert set(got) == set(ref), set(got) ^ set(ref)
for k in ref:
    assert got[k] == ref[k], k
print(f"ok   export {fam}: config.json is {arch}'s, every value PyTorch's fp32 ({len(ref)} tensors)")
PY
	check "init-ex-$fam" 0 "$strata" train --init "$work/ex-$fam" "${run[@]}" \
		--metrics "$work/ex-$fam.jsonl"
	a=$(first_loss "$work/ex-$fam.jsonl") b=$(first_loss "$work/$fam-f16.jsonl")
	[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok   --init from the $fam export: loss $a" ||
		{ echo "FAIL --init from the $fam export: $a, from the source $b"; fail=1; }
done

# --- refusals: copies of llama-bf16 damaged in one way ---------------------------
python3 - "$work" <<'PY' || fail=1
import json, os, shutil, sys
import hfdir
w = sys.argv[1]
src = f"{w}/llama-bf16"
wm = json.load(open(f"{src}/model.safetensors.index.json"))["weight_map"]
def copy(name):
    d = f"{w}/bad-{name}"
    shutil.copytree(src, d)
    return d
def config(d, edit):
    c = json.load(open(f"{d}/config.json"))
    edit(c)
    json.dump(c, open(f"{d}/config.json", "w"))
def rewrite(d, fname, edit):
    got, order = hfdir.read_safetensors(f"{d}/{fname}")
    ts = edit([(k,) + got[k] for k in order])
    import struct
    hdr, off, blobs = {}, 0, []
    for k, dtype, shape, raw in ts:
        hdr[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(f"{d}/{fname}", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
config(copy("rope"), lambda c: c["rope_scaling"].update(rope_type="yarn"))
config(copy("arch"), lambda c: c.update(architectures=["GemmaForCausalLM"]))
config(copy("type"), lambda c: c.update(architectures=["GemmaForCausalLM"], model_type="gemma"))
# a Mistral is read as a LLaMA only when its sliding window spans the context
config(copy("window"), lambda c: c.update(architectures=["MistralForCausalLM"],
                                          model_type="mistral", sliding_window=16))
t = "model.layers.1.mlp.up_proj.weight"
d = copy("missing")
rewrite(d, wm[t], lambda ts: [x for x in ts if x[0] != t])
m = dict(wm); del m[t]
open(f"{d}/model.safetensors.index.json", "w").write(hfdir.index_text(m, 0))
t = "model.layers.0.self_attn.k_proj.weight"  # GQA: 2 kv heads of 16, not 4
d = copy("shape")
rewrite(d, wm[t], lambda ts: [(k, dt, [64, 64] if k == t else s, r + r if k == t else r)
                              for k, dt, s, r in ts])
PY
refuse() { # name, what the line must say
	check "refuse-$1" 2 "$strata" train --init "$work/bad-$1" "${run[@]}" --save "$work/o-$1" &&
		{ grep -qF -- "$2" "$work/err" || { echo "FAIL refuse-$1: no \"$2\" in $(cat "$work/err")"; fail=1; }; }
	[ ! -e "$work/o-$1" ] || { echo "FAIL refuse-$1 wrote $work/o-$1"; fail=1; }
	check "refuse-$1-info" 2 "$strata" info --ckpt "$work/bad-$1" &&
		{ grep -qF -- "$2" "$work/err" || { echo "FAIL refuse-$1 info: no \"$2\""; fail=1; }; }
	[ "${3:-}" = plan ] || return 0  # plan reads config.json alone
	check "refuse-$1-plan" 2 "$strata" plan --model "$work/bad-$1" --seq 32 --batch 2 &&
		{ grep -qF -- "$2" "$work/err" || { echo "FAIL refuse-$1 plan: no \"$2\""; fail=1; }; }
}
refuse rope 'rope_scaling.rope_type "yarn"' plan
refuse arch 'architectures "GemmaForCausalLM"' plan
refuse type 'model_type "gemma"' plan
refuse window 'model_type mistral with sliding_window 16' plan
refuse missing 'model.layers.1.mlp.up_proj.weight'
refuse shape 'model.layers.0.self_attn.k_proj.weight has the wrong shape for the model: [64,64], the model'"'"'s is [32,64]'
[ $fail = 0 ] && echo PASS
exit $fail
