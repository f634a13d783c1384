#!/usr/bin/env bash
# strata tokenize --format chat and prompt-completion on a byte-level
# tokenizer written here (one token a byte, <|endoftext|> special), so the
# expected tokens, loss mask and document starts are computed in Python
# from the text alone: the shard's extension (hash, flags, mask, starts),
# --text-out, bad lines (one line naming FILE:LINE, exit 2, nothing left),
# the tokenizer's hash in every shard, --out naming an input (refused,
# the input intact), and the OUT.tmp.XXXXXX a kill -9 leaves (removed by
# the next run; one a live process holds is kept).
#   test_tokenize_chat.sh STRATA
set -u
strata=$1
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-tok-chat.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/../cli/check.sh"
export ST_QUIET=1

mk_tok() { # DIR TEMPLATE [MERGE: one, of two byte-level symbols]
	mkdir -p "$1"
	python3 - "$1" "$2" "${3:-}" <<'PY'
import json, sys
d, tpl, merge = sys.argv[1], sys.argv[2], sys.argv[3]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
merges = []
if merge:
    merges = [merge.split(" ")]
    vocab["".join(merges[0])] = 257
tj = {"version": "1.0", "added_tokens": [{"id": 256, "content": "<|endoftext|>",
      "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
      "special": True}], "normalizer": None,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                        "use_regex": True},
      "post_processor": None,
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                  "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                "byte_fallback": False, "vocab": vocab, "merges": merges}}
json.dump(tj, open(d + "/tokenizer.json", "w"))
json.dump({"bos_token": {"content": "<|endoftext|>", "special": True},
           "eos_token": "<|endoftext|>", "chat_template": tpl},
          open(d + "/tokenizer_config.json", "w"))
PY
}
TPL="{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
mk_tok "$work/tok" "$TPL"

cat > "$work/chat.jsonl" <<'J'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello \u00e9!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Ciao"}]}

{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": ""}]}
J
check chat 0 "$strata" tokenize --format chat --tokenizer "$work/tok" --out "$work/chat.bin" \
	--text-out "$work/chat.txt" "$work/chat.jsonl"
cat > "$work/pc.jsonl" <<'J'
{"prompt": "Q: the sky? ", "completion": "blue"}
{"prompt": "", "completion": "x"}
J
check prompt-completion 0 "$strata" tokenize --format prompt-completion --tokenizer "$work/tok" \
	--out "$work/pc.bin" --text-out "$work/pc.txt" "$work/pc.jsonl"
printf 'the fox' > "$work/plain.txt"
check text 0 "$strata" tokenize --tokenizer "$work/tok" --out "$work/text.bin" "$work/plain.txt"

# the expected shards, from the text alone: each byte a token, the
# assistant's content and its <|endoftext|> in the mask (an empty reply:
# its <|endoftext|> alone), one document a line
python3 - "$work" <<'PY' || fail=1
import json, struct, sys
w = sys.argv[1]
EOT = "<|endoftext|>"
def toks(s):  # (ids, in-mask) of text s, m: mask value
    out, i = [], 0
    while i < len(s):
        if s.startswith(EOT, i):
            out.append(256); i += len(EOT)
        else:
            out += list(s[i].encode()); i += 1
    return out
def shard(path):
    b = open(path, "rb").read()
    h = struct.unpack("<9i", b[:36])
    n = h[2]
    ids = list(struct.unpack("<%dH" % n, b[1024:1024 + 2 * n]))
    mask, docs = [], []
    if h[4] & 1:
        mask = list(b[1024 + 2 * n:1024 + 3 * n])
    if h[4] & 2:
        at = (1024 + 3 * n + 7) // 8 * 8
        docs = list(struct.unpack("<%dQ" % h[7], b[at:at + 8 * h[7]]))
        assert len(b) == at + 8 * h[7], "size"
    return h, ids, mask, docs
bad = 0
def want(what, got, exp):
    global bad
    if got != exp:
        print("FAIL %s: got %r\n     want %r" % (what, got, exp)); bad = 1
ids, mask, docs, texts = [], [], [], []
for line in open(w + "/chat.jsonl"):
    if not line.strip():
        continue
    msgs = json.loads(line)["messages"]
    t = EOT
    docs.append(len(ids))
    ids += toks(EOT); mask += [0]
    for m in msgs:
        head = "<%s>" % m["role"]
        ids += toks(head); mask += [0] * len(toks(head))
        if m["role"] == "assistant":
            c = toks(m["content"]) + [256]
            ids += c; mask += [1] * len(c)
            t += head + m["content"] + EOT + "\n"
        else:
            c = toks(m["content"])
            ids += c; mask += [0] * len(c)
            t += head + m["content"] + "\n"
        ids += [10]; mask += [0]
    texts.append(t)
h, gi, gm, gd = shard(w + "/chat.bin")
want("chat header", (h[0], h[1], h[3], h[4], h[7]), (20240520, 1, 0x41525453, 3, len(docs)))
want("chat tokens", gi, ids)
want("chat mask", gm, mask)
want("chat documents", gd, docs)
want("chat --text-out", [json.loads(l) for l in open(w + "/chat.txt")], texts)
ids, mask, docs, texts = [], [], [], []
for line in open(w + "/pc.jsonl"):
    o = json.loads(line)
    docs.append(len(ids))
    p, c = toks(o["prompt"]), toks(o["completion"]) + [256]
    ids += p + c; mask += [0] * len(p) + [1] * len(c)
    texts.append(o["prompt"] + o["completion"])
hp, gi, gm, gd = shard(w + "/pc.bin")
want("pc header", (hp[3], hp[4], hp[7]), (0x41525453, 3, 2))
want("pc tokens", gi, ids)
want("pc mask", gm, mask)
want("pc documents", gd, docs)
want("pc --text-out", [json.loads(l) for l in open(w + "/pc.txt")], texts)
ht, gi, gm, gd = shard(w + "/text.bin")
want("text: hash only, no trailer", (ht[3], ht[4], len(gm), len(gd)), (0x41525453, 0, 0, 0))
want("text: the llm.c size", len(open(w + "/text.bin", "rb").read()), 1024 + 2 * ht[2])
want("one tokenizer, one hash", {(x[5], x[6]) for x in (h, hp, ht)}, {(h[5], h[6])})
if (h[5], h[6]) == (0, 0):
    print("FAIL the hash is 0"); bad = 1
if not bad:
    print("ok   shards: tokens, mask, documents, text-out, hash as computed here")
sys.exit(bad)
PY
# prompt + completion are one text: a token that spans both (" A", a
# merge) is the completion's
mk_tok "$work/tokm" "$TPL" "Ġ A" # Ġ: GPT-2's symbol for the space byte
printf '%s\n' '{"prompt": "Q? ", "completion": "A."}' > "$work/pcm.jsonl"
check pc-merge 0 "$strata" tokenize --format prompt-completion --tokenizer "$work/tokm" \
	--out "$work/pcm.bin" "$work/pcm.jsonl"
python3 - "$work/pcm.bin" <<'PY' || fail=1
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<3i", b[:12])[2]
ids, mask = list(struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])), list(b[1024 + 2 * n:1024 + 3 * n])
want = ([ord("Q"), ord("?"), 257, ord("."), 256], [0, 0, 1, 1, 1])
if (ids, mask) != want:
    print("FAIL pc-merge: %r %r, want %r" % (ids, mask, want)); sys.exit(1)
