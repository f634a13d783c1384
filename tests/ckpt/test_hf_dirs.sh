#!/usr/bin/env bash
# Checkpoints and Hugging Face directories as they are shipped, sharded.
#   - --save with a small --shard-size: shards and indexes whose split is
#     huggingface_hub's (recomputed here from the unsharded checkpoint's
#     tensor order), whose index text is json.dumps(indent=2, sort_keys=True),
#     whose tensors are the unsharded run's bytes; the same losses; a resume
#     from a sharded checkpoint ends byte-identical to the run it resumes;
#     a run saving shards at every step (--resume auto) killed with SIGKILL
#     at several instants always leaves latest a whole, verified checkpoint;
#   - export --shard-size writes the checkpoint's shards byte for byte, and
#     --init from that export gives the first loss --init from the
#     checkpoint gives;
#   - directories written here with PyTorch as transformers writes them
#     (the "transformer." prefix, lm_head.weight, the attn.bias masks, three
#     shards and an index) in BF16, F16 and F32: export holds every value to
#     PyTorch's own conversion to fp32, --init gives the loss of that
#     conversion saved as one F32 file; info --ckpt describes them;
#   - every refusal: exit 2, one line naming the key or tensor, nothing
#     written.
# Needs a python3 with torch (Debian's python3-torch): exit 77 without it.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-hfdirs-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
data=/usr/share/common-licenses/GPL-3
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" # hfdir.py
. "$here/../cli/check.sh"
need_torch

model=layers=2,dim=64,heads=2,vocab=256,ctx=64
run=(--model "$model" --seq 32 --batch 2 --data "$data" --seed 3)
train() { # name: args...
	local name=$1
	shift
	"$strata" train "${run[@]}" "$@" >"$work/$name.log" 2>&1 ||
		{ echo "FAIL train $name"; tail -3 "$work/$name.log"; fail=1; }
}
first_loss() { # metrics file: its first step's loss
	python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$1"
}

# --- strata checkpoints, sharded ---------------------------------------------
train one --steps 4 --save-every 2 --keep 0 --save "$work/one" --metrics "$work/one.jsonl"
train sh --steps 4 --save-every 2 --keep 0 --save "$work/sh" --metrics "$work/sh.jsonl" \
	--shard-size 64K
