#!/usr/bin/env bash
# Checkpoint integrity and runs that resume and extend (issue 34):
#   - trainer.json checks itself: its "step" edited from 6 to 7 is refused by
#     info --verify and --resume; a file's entry dropped from "files" is
#     refused (the file cannot be checked); a step that disagrees with the
#     sampler's cursor, with the checksum made to match (by Python, from
#     the documented rule), is refused; a version-1 file (no checksum) is
#     still read; a `latest` symlink loop is named as one;
#   - --resume DIR alone restores the run (the model from the checkpoint,
#     not tiny; the data, the schedule; --save DIR), also for a run that
#     started with --init; the Ctrl-C line's command works verbatim;
#   - --resume DIR --steps M past the saved total extends the run: the
#     added steps run at the schedule's final LR, and the extended run
#     stopped and resumed again gives the same losses;
#   - --save DIR holding another run's checkpoints is refused.
# The commands of docs/finetune.md's "Stop, resume and extend".
#   test_resume.sh STRATA
set -u
strata=$1
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}" # sftools.py
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-resume-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/check.sh"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir "$work/nvme"
data=/usr/share/common-licenses/GPL-3
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 2"
T="$M --data $data --seed 5 --nvme $work/nvme --lr-schedule cosine --warmup 2"
losses() { # metrics file: "step loss" per line, the later line of a step winning
	python3 - "$1" <<'PY'
import json, sys
d = {}
for l in open(sys.argv[1]):
    if l.strip():
        o = json.loads(l); d[o["step"]] = (o["loss"], o["lr"])
for s in sorted(d): print(s, repr(d[s][0]), repr(d[s][1]))
PY
}

# --- C: trainer.json's own checksum, cross-checks, the listing ----------------
"$strata" train $T --steps 6 --save "$work/ck" >"$work/log" 2>&1 ||
	{ echo "FAIL train 6"; tail -5 "$work/log"; exit 1; }
ck=$work/ck/step-000006
check verify-whole 0 "$strata" info --ckpt "$work/ck" --verify
grep -q '"checksum": "[0-9a-f]\{16\}"' "$ck/trainer.json" && grep -q '"version": 2' "$ck/trainer.json" ||
	{ echo "FAIL no checksum or version 2 in trainer.json"; fail=1; }
cp -a "$ck" "$work/orig"
sed -i 's/"step": 6,/"step": 7,/' "$ck/trainer.json"
grep -q '"step": 7,' "$ck/trainer.json" || { echo "FAIL the edit"; fail=1; }
check verify-step-edited 1 "$strata" info --ckpt "$work/ck" --verify
grep -q "trainer.json: checksum mismatch" "$work/out" "$work/err" ||
	{ echo "FAIL verify-step-edited: not named"; cat "$work/out"; fail=1; }
check resume-step-edited 2 "$strata" train $T --steps 8 --resume "$work/ck" --save "$work/ck"
grep -q "checksum mismatch" "$work/err" || { echo "FAIL resume-step-edited: reason"; fail=1; }

# the rule of docs/checkpoints.md, applied by Python: an edit with its
# checksum redone
python3 - "$ck/trainer.json" "$work/orig/trainer.json" <<'PY' || fail=1
import json, sys
tj = json.load(open(sys.argv[2]))
tj["step"] = 7
json.dump(tj, open(sys.argv[1], "w"), indent=2)
PY
rehash() { # trainer.json: its checksum recomputed (sftools, the documented rule)
	python3 - "$1" <<'PY'
import sys
import sftools
sftools.trainer_save(sys.argv[1], sftools.trainer_load(sys.argv[1]))
PY
}
# the rule, in Python, gives strata's own checksum of an untouched file
cp "$work/orig/trainer.json" "$work/t.json" && rehash "$work/t.json" &&
	python3 -c 'import json,sys; a,b=(json.load(open(p))["checksum"] for p in sys.argv[1:]); assert a==b,(a,b)' \
		"$work/t.json" "$work/orig/trainer.json" ||
	{ echo "FAIL sftools.trainer_save: not strata's checksum"; fail=1; }
rehash "$ck/trainer.json" || { echo "FAIL rehash"; fail=1; }
check verify-cursor-disagrees 1 "$strata" info --ckpt "$work/ck" --verify
grep -q "step 7, but the sampler's cursor has drawn 6 batches" "$work/out" ||
	{ echo "FAIL verify-cursor-disagrees: reason"; cat "$work/out"; fail=1; }
check resume-cursor-disagrees 2 "$strata" train $T --steps 8 --resume "$work/ck" --save "$work/ck"
cp "$work/orig/trainer.json" "$ck/trainer.json"
check verify-restored 0 "$strata" info --ckpt "$work/ck" --verify