print("ok   pc-merge: the merged \" A\" counts as the completion's")
PY
# another tokenizer.json (one byte more): another hash
cp -r "$work/tok" "$work/tok2" && echo >> "$work/tok2/tokenizer.json"
check text-tok2 0 "$strata" tokenize --tokenizer "$work/tok2" --out "$work/text2.bin" "$work/plain.txt"
[ "$(od -An -tx4 -j20 -N8 "$work/text.bin")" != "$(od -An -tx4 -j20 -N8 "$work/text2.bin")" ] ||
	{ echo "FAIL the hash does not follow tokenizer.json"; fail=1; }

# bad lines: one line naming FILE:LINE, exit 2, nothing left behind
bad_line() { # NAME FORMAT LINE2 [OPTIONS...]
	local name=$1 fmt=$2 line=$3
	shift 3
	{ head -1 "$work/chat.jsonl"; printf '%s\n' "$line"; } > "$work/bad.jsonl"
	[ "$fmt" = chat ] || { head -1 "$work/pc.jsonl"; printf '%s\n' "$line"; } > "$work/bad.jsonl"
	check "$name" 2 "$strata" tokenize --format "$fmt" --tokenizer "$work/tok" "$@" \
		--out "$work/bad.bin" --text-out "$work/bad.txt" "$work/bad.jsonl" &&
		{ grep -q "bad.jsonl:2" "$work/err" || { echo "FAIL $name: no FILE:LINE"; fail=1; }; }
	[ -z "$(ls "$work" | grep -E '^bad\.(bin|txt)')" ] ||
		{ echo "FAIL $name left $(ls "$work" | grep -E '^bad\.')"; fail=1; }
}
bad_line bad-json chat '{"messages": [}'
bad_line bad-not-object chat '[1, 2]'
bad_line bad-trailing chat '{"messages": [{"role": "user", "content": "a"}]} x'
bad_line bad-no-messages chat '{"msgs": []}'
bad_line bad-empty-messages chat '{"messages": []}'
bad_line bad-no-content chat '{"messages": [{"role": "user"}]}'
bad_line bad-utf8 chat "$(printf '{"messages": [{"role": "user", "content": "\xff"}]}')"
bad_line bad-pc prompt-completion '{"prompt": "a"}'
printf '%s' "{% if messages[0].content == 'boom' %}{{ raise_exception('no boom') }}{% endif %}x" \
	> "$work/raise.jinja"
