#!/usr/bin/env bash
# A run that is killed (SIGKILL) again and again, and restarted each time
# with the same command (--resume auto), must end where an uninterrupted run
# ends: the same checkpoint bytes (weights, Adam state, trainer.json) and the
# same loss at every step. W and the optimizer state live on nvme, a
# checkpoint is saved after every step (so kills land in saves, in steps and
# in start-up), and nothing may be left behind: no swap file, no temporary
# checkpoint directory once the last run has committed. A second run cannot
# save into the directory of a live one. And Ctrl-C / SIGTERM stop a run at
# a step's end, saved. ST_CRASH_MODEL=MODEL runs the kills on that model
# (crash-resume-llama: a LLaMA shape) and stops after them.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-crash-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
steps=24
data=$work/data.txt
python3 -c "
import random
random.seed(5)
words = 'a run that dies must come back where it was and go on'.split()
print(' '.join(random.choice(words) for _ in range(4000)))" >"$data"
mkdir "$work/swap"
train() { # checkpoint dir, metrics file, extra flags... (exec: killing a
	# background "train ... &" must kill strata, not a subshell around it)
	local ck=$1 metrics=$2
	shift 2
	exec "$strata" train --model "${ST_CRASH_MODEL:-layers=2,dim=64,heads=2,vocab=256,ctx=64}" \
		--seq 32 --batch 4 \
		--grad-accum 2 --data "$data" --steps $steps --warmup 2 --seed 11 \
		--offload-params nvme --offload-optim nvme --nvme "$work/swap" \
		--save "$work/$ck" --save-every ${every:-1} --keep 2 --metrics "$work/$metrics" "$@"
}

t0=$(date +%s%N)
(train ref ref.jsonl) >"$work/ref.log" 2>&1 || { echo "FAIL uninterrupted run"; tail -5 "$work/ref.log"; exit 1; }
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
step_ms=$(( ms / steps + 1 ))
echo "uninterrupted: $steps steps in $ms ms"

# Each run is killed once its metrics show n more steps (n drawn from
# [0, a third of the steps still to go]), after a further delay drawn from [0, one
# step's time): kills land in start-up, in steps and in saves, and the runs
# get further each time. After 10 kills (or once the last checkpoint is
# there) the run goes to its end.
RANDOM=7
kills=0 from=""
lines() { [ -e "$work/${1:-run.jsonl}" ] && wc -l <"$work/${1:-run.jsonl}" || echo 0; }
while :; do
	done=0
	if [ -e "$work/ck/latest" ]; then
		done=$(readlink "$work/ck/latest" | sed 's/^step-0*//')
		from="$from ${done:-0}"
	fi
	want=$(( $(lines) + RANDOM % ((steps - ${done:-0}) / 3 + 1) ))
	# the same command each time, as a job's restarts would give it
	train ck run.jsonl --resume auto >"$work/run.log" 2>&1 &
	pid=$!
	if [ $kills -lt 10 ] && [ "${done:-0}" -lt $steps ]; then
		while [ "$(lines)" -lt $want ] && kill -0 $pid 2>/dev/null; do
			sleep 0.01
		done
		d=$(( RANDOM % step_ms ))
		sleep "$(printf '%d.%03d' $((d / 1000)) $((d % 1000)))"
		kill -KILL $pid 2>/dev/null
	fi
	wait $pid 2>/dev/null
	rc=$?
	if [ $rc = 137 ]; then
		kills=$((kills + 1))
		continue
	fi
	if [ $rc != 0 ]; then
		echo "FAIL a run exited $rc"; tail -5 "$work/run.log"; exit 1
	fi
	break
done
echo "killed $kills times; runs resumed from steps:${from:- none}"

# It shows something only if runs resumed from a checkpoint mid-run, trained
# and saved again: at least two different steps in (0, steps) resumed from.
mid=$(for s in $from; do [ "$s" -gt 0 ] && [ "$s" -lt $steps ] && echo "$s"; done | sort -u | wc -l)
if [ "$kills" -lt 5 ] || [ "$mid" -lt 2 ]; then
	echo "FAIL too few kills ($kills) or different steps resumed from mid-run ($mid)"; fail=1
fi

# A second run saving into the DIR of a live one is refused (exit 2, one
# line) before it writes anything; the kills above showed that a dead one's
# lock goes with it.
"$strata" train --model layers=1,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --data "$data" \
	--steps 100000 --save "$work/busy" --save-every 1000 --metrics "$work/busy.jsonl" \
	>"$work/busy.log" 2>&1 &
