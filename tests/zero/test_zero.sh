#!/usr/bin/env bash
# tests/zero/test_zero.sh STRATA MPI_RUN PART: ZeRO across ranks on the cpu
# device, under mpirun (MPI_RUN is tests/mpi-run: it exits 77, skipped,
# without mpirun). Every comparison is against a run of one rank, which
# shares no collective with the runs it checks. PART is one of:
#   np2, np4   the determinism promise: at --zero 0, 1, 2 and 3, in several
#              placements, N ranks at --grad-accum A give the losses, norms
#              and checkpoint tensor bytes (model.safetensors and
#              optimizer.safetensors: P, M, V) of one rank at --grad-accum
#              N*A, bit for bit; so the stages agree with each other
#   resume     a checkpoint saved at 2 ranks resumes at 1 and at 4 ranks
#              and ends where an uninterrupted one-rank run ends; the
#              files 2 ranks write in parallel (sharded) are one rank's
#   kill       a rank SIGKILLed mid-run ends the job within 60 s, naming
#              it; --resume auto then ends where an uninterrupted run ends
#   stop       Ctrl-C (SIGINT) and SIGUSR1 to mpirun: every rank stops after
#              the same step and saves; --resume auto then ends where an
#              uninterrupted run ends
#   mismatch   ranks with different settings (the model's, or --save-every)
#              stop (exit 2) before a step, naming the first difference
#   refuse     flags that make no sense with N ranks: exit 2, one line;
#              strata info's comm line (libraries, world)
#   budget     per-rank peaks within the budgets; stage 3's nvme bytes per
#              rank about 1/N of one rank's
#   layer-first
#              --schedule layer-first at 2 ranks, stages 0-3, W and the
#              optimizer in host, on nvme and in vram, --grad-accum 2 (and
#              LLaMA at stage 3, checkpoints on the host, --recompute
#              none): the losses,
#              norms and checkpoint tensor
#              bytes of batch-first (one rank at --grad-accum 4, and 2 ranks
#              batch-first), bit for bit; its collectives = the plan's
#   in-backward
#              --update in-backward at 2 ranks, stages 0-3, W, P, M, V
#              on nvme, a clip some steps pass (batch-first, layer-first,
#              LLaMA, a skipped step; stages 1-2 also with W in host and
#              in vram, through the device buffers and on cpu-strict),
#              and a clip every step passes (replayed steps, one from
#              the batch a sweep drew): one rank's numbers with the
#              update after, and its collectives per step; and its nvme
#              bytes (no G written or read back) and the update after's,
#              each the plan's
#   comm       the collectives' calls and bytes per step = strata plan's
#   trace      --trace: one file per rank, the collectives on a comm lane
#              overlapping the compute (stage 3's gathers, and stages 1-2's
#              W gathers over the update)
#   devpath    the cuda device's path through device buffers and the mpi
#              backend's host staging, on the cpu device
#              ($ST_ZERO_DEVICE_PATH=1)
#   strict-np2, strict-np4
#              the same path on the cpu-strict device (docs/gpu.md, "Strict
#              mode"), whose memory the host cannot touch, as a GPU's:
#              stages 0-3 over 2 and 4 ranks = 1 rank, every W home
#   mask       a shard with a loss mask: 2 and 4 ranks (stages 0-3, both
#              schedules, --samples documents) = 1 rank, bit for bit
#   cuda1      (a GPU; else 77) the engine on cuda through a world-1 nccl
#              communicator = through the local one, at --zero 0, 1, 2, 3
#   cuda2      (a GPU and an mpirun that starts strata; else 77) 2 ranks
#              sharing the GPU with the mpi backend = 1 rank at
#              --grad-accum 2, stages 0-3
set -u
strata=$1 mpirun=$2 part=$3
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-zero-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
# shellcheck source=../cli/check.sh
. "$(dirname "$0")/../cli/check.sh"
# shellcheck source=../lib/train_runs.sh
. "$(dirname "$0")/../lib/train_runs.sh"
text "$work/data.txt" 7 every rank adds its slice in rank order and the sums agree
mkdir -p "$work/nvme"
if [ "$part" != cuda1 ]; then # cuda1 is one rank, without mpirun
	"$mpirun" 1 true >/dev/null 2>&1
	if [ $? = 77 ]; then echo "mpirun not found: skipped"; exit 77; fi
fi
if [ "$part" = cuda2 ]; then
	# on a GPU machine an mpirun may be another MPI's (a framework's, a
	# vendor's): it runs `true`, and then strata's MPI_Init fails. So the
	# probe is strata itself: one rank that sees mpirun as its launcher.
	timeout 60 "$mpirun" 1 "$strata" info >"$work/probe" 2>&1
	if ! grep -q "launcher: mpirun, rank 0 of 1" "$work/probe"; then
		echo "mpirun ($(command -v mpirun)) does not start strata as a rank (another MPI's?): skipped"
		grep -m2 -iE "error|fail|abort" "$work/probe"
		exit 77
	fi
fi

common=(--data "$work/data.txt" --batch 2 --seq 32 --nvme "$work/nvme" --log-every 100
	--warmup 1 --seed 5)

# resume_run LOG ARGS...: strata train ARGS on 2 ranks into LOG, after a
# job that was killed or interrupted. Once more when Open MPI could not
# start a rank ("... when attempting to start process rank N", its
# launch's help message, seen once in a loaded run of this test right
# after an interrupted job): the launch failed, not strata, and a resume
# from a whole checkpoint may be started again.
resume_run() {
	local log=$1 rc
	shift
	timeout 120 "$mpirun" 2 "$strata" train "$@" >"$log" 2>&1
	rc=$?
	if [ $rc != 0 ] && grep -q "when attempting to start process rank" "$log"; then
		echo "note: mpirun could not start the ranks ($(grep -m1 '^Error' "$log")); once more"
		timeout 120 "$mpirun" 2 "$strata" train "$@" >"$log" 2>&1
		rc=$?
	fi
	return $rc
}