bad_line bad-raise chat '{"messages": [{"role": "user", "content": "boom"}]}' \
	--chat-template "$work/raise.jinja"
grep -q "no boom" "$work/err" || { echo "FAIL bad-raise: $(cat "$work/err")"; fail=1; }
printf '{{ x' > "$work/syntax.jinja"
check bad-template 2 "$strata" tokenize --format chat --tokenizer "$work/tok" \
	--chat-template "$work/syntax.jinja" --out "$work/bad.bin" "$work/chat.jsonl"
check bad-format 2 "$strata" tokenize --format html --tokenizer "$work/tok" --out "$work/bad.bin" "$work/chat.jsonl"
mkdir -p "$work/notpl" && cp "$work/tok/tokenizer.json" "$work/notpl/"
check no-template 2 "$strata" tokenize --format chat --tokenizer "$work/notpl" --out "$work/bad.bin" "$work/chat.jsonl"
grep -q "chat_template" "$work/err" || { echo "FAIL no-template: $(cat "$work/err")"; fail=1; }

# --out naming an input, also by another path: refused, the input intact
cp "$work/plain.txt" "$work/in.txt" && ln "$work/in.txt" "$work/in-link.txt"
sum=$(md5sum < "$work/in.txt")
check out-is-input 2 "$strata" tokenize --tokenizer "$work/tok" --out "$work/in.txt" "$work/in.txt"
check out-is-input-path 2 "$strata" tokenize --tokenizer "$work/tok" --out "$work/./in-link.txt" "$work/in.txt"
check text-out-is-input 2 "$strata" tokenize --format chat --tokenizer "$work/tok" \
	--out "$work/x.bin" --text-out "$work/chat.jsonl" "$work/chat.jsonl"
[ "$(md5sum < "$work/in.txt")" = "$sum" ] || { echo "FAIL --out X X changed X"; fail=1; }
# nor the tokenizer's own files: tokenizer.json, its chat template
tsum=$(cat "$work/tok/tokenizer.json" "$work/tok/tokenizer_config.json" 2>/dev/null | md5sum)
check out-is-tokenizer 2 "$strata" tokenize --tokenizer "$work/tok" --out "$work/tok/tokenizer.json" "$work/in.txt"
check out-is-tokenizer-file 2 "$strata" tokenize --tokenizer "$work/tok/tokenizer.json" \
	--out "$work/tok/tokenizer.json" "$work/in.txt"
if [ -f "$work/tok/tokenizer_config.json" ]; then
	check out-is-template 2 "$strata" tokenize --format chat --tokenizer "$work/tok" \
		--out "$work/tok/tokenizer_config.json" "$work/chat.jsonl"
fi
[ "$(cat "$work/tok/tokenizer.json" "$work/tok/tokenizer_config.json" 2>/dev/null | md5sum)" = "$tsum" ] ||
	{ echo "FAIL --out over the tokenizer changed it"; fail=1; }

# a tokenize killed with -9 leaves OUT.tmp.XXXXXX; the next run removes it
# once it is older than a minute and no process holds it (each run locks
# its own); one a live process holds stays
mkfifo "$work/fifo"
"$strata" tokenize --tokenizer "$work/tok" --out "$work/k.bin" - < "$work/fifo" &
pid=$!
exec 8>"$work/fifo"
for _ in $(seq 1 600); do # until the temporary exists (or it died)
	ls "$work" | grep -q '^k\.bin\.tmp\.' && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
kill -9 $pid; wait $pid 2>/dev/null
exec 8>&-
stale=$(ls "$work" | grep '^k\.bin\.tmp\.')
[ -n "$stale" ] || { echo "FAIL kill -9 left no temporary"; fail=1; }
touch -d '2 hours ago' "$work/$stale"
: > "$work/k.bin.tmp.LIVE00" && touch -d '2 hours ago' "$work/k.bin.tmp.LIVE00"
exec 9<"$work/k.bin.tmp.LIVE00" && flock -x 9
check stale-tmp 0 "$strata" tokenize --tokenizer "$work/tok" --out "$work/k.bin" "$work/plain.txt"
exec 9<&-
[ ! -e "$work/$stale" ] && [ -e "$work/k.bin.tmp.LIVE00" ] && [ -e "$work/k.bin" ] ||
	{ echo "FAIL stale temporaries: $(ls "$work" | grep '^k\.bin')"; fail=1; }
exit $fail
