#!/usr/bin/env bash
# strata train and the planner's rates (docs/plan.md, "Measured rates"):
# --rates-refresh writes the rates a run measured (a file --rates reads
# back), --rates reads one, --grad-accum auto takes what strata plan
# --grad-accum auto says; none of it changes a number of the run.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-rates-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 4"
N="--nvme $work --offload-params nvme --offload-optim nvme --gpu-mem 64M --host-mem 64M"
data=$work/data.txt
. "$(dirname "$0")/check.sh"
text "$data" 5 every unit streams from the disk while the planner predicts the step

check refresh 0 "$strata" train $M $N --data "$data" --steps 5 --rates-refresh "$work/r.json" \
	--metrics "$work/m1.jsonl" --trace "$work/t.json"
grep -q "rates from steps 2-4 written to $work/r.json" "$work/out" ||
	{ echo "FAIL refresh: no line saying what it wrote"; fail=1; }
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
assert f['strata_rates'] == 1, f
for k in ('compute_flops', 'nvme_read_bps', 'nvme_write_bps', 'adam_bps'):
    assert f[k] > 0, (k, f)
# not measured by the run (the copy lanes' busy time is no rate) and the
# default in the run: null
assert f['copy_bps'] is None and f['net_bps'] is None, f
assert f['measured'] == {'source': 'strata train', 'steps': [2, 4]}, f['measured']
" "$work/r.json" || { echo "FAIL refresh: the file"; fail=1; }
ls "$work"/r.json.* >/dev/null 2>&1 && { echo "FAIL refresh: a temporary left behind"; fail=1; }
# its compute: the plan's FLOPs of steps 2-4 over their compute busy time
# (--metrics) less the plan's widens of each of the three steps
check refresh-plan 0 "$strata" plan $M $N --json
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
t = json.load(open(sys.argv[2]))['time']
busy = sum(json.loads(l)['busy_s']['compute'] for l in open(sys.argv[3]) if '\"step\"' in l
           and json.loads(l)['step'] in (2, 3, 4))
assert t['widen_s'] > 0, t
want = 3 * t['compute_flops'] / (busy - 3 * t['widen_s'])
assert abs(f['compute_flops'] / want - 1) < 1e-3, (f['compute_flops'], want, busy, t)
" "$work/r.json" "$work/out" "$work/m1.jsonl" || { echo "FAIL refresh: its compute"; fail=1; }

# --rates reads it back: the plan says so, and the run's numbers are the same
check rates 0 "$strata" train $M $N --data "$data" --steps 5 --rates "$work/r.json" \
	--metrics "$work/m2.jsonl"
grep -q "(file)" "$work/out" || { echo "FAIL rates: the plan does not say (file)"; fail=1; }
python3 -c "
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [(x['loss'], x['grad_norm']) for x in a] == [(x['loss'], x['grad_norm']) for x in b]
# the bytes of the run: what tools/fingerprint compares too (one step's
# count differed once between two runs in the full suite at load ~300,
# cause not traced; the losses and norms were equal)
tot = lambda r: {k: sum(x['bytes'][k] for x in r) for k in r[0]['bytes']}
assert tot(a) == tot(b), (tot(a), tot(b))
" "$work/m1.jsonl" "$work/m2.jsonl" || { echo "FAIL rates: numbers changed"; fail=1; }
# the cpu device's widen and sum rates (from --calibrate) are no lane's:
# --rates-refresh keeps the ones the run planned with
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
f['widen_bps'], f['sum_bps'] = 2e10, 1.5e10
json.dump(f, open(sys.argv[2], 'w'))
" "$work/r.json" "$work/rc.json"
check refresh-cores 0 "$strata" train $M $N --data "$data" --steps 5 --rates "$work/rc.json" \
	--rates-refresh "$work/r2.json"
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
assert f['widen_bps'] == 2e10 and f['sum_bps'] == 1.5e10, f
" "$work/r2.json" || { echo "FAIL refresh-cores: the cores' rates not kept"; fail=1; }
check plan-rates 0 "$strata" plan $M $N --rates "$work/r.json"
grep -q "GFLOP/s (file" "$work/out" || { echo "FAIL plan-rates: not the file's"; fail=1; }

