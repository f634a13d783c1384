#!/usr/bin/env bash
# Validation during training (issue 34): strata train --val-data FILE
# --eval-every N [--val-batches K] [--keep-best].
#   - the train numbers are those of the run without validation (every
#     metrics field but val_loss and the timing);
#   - val_loss after step N is what `strata eval` of the step-N checkpoint
#     gives on the same batches (an independent path: the CLI's eval);
#   - --keep-best: DIR/best names the checkpoint of the lowest val_loss
#     (the validation set is random bytes, so the loss rises as the model
#     learns English and the best is an early one), kept past --keep 1 and
#     across a resume; info --ckpt shows it;
#   - the same at 2 ranks (--zero 1 and 3) as 1 rank at --grad-accum 2;
#   - the refusals: one line, exit 2.
# The commands of docs/finetune.md's "Validation and the best checkpoint".
#   test_val.sh STRATA
set -u
strata=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-val-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$here/check.sh"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir "$work/nvme"
python3 -c 'import random; random.seed(3); open("'"$work"'/val.bin.txt", "wb").write(bytes(random.randrange(256) for _ in range(8192)))'
val=$work/val.bin.txt
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 2"
T="$M --data /usr/share/common-licenses/GPL-3 --seed 5 --nvme $work/nvme --lr 3e-3 --warmup 1"
strip() { sed 's/,"val_loss":[^,]*//; s/,"tokens_per_s".*//' "$1"; }

quiet_refusals=1
check no-val-keep-best 2 "$strata" train $T --steps 2 --save "$work/x" --keep-best
check no-val-eval-every 2 "$strata" train $T --steps 2 --eval-every 2
check no-eval-every 2 "$strata" train $T --steps 2 --val-data "$val"
check keep-best-no-save 2 "$strata" train $T --steps 2 --val-data "$val" --eval-every 1 --keep-best
quiet_refusals=0
check too-many-batches 2 "$strata" train $T --steps 2 --val-data "$val" --eval-every 1 --val-batches 1000
[ -e "$work/x" ] && { echo "FAIL a refusal left --save behind"; fail=1; }

"$strata" train $T --steps 8 --metrics "$work/plain.jsonl" >"$work/log" 2>&1 ||
	{ echo "FAIL plain run"; tail -3 "$work/log"; fail=1; }
check val-run 0 "$strata" train $T --steps 8 --metrics "$work/val.jsonl" --val-data "$val" \
	--eval-every 2 --val-batches 8 --save "$work/ck" --keep 1 --keep-best
grep -q "^step 2/8 | loss [0-9.]* | val_loss [0-9.]* |" "$work/out" ||
	{ echo "FAIL no val_loss in the progress line"; grep "^step 2" "$work/out"; fail=1; }
if [ "$(strip "$work/plain.jsonl")" = "$(strip "$work/val.jsonl")" ]; then
	echo "ok   the train numbers with validation are those without"
else
	echo "FAIL validation changed the train numbers"; diff <(strip "$work/plain.jsonl") <(strip "$work/val.jsonl") | head -4; fail=1
fi
python3 - "$work/val.jsonl" "$work/ck" >"$work/best.txt" <<'PY' || { echo "FAIL val_loss lines"; fail=1; }
import json, os, sys
v = {}
for l in open(sys.argv[1]):
    o = json.loads(l)
    if "val_loss" in o: v[o["step"]] = o["val_loss"]
assert sorted(v) == [2, 4, 6, 8], v
best = min(v, key=v.get)
assert best < 8, ("the validation set should get worse", v)
b = json.load(open(f"{sys.argv[2]}/best.json"))
assert b == {"checkpoint": "step-%06d" % best, "step": best, "val_loss": v[best]}, (b, v)
assert os.readlink(f"{sys.argv[2]}/best") == "step-%06d" % best
print(best, v[best], v[8])
PY
read -r best bestloss lastloss <"$work/best.txt"
bdir=$(printf 'step-%06d' "$best")
[ -d "$work/ck/$bdir" ] && [ -d "$work/ck/step-000008" ] ||
	{ echo "FAIL --keep 1 with --keep-best: $(ls "$work/ck" | tr '\n' ' ')"; fail=1; }