pid=$!
while [ ! -s "$work/busy.jsonl" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
"$strata" train --model layers=1,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --data "$data" \
	--steps 2 --save "$work/busy" --metrics "$work/second.jsonl" >"$work/second.log" 2>"$work/err"
rc=$?
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
if [ $rc != 2 ] || [ "$(wc -l <"$work/err")" != 1 ] || ! grep -q "another process" "$work/err" ||
   [ -e "$work/second.jsonl" ]; then
	echo "FAIL second writer: exit $rc"; cat "$work/err"; tail -3 "$work/busy.log"; fail=1
else
	echo "ok   second writer refused: $(cat "$work/err")"
fi

# same_as_ref CKDIR METRICS WHAT: the run that wrote CKDIR and METRICS
# (resumed any number of times) ended as the uninterrupted one.
last=$(printf 'step-%06d' $steps)
same_as_ref() {
	local ck=$1 metrics=$2 what=$3 bad=0 left
	for f in model.safetensors optimizer.safetensors trainer.json; do
		cmp -s "$work/ref/$last/$f" "$work/$ck/$last/$f" ||
			{ echo "FAIL $what: $last/$f differs from the uninterrupted run's"; bad=1; }
	done
	[ "$(readlink "$work/$ck/latest")" = "$last" ] || { echo "FAIL $what: latest is not $last"; bad=1; }
	left=$(find "$work/$ck" "$work/swap" -mindepth 1 -maxdepth 1 -name '*.tmp.*' -o -name '*.swap')
	[ -z "$left" ] || { echo "FAIL $what: left behind: $left"; bad=1; }
	python3 - "$work" $steps "$metrics" "$what" <<'PY' || bad=1
import json, sys
w, steps, metrics, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ref = {j["step"]: j["loss"] for j in map(json.loads, open(f"{w}/ref.jsonl"))}
run = {}
for line in open(f"{w}/{metrics}"):
    try:
        j = json.loads(line)
    except ValueError:  # a line cut short by the kill
        continue
    run[j["step"]] = j["loss"]  # a step run again after a resume: the last
assert sorted(ref) == list(range(1, steps + 1)), sorted(ref)
assert sorted(run) == sorted(ref), (what, sorted(run))
bad = [s for s in ref if run[s] != ref[s]]
assert not bad, (what, [(s, ref[s], run[s]) for s in bad])
PY
	[ $bad = 0 ] && echo "ok   $what: the uninterrupted run's losses at all $steps steps and checkpoint bytes at $last, nothing left behind"
	return $bad
}
same_as_ref ck run.jsonl "killed $kills times" || fail=1
if [ -n "${ST_CRASH_MODEL:-}" ]; then
	[ $fail = 0 ] && echo "PASS (model $ST_CRASH_MODEL)"
	exit $fail
fi

# Ctrl-C (SIGINT) and SIGTERM: the run stops at the end of a step and saves
# there although no --save-every asks for it, says so in one line, exits
# 130; resumed each time, it ends as the uninterrupted run. Twice: SIGTERM
# once 4 steps are done, SIGINT 6 steps after the resume.
every=1000
stops=""
for sig in TERM INT; do
	resume=()
	[ -e "$work/stop/latest" ] && resume=(--resume "$work/stop")
	want=$(( $(lines stop.jsonl) + (${#resume[@]} ? 6 : 4) ))
	train stop stop.jsonl "${resume[@]}" >"$work/stop.log" 2>"$work/err" &
	pid=$!
	while [ "$(lines stop.jsonl)" -lt $want ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
	kill -$sig $pid 2>/dev/null
	wait $pid 2>/dev/null
	rc=$?
	at=$(readlink "$work/stop/latest" 2>/dev/null | sed 's/^step-0*//')
	if [ $rc != 130 ] || [ "$(wc -l <"$work/err")" != 1 ] ||
	   ! grep -q "stopped after step ${at:-none}, saved in" "$work/err" || [ "${at:-0}" -lt $want ]; then
		echo "FAIL SIG$sig: exit $rc, latest step ${at:-none} (want >= $want)"; cat "$work/err"; fail=1
		break
	fi
	stops="$stops SIG$sig at step $at;"
done
# A second signal does not wait for the step: SIGTERM, then SIGINT a fifth
# of a step later, end the run by SIGINT's default action, with no "stopped
# after" line. (Two signals at the same instant can reach two threads'
# handlers at once and count as one.) The step time is the run's own first.
"$strata" train --model layers=4,dim=256,heads=4,vocab=256,ctx=128 --seq 128 --batch 16 \
	--data "$data" --steps 1000 --gpu-mem 512M --host-mem 512M --save "$work/twice" \
	--threads 1 --metrics "$work/twice.jsonl" >/dev/null 2>"$work/err" &
pid=$!
while [ "$(lines twice.jsonl)" -lt 1 ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
kill -TERM $pid 2>/dev/null
sleep "$(sed -n '1s/.*"step_s":\([0-9.]*\).*/\1/p' "$work/twice.jsonl" |
	awk '{ printf "%.3f", $1 / 5 }')"
kill -INT $pid 2>/dev/null
wait $pid 2>/dev/null
rc=$?
if [ $rc != 130 ] || grep -q "stopped after" "$work/err"; then
	echo "FAIL SIGTERM then SIGINT: exit $rc"; cat "$work/err"; fail=1
else
	echo "ok   SIGTERM then SIGINT: ended at once by SIGINT"
fi

# The last resume moves the state: W into vram, G P M V onto host (a
# resume may change budgets and placement; the bits do not change).
if (train stop stop.jsonl --resume "$work/stop" --offload-params none --offload-optim host \
	--gpu-mem 64M) >"$work/stop.log" 2>&1; then
	same_as_ref stop stop.jsonl "stopped by$stops resumed in vram and host" || fail=1
else
	echo "FAIL resume after the stops"; tail -3 "$work/stop.log"; fail=1
fi
exit $fail