# tools/plan-timeline: the plan's lanes against a step of that trace
tl="$(dirname "$0")/../../tools/plan-timeline"
check plan-json 0 "$strata" plan $M $N --rates "$work/r.json" --json
cp "$work/out" "$work/plan.json"
check timeline 0 python3 "$tl" --plan "$work/plan.json" --trace "$work/t.json" --out "$work/t.svg" --step 2
python3 - "$work/t.svg" "$work/t.json" "$work/plan.json" <<'PY' || { echo "FAIL timeline: the SVG"; fail=1; }
import json, sys, xml.dom.minidom
svg = xml.dom.minidom.parse(sys.argv[1])
texts = [t.firstChild.data for t in svg.getElementsByTagName('text') if t.firstChild]
assert 'predicted' in texts and 'measured' in texts, texts[:5]
plan = json.load(open(sys.argv[3]))
assert any('step %.3f s, bound by %s' % (plan['time']['step_s'], plan['time']['bound']) in t
           for t in texts), texts
# every compute span of step 2 of the trace is one rect with its title
ev = json.load(open(sys.argv[2]))['traceEvents']
tid = [e['tid'] for e in ev if e.get('name') == 'thread_name' and e['args']['name'] == 'compute'][0]
starts = sorted(e['ts'] for e in ev if e.get('ph') == 'X' and e['tid'] == tid and e['name'] == 'fwd embed')
a, b = starts[2], starts[3]
want = sum(1 for e in ev if e.get('ph') == 'X' and e['tid'] == tid and e['ts'] < b and e['ts'] + e['dur'] > a)
rects = [r for r in svg.getElementsByTagName('rect') if r.getAttribute('fill') == '#4c72b0'
         and r.getElementsByTagName('title')]
assert len(rects) == want, (len(rects), want)
PY
check timeline-bad-step 2 python3 "$tl" --plan "$work/plan.json" --trace "$work/t.json" --out "$work/u.svg" --step 99
check timeline-no-plan 2 python3 "$tl" --trace "$work/t.json" --out "$work/u.svg"
check timeline-bad-trace 2 python3 "$tl" --plan "$work/plan.json" --trace "$work/plan.json" --out "$work/u.svg"
[ -e "$work/u.svg" ] && { echo "FAIL timeline: wrote on bad input"; fail=1; }

check refresh-one-step 2 "$strata" train $M --data "$data" --steps 1 --rates-refresh "$work/x.json"
[ -e "$work/x.json" ] && { echo "FAIL refresh-one-step: wrote the file"; fail=1; }
echo '{"strata_rates": 1}' >"$work/bad.json"
check rates-bad 2 "$strata" train $M --data "$data" --steps 1 --rates "$work/bad.json"
check rates-missing 2 "$strata" train $M --data "$data" --steps 1 --rates "$work/none.json"
# a file far larger than any rates file (a trace given by mistake): bad input
head -c 17000000 /dev/zero | tr '\0' ' ' >"$work/big.json"
check rates-huge 2 "$strata" plan $M --rates "$work/big.json"
rm -f "$work/big.json"
check accum-bad 2 "$strata" train $M --data "$data" --steps 1 --grad-accum lots

# --grad-accum auto: what strata plan --grad-accum auto takes
P="$M $N --compute-gflops 100"
check plan-auto 0 "$strata" plan $P --grad-accum auto --json
want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grad_accum'])" "$work/out")
[ "$want" -gt 1 ] || { echo "FAIL plan-auto: took $want, want more than 1 here"; fail=1; }
echo "{\"strata_rates\": 1, \"compute_flops\": 1e11, \"copy_bps\": null, \"nvme_read_bps\": null,
  \"nvme_write_bps\": null, \"adam_bps\": null, \"net_bps\": null}" >"$work/c.json"
check train-auto 0 "$strata" train $M $N --data "$data" --steps 1 --rates "$work/c.json" \
	--grad-accum auto
grep -q "^--grad-accum auto: $want " "$work/out" ||
	{ echo "FAIL train-auto: not $want"; grep -- "--grad-accum" "$work/out"; fail=1; }
grep -q "accum $want |" "$work/out" || { echo "FAIL train-auto: the run is not at $want"; fail=1; }

[ $fail = 0 ] && echo "all rates checks passed"
exit $fail
