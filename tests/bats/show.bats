#!/usr/bin/env bats
# vps-show: every document kind in either encoding, one line per file with
# -t, and vps-verify over several files.

load helpers

# a.layout, b.layout (devices listed, not packed, one joining), ab.plan, ab.staged,
# r1.plan and r1.staged (world rank 1's parts), all in YAML
documents() {
	# the last one joins: on no device of a.layout
	printf 'vps: devices\nversion: 1\ndevices:\n- [0, 1]\n- [0, 0]\n- [1, 3]\n- [1, 2]\n- [1, 0]\n- [2, 0]\n' > six.devices
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 --gpus-per-node 4 --rank 0,5 --yaml > a.layout
	vps-layout --model tiny-llama --parallel tp=2,pp=1,dp=3,zero=1 --devices six.devices --yaml > b.layout
	vps-plan a.layout b.layout --yaml > ab.plan
	vps-stage --budget 1MiB ab.plan --yaml > ab.staged
	vps-plan a.layout b.layout --rank 1 --yaml > r1.plan
	vps-stage --budget 1MiB r1.plan --yaml > r1.staged
}

# A real report: a switch of two ranks over TCP on this machine.
report() {
	run "$TOP/scripts/demo.sh" --budget 1MiB --transport tcp --np 2 --keep "$BATS_TEST_TMPDIR/demo" \
		--model tiny-llama --from tp=2 --to tp=1,dp=2
	[ "$status" -eq 0 ] || { echo "$output" | tail -20 >&2; return 1; }
	cp demo/report.0.yaml switch.report
}

# FILE: YAML -> binary -> YAML gives the same bytes, and binary -> YAML ->
# binary the same binary; the binary is what the tools read.
round_trip() {
	local f=$1
	vps-show --binary -o "$f.bin" "$f"
	head -c 4 "$f.bin" | od -An -tx1 | grep -q '89 56 50 53'
	vps-show "$f.bin" > "$f.back"
	cmp "$f" "$f.back"
	vps-show - --binary < "$f.back" > "$f.bin2"
	cmp "$f.bin" "$f.bin2"
}

@test "layouts, plans, staged plans and reports: yaml -> binary -> yaml is identical, and back" {
	documents
	report
	local f
	for f in a.layout b.layout ab.plan ab.staged r1.plan r1.staged switch.report; do
		round_trip "$f"
	done
	# the binary documents are the tools' own: checked as any other
	for f in a.layout b.layout ab.plan ab.staged r1.plan r1.staged; do
		expect_status 0 vps-verify "$f.bin"
	done
	# a report of before the pause's wall clock and the digest's time: read,
	# and those written as 0 in the binary and the YAML made from it
	grep -vE '^  (digest_seconds|requested_at|done_at|opened_in_pause):' switch.report > old.report
	vps-show --binary -o old.report.bin old.report
	vps-show old.report.bin > old.report.back
	[ "$(grep -cE '^  (digest_seconds|requested_at|done_at): 0\.0$|^  opened_in_pause: 0$' old.report.back)" -eq 4 ]
	[ "$(grep -cvE '^  (digest_seconds|requested_at|done_at|opened_in_pause):' old.report.back)" -eq "$(wc -l < old.report)" ]
	# and what a tool wrote in binary comes back as its YAML
	vps-plan a.layout b.layout -o tool.plan
	vps-show tool.plan | cmp - ab.plan
	vps-show --binary tool.plan -o again.plan
	cmp tool.plan again.plan
	# the devices map keeps its block list of pairs, a box its flow pairs
	grep -qx '  - \[1, 3\]' b.layout.back
	grep -qE '^    box: \[\[[0-9]+, [0-9]+\]' a.layout.back
}