# run TAG NP ARGS...: strata train on NP ranks (1: without mpirun) into
# $work/TAG.{jsonl,log} and checkpoint $work/TAG/
run() {
	local tag=$1 np=$2
	shift 2
	ranks_run "$tag" "$np" "$mpirun" "$np" -- "$@"
}

placements=("host|" "nvme|--offload-params nvme --offload-optim nvme --prefetch 1"
	    "vram|--offload-params none --offload-optim host --gpu-mem 64M --host-mem 24M"
	    "split|--offload-params host --offload-optim nvme --host-mem 24M")

# home_args P: placement P's flags (host, nvme, vram, split) into a=()
home_args() {
	local pl
	a=()
	for pl in "${placements[@]}"; do
		if [ "${pl%%|*}" = "$1" ]; then
			read -r -a a <<<"${pl#*|}"
			return
		fi
	done
	echo "test_zero.sh: no placement '$1'" >&2
	exit 2
}

determinism() { # N ACCUM ALL: ALL=1 every placement, else host and nvme (CI time)
	local n=$1 a=$2 all=$3
	run ref 1 --steps 3 --grad-accum $((n * a)) || { echo "FAIL one-rank run"; fail=1; return; }
	for z in 0 1 2 3; do
		for p in "${placements[@]}"; do
			[ "$all" = 1 ] || [ "${p%%|*}" = host ] || [ "${p%%|*}" = nvme ] || continue
			# shellcheck disable=SC2086
			run "z$z" "$n" --steps 3 --grad-accum "$a" --zero $z ${p#*|}
			same "z$z" ref "$n ranks --zero $z --grad-accum $a, ${p%%|*} = 1 rank --grad-accum $((n * a))"
		done
	done
}

case $part in
np2)
	determinism 2 1 1
	determinism 2 2 0
	# an embedding larger than every block: a W slot of its own, gathered
	# into at stage 3 (and the gathers' look-ahead never waits on it)
	big=(--model layers=2,dim=128,heads=4,vocab=4096,ctx=64 --steps 3 --host-mem 32M)
	run bigref 1 "${big[@]}" --grad-accum 2
	run big 2 "${big[@]}" --zero 3 --offload-params nvme --prefetch 1
	same big bigref "2 ranks --zero 3, embedding slot, W on nvme, prefetch 1 = 1 rank"
	# each rank's activation checkpoints on its host (3 of 5 there and back)
	run actref 1 --steps 3 --grad-accum 2 --offload-activations vram
	run act 2 --steps 3 --zero 3 --offload-activations host --offload-params nvme
	same act actref "2 ranks --zero 3, checkpoints on the host = 1 rank, checkpoints in vram"
	;;
np4)
	determinism 4 1 0
	# the LLaMA family (untied head, grouped-query attention) the same way
	ll=(--model llama:layers=2,dim=128,heads=4,kv-heads=2,ffn=256,vocab=256,ctx=64 --steps 3)
	run llref 1 "${ll[@]}" --grad-accum 4
	run ll 4 "${ll[@]}" --zero 3 --offload-params nvme --offload-optim nvme
	same ll llref "LLaMA: 4 ranks --zero 3, all on nvme = 1 rank --grad-accum 4"
	# stage 0 updates every slice of a padded unit: with the tile (the
	# embedding's 9 x 16384) not a multiple of a block's slice (4 x 16384),
	# its tiles still end at each slice, where the nvme checksums cut
	em=(--model layers=2,dim=128,heads=4,vocab=4096,ctx=64 --steps 2 --host-mem 64M)
	run emref 1 "${em[@]}" --grad-accum 4
	run em 4 "${em[@]}" --zero 0 --offload-optim nvme
	same em emref "4 ranks --zero 0, P, M, V on nvme, slices not the tile's multiple = 1 rank"
	;;
resume)
	# step 3 of a 2-rank run (--save-every 3), resumed at 1 and at 4 ranks
	run ref 1 --steps 6 --grad-accum 4
	run two 2 --steps 6 --grad-accum 2 --zero 2 --save-every 3 --keep 0
	for np in 1 4; do
		a=$((4 / np))
		rm -rf "$work/re$np"
		mkdir -p "$work/re$np"
		s3=$(cd "$work/two" && ls -d step-*3)
		cp -r "$work/two/$s3" "$work/re$np/"
		ln -s "$s3" "$work/re$np/latest"
		head -3 "$work/two.jsonl" >"$work/re$np.jsonl"
		if [ "$np" = 1 ]; then
			"$strata" train "${common[@]}" --steps 6 --grad-accum $a --save "$work/re$np" \
				--resume auto --metrics "$work/re$np.jsonl" >"$work/re$np.log" 2>&1
		else
			timeout 120 "$mpirun" $np "$strata" train "${common[@]}" --steps 6 --grad-accum $a \
				--zero 3 --save "$work/re$np" --resume auto --metrics "$work/re$np.jsonl" \
				>"$work/re$np.log" 2>&1
		fi
		grep -q "resumed from" "$work/re$np.log" || { echo "FAIL resume at $np: not resumed"; tail -3 "$work/re$np.log"; fail=1; }
		same "re$np" ref "saved at 2 ranks (--zero 2), resumed at $np"
	done
	# the files at 2 ranks, every rank writing its ranges, sharded as
	# transformers shards them: one rank's files, byte for byte
	run sh1 1 --steps 2 --grad-accum 2 --shard-size 300K
	run sh2 2 --steps 2 --zero 3 --shard-size 300K
	if (cd "$work/sh1/latest" && ls *.safetensors *.index.json | sort | xargs sha256sum) >"$work/a" &&
	   (cd "$work/sh2/latest" && ls *.safetensors *.index.json | sort | xargs sha256sum) >"$work/b" &&
	   [ "$(wc -l <"$work/a")" -gt 4 ] && diff "$work/a" "$work/b" >/dev/null; then
		echo "ok   sharded files written by 2 ranks = one rank's ($(wc -l <"$work/a") files)"
	else
		echo "FAIL sharded files at 2 ranks differ from one rank's"; diff "$work/a" "$work/b" | head -5; fail=1
	fi
	;;
