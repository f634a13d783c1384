#!/usr/bin/env bash
# strata train / eval / generate as a user meets them: bad input (one line,
# exit 2, nothing written), a run that saves and reloads, bit-identical reruns
# (also across thread counts), --steps 0, exact metrics, grad accumulation.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-cli-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32"
data=$work/data.txt
. "$(dirname "$0")/check.sh"
text "$data" 3 the quick brown fox jumps over a lazy dog while strata streams units

check help 0 "$strata" --help
check train-help 0 "$strata" train --help
check gen-help 0 "$strata" generate --help
check eval-help 0 "$strata" eval --help
check bad-command 2 "$strata" frobnicate
check bad-model 2 "$strata" train --model layers=2,dim=63,heads=2,vocab=256,ctx=64 --data "$data"
check bad-flag 2 "$strata" train --frobnicate
check bad-number 2 "$strata" train --batch 0 --data "$data"
check bad-lr 2 "$strata" train --lr abc --data "$data"
check bad-activations 2 "$strata" train --offload-activations nvme --data "$data"
check bad-precision 2 "$strata" train --precision fp8 --data "$data"
check bad-recompute 2 "$strata" train --recompute some --data "$data"
check recompute-none-short 2 "$strata" train $M --data "$data" --recompute none --gpu-mem 1M
check test-fault-spec 2 "$strata" train $M --data "$data" --test-fault eio300
check test-fault-kind 2 "$strata" train $M --data "$data" --test-fault melt@3
check test-fault-arg 2 "$strata" train $M --data "$data" --test-fault eio@3:5
check test-fault-two 2 "$strata" train $M --data "$data" --test-fault eio@3 --test-fault short@4
check test-fault-src 2 "$strata" train $M --data "$data" --test-fault other-page@3
check test-fault-no-nvme 2 "$strata" train $M --data "$data" --nvme none --test-fault eio@3
check optim-vram-w-host 2 "$strata" train $M --data "$data" --offload-params host --offload-optim vram
check optim-bad 2 "$strata" train $M --data "$data" --offload-optim vrm
"$strata" train --help | sed -n '/^testing$/,$p' | grep -q -e "--test-fault SPEC" ||
	{ echo "FAIL train --help lists no --test-fault under testing"; fail=1; }
check missing-data 2 "$strata" train --data "$work/nope" --save "$work/never"
check seq-too-long 2 "$strata" train $M --seq 65 --data "$data"
check vocab-too-small 2 "$strata" train --model layers=1,dim=64,heads=2,vocab=100,ctx=64 --seq 32 --data "$data"
check save-is-file 2 "$strata" train $M --data "$data" --save "$data"
check gen-no-ckpt 2 "$strata" generate --prompt hi
check eval-no-data 2 "$strata" eval --ckpt "$work/nope"
[ ! -e "$work/never" ] || { echo "FAIL bad input wrote --save"; fail=1; }
# bad input found after the trace is open and --save is made: neither stays
check resume-missing 2 "$strata" train $M --data "$data" --resume "$work/nope" --trace "$work/tr.json"
# --init is read before anything else: its own failure, not a misfit of the
# default model with the data
check init-missing 2 "$strata" train --init "$work/nope" --data "$data"
grep -q -- "--init $work/nope" "$work/err" || { echo "FAIL init-missing: $(cat "$work/err")"; fail=1; }
quiet_refusals=1 check init-missing-with-model 2 "$strata" train $M --init "$work/nope" --data "$data"
check keep-no-save 2 "$strata" train $M --data "$data" --keep 2
# one file by two names, neither there yet: the trace would be renamed
# over the metrics at the end
check metrics-is-trace 2 "$strata" train $M --data "$data" --metrics "$work/mt.json" \
	--trace "$work/./mt.json"
[ -e "$work/mt.json" ] && { echo "FAIL metrics-is-trace left $work/mt.json"; fail=1; }
# a metrics line that cannot be written stops the run at that step (it
# used to run on to the end, its checkpoints saved, and fail at the close)
check metrics-full 1 "$strata" train $M --data "$data" --steps 40 --metrics /dev/full \
	--save "$work/mf" --save-every 10