@test "models, parallel configurations and devices convert both ways too" {
	vps-show "$TOP/configs/models/tiny-qwen3-moe.yaml" > m.yaml
	round_trip m.yaml
	# YAML defaults are written out: the binary encoding has every field
	grep -qx 'vocab_divisor: 128' m.yaml
	vps-show "$TOP/configs/parallel/gpt3-1.3b-2-2-1.yaml" > p.yaml
	round_trip p.yaml
	grep -qx 'model: gpt3-1.3b' p.yaml
	printf 'vps: devices\nversion: 1\ndevices:\n- [0, 1]\n- [0, 0]\n' > hand.yaml
	vps-show hand.yaml > d.yaml
	round_trip d.yaml
	grep -qx 'mode: list' d.yaml
	# a name JSON must escape: a quote, a backslash, a tab, and UTF-8
	printf 'vps: model\nversion: 1\nname: "q\\"b\\\\s\\tt\\u00e9"\nhidden: 64\nlayers: 2\nheads: 4\nffn: 64\nvocab: 99\n' > odd.yaml
	vps-show odd.yaml > odd2.yaml
	round_trip odd2.yaml
	[ "$(vps-show --json odd.yaml | jq -r .name)" = "$(printf 'q"b\\s\tt\303\251')" ]
	vps-show --binary -o odd.bin <(vps-show --json odd.yaml)
	vps-show odd.bin | cmp - odd2.yaml
	# a model in binary is one a layout can be made of
	vps-layout --model ./m.yaml.bin --parallel tp=2 --yaml | grep -q 'name: tiny-qwen3-moe'
}

@test "JSON: one line that jq reads, and the tools read back" {
	documents
	vps-show --json ab.staged > s.json
	[ "$(wc -l < s.json)" -eq 1 ]
	# the hashes, as strings, are the YAML's
	[ "$(jq -r .hash s.json)" = "$(awk '/^hash:/ { print $2; exit }' ab.staged)" ]
	[ "$(jq -r .plan.hash s.json)" = "$(awk '/^  hash:/ { print $2; exit }' ab.staged)" ]
	[ "$(jq '.transfers | length' s.json)" -eq "$(grep -c '^- stage:' ab.staged)" ]
	vps-show --binary -o s.bin s.json
	vps-show s.bin | cmp - ab.staged
	expect_status 0 vps-verify s.json
	vps-show -t s.json | grep -q ', json$'
}

@test "conversion keeps the hash a plan states: a hand-edited plan stays one" {
	vps-layout --model tiny-llama --parallel tp=2,pp=2 > ta.layout
	vps-layout --model tiny-llama --parallel tp=4 > tb.layout
	vps-plan ta.layout tb.layout --yaml > t.plan
	sed -i '0,/\[\[768, 1000\], \[0, 256\]\]/s//[[744, 976], [0, 256]]/' t.plan
	vps-show --binary -o t.bin t.plan
	expect_status 1 vps-verify t.bin
	[[ "${lines[0]}" == "t.bin: the plan states hash 0x"*" but its content hashes to 0x"* ]]
	vps-show t.bin | cmp - t.plan
	# the stated hash, not a fresh one
	[ "$(vps-show --json t.bin | jq -r .hash)" = "$(awk '/^hash:/ { print $2 }' t.plan)" ]
}

@test "-t: kind, model, worlds, hash and encoding, as the documents and the tools state them" {
	documents
	report
	vps-show --binary -o ab.bin ab.staged
	local wa wb w ha hp hs hr
	wa=$(vps-layout -i a.layout --stats | awk '/^world:/ { print $2 }')
	wb=$(vps-layout -i b.layout --stats | awk '/^world:/ { print $2 }')
	w=$(vps-plan --stats a.layout b.layout | awk '/^world:/ { print $2 }')
	ha=$(awk '/^hash:/ { print $2 }' a.layout)
	hp=$(awk '/^hash:/ { print $2 }' ab.plan)
	hs=$(awk '/^hash:/ { print $2 }' ab.staged)
	hr=$(awk '/^hash:/ { print $2 }' r1.staged)
	[ "$wa" -eq 8 ] && [ "$wb" -eq 6 ] && [ "$w" -eq 9 ]
	expect_status 0 vps-show -t a.layout ab.plan ab.bin r1.plan r1.staged switch.report - < ab.staged
	[ "${lines[0]}" = "a.layout: vps layout, model tiny-llama, world $wa, hash $ha, yaml" ]
	[ "${lines[1]}" = "ab.plan: vps plan, model tiny-llama, world $wa -> $wb ($w ranks), hash $hp, yaml" ]
	[ "${lines[2]}" = "ab.bin: vps staged plan, model tiny-llama, world $wa -> $wb ($w ranks), hash $hs, binary" ]
	[[ "${lines[3]}" == "r1.plan: vps plan for rank 1, model tiny-llama, world $wa -> $wb ($w ranks), hash 0x"*", yaml" ]]
	[ "${lines[4]}" = "r1.staged: vps staged plan for rank 1, model tiny-llama, world $wa -> $wb ($w ranks), hash $hr, yaml" ]
	local rank world n
	rank=$(awk '/^- rank:/ { print $3; exit }' switch.report)
	world=$(awk '/^  world:/ { print $2; exit }' switch.report)
	n=$(grep -c '^- rank:' switch.report)
	[ "${lines[5]}" = "switch.report: vps report, rank $rank of $world, $n switch, yaml" ]
	[ "${lines[6]}" = "<stdin>: vps staged plan, model tiny-llama, world $wa -> $wb ($w ranks), hash $hs, yaml" ]
}

@test "-t: a file that is no vps document is named, the others still shown, exit 2" {
	vps-layout --model tiny-llama --parallel tp=2 -o good.bin
	printf 'hello: world\n' > other.yaml
	printf 'garbage\0\1' > junk.bin
	: > empty
	head -c 100 good.bin > short.bin
	mkdir dir
	expect_status 2 vps-show -t other.yaml good.bin junk.bin empty short.bin missing dir "$TOP/configs/topologies/a800-testbed.yaml"
	[ "${lines[0]}" = "other.yaml: not a vps document (no 'vps:' key)" ]
	[[ "${lines[1]}" == "good.bin: vps layout, model tiny-llama, world 2, hash 0x"*", binary" ]]
	[ "${lines[2]}" = "junk.bin: not a vps document (binary data)" ]
	[ "${lines[3]}" = "empty: not a vps document (empty)" ]
	[ "${lines[4]}" = "short.bin: vps layout, unreadable (truncated zstd frame)" ]
	[ "${lines[5]}" = "missing: cannot read (No such file or directory)" ]
	[ "${lines[6]}" = "dir: cannot read (is a directory)" ]
	[ "${lines[7]}" = "$TOP/configs/topologies/a800-testbed.yaml: vps topology, yaml" ]
	[ "${#lines[@]}" -eq 8 ]
	expect_status 0 vps-show -t good.bin
}

@test "damaged or hostile input exits 2 with vps-show: FILE: what, and writes nothing" {
	documents
	report
	vps-show --binary -o good.bin ab.plan
	bad() { # WANT FILE: the message, exit 2, no output file
		rm -f out
		expect_status 2 vps-show --binary -o out "$2"
		[ "$output" = "vps-show: $2: $1" ] || { echo "got: $output" >&2; return 1; }
		[ ! -e out ]
		[ -z "$(ls | grep tmp)" ]
	}
	head -c 100 good.bin > short.bin
	bad "truncated zstd frame" short.bin
	size=$(stat -c %s good.bin)
	cp good.bin flip.bin
	printf '\x55' | dd of=flip.bin bs=1 seek=$((size - 6)) conv=notrunc 2>/dev/null
	expect_status 2 vps-show flip.bin
	[[ "$output" == "vps-show: flip.bin: corrupt document"* ]]
	cp good.bin future.bin
	printf '\x09' | dd of=future.bin bs=1 seek=6 conv=notrunc 2>/dev/null
	bad "binary plan version 9 is newer than this build reads (6)" future.bin
	printf 'garbage\0\1' > junk.bin
	bad "not a vps document (binary data)" junk.bin
	printf 'hello: world\n' > other.yaml
	bad "not a vps document (no 'vps:' key)" other.yaml
	awk '/ffn: 688/ && !n++ { print; sub(/ffn: 688/, "colour: red") } { print }' ab.plan > colour.plan
	line=$(grep -n 'colour: red' colour.plan | cut -d: -f1)
	bad "line $line: unknown key 'colour'" colour.plan
	sed 's/^  transport: tcp$/  transport: pigeon/' switch.report > pigeon.report
	line=$(grep -n 'pigeon' pigeon.report | cut -d: -f1)
	bad "line $line: transport: 'pigeon' is not one vps-exec writes" pigeon.report
	line=$(awk '/^  - stage: 1$/ { print NR; exit }' switch.report)
	awk -v n="$line" 'NR == n { sub(/1/, "7") } { print }' switch.report > order.report
	bad "line $line: stage: 7 where stage 1 comes" order.report
	sed 's/^  transfer_seconds: .*/  transfer_seconds: -1.0/' switch.report > neg.report
	line=$(grep -n 'transfer_seconds: -1' neg.report | cut -d: -f1)
	bad "line $line: transfer_seconds: -1 is negative" neg.report
	bad "a topology document is read in YAML only and has no binary encoding" "$TOP/configs/topologies/a800-testbed.yaml"
	# a bomb of nested sequences is refused before it is walked
	{ printf 'vps: report\nversion: 1\nswitches: '; head -c 100000 /dev/zero | tr '\0' '['; } > deep.report
	bad "line 3: nested deeper than 64 levels" deep.report
	# a binary document naming a kind no build knows
	cp good.bin kind.bin
	printf '\x4d' | dd of=kind.bin bs=1 seek=4 conv=notrunc 2>/dev/null
	bad "not a vps document (binary, of unknown kind 77)" kind.bin
	expect_status 2 vps-show missing
	[ "$output" = "vps-show: missing: No such file or directory" ]
}

@test "output through a temporary and a rename; binary is refused on a terminal" {
	documents
	echo old > out.bin
	chmod 600 out.bin
	vps-show --binary -o out.bin ab.plan
	[ "$(stat -c %a out.bin)" = 600 ]
	vps-show out.bin | cmp - ab.plan
	[ -z "$(ls | grep tmp)" ]
	expect_status 2 vps-show -t --binary ab.plan
	expect_status 2 vps-show ab.plan ab.staged
	command -v script >/dev/null || skip "script(1) is not installed"
	run script -qec "$VPS_BIN/vps-show --binary $BATS_TEST_TMPDIR/ab.plan" /dev/null
	[ "$status" -eq 2 ]
	[[ "$output" == *"refusing to write binary output to a terminal (use --yaml or -o FILE)"* ]]
}

@test "-o FILE: one line on standard error says what was written, as -t would, and its size; -q none" {
	documents
	vps-show --binary -o ab.bin ab.plan 2> err
	[[ "$(cat err)" == "$(vps-show -t ab.bin), "[0-9]*" KiB" ]]
	[[ "$(cat err)" == "ab.bin: vps plan, model tiny-llama, world 8 -> 6 (9 ranks), hash 0x"*", binary, "*" KiB" ]]
	# below 1000 bytes the size is exact
	vps-show --binary -o six.bin six.devices 2> err
	[ "$(cat err)" = "six.bin: vps devices, binary, $(stat -c %s six.bin) B" ]
	vps-show --json -o ab.json ab.bin 2> err
	[[ "$(cat err)" == "ab.json: vps plan, model tiny-llama, "*", json, "*"B" ]]
	vps-show -q --yaml -o ab.yaml ab.bin 2> err
	[ ! -s err ]
	cmp ab.yaml ab.plan
	# on standard output the document is what the user reads: no line
	vps-show ab.bin 2> err | cmp - ab.plan
	[ ! -s err ]
	vps-show ab.bin -o - 2> err > /dev/null
	[ ! -s err ]
	# -q and -t say nothing of each other
	expect_status 2 vps-show -t -q ab.bin
	[ "${lines[0]}" = "vps-show: -t prints one line per file: no --yaml, --json, --binary, -o or -q with it" ]
}

@test "vps-verify A B C: each file checked, one line each, the exit status the worst" {
	vps-layout --model tiny-llama --parallel tp=2,pp=2 > ta.layout
	vps-layout --model tiny-llama --parallel tp=4 > tb.layout
	vps-plan ta.layout tb.layout --yaml > good.plan
	sed '0,/\[\[768, 1000\], \[0, 256\]\]/s//[[744, 976], [0, 256]]/' good.plan > edited.plan
	head -c 100 ta.layout > short.layout
	expect_status 0 vps-verify ta.layout good.plan tb.layout
	[ "${#lines[@]}" -eq 3 ]
	[[ "${lines[0]}" == "ta.layout: ok: "* ]]
	[[ "${lines[1]}" == "good.plan: ok: "* ]]
	[[ "${lines[2]}" == "tb.layout: ok: "* ]]
	# a violation: 1, the others still checked
	expect_status 1 vps-verify ta.layout edited.plan tb.layout
	[[ "${lines[0]}" == "ta.layout: ok: "* ]]
	[[ "${lines[-2]}" == "edited.plan: FAILED: 4 violations; "* ]]
	[[ "${lines[-1]}" == "tb.layout: ok: "* ]]
	# a file that cannot be read: 2, over a violation
	expect_status 2 vps-verify -q short.layout edited.plan good.plan
	[ "${lines[0]}" = "vps-verify: short.layout: truncated zstd frame" ]
	[[ "${lines[-1]}" == "edited.plan: FAILED: 4 violations; "* ]]
	! grep -q '^good.plan' <<<"$output"
	expect_status 2 vps-verify good.plan missing.plan
	[ "${lines[-1]}" = "vps-verify: missing.plan: No such file or directory" ]
	expect_status 0 vps-verify -q ta.layout - < good.plan
	[ -z "$output" ]
}

@test "a binary report whose number is not finite is refused: YAML could not carry it" {
	command -v zstd >/dev/null || skip "zstd(1) is not installed"
	report
	vps-show --binary -o r.bin switch.report
	# the payload: switches (8 bytes), rank, world, switch (8 each),
	# transport (4 + 3 for tcp), three byte counts (8 each), then
	# setup_seconds, here made a NaN
	tail -c +17 r.bin | zstd -dq > payload
	printf '\0\0\0\0\0\0\370\177' | dd of=payload bs=1 seek=63 conv=notrunc 2>/dev/null
	{ head -c 16 r.bin; zstd -q --check -c payload; } > nan.bin
	expect_status 2 vps-show nan.bin
	[ "$output" = "vps-show: nan.bin: setup_seconds: corrupt number (not finite)" ]
	# the same bytes with the number kept are a report
	tail -c +17 r.bin | zstd -dq > payload
	{ head -c 16 r.bin; zstd -q --check -c payload; } > same.bin
	vps-show same.bin | cmp - switch.report
}
