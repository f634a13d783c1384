#!/usr/bin/env bash
# What a user meets first (issue 34, part 4): the messages of a missing
# config.json under --init, an unknown option (the nearest one named), a
# missing --data, a Mistral config and an unknown model_type; and what an
# export keeps for inference from the --init directory (the special
# tokens' ids in config.json, torch_dtype, generation_config.json,
# tokenizer.model, special_tokens_map.json), the exported tokenizer's BOS
# held to config.json's bos_token_id by the JavaScript reference
# (tools/tok-ref; that part skips without the npm test data).
#   test_defaults.sh STRATA SOURCE_ROOT
set -u
strata=$1 root=$2
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-defaults-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
. "$(dirname "$0")/check.sh"
data=$work/data.txt
text "$data" 5 the quick brown fox jumps over a lazy dog while strata streams units
has() { # NAME TEXT: stderr of the last check holds TEXT
	grep -qF -- "$2" "$work/err" || { echo "FAIL $1: no '$2' in: $(cat "$work/err")"; fail=1; }
}
hasnt() {
	! grep -qF -- "$2" "$work/err" || { echo "FAIL $1: '$2' in: $(cat "$work/err")"; fail=1; }
}
L=llama:layers=1,dim=32,heads=2,kv-heads=1,ffn=64,vocab=32000,ctx=64
small=(--seq 32 --batch 2 --gpu-mem 64M --host-mem 64M --nvme none)

# a LLaMA as Hugging Face ships it: strata's export of a fresh model, then
# the files a download has beside the weights
check make-ck 0 "$strata" train --model $L --data "$data" --steps 0 "${small[@]}" --save "$work/ck0"
check make-hf 0 "$strata" export --ckpt "$work/ck0" --out "$work/hf"