[ -e "$work/mf/step-000010" ] && { echo "FAIL metrics-full: the run went on"; fail=1; }
grep -q -- "--metrics /dev/full: No space left on device" "$work/err" ||
	{ echo "FAIL metrics-full: $(cat "$work/err")"; fail=1; }
check metrics-unwritable 2 "$strata" train $M --data "$data" --save "$work/never/a/b" \
	--metrics "$work/nodir/m.jsonl" --trace "$work/tr.json"
left=$(ls "$work" | grep -e '^tr\.json' -e '^never$')
[ -z "$left" ] || { echo "FAIL bad input left $left"; fail=1; }

run() { # out-prefix, extra flags...
	local p=$1
	shift
	"$strata" train $M --data "$data" --batch 4 --steps 6 --warmup 2 --seed 7 \
		--metrics "$work/$p.jsonl" "$@" >"$work/$p.log" 2>&1
}
run a --save "$work/ck" || { echo "FAIL train"; cat "$work/a.log"; fail=1; }
run b --threads 1 || fail=1
run c --threads 2 || fail=1
# --recompute (docs/plan.md): the default (auto) keeps every block's forward
# at these budgets; all and none give the same bits and bytes per link
run d --recompute all || fail=1
run e --recompute none || fail=1
grep -q "units 1-2 keep their forward; recompute auto" "$work/a.log" ||
	{ echo "FAIL the default plan does not keep both blocks"; fail=1; }
