#!/usr/bin/env bash
# strata's Jinja (jinja_render, strata/jinja.h) against @huggingface/jinja
# on tests/tok/jinja_cases.jsonl: about fifty small templates over the
# features chat templates use (loops and loop.*, slicing, namespace, set
# blocks, break/continue, tests, filters, string methods, tojson and how
# JavaScript prints numbers, loose ==, whitespace control, the generation
# tag, strftime_now, errors). Each renders to the same bytes, or both
# refuse it; a case marked "strata": "refuses" is one strata does not
# support (a macro) and must refuse. Then a hostile run: every case and
# chat template cut and spliced at many points must parse and render or
# be refused, never crash or hang (jinja_render --fuzz). Exit 77 without
# node or the npm data (the fuzz part runs anyway, before).
#   test_jinja.sh JINJA_RENDER SOURCE_ROOT
set -u
render=$1 root=$2
cases=$root/tests/tok/jinja_cases.jsonl jinja=$root/.testdata/npm/jinja/package
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-jinja.XXXXXX")
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=1752148800 TZ=UTC
fail=0
python3 - "$cases" "$work" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
json.dump(lines[0]["vars"], open(sys.argv[2] + "/vars.json", "w"))
for i, c in enumerate(lines[1:]):
    open("%s/%d.jinja" % (sys.argv[2], i), "w", encoding="utf-8").write(c["template"])
    open("%s/%d.want" % (sys.argv[2], i), "w").write(c.get("strata", ""))
PY
n=$(ls "$work"/*.jinja | wc -l)
# hostile templates: no crash, no hang (a signal fails; a hang, meson's timeout)
if ! JINJA_FUZZ_POINTS=31 "$render" --fuzz "$work"/*.jinja "$root"/tests/tok/chat/*.jinja \
	> "$work/fuzz.log" 2>&1; then
	echo "FAIL fuzz: $(tail -n 3 "$work/fuzz.log")"; fail=1
else
	echo "ok   fuzz: $(tail -n 1 "$work/fuzz.log")"
fi
command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
[ -f "$jinja/dist/index.js" ] || { echo "SKIP: $jinja is missing (tools/quickstart test-data)"; exit 77; }
node "$root/tests/tok/jinja_cases.mjs" "$jinja" "$cases" > "$work/ref.jsonl" || { echo "FAIL: node"; exit 1; }
for ((i = 0; i < n; i++)); do
	"$render" "$work/$i.jinja" "$work/vars.json" > "$work/$i.out" 2> "$work/$i.err"
	echo $? > "$work/$i.rc"
done
python3 - "$work" "$n" <<'PY' || fail=1
import base64, json, sys
w, n = sys.argv[1], int(sys.argv[2])
ref = [json.loads(l) for l in open(w + "/ref.jsonl")]
bad = 0
for i in range(n):
    rc = int(open("%s/%d.rc" % (w, i)).read())
    got = open("%s/%d.out" % (w, i), "rb").read()
    tpl = open("%s/%d.jinja" % (w, i), encoding="utf-8").read()
    if open("%s/%d.want" % (w, i)).read() == "refuses":
        want_ok, want = False, None
    else:
        want_ok = ref[i]["ok"]
        want = base64.b64decode(ref[i]["out"]) if want_ok else None
    if (rc == 0) != want_ok or (want_ok and got != want):
        print("FAIL case %d %r:\n  reference %r\n  strata    %r" % (i + 1, tpl[:80],
              want if want_ok else "error: " + ref[i].get("err", "(unsupported)"),
              got if rc == 0 else "error: " + open("%s/%d.err" % (w, i)).read().strip()))
        bad = 1
if not bad:
    print("ok   %d cases: strata renders what @huggingface/jinja renders, or both refuse" % n)
sys.exit(bad)
PY
exit $fail
