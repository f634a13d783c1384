#!/usr/bin/env bash
# tests/comm/test_multinode.sh STRATA: ZeRO on 2 nodes x 2 ranks, on this one
# machine (docs/zero.md, Many nodes). tests/comm/fake-node is mpirun's rsh
# agent: each "node" (nodea, nodeb) is a UTS and mount namespace of its own
# with its own hostname, so Open MPI puts one orted on each, the nodes'
# ranks talk over TCP, and strata sees two hosts. Checks, each against a
# run of one rank, which shares no collective with the runs it checks:
#   - strata info on each node: its host, 2 nodes
#   - --zero 1 and --zero 3 (W on nvme) at 4 ranks on 2 nodes: the losses,
#     norms (--metrics) and the checkpoint's tensor bytes of 1 rank at
#     --grad-accum 4, bit for bit; the "world:" line names the 2 nodes
#   - a checkpoint saved at 4 ranks on 2 nodes resumes at 1 rank and ends
#     where an uninterrupted one-rank run ends
#   - a rank on nodeb SIGKILLed mid-run ends the whole job within 30 s,
#     naming it; the last checkpoint stays whole (resumed at 1 rank)
#   - refused before step 1, exit 2, one line: another BLAS kernel on
#     nodeb (OPENBLAS_CORETYPE there), and a --save DIR that is node-local
#     (each node's own tmpfs: ST_FAKE_NODE_PRIVATE)
# Exits 77 without mpirun, or where unshare is refused (but fails under
# CI=true: CI must not skip it silently).
set -u
strata=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-multinode-test.XXXXXX")
trap '[ -n "${ST_KEEP:-}" ] || rm -rf "$work"' EXIT
fail=0
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ST_QUIET=1

if ! command -v mpirun >/dev/null 2>&1; then
	echo "mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev): skipped"
	exit 77
fi
if ! out=$("$here/fake-node" --probe); then
	echo "$out"
	if [ "${CI:-}" = true ]; then
		echo "FAIL fake nodes need unshare --uts --mount, refused here, in CI"
		exit 1
	fi
	echo "skipped"
	exit 77
fi
# as tests/mpi-run: root, shared memory without CMA, LeakSanitizer, a
# session directory of this test's own
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
case ${LSAN_OPTIONS:-} in
*suppressions=*) ;;
*) export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$here/../lsan-mpi.supp:fast_unwind_on_malloc=0" ;;
esac
export OMPI_MCA_orte_tmpdir_base=$work/ompi
mkdir -p "$OMPI_MCA_orte_tmpdir_base"
# 4 ranks, 2 on each fake node; ranks that wait yield the cores (2 in CI:
# busy-polling ranks and orteds would starve the ones computing)
# shellcheck disable=SC2054 # --host takes a comma list
mn=(mpirun --oversubscribe --bind-to none --mca plm_rsh_agent "$here/fake-node"
    --host nodea:2,nodeb:2 -np 4 --mca mpi_yield_when_idle 1)

# shellcheck source=../cli/check.sh
. "$here/../cli/check.sh"
# shellcheck source=../lib/train_runs.sh
. "$here/../lib/train_runs.sh"
text "$work/data.txt" 7 ranks on two nodes add their slices in rank order and agree
mkdir -p "$work/nvme"
# shellcheck disable=SC2054 # --model takes a comma list
common=(--data "$work/data.txt" --batch 2 --seq 32 --nvme "$work/nvme" --log-every 100
	--warmup 1 --seed 5 --model layers=2,dim=64,heads=2,vocab=256,ctx=32)

# run TAG NP ARGS...: strata train on NP ranks (1: alone; 4: 2 nodes) into
# $work/TAG.{jsonl,log} and checkpoint $work/TAG/
run() {
	local tag=$1 np=$2
	shift 2
	ranks_run "$tag" "$np" "${mn[@]}" -- "$@"
}
# refused TAG WHAT REGEX: the run failed with exit 2 before step 1, with
# one line (rank 0's) matching REGEX, and left no checkpoint
refused() {
	local rc=$1 tag=$2 what=$3 re=$4
	if [ "$rc" != 2 ]; then
		echo "FAIL $what: exit $rc, not 2"; tail -4 "$work/$tag.log"; fail=1
	elif [ "$(grep -cE -e "$re" "$work/$tag.log")" != 1 ]; then
		echo "FAIL $what: not one line matching '$re'"; tail -4 "$work/$tag.log"; fail=1
	elif grep -q '^step ' "$work/$tag.log" || [ -e "$work/$tag/latest" ]; then
		echo "FAIL $what: refused only after a step"; fail=1
	else
		echo "ok   $what: $(grep -E -e "$re" "$work/$tag.log" | cut -c1-150)"
	fi
}

# each node sees itself and the job's 2 nodes
timeout 60 "${mn[@]}" "$strata" info >"$work/info" 2>&1
if [ "$(grep -c 'host nodea, 2 nodes' "$work/info")" = 2 ] &&
   [ "$(grep -c 'host nodeb, 2 nodes' "$work/info")" = 2 ]; then
	echo "ok   strata info on 2 fake nodes: 2 ranks on nodea, 2 on nodeb"
else
	echo "FAIL strata info on 2 nodes"; grep -E 'comm|rror' "$work/info" | head -4; fail=1
fi

# the determinism promise across nodes
run ref 1 --steps 3 --grad-accum 4 || { echo "FAIL the one-rank run"; tail -3 "$work/ref.log"; exit 1; }
run z1 4 --steps 3 --zero 1
same z1 ref "4 ranks on 2 nodes --zero 1 = 1 rank --grad-accum 4"
if grep -q '^world: 4 ranks on 2 nodes: nodea (ranks 0-1), nodeb (ranks 2-3) | --zero 1 | comm mpi' "$work/z1.log"; then
	echo "ok   the world: line names the 2 nodes"
