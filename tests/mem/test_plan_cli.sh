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

# Activation checkpoints: a T=8192 model whose checkpoints do not fit 25M
# of vram with the rest. Forced into vram: refused; auto: on the host, and
# the plan says so (table and JSON); a bad choice: exit 2.
L="--model layers=3,dim=32,heads=1,vocab=256,ctx=8192 --batch 1 --seq 8192 --gpu-mem 25M"
check act-vram-refused 2 "$plan" plan $L --offload-activations vram
expect_err act-vram-refused "vram budget"
expect_err act-vram-refused "it fits with the activation checkpoints on the host"
check act-auto 0 "$plan" plan $L
expect_out act-auto "activations on the host: 2 of 4 go there and back"
check act-host-json 0 "$plan" plan $L --offload-activations host --json
python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
a = p['activations']
assert a['home'] == 'host' and a['offloaded'] == 2 and a['slots'] == 2, a
assert a['copy_bytes_per_micro_batch'] == 2 * 8192 * 32 * 4, a
assert a['vram_bytes'] == p['pools']['act_bytes'], a
" "$work/out" || { echo "FAIL act-host-json"; fail=1; }
check act-vram-fits 0 "$plan" plan $M
expect_out act-vram-fits "activations in vram"
check act-bad 2 "$plan" plan $M --offload-activations nvme
expect_err act-bad "expected auto, vram or host"
# --recompute: which blocks keep their forward (docs/plan.md). none's vram
# minimum counts every saved forward and is exact; auto keeps what fits.
check bad-recompute 2 "$plan" plan $M --recompute some
expect_err bad-recompute "--recompute some: expected auto, all or none"
check recompute-none 0 "$plan" plan $M --gpu-mem 64M --recompute none --json
read -r rmin nkeep < <(python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
print(p['tiers']['vram']['min_bytes'], len(p['recompute']['keep']))" "$work/out")
if [ "${nkeep:-}" != 4 ]; then
	echo "FAIL recompute-none: keeps ${nkeep:-?} units, want the 4 blocks"; fail=1
else
	check recompute-none-at-min 0 "$plan" plan $M --gpu-mem "$rmin" --recompute none
	expect_out recompute-none-at-min "units 1-4 keep their forward"
	check recompute-none-below 2 "$plan" plan $M --gpu-mem $((rmin - 4096)) --recompute none
	expect_err recompute-none-below "--recompute none keeps the forward of 4 units"
	check recompute-auto-below 0 "$plan" plan $M --gpu-mem $((rmin - 4096)) --recompute auto
	# auto places W first (in vram here, where none streams it), then keeps what fits
	expect_out recompute-auto-below "units 3-4 keep their forward"
fi
check recompute-all 0 "$plan" plan $M --gpu-mem 64M --recompute all
expect_out recompute-all "none (recompute all"

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