grep -q "none (recompute all" "$work/d.log" || { echo "FAIL recompute all keeps"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import json, math, sys
w = sys.argv[1]
def losses(p):
    rows = [json.loads(l) for l in open(f"{w}/{p}.jsonl")]
    for r in rows:
        for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s"):
            assert k in r, (p, k)
        assert set(r["bytes"]) == {"h2d", "d2h", "nvme_read", "nvme_write"}, r["bytes"]
        assert {"vram", "host"} <= set(r["peak"]), r["peak"]
        assert set(r["busy_s"]) == {"compute", "h2d", "d2h", "nvme_read", "nvme_write", "adam"}
        assert r["bytes"]["d2h"] > 0 and r["busy_s"]["compute"] > 0
    return [(r["loss"], r["grad_norm"]) for r in rows]
a, b, c = losses("a"), losses("b"), losses("c")
assert len(a) == 6
assert a == b == c, ("not bit-identical across runs/threads", a, b, c)
d, e = losses("d"), losses("e")
assert a == d == e, ("not bit-identical across --recompute", a, d, e)
link = lambda p: [json.loads(l)["bytes"] for l in open(f"{w}/{p}.jsonl")]
assert link("a") == link("d") == link("e"), "bytes per link differ across --recompute"
assert abs(a[0][0] - math.log(256)) < 0.1, a[0]
assert a[-1][0] < a[0][0], "loss did not go down"
print("ok   reruns and 1 vs 2 threads give identical losses; init loss ~ ln(256)")
PY
# the optimizer on the device (--offload-optim vram): the host placement's
# numbers, and nothing over a link
run vh --offload-params none --offload-optim host --gpu-mem 64M || fail=1
run vv --offload-params none --offload-optim vram --gpu-mem 64M || fail=1
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
rows = {p: [json.loads(l) for l in open(f"{w}/{p}.jsonl")] for p in ("vh", "vv")}
same = [(r["loss"], r["grad_norm"]) for r in rows["vh"]] == [(r["loss"], r["grad_norm"]) for r in rows["vv"]]
assert same, "--offload-optim vram: losses or norms differ from the host optimizer's"
assert all(v == 0 for r in rows["vv"] for v in r["bytes"].values()), rows["vv"][0]["bytes"]
assert all(r["bytes"]["d2h"] > 0 for r in rows["vh"])
print("ok   --offload-optim vram: the host optimizer's losses and norms, no bytes over a link")
PY
# same_ckpt A B WHAT: checkpoints $work/A and $work/B hold the same tensor
# bytes (the model's and the optimizer's)
same_ckpt() {
	local f
	for f in model.safetensors optimizer.safetensors; do
		cmp -s "$work/$1/latest/$f" "$work/$2/latest/$f" ||
			{ echo "FAIL $3: $f differs"; fail=1; }
	done
}
# --schedule layer-first (docs/engine.md, "Schedules"): batch-first's
# losses, norms and checkpoint bytes, W and the optimizer on nvme at
# --grad-accum 3, and less nvme traffic; a budget it cannot fit is refused
check bad-schedule 2 "$strata" train $M --data "$data" --schedule sideways
check lf-vram-short 2 "$strata" train $M --data "$data" --schedule layer-first --grad-accum 4 \
	--gpu-mem 1M
grep -q "layer-first holds the checkpoints" "$work/err" ||
	{ echo "FAIL lf-vram-short: $(cat "$work/err")"; fail=1; }
for s in batch-first layer-first; do
	run "s-$s" --grad-accum 3 --offload-params nvme --offload-optim nvme --schedule $s \
		--save "$work/ck-$s" || { echo "FAIL --schedule $s"; cat "$work/s-$s.log"; fail=1; }
done
grep -q "schedule        layer-first" "$work/s-layer-first.log" ||
	{ echo "FAIL the layer-first plan does not say so"; fail=1; }
same_ckpt ck-layer-first ck-batch-first "--schedule layer-first against batch-first"
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
rows = {p: [json.loads(l) for l in open(f"{w}/s-{p}.jsonl")] for p in ("batch-first", "layer-first")}
ln = lambda p: [(r["loss"], r["grad_norm"]) for r in rows[p]]
assert ln("batch-first") == ln("layer-first"), "--schedule layer-first: losses or norms differ"
nv = lambda p, k: rows[p][-1]["bytes"][k]
for k in ("nvme_read", "nvme_write", "h2d", "d2h"):
    assert nv("layer-first", k) < nv("batch-first", k), (k, nv("layer-first", k), nv("batch-first", k))
print("ok   --schedule layer-first: batch-first's losses, norms and checkpoint bytes, fewer bytes per link")
PY
# --update in-backward (docs/engine.md): the update after the backward's
# losses, norms and checkpoint bytes, with a clip (3) that some steps pass;
# refused with the optimizer in host, and a bad word
check bad-update 2 "$strata" train $M --data "$data" --update sometimes
check update-host 2 "$strata" train $M --data "$data" --update in-backward --offload-optim host
grep -q "it needs P, M and V on nvme" "$work/err" ||
	{ echo "FAIL update-host: $(cat "$work/err")"; fail=1; }
for u in after in-backward; do
	run "u-$u" --offload-params nvme --offload-optim nvme --clip 3 --update $u \
		--save "$work/ck-u-$u" || { echo "FAIL --update $u"; cat "$work/u-$u.log"; fail=1; }
done
grep -q "update          in the backward" "$work/u-in-backward.log" ||
	{ echo "FAIL the in-backward plan does not say so"; fail=1; }
same_ckpt ck-u-in-backward ck-u-after "--update in-backward against after"
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
rows = {p: [json.loads(l) for l in open(f"{w}/u-{p}.jsonl")] for p in ("after", "in-backward")}
ln = lambda p: [(r["loss"], r["grad_norm"]) for r in rows[p]]
assert ln("after") == ln("in-backward"), "--update in-backward: losses or norms differ"
norms = [r["grad_norm"] for r in rows["after"]]
assert min(norms) <= 3 < max(norms), ("the clip 3 is not between the norms", norms)
print("ok   --update in-backward: the losses, norms and checkpoint bytes of the update after")
PY
[ -f "$work/ck/latest/model.safetensors" ] && [ -f "$work/ck/latest/config.json" ] || { echo "FAIL no checkpoint"; fail=1; }
ls "$work" | grep -q '\.tmp\.' && { echo "FAIL temporary checkpoint left"; fail=1; }

# The checkpoint reloads: eval twice gives the same number; --init then eval too.
check eval 0 "$strata" eval --ckpt "$work/ck" --data "$data" --batch 2 --seq 32 --batches 3
e1=$(cat "$work/out")
"$strata" train $M --init "$work/ck" --data "$data" --steps 0 --save "$work/ck2" >/dev/null 2>&1 || fail=1
check eval-reloaded 0 "$strata" eval --ckpt "$work/ck2" --data "$data" --batch 2 --seq 32 --batches 3
[ "$e1" = "$(cat "$work/out")" ] || { echo "FAIL reloaded checkpoint evaluates differently: $e1 / $(cat "$work/out")"; fail=1; }
cmp -s "$work/ck/latest/model.safetensors" "$work/ck2/latest/model.safetensors" || { echo "FAIL save(load(ck)) != ck"; fail=1; }
# more batches than the data holds would wrap around and count some twice
check eval-past-the-data 2 "$strata" eval --ckpt "$work/ck" --data "$data" --batch 2 --seq 32 \
	--batches 100000
# a full disk under stdout is exit 1, never a success with an empty file
check eval-stdout-full 1 sh -c "\"\$0\" eval --ckpt '$work/ck' --data '$data' --batch 2 \
	--seq 32 --batches 1 >/dev/full" "$strata"
check plan-json-stdout-full 1 sh -c "\"\$0\" plan $M --json >/dev/full" "$strata"
check generate 0 "$strata" generate --ckpt "$work/ck" --prompt "the " --tokens 20 --seed 1
[ "$(head -c 4 "$work/out")" = "the " ] || { echo "FAIL generate output"; fail=1; }
g1=$(cat "$work/out")
"$strata" generate --ckpt "$work/ck" --prompt "the " --tokens 20 --seed 1 >"$work/out" 2>&1
[ "$g1" = "$(cat "$work/out")" ] || { echo "FAIL generate is not deterministic"; fail=1; }

# --keep K leaves the newest K step directories; --keep 0 leaves them all.
"$strata" train $M --data "$data" --steps 3 --save "$work/k0" --save-every 1 --keep 0 >/dev/null 2>&1 || fail=1
"$strata" train $M --data "$data" --steps 3 --save "$work/k1" --save-every 1 --keep 1 >/dev/null 2>&1 || fail=1
[ "$(ls -d "$work"/k0/step-* | wc -l)" = 3 ] && [ "$(ls -d "$work"/k1/step-* | wc -l)" = 1 ] ||
	{ echo "FAIL --keep: $(ls "$work/k0" | tr '\n' ' ')/ $(ls "$work/k1" | tr '\n' ' ')"; fail=1; }

# --steps 0 writes the initial weights; two of them with one seed are equal.
"$strata" train $M --data "$data" --steps 0 --seed 5 --save "$work/i1" >/dev/null 2>&1 || fail=1
"$strata" train $M --data "$data" --steps 0 --seed 5 --save "$work/i2" >/dev/null 2>&1 || fail=1
cmp -s "$work/i1/latest/model.safetensors" "$work/i2/latest/model.safetensors" || { echo "FAIL init not reproducible"; fail=1; }
# Another run saving into a directory of checkpoints is refused, and
# leaves them as they were (a step saved again replaces it whole:
# tests/ckpt/test_ckpt.c).
check save-into-other-run 2 "$strata" train $M --data "$data" --steps 0 --seed 6 --save "$work/i1"
cmp -s "$work/i1/latest/model.safetensors" "$work/i2/latest/model.safetensors" || { echo "FAIL refused save changed the weights"; fail=1; }

# Gradient accumulation: 2 micro-batches of B=2 against 1 batch of B=4, with
# llm.c's contiguous order both see the same 4 sequences per step.
"$strata" train $M --data "$data" --steps 3 --shuffle off --batch 4 --metrics "$work/g1.jsonl" >/dev/null 2>&1 || fail=1
"$strata" train $M --data "$data" --steps 3 --shuffle off --batch 2 --grad-accum 2 --metrics "$work/g2.jsonl" >/dev/null 2>&1 || fail=1
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
g1 = [json.loads(l) for l in open(f"{w}/g1.jsonl")]
g2 = [json.loads(l) for l in open(f"{w}/g2.jsonl")]
for a, b in zip(g1, g2):
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
    assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-3 * abs(a["grad_norm"]), (a, b)
print("ok   2 x B=2 accumulated matches 1 x B=4")
PY
# A drive failure mid-run: exit 1, one line naming file, offset and errno;
# the checkpoint written before it still evaluates. The fault tier's
# operation 290 is step 5's write at nvme offset 1290240.
"$strata" train $M --data "$data" --steps 50 --nvme "$work" \
	--offload-params nvme --offload-optim nvme --save "$work/fck" --save-every 1 \
	--test-fault eio@290 >"$work/out" 2>"$work/err"
rc=$?
if [ $rc != 1 ] || ! grep -q "offset [0-9]*: Input/output error" "$work/err" ||
   ! grep -q "$work" "$work/err" || [ "$(wc -l <"$work/err")" != 1 ]; then
	echo "FAIL nvme fault: exit $rc"; cat "$work/err"; fail=1
else
	echo "ok   nvme fault: $(cat "$work/err")"
fi
check eval-after-fault 0 "$strata" eval --ckpt "$work/fck" --data "$data" --batches 1 --seq 32
ls "$work" | grep -q 'strata-.*\.swap' && { echo "FAIL swap files left"; fail=1; }

# --resume continues bit-identically: 4 steps = 2 steps, save, resume, 2.
"$strata" train $M --data "$data" --steps 4 --metrics "$work/r4.jsonl" >/dev/null 2>&1 || fail=1
"$strata" train $M --data "$data" --steps 4 --metrics "$work/r2.jsonl" --save "$work/rck" \
	--save-every 2 >/dev/null 2>&1 || fail=1
rm -rf "$work/rck/step-000004"
ln -sfn step-000002 "$work/rck/latest"
head -2 "$work/r2.jsonl" >"$work/r22.jsonl"
"$strata" train $M --data "$data" --steps 4 --metrics "$work/r22.jsonl" --resume "$work/rck" \
	>"$work/out" 2>&1 || { echo "FAIL resume"; cat "$work/out"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(f"{w}/r4.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{w}/r22.jsonl")]
assert a == b, (a, b)
print("ok   resume: 2 + 2 steps give the losses of 4")
PY
# --resume auto: from the start (and --init) while --save DIR has no
# checkpoint, from DIR once it has one (also when latest names a directory
# that is gone); a damaged one is refused, never silently started over.
check resume-auto-no-save 2 "$strata" train $M --data "$data" --resume auto
for want in "starting at step 0" "resumed from $work/auto/step-000002 at step 2" \
	    "latest names step-000099, which is missing"; do
	ST_QUIET=0 "$strata" train $M --data "$data" --steps 2 --save "$work/auto" --resume auto \
		--init "$work/ck" >"$work/out" 2>&1
	grep -q "$want" "$work/out" && echo "ok   resume auto: $want" ||
		{ echo "FAIL resume auto: no '$want'"; tail -3 "$work/out"; fail=1; }
	ln -sfn step-000099 "$work/auto/latest"
done
ln -sfn step-000002 "$work/auto/latest"
echo '{' >"$work/auto/step-000002/trainer.json"
check resume-auto-damaged 2 "$strata" train $M --data "$data" --steps 2 --save "$work/auto" --resume auto
check resume-other-model 2 "$strata" train --model layers=1,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --data "$data" --resume "$work/rck"
check resume-other-lr 2 "$strata" train $M --data "$data" --steps 4 --lr 0.5 --resume "$work/rck"
# --trace: Chrome trace-event JSON, one lane per queue, nothing overlapping
# on a lane (Perfetto draws overlapping slices of one track wrongly).
"$strata" train $M --data "$data" --steps 3 --offload-params nvme --offload-optim nvme \
	--nvme "$work" --trace "$work/t.json" >/dev/null 2>&1 || { echo "FAIL trace run"; fail=1; }
python3 - "$work/t.json" <<'PY' || fail=1
import json, sys, collections
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
for lane in ("compute", "h2d", "d2h", "nvme read", "nvme write", "cpu adam"):
    assert lane in names.values(), lane
spans = collections.defaultdict(list)
for e in ev:
    if e["ph"] == "X":
        spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
for tid, l in spans.items():
    l.sort()
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(l, l[1:])), names[tid]
busy = {names[t]: sum(b - a for a, b in l) for t, l in spans.items()}
assert busy["compute"] > 0 and busy["nvme read"] > 0 and busy["nvme write"] > 0, busy
print("ok   trace: every queue has a lane, no overlaps on a lane")
PY
# The update's loads of P, M and V overlap the backward: in every step,
# unit 1's are queued (the "load u1 P" instants on the nvme read lane)
# before the backward of unit 0 ("bwd embed", the step's last) ends, and
# unit 1's G only after it (G is final then).
python3 - "$work/t.json" <<'PY' || fail=1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
ends = sorted(e["ts"] + e["dur"] for e in ev if e["ph"] == "X" and e["name"] == "bwd embed")
loads = [(e["ts"], e["name"]) for e in ev if e["ph"] == "i" and e["name"].startswith("load u1 ")]
assert len(ends) == 3, ends
lo = 0
for k, end in enumerate(ends):
    got = sorted(n.split()[2] for t, n in loads if lo <= t < end and not n.endswith(" G"))
    assert got == ["M", "P", "V"], f"step {k}: before the backward of unit 0 ended: {got}"
    g = [t for t, n in loads if n == "load u1 G" and t >= end]
    assert g and (k + 1 == len(ends) or g[0] < ends[k + 1]), f"step {k}: G of unit 1 not after it"
    lo = end
