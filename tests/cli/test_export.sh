#!/usr/bin/env bash
# strata export as a user meets it. hf: fp32 is the checkpoint's weights file
# byte for byte; bf16 is each value rounded to nearest even (checked by a
# rounding written here) and strata eval reads it to the same loss as the
# checkpoint with bf16 weights. llmc: a reader of llm.c's format written here
# (header, order, (out, in) matrices, zero-padded vocabulary) finds every
# checkpoint tensor, and an llm.c file exports back to the checkpoint's bytes.
# Hugging Face directories export too (bf16; F16 with
# "transformer." names and lm_head, as transformers saves); an untied head is
# refused. Bad input, a damaged checkpoint and a tensor of the wrong shape
# (found before anything is written): exit 2, nothing left; a write that
# fails halfway: exit 1, nothing left; SIGTERM: nothing left.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-export-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
data=/usr/share/common-licenses/GPL-3
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}" # sftools.py

quiet_refusals=1
. "$(dirname "$0")/check.sh"
nothing_left() { # name: no export output or temporary in $work/o
	local left
	left=$(ls -A "$work/o")
	[ -z "$left" ] || { echo "FAIL $1 left: $left"; fail=1; }
}

# vocab 300 is not a multiple of 128 (llm.c pads it to 384); dim 96, 3 heads
"$strata" train --model layers=2,dim=96,heads=3,vocab=300,ctx=64 --seq 32 --batch 2 --data "$data" \
	--steps 4 --seed 11 --save "$work/ck" >"$work/train.log" 2>&1 ||
	{ echo "FAIL train"; tail -5 "$work/train.log"; exit 1; }
mkdir "$work/o"
check help 0 "$strata" export --help
check no-out 2 "$strata" export --ckpt "$work/ck"
check bad-format 2 "$strata" export --ckpt "$work/ck" --out "$work/o/x" --format onnx
check bad-dtype 2 "$strata" export --ckpt "$work/ck" --out "$work/o/x" --dtype fp8
check bad-arg 2 "$strata" export --ckpt "$work/ck" --out "$work/o/x" extra
check ckpt-missing 2 "$strata" export --ckpt "$work/nope" --out "$work/o/x"
check out-parent-missing 2 "$strata" export --ckpt "$work/ck" --out "$work/o/no/x"
check out-parent-missing-llmc 2 "$strata" export --ckpt "$work/ck" --out "$work/o/no/x" --format llmc
nothing_left bad-input
mkdir "$work/o/there"
check out-exists 2 "$strata" export --ckpt "$work/ck" --out "$work/o/there"
rmdir "$work/o/there"

# an export's config.json: the checkpoint's, and the torch_dtype written
same_config() { # EXPORT_CONFIG CKPT_CONFIG DTYPE
	python3 -c 'import json, sys
e, c = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(e.pop("torch_dtype", None) != sys.argv[3] or e != c)' "$@"
}
check hf 0 "$strata" export --ckpt "$work/ck" --out "$work/o/hf"
cmp -s "$work/o/hf/model.safetensors" "$work/ck/latest/model.safetensors" &&
	same_config "$work/o/hf/config.json" "$work/ck/latest/config.json" float32 &&
	[ "$(ls "$work/o/hf")" = "$(printf 'config.json\nmodel.safetensors')" ] ||
	{ echo "FAIL hf fp32 is not the checkpoint's weights and config"; fail=1; }
check hf-bf16 0 "$strata" export --ckpt "$work/ck" --out "$work/o/hf16" --dtype bf16
check llmc 0 "$strata" export --ckpt "$work/ck" --out "$work/o/m.bin" --format llmc
check llmc-bf16 0 "$strata" export --ckpt "$work/ck" --out "$work/o/m16.bin" --format llmc --dtype bf16
# a Hugging Face directory as the source: bf16 back to fp32
check from-hf 0 "$strata" export --ckpt "$work/o/hf16" --out "$work/o/hf32"
python3 - "$work" <<'PY' || fail=1
import json, struct, sys
import sftools
w = sys.argv[1]
st_read = sftools.read
def widen(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]
def rne(x):  # the bf16 nearest x, ties to the even one: by distance, not bit tricks
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    lo = u >> 16  # the bf16 next to x towards zero; lo + 1 the one away from zero
    dl, dh = abs(x - widen(lo)), abs(widen(lo + 1) - x)
    return lo if dl < dh or (dl == dh and lo % 2 == 0) else lo + 1
