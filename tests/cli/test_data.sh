#!/usr/bin/env bash
# strata train and eval over token data as a fine-tuner brings it
# (docs/finetune.md, "Training on chat data"):
#   - several files: --data a.bin,b.bin and --data 'dir/*.bin' train (and
#     eval) as the one shard of their tokens in that order, bit for bit; a
#     second --data, an empty list item, a pattern without a match and text
#     mixed with shards are refused (exit 2, one line);
#   - a shard's tokenizer: made by another tokenizer than the model's (the
#     tokenizer.json beside --init, --resume or eval's --ckpt / --tokenizer)
#     is refused, naming the strata tokenize command, as --data and as
#     --val-data; the same tokenizer and an unknown one (hash 0) pass;
#     text where the model has a tokenizer is refused as either;
#   - a loss mask: eval's loss is the mean over the counted targets (held
#     to the per-token losses read back through two evals: all ones and
#     the mask), a mask of zeros is refused by eval, and train says that a
#     step had no counted target;
#   - eval runs the tiered engine's forward alone: its loss is the
#     reference trainer's (eval --reference), GPT-2 and LLaMA, plain and
#     masked, W in vram, in host and on nvme; a budget below the plan's
#     minimum is refused (exit 2, one line naming the tier).
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-data-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
# shellcheck source=check.sh
. "$(dirname "$0")/check.sh"
quiet_refusals=1

# shard FILE FIRST N HASH MASK [DOCS]: N tokens (uint16) from a fixed
# stream at FIRST, strata's extension with HASH (a number, or a file:
# XXH3-64 of its bytes, through the libxxhash strata links), MASK (none,
# ones, zeros or spans: 23 tokens out, 11 in) and, with DOCS, documents
# starting every DOCS tokens
shard() {
	python3 - "$@" <<'PY'
import ctypes, os, struct, sys
path, first, n, hsh, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
docs = list(range(0, n, int(sys.argv[6]))) if len(sys.argv) > 6 else []
if os.path.exists(hsh):
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    raw = open(hsh, "rb").read()
    h = lib.XXH3_64bits(raw, len(raw))
else:
    h = int(hsh)
x, toks = 7, []
for i in range(first + n):
    x = (x * 1103515245 + 12345) % (1 << 31)
    toks.append(32 + (x >> 8) % 90)
toks = toks[first:]
m = {"none": None, "ones": bytes([1] * n), "zeros": bytes(n),
     "spans": bytes(1 if (first + i) % 34 >= 23 else 0 for i in range(n))}[mask]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
if h or m is not None or docs:
    hdr[3], hdr[4] = 0x41525453, (1 if m is not None else 0) | (2 if docs else 0)
    hdr[5], hdr[6] = h & 0xffffffff, h >> 32
    hdr[5:7] = [v - (1 << 32) if v >= 1 << 31 else v for v in hdr[5:7]]
    hdr[7] = len(docs)
body = struct.pack("<256i", *hdr) + struct.pack(f"<{n}H", *toks) + (m or b"")
if docs:
    body += bytes(-len(body) % 8) + struct.pack(f"<{len(docs)}Q", *docs)
with open(path, "wb") as f:
    f.write(body)
PY
}

model=(--model layers=1,dim=32,heads=2,vocab=256,ctx=32 --batch 2 --seq 16 --lr 1e-3
	--warmup 0 --gpu-mem 256M --host-mem 256M --nvme "$work" --log-every 1000)
sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---- several files ------------------------------------------------------
mkdir -p "$work/parts"
shard "$work/all.bin" 0 3000 0 none
shard "$work/parts/a.bin" 0 1000 0 none
shard "$work/parts/b.bin" 1000 1500 0 none
shard "$work/parts/c.bin" 2500 500 0 none
check "train on the one shard" 0 "$strata" train "${model[@]}" --data "$work/all.bin" --steps 4 \
	--save "$work/one"
check "train --data a.bin,b.bin,c.bin" 0 "$strata" train "${model[@]}" --steps 4 \
	--data "$work/parts/a.bin,$work/parts/b.bin,$work/parts/c.bin" --save "$work/list"
check "train --data 'parts/*.bin'" 0 "$strata" train "${model[@]}" --steps 4 \
	--data "$work/parts/*.bin" --save "$work/glob"
for r in list glob; do
	if [ "$(sha "$work/one/latest/model.safetensors")" = "$(sha "$work/$r/latest/model.safetensors")" ]; then
		echo "ok   --data as a $r = the concatenated shard, bit for bit"
	else
		echo "FAIL --data as a $r: other weights than the concatenated shard"; fail=1
	fi
