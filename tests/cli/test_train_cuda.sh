#!/usr/bin/env bash
# strata train --device cuda from the command line, against --device cpu,
# for each family with a bf16 path (a GPU only: exit 77 elsewhere;
# tools/gpu-check's train_cuda step runs it):
#   - LLaMA from a Hugging Face directory (--init DIR: strata export's of
#     a one-step checkpoint of GQA 2/1, llama3 rope scaling, an untied
#     head) and GPT-2 (--model dims), both at head size 64, which the bf16
#     attention takes;
#   - fp32 on cuda = fp32 on cpu within 1e-3 relative at every step (loss
#     and gradient norm; the kernels differ, as in test_engine's
#     cuda-against-cpu case);
#   - bf16 on cuda: finite, within 1% of fp32 on cuda at every step and not
#     equal to it (bf16 ran), and within 1% of bf16 on cpu;
#   - strata generate's KV cache on --device cuda prints, greedy, the text
#     it prints on --device cpu (a LLaMA with GQA and a GPT-2 trained on
#     the cpu until their argmax is clear).
# usage: test_train_cuda.sh STRATA
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-train-cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
# shellcheck source=check.sh
. "$(dirname "$0")/check.sh"

if ! "$strata" info 2>&1 | grep -q '^strata .*devices .*cuda'; then
	echo "this strata has no cuda device: skipped"; exit 77
fi
if "$strata" info 2>&1 | grep -q '^gpu  *none'; then echo "no GPU: skipped"; exit 77; fi

text "$work/data.txt" 3 the engine streams each unit to the device and back again
# the LLaMA directory: a step on the cpu, exported as transformers writes
# one (config.json, model.safetensors)
llama=llama:layers=2,dim=128,heads=2,kv-heads=1,ffn=256,vocab=256,ctx=128,tied=0
llama+=,rope-theta=500000,rope-scaling=llama3:8:1:4:32
check "LLaMA checkpoint (cpu)" 0 "$strata" train --model "$llama" --data "$work/data.txt" \
	--steps 1 --batch 2 --seq 32 --nvme none --save "$work/ck" || exit 1
check "LLaMA exported as a Hugging Face directory" 0 "$strata" export --ckpt "$work/ck" \
	--out "$work/hf" || exit 1
grep -q '"model_type": "llama"' "$work/hf/config.json" ||
	{ echo "FAIL the export's config.json is not LLaMA's"; cat "$work/hf/config.json"; exit 1; }
common=(--data "$work/data.txt" --steps 8 --batch 4 --seq 64 --warmup 2 --seed 7
	--gpu-mem 1G --host-mem 1G --nvme none --log-every 100)

# train TAG DEVICE DTYPE MODEL-ARGS...: $work/TAG.jsonl
train() {
	local tag=$1 dev=$2 dt=$3
	shift 3
	check "$tag: --device $dev --compute-dtype $dt" 0 "$strata" train "${common[@]}" "$@" \
		--device "$dev" --compute-dtype "$dt" --metrics "$work/$tag.jsonl"
}

gpt2=layers=2,dim=128,heads=2,vocab=256,ctx=64
for fam in llama gpt2; do
	case $fam in
	llama) model=(--init "$work/hf") ;; # its config.json gives the model
	gpt2) model=(--model "$gpt2") ;;
	esac
	train "$fam-cpu-fp32" cpu fp32 "${model[@]}" || continue
	train "$fam-cuda-fp32" cuda fp32 "${model[@]}" || continue
	train "$fam-cpu-bf16" cpu bf16 "${model[@]}" || continue
	train "$fam-cuda-bf16" cuda bf16 "${model[@]}" || continue
	python3 - "$work" "$fam" <<'PY' || fail=1
import json, math, sys
work, fam = sys.argv[1:]
def load(tag):
    return [json.loads(l) for l in open(f"{work}/{fam}-{tag}.jsonl")]
cf, gf, cb, gb = load("cpu-fp32"), load("cuda-fp32"), load("cpu-bf16"), load("cuda-bf16")
bad = []
if not (len(cf) == len(gf) == len(cb) == len(gb) == 8):
    bad.append(f"steps: {len(cf)} {len(gf)} {len(cb)} {len(gb)}, want 8 each")
def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a)
worst = {"fp32": 0.0, "bf16/fp32": 0.0, "bf16": 0.0}
for s, (a, b, c, d) in enumerate(zip(cf, gf, cb, gb), 1):
    for k in ("loss", "grad_norm"):
        for r in (a, b, c, d):
            if not isinstance(r.get(k), (int, float)) or not math.isfinite(r[k]):
                bad.append(f"step {s}: {k} not finite: {r.get(k)}")
        if bad:
            continue
        e = rel(b[k], a[k])
        worst["fp32"] = max(worst["fp32"], e)
        if not e <= 1e-3:
            bad.append(f"step {s}: {k} fp32 cuda {b[k]:.9g} cpu {a[k]:.9g} (rel {e:.2e} > 1e-3)")
    if bad:
        continue
    e = rel(d["loss"], b["loss"])
    worst["bf16/fp32"] = max(worst["bf16/fp32"], e)
    if not e < 0.01:
        bad.append(f"step {s}: loss bf16 cuda {d['loss']:.6f} fp32 cuda {b['loss']:.6f} (rel {e:.2e} >= 1%)")
    e = rel(d["loss"], c["loss"])
    worst["bf16"] = max(worst["bf16"], e)
    if not e < 0.01:
        bad.append(f"step {s}: loss bf16 cuda {d['loss']:.6f} bf16 cpu {c['loss']:.6f} (rel {e:.2e} >= 1%)")
if not bad and all(x["loss"] == y["loss"] for x, y in zip(gb, gf)):
    bad.append("bf16 losses on cuda equal fp32's bit for bit: bf16 did not run")
for b in bad[:5]:
    print(f"FAIL {fam}: {b}")
if bad:
    sys.exit(1)
print(f"ok   {fam}: cuda fp32 = cpu within {worst['fp32']:.1e} (bar 1e-3); cuda bf16 within "
      f"{worst['bf16/fp32']:.1e} of cuda fp32 and {worst['bf16']:.1e} of cpu bf16 (bar 1e-2); "
      f"loss {gf[0]['loss']:.4f} -> {gf[-1]['loss']:.4f} (fp32), {gb[-1]['loss']:.4f} (bf16)")
PY
done
# generate: the decoder's ops (rope at absolute positions, the attention
# over the cache) on the GPU against the cpu device, greedy
for model in "$llama" "gpt2:$gpt2"; do
	tag=gen-${model%%:*}
	check "$tag: trained on the cpu" 0 "$strata" train --model "$model" --data "$work/data.txt" \
		--steps 150 --batch 4 --seq 64 --lr 1e-2 --device cpu --nvme none --save "$work/$tag" ||
		continue
	for dev in cpu cuda; do
		"$strata" generate --ckpt "$work/$tag" --prompt "the engine" --tokens 48 \
			--temperature 0 --device $dev >"$work/$tag.$dev" 2>&1 ||
			{ echo "FAIL $tag: generate --device $dev"; cat "$work/$tag.$dev"; fail=1; }
	done
	if cmp -s "$work/$tag.cpu" "$work/$tag.cuda"; then
		echo "ok   $tag: generate --device cuda = --device cpu: $(head -c 60 "$work/$tag.cuda")"
	else
		echo "FAIL $tag: generate --device cuda differs from cpu"; cat "$work/$tag.cpu" "$work/$tag.cuda"
		fail=1
	fi
done
[ $fail = 0 ] && echo PASS
exit $fail
