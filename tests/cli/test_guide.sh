#!/usr/bin/env bash
# docs/finetune.md, the fine-tuner's guide, run as it is written: every
# ```sh block of the page, read from the page itself (each marked by a
# "<!-- guide: NAME -->" line before it), in the page's order, in one work
# directory, on a small model. The first block (setup) sets the variables
# the others use: the test checks that it sets exactly the names set
# here, and sets them to small values instead (a two-layer
# LlamaForCausalLM with Llama 3's real tokenizer and chat template, made
# with tests/ckpt/hfdir.py; a few synthetic conversations; the cpu device
# with small budgets). Every other block runs verbatim, each command in
# this shell (so a variable one block sets is there for the next), with
# `strata` and `mpirun` on PATH naming the build's binary and
# tests/mpi-run. After each block, check_NAME checks what it made (not only
# its exit status): a block without its check, or a check without its
# block, fails the test, so page and test cannot drift apart.
#   tokenize  the shard against the JSONL: documents, BOS, the mask's runs
#             (one per assistant message, each ending with <|eot_id|>),
#             the counts printed
#   plan      the model's line against config.json
#   train     (stopped by SIGTERM after 3 steps) the stop line; and the
#             same block run uninterrupted in another directory: val_loss
#             in the progress lines and the metrics, best.json the lowest
#   best      info shows best; eval of ck/best = its val_loss
#   resume    = the uninterrupted run: metrics, best.json, model and
#             optimizer bytes
#   extend    the added steps at LR / 10, with their val_loss
#   export    generate continues the prompt; config.json (shape, special
#             tokens, torch_dtype), generation_config.json, tokenizer files;
#             the bf16 weights = ck/best's rounded (python3 with torch)
#   ranks     2 ranks = the uninterrupted 1-rank run, bit for bit (skipped,
#             saying so, without mpirun)
# Exit 77, saying why, without the npm test data (tools/quickstart
# test-data) or a python3 with torch.
#   test_guide.sh STRATA SOURCE_ROOT
# shellcheck disable=SC2317,SC2034 # check_ functions called by name; variables the blocks use
set -u
strata=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") root=$(cd "$2" && pwd)
doc=$root/docs/finetune.md
tok=$root/.testdata/npm/tokenizer-llama3/package/models
[ -f "$tok/tokenizer_config.json" ] ||
	{ echo "SKIP: $tok/tokenizer_config.json is not there: run tools/quickstart test-data"; exit 77; }
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-guide-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$root/tests/cli/check.sh"
need_torch
export PYTHONPATH="$root/tests/ckpt${PYTHONPATH:+:$PYTHONPATH}" # hfdir.py
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} ST_QUIET=1

