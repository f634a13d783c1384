#!/usr/bin/env bash
# tools/trace-gaps: on a hand-made trace with known gaps it reports them
# to the microsecond, by phase and cause; on a real run's trace it finds
# the compute lane's gaps and names causes from the host lane; bad input
# exits 2 with one line.
#   $1 tools/trace-gaps   $2 strata
set -u
tg=$1 strata=$2
work=${ST_TEST_DIR:-/tmp}/trace-gaps.$$
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
fail=0

# One step (step 7), forward 0..20 us and backward 20..60 us of micro-batch
# 0. Compute spans 0-10, 15-30, 40-50; the last was queued at 35 us, so of
# the gap 30-40, 30-35 waited for the host and 35-40 on the device. Host waits: "W fetch" 12-14 inside the gap 10-15 (the rest,
# 10-12 and 14-15, is host work), "dW d2h" 30-33. cpu adam 50-55 (the gap
# 50-60 has no compute span after it: 50-55 adam, 55-60 host). On the
# comm lane, "dW all-to-all" at 33 us (3 after the compute span that ended
# at 30) and 52 us (2 after 50), and a "W gather" that --comm leaves out.
cat >"$work/hand.json" <<'JSON'
{"traceEvents":[
{"ph":"M","pid":1,"name":"thread_name","tid":1,"args":{"name":"compute"}},
{"ph":"M","pid":1,"name":"thread_name","tid":2,"args":{"name":"cpu adam"}},
{"ph":"M","pid":1,"name":"thread_name","tid":3,"args":{"name":"host"}},
{"ph":"M","pid":1,"name":"thread_name","tid":4,"args":{"name":"phase"}},
{"ph":"M","pid":1,"name":"thread_name","tid":5,"args":{"name":"comm"}},
{"ph":"X","pid":1,"name":"dW all-to-all","tid":5,"ts":33,"dur":2},
{"ph":"X","pid":1,"name":"dW all-to-all","tid":5,"ts":52,"dur":1},
{"ph":"X","pid":1,"name":"W gather","tid":5,"ts":56,"dur":1},
{"ph":"X","pid":1,"name":"fwd","tid":1,"ts":0,"dur":10,"args":{"queued_us":0}},
{"ph":"X","pid":1,"name":"bwd","tid":1,"ts":15,"dur":15,"args":{"queued_us":15}},
{"ph":"X","pid":1,"name":"bwd","tid":1,"ts":40,"dur":10,"args":{"queued_us":35}},
{"ph":"X","pid":1,"name":"W fetch","tid":3,"ts":12,"dur":2},
{"ph":"X","pid":1,"name":"dW d2h","tid":3,"ts":30,"dur":3},
{"ph":"X","pid":1,"name":"adam","tid":2,"ts":50,"dur":5},
{"ph":"X","pid":1,"name":"forward","tid":4,"ts":0,"dur":20,"args":{"step":7,"mb":0}},
{"ph":"X","pid":1,"name":"backward","tid":4,"ts":20,"dur":40,"args":{"step":7,"mb":0}}
],"displayTimeUnit":"ms"}
JSON
want='step 7: 0.060 ms, compute idle 0.025 ms in 3 gaps, inside micro-batches 0.025 ms
  backward   host                  0.007 ms     2 gaps
  backward   adam                  0.005 ms     1 gaps
  backward   device                0.005 ms     1 gaps
  backward   dW d2h                0.003 ms     1 gaps
  forward    host                  0.003 ms     1 gaps
  forward    W fetch               0.002 ms     1 gaps
median: no step after the first 1'
got=$("$tg" "$work/hand.json" 2>&1)
if [ "$got" = "$want" ]; then
	echo "ok   trace-gaps: the hand-made trace's gaps, by phase and cause"
else
	echo "FAIL trace-gaps hand-made: got"; echo "$got"; echo "want"; echo "$want"; fail=1
fi
# the same in JSON, to the microsecond: 10-15 is 2 us W fetch + 3 us host
python3 - "$tg" "$work/hand.json" <<'PY' || fail=1
import json, subprocess, sys
r = json.loads(subprocess.check_output([sys.argv[1], "--json", "--skip", "0", sys.argv[2]]))
s = r["steps"][0]
got = {(c["phase"], c["cause"]): round(c["us"], 6) for c in s["causes"]}
want = {("forward", "W fetch"): 2, ("forward", "host"): 3, ("backward", "host"): 7,
        ("backward", "dW d2h"): 3, ("backward", "device"): 5, ("backward", "adam"): 5}