ck = st_read(f"{w}/ck/latest/model.safetensors")
h16 = st_read(f"{w}/o/hf16/model.safetensors")
h32 = st_read(f"{w}/o/hf32/model.safetensors")
assert list(h16) == list(ck) == list(h32), "names or order differ"
for k, (dt, shape, vals) in ck.items():
    assert dt == "F32" and h16[k][0] == "BF16" and h16[k][1] == shape, (k, h16[k][:2])
    assert h16[k][2] == [rne(x) for x in vals], f"{k}: bf16 is not round-to-nearest-even of P"
    assert h32[k][0] == "F32" and h32[k][2] == [widen(h) for h in h16[k][2]], k
# llm.c's model file, read by the format's definition
cfg = json.load(open(f"{w}/ck/latest/config.json"))
L, C, V, T, NH = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_head"]
Vp = (V + 127) // 128 * 128
assert Vp == 384
order = [("wte.weight", 0, 0), ("wpe.weight", 0, 0), ("ln_1.weight", 1, 0), ("ln_1.bias", 1, 0),
         ("attn.c_attn.weight", 1, 1), ("attn.c_attn.bias", 1, 0),
         ("attn.c_proj.weight", 1, 1), ("attn.c_proj.bias", 1, 0),
         ("ln_2.weight", 1, 0), ("ln_2.bias", 1, 0), ("mlp.c_fc.weight", 1, 1),
         ("mlp.c_fc.bias", 1, 0), ("mlp.c_proj.weight", 1, 1), ("mlp.c_proj.bias", 1, 0),
         ("ln_f.weight", 0, 0), ("ln_f.bias", 0, 0)]
for fname, version, esize in (("m.bin", 3, 4), ("m16.bin", 5, 2)):
    raw = open(f"{w}/o/{fname}", "rb").read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[:8] == (20240326, version, T, V, L, NH, C, Vp), hdr[:8]
    assert not any(hdr[8:]), "header padding is not zero"
    want = []
    for name, per_layer, transpose in order:
        for l in range(L if per_layer else 1):
            dt, shape, vals = ck[f"h.{l}.{name}" if per_layer else name]
            if transpose:  # Conv1D (in, out) -> llm.c (out, in)
                r, c = shape
                vals = [vals[i * c + j] for j in range(c) for i in range(r)]
            if name == "wte.weight":
                vals = vals + [0.0] * ((Vp - V) * C)
            want += vals if esize == 4 else [rne(x) for x in vals]
    body = raw[1024:]
    assert len(body) == len(want) * esize, (fname, len(body), len(want))
    got = struct.unpack("<%d%s" % (len(want), "f" if esize == 4 else "H"), body)
    assert list(got) == want, f"{fname}: a parameter differs from the checkpoint's"
print("ok   hf bf16 rounds to nearest even; hf from hf widens; llmc fp32 and bf16 are llm.c's layout")
PY
# an llm.c model file as the source: back to the checkpoint's bytes
check from-llmc 0 "$strata" export --ckpt "$work/o/m.bin" --out "$work/o/back"
check from-llmc-bf16 0 "$strata" export --ckpt "$work/o/m16.bin" --out "$work/o/back16" --dtype bf16
check llmc-to-llmc 0 "$strata" export --ckpt "$work/o/m.bin" --out "$work/o/m2.bin" --format llmc
cmp -s "$work/o/back/model.safetensors" "$work/ck/latest/model.safetensors" &&
	same_config "$work/o/back/config.json" "$work/ck/latest/config.json" float32 &&
	cmp -s "$work/o/back16/model.safetensors" "$work/o/hf16/model.safetensors" &&
	cmp -s "$work/o/m2.bin" "$work/o/m.bin" ||
	{ echo "FAIL llm.c file -> hf is not the checkpoint's weights"; fail=1; }
head -c 1000 "$work/o/m.bin" >"$work/short.bin"
head -c 5000 "$work/o/m.bin" >"$work/cut.bin"
check llmc-short 2 "$strata" export --ckpt "$work/short.bin" --out "$work/o/x"
check llmc-cut 2 "$strata" export --ckpt "$work/cut.bin" --out "$work/o/x"
check not-llmc 2 "$strata" export --ckpt "$data" --out "$work/o/x"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(4); f.write((4).to_bytes(4, "little"))' "$work/cut.bin"
check llmc-version 2 "$strata" export --ckpt "$work/cut.bin" --out "$work/o/x"
[ ! -e "$work/o/x" ] || { echo "FAIL a refused llm.c source wrote --out"; fail=1; }

# --init and eval take an llm.c file (and a checkpoint directory) as they
# take a Hugging Face one: the same numbers
ev32() { "$strata" eval --data "$data" --batch 2 --seq 32 --batches 3 --precision fp32 "$@" 2>&1; }
if [ "$(ev32 --ckpt "$work/o/m.bin")" != "$(ev32 --ckpt "$work/ck")" ]; then
	echo "FAIL eval of the llm.c file differs from the checkpoint's"; fail=1
