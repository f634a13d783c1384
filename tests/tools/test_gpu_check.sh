#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2016 # ok never fails; the stubs' bodies expand when they run
# tools/gpu-check --run on a stand-in build, no GPU needed: every program a
# step runs is a stub script, ncu and compute-sanitizer are stubs on PATH.
#   - a whole run: pass, fail, ncu without counter permission (skip, not
#     fail), the sanitize step failing on one tool's report; the exit
#     status; --out DIR holds summary.txt (a line per step), gpu-logs.tgz
#     (LOGDIR with every step's log), console.log, and no running.log;
#     fewer than 8 files there (a runner's limit);
#   - a run killed in its second step (SIGKILL to its process group, as a
#     runner's timeout does): --out DIR still has the first step's line and
#     log, and the second step's output so far in running.log.
# usage: test_gpu_check.sh GPU-CHECK
set -u
gc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-test.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# --list: every step once, in --run's order, each with a limit and a line
"$gc" --list >"$work/list" || bad "--list: exit $?"
n=$(grep -cE '^[0-9]+ +[a-z_0-9]+ +[0-9]+s  [^?]' "$work/list")
first=$(awk 'NR == 2 {print $2}' "$work/list")
last=$(grep -E '^[0-9]+ ' "$work/list" | tail -1 | awk '{print $2}')
[ "$n" -ge 20 ] && [ "$first" = comm_cuda ] && [ "$last" = kernels_torch ] &&
	ok "--list: $n steps, $first first, the profiler ($last) last" ||
	{ bad "--list: $n steps, $first first, $last last"; cat "$work/list"; }

# stub NAME BODY: an executable script at $work/NAME
stub() {
	mkdir -p "$(dirname "$work/$1")"
	printf '#!/usr/bin/env bash\n%s\n' "$2" >"$work/$1"
	chmod +x "$work/$1"
}
b=build
stub $b/src/cli/strata 'echo "gpu       stand-in"; exit 0'
stub $b/tests/cuda/test_cuda_device 'echo "ok   11 tests"; exit 0'
stub $b/tests/comm/test_comm_cuda 'echo "FAIL allgather: rank 0 slot 1 differs"; exit 1'
for t in test_cuda_attention_bf16 test_cuda_head_ce test_cuda_bf16; do
	stub $b/tests/cuda/$t "echo \"$t small=\${ST_TEST_SMALL:-}\"; exit 0"
done
# test_cuda_ops: prints, then waits for a file that never comes (the
# killed run's second step)
stub $b/tests/cuda/test_cuda_ops "echo \$\$ >$work/ops.pid; echo 'ok   first comparisons'
while [ -d $work ]; do sleep 0.2; done"
# ncu denied the counters: the program runs, nothing is measured
stub bin/ncu 'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"; exit 1'
# compute-sanitizer: runs the test; racecheck reports on the fused head
stub bin/compute-sanitizer 'case $1 in --version) echo "Version 2025.3"; exit 0 ;; esac
tool=$2; shift 6 # --tool T --error-exitcode N --print-limit N PROGRAM
"$@" || exit
if [ "$tool" = racecheck ] && [[ $1 == *head_ce ]]; then
	echo "========= Error: Race reported between Write access and Read access"
	echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
	exit 86
fi'
export PATH=$work/bin:$PATH GPU_CHECK_NVME=$work/nvme
mkdir -p "$work/nvme"

# a whole run
(cd "$work" && "$gc" --run $b "$work/gl" --out "$work/out" \
	--only test_cuda_device,comm_cuda,sanitize,kernels >"$work/run.log" 2>&1)
rc=$?
[ $rc = 1 ] && ok "exit 1 when a step failed" || bad "exit $rc, want 1"
row() { grep -E "^$1 +$2 " "$work/out/summary.txt" >/dev/null; }
row test_cuda_device pass && row comm_cuda fail && row kernels skip && row sanitize fail &&
	ok "summary.txt: a line per step (pass, fail, skip, fail)" ||
	{ bad "summary.txt"; cat "$work/out/summary.txt"; }
