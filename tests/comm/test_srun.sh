#!/usr/bin/env bash
# tests/comm/test_srun.sh STRATA: ZeRO under Slurm's srun through PMIx
# (docs/zero.md), on the cpu device. A private one-node Slurm
# (tests/comm/slurm-local) is started for the test and stopped after it;
# where slurmctld and slurmd are not installed, a Slurm that already
# answers ($SLURM_CONF, or the system's) is used instead. Exits 77 where
# neither is usable (slurm-local's daemons do not start: their log's
# tail is printed), or srun has no pmix plugin. Checks:
#   - srun --mpi=pmix -n 2 strata info: launcher pmix, ranks 0 and 1 of 2
#   - 2 ranks under srun at --zero 1 and at --zero 3 (W on nvme: each rank
#     its own rank-R directory) give the losses, norms and checkpoint
#     tensor bytes of 1 rank at --grad-accum 2, bit for bit
#   - scancel -s TERM (SIGTERM to every task): every rank stops after the
#     same step and saves, srun exits 130; --resume auto then goes on
#     where an uninterrupted one-rank run goes (independent of timing)
#   - srun -n 2 with no MPI plugin: every task exits 2 with one line
#     naming --mpi=pmix (not 2 one-rank runs writing the same files)
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-srun-test.XXXXXX")
here=$(cd "$(dirname "$0")" && pwd)
# the Slurm's own directory short: its spool holds unix sockets (108 bytes)
sdir=$(mktemp -d /tmp/strata-slurm.XXXXXX)
cleanup() {
	# even before start returned (an interrupt while the daemons came
	# up); stop is a no-op without their pid files
	"$here/slurm-local" stop "$sdir" >/dev/null 2>&1
	rm -rf "$work" "$sdir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail=0
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ST_QUIET=1
# as tests/mpi-run: shared memory without CMA (containers forbid it), and
# in an ASan build LeakSanitizer skips what Open MPI keeps past MPI_Finalize
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
case ${LSAN_OPTIONS:-} in
*suppressions=*) ;;
*) export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$here/../lsan-mpi.supp:fast_unwind_on_malloc=0" ;;
esac

if ! command -v srun >/dev/null 2>&1; then
	echo "srun not found (Debian: apt-get install slurmctld slurmd slurm-client): skipped"
	exit 77
fi
own= out=
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1; then
	out=$("$here/slurm-local" start "$sdir")
	rc=$?
	if [ $rc = 0 ]; then
		own=1
		export SLURM_CONF=$sdir/slurm.conf
	elif [ $rc != 77 ]; then
		# srun is not usable here (a container's cgroups, say): skipped,
		# loudly, with the daemon's own words; in CI, which installs
		# Slurm for this test, a failure
		printf '%s\n' "$out"
		if [ "${CI:-}" = true ]; then
			echo "FAIL the private Slurm did not start (exit $rc), in CI"
			exit 1
		fi
		echo "the private Slurm did not start (exit $rc; its words above): skipped"
		exit 77
	fi
fi
if [ -z "$own" ] && ! timeout 30 srun -n 1 true >/dev/null 2>&1; then
	echo "no Slurm answers srun here, and none could be started ($out): skipped"
	exit 77
fi
if ! srun --mpi=list 2>&1 | grep -qw pmix; then
	echo "srun has no pmix plugin ($(srun --mpi=list 2>&1 | tr '\n' ' ')): skipped"
	exit 77
fi
echo "ok   srun: $(srun --version) $(srun --mpi=list 2>&1 | grep -o 'pmix_v[0-9]*' | head -1)${own:+, a private Slurm}"

# shellcheck source=../cli/check.sh
. "$here/../cli/check.sh"
# shellcheck source=../lib/train_runs.sh
. "$here/../lib/train_runs.sh"
text "$work/data.txt" 11 srun starts every task and pmix joins them into one world
mkdir -p "$work/nvme"
common=(--data "$work/data.txt" --batch 2 --seq 32 --nvme "$work/nvme" --log-every 100
	--warmup 1 --seed 5)

# run TAG LAUNCH... -- ARGS...: tests/lib/train_runs.sh's train_run
run() { train_run "$@"; }

# the world as strata sees it under srun
timeout 60 srun --mpi=pmix -n 2 "$strata" info >"$work/info" 2>&1
if grep -q 'launcher: pmix, rank 0 of 2' "$work/info" && grep -q 'launcher: pmix, rank 1 of 2' "$work/info"; then
	echo "ok   srun --mpi=pmix -n 2 strata info: ranks 0 and 1 of 2"