check eval-best 0 "$strata" eval --ckpt "$work/ck/best" --data "$val" --batch 2 --seq 32 --batches 8
grep -q "^loss $(printf '%.6f' "$bestloss") over 8 batches" "$work/out" ||
	{ echo "FAIL eval of ck/best is not its val_loss $bestloss"; cat "$work/out"; fail=1; }
check eval-last 0 "$strata" eval --ckpt "$work/ck/step-000008" --data "$val" --batch 2 --seq 32 --batches 8
grep -q "^loss $(printf '%.6f' "$lastloss") over 8 batches" "$work/out" ||
	{ echo "FAIL eval of step 8 is not its val_loss $lastloss"; cat "$work/out"; fail=1; }
check info-best 0 "$strata" info --ckpt "$work/ck"
grep -q "(best -> $bdir, val_loss " "$work/out" || { echo "FAIL info does not show best"; cat "$work/out"; fail=1; }

# a resume keeps the best it had (a later, worse one does not replace it)
check resume-keep-best 0 "$strata" train --resume "$work/ck" --steps 12 --val-data "$val" \
	--eval-every 2 --val-batches 8 --keep 1 --keep-best
[ "$(readlink "$work/ck/best")" = "$bdir" ] && [ -d "$work/ck/$bdir" ] ||
	{ echo "FAIL best after the resume: $(readlink "$work/ck/best")"; fail=1; }

# --resume DIR/best alone goes on from the best, saving into DIR
nb=$(printf 'step-%06d' $((best + 1)))
check resume-from-best 0 "$strata" train --resume "$work/ck/best" --steps $((best + 1))
[ -d "$work/ck/$nb" ] && [ "$(readlink "$work/ck/latest")" = "$nb" ] ||
	{ echo "FAIL resume-from-best: $(ls "$work/ck" | tr '\n' ' ')"; fail=1; }

# 2 ranks at --zero 1 (and 3: W gathered for the eval) = 1 rank at
# --grad-accum 2, val_loss included
if command -v mpirun >/dev/null 2>&1; then
	"$strata" train $T --steps 4 --grad-accum 2 --val-data "$val" --eval-every 2 --val-batches 4 \
		--metrics "$work/r1.jsonl" >"$work/log" 2>&1 || { echo "FAIL 1 rank"; fail=1; }
	v() { grep -o '"step":[0-9]*,"loss":[^,]*\|"val_loss":[^,]*' "$1"; }
	# rank2 Z: the 2-rank run into r2.jsonl. In an ASan build without
	# LeakSanitizer: on one VM its tracer crashed at a rank's exit in
	# most of these jobs ("Tracer caught signal 11", "LeakSanitizer has
	# encountered a fatal error"; the build before issue 33's G change as
	# well), the checker failing, not a leak it found nor strata. These
	# runs check the numbers; tests/zero's and tests/comm's mpirun jobs
	# check for leaks.
	rank2() {
		rm -f "$work/r2.jsonl"
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
			"$here/../mpi-run" 2 "$strata" train $T --steps 4 --zero "$1" --val-data "$val" \
			--eval-every 2 --val-batches 4 --metrics "$work/r2.jsonl" >"$work/log" 2>&1
	}
	for z in 1 3; do
		rank2 $z || { echo "FAIL 2 ranks --zero $z"; tail -20 "$work/log"; fail=1; }
		if [ -n "$(v "$work/r1.jsonl")" ] && [ "$(v "$work/r1.jsonl")" = "$(v "$work/r2.jsonl")" ]; then
			echo "ok   2 ranks --zero $z = 1 rank --grad-accum 2, val_loss too"
		else
			echo "FAIL 2 ranks --zero $z differ"; diff <(v "$work/r1.jsonl") <(v "$work/r2.jsonl") | head -4; fail=1
		fi
	done
fi
exit $fail