else
	echo "FAIL no world: line naming the nodes"; grep -E '^world' "$work/z1.log"; fail=1
fi
run z3 4 --steps 3 --zero 3 --offload-params nvme --prefetch 1
same z3 ref "4 ranks on 2 nodes --zero 3, W on nvme = 1 rank --grad-accum 4"

# saved at 4 ranks on 2 nodes (step 3 of 6), resumed at 1 rank
run ref6 1 --steps 6 --grad-accum 4
run four 4 --steps 6 --zero 3 --save-every 3 --keep 0
rm -rf "$work/re1" && mkdir -p "$work/re1"
if s3=$(cd "$work/four" && ls -d step-*3) && cp -r "$work/four/$s3" "$work/re1/"; then
	ln -s "$s3" "$work/re1/latest"
	head -3 "$work/four.jsonl" >"$work/re1.jsonl"
	"$strata" train "${common[@]}" --steps 6 --grad-accum 4 --save "$work/re1" --resume auto \
		--metrics "$work/re1.jsonl" >"$work/re1.log" 2>&1
	grep -q "resumed from" "$work/re1.log" || { echo "FAIL resume at 1: not resumed"; tail -3 "$work/re1.log"; fail=1; }
	same re1 ref6 "saved at 4 ranks on 2 nodes (--zero 3), resumed at 1 rank"
else
	echo "FAIL no step 3 checkpoint from 4 ranks"; tail -3 "$work/four.log"; fail=1
fi

# a rank on nodeb (rank 3) SIGKILLed mid-run: its orted sees it, mpirun
# ends the whole job naming it; the last checkpoint resumes at 1 rank
run kref 1 --steps 40 --grad-accum 4
rm -rf "$work/k" "$work/k.jsonl"
"${mn[@]}" "$strata" train "${common[@]}" --steps 40 --zero 1 --save "$work/k" --save-every 1 \
	--metrics "$work/k.jsonl" >"$work/k.log" 2>&1 &
job=$!
for _ in $(seq 600); do
	[ "$(wc -l 2>/dev/null <"$work/k.jsonl" || echo 0)" -ge 3 ] && break
	sleep 0.05
done
victim=
for p in $(pgrep -f -- "--save $work/k "); do
	tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=3 && victim=$p
done
if [ -z "$victim" ]; then
	echo "FAIL kill: rank 3 not found (the run ended first?)"; tail -3 "$work/k.log"; fail=1
	wait $job
else
	t0=$(date +%s%N)
	kill -KILL "$victim"
	# bounded: a job that outlives 30 s fails here rather than hangs
	for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
	if kill -0 $job 2>/dev/null; then
		echo "FAIL kill: the job still runs 30 s after rank 3's SIGKILL"; kill -TERM $job
	fi
	wait $job
	rc=$?
	dt=$((($(date +%s%N) - t0) / 100000000))
	if [ "$rc" = 0 ]; then
		echo "FAIL kill: exit 0 after rank 3's SIGKILL"; fail=1
	elif ! grep -qiE "rank 3 .*(signal 9|killed)" "$work/k.log"; then
		echo "FAIL kill: the job's end does not name rank 3"; tail -6 "$work/k.log"; fail=1
	else
		echo "ok   kill: rank 3 on nodeb SIGKILLed, the job ended in $((dt / 10)).$((dt % 10)) s (exit $rc)"
	fi
	"$strata" train "${common[@]}" --steps 40 --grad-accum 4 --save "$work/k" --save-every 1 \
		--resume auto --metrics "$work/k.jsonl" >"$work/k2.log" 2>&1 ||
		{ echo "FAIL kill: --resume auto at 1 rank"; tail -3 "$work/k2.log"; fail=1; }
	# the metrics of the steps redone after the kill are there twice
	awk -F'[:,]' '!seen[$2]++' "$work/k.jsonl" >"$work/k.u" && mv "$work/k.u" "$work/k.jsonl"
	same k kref "rank 3 killed on nodeb, --resume auto at 1 rank = uninterrupted"
fi

# another BLAS kernel on nodeb: refused at the start-up agreement
cur=$(grep -o '^world: .*| blas [A-Za-z0-9]*' "$work/z1.log" | sed 's/.*blas //')
other=Haswell
[ "$cur" = Haswell ] && other=Sandybridge
rc=0
(export ST_FAKE_NODE_ENV_nodeb="OPENBLAS_CORETYPE=$other" && run blas 4 --steps 3 --zero 1) || rc=$?
refused "$rc" blas "another BLAS kernel on nodeb ($other, not $cur)" \
	"the ranks do not run the same configuration: rank 2 has blas=.*$other"

# --save DIR node-local: each node its own tmpfs at $work/local (the
# probe goes where DIR will be made: there)
mkdir -p "$work/local"
rc=0
ST_FAKE_NODE_PRIVATE=$work/local timeout 120 "${mn[@]}" "$strata" train "${common[@]}" --steps 3 \
	--zero 1 --save "$work/local/ck" >"$work/lc.log" 2>&1 || rc=$?
refused "$rc" lc "--save DIR not shared by the nodes" \
	"--save .*local/ck is not one directory shared by every node: rank 2 on nodeb"
if [ -n "$(ls -A "$work/local")" ]; then
	echo "FAIL the refused run left files in $work/local"; ls -A "$work/local"; fail=1
fi
exit $fail
