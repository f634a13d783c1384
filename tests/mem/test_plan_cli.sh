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
# the update inside the backward names its own two phases and its one
# fill and drain; the update after keeps the backward and the update
check inbwd-text 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --update in-backward
expect_out inbwd-text "phases   to the last backward"
expect_out inbwd-text "+ the last backward with the update"
expect_out inbwd-text "once a step (none in a phase the disk binds)"
check inbwd-lf-text 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --update in-backward --grad-accum 2 --schedule layer-first
expect_out inbwd-lf-text "phases   forwards"
expect_out inbwd-lf-text "+ backwards with the update"
check after-text 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --update after
expect_out after-text "phases   backward"
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

# With that nvme budget, the host minimum is what the split needs to move
# enough off nvme (more than the uniform row takes): exact, and never above
# the budget that was just accepted.
if [ -n "${nsplit:-}" ]; then
	check split-hmin 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hsplit" --nvme "$work/d1" --nvme-mem "$nsplit" --json
	hmin=$(python3 -c "
import json, sys
print(json.load(open(sys.argv[1]))['tiers']['host']['min_bytes'])" "$work/out")
	if [ "$hmin" -gt "$hsplit" ]; then
		echo "FAIL split-hmin: host minimum $hmin above the accepted budget $hsplit"; fail=1
	fi
	check split-hmin-at 0 "$plan" plan $M --gpu-mem 64M --host-mem "$hmin" --nvme "$work/d1" --nvme-mem "$nsplit"
	check split-hmin-below 2 "$plan" plan $M --gpu-mem 64M --host-mem $((hmin - 4096)) --nvme "$work/d1" --nvme-mem "$nsplit"
	expect_err split-hmin-below "($hmin B)"
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

# --schedule (docs/plan.md, "Schedules"): layer-first's plan says so and
# reads W and G once a step: with everything on nvme at --grad-accum 4 its
# nvme bytes are batch-first's less 3 W fetch sequences and 3 G reads and
# writes; auto takes it there; a vram budget it cannot fit is refused
check bad-schedule 2 "$plan" plan $M --schedule sideways
expect_err bad-schedule "--schedule sideways: expected batch-first, layer-first or auto"
nv=(--nvme "$work/d1" --offload-params nvme --offload-optim nvme --grad-accum 4)
for s in batch-first layer-first auto; do
	check "schedule-$s" 0 "$plan" plan $M "${nv[@]}" --schedule $s --json
	cp "$work/out" "$work/sched-$s.json"
done
check schedule-lf-text 0 "$plan" plan $M "${nv[@]}" --schedule layer-first
expect_out schedule-lf-text "schedule        layer-first"
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
p = {s: json.load(open(f"{w}/sched-{s}.json")) for s in ("batch-first", "layer-first", "auto")}
assert p["batch-first"]["schedule"] == "batch-first" and p["layer-first"]["schedule"] == "layer-first"
assert p["auto"]["schedule"] == "layer-first", p["auto"]["schedule"]
tb, tl = p["batch-first"]["traffic"], p["layer-first"]["traffic"]
assert tl["nvme_read_bytes"] < tb["nvme_read_bytes"] and tl["nvme_write_bytes"] < tb["nvme_write_bytes"]
assert tl["d2h_bytes"] * 4 == tb["d2h_bytes"], (tl["d2h_bytes"], tb["d2h_bytes"])
print("ok   --schedule: layer-first's plan, fewer nvme bytes, a quarter of the dW copies; auto takes it")
PY
vmin=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tiers']['vram']['min_bytes'])" \
	"$work/sched-layer-first.json")
check schedule-lf-below 2 "$plan" plan $M "${nv[@]}" --schedule layer-first --gpu-mem $((vmin - 4096))
expect_err schedule-lf-below "--schedule layer-first holds the checkpoints"
check schedule-lf-at-min 0 "$plan" plan $M "${nv[@]}" --schedule layer-first --gpu-mem "$vmin"

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
# the update phase's nvme: its loads and stores at the same rates, but
# the P, M, V loads queued during the backward
b, u = t['phases']
assert (b['phase'], u['phase']) == ('backward', 'update'), t['phases']
pre = tr['update_prefetch_nvme_read_bytes']
assert 0 < pre < tr['update_nvme_read_bytes'], tr
# (and the next step's first forward's W fetches from nvme, which run beside
# the sweep: none here, W lives in vram)
fwd = tr['update_fwd_nvme_read_bytes']
assert fwd == 0 and tr['update_fwd_h2d_bytes'] == 0, tr
want = (tr['update_nvme_read_bytes'] - pre + fwd) / 3.25e9 + tr['update_nvme_write_bytes'] / 2.5e9
assert want > 0 and abs(u['lanes']['nvme_s'] - want) <= 1e-9 * want, (u, want)
# the cpu device: compute, AdamW and the copies share the cores (AdamW in
# the update), and the compute lane holds the widens and the nvme sums;
# the two phases add, plus the fill and drain
assert t['host_compute'] is True, t
assert t['widen_s'] > 0 and t['sums_s'] > 0, t
assert abs(t['sums_s'] - (tr['nvme_read_bytes'] + tr['nvme_write_bytes']) / p['rates']['copy_bps']) \
    <= 1e-12 * t['sums_s'], t
for k in ('adam_s', 'copy_s'):
    assert u['lanes'][k] == 0 and b['lanes'][k] == 0, t['phases']
cores = b['lanes']['compute_s'] + u['lanes']['compute_s']
assert abs(cores - t['compute_s'] - t['adam_s'] - t['copy_s']) <= 1e-12 * cores, (cores, t)
assert abs(b['lanes']['nvme_s'] + u['lanes']['nvme_s'] - t['nvme_s']) <= 1e-12 * t['nvme_s'], t
others = 0
for ph in (b, u):
    lanes = list(ph['lanes'].values())
    assert ph['s'] == max(lanes), ph
    others += sum(lanes) - max(lanes)
assert abs(t['serial_s'] - 2 * others / p['model']['units']) <= 1e-12, t
assert abs(t['step_s'] - b['s'] - u['s'] - t['serial_s']) <= 1e-12 * t['step_s'], t
" "$work/out" || { echo "FAIL bench: rates not used"; fail=1; }
echo '{ "points": [] }' >"$work/bad.json"
check bench-bad 2 "$plan" plan $M --nvme-bench "$work/bad.json"
check bench-missing 2 "$plan" plan $M --nvme-bench "$work/none.json"
check rates 0 "$plan" plan $M --compute-gflops 1000 --adam-gbps 0.001 --copy-gbps 16
expect_out rates "bound by adam"
check bad-rate 2 "$plan" plan $M --compute-gflops -1
# the cpu device's widens and sums: at the copy rate unless given
check cores-default 0 "$plan" plan $M --nvme "$work" --offload-params nvme --copy-gbps 4
expect_out cores-default "at 4.00 GB/s (the copy rate) and the nvme sums"
check cores-flags 0 "$plan" plan $M --nvme "$work" --offload-params nvme --widen-gbps 24 --sum-gbps 16
expect_out cores-flags "at 24.00 GB/s (flag) and the nvme sums"
expect_out cores-flags "at 16.00 GB/s (flag) on the cores"
check bad-widen 2 "$plan" plan $M --widen-gbps 0

# --calibrate: this machine's rates into a file (atomically); --rates reads it.
# (the nvme sweep over 32 MiB of files, not the 2 GiB of a real calibration)
STRATA_CALIBRATE_NVME_BYTES=32M check calibrate 0 "$plan" plan $M --nvme "$work/d1" \
	--calibrate "$work/rates.json"
expect_err calibrate "calibrate: compute"
expect_err calibrate "calibrate: wrote"
if [ -n "$(find "$work/d1" "$work" -maxdepth 1 -name '*.tmp*')" ] || \
   [ -n "$(find "$work/d1" -mindepth 1)" ]; then
	echo "FAIL calibrate: left files behind"; fail=1
fi
check rates-file 0 "$plan" plan $M --rates "$work/rates.json" --compute-gflops 7 --json
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
p = json.load(open(sys.argv[2]))
assert f['strata_rates'] == 1 and f['net_bps'] is None, f
for k in ('compute_flops', 'copy_bps', 'nvme_read_bps', 'nvme_write_bps', 'adam_bps'):
    assert f[k] > 0, (k, f)
assert f['measured']['batch'] == 4 and f['measured']['seq'] == 32, f['measured']
n = f['measured']['nvme']
assert n['bytes'] <= 32 << 20 and n['sweep_read_bytes'] > 0 and n['sweep_busy_s'] > 0, n
# the rates give the sweep's busy time back: read / r + write / w
back = n['sweep_read_bytes'] / f['nvme_read_bps'] + n['sweep_write_bytes'] / f['nvme_write_bps']
assert abs(back - n['sweep_busy_s']) <= 1e-9 * back, (back, n)
r = p['rates']
assert r['compute_flops'] == 7e9 and r['source']['compute_flops'] == 'flag', r
for k in ('copy_bps', 'nvme_read_bps', 'nvme_write_bps', 'adam_bps', 'widen_bps', 'sum_bps'):
    assert r[k] == f[k] and r['source'][k] == 'file', (k, r)
assert r['source']['net_bps'] == 'default', r
# the cpu device's passes on the cores, measured: the rates give their times back
c = f['measured']['cores']
assert abs(c['widen_elems'] * 6 / f['widen_bps'] - c['widen_s']) <= 1e-9 * c['widen_s'], (c, f)
assert abs(c['sum_bytes'] / f['sum_bps'] - c['sum_s']) <= 1e-9 * c['sum_s'], (c, f)
assert abs(p['time']['widen_s'] * f['widen_bps'] - p['traffic']['widen_bytes']) <= \
    1e-9 * p['traffic']['widen_bytes'], (p['time'], f)
h = p['hide']
assert 1 <= h['auto_accum'] <= h['accum_max'] == 64, h
" "$work/rates.json" "$work/out" || { echo "FAIL rates-file: the file's rates not used"; fail=1; }
check calibrate-bench 0 "$plan" plan $M --nvme-bench "$work/bench.json" --calibrate "$work/rates2.json"
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))
assert f['nvme_read_bps'] == 3.25e9 and f['nvme_write_bps'] == 2.5e9, f
" "$work/rates2.json" || { echo "FAIL calibrate-bench: nvme-bench's rates not kept"; fail=1; }
check calibrate-no-dir 2 "$plan" plan $M --calibrate "$work/nope/rates.json"
expect_err calibrate-no-dir "$work/nope/rates.json"
expect_err calibrate-no-dir "No such file or directory"
check calibrate-bad-bench 2 "$plan" plan $M --nvme-bench "$work/bad.json" --calibrate "$work/rates3.json"
[ -e "$work/rates3.json" ] && { echo "FAIL calibrate-bad-bench: wrote the file"; fail=1; }
check rates-and-calibrate 2 "$plan" plan $M --rates "$work/rates.json" --calibrate "$work/r4.json"
check rates-missing 2 "$plan" plan $M --rates "$work/none.json"
echo '{"strata_rates": 1, "compute_flops": 1e9}' >"$work/short.json"
check rates-short 2 "$plan" plan $M --rates "$work/short.json"
expect_err rates-short '"copy_bps"'
python3 -c "
import json, sys
f = json.load(open(sys.argv[1])); f['gpu_flops'] = 1
json.dump(f, open(sys.argv[2], 'w'))
" "$work/rates.json" "$work/extra.json"
check rates-unknown 2 "$plan" plan $M --rates "$work/extra.json"
expect_err rates-unknown 'unknown field "gpu_flops"'
python3 -c "
import json, sys
f = json.load(open(sys.argv[1])); f['adam_bps'] = -3
json.dump(f, open(sys.argv[2], 'w'))
" "$work/rates.json" "$work/neg.json"
check rates-negative 2 "$plan" plan $M --rates "$work/neg.json"
expect_err rates-negative '"adam_bps" is -3'

