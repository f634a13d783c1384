#!/usr/bin/env bash
# The benchmark tools as a user meets them: --help, and bad input answered
# with one line and exit 2 (their timed runs are benchmarks, not tests).
set -u
fail=0
check() { # name, expected rc, command...
	local name=$1 want=$2 rc out err
	shift 2
	out=$("$@" 2>/tmp/bench-cli-err.$$) ; rc=$?
	err=$(cat /tmp/bench-cli-err.$$)
	if [ $rc != "$want" ]; then
		echo "FAIL $name: exit $rc, want $want: $err"; fail=1
	elif [ "$want" = 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then
		echo "FAIL $name: stderr is not one line: $err"; fail=1
	elif [ "$want" = 0 ] && ! printf '%s' "$out" | grep -q usage; then
		echo "FAIL $name: no usage text"; fail=1
	else
		echo "ok   $name $err"
	fi
}
# A --json FILE that cannot be written at the end (ulimit -f 0: EFBIG, as a
# full disk's ENOSPC): exit 1, the last line naming the file and why, and
# nothing left in its directory, not even an empty file.
nowrite() { # name, command... (its --json FILE in $jd)
	local name=$1 rc err
	shift
	err=$( (ulimit -f 0; trap '' XFSZ; exec "$@") 2>&1 >/dev/null); rc=$?
	if [ $rc != 1 ] || ! printf '%s\n' "$err" | tail -1 | grep -q "^[a-z-]*: $jd/.*: cannot write (File too large)$"; then
		echo "FAIL $name: exit $rc: $err"; fail=1
	elif [ -n "$(ls -A "$jd")" ]; then
		echo "FAIL $name: left $(ls -A "$jd")"; fail=1
	else
		echo "ok   $name $(printf '%s\n' "$err" | tail -1)"
	fi
}
jd=$(mktemp -d)
for tool in "$@"; do
	n=$(basename "$tool")
	check "$n --help" 0 "$tool" --help
	check "$n unknown flag" 2 "$tool" --frobnicate
done
for tool in "$@"; do
	case $(basename "$tool") in
	adam-bench) check "adam-bench --params 0" 2 "$tool" --params 0
		    check "adam-bench --path avx9" 2 "$tool" --path avx9 --params 1000
		    check "adam-bench --optim-state fp8" 2 "$tool" --optim-state fp8 --params 1000
		    # a tiny run of the three formats interleaved: each one's
		    # line, the compact ones with their ratio to fp32
		    if out=$("$tool" --optim-state all --params 5000 --reps 2 2>&1) &&
		       printf '%s\n' "$out" | grep -q "^  fp32 " &&
		       printf '%s\n' "$out" | grep -q "^  bf16 .* / fp32: median of per-round" &&
		       printf '%s\n' "$out" | grep -q "^  q8 .* / fp32: median of per-round"; then
			    echo "ok   adam-bench --optim-state all"
		    else
			    echo "FAIL adam-bench --optim-state all: $out"; fail=1
		    fi
		    check "adam-bench --json in a missing directory" 2 "$tool" --params 1000 \
			  --json /nonexistent/a.json
		    nowrite "adam-bench --json, no space" "$tool" --params 1000 --reps 1 \
			    --json "$jd/a.json" ;;
	train-bench) check "train-bench --steps x" 2 "$tool" --steps x
		     check "train-bench --json in a missing directory" 2 "$tool" \
			   --json /nonexistent/t.json
		     nowrite "train-bench --json, no space" "$tool" \
			     --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --batch 2 --seq 32 \
			     --steps 1 --json "$jd/t.json"
		     check "train-bench --model bogus" 2 "$tool" --model bogus
		     check "train-bench --recompute some" 2 "$tool" --recompute some
		     # both steps in turn: it exits 1 when the kept step's loss
		     # is not the recomputing one's
		     if out=$("$tool" --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --batch 2 \
			      --seq 32 --steps 1 --recompute both 2>&1) &&
			printf '%s' "$out" | grep -q "recompute all / none"; then
			     echo "ok   train-bench --recompute both"
		     else
			     echo "FAIL train-bench --recompute both: $out"; fail=1
		     fi ;;
	strict-planted) check "strict-planted without a build" 2 "$tool"
			check "strict-planted, not a meson build" 2 "$tool" /nonexistent
			# main's own build: not the planted tree
			check "strict-planted, not the planted tree" 2 "$tool" \
			      "$(dirname "$(dirname "$tool")")/build" ;;
	gemm-split) check "gemm-split --shapes 3x4" 2 "$tool" --shapes 3x4
		    check "gemm-split --cut 0" 2 "$tool" --cut 0
		    check "gemm-split --shapes xt:3x4x5" 2 "$tool" --shapes xt:3x4x5
		    check "gemm-split --time x" 2 "$tool" --time x
		    # small shapes in the step's three layouts: the engine's tiles
		    # give the same bits at 1 and 3 threads; --time prints the ceiling
		    if out=$("$tool" --shapes 300x700x100,nt:300x700x100,tn:300x700x100 \
				--threads 3 --time 1 2>&1) &&
		       [ "$(printf '%s\n' "$out" | grep -c "tiles at 3 threads vs 1: 0 ")" = 3 ] &&
		       printf '%s' "$out" | grep -q "one call per matmul [0-9.]* of its rate"; then
			    echo "ok   gemm-split --shapes 300x700x100 (nn, nt, tn) --time 1"
		    else
			    echo "FAIL gemm-split --shapes 300x700x100 (nn, nt, tn): $out"; fail=1
		    fi ;;
	offload-bench) check "offload-bench --nvme /nonexistent" 2 "$tool" --nvme /nonexistent
		       check "offload-bench --batch 0" 2 "$tool" --batch 0
		       check "offload-bench --data missing" 2 "$tool" --data /nonexistent
		       # the two engines of each pair stepped in turn: exit 1 when
		       # their losses or gradient norms differ, and when the JSON
		       # cannot be written
		       d=$(mktemp -d)
		       for ab in "" --act-ab --verify-ab; do
			       if out=$("$tool" $ab --model layers=2,dim=64,heads=2,vocab=256,ctx=64 \
					--batch 2 --seq 32 --steps 2 --nvme "$d" --gpu-mem 64M \
					--host-mem 64M 2>&1) &&
				  printf '%s' "$out" | grep -q "median of per-step ratios B/A"; then
				       echo "ok   offload-bench ${ab:-(A/B)} on a tiny model"
			       else
				       echo "FAIL offload-bench ${ab:-(A/B)} on a tiny model: $out"; fail=1
			       fi
		       done
		       check "offload-bench --json in a missing directory" 2 "$tool" \
			     --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --batch 2 --seq 32 \
			     --steps 1 --nvme "$d" --json /proc/self/no/such.json
		       # written at the end, and not there (root may write in /proc,
		       # but create no file): exit 1, and the trace's temporary gone
		       check "offload-bench --json unwritable" 1 "$tool" \
			     --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --batch 2 --seq 32 \
			     --steps 1 --nvme "$d" --json /proc/offload-bench.json --trace "$jd/t.json"
		       [ -z "$(ls -A "$jd")" ] ||
			       { echo "FAIL offload-bench --json unwritable: left $(ls -A "$jd")"; fail=1; }
		       rm -rf "$d" "${jd:?}"/* ;;
	split-bench) check "split-bench --grad-accum 0" 2 "$tool" --grad-accum 0
		     check "split-bench --nvme /nonexistent" 2 "$tool" --nvme /nonexistent
		     check "split-bench --json in a missing directory" 2 "$tool" \
			   --json /nonexistent/s.json
		     d=$(mktemp -d)
		     # a failed run (its JSON not written) leaves neither trace's
		     # temporary (PREFIX-S.json.tmp.*, PREFIX-U.json.tmp.*)
		     check "split-bench --json unwritable" 1 "$tool" \
			   --model layers=4,dim=64,heads=2,vocab=256,ctx=64 --steps 1 --nvme "$d" \
			   --gpu-mem 64M --json /proc/split-bench.json --trace "$jd/t"
		     [ -z "$(ls -A "$jd")" ] ||
			     { echo "FAIL split-bench --json unwritable: left $(ls -A "$jd")"; fail=1; }
		     rm -rf "${jd:?}"/*
		     if out=$("$tool" --model layers=4,dim=64,heads=2,vocab=256,ctx=64 --steps 2 \
			      --nvme "$d" --gpu-mem 64M 2>&1) &&
			printf '%s' "$out" | grep -q "ratio S/U" && [ -z "$(ls -A "$d")" ]; then
			     echo "ok   split-bench on a tiny model, nothing left in --nvme"
		     else
			     echo "FAIL split-bench on a tiny model: $out"; fail=1
		     fi
		     rm -rf "$d" ;;
	schedule-bench) check "schedule-bench --grad-accum 1" 2 "$tool" --grad-accum 1
			check "schedule-bench --nvme /nonexistent" 2 "$tool" --nvme /nonexistent
			check "schedule-bench --json in a missing directory" 2 "$tool" \
			      --json /nonexistent/s.json
			d=$(mktemp -d)
			check "schedule-bench --json unwritable" 1 "$tool" \
			      --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --steps 1 --nvme "$d" \
			      --host-mem 8M --json /proc/schedule-bench.json
			if out=$("$tool" --model layers=2,dim=64,heads=2,vocab=256,ctx=64 --steps 2 \
				 --nvme "$d" --host-mem 8M 2>&1) &&
			   printf '%s' "$out" | grep -q "median of per-step ratios B/A: nvme bytes" &&
			   [ -z "$(ls -A "$d")" ]; then
				echo "ok   schedule-bench on a tiny model, nothing left in --nvme"
			else
				echo "FAIL schedule-bench on a tiny model: $out"; fail=1
			fi
			rm -rf "$d" ;;
	gpu-check) check "gpu-check --run without LOGDIR" 2 "$tool" --run build
		   check "gpu-check --only an unknown step" 2 "$tool" --run build /tmp/gc-$$ --only nope
		   check "gpu-check --prepare a missing build" 2 "$tool" --prepare /nonexistent
		   check "gpu-check --run --out without DIR" 2 "$tool" --run build /tmp/gc-$$ --out ;;
	torch-ref) check "torch-ref without a command" 2 "$tool"
		   check "torch-ref check --strata missing" 2 "$tool" check --strata /nonexistent
		   check "torch-ref bench --batch 0" 2 "$tool" bench --batch 0
		   check "torch-ref bench --model bogus" 2 "$tool" bench --model bogus
		   check "torch-ref bench --against on cuda" 2 "$tool" bench --device cuda --against /bin/true ;;
	generate-bench) check "generate-bench --strata missing" 2 "$tool" --strata /nonexistent
			check "generate-bench --rounds 0" 2 "$tool" --rounds 0
			check "generate-bench --tokens 0" 2 "$tool" --tokens 0 ;;
	startup-bench) check "startup-bench --strata missing" 2 "$tool" --strata /nonexistent
		       check "startup-bench --rounds 0" 2 "$tool" --rounds 0 ;;
	ab-bench) check "ab-bench without --new" 2 "$tool" --old /nonexistent
		  check "ab-bench --old missing" 2 "$tool" --old /nonexistent --new /nonexistent
		  check "ab-bench --rounds 0" 2 "$tool" --old /tmp --new /tmp --rounds 0
		  check "ab-bench --train-only, no train-bench" 2 "$tool" --old /tmp --new /tmp \
			--train-only
		  # a build whose train-bench writes a fixed JSON: --json's directory
		  # checked before the rounds, a file that cannot be written one line
		  d=$(mktemp -d)
		  mkdir "$d/tools"
		  printf '%s\n' '#!/bin/sh' 'while [ $# -gt 1 ]; do [ "$1" = --json ] && j=$2; shift; done' \
			 'echo "{\"step_s_median\": 1, \"ratio\": 1}" >"$j"' >"$d/tools/train-bench"
		  chmod +x "$d/tools/train-bench"
		  check "ab-bench --json in a missing directory" 2 "$tool" --old "$d" --new "$d" \
			--train-only --rounds 1 --json /nonexistent/ab.json
		  check "ab-bench --json unwritable" 1 "$tool" --old "$d" --new "$d" --train-only \
			--rounds 1 --json /proc/ab.json
		  grep -q "^ab-bench: /proc/ab.json: cannot write" /tmp/bench-cli-err.$$ ||
			  { echo "FAIL ab-bench --json unwritable: no one-line message"; fail=1; }
		  rm -rf "$d" ;;
	fingerprint) check "fingerprint --strata missing" 2 "$tool" --strata /nonexistent ;;
	attn-bench) check "attn-bench --rounds 0" 2 "$tool" --rounds 0 ;;
	attn-sdpa) check "attn-sdpa --iters 0" 2 "$tool" --iters 0
		   check "attn-sdpa --rounds x" 2 "$tool" --rounds x ;;
	copy-bench) check "copy-bench --sizes 0" 2 "$tool" --sizes 0
		    check "copy-bench --json in a missing directory" 2 "$tool" \
			  --json /nonexistent/c.json
		    nowrite "copy-bench --json, no space" "$tool" --sizes 4K --rounds 1 --reps 1 \
			    --json "$jd/c.json"
		    check "copy-bench --device tpu" 2 "$tool" --device tpu
		    check "copy-bench --reps 0" 2 "$tool" --reps 0
		    # a short run on the cpu device: a rate per size and direction
		    if out=$("$tool" --sizes 4K,64K --rounds 1 --reps 2 2>&1) &&
		       [ "$(printf '%s\n' "$out" | grep -cE '^ +(4096|65536) +[0-9.]+ +[0-9.]+$')" = 2 ]; then
			    echo "ok   copy-bench --sizes 4K,64K"
		    else
			    echo "FAIL copy-bench --sizes 4K,64K: $out"; fail=1
		    fi ;;
	host-waits-bench) check "host-waits-bench --rounds 0" 2 "$tool" --rounds 0
			  check "host-waits-bench --params gpu" 2 "$tool" --params gpu
			  check "host-waits-bench --strata a directory" 2 "$tool" --strata / \
				--rounds 1 --steps 2 ;;
	tok-bench) check "tok-bench --rounds abc" 2 "$tool" --rounds abc
		   check "tok-bench --rounds 0" 2 "$tool" --rounds 0
		   check "tok-bench --tokenizers nosuch" 2 "$tool" --tokenizers nosuch
		   check "tok-bench --text missing" 2 "$tool" --text /nonexistent ;;
	predict-bench) for n in abc 0; do # refused as such, from any directory
			       check "predict-bench --rounds $n" 2 "$tool" --rounds $n
			       grep -q -- "--rounds $n" /tmp/bench-cli-err.$$ ||
				       { echo "FAIL predict-bench --rounds $n: not named"; fail=1; }
		       done
		       check "predict-bench --steps x" 2 "$tool" --steps x ;;
	nvme-vs-fio) check "nvme-vs-fio --size abc" 2 "$tool" --dir /tmp --size abc
		     check "nvme-vs-fio --time -1" 2 "$tool" --dir /tmp --time -1
		     check "nvme-vs-fio --bs 3000" 2 "$tool" --dir /tmp --bs 3000
		     check "nvme-vs-fio --reps x" 2 "$tool" --dir /tmp --reps x
		     # 1GiB and 1MiB are sizes, as nvme-bench reads them: the
		     # refusal is the depth's
		     if err=$("$tool" --dir /tmp --size 1GiB --bs 1MiB --qd 0 2>&1); [ $? = 2 ] &&
			printf '%s' "$err" | grep -q -- "--qd 0"; then
			     echo "ok   nvme-vs-fio --size 1GiB --bs 1MiB"
		     else
			     echo "FAIL nvme-vs-fio --size 1GiB --bs 1MiB: $err"; fail=1
		     fi
		     check "nvme-vs-fio --json in a missing directory" 2 "$tool" --dir /tmp \
			   --json /nonexistent/n.json ;;
	zero-bench) check "zero-bench --model bogus" 2 "$tool" --model bogus --worlds 1 \
			  --stages 0 --rounds 1 --steps 2
		    check "zero-bench --json in a missing directory" 2 "$tool" --worlds 1 \
			  --stages 0 --rounds 1 --steps 2 --json /nonexistent/z.json ;;
	plan-timeline) # its SVG gets the mode open() gives (0666 less the umask), not
		       # its temporary's 0600
		       d=$(mktemp -d)
		       echo '{"time": {"step_s": 0.001, "compute_s": 0.0005}}' >"$d/plan.json"
		       echo '{"traceEvents": [{"ph": "M", "name": "thread_name", "tid": 1,
			     "args": {"name": "compute"}}, {"ph": "X", "tid": 1, "name": "fwd embed",
			     "ts": 0, "dur": 100}, {"ph": "X", "tid": 1, "name": "fwd embed",
			     "ts": 1000, "dur": 100}]}' >"$d/trace.json"
		       for m in 022:644 027:640; do
			       (umask "${m%:*}" && "$tool" --plan "$d/plan.json" --trace "$d/trace.json" \
					--out "$d/t.svg" 2>/dev/null)
			       if [ "$(stat -c %a "$d/t.svg" 2>&1)" = "${m#*:}" ]; then
				       echo "ok   plan-timeline: umask ${m%:*}, its SVG ${m#*:}"
			       else
				       echo "FAIL plan-timeline: umask ${m%:*}: $(stat -c %a "$d/t.svg" 2>&1)"
				       fail=1
			       fi
			       rm -f "$d/t.svg"
		       done
		       rm -rf "$d" ;;
	count-refusals) check "count-refusals with an argument" 2 "$tool" tests ;;
	code-shape) check "code-shape a missing directory" 2 "$tool" /nonexistent
		    check "code-shape --top 0" 2 "$tool" --top 0 .
		    # a hand-made tree: a function of 6 lines, brace to brace, a static one with the
		    # public prefix, an include of the other folder's header
		    d=$(mktemp -d)
		    mkdir -p "$d/src/a" "$d/src/b"
		    printf '#include "b.h"\nstatic int st_x(void)\n{\n\treturn 0;\n}\n' \
			    >"$d/src/a/a.c"
		    printf 'int y(int v)\n{\n\tint w = v;\n\n\tw++;\n\treturn w;\n}\n' \
			    >"$d/src/b/b.c"
		    echo 'int y(int v);' >"$d/src/b/b.h"
		    if out=$(cd "$d" && "$tool" --top 5 src 2>&1) &&
		       printf '%s\n' "$out" | grep -q "^ *6  y  src/b/b.c:1$" &&
		       printf '%s\n' "$out" | grep -q "st_ prefix: 1$" &&
		       printf '%s\n' "$out" | grep -q "^  src/a -> src/b  (1)$"; then
			    echo "ok   code-shape on a hand-made tree"
		    else
			    echo "FAIL code-shape on a hand-made tree: $out"; fail=1
		    fi
		    rm -rf "$d" ;;
	tok-bench-c) # refused as such, not as a missing tokenizer (x) after a run
		     for n in abc 0 -1 1e99 10Q; do
			     check "tok-bench-c --passes $n" 2 "$tool" --tokenizer x --passes $n /dev/null
			     grep -q "bad --passes $n" /tmp/bench-cli-err.$$ ||
				     { echo "FAIL tok-bench-c --passes $n: not named"; fail=1; }
		     done
		     check "tok-bench-c a missing file" 2 "$tool" --tokenizer x /nonexistent
		     grep -q "No such file" /tmp/bench-cli-err.$$ ||
			     { echo "FAIL tok-bench-c a missing file: no errno text"; fail=1; } ;;
	trace-gaps) for v in -1 nan inf; do
			    check "trace-gaps --min-us $v" 2 "$tool" --min-us $v x.json
		    done ;;
	esac
done
rm -f /tmp/bench-cli-err.$$
rm -rf "$jd"
exit $fail
