#!/usr/bin/env bash
# strata info as a user meets it: the machine's facts against what Python and
# the system report on their own; the nvme probe in two directories (file
# system, free space, nothing left behind); a --save directory (what --resume
# takes, every step-N, the model's parameters counted from the weights file's
# header by a parser written here, the files as trainer.json lists them) and
# --verify finding a changed byte and a truncated file; other weights (an
# llm.c file, a Hugging Face directory, a bare file, a NaN); bad input.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-info-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}" # sftools.py

quiet_refusals=1
. "$(dirname "$0")/check.sh"

check help 0 "$strata" info --help
grep -q -e "--verify" "$work/out" || { echo "FAIL help does not name --verify"; fail=1; }
check bad-flag 2 "$strata" info --frobnicate
check bad-arg 2 "$strata" info extra
check verify-alone 2 "$strata" info --verify
check both-uses 2 "$strata" info --ckpt "$work" --nvme "$work"
check nvme-missing 2 "$strata" info --nvme "$work/nope"
check ckpt-missing 2 "$strata" info --ckpt "$work/nope"
mkdir "$work/empty"
check ckpt-empty 2 "$strata" info --ckpt "$work/empty"
# a latest that names a directory that is gone, and no other step-N: one
# line that says so, not a warning before a "no latest link"
mkdir "$work/dangling" && ln -s step-000002 "$work/dangling/latest"
check ckpt-dangling 2 "$strata" info --ckpt "$work/dangling"
grep -q "'latest' names step-000002, which is missing" "$work/err" ||
	{ echo "FAIL ckpt-dangling: $(cat "$work/err")"; fail=1; }
# an nvme dir that cannot be used: exit 1, and why on stderr as well
check nvme-unusable 1 "$strata" info --nvme /proc
grep -q "info: --nvme /proc: " "$work/err" || { echo "FAIL nvme-unusable: stderr empty"; fail=1; }

# --- the machine --------------------------------------------------------------
mkdir "$work/d1" "$work/d2"
check machine-text 0 env OMP_NUM_THREADS=1 "$strata" info --nvme "$work/d1,$work/d2"
cp "$work/out" "$work/machine.txt"
check machine-json 0 env OMP_NUM_THREADS=1 "$strata" info --json --nvme "$work/d1,$work/d2"
cp "$work/out" "$work/machine.json"
left=$(ls -A "$work/d1" "$work/d2" | grep -v -e '^$' -e ':$')
[ -z "$left" ] || { echo "FAIL the nvme probe left $left"; fail=1; }
# the AdamW kernel a training run reports
adam=$("$strata" train --model layers=1,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --steps 0 \
	--data /usr/share/common-licenses/GPL-3 2>&1 | sed -n 's/.*| adam \([a-z0-9]*\).*/\1/p')
fst=$(findmnt -n -o FSTYPE --target "$work/d1" 2>/dev/null || echo unknown)
python3 - "$work" "$adam" "$fst" <<'PY' || fail=1
import glob, json, os, resource, sys
w, adam, fst = sys.argv[1:4]
m = json.load(open(f"{w}/machine.json"))
text = open(f"{w}/machine.txt").read()
cpu, mem = m["cpu"], m["memory"]
assert cpu["online"] == os.sysconf("SC_NPROCESSORS_ONLN"), cpu
assert cpu["usable"] == len(os.sched_getaffinity(0)), cpu
assert cpu["omp_threads"] == 1, cpu  # OMP_NUM_THREADS=1
assert cpu["adam"] == adam, (cpu, adam)
assert "OpenBLAS" in cpu["blas"], cpu
info = {l.split(":")[0]: l.split(":")[1].split() for l in open("/proc/meminfo")}
assert mem["total_bytes"] == int(info["MemTotal"][0]) * 1024, mem
assert 0 < mem["available_bytes"] <= mem["total_bytes"], mem
assert mem["hugepages_total"] == int(info["HugePages_Total"][0]), mem
def lim(v):
    return "unlimited" if v == resource.RLIM_INFINITY else v
soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
assert (mem["memlock_soft"], mem["memlock_hard"]) == (lim(soft), lim(hard)), mem
cap = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0]
assert mem["cap_ipc_lock"] == bool(int(cap.split()[1], 16) >> 14 & 1), mem
nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1
assert m["numa"]["nodes"] == nodes, m["numa"]
assert m["io_uring"]["kernel"] == os.uname().release, m["io_uring"]
assert m["io_uring"]["ok"] is True, m["io_uring"]  # the nvme tier's tests need it too
gpu = m["gpu"]
assert gpu["built"] == ("cuda" in m["devices"].split(",")), (gpu, m["devices"])
if gpu["built"]:  # cuBLASLt, loaded on first use, comes with the toolkit strata was built with
    assert gpu.get("cublaslt", "").startswith("libcublasLt.so."), gpu
    assert f"; {gpu['cublaslt']} loads" in text, text