# a file's entry dropped (checksum left as it was: refused as edited;
# redone: refused as unlisted) after damage to that file
python3 - "$ck/trainer.json" <<'PY' || fail=1
import json, sys
p = sys.argv[1]
tj = json.load(open(p))
tj["files"] = [f for f in tj["files"] if f["name"] != "optimizer.safetensors"]
json.dump(tj, open(p, "w"), indent=2)
PY
printf 'X' | dd of="$ck/optimizer.safetensors" bs=1 seek=1000 conv=notrunc status=none
check verify-entry-dropped 1 "$strata" info --ckpt "$work/ck" --verify
if rehash "$ck/trainer.json"; then
	check verify-entry-dropped-rehashed 1 "$strata" info --ckpt "$work/ck" --verify
	grep -q "lists no optimizer.safetensors" "$work/out" ||
		{ echo "FAIL verify-entry-dropped-rehashed: reason"; cat "$work/out"; fail=1; }
	check resume-entry-dropped 2 "$strata" train $T --steps 8 --resume "$work/ck"
fi
rm -rf "$ck" && cp -a "$work/orig" "$ck"

# a version-1 trainer.json (before the checksum): read without it
python3 - "$ck/trainer.json" <<'PY' || fail=1
import json, sys
p = sys.argv[1]
tj = json.load(open(p))
del tj["checksum"]
tj["version"] = 1
json.dump(tj, open(p, "w"), indent=2)
PY
check verify-version-1 0 "$strata" info --ckpt "$work/ck" --verify
cp "$work/orig/trainer.json" "$ck/trainer.json"

# latest as a symlink loop
ln -sfn latest "$work/ck/latest"
check latest-loop 1 "$strata" info --ckpt "$work/ck" --verify
grep -q "symlink loop (ELOOP)" "$work/err" ||
	{ echo "FAIL latest-loop: not named"; cat "$work/err"; fail=1; }
ln -sfn step-000006 "$work/ck/latest"

# --- B: stop, resume alone, extend --------------------------------------------
# the uninterrupted run: 12 steps, then extended to 16 (the added steps at
# the final LR of the 12-step cosine)
"$strata" train $T --steps 12 --save "$work/ref" --metrics "$work/ref.jsonl" >"$work/log" 2>&1 ||
	{ echo "FAIL ref 12"; tail -5 "$work/log"; fail=1; }
check extend-ref 0 "$strata" train --resume "$work/ref" --steps 16 --metrics "$work/ref.jsonl"
grep -q "resumed from .* at step 12" "$work/out" || { echo "FAIL extend-ref: not resumed"; fail=1; }
[ -d "$work/ref/step-000016" ] || { echo "FAIL extend-ref: no step-000016 in --save"; fail=1; }
python3 - "$work/ref.jsonl" <<'PY' || { echo "FAIL extend: the added steps' LR"; fail=1; }
import json, sys
lr = {}
for l in open(sys.argv[1]):
    o = json.loads(l); lr[o["step"]] = o["lr"]
assert sorted(lr) == list(range(1, 17)), sorted(lr)
final = 1e-3 * 0.1
assert all(abs(lr[s] - final) < 1e-12 for s in (13, 14, 15, 16)), lr
assert lr[12] > final
PY

# the same 12 steps in two goes (8, then the rest with --resume alone),
# extended to 14, then to 16: = 12 extended to 16 at once
"$strata" train $T --steps 12 --save "$work/run" --metrics "$work/run.jsonl" \
	--save-every 8 >"$work/log" 2>&1 || { echo "FAIL run 12"; fail=1; }
rm -rf "$work/run/step-000012" && ln -sfn step-000008 "$work/run/latest" &&
	python3 - "$work/run.jsonl" <<'PY' || fail=1
import sys
p = sys.argv[1]
lines = open(p).readlines()[:8]
open(p, "w").writelines(lines)
PY
check resume-alone 0 "$strata" train --resume "$work/run" --metrics "$work/run.jsonl"
grep -q "resumed from .* at step 8" "$work/out" || { echo "FAIL resume-alone: not at 8"; fail=1; }
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert c["n_layer"]==2 and c["n_embd"]==64' \
	"$work/run/latest/config.json" || { echo "FAIL resume-alone: not the saved model"; fail=1; }
"$strata" train --resume "$work/run" --steps 14 --metrics "$work/run.jsonl" >"$work/log" 2>&1 ||
	{ echo "FAIL extend 14"; tail -3 "$work/log"; fail=1; }
check extend-again 0 "$strata" train --resume "$work/run" --steps 16 --metrics "$work/run.jsonl"
if [ "$(losses "$work/ref.jsonl")" = "$(losses "$work/run.jsonl")" ]; then
	echo "ok   resumed alone, extended twice = 12 then extended to 16 (losses and LRs)"
else
	echo "FAIL resumed/extended losses differ"; diff <(losses "$work/ref.jsonl") <(losses "$work/run.jsonl") | head; fail=1
fi
cmp -s "$work/ref/step-000016/model.safetensors" "$work/run/step-000016/model.safetensors" ||
	{ echo "FAIL extended model bytes differ"; fail=1; }