# --- 1: --device auto, the default: cuda when strata info finds a usable
# GPU (no "error" in its gpu object), else cpu; plan and train say which
want=$("$strata" info --json | python3 -c 'import json, sys
g = json.load(sys.stdin)["gpu"]
print("cpu" if "error" in g else "cuda")')
# (the suite's ST_DEVICE=cpu is the default's override: unset here, and
# put back after)
dev_env=${ST_DEVICE-}
unset ST_DEVICE
check plan-auto 0 "$strata" plan --seq 32
grep -q "^device: $want (--device auto: " "$work/out" ||
	{ echo "FAIL plan-auto: no 'device: $want' line: $(head -3 "$work/out")"; fail=1; }
if [ "$want" = cpu ]; then
	grep -Eq "^device: cpu \(--device auto: (no usable GPU: .+|built without CUDA.*)\)$" "$work/out" ||
		{ echo "FAIL plan-auto: no reason for cpu: $(sed -n 2p "$work/out")"; fail=1; }
fi
echo "     $(sed -n 2p "$work/out")"
check plan-cpu 0 "$strata" plan --seq 32 --device cpu
! grep -q "^device:" "$work/out" || { echo "FAIL plan --device cpu: says auto"; fail=1; }
check train-auto 0 "$strata" train --model layers=1,dim=32,heads=2,vocab=256,ctx=64 --data "$data" \
	--steps 1 "${small[@]}"
grep -q "^device: $want (--device auto: " "$work/out" ||
	{ echo "FAIL train-auto: no 'device: $want' line: $(head -3 "$work/out")"; fail=1; }
quiet_refusals=1 check device-bad 2 "$strata" train --device gpu
has device-bad "auto, cpu"
ST_DEVICE=cpu check env-cpu 0 "$strata" plan --seq 32
! grep -q "^device:" "$work/out" || { echo "FAIL ST_DEVICE=cpu: still auto"; fail=1; }
ST_DEVICE=gpu quiet_refusals=1 check env-bad 2 "$strata" plan --seq 32
has env-bad "ST_DEVICE=gpu"
[ -z "$dev_env" ] || export ST_DEVICE=$dev_env

# --- 2: --gpu-mem auto and --host-mem auto on the cpu device: a quarter of
# MemAvailable each (read here before and after: it moves on a busy
# machine), the host's within RLIMIT_MEMLOCK's hard limit, in whole MiB
# and pages; the lines say so
python3 -c 'import sys; print(open("/proc/meminfo").read())' >"$work/mem0"
check plan-auto-budgets 0 "$strata" plan --device cpu --gpu-mem auto --host-mem auto --nvme "$work" --json
cp "$work/out" "$work/auto.json"
check plan-auto-lines 0 "$strata" plan --device cpu --gpu-mem auto --host-mem auto --nvme "$work"
python3 - "$work/auto.json" "$work/mem0" "$work/out" <<'PY' || fail=1
import json, resource, sys
def avail(text):
    return next(int(l.split()[1]) * 1024 for l in text.splitlines() if l.startswith("MemAvailable:"))
a = [avail(open(sys.argv[2]).read()), avail(open("/proc/meminfo").read())]
lo, hi = min(a) - (256 << 20), max(a) + (256 << 20)
t = json.load(open(sys.argv[1]))["tiers"]
g, h = t["vram"]["budget_bytes"], t["host"]["budget_bytes"]
assert g % (1 << 20) == 0 and lo // 4 - (1 << 20) <= g <= hi // 4, (g, lo, hi)
lim = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
if lim != resource.RLIM_INFINITY and lim < lo // 4:
    assert h == lim // 4096 * 4096, (h, lim)
else:
    assert h % 4096 == 0 and lo // 4 - 4096 <= h <= hi // 4 and (lim == resource.RLIM_INFINITY or h <= lim), (h, lo, hi, lim)
out = open(sys.argv[3]).read()
assert "--gpu-mem auto: " in out and "a quarter of MemAvailable" in out, out[:400]
assert "--host-mem auto: " in out, out[:400]
print(f"ok   --gpu-mem auto {g} B, --host-mem auto {h} B (MemAvailable {a[0]} B, memlock {lim})")
PY
check train-gpu-auto 0 "$strata" train --model layers=1,dim=32,heads=2,vocab=256,ctx=64 --data "$data" \
	--steps 1 --seq 32 --batch 2 --gpu-mem auto --host-mem 64M --nvme none
grep -q "^--gpu-mem auto: " "$work/out" || { echo "FAIL train --gpu-mem auto: no line"; fail=1; }
! grep -q "^--host-mem auto" "$work/out" || { echo "FAIL train: --host-mem auto said, 64M given"; fail=1; }

# --- 2: a shortfall names the flag to raise and by how much, or --nvme;
# sizes take fractions, whole pages below them
quiet_refusals=1 check short-host 2 "$strata" plan --model gpt2 --gpu-mem 1G --host-mem 1G
has short-host "below the minimum of 2.03 GiB (2182209536 B) for this model and batch: raise --host-mem by 1.03 GiB"
has short-host "or give an nvme tier, --nvme DIR: with one it fits"
quiet_refusals=1 check short-host-nvme 2 "$strata" plan --model gpt2 --gpu-mem 1G --host-mem 300M --nvme "$work"
has short-host-nvme "raise --host-mem by "
hasnt short-host-nvme "give an nvme tier"
check fraction 0 "$strata" plan --gpu-mem 0.3G --host-mem 2.3G --json
python3 - "$work/out" <<'PY' || fail=1
import json, sys
p = json.load(open(sys.argv[1]))
got = (p["tiers"]["vram"]["budget_bytes"], p["tiers"]["host"]["budget_bytes"])
want = (int(0.3 * 2**30) // 4096 * 4096, int(2.3 * 2**30) // 4096 * 4096)
assert got == want, (got, want)
print(f"ok   --gpu-mem 0.3G --host-mem 2.3G: {got} B, whole pages")
PY
quiet_refusals=1 check fraction-bad 2 "$strata" plan --gpu-mem 2.3X
has fraction-bad "expected a size such as 512M, 2G or 2.3G"

# --- 6: --init DIR without config.json ------------------------------------
mkdir "$work/bare" && cp "$work/hf/model.safetensors" "$work/bare/"
quiet_refusals=1 check init-no-config 2 "$strata" train --init "$work/bare" --data "$data" "${small[@]}"
has init-no-config "no config.json"
quiet_refusals=1 check init-no-config-file 2 "$strata" train --init "$work/bare/model.safetensors" \
	--data "$data" "${small[@]}"
has init-no-config-file "no config.json"

# --- 5: unknown options get the nearest, in every command ----------------
quiet_refusals=1 check learning-rate 2 "$strata" train --learning-rate 1e-4 --data "$data"
has learning-rate "did you mean --lr?"
quiet_refusals=1 check learning_rate 2 "$strata" --learning_rate=1e-4
has learning_rate "did you mean --lr?"
quiet_refusals=1 check max-steps 2 "$strata" train --max-steps 5
has max-steps "did you mean --steps?"
quiet_refusals=1 check plan-gpu-memory 2 "$strata" plan --gpu-memry 1G
has plan-gpu-memory "did you mean --gpu-mem?"
quiet_refusals=1 check eval-batch-size 2 "$strata" eval --batch-size 2
has eval-batch-size "did you mean --batch?"
quiet_refusals=1 check gen-tokens 2 "$strata" generate --max-tokens 5
has gen-tokens "did you mean --tokens?"
quiet_refusals=1 check export-dtpye 2 "$strata" export --dtpye bf16
has export-dtpye "did you mean --dtype?"
quiet_refusals=1 check tokenize-tokeniser 2 "$strata" tokenize --tokeniser x
has tokenize-tokeniser "did you mean --tokenizer?"
quiet_refusals=1 check info-nothing-near 2 "$strata" info --frobnicate
hasnt info-nothing-near "did you mean"
quiet_refusals=1 check lr-no-value 2 "$strata" train --lr
has lr-no-value "--lr needs a value"
quiet_refusals=1 check help-value 2 "$strata" train --help=yes
has help-value "--help takes no value"
quiet_refusals=1 check ambiguous 2 "$strata" train --offload nvme
has ambiguous "ambiguous: --offload-params, --offload-optim, --offload-activations"

# --- 5: a Mistral, and the model_types listed -----------------------------
python3 - "$work/hf" "$work" <<'PY' || fail=1
import json, os, shutil, sys
hf, work = sys.argv[1:]
c = json.load(open(f"{hf}/config.json"))
for name, edit in (("mistral-null", {"sliding_window": None}),
                   ("mistral-absent", {}),
                   ("mistral-long", {"sliding_window": 4096}),
                   ("mistral-short", {"sliding_window": 16}),
                   ("bert", {"model_type": "bert", "architectures": ["BertModel"]})):
    d = f"{work}/{name}"
    os.mkdir(d)
    m = dict(c, model_type="mistral", architectures=["MistralForCausalLM"])
    m.update(edit)
    json.dump(m, open(f"{d}/config.json", "w"), indent=2)
PY
for m in mistral-null mistral-absent mistral-long; do
	check "plan-$m" 0 "$strata" plan --model "$work/$m" --seq 32
	grep -q "LLaMA, 1 layers\?, dim 32" "$work/out" || { echo "FAIL plan-$m: $(head -3 "$work/out")"; fail=1; }
done
quiet_refusals=1 check plan-mistral-short 2 "$strata" plan --model "$work/mistral-short" --seq 32
has plan-mistral-short "sliding_window 16"
has plan-mistral-short "is read as llama"
quiet_refusals=1 check plan-bert 2 "$strata" plan --model "$work/bert" --seq 32
has plan-bert "gpt2, llama, qwen2, mistral"

# --- 4: what inference needs, from --init to the export -------------------
npm=$root/.testdata/npm/tokenizer-llama2/package/models
if [ -f "$npm/tokenizer.json" ]; then
	cp "$npm/tokenizer.json" "$npm/tokenizer_config.json" "$work/hf/"
	printf 'not a real sentencepiece model\n' >"$work/hf/tokenizer.model"
	printf '{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}\n' \
		>"$work/hf/special_tokens_map.json"
	python3 - "$work/hf/config.json" <<'PY' || fail=1
import json, sys
c = json.load(open(sys.argv[1]))
c.update(bos_token_id=1, eos_token_id=[2, 31999], pad_token_id=0)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
	# --- 5: no --data beside a model with a tokenizer: no default file named
	quiet_refusals=1 check init-no-data 2 "$strata" train --init "$work/hf" "${small[@]}"
	has init-no-data "no --data"
	has init-no-data "strata tokenize --tokenizer $work/hf"
	hasnt init-no-data "common-licenses"
	check tokenize 0 "$strata" tokenize --tokenizer "$work/hf" --out "$work/data.bin" "$data"
	check init-train 0 "$strata" train --init "$work/hf" --data "$work/data.bin" "${small[@]}" \
		--steps 1 --save "$work/ck"
	for f in tokenizer.model special_tokens_map.json tokenizer_config.json; do
		cmp -s "$work/hf/$f" "$work/ck/$f" || { echo "FAIL $f not carried into --save"; fail=1; }
	done
	check export 0 "$strata" export --ckpt "$work/ck" --out "$work/exp32"
	check export-bf16 0 "$strata" export --ckpt "$work/ck" --out "$work/exp16" --dtype bf16
	python3 - "$work" <<'PY' || fail=1
import json, sys
w = sys.argv[1]
g = json.load(open(f"{w}/ck/generation_config.json"))
assert g == {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [2, 31999],
             "pad_token_id": 0}, g
for out, dt in (("exp32", "float32"), ("exp16", "bfloat16")):
    c = json.load(open(f"{w}/{out}/config.json"))
    got = {k: c.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype")}
    want = {"bos_token_id": 1, "eos_token_id": [2, 31999], "pad_token_id": 0, "torch_dtype": dt}
    assert got == want, (out, got)
    for f in ("tokenizer.model", "special_tokens_map.json", "tokenizer_config.json",
              "tokenizer.json", "generation_config.json"):
        src = f"{w}/ck/{f}"
        assert open(f"{w}/{out}/{f}", "rb").read() == open(src, "rb").read(), (out, f)
print("ok   export: bos/eos/pad ids and torch_dtype in config.json; the inference files carried")
PY
	# the reference tokenizer of the export: its BOS is config.json's bos_token_id
	if node -e 1 2>/dev/null; then
		printf 'hello' >"$work/hello.txt"
		ids=$(node "$root/tools/tok-ref" encode --tokenizer "$work/exp32" "$work/hello.txt")
		rc=$?
		if [ "$rc" = 77 ]; then
			echo "skip the JavaScript reference: $ids"
		elif [ "${ids%% *}" = 1 ]; then
			echo "ok   the export's tokenizer (JavaScript reference) starts with BOS 1: $ids"
		else
			echo "FAIL the export's tokenizer starts with '${ids%% *}', not bos_token_id 1"; fail=1
		fi
	fi
	# an --init with its own generation_config.json: carried as it is
	cp -r "$work/hf" "$work/hf2"
	printf '{\n  "bos_token_id": 1,\n  "eos_token_id": 2,\n  "temperature": 0.6\n}\n' \
		>"$work/hf2/generation_config.json"
	check init-gen 0 "$strata" train --init "$work/hf2" --data "$work/data.bin" "${small[@]}" \
		--steps 1 --save "$work/ck2"
	cmp -s "$work/hf2/generation_config.json" "$work/ck2/generation_config.json" ||
		{ echo "FAIL the --init's generation_config.json is not carried as it is"; fail=1; }
else
	echo "skip the export's inference files: no $npm (tools/quickstart test-data)"
fi
exit $fail
