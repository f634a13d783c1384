#!/usr/bin/env bash
# strata tokenize, and text through a tokenizer in train / eval / generate,
# on a small byte-level BPE tokenizer.json written here (no test data
# needed): bad input (one line, exit 2, nothing at --out), the shard's
# header and tokens against tok_dump (the library) read back in Python,
# --lines, --bos/--eos, uint32 shards for a vocabulary past 65535, a model
# trained on the shard, eval of the shard and of the text (the same loss),
# generate with --tokenizer and with the tokenizer found beside the
# checkpoint.
#   test_tokenize_cli.sh STRATA TOK_DUMP
set -u
strata=$1 dump=$2
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-tok-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/../cli/check.sh"
data=$work/data.txt
text "$data" 5 the quick brown fox jumps over a lazy dog while strata streams units

# A GPT-2-style tokenizer: the 256 byte symbols, merges for the words of
# the text, <|endoftext|> after each document (TemplateProcessing).
mk_tok() { # DIR [EXTRA_ADDED_ID] [NORMALIZER_JSON]
	mkdir -p "$1"
	python3 - "$1" "${2:-}" "${3:-null}" <<'PY'
import json, sys
d, extra, norm = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
ch = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {ch[b]: b for b in range(256)}
merges = []
def add(a, b):
    merges.append([a, b])
    if a + b not in vocab:
        vocab[a + b] = len(vocab)
for w in "the quick brown fox jumps over lazy dog while strata streams units".split():
    s = [ch[ord(c)] for c in " " + w]
    while len(s) > 1:
        add(s[0], s[1]); s = [s[0] + s[1]] + s[2:]
eot = len(vocab)
added = [{"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
          "rstrip": False, "normalized": False, "special": True}]
if extra:
    added.append({"id": int(extra), "content": "<|far|>", "special": True})
tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
      "normalizer": norm,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                        "use_regex": True},
      "post_processor": {"type": "TemplateProcessing",
                         "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                         "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>",
                                                        "ids": [eot], "tokens": ["<|endoftext|>"]}}},
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                  "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                "byte_fallback": False, "vocab": vocab, "merges": merges}}
json.dump(tj, open(d + "/tokenizer.json", "w"))
json.dump({"eos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False},
          open(d + "/tokenizer_config.json", "w"))
print(eot + 1)
PY
}
V=$(mk_tok "$work/tok")
[ "$V" -gt 256 ] || { echo "FAIL tokenizer: vocabulary $V"; exit 1; }

# shard FILE: "magic version count" and the tokens, one line each
shard() {
	python3 - "$1" <<'PY'
import struct, sys
b = open(sys.argv[1], 'rb').read()
m, v, n = struct.unpack('<3i', b[:12])
w = 4 if m == 20240801 else 2
print(m, v, n)
print(' '.join(str(x) for x in struct.unpack('<%d%s' % (n, 'I' if w == 4 else 'H'), b[1024:1024 + w * n])))
PY
}

check tok-help 0 "$strata" tokenize --help
check tok-no-out 2 "$strata" tokenize --tokenizer "$work/tok" "$data"
check tok-no-tokenizer 2 "$strata" tokenize --tokenizer "$work/nope" --out "$work/x.bin" "$data"
check tok-missing-input 2 "$strata" tokenize --tokenizer "$work/tok" --out "$work/x.bin" "$work/nope.txt"
check tok-bad-flag 2 "$strata" tokenize --frobnicate
check tok-out-dir 2 "$strata" tokenize --tokenizer "$work/tok" --out "$work" "$data"
mkdir -p "$work/badjson" && echo '{"model": {' > "$work/badjson/tokenizer.json"
check tok-bad-json 2 "$strata" tokenize --tokenizer "$work/badjson" --out "$work/x.bin" "$data"
grep -q "not JSON" "$work/err" || { echo "FAIL tok-bad-json: $(cat "$work/err")"; fail=1; }
mk_tok "$work/bert" "" '{"type": "BertNormalizer"}' >/dev/null
check tok-unsupported 2 "$strata" tokenize --tokenizer "$work/bert" --out "$work/x.bin" "$data"
grep -q "normalizer.type: BertNormalizer is not supported" "$work/err" ||
	{ echo "FAIL tok-unsupported names no key: $(cat "$work/err")"; fail=1; }
check tok-bad-bos 2 "$strata" tokenize --tokenizer "$work/tok" --bos '<|nope|>' --out "$work/x.bin" "$data"
: > "$work/empty.txt"
check tok-empty 2 "$strata" tokenize --tokenizer "$work/tok" --bos none --eos none --out "$work/x.bin" "$work/empty.txt"
[ ! -e "$work/x.bin" ] && [ -z "$(ls "$work" | grep '\.tmp\.')" ] ||
	{ echo "FAIL bad input left output behind: $(ls "$work")"; fail=1; }