fi
tr2() { # OUT INIT: two steps from INIT
	"$strata" train --model layers=2,dim=96,heads=3,vocab=300,ctx=64 --seq 32 --batch 2 \
		--data "$data" --steps 2 --seed 3 --init "$2" --metrics "$work/$1.jsonl" >/dev/null 2>&1 ||
		{ echo "FAIL train --init $2"; fail=1; }
	cut -d, -f1-3 "$work/$1.jsonl"
}
a=$(tr2 i1 "$work/ck/latest/model.safetensors") b=$(tr2 i2 "$work/o/m.bin") c=$(tr2 i3 "$work/ck")
if [ -z "$a" ] || [ "$a" != "$b" ] || [ "$a" != "$c" ]; then
	echo "FAIL --init from the llm.c file or the checkpoint directory trains differently"; fail=1
else
	echo "ok   --init from model.safetensors, the llm.c file and the checkpoint directory: the same steps"
fi
for src in "$work/o/m.bin" "$work/o/hf" "$work/o/hf/model.safetensors"; do # its config says 2 layers
	quiet_refusals=0 check "init-other-model ${src#$work/}" 2 "$strata" train \
		--model layers=1,dim=96,heads=3,vocab=300,ctx=64 --seq 32 --data "$data" --steps 1 --init "$src"
	grep -q "not the model --model gives" "$work/err" || { echo "FAIL: not refused as another model"; fail=1; }
done
# a directory with model.safetensors alone: its tensors' shapes are what is checked
mkdir "$work/bare" && cp "$work/o/hf/model.safetensors" "$work/bare/"
d=$(tr2 i4 "$work/bare")
[ "$d" = "$a" ] || { echo "FAIL --init from a directory with model.safetensors alone"; fail=1; }

# strata reads the exports: the same losses as the checkpoint
ev() { "$strata" eval --data "$data" --batch 2 --seq 32 --batches 3 "$@" 2>&1; }
a=$(ev --ckpt "$work/ck" --precision fp32) b=$(ev --ckpt "$work/o/hf" --precision fp32)
c=$(ev --ckpt "$work/ck") d=$(ev --ckpt "$work/o/hf16" --precision fp32)
if [ "$a" != "$b" ] || [ "$c" != "$d" ] || [ "$a" = "$c" ] || [ -z "${a##*error*}" ]; then
	echo "FAIL eval of the exports: ck fp32 '$a' hf '$b'; ck bf16 '$c' hf16 '$d'"; fail=1
else
	echo "ok   eval: export fp32 = checkpoint fp32 ($a); export bf16 = checkpoint bf16 ($c)"
fi