if "error" in gpu:  # no GPU, or one that cannot be used
    assert gpu["error"] and gpu["error"] in text, (gpu, text)
    assert ("gpu       none: " in text) == (gpu["count"] == 0), text
else:
    assert gpu["count"] > 0 and gpu["total_bytes"] >= gpu["free_bytes"] > 0, gpu
    assert gpu["name"] in text, text
dirs = m["nvme"]
assert [d["dir"] for d in dirs] == [f"{w}/d1", f"{w}/d2"], dirs
for d in dirs:
    assert d["ok"] is True and "error" not in d, d
    assert d["fs"] == fst or fst == "unknown", (d, fst)
    sv = os.statvfs(d["dir"])
    free = sv.f_bavail * sv.f_frsize
    assert abs(d["free_bytes"] - free) <= max(free // 20, 64 << 20), (d, free)
    assert f"nvme      {d['dir']}: {d['fs']}" in text and "written and read back" in text, text
assert "AdamW " + adam in text and "io_uring  works" in text, text
print("ok   machine facts match /proc, sysconf, rlimits, findmnt, statvfs and strata train")
PY
# a probe that fails (no file descriptor left for the tier's io_uring or its
# file): exit 1, the directory named once, the system's reason
check probe-fails 1 python3 -c 'import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (4, 4))
os.execv(sys.argv[1], sys.argv[1:])' "$strata" info --nvme "$work/d1"
grep -q "^nvme      $work/d1: .*FAILED: .*Too many open files" "$work/out" &&
	! grep -q "FAILED: $work/d1: $work/d1" "$work/out" ||
	{ echo "FAIL probe-fails: output"; cat "$work/out"; fail=1; }

# --- a checkpoint directory ----------------------------------------------------
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 2"
"$strata" train $M --data /usr/share/common-licenses/GPL-3 --steps 3 --seed 5 \
	--save "$work/ck" --save-every 1 --keep 2 >"$work/train.log" 2>&1 ||
	{ echo "FAIL train"; tail -5 "$work/train.log"; fail=1; }
check ckpt-text 0 "$strata" info --ckpt "$work/ck"
grep -q "checkpoint $work/ck/step-000003 (what --resume $work/ck takes)" "$work/out" ||
	{ echo "FAIL ckpt-text: no heading"; cat "$work/out"; fail=1; }
check ckpt-json 0 "$strata" info --ckpt "$work/ck" --json --verify
cp "$work/out" "$work/ck.json"
python3 - "$work" <<'PY' || fail=1
import json, os, sys
import sftools
w = sys.argv[1]
c = json.load(open(f"{w}/ck.json"))
assert c["resume"] == f"{w}/ck/step-000003" and c["latest"] == "step-000003", c
assert [(e["name"], e["step"], e["ok"]) for e in c["checkpoints"]] == \
    [("step-000003", 3, True), ("step-000002", 2, True)], c["checkpoints"]
tj = json.load(open(f"{w}/ck/step-000003/trainer.json"))
assert c["step"] == tj["step"] == 3 and c["seed"] == tj["seed"] == 5, c
assert c["config"] == tj["config"], (c["config"], tj["config"])
assert c["files"] == [{"name": f["name"], "bytes": f["bytes"], "xxh64": f["xxh64"]}
                      for f in tj["files"]], c["files"]
for f in c["files"]:
    assert os.path.getsize(f"{w}/ck/step-000003/{f['name']}") == f["bytes"], f
for e in c["checkpoints"]:
    d = f"{w}/ck/{e['name']}"
    assert e["bytes"] == sum(os.path.getsize(f"{d}/{n}") for n in os.listdir(d)
                             if n != "trainer.json"), e
# the parameters, from the safetensors header read here
hdr = sftools.header(f"{w}/ck/step-000003/model.safetensors")
params = 0
for k, v in hdr.items():
    if k != "__metadata__":
        n = 1
        for s in v["shape"]:
            n *= s
        params += n
L, C, V, T = 2, 64, 256, 64
assert params == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C, params
cfg = json.load(open(f"{w}/ck/step-000003/config.json"))
assert c["model"] == {"n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"], "n_head": cfg["n_head"],
                      "vocab_size": cfg["vocab_size"], "n_positions": cfg["n_positions"],
                      "tensors": len(hdr) - ("__metadata__" in hdr), "params": params}, c["model"]
print("ok   ckpt-json matches trainer.json, config.json, the files and a header count")
PY
# other weights: an llm.c file and a Hugging Face directory made from the
# checkpoint, a bare model.safetensors, a value that is not finite
"$strata" export --ckpt "$work/ck" --out "$work/m.bin" --format llmc >/dev/null &&
	"$strata" export --ckpt "$work/ck" --out "$work/hf" >/dev/null || fail=1