# The batch that hides the I/O: optimizer on a slow nvme, a fast compute.
check hide 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --compute-gflops 100
expect_out hide "compute-bound from --grad-accum"
check accum-auto 0 "$plan" plan $M --nvme "$work/d1" --offload-optim nvme --compute-gflops 100 \
	--grad-accum auto --json
expect_err accum-auto "--grad-accum auto:"
python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
assert p['grad_accum'] == p['hide']['compute_bound_accum'] > 1, (p['grad_accum'], p['hide'])
assert p['time']['bound'] == 'compute', p['time']
" "$work/out" || { echo "FAIL accum-auto: did not take the compute-bound N"; fail=1; }
check hide-never 0 "$plan" plan $M --nvme "$work/d1" --offload-params nvme --offload-optim nvme \
	--compute-gflops 100000
expect_out hide-never "never compute-bound up to --grad-accum 64"
check bad-accum 2 "$plan" plan $M --grad-accum sometimes

# --recompute auto: each row is compared with its own kept forwards. At
# gpt2 B=8 T=1024 --gpu-mem 3G the checkpoints on the host free vram for
# one more kept forward: auto must take that row, and be no slower than
# either forced home (before, it compared the rows without keeps and took
# vram's, 151.7 s against 149.1 s).
G2="--model gpt2 --batch 8 --seq 1024 --gpu-mem 3G --host-mem 8G"
for a in auto vram host; do
	check "act-keeps-$a" 0 "$plan" plan $G2 --offload-activations $a --json
	cp "$work/out" "$work/act_$a.json"
