#!/usr/bin/env bash
# The main job end to end, as docs/finetune.md tells it, on small random
# LLaMA-family models (directories written here with PyTorch as
# transformers writes them: BF16 shards, the index, config.json), each
# with a real tokenizer beside the weights as Hugging Face ships them
# (tokenizer.json and tokenizer_config.json from the npm test data):
# Mistral 7B's (npm's tokenizer-llama2, docs/tokenizer.md: 32000 ids, <s>
# first, uint16 shards) on a LlamaForCausalLM, and
# Qwen 3's (151669 ids, no BOS, uint32 shards) on a Qwen2ForCausalLM with
# q/k/v biases, a tied head and Qwen's vocabulary padded to 151936:
#   strata tokenize --tokenizer DIR --out data.bin my.txt
#   strata plan --model DIR ...
#   strata train --init DIR --data data.bin ... --save ck
#   strata generate --ckpt ck --prompt "..."
#   strata export --ckpt ck --out DIR2
# and that each step hands the next what it needs: the shard holds the
# tokenizer's ids (Mistral's BOS first), the checkpoint carries the tokenizer, eval of
# the text through the export's tokenizer is eval of the shard, --init from
# the export is --init from the checkpoint.
# Exit 77, saying why, without the npm test data (tools/quickstart
# test-data) or a python3 with torch.
#   test_finetune.sh STRATA SOURCE_ROOT
set -u
strata=$1 root=$2
npm=$root/.testdata/npm
for t in llama2 qwen3; do
	[ -f "$npm/tokenizer-$t/package/models/tokenizer.json" ] ||
		{ echo "SKIP: $npm/tokenizer-$t/package/models/tokenizer.json is not there: run tools/quickstart test-data"; exit 77; }
done
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-finetune-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/check.sh"
need_torch
export PYTHONPATH="$root/tests/ckpt${PYTHONPATH:+:$PYTHONPATH}" # hfdir.py
first() { # metrics file, key: the first step's value
	python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])' "$1" "$2"
}

job() { # tokenizer (npm name), vocab, qwen 0|1
	local tok=$1 V=$2 qwen=$3 w=$work/$1 arch=LlamaForCausalLM desc=
	[ "$qwen" = 1 ] && arch=Qwen2ForCausalLM desc=" (q/k/v biases)"
	mkdir "$w"
	local my=$w/my.txt
	cat /usr/share/common-licenses/GPL-3 >"$my"
# the model directory as it is downloaded: the tokenizer's vocabulary, tiny dims
python3 - "$w/model" "$npm/tokenizer-$tok/package/models" "$V" "$qwen" <<'PY' || { echo "FAIL writing the model"; exit 1; }
import json, os, shutil, sys, torch
import hfdir
d, tok, V, qwen = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
os.mkdir(d)
L, C, H, K, F, T = 2, 64, 4, 2, 128, 128
json.dump(hfdir.llama_config(L, C, H, K, F, V, T, qwen=qwen, tied=qwen, theta=10000.0),
          open(f"{d}/config.json", "w"), indent=2)
hfdir.write_sharded(d, hfdir.llama_tensors(L, C, H, K, F, V, seed=1, dtype=torch.bfloat16,
                                           qwen=qwen, tied=qwen), 3 << 20,
                    metadata={"format": "pt"})
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", d)
PY

# 1. tokenize: Mistral's tokenizer (npm's tokenizer-llama2, docs/tokenizer.md)
# adds <s> (id 1), no </s>, ids fit uint16; Qwen 3
# adds nothing, ids past 65535: uint32 (llm.c's version 7)
check "$tok-tokenize" 0 "$strata" tokenize --tokenizer "$w/model" --out "$w/data.bin" "$my"
python3 - "$w/data.bin" "$tok" <<'PY' || fail=1
import struct, sys
raw = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<iii", raw[:12])
if sys.argv[2] == "llama2":
    ids = struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n])
    assert magic == 20240520 and version == 1 and len(raw) == 1024 + 2 * n, (magic, version, n)
    assert ids[0] == 1 and 1 not in ids[1:] and 2 not in ids and max(ids) < 32000, ids[:8]
else:
    ids = struct.unpack(f"<{n}I", raw[1024:1024 + 4 * n])
    assert magic == 20240801 and version == 7 and len(raw) == 1024 + 4 * n, (magic, version, n)
    assert max(ids) < 151643, max(ids)  # text only: no special token
assert 5000 < n < 15000, n  # about 4 bytes a token on English text
print(f"ok   {sys.argv[2]}: the shard: {n} ids (magic {magic}), first {ids[:4]}")
PY

# 2. plan --model DIR: the model config.json says
check "$tok-plan" 0 "$strata" plan --model "$w/model" --seq 64 --batch 2 --gpu-mem 512M --host-mem 1G
grep -q "LLaMA$desc, 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 128, vocab $V, ctx 128" \
	"$work/out" || { echo "FAIL plan: $(head -3 "$work/out")"; fail=1; }