kill)
	run ref 1 --steps 8 --grad-accum 2 --offload-optim nvme
	rm -rf "$work/k" "$work/k.jsonl"
	args=("${common[@]}" --steps 8 --zero 1 --offload-optim nvme --save "$work/k" --save-every 1
	      --metrics "$work/k.jsonl" --resume auto)
	"$mpirun" 2 "$strata" train "${args[@]}" >"$work/k.log" 2>&1 &
	job=$!
	victim=
	for _ in $(seq 600); do
		[ "$(wc -l <"$work/k.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
		sleep 0.05
	done
	for p in $(pgrep -P $job); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
	done
	if [ -z "$victim" ]; then
		echo "FAIL kill: rank 1 not found"; fail=1
	else
		t0=$(date +%s)
		kill -KILL "$victim"
		wait $job
		rc=$? dt=$(($(date +%s) - t0))
		if [ "$rc" = 0 ] || [ $dt -gt 60 ]; then
			echo "FAIL kill: exit $rc after $dt s"; tail -5 "$work/k.log"; fail=1
		elif ! grep -qiE "rank 1|signal 9|killed" "$work/k.log"; then
			echo "FAIL kill: the job's end does not name the rank"; tail -5 "$work/k.log"; fail=1
		else
			echo "ok   kill: rank 1 SIGKILLed, the job ended in $dt s (exit $rc)"
		fi
		resume_run "$work/k2.log" "${args[@]}" ||
			{ echo "FAIL kill: --resume auto"; tail -20 "$work/k2.log"; fail=1; }
		# the metrics of the steps redone after the kill are there twice
		awk -F'[:,]' '!seen[$2]++' "$work/k.jsonl" >"$work/k.u" && mv "$work/k.u" "$work/k.jsonl"
		same k ref "rank killed, --resume auto = uninterrupted"
	fi
	;;
stop)
	# Ctrl-C under mpirun: mpirun sends every rank SIGCONT, SIGTERM after
	# odls_base_sigkill_timeout and SIGKILL as long again after (here 5 s,
	# so 10 s to end the step and save); the ranks stop at the SIGCONT,
	# agree, save and exit. SIGUSR1, which mpirun forwards, stops them
	# with no deadline, and mpirun exits 130. Each time --resume auto then
	# ends where an uninterrupted run ends.
	run ref 1 --steps 12 --grad-accum 2
	for sig in INT USR1; do
		rm -rf "$work/s$sig" "$work/s$sig.jsonl"
		args=("${common[@]}" --steps 12 --save "$work/s$sig" --metrics "$work/s$sig.jsonl"
		      --resume auto)
		OMPI_MCA_odls_base_sigkill_timeout=5 "$mpirun" 2 "$strata" train "${args[@]}" \
			--log-every 1 >"$work/s$sig.log" 2>&1 &
		job=$!
		for _ in $(seq 600); do
			[ "$(wc -l <"$work/s$sig.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
			sleep 0.05
		done
		kill -"$sig" $job
		wait $job
		rc=$?
		n=$(wc -l <"$work/s$sig.jsonl")
		if [ ! -e "$work/s$sig/latest" ] || ls -d "$work/s$sig"/*.tmp.* >/dev/null 2>&1; then
			echo "FAIL stop SIG$sig: no whole checkpoint (exit $rc)"; ls "$work/s$sig"; tail -3 "$work/s$sig.log"; fail=1
			continue
		elif [ "$n" -ge 12 ] || { [ "$sig" = USR1 ] && [ "$rc" != 130 ]; }; then
			echo "FAIL stop SIG$sig: exit $rc after $n steps"; tail -3 "$work/s$sig.log"; fail=1
			continue
		fi
		saved=$(readlink "$work/s$sig/latest")
		resume_run "$work/s$sig-2.log" "${args[@]}" ||
			{ echo "FAIL stop SIG$sig: --resume auto"; tail -20 "$work/s$sig-2.log"; fail=1; }
		echo "ok   SIG$sig to mpirun: every rank stopped after step $n, saved $saved (mpirun exit $rc)"
		same "s$sig" ref "stopped by SIG$sig to mpirun, --resume auto = uninterrupted"
	done
	;;
mismatch)
	"$mpirun" 2 bash -c 'exec "$0" train "$@" --steps $((3 + OMPI_COMM_WORLD_RANK))' \
		"$strata" "${common[@]}" >"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc != 2 ]; then
		echo "FAIL mismatch: exit $rc, want 2"; tail -5 "$work/err"; fail=1
	elif ! grep -q "rank 1 has steps=4 where rank 0 has steps=3" "$work/err"; then
		echo "FAIL mismatch: the first difference is not named"; cat "$work/err"; fail=1
	elif [ "$(grep -c "do not run the same configuration" "$work/err")" != 1 ]; then
		echo "FAIL mismatch: not one line"; cat "$work/err"; fail=1
	elif grep -q "^step " "$work/out"; then
		echo "FAIL mismatch: a step ran"; fail=1
	else
		echo "ok   mismatch: $(grep "do not run" "$work/err")"
	fi
	# a setting outside the model that changes the collectives a step runs
	"$mpirun" 2 bash -c 'exec "$0" train "$@" --save-every $((2 + OMPI_COMM_WORLD_RANK))' \
		"$strata" "${common[@]}" --steps 3 --save "$work/ck-mm" >"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc != 2 ] || ! grep -q "rank 1 has run save=.* save-every=3 .*where rank 0 has run .*save-every=2" "$work/err"; then
		echo "FAIL mismatch --save-every: exit $rc"; tail -3 "$work/err"; fail=1
	elif [ -e "$work/ck-mm/latest" ]; then
		echo "FAIL mismatch --save-every: a checkpoint was saved"; fail=1
	else
		echo "ok   mismatch --save-every: exit 2, named"
	fi
	# the schedule orders a step's all-to-alls: ranks must agree on it
	"$mpirun" 2 bash -c 'exec "$0" train "$@" --schedule $([ "$OMPI_COMM_WORLD_RANK" = 1 ] &&
		echo layer-first || echo batch-first)' "$strata" "${common[@]}" --steps 2 \
		--grad-accum 2 >"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc != 2 ] || ! grep -q "rank 1 has run .*schedule=layer-first where rank 0 has run .*schedule=batch-first" "$work/err"; then
		echo "FAIL mismatch --schedule: exit $rc"; tail -3 "$work/err"; fail=1
	else
		echo "ok   mismatch --schedule: exit 2, named"
	fi
	;;
refuse)
	check "--zero 4" 2 "$strata" train "${common[@]}" --zero 4
	check "--zero 3 at one rank warns" 0 "$strata" train "${common[@]}" --zero 3 --steps 1
	grep -q "shards nothing" "$work/err" || { echo "FAIL no warning"; fail=1; }
	ST_COMM=nope check "ST_COMM names no backend" 2 "$strata" train "${common[@]}" --steps 1
	check "plan --rank outside --world" 2 "$strata" plan --world 2 --rank 2
	# --optim-state bf16|q8 at world > 1: exit 2, one line of strata's (rank
	# 0's; mpirun adds its own report of the exit)
	"$mpirun" 2 "$strata" train "${common[@]}" --zero 1 --optim-state q8 --steps 1 \
		>"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc = 2 ] && [ "$(grep -c '^strata:' "$work/err")" = 1 ] &&
	   grep -q "^strata: --optim-state q8: not with ZeRO at world > 1" "$work/err"; then
		echo "ok   --optim-state q8 at 2 ranks refused"
	else
		echo "FAIL --optim-state q8 at 2 ranks: exit $rc"; grep '^strata' "$work/err"; fail=1
	fi
	# strata info names the libraries and the world
	"$strata" info >"$work/out" 2>&1
	grep -q "^comm .*mpi: Open MPI.*launcher: none, one rank" "$work/out" ||
		{ echo "FAIL info: no comm line at one rank"; grep comm "$work/out"; fail=1; }
	"$mpirun" 2 "$strata" info >"$work/out" 2>&1
	grep -q "^comm .*launcher: mpirun, rank 1 of 2" "$work/out" ||
		{ echo "FAIL info: no world under mpirun"; grep comm "$work/out"; fail=1; }
	echo "ok   info: $(grep -m1 '^comm' "$work/out" | cut -c1-60)..."
	;;
budget)
	b=(--gpu-mem 12M --host-mem 10M --nvme-mem 16M --offload-params nvme --offload-optim nvme
	   --steps 2)
	run one 1 "${b[@]}" --nvme-mem 64M
	for np in 2 4; do
		run "b$np" $np "${b[@]}" --zero 3
		python3 - "$work/one.jsonl" "$work/b$np.jsonl" $np <<'PY' || fail=1
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])][-1]["peak"]
last = [json.loads(l) for l in open(sys.argv[2])][-1]
n = int(sys.argv[3])
budget = {"vram": 12 << 20, "host": 10 << 20, "nvme": 16 << 20}
ok = True
for r, p in enumerate(last["rank_peak"]):
    for t, v in p.items():
        if v > budget[t]:
            print(f"FAIL rank {r} {t} peak {v} over its budget {budget[t]}"); ok = False
ratio = max(p["nvme"] for p in last["rank_peak"]) / one["nvme"]
# 1/N, and the slices' rounding up to 64 KiB (a third more at 4 ranks on
# this model's 198k-element blocks)
if not ratio <= 1.4 / n:
    print(f"FAIL stage 3 at {n} ranks: nvme per rank {ratio:.3f} of one rank's"); ok = False
else:
    print(f"ok   {n} ranks --zero 3: peaks within budgets; nvme per rank {ratio:.3f} of one rank's")
sys.exit(0 if ok else 1)
PY
	done
	;;
layer-first)
	run ref 1 --steps 3 --grad-accum 4 || { echo "FAIL one-rank run"; fail=1; }
	for z in 0 1 2 3; do
		for p in "${placements[@]}"; do
			[ "${p%%|*}" = split ] && continue
			# shellcheck disable=SC2086
			run "lf$z" 2 --steps 3 --grad-accum 2 --zero $z --schedule layer-first ${p#*|}
			same "lf$z" ref "2 ranks --zero $z --schedule layer-first --grad-accum 2, ${p%%|*} = 1 rank batch-first --grad-accum 4"
		done
		run "bf$z" 2 --steps 3 --grad-accum 2 --zero $z
		same "lf$z" "bf$z" "2 ranks --zero $z: layer-first = batch-first"
	done
	# each rank's checkpoints on its host, the N micro-batches' blocks
	run lfact 2 --steps 3 --zero 3 --grad-accum 2 --schedule layer-first \
		--offload-activations host --offload-params nvme
	same lfact ref "2 ranks --zero 3 layer-first, checkpoints on the host = 1 rank --grad-accum 4"
	# every block keeps the forward of each micro-batch
	run lfkeep 2 --steps 3 --zero 2 --grad-accum 2 --schedule layer-first --recompute none
	same lfkeep ref "2 ranks --zero 2 layer-first, --recompute none = 1 rank --grad-accum 4"
	ll=(--model llama:layers=2,dim=128,heads=4,kv-heads=2,ffn=256,vocab=256,ctx=64 --steps 3)
	run llref 1 "${ll[@]}" --grad-accum 6
	run ll 2 "${ll[@]}" --zero 3 --grad-accum 3 --schedule layer-first --offload-params nvme \
		--offload-optim nvme
	same ll llref "LLaMA: 2 ranks --zero 3 layer-first --grad-accum 3, on nvme = 1 rank --grad-accum 6"
	;;
in-backward)
	# held TAG: some step of TAG's held its speculation
	held() {
		grep -q '"in_backward":true' "$work/$1.jsonl" ||
			{ echo "FAIL $1: no step's speculation held"; fail=1; }
	}
	# the clip halfway between two of the steps' norms without one: some
	# steps' speculation holds, some redo (a sweep from the kept G) and
	# some, the clip applying where no G was kept, run again (replayed)
	run noclip 1 --steps 4 --grad-accum 4 --offload-params nvme --offload-optim nvme --clip 0
	clip=$(python3 -c 'import json, sys
n = sorted(json.loads(l)["grad_norm"] for l in open(sys.argv[1]))
print((n[1] + n[2]) / 2)' "$work/noclip.jsonl")
	nv=(--offload-params nvme --offload-optim nvme --clip "$clip")
	run ref 1 --steps 4 --grad-accum 4 "${nv[@]}" || { echo "FAIL one-rank run"; fail=1; }
	for z in 0 1 2 3; do
		for sched in batch-first layer-first; do
			run "ib$z$sched" 2 --steps 4 --grad-accum 2 --zero $z --schedule $sched \
				--update in-backward "${nv[@]}"
			same "ib$z$sched" ref "2 ranks --zero $z $sched --update in-backward = 1 rank, after"
			held "ib$z$sched"
		done
	done
	cat "$work"/ib[0-3]*.jsonl | grep -q '"replayed":true' ||
		{ echo "FAIL no 2-rank step was replayed"; fail=1; }
	# a clip that applies to every step: step 1 (0-based 0) is replayed,
	# the next ones update after, but step 3, made to speculate, is
	# replayed from the first batch step 2's sweep drew, on every rank;
	# batch-first at stages 0-3, layer-first at stage 3
	ca=(--steps 4 --offload-params nvme --offload-optim nvme --clip 0.001)
	run caref 1 "${ca[@]}" --grad-accum 4
	for z in 0 1 2 3 3lf; do
		sc=(--schedule batch-first)
		[ "$z" = 3lf ] && sc=(--schedule layer-first)
		ST_TEST_SPECULATE_STEP=2 run "ca$z" 2 "${ca[@]}" --grad-accum 2 --zero "${z%lf}" \
			"${sc[@]}" --update in-backward
		same "ca$z" caref "2 ranks --zero $z ${sc[1]} in-backward, clip always, 2 steps replayed = 1 rank, after"
		r=$(python3 -c 'import json, sys
print([i for i, l in enumerate(open(sys.argv[1])) if json.loads(l).get("replayed")])' \
			"$work/ca$z.jsonl")
		[ "$r" = "[0, 2]" ] || { echo "FAIL ca$z: replayed steps $r, not [0, 2]"; fail=1; }
	done
	# stages 1-2: the steps that held and those redone queue the update
	# after's collectives, step by step (calls and bytes of each kind); a
	# step replayed queues its backward's twice
	for z in 1 2; do
		run "af$z" 2 --steps 4 --grad-accum 2 --zero $z "${nv[@]}"
		python3 - "$work/af$z.jsonl" "$work/ib${z}batch-first.jsonl" "$z" <<'PY' || fail=1
import json, sys
sa, sb = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
a, b = ([{k: (v["calls"], v["bytes"]) for k, v in x["comm"].items()} for x in s]
        for s in (sa, sb))
ok = len(a) == len(b) == 4 and any(not x.get("replayed") for x in sb)
ok = ok and all(x.get("replayed") or a[i] == b[i] for i, x in enumerate(sb))
print(("ok  " if ok else "FAIL") + f" --zero {sys.argv[3]}: in-backward's collectives per step "
      f"= after's (but replayed steps {[i for i, x in enumerate(sb) if x.get('replayed')]})")
sys.exit(0 if ok else 1)
PY
	done
	# stages 1-2: the rank's slice of the new W goes to its home alone in
	# the backward, and is gathered from there at the commit: W in host
	# (in place) and in vram, and through the device buffers
	# ($ST_ZERO_DEVICE_PATH=1, the cuda device's path)
	for z in 1 2; do
		run "ibh$z" 2 --steps 4 --grad-accum 2 --zero $z --update in-backward \
			--offload-params host --offload-optim nvme --clip "$clip"
		same "ibh$z" ref "2 ranks --zero $z in-backward, W in host = 1 rank, after"
		held "ibh$z"
		run "ibv$z" 2 --steps 4 --grad-accum 2 --zero $z --update in-backward \
			--offload-params none --offload-optim nvme --gpu-mem 64M --clip "$clip"
		same "ibv$z" ref "2 ranks --zero $z in-backward, W in vram = 1 rank, after"
		held "ibv$z"
	done
	ST_ZERO_DEVICE_PATH=1 run ibd1 2 --steps 4 --grad-accum 2 --zero 1 --update in-backward \
		--offload-params host --offload-optim nvme --clip "$clip"
	same ibd1 ref "2 ranks --zero 1 in-backward, through the device = 1 rank, after"
	held ibd1
	ST_ZERO_DEVICE_PATH=1 run ibd2 2 --steps 4 --grad-accum 2 --zero 2 --update in-backward \
		--offload-params none --offload-optim nvme --gpu-mem 64M --clip "$clip"
	same ibd2 ref "2 ranks --zero 2 in-backward, W in vram through the device = 1 rank, after"
	held ibd2
	# and on the cpu-strict device, whose memory faults when the host
	# touches it (docs/gpu.md, "Strict mode")
	run ibs1 2 --steps 4 --grad-accum 2 --zero 1 --update in-backward --device cpu-strict \
		"${nv[@]}"
	same ibs1 ref "cpu-strict: 2 ranks --zero 1 in-backward, W on nvme = 1 rank, after"
	held ibs1
	run ibs2 2 --steps 4 --grad-accum 2 --zero 2 --update in-backward --device cpu-strict \
		--offload-params none --offload-optim nvme --gpu-mem 64M --clip "$clip"
	same ibs2 ref "cpu-strict: 2 ranks --zero 2 in-backward, W in vram = 1 rank, after"
	held ibs2
	# step 3 (0-based 2) skipped: unit 1's G not finite below the
	# speculated units, whose W is rebuilt from their P on every rank
	ST_TEST_NAN_GRAD=1:2 run nanref 1 --steps 4 --grad-accum 4 "${nv[@]}"
	for z in 0 1 2 3; do
		ST_TEST_NAN_GRAD=1:2 run "nan$z" 2 --steps 4 --grad-accum 2 --zero $z \
			--update in-backward "${nv[@]}"
		same "nan$z" nanref "2 ranks --zero $z in-backward, step 3 skipped = 1 rank, after"
		grep -q '"skipped":true' "$work/nan$z.jsonl" || { echo "FAIL nan$z: no step skipped"; fail=1; }
	done
	# without a clip (only a skip fails the speculation)
	nc=(--steps 4 --offload-params nvme --offload-optim nvme --clip 0)
	ST_TEST_NAN_GRAD=1:2 run nanref0 1 "${nc[@]}" --grad-accum 4
	for z in 0 2; do
		ST_TEST_NAN_GRAD=1:2 run "nanc$z" 2 "${nc[@]}" --grad-accum 2 --zero $z \
			--update in-backward
		same "nanc$z" nanref0 "2 ranks --zero $z in-backward, no clip, step 3 skipped = 1 rank, after"
		grep -q '"skipped":true' "$work/nanc$z.jsonl" || { echo "FAIL nanc$z: no step skipped"; fail=1; }
		held "nanc$z"
	done
	ST_TEST_NAN_GRAD=1:2 run nanh2 2 --steps 4 --grad-accum 2 --zero 2 --update in-backward \
		--offload-params host --offload-optim nvme --clip "$clip"
	same nanh2 nanref "2 ranks --zero 2 in-backward, W in host, step 3 skipped = 1 rank, after"
	# LLaMA, its own clip between its steps' norms
	ll=(--model llama:layers=2,dim=128,heads=4,kv-heads=2,ffn=256,vocab=256,ctx=64 --steps 4
	    --offload-params nvme --offload-optim nvme)
	run llnoclip 1 "${ll[@]}" --grad-accum 2 --clip 0
	llclip=$(python3 -c 'import json, sys
n = sorted(json.loads(l)["grad_norm"] for l in open(sys.argv[1]))
print((n[1] + n[2]) / 2)' "$work/llnoclip.jsonl")
	run llref 1 "${ll[@]}" --grad-accum 2 --clip "$llclip"
	for z in 0 1 2 3; do
		run "ll$z" 2 "${ll[@]}" --zero $z --update in-backward --clip "$llclip"
		same "ll$z" llref "LLaMA: 2 ranks --zero $z --update in-backward = 1 rank --grad-accum 2, after"
		held "ll$z"
	done
	# every step held: a rank neither writes its final G to nvme nor
	# reads it back, so its steps read and write the update after's bytes
	# less the plan's difference (G's write and load; stages 1-2 add the W
	# slice's); batch-first at N = 1 (G in the landing) and 2 (in the G
	# staging), and layer-first, without a clip; batch-first at N = 1
	# with one that does not apply. And each run moves its plan's bytes.
	for z in 0 1 2 3; do
		for sched in "batch-first 1 0" "batch-first 2 0" "layer-first 2 0" \
			     "batch-first 1 1e9"; do
			read -r sc n cl <<<"$sched"
			by=(--steps 2 --zero $z --schedule $sc --grad-accum $n --offload-params nvme
			    --offload-optim nvme --clip $cl)
			t=$z$sc$n-$cl
			run "bya$t" 2 "${by[@]}"
			run "byb$t" 2 "${by[@]}" --update in-backward
			for u in after in-backward; do
				"$strata" plan --json --world 2 --zero $z --grad-accum $n --schedule $sc \
					--batch 2 --seq 32 --gpu-mem 16M --host-mem 12M --nvme "$work/nvme" \
					--offload-params nvme --offload-optim nvme --update $u \
					>"$work/plan-$u.json" || { echo "FAIL plan --update $u"; fail=1; }
			done
			python3 - "$work/bya$t.jsonl" "$work/byb$t.jsonl" "$work/plan-after.json" \
				"$work/plan-in-backward.json" "--zero $z $sc N = $n --clip $cl" <<'PY' || fail=1
import json, sys
def tot(f):
    s = [json.loads(l) for l in open(f)]
    return len(s), sum(x["bytes"]["nvme_read"] for x in s), sum(x["bytes"]["nvme_write"] for x in s), \
        all(x.get("in_backward") for x in s)
na, ra, wa, _ = tot(sys.argv[1])
nb, rb, wb, held = tot(sys.argv[2])
pa, pb = (json.load(open(f))["traffic"] for f in sys.argv[3:5])
dr = na * (pa["nvme_read_bytes"] - pb["nvme_read_bytes"])
dw = na * (pa["nvme_write_bytes"] - pb["nvme_write_bytes"])
ok = na == nb == 2 and held and ra - rb == dr and wa - wb == dw and dr > 0
# and each run its plan's bytes: the update after's sweep runs the next
# step's forward, and the last step's has none, so the run's sum is
# steps x the plan's one step
ok = ok and (ra, wa, rb, wb) == tuple(na * p[k] for p in (pa, pb)
                                      for k in ("nvme_read_bytes", "nvme_write_bytes"))
print(("ok   " if ok else "FAIL ") + f"{sys.argv[5]}: in-backward reads {ra - rb} B less "
      f"(plan {dr}), writes {wa - wb} less (plan {dw}); all held: {held}; read, written "
      f"{ra}, {wa} (after), {rb}, {wb} (in-backward); plans x {na}: "
      f"{[na * p[k] for p in (pa, pb) for k in ('nvme_read_bytes', 'nvme_write_bytes')]}")
sys.exit(0 if ok else 1)
PY
		done
	done
	;;
comm)
	for spec in "2 0 1" "2 1 1" "2 2 2" "2 3 1" "4 3 1" "4 1 2" "2 0 3 layer-first" \
		    "2 3 2 layer-first"; do
		read -r np z a sched <<<"$spec"
		sched=${sched:-batch-first}
		run "c$np$z" $np --steps 2 --zero $z --grad-accum $a --schedule $sched
		"$strata" plan --json --world $np --zero $z --grad-accum $a --batch 2 --seq 32 \
			--gpu-mem 16M --host-mem 12M --nvme "$work/nvme" --schedule $sched >"$work/plan.json"
		python3 - "$work/plan.json" "$work/c$np$z.jsonl" "$np ranks --zero $z --grad-accum $a $sched" <<'PY' || fail=1
import json, sys
plan = json.load(open(sys.argv[1]))["zero"]["comm"]
steps = [json.loads(l)["comm"] for l in open(sys.argv[2])]
got = {}
for s in steps:
    for k, v in s.items():
        c = got.setdefault(k, [0, 0])
        c[0] += v["calls"]; c[1] += v["bytes"]
want = {k: [v["calls"] * len(steps), v["bytes"] * len(steps)] for k, v in plan.items()}
if got != want:
    print(f"FAIL {sys.argv[3]}: measured {got}, the plan says {want}"); sys.exit(1)
print(f"ok   {sys.argv[3]}: collectives = the plan's ({want})")
PY
	done
	;;
trace)
	# one trace per rank; the collectives on a "comm" lane, overlapping
	# the compute
	timeout 120 "$mpirun" 2 "$strata" train "${common[@]}" --steps 3 --zero 3 \
		--trace "$work/t.json" >"$work/t.log" 2>&1 || { echo "FAIL trace run"; tail -3 "$work/t.log"; fail=1; }
	for r in 0 1; do
		python3 - "$work/t.json.rank-$r" "$r" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
lanes = {x["tid"]: x["args"]["name"] for x in ev
         if x.get("ph") == "M" and x.get("name") == "thread_name"}
spans = {}
for x in ev:
    if x.get("ph") == "X":
        spans.setdefault(lanes.get(x["tid"]), []).append((x["ts"], x["ts"] + x["dur"]))
comm, comp = spans.get("comm", []), spans.get("compute", [])
ov = sum(max(0, min(a1, b1) - max(a0, b0)) for a0, a1 in comm for b0, b1 in comp)
if not comm or ov <= 0:
    print(f"FAIL trace rank {sys.argv[2]}: {len(comm)} comm spans, {ov:.0f} us over compute")
    sys.exit(1)
print(f"ok   trace rank {sys.argv[2]}: {len(comm)} collectives, {ov:.0f} us of them over compute")
PY
	done
	# stages 1-2: the updated W's gathers on the comm queue, over the
	# next unit's AdamW (the host thread), which used to wait for each
	timeout 120 "$mpirun" 2 "$strata" train "${common[@]}" --steps 3 --zero 1 \
		--model layers=2,dim=256,heads=4,vocab=256,ctx=64 --gpu-mem 128M --host-mem 128M \
		--trace "$work/t1.json" >"$work/t1.log" 2>&1 || { echo "FAIL trace run (--zero 1)"; tail -3 "$work/t1.log"; fail=1; }
	# (a gather waits for the later rank, so on the earlier one the next
	# unit's AdamW runs inside it: counted over both ranks)
	python3 - "$work/t1.json.rank-0" "$work/t1.json.rank-1" <<'PY' || fail=1
import json, sys
n_wg = over = ov = 0
for path in sys.argv[1:]:
    d = json.load(open(path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    lanes = {x["tid"]: x["args"]["name"] for x in ev
             if x.get("ph") == "M" and x.get("name") == "thread_name"}
    wg = [(x["ts"], x["ts"] + x["dur"]) for x in ev
          if x.get("ph") == "X" and lanes.get(x["tid"]) == "comm" and x["name"] == "W gather"]
    work = [(x["ts"], x["ts"] + x["dur"]) for x in ev
            if x.get("ph") == "X" and lanes.get(x["tid"]) == "cpu adam"]
    n_wg += len(wg)
    ov += sum(max(0, min(a1, b1) - max(a0, b0)) for a0, a1 in wg for b0, b1 in work)
    over += sum(1 for a0, a1 in wg if any(min(a1, b1) > max(a0, b0) for b0, b1 in work))
if not n_wg or not over:
    print(f"FAIL trace --zero 1: {n_wg} W gathers on 2 ranks, {over} of them over AdamW")
    sys.exit(1)
print(f"ok   trace --zero 1: {over} of {n_wg} W gathers (2 ranks) over AdamW ({ov:.0f} us)")
PY
	;;
devpath)
	# the cuda device's path on the cpu device: the norm's sums, the
	# losses, stage 0's G and the stages 1-2 W gathers through device
	# buffers (the comm scratch, copies on the comm queue), and the mpi
	# backend through its host staging: the same numbers
	export ST_ZERO_DEVICE_PATH=1
	# each of the W gather's ways (W home vram, host, nvme) at stage 1;
	# stage 0's G gather; stage 3's sharded states read back at the save
	run ref 1 --steps 3 --grad-accum 2
	for spec in "0 host" "0 vram" "1 host" "1 nvme" "1 vram" "2 nvme" "3 host" "3 vram"; do
		read -r z p <<<"$spec"
		home_args "$p"
		run "d$z$p" 2 --steps 3 --zero "$z" "${a[@]}"
		same "d$z$p" ref "2 ranks --zero $z through device buffers, $p = 1 rank --grad-accum 2"
	done
	;;
strict-np2 | strict-np4)
	# the cuda device's path on a device whose memory faults when the host
	# touches it: every collective through device buffers and the mpi
	# backend's host staging (not unified: no $ST_ZERO_DEVICE_PATH needed)
	np=${part#strict-np}
	run ref 1 --steps 3 --grad-accum "$np"
	specs=("0 host" "0 vram" "1 nvme" "1 vram" "2 nvme" "2 host" "3 host" "3 vram")
	[ "$np" = 4 ] && specs=("0 vram" "1 nvme" "2 host" "3 vram")
	for spec in "${specs[@]}"; do
		read -r z p <<<"$spec"
		home_args "$p"
		run "s$z$p" "$np" --steps 3 --zero "$z" --device cpu-strict "${a[@]}"
		same "s$z$p" ref "cpu-strict: $np ranks --zero $z, $p = 1 rank --grad-accum $np"
		# what strict mode refused, with its stack
		grep -m1 -A24 '^strata: cpu-strict: ' "$work/s$z$p.log"
	done
	# layer-first: the fold of the ranks' slots on the device
	if [ "$np" = 2 ]; then
		run ref2 1 --steps 3 --grad-accum 4
		for z in 0 3; do
			run "sl$z" 2 --steps 3 --zero $z --grad-accum 2 --device cpu-strict \
				--schedule layer-first --offload-params nvme --offload-optim nvme
			same "sl$z" ref2 "cpu-strict: 2 ranks --zero $z layer-first, nvme = 1 rank --grad-accum 4"
			grep -m1 -A24 '^strata: cpu-strict: ' "$work/sl$z.log"
		done
	fi
	;;
cuda1 | cuda2)
	# on a GPU (tools/gpu-check): cuda1, the engine through a world-1
	# nccl communicator = through the local one; cuda2, 2 ranks sharing
	# the one GPU with the mpi backend (host staging; nccl refuses two
	# ranks on one GPU) = 1 rank at --grad-accum 2, at every stage
	if "$strata" info 2>&1 | grep -q '^gpu  *none'; then echo "no GPU: skipped"; exit 77; fi
	common+=(--device cuda --gpu-mem 512M --host-mem 512M)
	if [ "$part" = cuda1 ]; then
		"$strata" info 2>&1 | grep -q "nccl: NCCL" || { echo "nccl not loadable: skipped"; exit 77; }
		# every stage: at world 1 the engine runs no collective
		# (engine_zero.c), so each pair shows that a world-1 nccl comm
		# opens on the GPU beside the engine and moves no bit
		for z in 0 1 2 3; do
			run "ref$z" 1 --steps 3 --grad-accum 2 --zero $z
			ST_COMM=nccl run "nc$z" 1 --steps 3 --grad-accum 2 --zero $z
			grep -qi "nccl" "$work/nc$z.log" && grep -i nccl "$work/nc$z.log" | head -2
			same "nc$z" "ref$z" "cuda: --zero $z through nccl at world 1 = through the local comm"
		done
	else
		run ref 1 --steps 3 --grad-accum 2
		for z in 0 1 2 3; do
			ST_COMM=mpi run "m$z" 2 --steps 3 --zero $z
			same "m$z" ref "cuda: 2 ranks on one GPU (mpi) --zero $z = 1 rank --grad-accum 2"
		done
	fi
	;;
mask)
	# a shard with a loss mask (the step's loss the mean over its counted
	# targets, docs/finetune.md): every rank counts the step's targets
	# from the same cursor, so N ranks = 1 rank, bit for bit
	for spec in masked.bin:97 short.bin:11; do
	python3 - "$work/data.txt" "$work/${spec%:*}" "${spec#*:}" <<'PY'
import struct, sys
toks = open(sys.argv[1], "rb").read()
n = len(toks)
# documents of 97 tokens (--samples documents), or of 11 (rows of 32
# pack two: --packing isolated)
docs = list(range(0, n, int(sys.argv[3])))
hdr = [0] * 256
hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[7] = 20240520, 1, n, 0x41525453, 3, len(docs)
mask = bytes(1 if i % 34 >= 23 else 0 for i in range(n))
body = struct.pack("<256i", *hdr) + struct.pack(f"<{n}H", *toks) + mask
body += bytes(-len(body) % 8) + struct.pack(f"<{len(docs)}Q", *docs)
with open(sys.argv[2], "wb") as f:
    f.write(body)
PY
	done
	common=(--data "$work/masked.bin" "${common[@]:2}")
	run ref 1 --steps 3 --grad-accum 4
	for z in 0 3; do
		run "m$z" 2 --steps 3 --grad-accum 2 --zero $z --offload-params nvme
		same "m$z" ref "masked: 2 ranks --zero $z --grad-accum 2 = 1 rank --grad-accum 4"
	done
	run lf 2 --steps 3 --grad-accum 2 --zero 1 --schedule layer-first
	same lf ref "masked: 2 ranks --zero 1 layer-first = 1 rank --grad-accum 4"
	run m4 4 --steps 3 --zero 2
	same m4 ref "masked: 4 ranks --zero 2 = 1 rank --grad-accum 4"
	run dref 1 --steps 3 --grad-accum 4 --samples documents
	run d2 2 --steps 3 --grad-accum 2 --zero 1 --samples documents
	same d2 dref "masked, --samples documents: 2 ranks --zero 1 = 1 rank --grad-accum 4"
	# --packing isolated: each rank's micro-batches carry their segment
	# starts; 2 ranks (layer-first too) = 1 rank, bit for bit
	common=(--data "$work/short.bin" "${common[@]:2}")
	run iref 1 --steps 3 --grad-accum 4 --samples documents --packing isolated
	run i2 2 --steps 3 --grad-accum 2 --zero 1 --samples documents --packing isolated
	same i2 iref "isolated documents: 2 ranks --zero 1 = 1 rank --grad-accum 4"
	run i3 2 --steps 3 --grad-accum 2 --zero 3 --samples documents --packing isolated \
		--schedule layer-first
	same i3 iref "isolated documents: 2 ranks --zero 3 layer-first = 1 rank --grad-accum 4"
	;;
*)
	echo "test_zero.sh: unknown part '$part'" >&2
	exit 2
	;;
esac
exit $fail