done
python3 -c "
import json, sys
p = {a: json.load(open(sys.argv[1] + '/act_' + a + '.json')) for a in ('auto', 'vram', 'host')}
s = {a: p[a]['time']['step_s'] for a in p}
assert s['auto'] <= min(s['vram'], s['host']) * (1 + 1e-9), s
assert len(p['auto']['recompute']['keep']) == max(len(p[a]['recompute']['keep'])
	for a in ('vram', 'host')), [p[a]['recompute']['keep'] for a in p]
assert p['host']['time']['step_s'] < p['vram']['time']['step_s'], s
assert p['auto']['activations']['home'] == 'host', p['auto']['activations']
" "$work" || { echo "FAIL act-keeps: auto is not the faster row with its keeps"; fail=1; }

# Issue 33's llama3.1-8b plan (80G GPU, 64G host, nvme, B=4, T=2048,
# N=8; docs/plan.md): with the fp32 state auto takes layer-first at 266 s
# (its recompute); with bf16 compute and the q8 state every unit keeps
# its forward, nothing is recomputed, and the update's nvme phase is a
# quarter of fp32's: batch-first under 230 s. The default rates, so the
# numbers are the planner's alone.
P8="--model llama3.1-8b --device cuda --gpu-mem 80G --host-mem 64G --nvme $work/d1 --batch 4 --seq 2048 --grad-accum 8 --schedule auto --update auto --json"
# shellcheck disable=SC2086
check plan-8b 0 "$plan" plan $P8
cp "$work/out" "$work/p8.json"
# shellcheck disable=SC2086
check plan-8b-q8-bf16 0 "$plan" plan $P8 --compute-dtype bf16 --optim-state q8
python3 - "$work/p8.json" "$work/out" <<'PY' || { echo "FAIL plan-8b: the predicted steps"; fail=1; }
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["schedule"] == "layer-first" and a["time"]["step_s"] > 230, (a["schedule"], a["time"]["step_s"])
assert b["schedule"] == "batch-first" and b["recompute"]["recompute_flops"] == 0, b["schedule"]
assert b["time"]["step_s"] <= 230 and b["time"]["bound"] == "compute", b["time"]
print(f"ok   the 8B plan: fp32 state {a['time']['step_s']:.1f} s ({a['schedule']}), "
      f"bf16 compute + q8 state {b['time']['step_s']:.1f} s ({b['schedule']})")
