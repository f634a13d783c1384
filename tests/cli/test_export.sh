#!/usr/bin/env bash
# strata export as a user meets it. hf: fp32 is the checkpoint's weights file
# byte for byte; bf16 is each value rounded to nearest even (checked by a
# rounding written here) and strata eval reads it to the same loss as the
# checkpoint with bf16 weights. llmc: a reader of llm.c's format written here
# (header, order, (out, in) matrices, zero-padded vocabulary) finds every
# checkpoint tensor. A Hugging Face directory (bf16, "transformer." names)
# exports too. Bad input, a damaged checkpoint and a tensor of the wrong shape
# (found before anything is written): exit 2, nothing left.
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-export-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
data=/usr/share/common-licenses/GPL-3

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

check hf 0 "$strata" export --ckpt "$work/ck" --out "$work/o/hf"
cmp -s "$work/o/hf/model.safetensors" "$work/ck/latest/model.safetensors" &&
	cmp -s "$work/o/hf/config.json" "$work/ck/latest/config.json" &&
	[ "$(ls "$work/o/hf")" = "$(printf 'config.json\nmodel.safetensors')" ] ||
	{ echo "FAIL hf fp32 is not the checkpoint's weights and config"; fail=1; }
check hf-bf16 0 "$strata" export --ckpt "$work/ck" --out "$work/o/hf16" --dtype bf16
check llmc 0 "$strata" export --ckpt "$work/ck" --out "$work/o/m.bin" --format llmc
check llmc-bf16 0 "$strata" export --ckpt "$work/ck" --out "$work/o/m16.bin" --format llmc --dtype bf16
# a Hugging Face directory as the source: bf16 back to fp32
check from-hf 0 "$strata" export --ckpt "$work/o/hf16" --out "$work/o/hf32"
python3 - "$work" <<'PY' || fail=1
import json, struct, sys
w = sys.argv[1]
def st_read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b = raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        cnt = len(b) // (4 if v["dtype"] == "F32" else 2)
        fmt = "<%d%s" % (cnt, "f" if v["dtype"] == "F32" else "H")
        out[k] = (v["dtype"], v["shape"], list(struct.unpack(fmt, b)))
    return out
def rne(x):  # fp32 -> bf16 bits, round to nearest even
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
def widen(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]
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
printf '\x55' | dd of="$work/ckbad/latest/model.safetensors" bs=1 seek=3000 conv=notrunc 2>/dev/null
check damaged 2 "$strata" export --ckpt "$work/ckbad" --out "$work/o/x"
grep -q "checksum mismatch" "$work/err" || { echo "FAIL damaged: not a checksum message"; fail=1; }
nothing_left damaged
# a Hugging Face directory with a tensor of the wrong shape (the last block's)
python3 - "$work" <<'PY' || fail=1
import json, os, struct, sys
w = sys.argv[1]
os.makedirs(f"{w}/badhf")
raw = open(f"{w}/ck/latest/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
hdr = json.loads(raw[8:8 + n])
hdr["h.1.mlp.c_fc.bias"]["shape"] = [2, hdr["h.1.mlp.c_fc.bias"]["shape"][0] // 2]
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(f"{w}/badhf/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
open(f"{w}/badhf/config.json", "w").write(open(f"{w}/ck/latest/config.json").read())
PY
check wrong-shape 2 "$strata" export --ckpt "$work/badhf" --out "$work/o/x"
check wrong-shape-llmc 2 "$strata" export --ckpt "$work/badhf" --out "$work/o/x.bin" --format llmc
nothing_left wrong-shape
exit $fail
