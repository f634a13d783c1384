#!/usr/bin/env bash
# strata generate's KV cache against its recompute path (the hidden
# --no-kv-cache): greedy (--temperature 0) prints the same text for GPT-2
# and LLaMA shapes (GQA untied with llama3 scaling, tied with Qwen2's
# biases, MQA), prompts of 1 and several bytes; sampling with one --seed
# too; a text past ctx and bf16 compute take the recompute path and still
# agree. The cache decodes on the device (ST_DEVICE=cpu here), and on
# cpu-strict, whose memory the host cannot touch, it prints the same; a
# --gpu-mem below what the weights and the cache need is one line, exit 2.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-genkv-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# same NAME CKPT ARGS...: generate with and without the cache, the same text
same() {
	local name=$1 ck=$2
	shift 2
	"$strata" generate --ckpt "$ck" "$@" >"$work/kv" 2>&1 || { bad "$name: kv"; cat "$work/kv"; return; }
	"$strata" generate --ckpt "$ck" --no-kv-cache "$@" >"$work/re" 2>&1 ||
		{ bad "$name: recompute"; cat "$work/re"; return; }
	# a model that prints varied text (not one repeated byte), or the
	# comparison says little
	if cmp -s "$work/kv" "$work/re" && [ "$(fold -w1 "$work/kv" | sort -u | wc -l)" -ge 5 ]; then
		ok "$name"
	else
		bad "$name: the cache's text differs"; cat -A "$work/kv" | head -3; cat -A "$work/re" | head -3
	fi
}

# byte-level models trained on a few words long enough to print them
python3 -c "
import random
r = random.Random(1)
w = 'the quick brown fox jumps over a lazy dog while strata streams units of weights'.split()
print(' '.join(r.choice(w) for _ in range(3000)))" >"$work/data.txt"
i=0
for model in gpt2:layers=2,dim=64,heads=4,vocab=256,ctx=96 \
	llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=96,tied=0,rope-theta=500000,rope-scaling=llama3:8:1:4:32 \
	llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=96,bias=1,tied=1 \
	llama:layers=2,dim=48,heads=4,kv-heads=1,ffn=64,vocab=256,ctx=96,head-dim=16,tied=0; do
	i=$((i + 1))
	"$strata" train --model "$model" --data "$work/data.txt" --steps 300 --batch 4 --seq 64 \
		--lr 1e-2 --save "$work/ck$i" \
		>"$work/train.log" 2>&1 || { bad "train $model"; tail -3 "$work/train.log"; continue; }
	same "$model: greedy, 1-byte prompt" "$work/ck$i" --prompt "a" --tokens 60 --temperature 0
	same "$model: greedy, 12-byte prompt" "$work/ck$i" --prompt "The quick br" --tokens 60 \
		--temperature 0
	same "$model: sampled, one seed" "$work/ck$i" --prompt "ab" --tokens 40 --seed 7
	same "$model: greedy on cpu-strict" "$work/ck$i" --prompt "The quick br" --tokens 60 \
		--temperature 0 --device cpu-strict
	"$strata" generate --ckpt "$work/ck$i" --prompt "ab" --tokens 40 --device cpu \
		--gpu-mem 64K >"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc -eq 2 ] && [ ! -s "$work/out" ] && [ "$(wc -l <"$work/err")" -eq 1 ] &&
		grep -q "needs .*--gpu-mem is 64.00 KiB: raise it" "$work/err"; then
		ok "$model: --gpu-mem 64K refused"
	else
		bad "$model: --gpu-mem 64K: rc $rc"; cat "$work/err"
	fi
	# what the device takes follows the prompt and --tokens (the cache for
	# 12 positions against 42), not the model's context
	cache_kib() {
		"$strata" generate --ckpt "$work/ck$i" --prompt "ab" --tokens "$1" --device cpu \
			--gpu-mem 64K 2>&1 | sed -n 's/.*and --tokens (\([0-9.]*\) KiB).*/\1/p'
	}
	c10=$(cache_kib 10) c40=$(cache_kib 40)
	if [ -n "$c10" ] && [ -n "$c40" ] && awk -v a="$c10" -v b="$c40" 'BEGIN { exit !(a < b) }'; then
		ok "$model: the device's cache and workspace follow --tokens ($c10 KiB for 10, $c40 for 40)"
	else
		bad "$model: cache for 10 tokens '$c10' KiB, for 40 '$c40' KiB"
	fi
	# past ctx (the window slides) and bf16: the recompute path either way
	same "$model: past ctx" "$work/ck$i" --prompt "The quick br" --tokens 100 --temperature 0
	same "$model: bf16" "$work/ck$i" --prompt "ab" --tokens 30 --temperature 0 \
		--compute-dtype bf16
done
exit $fail
