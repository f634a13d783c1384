#!/usr/bin/env bash
# The main job end to end, as docs/finetune.md tells it, on a small random
# LLaMA-shaped model (a LlamaForCausalLM directory written here with
# PyTorch as transformers writes it: BF16 shards, the index, config.json)
# with a real tokenizer (Llama 2's tokenizer.json and tokenizer_config.json,
# from the npm test data, beside the weights as Hugging Face ships them):
#   strata tokenize --tokenizer DIR --out data.bin my.txt
#   strata plan --model DIR ...
#   strata train --init DIR --data data.bin ... --save ck
#   strata generate --ckpt ck --prompt "..."
#   strata export --ckpt ck --out DIR2
# and that each step hands the next what it needs: the shard holds the
# tokenizer's ids (BOS first), the checkpoint carries the tokenizer, eval of
# the text through the export's tokenizer is eval of the shard, --init from
# the export is --init from the checkpoint.
# Exit 77, saying why, without the npm test data (tools/quickstart
# test-data) or a python3 with torch.
#   test_finetune.sh STRATA SOURCE_ROOT
set -u
strata=$1 root=$2
tokdir=$root/.testdata/npm/tokenizer-llama2/package/models
[ -f "$tokdir/tokenizer.json" ] ||
	{ echo "SKIP: $tokdir/tokenizer.json is not there: run tools/quickstart test-data"; exit 77; }
py=
for p in python3 /usr/bin/python3; do
	"$p" -c "import torch" 2>/dev/null && { py=$p; break; }
done
[ -n "$py" ] || { echo "SKIP: python3-torch is missing"; exit 77; }
python3() { "$py" "$@"; }
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-finetune-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/check.sh"
export PYTHONPATH="$root/tests/ckpt${PYTHONPATH:+:$PYTHONPATH}" # hfdir.py
first() { # metrics file, key: the first step's value
	python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])' "$1" "$2"
}

# the model directory as it is downloaded: Llama 2's vocabulary, tiny dims
python3 - "$work/model" "$tokdir" <<'PY' || { echo "FAIL writing the model"; exit 1; }
import json, os, shutil, sys, torch
import hfdir
d, tok = sys.argv[1:]
os.mkdir(d)
L, C, H, K, F, V, T = 2, 64, 4, 2, 128, 32000, 128
json.dump(hfdir.llama_config(L, C, H, K, F, V, T, theta=10000.0), open(f"{d}/config.json", "w"),
          indent=2)
hfdir.write_sharded(d, hfdir.llama_tensors(L, C, H, K, F, V, seed=1, dtype=torch.bfloat16),
                    3 << 20, metadata={"format": "pt"})
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", d)
PY
my=$work/my.txt
cat /usr/share/common-licenses/GPL-3 >"$my"

# 1. tokenize: Llama 2 adds <s> (id 1), no </s>; ids fit uint16
check tokenize 0 "$strata" tokenize --tokenizer "$work/model" --out "$work/data.bin" "$my"
python3 - "$work/data.bin" <<'PY' || fail=1
import struct, sys
raw = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<iii", raw[:12])
ids = struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n])
assert magic == 20240520 and version == 1 and len(raw) == 1024 + 2 * n, (magic, version, n)
assert ids[0] == 1 and 1 not in ids[1:] and 2 not in ids and max(ids) < 32000, ids[:8]
assert 5000 < n < 15000, n  # about 4 bytes a token on English text
print(f"ok   the shard: {n} ids, <s> first")
PY

# 2. plan --model DIR: the model config.json says
check plan 0 "$strata" plan --model "$work/model" --seq 64 --batch 2 --gpu-mem 128M --host-mem 512M
grep -q "LLaMA, 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 128, vocab 32000, ctx 128" \
	"$work/out" || { echo "FAIL plan: $(head -3 "$work/out")"; fail=1; }

