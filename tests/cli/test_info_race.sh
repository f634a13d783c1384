#!/usr/bin/env bash
# strata info --ckpt DIR --verify while a run saves into DIR with
# --save-every 1 --keep 2 (issue 17, section 3): checkpoints are pruned
# while info reads them. A pruned one is reported as such, never as damage,
# so every call exits 0, and the checkpoint latest names when info looks at
# it is verified in every call. Then a byte of the last checkpoint is
# changed with no run there: that is damage, exit 1.
set -u
strata=$1
secs=${2:-15}
work=$(mktemp -d "${ST_TEST_DIR:-/var/tmp}/strata-info-race.XXXXXX")
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
fail=0
ck=$work/ck
data=/usr/share/common-licenses/GPL-3

"$strata" train --model layers=1,dim=64,heads=2,vocab=256,ctx=64 --seq 32 --batch 2 \
	--steps 1000000 --data "$data" --save "$ck" --save-every 1 --keep 2 --nvme none \
	--threads 1 --log-every 1000000 >"$work/train.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -e "$ck/latest" ] && break; sleep 0.1; done
[ -e "$ck/latest" ] || { echo "FAIL the run saved nothing"; cat "$work/train.out"; exit 1; }

calls=0 pruned=0 damaged=0 unverified=0
end=$((SECONDS + secs))
while [ $SECONDS -lt $end ]; do
	"$strata" info --ckpt "$ck" --verify >"$work/out" 2>"$work/err"
	rc=$?
	calls=$((calls + 1))
	if [ $rc != 0 ]; then
		damaged=$((damaged + 1))
		[ $damaged -le 3 ] && { echo "FAIL call $calls: exit $rc"; cat "$work/err";
					  grep -e DAMAGED -e FAILED "$work/out"; }
		continue
	fi
	grep -q "pruned while being read (a run is saving into $ck)" "$work/out" &&
		pruned=$((pruned + 1))
	# the checkpoint --resume would take (latest) is in the list, verified
	chosen=$(sed -n 's|^checkpoint .*/\(step-[0-9]*\) (what --resume.*|\1|p' "$work/out")
	grep -q "^  $chosen  *step [0-9]* .*verified: sizes and XXH64 match" "$work/out" ||
		{ unverified=$((unverified + 1)); [ $unverified -le 3 ] && cat "$work/out"; }
done
kill -0 "$pid" 2>/dev/null || { echo "FAIL the run ended early"; tail -3 "$work/train.out"; fail=1; }
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=
echo "info --verify during saves: $calls calls, $pruned saw a checkpoint pruned while" \
	"being read, $damaged exited non-zero, $unverified did not verify latest"
[ $damaged = 0 ] && [ $unverified = 0 ] && [ $calls -ge 10 ] || fail=1

# Real damage still exits 1: one byte of the latest checkpoint changed.
latest=$ck/$(readlink "$ck/latest")
python3 - "$latest/optimizer.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-5, 2)
    b = f.read(1)
    f.seek(-5, 2)
    f.write(bytes([b[0] ^ 0x10]))
PY
"$strata" info --ckpt "$ck" --verify >"$work/out" 2>"$work/err"
rc=$?
if [ $rc != 1 ] || ! grep -q "DAMAGED: $latest/optimizer.safetensors: checksum mismatch" "$work/out"; then
	echo "FAIL a changed byte: exit $rc"; cat "$work/out" "$work/err"; fail=1
else
	echo "ok   a changed byte: exit 1, $(grep DAMAGED "$work/out" | head -1 | sed 's/^ *//')"
fi
# A file of a checkpoint that is still there gone missing is damage too.
rm "$latest/config.json"
"$strata" info --ckpt "$ck" --verify >"$work/out" 2>"$work/err"
rc=$?
if [ $rc != 1 ] || ! grep -q "DAMAGED: .*config.json: No such file" "$work/out" ||
   grep -q "pruned" "$work/out"; then
	echo "FAIL a missing file: exit $rc"; cat "$work/out" "$work/err"; fail=1
else
	echo "ok   a missing file: exit 1"
fi
exit $fail
