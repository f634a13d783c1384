# shellcheck shell=bash disable=SC2034,SC2154 # sourced: the caller owns fail, strata, work, common
# Sourced by the tests that train one model under several launchers, rank
# counts or placements and compare the runs bit for bit
# (tests/comm/test_multinode.sh, tests/comm/test_srun.sh,
# tests/zero/test_zero.sh). Needs $strata, $work, $fail and the array
# common (the arguments every run shares).

# train_run TAG LAUNCH... -- ARGS...: strata train "${common[@]}" ARGS under
# LAUNCH (nothing: one rank in this shell; a launcher: killed after 120 s,
# so that a hung world ends the test) into $work/TAG.{jsonl,log} and the
# checkpoint $work/TAG/. Returns strata's exit status.
train_run() {
	local tag=$1 launch=()
	shift
	while [ "$1" != -- ]; do launch+=("$1"); shift; done
	shift
	[ ${#launch[@]} = 0 ] || launch=(timeout 120 "${launch[@]}")
	rm -rf "${work:?}/$tag" "$work/$tag.jsonl"
	"${launch[@]}" "$strata" train "${common[@]}" --save "$work/$tag" \
		--metrics "$work/$tag.jsonl" "$@" >"$work/$tag.log" 2>&1
}

# ranks_run TAG NP LAUNCH... -- ARGS...: train_run alone when NP is 1, else
# under LAUNCH (which must start NP ranks)
ranks_run() {
	local tag=$1 np=$2
	shift 2
	if [ "$np" = 1 ]; then
		while [ "$1" != -- ]; do shift; done
	fi
	train_run "$tag" "$@"
}

# numbers TAG: what must not change between runs: the metrics but for the
# throughput, and the checkpoint's bytes
numbers() {
	sed 's/,"tokens_per_s".*//' "$work/$1.jsonl"
	(cd "$work/$1/latest" && sha256sum model.safetensors optimizer.safetensors)
}

# same TAG REF WHAT: TAG's numbers are REF's ("ok   WHAT"), or "FAIL ..."
# and fail=1
same() {
	if [ ! -s "$work/$1.jsonl" ] || [ ! -d "$work/$1/latest" ]; then
		echo "FAIL $3: no metrics or checkpoint"; tail -5 "$work/$1.log"; fail=1; return
	fi
	if diff <(numbers "$2") <(numbers "$1") >"$work/diff" 2>&1; then
		echo "ok   $3"
	else
		echo "FAIL $3: differs from $2"; head -8 "$work/diff"; tail -3 "$work/$1.log"; fail=1
	fi
}
