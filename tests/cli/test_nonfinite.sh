#!/usr/bin/env bash
# Values that are not finite (docs/reliability.md): weights with one NaN or
# Inf refused by train --init, eval and generate (exit 2, one line naming
# the tensor and the index, nothing left); a checkpoint whose optimizer
# state holds an Inf or a negative V behind a matching checksum refused at
# --resume; a run whose steps all come out non-finite stopped by
# --max-skipped (exit 1) with latest on a finite checkpoint; eval and
# generate on weights whose forward overflows exit 1; every --metrics line
# is JSON that Python's json.loads takes with NaN and Infinity refused.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-nonfinite-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}" # sftools.py
export ST_QUIET=1
M="--model layers=2,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 2 --nvme $work"
data=$work/data.txt
. "$(dirname "$0")/check.sh"
text "$data" 3 the quick brown fox jumps over a lazy dog while strata streams units

# named(WORDS): the one stderr line holds WORDS
named() {
	grep -qF -- "$1" "$work/err" || { echo "FAIL: stderr does not say '$1':"; cat "$work/err"; fail=1; }
}

check help 0 "$strata" train --help
grep -q -e "--max-skipped" "$work/out" || { echo "FAIL train --help does not name --max-skipped"; fail=1; }
check bad-max-skipped 2 "$strata" train $M --data "$data" --max-skipped -1

"$strata" train $M --data "$data" --steps 2 --save "$work/ck" --save-every 1 >/dev/null 2>&1 &&
	"$strata" export --ckpt "$work/ck" --out "$work/hf" >/dev/null &&
	"$strata" export --ckpt "$work/ck" --out "$work/m.bin" --format llmc >/dev/null ||
	{ echo "FAIL setup"; exit 1; }

# one NaN in wte.weight (a Hugging Face directory), one Inf in an llm.c
# file, values that are finite but overflow the forward
python3 - "$work" <<'PY' || fail=1
import os, shutil, struct, sys
import sftools
w = sys.argv[1]
t = sftools.read(f"{w}/hf/model.safetensors")
def variant(name, edit):
    os.makedirs(f"{w}/{name}")
    shutil.copy(f"{w}/hf/config.json", f"{w}/{name}/")
    u = {k: (d, s, list(v)) for k, (d, s, v) in t.items()}
    edit(u)
    sftools.write(f"{w}/{name}/model.safetensors", u)
variant("nan", lambda u: u["wte.weight"][2].__setitem__(1234, float("nan")))
def big(u):
    for k, (d, s, v) in u.items():
        if k.startswith("h.") and k.endswith(".weight"):
            u[k] = (d, s, [x * 1e30 for x in v])
variant("big", big)
raw = bytearray(open(f"{w}/m.bin", "rb").read())
struct.pack_into("<f", raw, 1024 + 4 * 1234, float("inf"))  # wte comes first
open(f"{w}/inf.bin", "wb").write(raw)
PY

quiet_refusals=0 # train prints its plan before it reads --init
check init-nan 2 "$strata" train $M --data "$data" --steps 2 --init "$work/nan" --save "$work/never"
named "--init $work/nan: $work/nan/model.safetensors: wte.weight[1234] is nan: not finite weights are refused"
check init-nan-file 2 "$strata" train $M --data "$data" --steps 2 --init "$work/nan/model.safetensors"
named "--init $work/nan/model.safetensors: wte.weight[1234] is nan"
check init-inf-llmc 2 "$strata" train $M --data "$data" --steps 2 --init "$work/inf.bin"
named "--init $work/inf.bin: wte.weight[1234] is inf"
[ ! -e "$work/never" ] || { echo "FAIL a refused --init left its --save DIR"; fail=1; }
quiet_refusals=1
check eval-nan 2 "$strata" eval --ckpt "$work/nan" --data "$data" --batches 1
named "--ckpt $work/nan: $work/nan/model.safetensors: wte.weight[1234] is nan"
check generate-nan 2 "$strata" generate --ckpt "$work/nan" --tokens 4
named "wte.weight[1234] is nan"
check generate-inf-llmc 2 "$strata" generate --ckpt "$work/inf.bin" --tokens 4
named "wte.weight[1234] is inf"

# finite weights whose forward overflows: exit 1, not a loss of nan
check eval-overflow 1 "$strata" eval --ckpt "$work/big" --data "$data" --batches 1
named "the loss over 1 batches is nan"
check generate-overflow 1 "$strata" generate --ckpt "$work/big" --tokens 4
named "are not finite"