check llmc-file 0 "$strata" info --ckpt "$work/m.bin" --json
cp "$work/out" "$work/m.json"
check hf-verify 0 "$strata" info --ckpt "$work/hf" --verify
grep -q "Hugging Face safetensors" "$work/out" && grep -q "every value finite" "$work/out" ||
	{ echo "FAIL hf-verify: output"; cat "$work/out"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
m, c = json.load(open(f"{w}/m.json")), json.load(open(f"{w}/ck.json"))
assert m["format"] == "llm.c model file, version 3 (fp32)", m
assert m["model"] == {k: v for k, v in c["model"].items() if k != "tensors"}, (m, c["model"])
print("ok   the llm.c file's model and parameter count are the checkpoint's")
PY
mkdir "$work/bare" && cp "$work/hf/model.safetensors" "$work/bare/"
check bare 0 "$strata" info --ckpt "$work/bare"
grep -q "model: unknown" "$work/out" || { echo "FAIL bare: output"; cat "$work/out"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import sys
import sftools
w = sys.argv[1]
t = sftools.read(f"{w}/hf/model.safetensors")
dtype, shape, vals = t["h.1.mlp.c_fc.bias"]
vals[7] = float("nan")
t["h.1.mlp.c_fc.bias"] = (dtype, shape, vals)
sftools.write(f"{w}/hf/model.safetensors", t)
PY
check hf-nan 0 "$strata" info --ckpt "$work/hf"
check hf-nan-verify 1 "$strata" info --ckpt "$work/hf" --verify
grep -q "DAMAGED: .*model.safetensors: h.1.mlp.c_fc.bias\[7\] is nan: not finite weights are refused" "$work/out" ||
	{ echo "FAIL hf-nan-verify: output"; cat "$work/out"; fail=1; }
check ckpt-one 0 "$strata" info --ckpt "$work/ck/step-000002" --verify
grep -q "verified: every file's size and XXH64 match" "$work/out" ||
	{ echo "FAIL ckpt-one: not verified"; cat "$work/out"; fail=1; }

# one changed byte: only --verify sees it, names the file, exits 1
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 0xff]))' \
	"$work/ck/step-000002/optimizer.safetensors"
check changed-unverified 0 "$strata" info --ckpt "$work/ck"
check changed-verify 1 "$strata" info --ckpt "$work/ck" --verify
grep -q "step-000002 *DAMAGED: .*step-000002/optimizer.safetensors: checksum mismatch" "$work/out" &&
	grep -q "step-000003 .*verified" "$work/out" ||
	{ echo "FAIL changed-verify: output"; cat "$work/out"; fail=1; }
check changed-one 1 "$strata" info --ckpt "$work/ck/step-000002" --verify
grep -q "verify FAILED: .*optimizer.safetensors: checksum mismatch" "$work/out" ||
	{ echo "FAIL changed-one: output"; cat "$work/out"; fail=1; }
# a truncated weights file: its header no longer fits, seen without --verify
truncate -s 4000 "$work/ck/step-000003/model.safetensors"
check truncated 1 "$strata" info --ckpt "$work/ck"
grep -q "weights: .*model.safetensors" "$work/out" ||
	{ echo "FAIL truncated: output"; cat "$work/out"; fail=1; }
# without latest, --resume takes the newest step-N: so does info
rm "$work/ck/latest"
check no-latest 1 "$strata" info --ckpt "$work/ck" --json
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['resume'].endswith('/step-000003') and c['latest'] is None, c" \
	"$work/out" || { echo "FAIL no-latest"; fail=1; }
# latest naming a directory that is gone: said so; --resume takes the newest
ln -s step-000009 "$work/ck/latest"
check latest-missing 1 "$strata" info --ckpt "$work/ck"
grep -q "(latest -> step-000009, which is missing)" "$work/out" ||
	{ echo "FAIL latest-missing: output"; cat "$work/out"; fail=1; }
# a checkpoint other than the one --resume takes, with a bad config.json:
# found without --verify
"$strata" train $M --data /usr/share/common-licenses/GPL-3 --steps 2 --seed 5 \
	--save "$work/ck2" --save-every 1 --keep 2 >"$work/train.log" 2>&1 || fail=1
check old-step-fine 0 "$strata" info --ckpt "$work/ck2"
echo '{bad' >"$work/ck2/step-000001/config.json"
check old-step-config 1 "$strata" info --ckpt "$work/ck2"
grep -q "step-000001 *DAMAGED: .*step-000001/config.json" "$work/out" ||
	{ echo "FAIL old-step-config: output"; cat "$work/out"; fail=1; }

exit $fail