# 3. train from the directory; the checkpoint carries its tokenizer
run=(--data "$work/data.bin" --seq 64 --batch 2 --gpu-mem 128M --host-mem 512M --seed 5)
check train 0 "$strata" train --init "$work/model" "${run[@]}" --steps 4 --lr 1e-3 \
	--save "$work/ck" --metrics "$work/train.jsonl"
grep -q "the tokenizer of .*: copied into" "$work/out" || { echo "FAIL train: no tokenizer copied"; fail=1; }
cmp -s "$work/model/tokenizer.json" "$work/ck/tokenizer.json" &&
	cmp -s "$work/model/tokenizer_config.json" "$work/ck/tokenizer_config.json" ||
	{ echo "FAIL the checkpoint's tokenizer files are not the model's"; fail=1; }
[ "$(wc -l <"$work/train.jsonl")" = 4 ] || { echo "FAIL train: $(wc -l <"$work/train.jsonl") metrics rows"; fail=1; }
check info 0 "$strata" info --ckpt "$work/ck" --verify

# 4. generate through the tokenizer beside the checkpoint: text out,
# the same with --tokenizer naming it, the same twice
gen=(--prompt "This License applies to" --tokens 16 --seed 2)
check generate 0 "$strata" generate --ckpt "$work/ck" "${gen[@]}"
cp "$work/out" "$work/gen1"
case "$(cat "$work/gen1")" in
"This License applies to"?*) echo "ok   generated: $(head -c 120 "$work/gen1" | tr '\n' ' ')" ;;
*) echo "FAIL generate: $(cat "$work/gen1")"; fail=1 ;;
esac
check generate-tokenizer 0 "$strata" generate --ckpt "$work/ck/latest" --tokenizer "$work/model" "${gen[@]}"
cmp -s "$work/out" "$work/gen1" || { echo "FAIL generate with --tokenizer differs"; fail=1; }

# 5. export: a LlamaForCausalLM directory with the tokenizer, as it came
check export 0 "$strata" export --ckpt "$work/ck" --out "$work/out2"
grep -q "as a Hugging Face LlamaForCausalLM directory (LLaMA)" "$work/out" ||
	{ echo "FAIL export: $(cat "$work/out")"; fail=1; }
python3 - "$work/out2" "$work/model" <<'PY' || fail=1
import json, os, sys
out, src = sys.argv[1:]
c, s = (json.load(open(f"{d}/config.json")) for d in (out, src))
assert c["architectures"] == ["LlamaForCausalLM"], c
for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rope_theta", "tie_word_embeddings"):
    assert c[k] == s[k], (k, c[k], s[k])
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert open(f"{out}/{f}", "rb").read() == open(f"{src}/{f}", "rb").read(), f
print(f"ok   the export: {sorted(os.listdir(out))}")
PY
check init-ck 0 "$strata" train --init "$work/ck" "${run[@]}" --steps 1 --metrics "$work/a.jsonl"
check init-export 0 "$strata" train --init "$work/out2" "${run[@]}" --steps 1 --metrics "$work/b.jsonl"
a=$(first "$work/a.jsonl" loss) b=$(first "$work/b.jsonl" loss)
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok   --init from the export: the checkpoint's loss $a" ||
	{ echo "FAIL --init from the export: $b, from the checkpoint $a"; fail=1; }
# the text through the export's tokenizer is the shard
check eval-shard 0 "$strata" eval --ckpt "$work/ck" --data "$work/data.bin" --batch 2 --seq 64 --batches 8
l1=$(grep "^loss" "$work/out")
check eval-text 0 "$strata" eval --ckpt "$work/out2" --data "$my" --batch 2 --seq 64 --batches 8
l2=$(grep "^loss" "$work/out")
[ -n "$l1" ] && [ "$l1" = "$l2" ] && echo "ok   eval of the text through the export's tokenizer: $l1" ||
	{ echo "FAIL eval: shard '$l1', text '$l2'"; fail=1; }
[ $fail = 0 ] && echo PASS
exit $fail
