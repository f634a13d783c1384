#!/usr/bin/env bash
# nvme-bench as a user meets it: help, bad input (one line, exit 2, nothing
# left behind), a small real run with JSON, and Ctrl-C cleaning up.
set -u
bench=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/nvme-bench-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
check() { # name, expected rc, command...
	local name=$1 want=$2 rc lines
	shift 2
	"$@" >"$work/out" 2>"$work/err"
	rc=$?
	if [ "$rc" != "$want" ]; then
		echo "FAIL $name: exit $rc, want $want"; cat "$work/err"; fail=1; return
	fi
	if [ "$want" = 2 ]; then
		lines=$(wc -l <"$work/err")
		if [ "$lines" != 1 ]; then
			echo "FAIL $name: $lines lines on stderr, want 1"; cat "$work/err"; fail=1; return
		fi
	fi
	echo "ok   $name: $(head -c 120 "$work/err" | head -1)"
}
mkdir "$work/d"
check help 0 "$bench" --help
grep -q -- '--aio-block' "$work/out" || { echo "FAIL help text"; fail=1; }
check no-dir 2 "$bench"
check missing-dir 2 "$bench" --dir "$work/nope"
check file-not-dir 2 "$bench" --dir "$bench"
check bad-size 2 "$bench" --dir "$work/d" --size 12Q
check zero-size 2 "$bench" --dir "$work/d" --size 0
check zero-qd 2 "$bench" --dir "$work/d" --qd 0
check bad-qd 2 "$bench" --dir "$work/d" --qd 1,x
check bad-bs 2 "$bench" --dir "$work/d" --bs 3000
check bad-rw 2 "$bench" --dir "$work/d" --rw readwrite
check bad-time 2 "$bench" --dir "$work/d" --time -1
check no-space 2 "$bench" --dir "$work/d" --size 900T
check unknown-flag 2 "$bench" --dir "$work/d" --frobnicate
check stray-arg 2 "$bench" --dir "$work/d" extra
check json-missing-dir 2 "$bench" --dir "$work/d" --size 16M --json "$work/nope/r.json"
[ -z "$(ls -A "$work/d")" ] || { echo "FAIL bad input left files"; ls -la "$work/d"; fail=1; }

# A small real run: two block sizes, two depths, both directions, JSON.
check small-run 0 "$bench" --dir "$work/d" --size 16M --bs 64K,256K --qd 1,4 \
	--time 0.2 --json "$work/r.json"
python3 - "$work/r.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
pts = r["points"]
assert len(pts) == 8, len(pts)
for p in pts:
    for k in ("rw", "bs", "qd", "gbps", "iops", "p50_us", "p99_us"):
        assert k in p, k
    assert p["rw"] in ("read", "write") and p["gbps"] > 0 and p["iops"] > 0
    assert p["bs"] in (65536, 262144) and p["qd"] in (1, 4)
    assert 0 < p["p50_us"] <= p["p99_us"]
    # GB/s and IOPS must agree: bytes per second = IOPS x block size
    assert abs(p["gbps"] * 1e9 - p["iops"] * p["bs"]) <= 0.02 * p["gbps"] * 1e9, p
b = r["best"]
for k in ("read_gbps", "write_gbps", "bs", "qd"):
    assert k in b, k
assert b["read_gbps"] == max(p["gbps"] for p in pts if p["rw"] == "read") or \
       b["read_gbps"] >= 0.95 * max(p["gbps"] for p in pts if p["rw"] == "read")
print("ok   json keys and values")
PY
grep -q '^recommendation: --aio-block' "$work/out" || { echo "FAIL no recommendation"; fail=1; }
# a JSON that cannot be written at the end: exit 1, the file and why
check json-unwritable 1 "$bench" --dir "$work/d" --size 16M --bs 64K --qd 1 --rw read \
	--time 0.1 --json /proc/nvme-bench.json
grep -q '^nvme-bench: /proc/nvme-bench.json: cannot write (' "$work/err" ||
	{ echo "FAIL json-unwritable: no line naming the file"; cat "$work/err"; fail=1; }
[ -z "$(ls -A "$work/d")" ] || { echo "FAIL run left files"; ls -la "$work/d"; fail=1; }

# Ctrl-C mid-run: exit 130, no files, no JSON.
"$bench" --dir "$work/d" --size 64M --bs 64K --qd 1 --time 30 --json "$work/int.json" \
	>/dev/null 2>"$work/err" &
pid=$!
# Not before it has started: bash starts a background job with SIGINT
# ignored, and only the bench's own handler (set before it prints its first
# line) undoes that, so a signal sent earlier (a slow start on a busy
# machine) would be lost.
for i in $(seq 200); do
	grep -q 'points of' "$work/err" 2>/dev/null && break
	sleep 0.1
done
sleep 0.5
kill -INT $pid
wait $pid
rc=$?
[ $rc = 130 ] || { echo "FAIL interrupt: exit $rc"; cat "$work/err"; fail=1; }
[ -z "$(ls -A "$work/d")" ] || { echo "FAIL interrupt left files"; ls -la "$work/d"; fail=1; }
[ ! -e "$work/int.json" ] || { echo "FAIL interrupt wrote JSON"; fail=1; }
[ $fail = 0 ] && echo "ok   interrupt"
exit $fail
