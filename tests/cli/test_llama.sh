#!/usr/bin/env bash
# The LLaMA family from the command line: `strata plan --model DIR` reads a
# Hugging Face config.json (and refuses, in one line with exit 2, an
# architecture or rope type strata does not compute), `--model llama:...`
# and the presets plan and train, a saved LLaMA checkpoint carries its
# config.json (Qwen2ForCausalLM for q/k/v biases) and starts a run again
# (--init) and generation.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-llama-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

mkdir "$work/hf" "$work/nvme"
cat >"$work/hf/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
 "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
 "hidden_act": "silu", "torch_dtype": "bfloat16"}
JSON
out=$("$strata" plan --model "$work/hf" --seq 64 --batch 2 2>&1)
if [ $? = 0 ] && grep -q "LLaMA, 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 96" <<<"$out" &&
   grep -q "llama3 x8, untied head" <<<"$out" && grep -q "| 4 units" <<<"$out"; then
	ok "plan --model DIR: $(sed -n 2p <<<"$out")"
else
	bad "plan --model DIR"; echo "$out" | head -5
fi
# refusals: one line naming the key, exit 2
for sub in 's/LlamaForCausalLM/GemmaForCausalLM/;architectures' \
	   's/"llama3"/"yarn"/;rope_type' 's/"silu"/"gelu"/;hidden_act'; do
	mkdir -p "$work/bad"
	sed "${sub%;*}" "$work/hf/config.json" >"$work/bad/config.json"
	"$strata" plan --model "$work/bad" >/dev/null 2>"$work/err"
	rc=$?
	if [ $rc = 2 ] && [ "$(wc -l <"$work/err")" = 1 ] && grep -q "${sub#*;}" "$work/err"; then
		ok "refused: $(cat "$work/err")"
	else
		bad "config.json ${sub%;*}: exit $rc"; cat "$work/err"
	fi
done
"$strata" plan --model "$work/missing/dir" >/dev/null 2>"$work/err"
[ $? = 2 ] && [ "$(wc -l <"$work/err")" = 1 ] && ok "missing DIR: $(cat "$work/err")" ||
	bad "missing DIR"

# the presets plan as the released shapes, on a GPU of 80G with nvme
out=$("$strata" plan --model llama3.1-8b --device cuda --gpu-mem 80G --host-mem 64G \
	--nvme "$work/nvme" 2>&1)
if [ $? = 0 ] && grep -q "model 8030.26M params" <<<"$out" && grep -q "34 units" <<<"$out"; then
	ok "plan llama3.1-8b: $(grep '  step' <<<"$out")"
else
	bad "plan llama3.1-8b"; echo "$out" | head -5
fi

# train, save, --init from the checkpoint, generate
model=llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,bias=1
"$strata" train --model $model --steps 4 --batch 2 --seq 32 --save "$work/ck" \
	--metrics "$work/m.jsonl" >"$work/train.log" 2>&1 || { bad "train"; tail -3 "$work/train.log"; }
cfg=$work/ck/step-000004/config.json
if grep -q '"Qwen2ForCausalLM"' "$cfg" && grep -q '"rms_norm_eps": 1e-05' "$cfg"; then
	ok "the checkpoint's config.json is Qwen2ForCausalLM's"
else
	bad "checkpoint config.json"; cat "$cfg"
fi
python3 - "$work/m.jsonl" <<'PY' && ok "loss at step 1 near ln 256" || bad "loss at init"
import json, math, sys
first = json.loads(open(sys.argv[1]).readline())["loss"]
assert abs(first - math.log(256)) < 0.15, first
PY
"$strata" train --model $model --init "$work/ck" --steps 1 --batch 2 --seq 32 \
	--metrics "$work/i1.jsonl" >"$work/init.log" 2>&1 && ok "--init from a LLaMA checkpoint" ||
	{ bad "--init"; tail -3 "$work/init.log"; }
# without --model: the model the checkpoint's config.json says, the same step
"$strata" train --init "$work/ck" --steps 1 --batch 2 --seq 32 --metrics "$work/i2.jsonl" \
	>"$work/init2.log" 2>&1 || { bad "--init without --model"; tail -3 "$work/init2.log"; }
if python3 - "$work/i1.jsonl" "$work/i2.jsonl" <<'PY'
import json, sys
a, b = (json.loads(open(f).readline()) for f in sys.argv[1:])
assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
PY
then
	ok "--init without --model: the checkpoint's model, the same step"
else
	bad "--init without --model trains another step"; cat "$work/i1.jsonl" "$work/i2.jsonl"
fi
"$strata" train --model llama:layers=1,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64 \
	--init "$work/ck" --steps 1 --seq 32 >/dev/null 2>"$work/err"
[ $? = 2 ] && grep -q "not the model --model gives" "$work/err" &&
	ok "--init of another shape refused" || { bad "--init other shape"; cat "$work/err"; }
# export --format hf of the checkpoint: Qwen2's config.json (q/k/v biases),
# and --init from the export is --init from the checkpoint
"$strata" export --ckpt "$work/ck" --out "$work/ex" >"$work/ex.log" 2>&1 &&
	grep -q "as a Hugging Face Qwen2ForCausalLM directory (LLaMA)" "$work/ex.log" &&
	python3 - "$work/ex/config.json" <<'PY' && ok "export: $(cat "$work/ex.log")" || { bad "export"; cat "$work/ex.log"; }
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["Qwen2ForCausalLM"] and c["model_type"] == "qwen2", c
assert (c["num_key_value_heads"], c["intermediate_size"], c["tie_word_embeddings"]) == (2, 96, False), c
PY
"$strata" train --init "$work/ex" --steps 1 --batch 2 --seq 32 --metrics "$work/i3.jsonl" \
	>"$work/init3.log" 2>&1 || { bad "--init from the export"; tail -3 "$work/init3.log"; }
cmp -s <(head -1 "$work/i2.jsonl" | grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*') \
	<(head -1 "$work/i3.jsonl" | grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*') &&
	ok "--init from the export: the checkpoint's first step" ||
	{ bad "--init from the export"; head -1 "$work/i2.jsonl" "$work/i3.jsonl"; }
"$strata" export --ckpt "$work/ck" --out "$work/ex.bin" --format llmc >/dev/null 2>"$work/err"
[ $? = 2 ] && grep -q "llm.c's files hold GPT-2 models, not LLaMA" "$work/err" && [ ! -e "$work/ex.bin" ] &&
	ok "export --format llmc of a LLaMA refused" || { bad "export llmc"; cat "$work/err"; }
"$strata" generate --ckpt "$work/ck" --prompt "The " --tokens 8 >"$work/gen" 2>&1 &&
	ok "generate from a LLaMA checkpoint" || { bad "generate"; cat "$work/gen"; }
[ $fail = 0 ] && echo PASS
exit $fail
