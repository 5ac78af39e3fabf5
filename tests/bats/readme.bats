#!/usr/bin/env bats
# The first run, as the README and vps(7) give it: their commands are taken
# from the documents, run as written, and what the text says they do is
# checked against what they did.

load helpers

# The code blocks (lines indented 4 spaces) of README.md's section $1, each
# into block.N (N from 1), the indentation removed; prints how many.
readme_blocks() {
	awk -v want="## $1" '
		/^## / { on = ($0 == want); next }
		!on { next }
		/^    / { if (!inblock) { n++; inblock = 1 } print substr($0, 5) > ("block." n); next }
		{ inblock = 0 }
		END { print n + 0 }' "$TOP/README.md"
}

# The examples (.EX to .EE) of section $1 (.SH) of vps(7), each into
# man.N.cmd, or man.N.out when the text before it is "prints": what the
# one before printed. Roff's escapes in them are undone (\- \e \(aq \&);
# any other escape fails, since the test could not know what it means.
man_blocks() {
	local page=$TOP/man/vps.7
	if sed -n '/^\.EX/,/^\.EE/p' "$page" | grep -P '\\(?!-|e|&|\(aq)' >&2; then
		echo "an escape readme.bats does not undo, in an example of vps(7)" >&2
		return 1
	fi
	awk -v want="$1" '
		/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); gsub(/"/, "", s); on = (s == want); next }
		!on { next }
		/^\.EX/ { n++; f = "man." n (last == "prints" ? ".out" : ".cmd"); inex = 1; next }
		/^\.EE/ { inex = 0; next }
		inex { print > f; next }
		/^[^.]/ { last = $0 }' "$page"
	local f
	for f in man.*.cmd man.*.out; do
		[ -e "$f" ] || continue
		perl -pi -e 's/\\(-|e|&|\(aq)/$1 eq "-" ? "-" : $1 eq "e" ? "\\" : $1 eq "&" ? "" : "\x27"/ge' "$f"
	done
}

# Does the output in file $2 show the lines of file $1, in order? A line
# "..." in $1 stands for any lines; every other line must be equal.
shows() {
	local want=$1 got=$2
	awk -v gotfile="$got" '
		BEGIN { while ((getline l < gotfile) > 0) g[++ng] = l; pos = 1 }
		$0 == "..." { skip = 1; next }
		{
			if (skip) { while (pos <= ng && g[pos] != $0) pos++ }
			if (pos > ng || g[pos] != $0) { printf "expected line %d: %s\n", NR, $0 > "/dev/stderr"; bad = 1; exit }
			pos++; skip = 0
		}
		END { if (!bad && !skip && pos <= ng) { printf "more output than shown: %s\n", g[pos] > "/dev/stderr"; bad = 1 }
		      exit bad }' "$want" || { echo "--- shown:" >&2; cat "$want" >&2; echo "--- printed:" >&2; cat "$got" >&2; return 1; }
}

# Run each command of file $1 (one a line, \ continuing a line) in bash
# with pipefail, as a user would at a prompt; the output of each into
# out.N; any that fails fails the test, naming it.
run_lines() {
	local cmd n=0 line
	cmd=
	while IFS= read -r line || [ -n "$line" ]; do
		if [[ "$line" == *\\ ]]; then cmd+="${line%\\}"; continue; fi
		cmd+=$line
		[ -n "${cmd//[[:space:]]/}" ] || { cmd=; continue; }
		n=$((n + 1))
		if ! bash -o pipefail -c "$cmd" > "out.$n" 2>&1; then
			echo "failed: $cmd" >&2
			cat "out.$n" >&2
			return 1
		fi
		cmd=
	done < "$1"
}

@test "README's set-up commands: make, and the PATH line make prints" {
	[ "$(readme_blocks "A pipeline")" -ge 2 ]
	# the first block is the set-up: make, then the line make prints
	[ "$(sed -n 1p block.1)" = "make" ]
	[ "$(wc -l < block.1)" -eq 2 ]
	local export_line
	export_line=$(sed -n 2p block.1)
	# make says it (when bin/ is not yet on PATH), with the directory filled in
	PATH=/usr/bin:/bin run plain_make
	[ "$status" -eq 0 ]
	[[ "$output" == *"export PATH=\"$TOP/bin:\$PATH\""* ]]
	[ "${export_line//\$PWD/$TOP}" = "export PATH=\"$TOP/bin:\$PATH\"" ]
	# and after it, in the source tree, the tools are found by name
	run bash -c "cd '$TOP' && PATH=/usr/bin:/bin && $export_line && command -v vps-layout"
	[ "$output" = "$TOP/bin/vps-layout" ]
}

