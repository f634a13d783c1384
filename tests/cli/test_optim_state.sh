#!/usr/bin/env bash
# strata train --optim-state bf16|q8 (docs/optim.md, "Compact state"):
#   - placement invariance: bit-identical losses, norms and checkpoint bytes
#     whether G, P, M, V live in host or on nvme (W in vram, host or nvme),
#     at prefetch 1 and at 1 thread as at 2, for each compact format;
#   - the compact formats did run: their losses are not fp32's;
#   - resume: 4 steps then a resume to 8 give the bits of 8 straight
#     (losses and checkpoint bytes); a resume with another --optim-state
#     converts (the checkpoint holds M and V decoded to fp32, and names the
#     format in optimizer.safetensors' metadata);
#   - strata export of a compact checkpoint: the weights alone, as ever;
#   - strata plan: M and V's host bytes and the AdamW bytes shrink; q8's
#     scales are a host pool;
#   - refusals, one line and exit 2: a bad value, --offload-optim vram (train
#     and plan), ZeRO at world > 1 (plan).
# usage: test_optim_state.sh STRATA
set -u
strata=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${ST_TEST_DIR:-/tmp}/optim-state.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
. "$here/check.sh"
quiet_refusals=1

check "optim-state fp8 refused" 2 "$strata" train --optim-state fp8 --steps 1
check "optim-state q8 with offload-optim vram refused" 2 "$strata" train --optim-state q8 \
	--offload-optim vram --steps 1
grep -q "offload-optim vram" "$work/err" || { echo "FAIL: message"; fail=1; }
check "plan optim-state bf16 with offload-optim vram refused" 2 "$strata" plan \
	--optim-state bf16 --offload-optim vram
check "plan optim-state q8 at world 2 refused" 2 "$strata" plan --optim-state q8 --world 2 \
	--zero 1

mkdir -p "$work/nvme"
short=(--steps 4 --batch 4 --seq 64 --log-every 100 --nvme "$work/nvme")
fp() { # name: the losses, norms and checkpoint bytes of run NAME
	python3 - "$work/m-$1.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))
PY
	sha256sum "$work/ck-$1"/latest/model.safetensors "$work/ck-$1"/latest/optimizer.safetensors |
		cut -d' ' -f1
}
run() { # name, args...
	local name=$1
	shift
	rm -rf "$work/ck-$name"
	check "$name" 0 "$strata" train "${short[@]}" "$@" --metrics "$work/m-$name.jsonl" \
		--save "$work/ck-$name" || return
	fp "$name" >"$work/fp-$name"
}
same() { # a b
	if cmp -s "$work/fp-$1" "$work/fp-$2"; then
		echo "ok   $2 = $1"
	else
		echo "FAIL $2 differs from $1"; diff "$work/fp-$1" "$work/fp-$2" | head -5; fail=1
	fi
}
run fp32 --offload-params host --offload-optim host --host-mem 64M
for st in bf16 q8; do
	run $st-host --optim-state $st --offload-params host --offload-optim host --host-mem 64M
	run $st-nvme --optim-state $st --offload-params nvme --offload-optim nvme --host-mem 32M
	run $st-vram --optim-state $st --offload-params none --offload-optim host --gpu-mem 64M \
		--host-mem 64M
	run $st-mixed --optim-state $st --offload-params host --offload-optim nvme --prefetch 1
	OMP_NUM_THREADS=1 run $st-t1 --optim-state $st --offload-optim nvme
	for n in nvme vram mixed t1; do same $st-host $st-$n; done
	if cmp -s <(head -4 "$work/fp-fp32") <(head -4 "$work/fp-$st-host"); then
		echo "FAIL $st losses equal fp32's: the compact state did not run"; fail=1
	fi
	# resume: 4 then 8 = 8 straight
	rm -rf "$work/r8" "$work/r4"
	check "$st 8 steps, saved every 4" 0 "$strata" train "${short[@]:2}" --steps 8 \
		--optim-state $st --offload-optim nvme --metrics "$work/m-r8.jsonl" --save "$work/r8" \
		--save-every 4 --keep 2
	check "$st resumed at 4" 0 "$strata" train "${short[@]:2}" --steps 8 --optim-state $st \
		--offload-optim nvme --resume "$work/r8/step-000004" --metrics "$work/m-r4.jsonl" \
		--save "$work/r4"
	if [ "$(tail -1 "$work/m-r8.jsonl" | cut -d, -f1-4)" = \
	     "$(tail -1 "$work/m-r4.jsonl" | cut -d, -f1-4)" ] &&
	   cmp -s "$work/r8/latest/optimizer.safetensors" "$work/r4/latest/optimizer.safetensors" &&
	   cmp -s "$work/r8/latest/model.safetensors" "$work/r4/latest/model.safetensors"; then
		echo "ok   $st resume bit-identical"
	else
		echo "FAIL $st resume differs"; fail=1
	fi
	if head -c 4096 "$work/r8/latest/optimizer.safetensors" |
	   grep -q "\"strata_optim_state\":\"$st\""; then
		echo "ok   $st recorded in optimizer.safetensors"
	else
		echo "FAIL $st not recorded in optimizer.safetensors"; fail=1
	fi
	# the HF export is the model's weights, as with fp32 state
	rm -rf "$work/hf"
	check "$st export hf" 0 "$strata" export --ckpt "$work/r8" --out "$work/hf"
	if grep -rq "strata_optim_state\|exp_avg" "$work/hf"; then
		echo "FAIL $st export carries optimizer state"; fail=1
	fi
	check "$st checkpoint resumed as fp32 (converted)" 0 "$strata" train "${short[@]:2}" \
		--steps 8 --resume "$work/r8/step-000004"
done

# the plan's bytes: M and V at a half (bf16) and about a quarter (q8)
for st in fp32 bf16 q8; do
	check "plan $st" 0 "$strata" plan --optim-state $st --offload-optim host --json
	cp "$work/out" "$work/plan-$st.json"
done
# q8's scales: a host pool of the plan, printed
check "plan q8 text" 0 "$strata" plan --optim-state q8 --offload-optim nvme --nvme "$work/nvme"
if grep -q "^ *q8 scales M,V " "$work/out"; then
	echo "ok   plan q8 prints its scales pool"
else
	echo "FAIL plan q8: no scales pool"; fail=1
fi
python3 - "$work"/plan-{fp32,bf16,q8}.json <<'PY' || fail=1
import json, sys
p = [json.load(open(f)) for f in sys.argv[1:]]
host = [x["tiers"]["host"]["total_bytes"] for x in p]
adam = [x["time"]["adam_bytes"] for x in p]
print(f"ok   plan host bytes {host}, adam bytes {adam}")
if not (host[0] > host[1] > host[2] and adam[0] > adam[1] > adam[2]):
    sys.exit("FAIL the compact states' bytes do not shrink")
if abs(adam[1] / adam[0] - 22 / 30) > 0.01:
    sys.exit("FAIL bf16 AdamW bytes are not 22/30 of fp32's")
PY
exit $fail