# the shard holds what the library gives, then <|endoftext|>
check tokenize 0 "$strata" tokenize --tokenizer "$work/tok" --out "$work/data.bin" "$data"
shard "$work/data.bin" > "$work/shard.txt"
"$dump" "$work/tok" "$data" > "$work/lib.txt"
n=$(wc -w < "$work/lib.txt")
if [ "$(head -1 "$work/shard.txt")" != "20240520 1 $n" ] ||
   [ "$(sed -n 2p "$work/shard.txt")" != "$(cat "$work/lib.txt")" ] ||
   [ "$(awk '{print $NF}' "$work/lib.txt")" != "$((V - 1))" ]; then
	echo "FAIL tokenize: shard $(head -1 "$work/shard.txt"), library $n tokens"; fail=1
else
	echo "ok   tokenize: $n tokens, the library's, <|endoftext|> last"
fi
# stdin, --lines (one document per non-empty line), --bos
printf 'the fox\n\nlazy dog\nunits\n' > "$work/lines.txt"
check tok-lines 0 "$strata" tokenize --tokenizer "$work/tok/tokenizer.json" --lines --bos '<|endoftext|>' \
	--eos none --out "$work/lines.bin" - < "$work/lines.txt"
got=$(shard "$work/lines.bin" | sed -n 2p | tr ' ' '\n' | grep -cx "$((V - 1))")
[ "$got" = 3 ] && grep -q "from 3 documents" "$work/out" ||
	{ echo "FAIL tok-lines: $got BOS in $(cat "$work/out")"; fail=1; }
# a vocabulary past 65535: uint32 tokens, llm.c's Llama 3 header
mk_tok "$work/wide" 70000 >/dev/null
printf 'the fox <|far|> dog' > "$work/far.txt"
check tok-uint32 0 "$strata" tokenize --tokenizer "$work/wide" --out "$work/far.bin" "$work/far.txt"
shard "$work/far.bin" > "$work/far.txt.shard"
[ "$(head -1 "$work/far.txt.shard" | cut -d' ' -f1-2)" = "20240801 7" ] &&
	grep -qw 70000 "$work/far.txt.shard" ||
	{ echo "FAIL tok-uint32: $(head -c 200 "$work/far.txt.shard")"; fail=1; }

# added tokens: normalized: true ones match the normalised text (as their
# content normalised), the others the raw text; lstrip/rstrip take the
# white space beside them (Hugging Face's rules)
python3 - "$work/tok" "$work/norm" <<'PY'
import json, os, sys
t = json.load(open(sys.argv[1] + "/tokenizer.json"))
t["normalizer"] = {"type": "Lowercase"}
n = max(a["id"] for a in t["added_tokens"]) + 1
t["added_tokens"] += [
    {"id": n, "content": "<NORM>", "normalized": True, "special": False},
    {"id": n + 1, "content": "<RAW>", "normalized": False, "special": True},
    {"id": n + 2, "content": "<STRIP>", "normalized": False, "special": True,
     "lstrip": True, "rstrip": True}]
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(t, open(sys.argv[2] + "/tokenizer.json", "w"))
print(n)
PY
printf 'a <NORM> b <norm> c <RAW> d <raw> e   <STRIP>   f' > "$work/norm.txt"
nid=$(python3 -c "import json; print(max(a['id'] for a in json.load(open('$work/norm/tokenizer.json'))['added_tokens']) - 2)")
"$dump" "$work/norm" --no-special "$work/norm.txt" > "$work/norm.ids"
got=$(python3 - "$work/norm.ids" "$nid" <<'PY'
import sys
ids = list(map(int, open(sys.argv[1]).read().split()))
n = int(sys.argv[2])
print(ids.count(n), ids.count(n + 1), ids.count(n + 2))
PY
)
case "$got" in "2 1 1") echo "ok   added-normalized: <NORM> twice (normalised), <RAW> once, <STRIP> once";;
	*) echo "FAIL added-normalized: counts $got (want 2 1 1)"; fail=1;; esac
# <STRIP> took the spaces: e and f are encoded as without them
"$dump" "$work/norm" --no-special --decoded "$work/norm.dec" "$work/norm.txt" > /dev/null
grep -q 'e<STRIP>f' "$work/norm.dec" || { echo "FAIL added-strip: $(cat "$work/norm.dec")"; fail=1; }

