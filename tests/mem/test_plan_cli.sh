#!/usr/bin/env bash
# `strata plan` as a user meets it: the table, --verbose, --json that parses
# and agrees with the minimums it prints, refusals (one line, exit 2, naming
# the tier, budget and minimum), bad flags, --nvme directories that must
# exist, --nvme-bench rates. $1 is the strata binary.
set -u
plan=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-plan-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
M="--model layers=4,dim=64,heads=2,vocab=256,ctx=64 --batch 4 --seq 32"

quiet_refusals=1
. "$(dirname "$0")/../cli/check.sh"
expect_err() { # name, text expected in stderr
	if ! grep -qF -- "$2" "$work/err"; then
		echo "FAIL $1: stderr lacks '$2'"; cat "$work/err"; fail=1
	fi
}
expect_out() { # name, text expected in stdout
	if ! grep -qF -- "$2" "$work/out"; then
		echo "FAIL $1: stdout lacks '$2'"; fail=1
	fi
}

mkdir -p "$work/d1" "$work/d2"
touch "$work/file"

check help 0 "$plan" plan --help
expect_out help "--offload-params"
check defaults 0 "$plan" plan
expect_out defaults "bound by"
check verbose 0 "$plan" plan $M --verbose
expect_out verbose "embed"
expect_out verbose "head"

check bad-flag 2 "$plan" plan --frobnicate
check bad-size 2 "$plan" plan --gpu-mem lots
expect_err bad-size "--gpu-mem lots"
check bad-offload 2 "$plan" plan --offload-params cloud
check bad-offload-optim 2 "$plan" plan --offload-optim none
check bad-model 2 "$plan" plan --model layers=2,dim=63,heads=2,vocab=256,ctx=64
check long-seq 2 "$plan" plan $M --seq 65
expect_err long-seq "context of 64"
check bad-prefetch 2 "$plan" plan $M --prefetch 7
check nvme-missing 2 "$plan" plan $M --nvme "$work/nope"
check nvme-not-dir 2 "$plan" plan $M --nvme "$work/file"
check nvme-second-missing 2 "$plan" plan $M --nvme "$work/d1,$work/nope"
check nvme-empty 2 "$plan" plan $M --nvme "$work/d1,"
check nvme-mem-alone 2 "$plan" plan $M --nvme-mem 1G
check forced-nvme-no-dir 2 "$plan" plan $M --offload-params nvme
expect_err forced-nvme-no-dir "needs --nvme"
check two-dirs 0 "$plan" plan $M --nvme "$work/d1,$work/d2" --offload-optim nvme
if [ -n "$(find "$work/d1" "$work/d2" -mindepth 1)" ]; then
	echo "FAIL two-dirs: plan wrote into the nvme directories"; fail=1
fi

