#!/usr/bin/env bash
# What the nvme tier reads back is what went in (docs/reliability.md): a run
# whose optimizer state lives on nvme has pages of its swap file overwritten
# while it runs, from outside, through /proc/PID/fd (as a bad drive or a
# stray process would). The run must stop with exit 1 and one line naming
# the unit, the state, the file, the offset and both checksums, and its last
# checkpoint must still verify. With --verify-reads off the same damage goes
# unnoticed (exit 0): the check is what caught it.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-sums-test.XXXXXX")
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
fail=0
pid=
mkdir "$work/swap"

run() { # name, extra flags...: a long run with P, M, V on nvme, in the background
	local name=$1
	shift
	"$strata" train --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 4 \
		--steps 400 --offload-optim nvme --nvme "$work/swap" --save "$work/$name" \
		--save-every 5 --keep 2 --metrics "$work/$name.jsonl" --log-every 1000 "$@" \
		>"$work/$name.out" 2>"$work/$name.err" &
	pid=$!
}

corrupt() { # name: wait for 7 steps, then overwrite pages of the swap file
	local name=$1 fd= f n
	while [ "$(wc -l <"$work/$name.jsonl" 2>/dev/null || echo 0)" -lt 7 ] &&
		kill -0 $pid 2>/dev/null; do
		sleep 0.02
	done
	for f in /proc/$pid/fd/*; do
		case $(readlink "$f") in "$work/swap/"*) fd=$f ;; esac # named or O_TMPFILE
	done
	[ -n "$fd" ] || { echo "FAIL $name: no swap file open in /proc/$pid/fd"; fail=1; return; }
	# a page of 0xFF every 256 KiB of the first 4 MiB: P, M and V of every
	# unit are hit (G too: G is rewritten before it is read, unless the
	# pages land between its write in the backward and its read in the
	# update, and then G's read is the one that stops the run)
	for n in $(seq 1 16); do
		head -c 4096 /dev/zero | tr '\0' '\377' |
			dd of="$fd" bs=4096 seek=$((n * 64 + 1)) count=1 conv=notrunc status=none
	done
}

run checked
corrupt checked
wait $pid
rc=$?
pid=
if [ $rc != 1 ]; then
	echo "FAIL checked: exit $rc, want 1"; tail -3 "$work/checked.err"; fail=1
elif [ "$(wc -l <"$work/checked.err")" != 1 ]; then
	echo "FAIL checked: stderr is not one line:"; cat "$work/checked.err"; fail=1
elif ! grep -qE 'unit [0-9]+ \(.*\) state [GPMV]: .*swap.* \(unlinked\) offset [0-9]+: .*XXH3 [0-9a-f]{16}, written [0-9a-f]{16}' \
	"$work/checked.err"; then
	echo "FAIL checked: the line lacks unit, state, file, offset or sums:"; cat "$work/checked.err"; fail=1
else
	echo "ok   checked: $(cat "$work/checked.err")"
fi
# the run stopped early, and its last checkpoint is whole
steps=$(wc -l <"$work/checked.jsonl")
[ "$steps" -lt 400 ] || { echo "FAIL checked: ran all 400 steps"; fail=1; }
if "$strata" info --ckpt "$work/checked" --verify >"$work/info.out" 2>&1; then
	echo "ok   the last checkpoint verifies ($(grep -m1 -o 'step-[0-9]*' "$work/info.out"))"
else
	echo "FAIL the last checkpoint does not verify"; tail -3 "$work/info.out"; fail=1
fi
[ -z "$(ls -A "$work/swap")" ] || { echo "FAIL swap files left behind"; ls -la "$work/swap"; fail=1; }

run unchecked --verify-reads off --steps 30
corrupt unchecked
wait $pid
rc=$?
pid=
# Unchecked, the damage gets through to the values: the run ends with
# exit 0, or (0xFF pages are NaNs) is stopped by the non-finite guards
# (docs/reliability.md#non-finite-values: a save of a NaN P refused, or
# --max-skipped; or AdamW's own scan of a G damaged after the norm was
# taken), never by the checksum.
if [ $rc = 0 ]; then
	echo "ok   unchecked: the same damage is not noticed (exit 0)"
elif [ $rc = 1 ] && ! grep -q XXH3 "$work/unchecked.err" &&
	grep -qE 'is not finite is not saved|steps in a row had a non-finite gradient|gradient elements NaN or Inf' \
		"$work/unchecked.err"; then
	echo "ok   unchecked: not noticed by the checksum; the values: $(cat "$work/unchecked.err")"
else
	echo "FAIL unchecked: exit $rc, want 0 or a non-finite stop"; tail -3 "$work/unchecked.err"; fail=1
fi
exit $fail