done
check "eval on the one shard" 0 "$strata" eval --ckpt "$work/one/latest" --data "$work/all.bin"
one=$(cat "$work/out")
check "eval on the pattern" 0 "$strata" eval --ckpt "$work/one/latest" --data "$work/parts/*.bin"
if [ "$(cat "$work/out")" = "$one" ]; then
	echo "ok   eval --data 'parts/*.bin' = eval of the concatenated shard ($one)"
else
	echo "FAIL eval of the pattern: $(cat "$work/out"), of the shard: $one"; fail=1
fi
check "a second --data is refused" 2 "$strata" train "${model[@]}" --data "$work/all.bin" \
	--data "$work/parts/a.bin"
grep -q "given twice" "$work/err" || { echo "FAIL: the refusal does not say why"; fail=1; }
check "eval: a second --data is refused" 2 "$strata" eval --ckpt "$work/one/latest" \
	--data "$work/all.bin" --data "$work/parts/a.bin"
check "an empty list item is refused" 2 "$strata" train "${model[@]}" \
	--data "$work/parts/a.bin,,$work/parts/b.bin"
check "a pattern without a match is refused" 2 "$strata" train "${model[@]}" \
	--data "$work/none/*.bin"
printf 'some text' >"$work/parts/t.txt"
check "text mixed with shards is refused" 2 "$strata" train "${model[@]}" \
	--data "$work/parts/a.bin,$work/parts/t.txt"

# ---- the shard's tokenizer ----------------------------------------------
printf '{"model": "a"}' >"$work/tok-a.json"
printf '{"model": "b"}' >"$work/tok-b.json"
cp "$work/tok-a.json" "$work/one/tokenizer.json" # the model's: beside its checkpoints
shard "$work/by-a.bin" 0 3000 "$work/tok-a.json" none
shard "$work/by-b.bin" 0 3000 "$work/tok-b.json" none
check "train --init, a shard of another tokenizer is refused" 2 "$strata" train "${model[@]}" \
	--init "$work/one/latest" --data "$work/by-b.bin" --steps 1
grep -q "strata tokenize --tokenizer $work/one" "$work/err" ||
	{ echo "FAIL: the refusal does not name the tokenize command"; fail=1; }
check "train --init, the model's tokenizer passes" 0 "$strata" train "${model[@]}" \
	--init "$work/one/latest" --data "$work/by-a.bin" --steps 1
check "train --init, an unknown tokenizer (0) passes" 0 "$strata" train "${model[@]}" \
	--init "$work/one/latest" --data "$work/all.bin" --steps 1
check "train --resume, a shard of another tokenizer is refused" 2 "$strata" train "${model[@]}" \
	--resume "$work/one/latest" --data "$work/by-b.bin" --steps 5
check "eval, a shard of another tokenizer is refused" 2 "$strata" eval \
	--ckpt "$work/one/latest" --data "$work/by-b.bin"
check "eval --tokenizer, a shard of another tokenizer is refused" 2 "$strata" eval \
	--ckpt "$work/list/latest" --tokenizer "$work/tok-a.json" --data "$work/by-b.bin"
check "eval, the model's tokenizer passes" 0 "$strata" eval --ckpt "$work/one/latest" \
	--data "$work/by-a.bin"
check "two tokenizers in one --data are refused" 2 "$strata" train "${model[@]}" \
	--data "$work/by-a.bin,$work/by-b.bin"
# --val-data is held to the same tokenizer as --data
check "train --init, a --val-data of another tokenizer is refused" 2 "$strata" train \
	"${model[@]}" --init "$work/one/latest" --data "$work/by-a.bin" \
	--val-data "$work/by-b.bin" --eval-every 1 --steps 1
grep -q "^strata: --val-data $work/by-b.bin was made by another tokenizer" "$work/err" ||
	{ echo "FAIL: the --val-data refusal does not name the flag"; fail=1; }
check "train --resume, a --val-data of another tokenizer is refused" 2 "$strata" train \
	"${model[@]}" --resume "$work/one/latest" --data "$work/by-a.bin" \
	--val-data "$work/by-b.bin" --eval-every 1 --steps 5
check "train --init, a --val-data of the model's tokenizer passes" 0 "$strata" train \
	"${model[@]}" --init "$work/one/latest" --data "$work/by-a.bin" \
	--val-data "$work/by-a.bin" --eval-every 1 --steps 1
# text where the model has a tokenizer (its vocab is not the bytes'):
# refused as --data and as --val-data
"$strata" train --model layers=1,dim=32,heads=2,vocab=300,ctx=32 --batch 2 --seq 16 \
	--data "$work/all.bin" --steps 1 --save "$work/v300" >"$work/log" 2>&1 ||
	{ echo "FAIL a vocab-300 run"; tail -3 "$work/log"; fail=1; }
cp "$work/tok-a.json" "$work/v300/tokenizer.json"
check "train --init, text as --data with a tokenizer is refused" 2 "$strata" train \
	--batch 2 --seq 16 --init "$work/v300/latest" --data "$work/parts/t.txt" --steps 1