@test "README's pipeline runs as written, and is the join README says" {
	[ "$(readme_blocks "A pipeline")" -ge 2 ]
	# the text says what kind of switch it is, before the commands
	awk '/^## A pipeline/ { on = 1; next } /^## / { on = 0 } on' "$TOP/README.md" > section
	grep -q 'a \*\*join\*\*: LLaMA-2 7B on the 8 GPUs of node 0' section
	grep -q 'is a \*\*leave\*\*: the 8$' section
	run_lines block.2
	# the layouts: 8 devices, then 16
	vps-verify a.layout
	vps-verify b.layout
	[ "$(vps-layout -i a.layout --stats | awk '$1 == "world:" { print $2 }')" = 8 ]
	[ "$(vps-layout -i b.layout --stats | awk '$1 == "world:" { print $2 }')" = 16 ]
	# the statistics line: a join of 8 devices (README: "the 8 of node 1
	# join"), with bytes, balance and a time on the topology
	local stats
	stats=$(grep -l '^joining:' out.* | head -1)
	[ -n "$stats" ]
	grep -qx 'world: 16' "$stats"
	grep -qx 'joining: 8' "$stats"
	grep -qx 'leaving: 0' "$stats"
	grep -q '^bytes_moved: [1-9]' "$stats"
	grep -q '^busiest_over_bound: ' "$stats"
	grep -q '^estimate_seconds: ' "$stats"
	# the joining devices are node 1's, ranks 8 to 15 of b, which hold
	# nothing under a: they only receive
	for r in 8 15; do
		[[ "$(vps-layout -i b.layout --rank $r --stats)" == *"device: [1, $((r - 8))]"* ]]
	done
	vps-plan a.layout b.layout --stats --load | grep -q '{rank: 8, send: 0, recv: [1-9]'
	# the staged plan and rank 3's own part are checked
	run vps-verify ab.staged
	[ "$status" -eq 0 ]
	[[ "$output" == "ab.staged: ok: llama2-7b: "* ]]
	[ -s ab.3.staged ]
	vps-verify ab.3.staged
	# "the other way round is a leave: the 8 devices of node 1"
	run vps-plan b.layout a.layout --stats
	[[ "$output" == *$'\njoining: 0\nleaving: 8\n'* ]]
}

@test "make demo ends with the human lines, no raw report" {
	run plain_make -s demo
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" != *"vps: report"* ]]
	[[ "$output" != *"bytes_sent:"* ]]
	[ "${lines[-1]}" = "digest: match" ]
	[ "${lines[-2]}" = "samples: 168 read, each exactly once" ]
	[[ "${lines[0]}" == "== tiny-llama: (tp=2,pp=2,dp=2,zero=1) -> (tp=4,pp=1,dp=2,zero=1) and back, 8 devices (0 joining, 0 leaving), 8 per node, over tcp" ]]
	# each switch over every rank: what the plans move, sent and received,
	# against vps-plan's own count, and every digest matched
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 -o b.layout
	local s ab ba
	# in the tools' units (vps(7) UNITS), as vps-plan -H prints the bytes
	ab=$(vps-plan a.layout b.layout --stats -H | awk '$1 == "bytes_moved:" { print $2, $3 }')
	ba=$(vps-plan b.layout a.layout --stats -H | awk '$1 == "bytes_moved:" { print $2, $3 }')
	for s in 1 2; do
		local mb=$ab
		[ $s = 1 ] || mb=$ba
		printf '%s\n' "${lines[@]}" | grep -qE "^switch $s, all 8 ranks: sent $mb, received $mb in [0-9.]+ (us|ms|s) \([0-9.]+ [kMGT]?B/s\); paused at most [0-9.]+ (us|ms|s); digest: match on every rank$"
		printf '%s\n' "${lines[@]}" | grep -qE "^vps-exec: rank 0: switch $s: sent [0-9.]+ MiB, received [0-9.]+ MiB, .* \([0-9.]+ [MG]B/s\) over tcp; .*digest: match$"
	done
}