grep -q "ERR_NVGPUCTRPERM" "$work/out/summary.txt" && ok "ncu without counter permission: skipped" ||
	bad "no ERR_NVGPUCTRPERM reason"
grep -q "FAIL racecheck test_cuda_head_ce" "$work/gl/sanitize.log" &&
	[ "$(grep -c '^ok   ' "$work/gl/sanitize.log")" = 11 ] &&
	grep -q "small=1" "$work/gl/sanitize-memcheck-test_cuda_bf16.log" &&
	ok "sanitize: 11 runs clean at ST_TEST_SMALL=1, racecheck's report on the head failed" ||
	{ bad "sanitize"; cat "$work/gl/sanitize.log"; }
# a step limit too short for one run: nothing runs, and that is no pass
GPU_CHECK_STEP_LIMIT=30 "$gc" --sanitize "$work/$b" "$work/san" >"$work/san.log" 2>&1
rc=$?
[ $rc = 1 ] && [ "$(grep -c '^NOT RUN ' "$work/san.log")" = 12 ] &&
	grep -q "^FAIL sanitize: 12 runs: 0 clean, 0 failed, 0 skipped, 12 not run" "$work/san.log" &&
	ok "sanitize without the time for a run: 12 not run, exit 1" ||
	{ bad "sanitize, step limit 30: exit $rc"; cat "$work/san.log"; }
tar tzf "$work/out/gpu-logs.tgz" >"$work/tgz" 2>&1
for f in summary.txt test_cuda_device.log comm_cuda.log kernels.log sanitize.log \
	sanitize-racecheck-test_cuda_head_ce.log; do
	grep -qx "gl/$f" "$work/tgz" || { bad "gpu-logs.tgz has no gl/$f"; cat "$work/tgz"; }
done
grep -q "== summary" "$work/out/console.log" && ok "console.log has the summary" ||
	bad "console.log"
[ ! -e "$work/out/running.log" ] && ok "no running.log after a whole run" || bad "running.log left"
n=$(find "$work/out" -type f | wc -l)
[ "$n" -le 8 ] && ok "--out holds $n files" || bad "--out holds $n files, over a runner's 8"

# a run killed in its second step: the first step's line and log, the
# second's output so far
rm -rf "$work/gl" "$work/out"
(cd "$work" && exec setsid "$gc" --run $b "$work/gl" --out "$work/out" \
	--only test_cuda_device,test_cuda_ops >"$work/run2.log" 2>&1) &
job=$!
for _ in $(seq 300); do
	grep -q "first comparisons" "$work/out/running.log" 2>/dev/null && break
	sleep 0.1
done
pgid=$(ps -o pgid= -p "$job" | tr -d ' ')
# the subshell execs setsid, which execs gpu-check: its own group
[ -n "$pgid" ] && kill -KILL -- "-$pgid"
wait "$job" 2>/dev/null
# timeout put the step in a process group of its own (a runner ends every
# process the call leaves): end it here
[ -s "$work/ops.pid" ] && kill "$(cat "$work/ops.pid")" 2>/dev/null
row test_cuda_device pass && ! grep -q "^test_cuda_ops " "$work/out/summary.txt" &&
	ok "killed: summary.txt has the first step only" ||
	{ bad "killed: summary.txt"; cat "$work/out/summary.txt"; }
grep -q "== test_cuda_ops" "$work/out/running.log" &&
	grep -q "first comparisons" "$work/out/running.log" &&
	ok "killed: running.log has the second step's output so far" || bad "killed: running.log"
tar tzf "$work/out/gpu-logs.tgz" 2>/dev/null | grep -qx "gl/test_cuda_device.log" &&
	ok "killed: gpu-logs.tgz has the first step's log" || bad "killed: gpu-logs.tgz"
[ $fail = 0 ] && echo PASS
exit $fail