PY

# --update auto against the plan made for the update after: with the
# bf16 state the update inside the backward (every P, M, V on nvme) is
# slower than after it with P, M, V of some units in host, and auto
# takes the faster one whatever the homes (it did not, before).
P8B="--model llama3.1-8b --device cuda --gpu-mem 80G --host-mem 64G --nvme $work/d1 --batch 4 --seq 2048 --grad-accum 8 --schedule batch-first --optim-state bf16 --json"
# shellcheck disable=SC2086
check plan-8b-auto 0 "$plan" plan $P8B --update auto
cp "$work/out" "$work/p8a.json"
# shellcheck disable=SC2086
check plan-8b-after 0 "$plan" plan $P8B --update after
cp "$work/out" "$work/p8f.json"
# shellcheck disable=SC2086
check plan-8b-inbwd 0 "$plan" plan $P8B --update in-backward --offload-optim nvme
python3 - "$work/p8a.json" "$work/p8f.json" "$work/out" <<'PY' || { echo "FAIL plan-8b-auto: not the faster update"; fail=1; }
import json, sys
a, f, i = (json.load(open(x)) for x in sys.argv[1:4])
assert f["update"] == "after" and i["update"] == "in-backward", (f["update"], i["update"])
assert f["time"]["step_s"] < i["time"]["step_s"], (f["time"]["step_s"], i["time"]["step_s"])
assert a["update"] == "after" and a["time"]["step_s"] == f["time"]["step_s"], a["time"]
assert a["update_why"].startswith("auto: after it, with its own placement"), a["update_why"]
print(f"ok   --update auto: after {f['time']['step_s']:.1f} s, in the backward "
      f"{i['time']['step_s']:.1f} s: {a['update_why']}")
PY

exit $fail