# Run a vps(7) section's command blocks in order, each block after one that
# is what it printed compared with what it printed. Sets n, the blocks run.
run_section() { # SECTION
	man_blocks "$1"
	n=0
	local f i
	for f in man.*.cmd; do
		n=$((n + 1))
		run_lines "$f"
		i=${f#man.}
		i=${i%.cmd}
		if [ -e "man.$((i + 1)).out" ]; then
			cat out.* > printed
			shows "man.$((i + 1)).out" printed
		fi
		rm -f out.*
	done
}

@test "vps(7) DEVICES LEAVE: its commands run as written and print what it shows" {
	local n
	run_section "DEVICES LEAVE"
	[ "$n" -ge 2 ]
}

@test "vps(7) A MIGRATION SCRIPT runs as written: a leave on this machine, every digest matched" {
	man_blocks "A MIGRATION SCRIPT"
	# the script, the command that runs it, what it prints
	[ -e man.1.cmd ] && [ "$(cat man.2.cmd)" = "bash migrate.sh" ] && [ -e man.3.out ]
	[ "$(head -1 man.1.cmd)" = "#!/bin/bash" ]
	cp man.1.cmd migrate.sh
	# its one setting this shared machine needs: a free port
	run env MASTER="127.0.0.1:$("$TOP/scripts/free-port.sh")" bash migrate.sh
	echo "$output"
	[ "$status" -eq 0 ]
	printf '%s\n' "${lines[@]}" > printed
	shows man.3.out printed
	# what it says happened: 8 ranks, 4 of them left, each digest matched,
	# and the trainers that stay found their state intact
	[ "$(grep -c 'digest: match$' exec.*.log | awk -F: '{ n += $2 } END { print n }')" = 8 ]
	for r in 0 1 2 3 4 5 6 7; do grep -q ': ok$' "trainer.$r.log"; done
	run vps-plan a.layout b.layout --stats
	[[ "$output" == *$'\nleaving: 4\n'* ]]
}

# A user's first hour: a fresh clone of the repository (its HEAD: what is
# committed, nothing else of this tree), `make demo` there as the only
# command, then every block of README.md in order, as written, in the
# clone, by tests/bats/examples.py (the blocks README marks "not run" stay
# so); each block's result is checked, and the clone is as git left it.
#
# The clone builds itself (make demo: about 30 s on 2 cores, nvcc's part
# included) rather than borrowing this suite's objects: make judges by
# time stamps, so borrowed objects would have to be dated after the
# clone's sources and would stand for them only when the tree has no
# change beyond HEAD; the clone's own build is what proves that a fresh
# clone builds, which is what README's first command promises. The test
# environment is borrowed instead: README says `make venv`, which makes
# build/venv from PyPI (minutes, 4.5 GB), before its first use of it. Once
# make demo is done (so it is seen to need none), the clone's build/venv
# is a link to this suite's, and its python/requirements-test.txt and
# scripts/venv.sh are dated as that environment's stamp, so that README's
# `make venv` finds it made from those very files, as a user who made it
# before would, and changes nothing in it (checked after). The whole test
# took 2 to 3 minutes on the 2-core development machine under other work:
# the clone's build (30 to 40 s) and a minute or two of PyTorch and
# Megatron-Core jobs on 4 ranks, which examples.bats ran before; it does
# not run README.md any more, so make check grows by the build.
@test "README's walkthroughs run as written in a fresh clone after make demo, and leave it as git left it" {
	[ -z "${VPS_SANITIZED:-}" ] || skip "the clone builds and runs its own plain tools: make check runs this, make asan does not"
	command -v git >/dev/null || skip "needs git"
	git -C "$TOP" rev-parse -q --verify HEAD >/dev/null 2>&1 || skip "$TOP is not a git checkout: nothing to clone"
	unshare -mn true 2>/dev/null || skip "needs a mount and network namespace of its own (unshare -mn, as root)"
	local venv
	venv=$(readlink -f "$TOP/build/venv") || true
	[ -n "$venv" ] && [ -x "$venv/bin/python" ] && [ -e "$venv/.installed" ] ||
		skip "no test environment in $TOP/build/venv to lend the clone (make venv)"
	[ ! "$TOP/python/requirements-test.txt" -nt "$venv/.installed" ] && [ ! "$TOP/scripts/venv.sh" -nt "$venv/.installed" ] ||
		skip "$TOP/build/venv is older than its requirements (make venv)"

	git clone -q "$TOP" clone
	git -C clone checkout -q --detach "$(git -C "$TOP" rev-parse HEAD)"
	local f
	for f in python/requirements-test.txt scripts/venv.sh; do
		cmp -s "$TOP/$f" "clone/$f" || skip "$f differs from HEAD's: the clone could not borrow this suite's build/venv (commit it)"
	done
	# a user's environment: none of the suite's settings, nor its tools on PATH
	local userpath v
	userpath=$(tr ':' '\n' <<<"$PATH" | grep -vxF -e "$VPS_BIN" -e "$TOP/bin" | paste -sd:)
	local -a unset=(-u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR -u BINDIR -u SANITIZE -u CFLAGS -u LDFLAGS)
	for v in $(compgen -e | grep '^VPS_'); do unset+=(-u "$v"); done

	# README's first command, the only one before the walkthroughs
	run env "${unset[@]}" PATH="$userpath" TMPDIR="$BATS_TEST_TMPDIR" bash -c 'cd clone && make demo'
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	[ "${lines[-1]}" = "digest: match" ]
	[ ! -e clone/build/venv ]

	# the walkthroughs' test environment, as README's make venv leaves it
	ln -s "$venv" clone/build/venv
	touch -r "$venv/.installed" clone/python/requirements-test.txt clone/scripts/venv.sh
	local stamp
	stamp=$(stat -c %y "$venv/.installed")
	# README says make venv in each section, before the section first runs build/venv
	awk '/^## / { sec = $0; said = 0; next }
		/make venv/ { said = 1 }
		/^    / && /build\/venv\// && !said { print "README.md:" NR ": " sec ": build/venv before make venv"; bad = 1 }
		END { exit bad }' clone/README.md

	run env "${unset[@]}" PATH="$userpath" TMPDIR="$BATS_TEST_TMPDIR" \
		unshare -mn python3 "$TOP/tests/bats/examples.py" --isolated "$PWD/clone/README.md" "$PWD/clone"
	# the examples' session files are the harness's, not a leftover of README's
	mv clone/.ex session
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" != *FAILED* ]]
	[ "$(stat -c %y "$venv/.installed")" = "$stamp" ]

	# the clone is as git left it: nothing untracked, nothing changed
	run git -C clone status --porcelain
	echo "$output"
	[ -z "$output" ]

	# what each block says it does, in what that block printed
	python3 "$TOP/tests/bats/examples.py" --list clone/README.md > blocks
	printed_by() { # a line of README.md: the file of what its block printed
		local n k=-1 i=0 at
		n=$(grep -nxF -m1 -- "    $1" clone/README.md | cut -d: -f1)
		[ -n "$n" ] || { echo "README.md has no line '$1'" >&2; return 1; }
		while IFS=: read -r _ at _; do
			[ "$at" -le "$n" ] && k=$i
			i=$((i + 1))
		done < blocks
		echo "session/out.$k"
	}
	local out
	# the set-up: the tools by name are the clone's
	out=$(printed_by make)
	grep -qx "vps: built; to run the tools by name: export PATH=\"$PWD/clone/bin:\$PATH\"" "$out"
	# the pipeline: a join of 8 devices, staged and verified
	out=$(printed_by 'vps-verify ab.staged                      # every element moved once, within budget')
	grep -qx 'joining: 8' "$out"
	grep -q '^ab.staged: ok: llama2-7b: ' "$out"
	clone/bin/vps-verify clone/ab.3.staged
	# the picture
	grep -q '<svg' clone/traffic.svg
	# the minimal PyTorch loop: one switch, the whole state equal bit for bit
	out=$(printed_by 'build/venv/bin/python examples/torch/minimal.py')
	grep -q 'the whole state equal bit for bit; loss' "$out"
	# the full example: three switches, each equal bit for bit
	out=$(printed_by 'build/venv/bin/python examples/torch/launch.py --nproc 4 --model micro-llama \')
	grep -q '(--check-switch): 3 of 3$' "$out"
	# under torchrun: two switches, each equal bit for bit, every digest
	# matched, each rank's plans, the losses of 12 steps
	out=$(printed_by 'export VPS_TOKEN=$(vps-exec --new-token)')
	[ "$(grep -c 'equal bit for bit' "$out")" -eq 2 ]
	[ "$(cat clone/build/torchrun/exec.*.log | grep -c 'digest: match')" -eq 8 ]
	for r in 0 1 2 3; do [ -s clone/build/torchrun/rank-$r/c0-c1.staged ]; done
	[ "$(wc -l < clone/build/torchrun/loss.txt)" -eq 12 ]
	# Megatron-Core switched by vps.megatron, and checked against vps
	out=$(printed_by 'build/venv/bin/python tests/megatron/check_switch.py -v --steps 7 --every 3 --optimizer adam')
	grep -q 'the whole state equal bit for bit across each' "$out"
	out=$(printed_by 'build/venv/bin/python tests/megatron/check_megatron.py -v -k tiny-llama')
	grep -q 'configurations\?, every rank equal to Megatron-Core$' "$out"
}