print("ok   trace: unit 1's P, M, V loads queued before the backward of unit 0 ends, 3 steps")
PY
# The step reads the device's scalars (the losses, the norm's sums) in one
# d2h a step, named on the host lane.
"$strata" train $M --data "$data" --steps 3 --grad-accum 2 --nvme "$work" \
	--trace "$work/t2.json" >/dev/null 2>&1 || { echo "FAIL trace run (accum 2)"; fail=1; }
python3 - "$work/t2.json" <<'PY' || fail=1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
d2h = [e for e in ev if e["ph"] == "X" and e["name"] == "scalars d2h"]
assert [e["args"]["step"] for e in d2h] == [0, 1, 2], d2h
assert all(e["args"]["bytes"] >= 2 * 32 * 4 for e in d2h), d2h  # 2 micro-batches' losses
bwd = sorted(e["ts"] + e["dur"] for e in ev if e["ph"] == "X" and e["name"] == "bwd embed")
assert len(bwd) == 6, bwd
# it waits for the compute: it ends after the step's last backward
assert all(d["ts"] + d["dur"] >= bwd[2 * k + 1] - 1e-3 for k, d in enumerate(d2h)), "early"
print("ok   trace: one scalars d2h a step, waiting for its last backward")
PY
check plan-impossible 2 "$strata" train $M --data "$data" --gpu-mem 1M

