#!/usr/bin/env bash
# strata train --compute-dtype bf16 on the cpu device (docs/model.md, "bf16
# compute"), for each family with a bf16 path (GPT-2, LLaMA):
#   - the issue's target: the loss after 200 steps of a small model on the
#     same data within 1% of fp32's (and not bit-equal: bf16 did run);
#   - placement invariance: bit-identical losses, norms and checkpoint
#     bytes whether W lives in vram, host or nvme, at prefetch 1, with
#     every block keeping its forward, at 1 thread as at 2, and with fp32 W
#     rounded on the device
#     (--precision fp32 keeps fp32 masters; the numbers differ from bf16 W
#     only through W, so that one is compared with itself across homes);
#   - strata eval and generate at bf16 on a checkpoint (eval within 1%);
#   - bad input: --compute-dtype fp16 and --precision fp16 refused (exit 2,
#     one line).
# With "strict" (bf16-strict): the placement runs on the cpu-strict device
# (docs/gpu.md, "Strict mode"), the same bits as on the plain cpu device;
# the 200 steps, eval, generate and the refusals are the plain run's.
# usage: test_bf16.sh STRATA [strict]
set -u
strata=$1 mode=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${ST_TEST_DIR:-/tmp}/bf16.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
. "$here/check.sh"
quiet_refusals=1

dev=()
if [ "$mode" = strict ]; then
	dev=(--device cpu-strict)
else
	check "compute-dtype fp16 refused" 2 "$strata" train --compute-dtype fp16 --steps 1
	grep -q "compute-dtype fp16" "$work/err" || { echo "FAIL: message"; fail=1; }
	check "precision fp16 refused" 2 "$strata" train --precision fp16 --steps 1
fi

# family NAME MODEL-ARGS...: every check below for one family
family() {
fam=$1
shift
model=("$@")
# the loss after 200 steps
common=("${model[@]}" --steps 200 --batch 4 --seq 64 --log-every 1000)
if [ "$mode" != strict ]; then
for cd in fp32 bf16; do
	check "$fam 200 steps $cd" 0 "$strata" train "${common[@]}" --compute-dtype $cd \
		--metrics "$work/m200-$fam-$cd.jsonl"
done
python3 - "$work/m200-$fam-fp32.jsonl" "$work/m200-$fam-bf16.jsonl" "$fam" <<'PY' || fail=1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 200, (len(a), len(b))
la, lb = a[-1]["loss"], b[-1]["loss"]
m10a = sum(r["loss"] for r in a[-10:]) / 10
m10b = sum(r["loss"] for r in b[-10:]) / 10
rel, rel10 = abs(lb - la) / la, abs(m10b - m10a) / m10a
print(f"ok   {sys.argv[3]} loss after 200 steps: fp32 {la:.6f} bf16 {lb:.6f} (rel {rel:.2e}); "
      f"last 10 mean fp32 {m10a:.6f} bf16 {m10b:.6f} (rel {rel10:.2e})")
if not (rel < 0.01 and rel10 < 0.01):
    sys.exit("FAIL bf16 loss not within 1% of fp32")
if all(x["loss"] == y["loss"] for x, y in zip(a, b)):
    sys.exit("FAIL bf16 losses equal fp32's bit for bit: bf16 did not run")
if not (b[0]["loss"] > b[-1]["loss"] + 1.0):
    sys.exit("FAIL bf16 did not learn")
PY
fi

# placement invariance: the same numbers and checkpoint bytes everywhere
mkdir -p "$work/nvme"
short=("${model[@]}" "${dev[@]}" --steps 4 --batch 4 --seq 64 --log-every 100 --nvme "$work/nvme"
       --compute-dtype bf16)
run() { # name, args...
	local name=$1
	shift
	rm -rf "$work/ck"
	check "$fam bf16 $name" 0 "$strata" train "${short[@]}" "$@" --metrics "$work/m-$name.jsonl" \
		--save "$work/ck" || return
	python3 - "$work/m-$name.jsonl" >"$work/fp-$name" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))
PY
	sha256sum "$work"/ck/latest/model.safetensors "$work"/ck/latest/optimizer.safetensors |
		cut -d' ' -f1 >>"$work/fp-$name"
}
same() { # a b
	if cmp -s "$work/fp-$1" "$work/fp-$2"; then
		echo "ok   $fam bf16 $2 = $1"
	else
		echo "FAIL $fam bf16 $2 differs from $1"; diff "$work/fp-$1" "$work/fp-$2" | head -5; fail=1
	fi
}
run default
run vram --offload-params none --offload-optim host --gpu-mem 64M --host-mem 64M
run host --offload-params host --offload-optim host --host-mem 64M
run nvme --offload-params nvme --offload-optim nvme --host-mem 32M
run prefetch1 --prefetch 1
run keep --recompute none --gpu-mem 256M
run keep-nvme --recompute none --gpu-mem 256M --offload-params nvme --host-mem 32M
OMP_NUM_THREADS=1 run threads1
for n in vram host nvme prefetch1 keep keep-nvme threads1; do same default $n; done
# fp32 W rounded to bf16 on the device: invariant across homes too
run w32 --precision fp32
run w32-nvme --precision fp32 --offload-params nvme --offload-optim nvme --host-mem 32M
same w32 w32-nvme
if [ "$mode" = strict ]; then # the strict runs = the plain cpu device's
	run plain --device cpu
	same plain default
	run plain-w32 --device cpu --precision fp32
	same plain-w32 w32
	return
fi
# eval and generate at bf16 on that checkpoint: the loss within 1% of
# fp32's and not equal to it; a bad value refused
for cd in fp32 bf16; do
	check "$fam eval $cd" 0 "$strata" eval --ckpt "$work/ck" --data "$here/check.sh" --seq 64 \
		--batches 3 --compute-dtype $cd
	sed -n 's/^loss \([0-9.]*\) .*/\1/p' "$work/out" >"$work/eval-$cd"
done
python3 - "$work/eval-fp32" "$work/eval-bf16" "$fam" <<'PY' || fail=1
import sys
a, b = (float(open(p).read()) for p in sys.argv[1:3])
print(f"ok   {sys.argv[3]} eval loss fp32 {a:.6f} bf16 {b:.6f} (rel {abs(b - a) / a:.2e})")
if not abs(b - a) / a < 0.01 or a == b:
    sys.exit("FAIL eval at bf16")
PY
check "$fam generate bf16" 0 "$strata" generate --ckpt "$work/ck" --tokens 8 --compute-dtype bf16
check "$fam eval compute-dtype fp8 refused" 2 "$strata" eval --ckpt "$work/ck" \
	--data "$here/check.sh" --compute-dtype fp8
# the bf16 path is not the fp32 one
rm -rf "$work/ck"
# (short ends with "--compute-dtype bf16"; $work's name holds "bf16" too)
check "$fam fp32 4 steps" 0 "$strata" train "${short[@]:0:${#short[@]}-1}" fp32 \
	--metrics "$work/m-f.jsonl"
if cmp -s <(head -1 "$work/m-f.jsonl" | cut -d, -f2) <(head -1 "$work/m-default.jsonl" | cut -d, -f2); then
	echo "FAIL $fam bf16 step 1 loss equals fp32's"; fail=1
fi
}

family gpt2
family llama --model llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64
exit $fail