grep -q "^strata: --data $work/parts/t.txt is text, and --init $work/v300/latest has a tokenizer" \
	"$work/err" || { echo "FAIL: the text refusal says $(cat "$work/err")"; fail=1; }
check "train --init, text as --val-data with a tokenizer is refused" 2 "$strata" train \
	--batch 2 --seq 16 --init "$work/v300/latest" --data "$work/by-a.bin" \
	--val-data "$work/parts/t.txt" --eval-every 1 --steps 1
grep -q "^strata: --val-data $work/parts/t.txt is text" "$work/err" ||
	{ echo "FAIL: the --val-data text refusal says $(cat "$work/err")"; fail=1; }
check "train --resume, text as --val-data with a tokenizer is refused" 2 "$strata" train \
	--resume "$work/v300/latest" --data "$work/by-a.bin" --val-data "$work/parts/t.txt" \
	--eval-every 1 --steps 3

# ---- a loss mask --------------------------------------------------------
shard "$work/masked.bin" 0 3000 0 spans
shard "$work/ones.bin" 0 3000 0 ones
shard "$work/zeros.bin" 0 3000 0 zeros
check "eval on a mask of ones" 0 "$strata" eval --ckpt "$work/one/latest" --data "$work/ones.bin"
ones=$(cat "$work/out")
if [ "$(echo "$ones" | cut -d' ' -f2)" = "$(echo "$one" | cut -d' ' -f2)" ]; then
	echo "ok   eval: a mask of ones = no mask ($ones)"
else
	echo "FAIL eval: a mask of ones $ones, no mask $one"; fail=1
fi
check "eval on the masked shard" 0 "$strata" eval --ckpt "$work/one/latest" --data "$work/masked.bin"
masked=$(cat "$work/out")
if [ "$(echo "$masked" | cut -d' ' -f2)" != "$(echo "$one" | cut -d' ' -f2)" ]; then
	echo "ok   eval: the masked loss differs ($masked)"
else
	echo "FAIL eval: the masked loss is the plain one"; fail=1
fi
check "eval: a mask of zeros is refused" 2 "$strata" eval --ckpt "$work/one/latest" \
	--data "$work/zeros.bin"
check "train on a mask of zeros" 0 "$strata" train "${model[@]}" --data "$work/zeros.bin" \
	--steps 2 --log-every 1
grep -q "no target the loss mask counts: skipped" "$work/out" ||
	{ echo "FAIL: the progress line does not say the step had no counted target"; fail=1; }
check "train on the masked shard" 0 "$strata" train "${model[@]}" --data "$work/masked.bin" --steps 2

# ---- --samples documents ------------------------------------------------
shard "$work/docs.bin" 0 3000 0 spans 70
check "--samples documents: a shard without documents is refused" 2 "$strata" train \
	"${model[@]}" --data "$work/masked.bin" --samples documents
grep -q "no document starts" "$work/err" || { echo "FAIL: the refusal does not say why"; fail=1; }
check "--samples bogus is refused" 2 "$strata" train "${model[@]}" --data "$work/docs.bin" \
	--samples bogus
docs=("${model[@]}" --data "$work/docs.bin" --samples documents --log-every 1)
check "train --samples documents, 250 steps (epochs)" 0 "$strata" train "${docs[@]}" --steps 250 \
	--save "$work/dall" --save-every 120 --metrics "$work/dall.jsonl"
if grep -q "^step 250/250 | epoch 2\.[0-9][0-9] | loss" "$work/out"; then
	echo "ok   the progress line shows the epochs ($(grep -o 'epoch [0-9.]*' "$work/out" | tail -1))"
else
	echo "FAIL: no epoch in the progress line"; grep "^step 250" "$work/out"; fail=1
fi
grep -q '"epoch":' "$work/dall.jsonl" || { echo "FAIL: no epoch in --metrics"; fail=1; }
shard "$work/docs-nomask.bin" 0 3000 0 none 70
check "train --samples documents without a mask (padding ignored)" 0 "$strata" train \
	"${model[@]}" --data "$work/docs-nomask.bin" --samples documents --steps 3
check "eval of documents without a mask" 0 "$strata" eval --ckpt "$work/dall/latest" \
	--data "$work/docs-nomask.bin"
check "--resume from step 120 (mid-epoch) to step 250" 0 "$strata" train "${docs[@]}" \
	--steps 250 --save "$work/dpart" --resume "$(ls -d "$work"/dall/step-*120)"
if [ "$(sha "$work/dall/latest/model.safetensors")" = "$(sha "$work/dpart/latest/model.safetensors")" ]; then
	echo "ok   --samples documents resumed mid-epoch = uninterrupted, bit for bit"
