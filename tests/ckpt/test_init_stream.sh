#!/usr/bin/env bash
# --init streams: weights larger than the host budget are read unit by unit
# into the tiers, never whole. A model of 12.7M parameters (50.9 MB of fp32
# weights in 7 shards) is fine-tuned with --host-mem 34M and every state on
# nvme; the run's peak RSS with --init may exceed the same run's without
# --init by little (a unit: 3.2 MB here), far less
# than the weights, and the host tier's peak stays inside its budget. The
# first loss equals that of --init with everything in memory (so the weights
# streamed are the weights).
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-initstream-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
data=/usr/share/common-licenses/GPL-3
model=layers=16,dim=256,heads=4,vocab=256,ctx=64
run=(--model "$model" --seq 16 --batch 1 --steps 1 --data "$data" --seed 5)

"$strata" train "${run[@]}" --host-mem 1G --gpu-mem 1G --save "$work/ck" >"$work/log" 2>&1 &&
	"$strata" export --ckpt "$work/ck" --out "$work/hf" --shard-size 8M >>"$work/log" 2>&1 ||
	{ echo "FAIL making the weights"; tail -3 "$work/log"; exit 1; }
rm -rf "$work/ck"
mkdir "$work/swap"
# peak RSS (KiB) of one run, and its exit status
peak() { # metrics file, args...
	local m=$1
	shift
	python3 - "$strata" train "${run[@]}" --metrics "$m" "$@" <<'PY'
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
if r.returncode != 0:
    sys.stderr.write(r.stderr.decode()[-400:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)
PY
}
# ASan keeps freed memory in a quarantine (256 MB), which would count the
# units --init has already handed to the tiers: none in this test's runs
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=0"
tiers=(--offload-params nvme --offload-optim nvme --nvme "$work/swap" --host-mem 34M --gpu-mem 64M)
read -r base rc0 < <(peak "$work/base.jsonl" "${tiers[@]}")
read -r init rc1 < <(peak "$work/init.jsonl" "${tiers[@]}" --init "$work/hf")
read -r ram rc2 < <(peak "$work/ram.jsonl" --host-mem 1G --gpu-mem 1G --init "$work/hf")
python3 - "$work" "$base" "$init" "$rc0$rc1$rc2" <<'PY' || fail=1
import json, os, sys
w, base, init, rcs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
assert rcs == "000", "a run failed: exit statuses %s" % rcs
weights = sum(os.path.getsize(f"{w}/hf/{f}") for f in os.listdir(f"{w}/hf")
              if f.endswith(".safetensors"))
budget = 34 << 20
assert weights > budget, (weights, budget)
growth = (init - base) * 1024
m = json.loads(open(f"{w}/init.jsonl").readline())
ram = json.loads(open(f"{w}/ram.jsonl").readline())
print("weights %.1f MB, host budget %.1f MB: peak RSS %.1f MB without --init, %.1f MB with "
      "(+%.1f MB); host tier peak %.1f MB" % (weights / 1e6, budget / 1e6, base * 1024 / 1e6,
                                              init * 1024 / 1e6, growth / 1e6,
                                              m["peak"]["host"] / 1e6))
assert growth < 16e6 and growth < weights / 3, "--init grew the peak RSS by %d bytes" % growth
assert m["peak"]["host"] <= budget, m["peak"]
assert m["loss"] == ram["loss"], (m["loss"], ram["loss"])
print("ok   --init streamed: first loss %s, as with everything in memory" % m["loss"])
PY
exit $fail