# a damaged checkpoint is refused before anything is written
rm -rf "$work/o"/*
cp -r "$work/ck" "$work/ckbad"
flip() { # FILE OFFSET: invert one byte
	python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0xff]))' "$1" "$2"
}
flip "$work/ckbad/latest/model.safetensors" 3000
check damaged 2 "$strata" export --ckpt "$work/ckbad" --out "$work/o/x"
grep -q "checksum mismatch" "$work/err" || { echo "FAIL damaged: not a checksum message"; fail=1; }
quiet_refusals=0 check init-damaged 2 "$strata" train --model layers=2,dim=96,heads=3,vocab=300,ctx=64 --seq 32 \
	--data "$data" --steps 1 --init "$work/ckbad"
grep -q "checksum mismatch" "$work/err" || { echo "FAIL init-damaged: not a checksum message"; fail=1; }
nothing_left damaged
# a Hugging Face directory with a tensor of the wrong shape (the last block's)
python3 - "$work" <<'PY' || fail=1
import os, sys
import sftools
w = sys.argv[1]
os.makedirs(f"{w}/badhf")
t = sftools.read(f"{w}/ck/latest/model.safetensors")
dtype, shape, vals = t["h.1.mlp.c_fc.bias"]
t["h.1.mlp.c_fc.bias"] = (dtype, [2, shape[0] // 2], vals)
sftools.write(f"{w}/badhf/model.safetensors", t)
open(f"{w}/badhf/config.json", "w").write(open(f"{w}/ck/latest/config.json").read())
PY
check wrong-shape 2 "$strata" export --ckpt "$work/badhf" --out "$work/o/x"
check wrong-shape-llmc 2 "$strata" export --ckpt "$work/badhf" --out "$work/o/x.bin" --format llmc
nothing_left wrong-shape

# a Hugging Face file as transformers saves one: "transformer." names, F16,
# lm_head and mask buffers besides; an untied head is refused
python3 - "$work" <<'PY' || fail=1
import json, os, sys
import sftools
w = sys.argv[1]
tensors = {}
for k, (dtype, shape, vals) in sftools.read(f"{w}/ck/latest/model.safetensors").items():
    tensors["transformer." + k] = ("F16", shape, vals)  # packed as F16: rounded to nearest
    if k == "wte.weight":  # transformers also saves the tied head
        tensors["lm_head.weight"] = ("F16", shape, vals)
cfg = json.load(open(f"{w}/ck/latest/config.json"))
for d, tied in (("tf", True), ("untied", False)):
    os.makedirs(f"{w}/{d}")
    sftools.write(f"{w}/{d}/model.safetensors", tensors)
    json.dump(dict(cfg, tie_word_embeddings=tied, architectures=["GPT2LMHeadModel"]),
              open(f"{w}/{d}/config.json", "w"))
PY
check from-transformers 0 "$strata" export --ckpt "$work/tf" --out "$work/o/tf32/"
check untied 2 "$strata" export --ckpt "$work/untied" --out "$work/o/u"
python3 - "$work" <<'PY' || fail=1
import sys
import sftools
w = sys.argv[1]
src = sftools.read(f"{w}/tf/model.safetensors")
got = sftools.read(f"{w}/o/tf32/model.safetensors")
assert sorted("transformer." + k for k in got) == sorted(k for k in src if k != "lm_head.weight")
for k, (dtype, shape, vals) in got.items():
    assert dtype == "F32" and vals == src["transformer." + k][2], k  # F16 widened exactly
print("ok   a transformers-style F16 file exports as the same values in F32")
PY
rm -rf "$work/o"/*

# a write that fails halfway (the file size limit): exit 1, nothing left
for fmt in hf llmc; do
	( trap '' XFSZ; ulimit -f 64; exec "$strata" export --ckpt "$work/ck" --out "$work/o/big" --format $fmt ) \
		>"$work/out" 2>"$work/err"
	rc=$?
	if [ $rc != 1 ] || [ "$(wc -l <"$work/err")" != 1 ]; then
		echo "FAIL write-fails-$fmt: exit $rc, want 1 and one line"; cat "$work/err"; fail=1
	else
		echo "ok   write-fails-$fmt $(cat "$work/err")"
	fi
	nothing_left "write-fails-$fmt"
done

# SIGTERM while a larger model is written: the temporary goes, then the signal
# ends the run as it would have
python3 - "$work" <<'PY' || fail=1
import json, os, sys
import sftools
w = sys.argv[1]
L, C, V, T = 1, 768, 50257, 64
shapes = {"wte.weight": [V, C], "wpe.weight": [T, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for k, s in (("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [C, 3 * C]),
             ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]),
             ("attn.c_proj.bias", [C]), ("ln_2.weight", [C]), ("ln_2.bias", [C]),
             ("mlp.c_fc.weight", [C, 4 * C]), ("mlp.c_fc.bias", [4 * C]),
             ("mlp.c_proj.weight", [4 * C, C]), ("mlp.c_proj.bias", [C])):
    shapes[f"h.0.{k}"] = s
os.makedirs(f"{w}/large")
sftools.write(f"{w}/large/model.safetensors", {k: ("F32", s, None) for k, s in shapes.items()})
json.dump({"n_layer": L, "n_embd": C, "n_head": 12, "vocab_size": V, "n_positions": T},
          open(f"{w}/large/config.json", "w"))
PY
python3 - "$strata" "$work" <<'PY' || fail=1
import os, signal, subprocess, sys, time
strata, w = sys.argv[1:3]
o = f"{w}/o"
def writing(fmt):  # the export has begun to write its temporary
    for e in os.listdir(o):
        p = os.path.join(o, e)
        if e.startswith("sig.tmp."):
            if fmt == "llmc" and os.path.getsize(p) > 1024:
                return True
            if fmt == "hf" and os.path.isdir(p) and os.listdir(p):
                return True
    return False
bad = False
for fmt in ("hf", "llmc"):
    pr = subprocess.Popen([strata, "export", "--ckpt", f"{w}/large", "--out", f"{o}/sig",
                           "--format", fmt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while pr.poll() is None and not writing(fmt) and time.monotonic() - t0 < 60:
        time.sleep(0.0005)
    if pr.poll() is None:
        pr.send_signal(signal.SIGTERM)
    rc = pr.wait()
    left = os.listdir(o)
    if rc == 0:
        print(f"note sigterm-{fmt}: the export finished before SIGTERM came; not checked this time")
        for e in left:
            subprocess.run(["rm", "-rf", os.path.join(o, e)])
    elif rc != -signal.SIGTERM or left:
        print(f"FAIL sigterm-{fmt}: exit {rc}, want SIGTERM's; left {left}")
        bad = True
    else:
        print(f"ok   sigterm-{fmt}: ended by SIGTERM while writing, nothing left")
sys.exit(1 if bad else 0)
PY
exit $fail