else
	echo "FAIL --samples documents: the resumed run differs"; fail=1
fi
# --resume without --samples takes the checkpoint's (documents)
check "--resume without --samples: the saved documents" 0 "$strata" train "${model[@]}" \
	--data "$work/docs.bin" --steps 250 --save "$work/dpart2" --resume "$(ls -d "$work"/dall/step-*120)"
[ "$(sha "$work/dall/latest/model.safetensors")" = "$(sha "$work/dpart2/latest/model.safetensors")" ] ||
	{ echo "FAIL --resume without --samples: differs from the documents run"; fail=1; }
quiet_refusals=0 # train prints its plan before it reads the checkpoint
check "--resume with --samples windows is refused" 2 "$strata" train "${model[@]}" \
	--data "$work/docs.bin" --samples windows --steps 250 --resume "$(ls -d "$work"/dall/step-*120)"

# ---- --packing isolated ---------------------------------------------------
# documents of 13 tokens, rows of 32: two whole ones a row, so that
# isolating them changes the numbers; saved in trainer.json, kept by a
# --resume that does not name it, and a resume that changes it refused
quiet_refusals=1
shard "$work/docs13.bin" 0 3000 0 spans 13
iso=("${model[@]}" --seq 32 --data "$work/docs13.bin" --log-every 1)
check "--packing isolated without --samples documents is refused" 2 "$strata" train \
	"${iso[@]}" --packing isolated
check "--packing bogus is refused" 2 "$strata" train "${iso[@]}" --samples documents \
	--packing bogus
check "train --samples documents --packing isolated, 20 steps" 0 "$strata" train "${iso[@]}" \
	--samples documents --packing isolated --steps 20 --save "$work/iso" --save-every 10
check "train --samples documents (packed, the default), 20 steps" 0 "$strata" train \
	"${iso[@]}" --samples documents --steps 20 --save "$work/pk"
if [ "$(sha "$work/iso/latest/model.safetensors")" != "$(sha "$work/pk/latest/model.safetensors")" ]; then
	echo "ok   isolated documents train otherwise than packed ones"
else
	echo "FAIL --packing isolated: the same weights as packed"; fail=1
fi
grep -q '"packing": *"isolated"' "$work/iso/latest/trainer.json" ||
	{ echo "FAIL: trainer.json does not say packing isolated"; fail=1; }
grep -q '"packing"' "$work/pk/latest/trainer.json" &&
	{ echo "FAIL: a packed run's trainer.json names packing (it was absent before)"; fail=1; }
check "--resume without --samples and --packing: the saved isolated" 0 "$strata" train \
	"${iso[@]}" --steps 20 --save "$work/iso2" --resume "$(ls -d "$work"/iso/step-*10)"
[ "$(sha "$work/iso/latest/model.safetensors")" = "$(sha "$work/iso2/latest/model.safetensors")" ] ||
	{ echo "FAIL --resume without --packing: differs from the isolated run"; fail=1; }
quiet_refusals=0
check "--resume with --packing packed is refused" 2 "$strata" train "${iso[@]}" \
	--packing packed --steps 20 --resume "$(ls -d "$work"/iso/step-*10)"
grep -q "packing" "$work/err" || { echo "FAIL: the refusal does not name packing"; fail=1; }

# ---- eval through the engine = the reference trainer --------------------
check "train a LLaMA" 0 "$strata" train --model llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=32 \
	--batch 2 --seq 16 --lr 1e-3 --warmup 0 --gpu-mem 256M --host-mem 256M --nvme "$work" \
	--log-every 1000 --data "$work/all.bin" --steps 4 --save "$work/llama"
for ck in one llama; do
	for d in all masked; do
		check "eval --reference $ck $d" 0 "$strata" eval --ckpt "$work/$ck/latest" \
			--data "$work/$d.bin" --batch 2 --seq 16 --reference
		ref=$(cat "$work/out")
		for w in none host nvme; do
			check "eval $ck $d, W $w" 0 "$strata" eval --ckpt "$work/$ck/latest" \
				--data "$work/$d.bin" --batch 2 --seq 16 --offload-params $w --nvme "$work"
			if [ "$(cat "$work/out")" = "$ref" ]; then
				echo "ok   eval $ck $d, W $w = the reference trainer ($ref)"
			else
				echo "FAIL eval $ck $d, W $w: $(cat "$work/out"), the reference: $ref"; fail=1
			fi
		done
	done
done
quiet_refusals=1
check "eval: a budget below the minimum is refused" 2 "$strata" eval --ckpt "$work/llama/latest" \
	--data "$work/all.bin" --gpu-mem 64K
grep -q "vram budget .* below the minimum" "$work/err" ||
	{ echo "FAIL: the refusal does not name the tier: $(cat "$work/err")"; fail=1; }

exit $fail