else
	echo "FAIL strata info under srun"; grep -E 'comm|error' "$work/info" | head -4; fail=1
fi

run ref -- --steps 3 --grad-accum 2 || { echo "FAIL the one-rank run"; tail -3 "$work/ref.log"; exit 1; }
run z1 srun --mpi=pmix -n 2 -- --steps 3 --zero 1
same z1 ref "srun --mpi=pmix -n 2 --zero 1 = 1 rank --grad-accum 2"
run z3 srun --mpi=pmix -n 2 -- --steps 3 --zero 3 --offload-params nvme --prefetch 1
same z3 ref "srun --mpi=pmix -n 2 --zero 3, W on nvme = 1 rank --grad-accum 2"
if [ -d "$work/nvme/rank-1" ]; then
	echo "ok   rank 1's nvme files in nvme/rank-1"
else
	echo "FAIL no nvme/rank-1 under srun"; ls "$work/nvme"; fail=1
fi

# scancel: every task gets SIGTERM (what scancel and a job's time limit
# send first): every rank stops after the same step and saves, srun exits
# 130, and --resume auto goes on to where an uninterrupted run is. Nothing
# here depends on timing, so a loaded machine passes: the run is
# endless (--steps 100000) and stopped once its metrics show 3 steps, so
# the signal never races its end; `scancel -s TERM` signals without
# cancelling, so no KillWait deadline cuts a slow save short; the resumed
# run goes on only to 2 steps past the stop (the schedule is constant, so
# those steps are the uninterrupted run's, which is run to the same step).
# The `timeout`s only end a hung world.
name=strata-srun-test-$$
rm -rf "$work/st" "$work/st.jsonl"
args=("${common[@]}" --steps 100000 --lr-schedule constant --zero 1 --save "$work/st"
	--metrics "$work/st.jsonl" --resume auto)
timeout 600 srun -J "$name" --mpi=pmix -n 2 "$strata" train "${args[@]}" --log-every 1 \
	>"$work/st.log" 2>&1 &
job=$!
while kill -0 $job 2>/dev/null && [ "$(cat "$work/st.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do
	sleep 0.05
done
scancel -s TERM -n "$name"
wait $job
rc=$?
n=$(wc -l <"$work/st.jsonl")
if [ "$rc" != 130 ] || [ "$n" -lt 3 ] || [ ! -e "$work/st/latest" ] ||
	ls -d "$work/st"/*.tmp.* >/dev/null 2>&1; then
	echo "FAIL scancel: srun exit $rc after $n steps, want 130 after 3 or more and a whole checkpoint"
	ls "$work/st"; tail -3 "$work/st.log"; fail=1
else
	saved=$(readlink "$work/st/latest")
	[ "$saved" = "$(printf 'step-%06d' "$n")" ] ||
		{ echo "FAIL scancel: latest is $saved after $n steps"; fail=1; }
	end=$((n + 2))
	timeout 600 srun --mpi=pmix -n 2 "$strata" train "${args[@]}" --steps $end >"$work/st-2.log" 2>&1 ||
		{ echo "FAIL scancel: --resume auto"; tail -5 "$work/st-2.log"; fail=1; }
	echo "ok   scancel: every rank stopped after step $n, saved $saved (srun exit $rc)"
	run ref-end -- --steps $end --lr-schedule constant --grad-accum 2 ||
		{ echo "FAIL the one-rank run"; exit 1; }
	same st ref-end "stopped by scancel, --resume auto under srun = uninterrupted 1 rank"
fi

# srun with no MPI plugin: refused by every task
run none srun --mpi=none -n 2 -- --steps 3 --zero 1
rc=$?
n=$(grep -c 'srun started 2 tasks with no MPI plugin.*srun --mpi=pmix' "$work/none.log")
if [ $rc = 2 ] && [ "$n" = 2 ] && [ ! -e "$work/none.jsonl" ]; then
	echo "ok   srun --mpi=none -n 2: exit 2, each task: $(grep -m1 -o 'comm: srun.*world' "$work/none.log")"
else
	echo "FAIL srun --mpi=none -n 2: exit $rc, $n lines, want 2 and 2"; tail -4 "$work/none.log"; fail=1
fi
exit $fail