# A T=8192 model whose activation checkpoints do not fit 25M of vram with
# the rest: refused with them forced into vram, trained with auto (on the
# host, as the printed plan says).
L=(--model layers=3,dim=32,heads=1,vocab=256,ctx=8192 --batch 1 --seq 8192 --gpu-mem 25M
   --nvme none --steps 1 --data "$data")
check act-vram-refused 2 "$strata" train "${L[@]}" --offload-activations vram
check act-long 0 "$strata" train "${L[@]}"
if ! grep -q "activations on the host: 2 of 4" "$work/out" || ! grep -Eq '^step +1' "$work/out"; then
	echo "FAIL act-long: checkpoints not on the host, or no step 1"; tail -5 "$work/out"; fail=1
fi

# `strata train` as it comes is the demo (tools/quickstart demo): its default
# budgets must still plan, and must still use every tier as the help says
# (some W streamed from host, some of the optimizer state on nvme: the split
# policy fills vram and host first), whatever the planner's pools become.
# (on a GPU the budgets not given are the machine's: the demo gives its own)
check defaults 0 "$strata" train --steps 2 --nvme "$work" --gpu-mem 16M --host-mem 12M
if ! grep -Eq '^  W +(-|[0-9]+ units [0-9.]+ [A-Za-z]+) +[0-9]+ units' "$work/out" ||
   ! grep -Eq '^  M .*[0-9]+ units [0-9.]+ [A-Za-z]+$' "$work/out" ||
   ! grep -Eq '^step +2' "$work/out"; then
	echo "FAIL defaults: not W on host and M on nvme, or no step 2"; head -12 "$work/out"; fail=1
fi

[ $fail = 0 ] && echo "all cli checks passed"
exit $fail