# 3. train from the directory; the checkpoint carries its tokenizer
local run=(--data "$w/data.bin" --seq 64 --batch 2 --gpu-mem 512M --host-mem 1G --seed 5)
check "$tok-train" 0 "$strata" train --init "$w/model" "${run[@]}" --steps 4 --lr 1e-3 \
	--save "$w/ck" --metrics "$w/train.jsonl"
grep -q "the tokenizer of .*: copied into" "$work/out" || { echo "FAIL train: no tokenizer copied"; fail=1; }
cmp -s "$w/model/tokenizer.json" "$w/ck/tokenizer.json" &&
	cmp -s "$w/model/tokenizer_config.json" "$w/ck/tokenizer_config.json" ||
	{ echo "FAIL the checkpoint's tokenizer files are not the model's"; fail=1; }
[ "$(wc -l <"$w/train.jsonl")" = 4 ] || { echo "FAIL train: $(wc -l <"$w/train.jsonl") metrics rows"; fail=1; }
check "$tok-info" 0 "$strata" info --ckpt "$w/ck" --verify
local tv="BPE, 32000 ids"
[ "$qwen" = 1 ] && tv="byte-level BPE, 151669 ids"
grep -qF "tokenizer: $w/ck/tokenizer.json ($tv)" "$work/out" ||
	{ echo "FAIL info --ckpt ck: no tokenizer line"; cat "$work/out"; fail=1; }

# 4. generate through the tokenizer beside the checkpoint: text out,
# the same with --tokenizer naming it, the same twice
local gen=(--prompt "This License applies to" --tokens 16 --seed 2)
check "$tok-generate" 0 "$strata" generate --ckpt "$w/ck" "${gen[@]}"
cp "$work/out" "$w/gen1"
case "$(cat "$w/gen1")" in
"This License applies to"?*) echo "ok   $tok generated: $(head -c 120 "$w/gen1" | tr '\n' ' ')" ;;
*) echo "FAIL generate: $(cat "$w/gen1")"; fail=1 ;;
esac
check "$tok-generate-tokenizer" 0 "$strata" generate --ckpt "$w/ck/latest" --tokenizer "$w/model" "${gen[@]}"
cmp -s "$work/out" "$w/gen1" || { echo "FAIL generate with --tokenizer differs"; fail=1; }

# 5. export: a LlamaForCausalLM / Qwen2ForCausalLM directory with the
# tokenizer, as it came
check "$tok-export" 0 "$strata" export --ckpt "$w/ck" --out "$w/out2"
grep -q "as a Hugging Face $arch directory (LLaMA)" "$work/out" ||
	{ echo "FAIL export: $(cat "$work/out")"; fail=1; }
python3 - "$w/out2" "$w/model" "$arch" <<'PY' || fail=1
import json, os, sys
out, src, arch = sys.argv[1:]
c, s = (json.load(open(f"{d}/config.json")) for d in (out, src))
assert c["architectures"] == [arch], c
for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rope_theta", "tie_word_embeddings"):
    assert c[k] == s[k], (k, c[k], s[k])
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert open(f"{out}/{f}", "rb").read() == open(f"{src}/{f}", "rb").read(), f
print(f"ok   the {arch} export: {sorted(os.listdir(out))}")
PY
# the text itself, not its ids, beside a model with a tokenizer: refused,
# naming strata tokenize
check "$tok-init-text" 2 "$strata" train --init "$w/ck" --data "$my" "${run[@]:2}" --steps 1
grep -q "strata tokenize --tokenizer" "$work/err" || { echo "FAIL init-text: $(cat "$work/err")"; fail=1; }
check "$tok-init-ck" 0 "$strata" train --init "$w/ck" "${run[@]}" --steps 1 --metrics "$w/a.jsonl"
check "$tok-init-export" 0 "$strata" train --init "$w/out2" "${run[@]}" --steps 1 --metrics "$w/b.jsonl"
a=$(first "$w/a.jsonl" loss) b=$(first "$w/b.jsonl" loss)
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok   $tok --init from the export: the checkpoint's loss $a" ||
	{ echo "FAIL --init from the export: $b, from the checkpoint $a"; fail=1; }
# the text through the export's tokenizer is the shard
check "$tok-eval-shard" 0 "$strata" eval --ckpt "$w/ck" --data "$w/data.bin" --batch 2 --seq 64 --batches 8
l1=$(grep "^loss" "$work/out")
check "$tok-eval-text" 0 "$strata" eval --ckpt "$w/out2" --data "$my" --batch 2 --seq 64 --batches 8
l2=$(grep "^loss" "$work/out")
[ -n "$l1" ] && [ "$l1" = "$l2" ] && echo "ok   $tok eval of the text through the export's tokenizer: $l1" ||
	{ echo "FAIL eval: shard '$l1', text '$l2'"; fail=1; }
}
job llama2 32000 0
job qwen3 151936 1
[ $fail = 0 ] && echo PASS
exit $fail