# strata and mpirun as the page names them; strata records its pid, so
# that the test can stop the run the page stops with Ctrl-C
mkdir "$work/bin" "$work/nvme"
cat >"$work/bin/strata" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$work/strata.pid"
exec "$strata" "\$@"
EOF
cat >"$work/bin/mpirun" <<EOF
#!/usr/bin/env bash
[ "\$1" = -np ] || { echo "the guide's mpirun: -np N first" >&2; exit 2; }
n=\$2
shift 2
[ "\$1" = strata ] && shift && set -- "$work/bin/strata" "\$@"
PATH=\${PATH#"$work/bin:"} exec timeout 600 "$root/tests/mpi-run" "\$n" "\$@"
EOF
chmod +x "$work/bin/strata" "$work/bin/mpirun"
export PATH=$work/bin:$PATH

# --- the page's blocks, in order: blocks/NN-NAME ---
mkdir "$work/blocks"
awk -v dir="$work/blocks" '
	/^<!-- guide: [a-z]+ -->$/ { name = $3; want = 1; next }
	want && /^```sh$/ { n++; f = sprintf("%s/%02d-%s", dir, n, name); inblk = 1; want = 0; next }
	want { print "FAIL the mark of " name " is not right before a ```sh block"; exit 1 }
	/^```sh/ && !inblk { print "FAIL a ```sh block without a <!-- guide: NAME --> mark (line " NR ")"; exit 1 }
	inblk && /^```$/ { inblk = 0; close(f); next }
	inblk { print > f }
' "$doc" || fail=1
names=$(cd "$work/blocks" && printf '%s\n' [0-9]* | sed 's/^[0-9]*-//')
[ -n "$names" ] || { echo "FAIL no guide blocks in $doc"; exit 1; }
echo "ok   the guide's blocks: $(echo "$names" | tr '\n' ' ')"

# run_block NAME LOG: the block's commands (a line ending in \ goes on) in
# this shell, from the current directory, output in LOG; stops at the
# first that fails, returning its status
run_block() {
	local cmd='' line rc
	: >"$2"
	while IFS= read -r line; do
		cmd+=$line
		case $line in *\\) cmd=${cmd%\\}; continue ;; esac
		echo "\$ $cmd" >>"$2"
		eval "$cmd" >>"$2" 2>&1
		rc=$?
		[ $rc = 0 ] || return $rc
		cmd=
	done <"$work/blocks/"[0-9][0-9]-"$1"
	return 0
}

# --- the inputs: the model directory and the conversations ---
python3 - "$work/Llama-tiny" "$tok" <<'PY' || { echo "FAIL writing the model"; exit 1; }
import json, os, shutil, sys, torch
import hfdir
d, tok = sys.argv[1:]
os.mkdir(d)
L, C, H, K, F, V, T = 2, 64, 4, 2, 128, 128256, 128
c = hfdir.llama_config(L, C, H, K, F, V, T, tied=True, theta=500000.0)
c.update(bos_token_id=128000, eos_token_id=128009)
json.dump(c, open(f"{d}/config.json", "w"), indent=2)
hfdir.write_sharded(d, hfdir.llama_tensors(L, C, H, K, F, V, seed=1, dtype=torch.bfloat16,
                                           tied=True, theta=500000.0), 3 << 20,
                    metadata={"format": "pt"})
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", d)
PY
mkdir "$work/g" "$work/ref"
python3 - "$work/g" <<'PY'
import json, random, sys
r = random.Random(7)
def conv():
    m = [{"role": "system", "content": "You add small numbers."}] if r.random() < 0.5 else []
    for _ in range(r.choice((1, 1, 2))):
        a, b = r.randrange(10), r.randrange(10)
        m += [{"role": "user", "content": f"What is {a} plus {b}?"},
              {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]
    return json.dumps({"messages": m})
for name, n in (("chats.jsonl", 120), ("held.jsonl", 24)):
    open(f"{sys.argv[1]}/{name}", "w").write("".join(conv() + "\n" for _ in range(n)))
PY

# --- setup: the page's names, the test's values ---
doc_vars=$(grep -o '^[A-Z_]*=\|  *[A-Z_]*=' "$work/blocks/"[0-9][0-9]-setup | tr -d ' =' | sort)
set_vars() {
	MODEL=$work/Llama-tiny
	CHATS=chats.jsonl HELD=held.jsonl
	SEQ=64 BATCH=2
	STEPS=12 EVERY=4 LR=1e-3
	MEM="--device cpu --gpu-mem 256M --host-mem 512M --nvme $work/nvme"
}
test_vars=$(declare -f set_vars | grep -o '^ *[A-Z_]*=\|  *[A-Z_]*=' | tr -d ' =' | sort)
check_setup() {
	if [ "$doc_vars" = "$test_vars" ]; then
		echo "ok   setup: the page sets $(echo $doc_vars)"
	else
		echo "FAIL setup: the page sets $(echo $doc_vars), the test $(echo $test_vars)"; fail=1
	fi
	set_vars
}

jsonl() { # FILE: the numbers of each metrics line (no timing)
	sed 's/,"tokens_per_s".*//' "$1"
}

check_tokenize() {
	run_block tokenize "$work/tokenize.log" || { echo "FAIL tokenize"; tail -3 "$work/tokenize.log"; fail=1; return; }
	python3 - train.bin "$CHATS" train.txt "$work/tokenize.log" <<'PY' || fail=1
import json, re, struct, sys
shard, chats, txt, log = sys.argv[1:]
raw = open(shard, "rb").read()
h = struct.unpack("<256i", raw[:1024])
magic, n, flags, docs = h[0], h[2], h[4], h[7]
assert magic == 20240801 and h[3] == 0x41525453 and flags == 3, (magic, h[3], flags)
ids = struct.unpack(f"<{n}I", raw[1024:1024 + 4 * n])
mask = raw[1024 + 4 * n:1024 + 5 * n]
off = 1024 + 5 * n
off += -off % 8
starts = struct.unpack(f"<{docs}Q", raw[off:off + 8 * docs])
assert len(raw) == off + 8 * docs, (len(raw), off, docs)
convs = [json.loads(l)["messages"] for l in open(chats)]
replies = sum(m["role"] == "assistant" for c in convs for m in c)
assert docs == len(convs), (docs, len(convs))
assert all(ids[s] == 128000 and mask[s] == 0 for s in starts), "a document without <|begin_of_text|>"
runs = [m.end() - 1 for m in re.finditer(rb"\x01+", mask)]
assert len(runs) == replies, (len(runs), replies)
assert all(ids[e] == 128009 for e in runs), "a masked run not ending with <|eot_id|>"
line = [l for l in open(log) if "to train.bin" in l][0]
want = f"tokenize: {n} tokens (uint32) from {len(convs)} conversations"
assert line.startswith(want) and line.rstrip().endswith(f"; {sum(mask)} tokens in the loss mask"), line
assert len(open(txt).readlines()) == len(convs)
print(f"ok   tokenize: {n} tokens, {docs} conversations, {sum(mask)} in the mask, {replies} replies")
PY
	grep -q "to val.bin" "$work/tokenize.log" || { echo "FAIL no val.bin line"; fail=1; }
}

check_plan() {
	run_block plan "$work/plan.log" || { echo "FAIL plan"; tail -3 "$work/plan.log"; fail=1; return; }
	grep -q "^LLaMA, 2 layers, dim 64, 4 heads (2 kv, head dim 16), ffn 128, vocab 128256, ctx 128," \
		"$work/plan.log" && echo "ok   plan: the model of $MODEL/config.json" ||
		{ echo "FAIL plan: $(grep -m1 LLaMA "$work/plan.log")"; fail=1; }
}

# the run the page stops with Ctrl-C: SIGTERM once 3 steps are done
stop_after() { # LOG STEPS
	local pid=
	while :; do
		[ -z "$pid" ] && [ -s "$work/strata.pid" ] && pid=$(cat "$work/strata.pid")
		[ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && return
		[ -n "$pid" ] && [ "$(grep -c '^step  *[0-9]*/' "$1")" -ge "$2" ] && break
		sleep 0.05
	done
	kill -TERM "$pid"
}
check_train() {
	# uninterrupted, in another directory: the reference
	(cd "$work/ref" && ln -s ../g/train.bin ../g/val.bin . && run_block train "$work/ref.log") ||
		{ echo "FAIL train (reference)"; tail -3 "$work/ref.log"; fail=1; }
	grep -q "^step  *$EVERY/$STEPS | epoch [0-9.]* | loss [0-9.]* | val_loss [0-9.]* |" "$work/ref.log" &&
		grep -q "^best so far: step [0-9]*, val_loss" "$work/ref.log" ||
		{ echo "FAIL train: no val_loss or best line"; grep "^step" "$work/ref.log" | head -3; fail=1; }
	python3 - "$work/ref" "$STEPS" "$EVERY" <<'PY' || fail=1
import json, os, sys
d, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{d}/train.jsonl")]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
v = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
assert sorted(v) == list(range(every, steps + 1, every)), v
best = min(v, key=v.get)
b = json.load(open(f"{d}/ck/best.json"))
assert b == {"checkpoint": "step-%06d" % best, "step": best, "val_loss": v[best]}, (b, v)
assert os.path.isdir(f"{d}/ck/best") and os.readlink(f"{d}/ck/best") == "step-%06d" % best
assert open(f"{d}/ck/tokenizer.json", "rb").read() == open(f"{d}/../Llama-tiny/tokenizer.json", "rb").read()
print(f"ok   train: val_loss at {sorted(v)}, the best at step {best} ({v[best]}), the tokenizer in ck")
PY
	# the page's run, stopped after 3 steps as by Ctrl-C (in this shell:
	# what the block sets is there for the next ones)
	rm -f "$work/strata.pid"
	stop_after "$work/train.log" 3 &
	local stopper=$! rc
	run_block train "$work/train.log"
	rc=$?
	wait $stopper
	# the line is the resume block's command: RUN's flags, which a
	# checkpoint does not keep, repeated in their order
	if [ $rc = 130 ] && grep -qxF "strata: stopped after step $(sed -n \
		's/^strata: stopped after step \([0-9]*\),.*/\1/p' "$work/train.log"), saved in ck (go on with: strata train --resume ck --metrics train.jsonl $RUN)" \
		"$work/train.log"; then
		echo "ok   train stopped: $(grep '^strata: stopped' "$work/train.log")"
	else
		echo "FAIL train stop: exit $rc"; tail -3 "$work/train.log"; fail=1
	fi
}

check_best() {
	run_block best "$work/best.log" || { echo "FAIL best"; tail -3 "$work/best.log"; fail=1; return; }
	local b v
	b=$(python3 -c 'import json; print(json.load(open("ck/best.json"))["checkpoint"])')
	v=$(python3 -c 'import json; print("%.6f" % json.load(open("ck/best.json"))["val_loss"])')
	grep -q "(best -> $b, val_loss " "$work/best.log" &&
		grep -qF "tokenizer: ck/tokenizer.json (byte-level BPE, 128256 ids)" "$work/best.log" &&
		grep -q "^loss $v over [0-9]* batches" "$work/best.log" &&
		echo "ok   best: info shows $b and the tokenizer, eval of ck/best gives its val_loss $v" ||
		{ echo "FAIL best: $b $v"; cat "$work/best.log"; fail=1; }
}

check_resume() {
	run_block resume "$work/resume.log" || { echo "FAIL resume"; tail -3 "$work/resume.log"; fail=1; return; }
	grep -q "resumed from .* at step" "$work/resume.log" || { echo "FAIL resume: no resumed line"; fail=1; }
	local s=ck/step-$(printf %06d "$STEPS")
	if [ "$(jsonl train.jsonl)" = "$(jsonl "$work/ref/train.jsonl")" ] &&
		cmp -s ck/best.json "$work/ref/ck/best.json" &&
		cmp -s "$s/model.safetensors" "$work/ref/$s/model.safetensors" &&
		cmp -s "$s/optimizer.safetensors" "$work/ref/$s/optimizer.safetensors"; then
		echo "ok   stopped and resumed = uninterrupted: metrics, best.json, model and optimizer bytes"
	else
		echo "FAIL resumed differs from the uninterrupted run"
		diff <(jsonl "$work/ref/train.jsonl") <(jsonl train.jsonl) | head -4; fail=1
	fi
}

check_extend() {
	run_block extend "$work/extend.log" || { echo "FAIL extend"; tail -3 "$work/extend.log"; fail=1; return; }
	python3 - train.jsonl "$STEPS" "$EVERY" "$LR" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps, every, lr = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
m = steps * 3 // 2
assert [r["step"] for r in rows] == list(range(1, m + 1)), [r["step"] for r in rows]
added = rows[steps:]
assert all(abs(r["lr"] - lr / 10) <= 1e-6 * lr for r in added), [r["lr"] for r in added]
assert [r["step"] for r in added if "val_loss" in r] == [s for s in range(steps + 1, m + 1) if s % every == 0 or s == m]
print(f"ok   extend: steps {steps + 1}-{m} at lr {lr / 10:g}")
PY
}

check_export() {
	run_block export "$work/export.log" || { echo "FAIL export"; tail -3 "$work/export.log"; fail=1; return; }
	grep -qF "What is 2 plus 3?" <(grep -v "^\\$ " "$work/export.log") || { echo "FAIL generate: $(head -3 "$work/export.log")"; fail=1; }
	python3 - my-model "$MODEL" ck/best <<'PY' || fail=1
import json, os, sys
import hfdir
out, src, ck = sys.argv[1:]
c, s = (json.load(open(f"{d}/config.json")) for d in (out, src))
assert c["architectures"] == ["LlamaForCausalLM"], c
for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rope_theta", "rms_norm_eps", "tie_word_embeddings"):
    assert c[k] == s[k], (k, c[k], s[k])
for k in ("bos_token_id", "eos_token_id"):
    assert c[k] == s[k], (k, c[k], s[k])
assert c["torch_dtype"] == "bfloat16", c["torch_dtype"]
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert open(f"{out}/{f}", "rb").read() == open(f"{src}/{f}", "rb").read(), f
g = json.load(open(f"{out}/generation_config.json"))
assert g["bos_token_id"] == s["bos_token_id"] and g["eos_token_id"] == s["eos_token_id"], g
import torch
def tensors(d):  # {name: torch tensor} of every .safetensors file in d
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            t, _ = hfdir.read_safetensors(f"{d}/{f}")
            for k, (dt, shape, raw) in t.items():
                ty = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dt]
                out[k] = torch.frombuffer(bytearray(raw), dtype=ty).reshape(shape)
    return out
w, m, names = tensors(out), tensors(ck), {k: list(v.shape) for k, v in tensors(src).items()}
if s["tie_word_embeddings"]:
    names.pop("lm_head.weight", None)
    w.pop("lm_head.weight", None)
assert {k: list(v.shape) for k, v in w.items()} == names, (sorted(w), sorted(names))
for k, v in w.items():
    assert v.dtype == torch.bfloat16, (k, v.dtype)
    assert torch.equal(v, m[k].to(torch.bfloat16)), k
print(f"ok   export: config.json, generation_config.json, tokenizer files; {len(w)} bf16 tensors = ck/best's rounded")
PY
}

check_ranks() {
	"$root/tests/mpi-run" 1 true >/dev/null 2>&1
	if [ $? = 77 ]; then echo "SKIP ranks: mpirun not found (Debian: apt-get install openmpi-bin)"; return; fi
	run_block ranks "$work/ranks.log" || { echo "FAIL ranks"; tail -5 "$work/ranks.log"; fail=1; return; }
	local s=step-$(printf %06d "$STEPS")
	if [ -s train2.jsonl ] && [ "$(jsonl train2.jsonl)" = "$(jsonl "$work/ref/train.jsonl")" ] &&
		cmp -s ck2/best.json "$work/ref/ck/best.json" &&
		cmp -s "ck2/$s/model.safetensors" "$work/ref/ck/$s/model.safetensors" &&
		cmp -s "ck2/$s/optimizer.safetensors" "$work/ref/ck/$s/optimizer.safetensors"; then
		echo "ok   2 ranks = 1 rank: metrics, best.json, model and optimizer bytes"
	else
		echo "FAIL 2 ranks differ from 1"; diff <(jsonl "$work/ref/train.jsonl") <(jsonl train2.jsonl) | head -4
		tail -3 "$work/ranks.log"; fail=1
	fi
}

# --- each block, in the page's order, and its check ---
for name in $names; do
	declare -F "check_$name" >/dev/null || { echo "FAIL the page's block '$name' has no check in $0"; fail=1; continue; }
done
for f in $(declare -F | sed -n 's/^declare -f check_//p'); do
	echo "$names" | grep -qx "$f" || { echo "FAIL check_$f: no such block in $doc"; fail=1; }
done
cd "$work/g" || exit 1
for name in $names; do
	declare -F "check_$name" >/dev/null && "check_$name"
done
[ $fail = 0 ] && echo PASS
exit $fail