# The minimum it prints is exact: accepted at the minimum, refused 4 KiB
# below with the tier, the budget and the minimum in the one line.
check json 0 "$plan" plan $M --gpu-mem 64M --host-mem 64M --nvme "$work/d1" --nvme-mem 1G --json
cp "$work/out" "$work/plan.json"
read -r vmin hmin nmin < <(python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
t = p['tiers']
print(t['vram']['min_bytes'], t['host']['min_bytes'], t['nvme']['min_bytes'])" "$work/plan.json")
if [ -z "${vmin:-}" ]; then
	echo "FAIL json: does not parse"; fail=1
else
	echo "     minimums: vram $vmin host $hmin nvme $nmin"
	check vram-at-min 0 "$plan" plan $M --gpu-mem "$vmin" --host-mem 64M --nvme "$work/d1" --nvme-mem 1G
	check vram-below 2 "$plan" plan $M --gpu-mem $((vmin - 4096)) --host-mem 64M --nvme "$work/d1" --nvme-mem 1G
	expect_err vram-below "vram budget"
	expect_err vram-below "($((vmin - 4096)) B)"
	expect_err vram-below "minimum of"
	expect_err vram-below "($vmin B)"
	check host-at-min 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hmin" --nvme "$work/d1" --nvme-mem 1G
	check host-below 2 "$plan" plan $M --gpu-mem 64M --host-mem $((hmin - 4096)) --nvme "$work/d1" --nvme-mem 1G
	expect_err host-below "host budget"
	expect_err host-below "($hmin B)"
	check nvme-forced 0 "$plan" plan $M --offload-params nvme --offload-optim nvme --nvme "$work/d1" --json
	nmin=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tiers']['nvme']['min_bytes'])" "$work/out")
	check nvme-at-min 0 "$plan" plan $M --offload-params nvme --offload-optim nvme --nvme "$work/d1" --nvme-mem "$nmin"
	check nvme-below 2 "$plan" plan $M --offload-params nvme --offload-optim nvme --nvme "$work/d1" --nvme-mem $((nmin - 4096))
	expect_err nvme-below "nvme budget"
	expect_err nvme-below "($nmin B)"
fi

# A split placement: host for W in vram, the optimizer on nvme, and half
# the optimizer state. The table says it by unit; --json carries split and
# each cell's unit ranges, which agree with the per-unit rows; the nvme
# minimum is what the split leaves on nvme, exact at the CLI too.
check split-row 0 "$plan" plan $M --gpu-mem 64M --host-mem 64M --nvme "$work/d1" --offload-optim nvme --json
hsplit=$(python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
state = sum(u[s]['bytes'] for u in p['units'] for s in 'GPMV')
print(p['tiers']['host']['total_bytes'] + state // 2)" "$work/out")
check split 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hsplit" --nvme "$work/d1"
expect_out split "by unit (the split placement)"
check split-json 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hsplit" --nvme "$work/d1" --json
if ! nsplit=$(python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
assert p['split'] is True
def ranges(us):
    out, i = [], 0
    while i < len(us):
        j = i
        while j + 1 < len(us) and us[j + 1] == us[j] + 1:
            j += 1
        out.append(str(us[i]) if i == j else '%d-%d' % (us[i], us[j]))
        i = j + 1
    return ', '.join(out)
for s in 'WGPMV':
    for t in ('vram', 'host', 'nvme'):
        us = [u['unit'] for u in p['units'] if u[s]['tier'] == t]
        cell = p['placement'][s][t]
        assert cell['units'] == len(us) and cell['unit_ranges'] == ranges(us), (s, t, cell)
host = [u['unit'] for u in p['units'] if u['G']['tier'] == 'host']
assert 0 < len(host) < len(p['units']), host
assert p['tiers']['nvme']['min_bytes'] == p['tiers']['nvme']['total_bytes']
print(p['tiers']['nvme']['min_bytes'])" "$work/out"); then
	echo "FAIL split-json: split, unit_ranges or the nvme minimum"; fail=1
else
	check split-nvme-at-min 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hsplit" --nvme "$work/d1" --nvme-mem "$nsplit"
	check split-nvme-below 2 "$plan" plan $M --gpu-mem 64M --host-mem "$hsplit" --nvme "$work/d1" --nvme-mem $((nsplit - 4096))
	expect_err split-nvme-below "($nsplit B)"
fi

# --nvme-bench: the rates come from the file; a bad file is refused.
cat >"$work/bench.json" <<'EOF'
{ "points": [], "best": { "read_gbps": 3.25, "write_gbps": 2.5, "bs": 1048576, "qd": 32 } }
EOF
check bench 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --nvme-bench "$work/bench.json" --json
python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
r, t, tr = p['rates'], p['time'], p['traffic']
assert r['nvme_read_bps'] == 3.25e9 and r['nvme_write_bps'] == 2.5e9, r
want = tr['nvme_read_bytes'] / 3.25e9 + tr['nvme_write_bytes'] / 2.5e9
assert abs(t['nvme_s'] - want) <= 1e-9 * want, (t, want)
assert t['step_s'] == max(t['compute_s'], t['copy_s'], t['nvme_s'], t['adam_s'])
" "$work/out" || { echo "FAIL bench: rates not used"; fail=1; }
echo '{ "points": [] }' >"$work/bad.json"
check bench-bad 2 "$plan" plan $M --nvme-bench "$work/bad.json"
check bench-missing 2 "$plan" plan $M --nvme-bench "$work/none.json"
check rates 0 "$plan" plan $M --compute-gflops 1000 --adam-gbps 0.001 --copy-gbps 16
expect_out rates "bound by adam"
check bad-rate 2 "$plan" plan $M --compute-gflops -1

exit $fail