# train and eval read the uint32 shard: the same text, the ids of the
# small tokenizer (<|far|> is id 70000)
check tok-uint32-data 0 "$strata" tokenize --tokenizer "$work/wide" --out "$work/wide.bin" "$data" "$work/far.txt"
W="--model layers=1,dim=32,heads=2,vocab=70001,ctx=64 --seq 32 --batch 2 --gpu-mem 256M --host-mem 512M"
check train-uint32 0 "$strata" train $W --data "$work/wide.bin" --steps 2 --save "$work/ckw"
check eval-uint32 0 "$strata" eval --ckpt "$work/ckw" --data "$work/wide.bin" --batch 2 --seq 32
grep -q "^loss " "$work/out" || { echo "FAIL eval-uint32: $(cat "$work/out")"; fail=1; }

# invalid UTF-8 is read as Python's errors="replace" reads it (one U+FFFD
# per maximal invalid subsequence, the WHATWG decoder): with a byte-level
# tokenizer without a normalizer, decode(encode(x)) is exactly that, for
# 300 random byte strings biased to UTF-8's lead and continuation bytes
mkdir -p "$work/rnd"
python3 - "$work/rnd" <<'PY'
import random, sys
random.seed(7)
pool = [0x41, 0x20, 0x0a, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0,
        0xe1, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff, 0xbb, 0xbd]
for i in range(300):
    n = random.randint(0, 24)
    open(f"{sys.argv[1]}/{i:03d}", "wb").write(bytes(random.choice(pool) for _ in range(n)))
PY
"$dump" "$work/tok" --no-special --decoded "$work/rnd.dec" "$work"/rnd/* > /dev/null &&
python3 - "$work/rnd.dec" "$work"/rnd/* <<'PY'
import json, sys
dec = open(sys.argv[1], encoding="utf-8").read().split("\n")
bad = [(f, d) for f, d in zip(sys.argv[2:], dec)
       if json.loads(d) != open(f, "rb").read().decode("utf-8", "replace")]
for f, d in bad[:3]:
    print(f"FAIL utf8-replace: {f}: {open(f, 'rb').read()!r} -> {json.loads(d)!r}, Python: "
          f"{open(f, 'rb').read().decode('utf-8', 'replace')!r}")
print(f"ok   utf8-replace: {len(sys.argv) - 2 - len(bad)} of {len(sys.argv) - 2} as Python reads them")
sys.exit(1 if bad else 0)
PY
[ $? = 0 ] || fail=1

# train on the shard, evaluate the shard and the text: the same tokens, the
# same loss; generate through the tokenizer
M="--model layers=2,dim=64,heads=2,vocab=$V,ctx=64 --seq 32 --batch 2"
check train 0 "$strata" train $M --data "$work/data.bin" --steps 3 --save "$work/ck"
check train-too-small 2 "$strata" train --model layers=2,dim=64,heads=2,vocab=256,ctx=64 \
	--seq 32 --data "$work/data.bin" --steps 1
check eval-shard 0 "$strata" eval --ckpt "$work/ck" --data "$work/data.bin" --batch 2 --seq 32
l1=$(grep loss "$work/out")
check eval-text 0 "$strata" eval --ckpt "$work/ck" --tokenizer "$work/tok" --data "$data" --batch 2 --seq 32
l2=$(grep loss "$work/out")
[ -n "$l1" ] && [ "$l1" = "$l2" ] || { echo "FAIL eval: shard '$l1' text '$l2'"; fail=1; }
check gen-no-tokenizer 2 "$strata" generate --ckpt "$work/ck" --prompt "the quick"
check gen-tokenizer 0 "$strata" generate --ckpt "$work/ck" --tokenizer "$work/tok" \
	--prompt "the quick" --tokens 20 --seed 3
case "$(cat "$work/out")" in "the quick"*) ;; *) echo "FAIL gen: $(cat "$work/out")"; fail=1;; esac
cp "$work/tok"/tokenizer*.json "$work/ck/"
check gen-beside 0 "$strata" generate --ckpt "$work/ck" --prompt "the quick" --tokens 20 --seed 3
cp "$work/out" "$work/gen2"
check gen-beside-again 0 "$strata" generate --ckpt "$work/ck" --prompt "the quick" --tokens 20 --seed 3
cmp -s "$work/out" "$work/gen2" || { echo "FAIL gen: not the same twice"; fail=1; }
check eval-beside 0 "$strata" eval --ckpt "$work/ck" --data "$data" --batch 2 --seq 32
[ "$(grep loss "$work/out")" = "$l1" ] || { echo "FAIL eval-beside: $(cat "$work/out")"; fail=1; }
exit $fail
