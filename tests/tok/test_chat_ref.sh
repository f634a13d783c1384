#!/usr/bin/env bash
# strata tokenize --format chat against @huggingface/jinja and
# @lenml/tokenizers (chat_ref.mjs): every template of the real tokenizers
# (Llama 3's and Qwen 3's tokenizer_config.json) and of tests/tok/chat/
# (Llama 3.1, Llama 3.2, Qwen 2.5, SmolLM2, Zephyr: see README there)
# renders tests/tok/chat/conversations.jsonl byte for byte as the
# reference does (--text-out), and the shard's tokens, loss mask and
# document starts are the reference's. Exit 77 when node or the npm test
# data (tools/quickstart test-data) is missing.
#   test_chat_ref.sh STRATA SOURCE_ROOT
set -u
strata=$1 root=$2
npm=$root/.testdata/npm data=$root/tests/tok/chat
command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
for p in jinja/package/dist/index.js tokenizers/package/dist/main.js \
	tokenizer-llama3/package/models/tokenizer_config.json \
	tokenizer-qwen3/package/models/tokenizer_config.json; do
	[ -f "$npm/$p" ] || { echo "SKIP: $npm/$p is missing (tools/quickstart test-data)"; exit 77; }
done
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-chat-ref.XXXXXX")
trap 'rm -rf "$work"' EXIT
# strftime_now (Llama 3.2) reads this date on both sides
export SOURCE_DATE_EPOCH=1752148800 TZ=UTC ST_QUIET=1
fail=0
# TEMPLATE (- for the tokenizer's own) and the tokenizer it is tried with
while read -r tpl model; do
	tok=$npm/tokenizer-$model/package/models
	name=$(basename -- "$tpl" .jinja)-$model
	opt=() ref=()
	[ "$tpl" = - ] || { opt=(--chat-template "$data/$tpl"); ref=(--template "$data/$tpl"); }
	if ! "$strata" tokenize --format chat --tokenizer "$tok" "${opt[@]}" \
		--out "$work/$name.bin" --text-out "$work/$name.txt" \
		"$data/conversations.jsonl" >"$work/$name.log" 2>&1; then
		echo "FAIL $name: strata tokenize: $(tail -n 3 "$work/$name.log")"
		fail=1
		continue
	fi
	if out=$(node "$root/tests/tok/chat_ref.mjs" --jinja "$npm/jinja/package" \
		--tokenizers "$npm/tokenizers/package/dist/main.js" --tokenizer "$tok" \
		"${ref[@]}" --data "$data/conversations.jsonl" --text "$work/$name.txt" \
		--shard "$work/$name.bin"); then
		echo "$name: $out"
	else
		echo "FAIL $name:"
		echo "$out"
		fail=1
	fi
done <<'LIST'
- llama3
- qwen3
llama-3.1-instruct.jinja llama3
llama-3.2-instruct.jinja llama3
qwen2.5-instruct.jinja qwen3
smollm2-instruct.jinja qwen3
zephyr.jinja llama3
LIST
exit $fail