assert got == want, got
assert s["idle_us"] == 25 and s["wall_us"] == 60 and r["median"]["idle_mb_us"] == 25, s
print("ok   trace-gaps --json: every cause to the microsecond")
PY
# --comm: the all-to-alls' starts after the compute span before each
python3 - "$tg" "$work/hand.json" <<'PY' || fail=1
import json, subprocess, sys
r = json.loads(subprocess.check_output([sys.argv[1], "--json", "--skip", "0", "--comm",
                                        "dW all-to-all", sys.argv[2]]))
assert r["comm"] == {"name": "dW all-to-all", "spans": 2, "gap_median_us": 2.5,
                     "gap_p90_us": 3}, r["comm"]
print("ok   trace-gaps --comm: each all-to-all's gap from the compute before it")
PY
got=$("$tg" --comm "" "$work/hand.json" 2>&1); rc=$?
[ $rc = 2 ] && [ "$got" = "trace-gaps: --comm needs a span name (see --help)" ] &&
	echo "ok   trace-gaps --comm without a name: exit 2" ||
	{ echo "FAIL trace-gaps --comm '': rc $rc: $got"; fail=1; }
# --min-us drops the gaps shorter than it (the 5 us one at 10-15)
got=$("$tg" --min-us 6 "$work/hand.json")
got=${got%%$'\n'*}
[ "$got" = "step 7: 0.060 ms, compute idle 0.020 ms in 2 gaps, inside micro-batches 0.020 ms" ] &&
	echo "ok   trace-gaps --min-us" || { echo "FAIL trace-gaps --min-us: $got"; fail=1; }

# A real run with the optimizer on the host and two micro-batches: every
# step has gaps, and their causes are the host lane's names or the fixed ones
d="$work/data.txt"
python3 -c "import random; random.seed(3); print(' '.join(random.choice(['the','strata','unit','tier','host']) for _ in range(4000)))" >"$d"
if "$strata" train --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --batch 2 --seq 32 \
	--steps 3 --grad-accum 2 --offload-optim host --offload-params host --nvme none \
	--data "$d" --trace "$work/t.json" >/dev/null 2>&1; then
	python3 - "$tg" "$work/t.json" <<'PY' || fail=1
import json, subprocess, sys
r = json.loads(subprocess.check_output([sys.argv[1], "--json", sys.argv[2]]))
ev = json.load(open(sys.argv[2]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
host = {e["name"] for e in ev if e["ph"] == "X" and names[e["tid"]] == "host"}
assert "dW d2h" in host and "tokens h2d" in host, host
assert [s["step"] for s in r["steps"]] == [0, 1, 2], r["steps"]
for s in r["steps"]:
    assert s["gaps"] > 0 and 0 < s["idle_us"] < s["wall_us"], s
    assert s["idle_mb_us"] <= s["idle_us"], s
    assert abs(sum(c["us"] for c in s["causes"]) - s["idle_us"]) < 1e-6, s
    for c in s["causes"]:
        assert c["cause"] in host | {"device", "adam", "host"}, c
        assert c["phase"] in ("forward", "backward", "norm", "update", "end", "between"), c
print("ok   trace-gaps on a run: %d steps, gaps found and named" % len(r["steps"]))
PY
else
	echo "FAIL the traced run"; fail=1
fi

check() { # name, command...: exit 2 and one line on stderr
	local name=$1 err rc
	shift
	err=$("$@" 2>&1 >/dev/null); rc=$?
	if [ $rc = 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ]; then
		echo "ok   $name: $err"
	else
		echo "FAIL $name: exit $rc: $err"; fail=1
	fi
}
echo '{"traceEvents":[]}' >"$work/empty.json"
echo 'not json' >"$work/bad.json"
check "no file" "$tg"
check "unknown flag" "$tg" --frobnicate "$work/hand.json"
check "bad --skip" "$tg" --skip x "$work/hand.json"
check "not JSON" "$tg" "$work/bad.json"
check "no lanes" "$tg" "$work/empty.json"
[ "$("$tg" --help | grep -c usage)" -ge 1 ] || { echo "FAIL --help"; fail=1; }
"$tg" "$work/nope.json" 2>/dev/null; [ $? = 1 ] && echo "ok   missing file: exit 1 (the file named)" ||
	{ echo "FAIL missing file"; fail=1; }
exit $fail
