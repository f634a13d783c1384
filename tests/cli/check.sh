# Sourced by the CLI tests (tests/cli, tests/mem, tests/ckpt): check NAME RC
# COMMAND... (and, below, text FILE SEED WORDS... for a training text, and
# need_torch for the tests that use PyTorch)
# runs COMMAND with stdout and stderr in $work/out and $work/err, and
# passes when it exits RC; a refusal (RC 2) must also be one line on
# stderr, and with quiet_refusals=1 nothing on stdout (strata train prints
# its plan before it reads a --resume checkpoint, so test_cli.sh leaves it
# unset). Prints "ok   NAME <first stderr line>", or "FAIL ..." and sets
# fail=1. Needs $work and $fail.
check() {
	local name=$1 want=$2 rc
	shift 2
	"$@" >"$work/out" 2>"$work/err"
	rc=$?
	if [ "$rc" != "$want" ]; then
		echo "FAIL $name: exit $rc, want $want"; cat "$work/err" "$work/out" | tail -5; fail=1; return 1
	fi
	if [ "$want" = 2 ] && [ "$(wc -l <"$work/err")" != 1 ]; then
		echo "FAIL $name: stderr is not one line"; cat "$work/err"; fail=1; return 1
	fi
	if [ "$want" = 2 ] && [ "${quiet_refusals:-0}" = 1 ] && [ -s "$work/out" ]; then
		echo "FAIL $name: refused but wrote to stdout"; head -3 "$work/out"; fail=1; return 1
	fi
	echo "ok   $name $(head -1 "$work/err")"
}

# text FILE SEED WORDS...: 4000 of WORDS drawn at random (seeded) into FILE,
# the training text of a test.
text() {
	local file=$1 seed=$2
	shift 2
	python3 - "$seed" "$@" >"$file" <<'PY'
import random, sys
random.seed(int(sys.argv[1]))
words = sys.argv[2:]
print(' '.join(random.choice(words) for _ in range(4000)))
PY
}

# need_torch: the first python3 with PyTorch (on PATH, else Debian's
# /usr/bin/python3) is python3 for the rest of the test; without one the
# test is skipped (exit 77), saying so.
need_torch() {
	local p
	py=
	for p in python3 /usr/bin/python3; do
		"$p" -c "import torch" 2>/dev/null && { py=$p; break; }
	done
	[ -n "$py" ] || { echo "SKIP: python3-torch is missing"; exit 77; }
	python3() { "$py" "$@"; }
}