cmp -s <(grep -o '"loss":[^,]*' "$work/one.jsonl") <(grep -o '"loss":[^,]*' "$work/sh.jsonl") ||
	{ echo "FAIL sharded saving changed the losses"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import json, sys
import hfdir
w = sys.argv[1]
for step in ("step-000002", "step-000004"):
    one, sh = f"{w}/one/{step}", f"{w}/sh/{step}"
    listed = {f["name"] for f in json.load(open(f"{sh}/trainer.json"))["files"]}
    for stem, whole in (("model", "model.safetensors"), ("optimizer", "optimizer.safetensors")):
        ref, order = hfdir.read_safetensors(f"{one}/{whole}")
        shards = hfdir.split([(k, len(ref[k][2])) for k in order], 64 * 1024)
        names = hfdir.shard_names(len(shards), stem)
        assert len(names) > 2, names
        wm = {}
        for fname, members in zip(names, shards):
            got, got_order = hfdir.read_safetensors(f"{sh}/{fname}")
            assert got_order == members, (fname, got_order, members)
            for k in members:
                assert got[k] == ref[k], (fname, k)  # dtype, shape, bytes
                wm[k] = fname
            assert fname in listed, fname
        text = open(f"{sh}/{stem}.safetensors.index.json").read()
        want = hfdir.index_text(wm, sum(len(v[2]) for v in ref.values()))
        assert text == want, (stem, text[:300], want[:300])
        assert f"{stem}.safetensors.index.json" in listed
print("ok   sharded checkpoints: hub's split, transformers' index, the unsharded bytes")
PY
# resume from a sharded checkpoint: the run it resumes, byte for byte
cp -r "$work/sh/step-000002" "$work/r2"
train resumed --steps 4 --save-every 2 --keep 0 --resume "$work/r2" --save "$work/rs" \
	--shard-size 64K
for f in "$work/sh/step-000004"/*; do
	cmp -s "$f" "$work/rs/step-000004/$(basename "$f")" ||
		{ echo "FAIL resumed from shards: $(basename "$f") differs"; fail=1; }
done
echo "ok   resumed from a sharded checkpoint: step 4 byte-identical"

# SIGKILL while shards are being saved: latest always names a whole,
# verified checkpoint (the directory protocol is the same for many files)
kills=0
for delay in 0.6 1.0 1.5 2.1 2.8 3.6; do
	[ "$kills" -ge 3 ] && break
	"$strata" train --model layers=4,dim=128,heads=2,vocab=256,ctx=64 --seq 32 --batch 2 \
		--data "$data" --seed 3 --steps 1000 --save-every 1 --keep 2 --save "$work/kill" \
		--shard-size 32K --resume auto >/dev/null 2>&1 &
	pid=$!
	sleep "$delay"
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	if [ -e "$work/kill/latest" ]; then
		"$strata" info --ckpt "$work/kill" --verify >"$work/out" 2>&1 ||
			{ echo "FAIL killed after ${delay}s: $(grep -m1 -E 'DAMAGED|FAILED|strata:' "$work/out")"; fail=1; }
		kills=$((kills + 1))
	fi
done
n=$(ls "$work/kill/latest" | grep -c '^optimizer-')
[ "$kills" -ge 2 ] && [ "$n" -gt 20 ] && echo "ok   SIGKILL during sharded saves ($kills with a checkpoint, $n optimizer shards): latest verified" ||
	{ echo "FAIL kill test: $kills kills with a checkpoint, $n optimizer shards"; fail=1; }

# export writes the checkpoint's layout; --init from it is --init from ck
check export-sharded 0 "$strata" export --ckpt "$work/sh" --out "$work/ex" --shard-size 64K
for f in "$work/sh/latest"/model*; do
	cmp -s "$f" "$work/ex/$(basename "$f")" ||
		{ echo "FAIL export: $(basename "$f") is not the checkpoint's"; fail=1; }
done
[ "$(ls "$work/ex" | grep -vc '^model-')" = 2 ] ||
	{ echo "FAIL export: $(ls "$work/ex")"; fail=1; }
check export-one 0 "$strata" export --ckpt "$work/one" --out "$work/ex1"
cmp -s "$work/ex1/model.safetensors" "$work/one/latest/model.safetensors" ||
	{ echo "FAIL export below the shard size is not the checkpoint's model.safetensors"; fail=1; }
check export-llmc-no-shards 2 "$strata" export --ckpt "$work/sh" --out "$work/x.bin" --format llmc \
	--shard-size 1M
train init-ck --steps 1 --init "$work/one" --metrics "$work/init-ck.jsonl"
train init-ex --steps 1 --init "$work/ex" --metrics "$work/init-ex.jsonl"
train init-sh --steps 1 --init "$work/sh" --metrics "$work/init-sh.jsonl"
a=$(first_loss "$work/init-ck.jsonl") b=$(first_loss "$work/init-ex.jsonl") c=$(first_loss "$work/init-sh.jsonl")
[ "$a" = "$b" ] && [ "$a" = "$c" ] && echo "ok   --init from the sharded export and checkpoint: loss $a" ||
	{ echo "FAIL --init: $a (checkpoint) $b (sharded export) $c (sharded checkpoint)"; fail=1; }
check info-sharded-ckpt 0 "$strata" info --ckpt "$work/sh"
n=$(ls "$work/sh/latest" | grep -c '^model-')
grep -q "weights: 120576 parameters in 28 tensors (F32 28), in $n shards (model.safetensors.index.json)" "$work/out" ||
	{ echo "FAIL info of a sharded checkpoint"; cat "$work/out"; fail=1; }

# --- Hugging Face directories as transformers writes them -----------------------
python3 - "$work" <<'PY' || fail=1
import json, os, sys, torch
import hfdir
w = sys.argv[1]
L, C, H, V, T = 2, 64, 2, 256, 64
for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
    d = f"{w}/hf-{name}"
    os.mkdir(d)
    t = hfdir.gpt2_tensors(L, C, V, T, seed=7, dtype=dtype)
    json.dump(hfdir.gpt2_config(L, C, H, V, T), open(f"{d}/config.json", "w"), indent=2)
    size = sum(len(hfdir.tensor_bytes(x)) for _, x in t)
    files = hfdir.write_sharded(d, t, size // 3 + 1, metadata={"format": "pt"})
    assert len(files) >= 3, files
    # PyTorch's own conversion, the model's tensors only, as one F32 file
    r = f"{w}/ref-{name}"
    os.mkdir(r)
    json.dump(hfdir.gpt2_config(L, C, H, V, T), open(f"{r}/config.json", "w"))
    hfdir.write_safetensors(f"{r}/model.safetensors",
                            [(k.replace("transformer.", "", 1), x.float()) for k, x in t
                             if x.dtype != torch.bool and x.dim() > 0 and k != "lm_head.weight"])
PY
for dt in bf16 f16 f32; do
	check "export-hf-$dt" 0 "$strata" export --ckpt "$work/hf-$dt" --out "$work/hfx-$dt"
	python3 - "$work" "$dt" <<'PY' || fail=1
import sys
import hfdir
w, dt = sys.argv[1:]
got, _ = hfdir.read_safetensors(f"{w}/hfx-{dt}/model.safetensors")
ref, _ = hfdir.read_safetensors(f"{w}/ref-{dt}/model.safetensors")
assert set(got) == set(ref), set(got) ^ set(ref)
for k in ref:
    assert got[k] == ref[k], k  # every value as PyTorch widens it, bit for bit
print(f"ok   {dt}: every value as PyTorch converts it ({len(ref)} tensors)")
PY
	train "hf-$dt" --steps 1 --init "$work/hf-$dt" --metrics "$work/hf-$dt.jsonl"
	train "ref-$dt" --steps 1 --init "$work/ref-$dt" --metrics "$work/ref-$dt.jsonl"
	a=$(first_loss "$work/hf-$dt.jsonl") b=$(first_loss "$work/ref-$dt.jsonl")
	[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok   --init $dt shards: loss $a, as PyTorch's fp32" ||
		{ echo "FAIL --init $dt: $a, PyTorch's fp32 gives $b"; fail=1; }
done
check info-hf 0 "$strata" info --ckpt "$work/hf-bf16"
grep -q "architecture: GPT2LMHeadModel" "$work/out" &&
	grep -q "model: GPT-2, 2 layers, dim 64, 2 heads, vocab 256, ctx 64" "$work/out" &&
	grep -q "weights: 120576 parameters, every tensor there with its shape" "$work/out" &&
	grep -Eq "files: [0-9]+ values in 33 tensors \(BOOL 2, BF16 29, F32 2\), in [0-9]+ shards \(model.safetensors.index.json\)" "$work/out" &&
	grep -q "model-00001-of-0000" "$work/out" ||
	{ echo "FAIL info of a Hugging Face directory"; cat "$work/out"; fail=1; }
"$strata" info --ckpt "$work/hf-f16" --json >"$work/info.json" 2>&1 || fail=1
python3 - "$work" <<'PY' || fail=1
import json, os, sys
w = sys.argv[1]
o = json.load(open(f"{w}/info.json"))
wt = o["weights"]
names = sorted(f for f in os.listdir(f"{w}/hf-f16") if f.startswith("model-"))
assert [f["name"] for f in wt["files"]] == names, wt
assert all(f["bytes"] == os.path.getsize(f"{w}/hf-f16/{f['name']}") for f in wt["files"])
assert wt["tensors"] == 33 and o["architecture"] == "GPT2LMHeadModel", o
assert o["model"]["params"] == 120576, o["model"]
print("ok   info --json: shards, sizes, tensors")
PY

# --- refusals ----------------------------------------------------------------------
# each a copy of hf-bf16 damaged in one way; exit 2, one line, naming it
python3 - "$work" <<'PY' || fail=1
import json, os, shutil, struct, sys
import hfdir
w = sys.argv[1]
src = f"{w}/hf-bf16"
idx = json.load(open(f"{src}/model.safetensors.index.json"))
wm = idx["weight_map"]
def copy(name):
    d = f"{w}/bad-{name}"
    shutil.copytree(src, d)
    return d
def shard_of(t):
    return wm[t]
def rewrite(d, fname, edit):
    got, order = hfdir.read_safetensors(f"{d}/{fname}")
    ts = []
    for k in order:
        dtype, shape, raw = got[k]
        ts.append((k, dtype, shape, raw))
    ts = edit(ts)
    hdr, off, blobs = {}, 0, []
    for k, dtype, shape, raw in ts:
        hdr[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)

    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(f"{d}/{fname}", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def index(d, m):
    open(f"{d}/model.safetensors.index.json", "w").write(hfdir.index_text(m, 0))

d = copy("arch")
c = json.load(open(f"{d}/config.json")); c["model_type"] = "bert"; c["architectures"] = ["BertModel"]
json.dump(c, open(f"{d}/config.json", "w"))
t = "transformer.h.1.ln_2.bias"
d = copy("missing"); rewrite(d, shard_of(t), lambda ts: [x for x in ts if x[0] != t])
m = dict(wm); del m[t]; index(d, m)
t = "transformer.ln_f.weight"
d = copy("shape"); rewrite(d, shard_of(t), lambda ts: [(k, dt, [32] if k == t else s, r[:64] if k == t else r) for k, dt, s, r in ts])
d = copy("dtype"); rewrite(d, shard_of(t), lambda ts: [(k, "I16" if k == t else dt, s, r) for k, dt, s, r in ts])
d = copy("noshard"); os.remove(f"{d}/{shard_of(t)}")
t2 = "transformer.wpe.weight"
other = [f for f in sorted(set(wm.values())) if f != shard_of(t2)][0]
d = copy("twice")
got, _ = hfdir.read_safetensors(f"{src}/{shard_of(t2)}")
rewrite(d, other, lambda ts: ts + [(t2,) + got[t2]])
d = copy("unmapped"); m = dict(wm); del m[t2]; index(d, m)
d = copy("extra"); rewrite(d, other, lambda ts: ts + [("transformer.h.0.attn.rotary_emb.inv_freq", "F32", [4], bytes(16))])
m = dict(wm); m["transformer.h.0.attn.rotary_emb.inv_freq"] = other; index(d, m)
d = copy("both"); shutil.copy(f"{w}/ref-bf16/model.safetensors", d)
d = copy("badjson"); open(f"{d}/model.safetensors.index.json", "w").write('{"weight_map": {')
d = copy("pickle")
for f in os.listdir(d):
    if f.startswith("model"):
        os.remove(f"{d}/{f}")
open(f"{d}/pytorch_model.bin", "wb").write(b"PK")
d = copy("ctx")
c = json.load(open(f"{d}/config.json")); c["n_positions"] = 32; c["n_ctx"] = 32
json.dump(c, open(f"{d}/config.json", "w"))
PY
refuse() { # name, what the line must say
	check "refuse-$1" 2 "$strata" export --ckpt "$work/bad-$1" --out "$work/o-$1" &&
		{ grep -qF -- "$2" "$work/err" || { echo "FAIL refuse-$1: no \"$2\""; fail=1; }; }
	[ ! -e "$work/o-$1" ] || { echo "FAIL refuse-$1 wrote $work/o-$1"; fail=1; }
	"$strata" train "${run[@]}" --steps 1 --init "$work/bad-$1" >"$work/out" 2>"$work/err"
	[ $? = 2 ] && [ "$(wc -l <"$work/err")" = 1 ] && grep -qF -- "$2" "$work/err" ||
		{ echo "FAIL refuse-$1 --init: $(cat "$work/err")"; fail=1; }
}
refuse arch "bert"
refuse missing "tensor h.1.ln_2.bias is missing"
refuse shape "model-00004-of-00004.safetensors: tensor ln_f.weight has the wrong shape for the model: [32], the model's is [64]"
refuse dtype "model-00004-of-00004.safetensors: tensor ln_f.weight is I16, not a float type"
refuse noshard "which is missing"
refuse twice "tensor \"transformer.wpe.weight\" is in two shards"
refuse unmapped "tensor \"transformer.wpe.weight\" of model-0000"
refuse extra "tensor transformer.h.0.attn.rotary_emb.inv_freq is not one of the model's (GPT-2)"
refuse both "holds both model.safetensors and model.safetensors.index.json"
refuse badjson "model.safetensors.index.json: not valid JSON"
refuse pickle "pytorch_model.bin is a pickle"
refuse ctx "tensor wpe.weight has the wrong shape for the model: [64,64], the model's is [32,64]"
exit $fail