# the stop line's command, verbatim: a run (endless: --steps 100000,
# constant LR, so the signal never races its end) stopped by SIGTERM once
# its metrics show 3 steps; its line's command run as it is, stopped again
# 2 steps on; = one run to that step. Waits on conditions only.
stop_after() { # pid, file, lines: SIGTERM once the file has that many
	while kill -0 "$1" 2>/dev/null && [ "$(cat "$2" 2>/dev/null | grep -c "$4")" -lt "$3" ]; do
		sleep 0.05
	done
	kill -TERM "$1" 2>/dev/null
	wait "$1"
}
# The line repeats the flags a checkpoint does not keep (where the run
# runs and with which budgets, what it logs), in their order.
"$strata" train $T --steps 100000 --lr-schedule constant --save "$work/endless" \
	--gpu-mem 48M --host-mem 40M --metrics "$work/endless.jsonl" >"$work/a.log" 2>&1 &
stop_after $! "$work/endless.jsonl" 3 .
rc=$?
n=$(wc -l <"$work/endless.jsonl")
go=$(grep -o 'go on with: strata train [^)]*' "$work/a.log" | sed 's/^go on with: strata //')
if [ "$rc" = 130 ] && [ "$go" = "train --resume $work/endless --nvme $work/nvme --gpu-mem 48M --host-mem 40M --metrics $work/endless.jsonl" ]; then
	echo "ok   stopped at step $n: 'go on with: strata $go'"
else
	echo "FAIL stop: exit $rc, line '$go'"; tail -3 "$work/a.log"; fail=1
fi
# shellcheck disable=SC2086 # the command as the line gives it
"$strata" $go >"$work/b.log" 2>&1 &
stop_after $! "$work/b.log" 2 '^step  *[0-9]*/100000 '
rc=$?
m=$(sed -n 's/^strata: stopped after step \([0-9]*\),.*/\1/p' "$work/b.log")
grep -q "resumed from .* at step $n" "$work/b.log" && [ "$rc" = 130 ] && [ -n "$m" ] ||
	{ echo "FAIL the stop line's command: exit $rc"; tail -3 "$work/b.log"; fail=1; }
"$strata" train $T --steps "${m:-1}" --lr-schedule constant --save "$work/straight" \
	--metrics "$work/straight.jsonl" >"$work/log" 2>&1 || { echo "FAIL straight run"; fail=1; }
# the line's --metrics appended the resumed steps: the file holds all m
if [ "$(losses "$work/straight.jsonl")" = "$(losses "$work/endless.jsonl")" ] &&
	cmp -s "$work/straight/latest/model.safetensors" "$work/endless/latest/model.safetensors" &&
	cmp -s "$work/straight/latest/optimizer.safetensors" "$work/endless/latest/optimizer.safetensors"; then
	echo "ok   stopped at $n and $m, resumed with the line's command = one run to $m"
else
	echo "FAIL stop/resume differs (steps $n, $m)"; fail=1
fi

check steps-below-ckpt 2 "$strata" train --resume "$work/run/step-000016" --steps 10 --save "$work/x"
[ -e "$work/x" ] && { echo "FAIL steps-below-ckpt left $work/x"; fail=1; }

# validation and the best checkpoint are not kept either: the line
# repeats them, and quotes what the shell would split
"$strata" train $M --data $data --nvme "$work/nvme" --steps 100000 --lr-schedule constant \
	--save "$work/val run" --val-data $data --eval-every 2 --keep-best \
	--metrics "$work/val.jsonl" >"$work/a.log" 2>&1 &
stop_after $! "$work/val.jsonl" 3 .
rc=$?
go=$(grep -o 'go on with: strata train .*)$' "$work/a.log" | sed 's/^go on with: strata //; s/)$//')
if [ "$rc" = 130 ] && [ "$go" = "train --resume '$work/val run' --nvme $work/nvme --val-data $data --eval-every 2 --keep-best --metrics $work/val.jsonl" ]; then
	echo "ok   the stop line repeats --val-data, --eval-every, --keep-best, quoted"
else
	echo "FAIL val stop: exit $rc, line '$go'"; tail -3 "$work/a.log"; fail=1
fi

# a run that started with --init: the stop line's command works, the
# model is the checkpoint's
"$strata" train $T --steps 3 --save "$work/init-src" >"$work/log" 2>&1 ||
	{ echo "FAIL init source"; fail=1; }
"$strata" train --init "$work/init-src" --data $data --seq 32 --batch 2 --seed 5 \
	--nvme "$work/nvme" --steps 4 --save "$work/ft" >"$work/log" 2>&1 ||
	{ echo "FAIL train --init"; tail -3 "$work/log"; fail=1; }
check resume-init-run 0 "$strata" train --resume "$work/ft" --steps 6
grep -q "resumed from .* at step 4" "$work/out" || { echo "FAIL resume-init-run"; fail=1; }

# --save into another run's directory
check save-other-run 2 "$strata" train $T --steps 2 --save "$work/ref"
grep -q "holds another run's checkpoints" "$work/err" || { echo "FAIL save-other-run: reason"; fail=1; }
check save-other-resume 2 "$strata" train $T --steps 8 --resume "$work/ck" --save "$work/ref"
check save-same-run 0 "$strata" train --resume "$work/ck" --steps 7 --save "$work/ck"
exit $fail