# A checkpoint whose optimizer.safetensors holds an Inf (then a V of -1),
# with trainer.json's size and XXH64 (and its own checksum) rewritten so
# only the values show it.
for case in inf:exp_avg neg:exp_avg_sq; do
	kind=${case%%:*}
	rm -rf "$work/bad"
	mkdir -p "$work/bad" && cp -r "$work/ck/step-000002" "$work/bad/" || fail=1
	python3 - "$work/bad/step-000002" "$kind" "${case#*:}" <<'PY' || fail=1
import json, sys
import sftools
d, kind, suffix = sys.argv[1:]
p = f"{d}/optimizer.safetensors"
t = sftools.read(p)
dt, s, v = t["h.0.mlp.c_fc.bias." + suffix]
v[3] = float("inf") if kind == "inf" else -1.0
t["h.0.mlp.c_fc.bias." + suffix] = (dt, s, v)
sftools.write(p, t)
tr = sftools.trainer_load(f"{d}/trainer.json")
raw = open(p, "rb").read()
for f in tr["files"]:
    if f["name"] == "optimizer.safetensors":
        f["bytes"], f["xxh64"] = len(raw), "%016x" % sftools.xxh64(raw)
sftools.trainer_save(f"{d}/trainer.json", tr)  # its own checksum too
PY
	quiet_refusals=0
	check "resume-$kind" 2 "$strata" train $M --data "$data" --steps 4 --resume "$work/bad/step-000002" \
		--save "$work/never2"
	if [ "$kind" = inf ]; then
		named "step-000002/optimizer.safetensors: h.0.mlp.c_fc.bias.exp_avg[3] is inf"
	else
		named "h.0.mlp.c_fc.bias.exp_avg_sq[3] is -1: Adam's second moment must be finite and >= 0"
	fi
	quiet_refusals=1
	[ ! -e "$work/never2" ] || { echo "FAIL a refused --resume left its --save DIR"; fail=1; }
done

# A run whose every step is non-finite: stopped after --max-skipped steps
# in a row, exit 1, unsaved at the stop; latest names a finite checkpoint
# (the skipped steps' state is the last good one).
check max-skipped 1 "$strata" train $M --data "$data" --steps 20 --init "$work/big" \
	--save "$work/sk" --save-every 2 --max-skipped 3 --metrics "$work/m.jsonl"
named "strata: 3 steps in a row had a non-finite gradient (last at step 3): stopped; the last checkpoint is $work/sk/step-000002"
[ "$(wc -l <"$work/err")" = 1 ] || { echo "FAIL max-skipped: stderr is not one line"; fail=1; }
[ "$(readlink "$work/sk/latest")" = step-000002 ] && [ ! -e "$work/sk/step-000003" ] &&
	[ -z "$(ls "$work/sk" | grep tmp)" ] ||
	{ echo "FAIL max-skipped: the checkpoints"; ls -l "$work/sk"; fail=1; }
python3 - "$work" <<'PY' || fail=1
import json, math, sys
import sftools
w = sys.argv[1]
for name, (d, s, v) in sftools.read(f"{w}/sk/latest/model.safetensors").items():
    assert all(math.isfinite(x) for x in v), name
def no_constant(c):
    raise ValueError("not JSON: " + c)
rows = [json.loads(l, parse_constant=no_constant) for l in open(f"{w}/m.jsonl")]
assert [r["step"] for r in rows] == [1, 2, 3], rows
for r in rows:
    assert r["skipped"] is True and r["grad_norm"] is None, r
    assert "grad_norm" in r["nonfinite"], r
    assert (r["loss"] is None) == ("loss" in r["nonfinite"]), r
    assert isinstance(r["bytes"], dict) and isinstance(r["lr"], float), r
print("ok   metrics: 3 lines, json.loads with NaN/Infinity refused; latest's P finite")
PY
check max-skipped-default 1 "$strata" train $M --data "$data" --steps 20 --init "$work/big"
named "10 steps in a row had a non-finite gradient (last at step 10): stopped; nothing is saved (no --save)"
check max-skipped-off 0 "$strata" train $M --data "$data" --steps 4 --init "$work/big" --max-skipped 0
# and a finite run's lines parse as ever
"$strata" train $M --data "$data" --steps 3 --metrics "$work/ok.jsonl" >/dev/null 2>&1 || fail=1
python3 - "$work/ok.jsonl" <<'PY' || fail=1
import json, sys
def no_constant(c):
    raise ValueError("not JSON: " + c)
rows = [json.loads(l, parse_constant=no_constant) for l in open(sys.argv[1])]
assert len(rows) == 3 and all("nonfinite" not in r and "skipped" not in r for r in rows), rows
print("ok   metrics of a finite run: no nonfinite field")
PY

exit $fail
