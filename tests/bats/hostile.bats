#!/usr/bin/env bats
# Crafted files, as a hostile tester writes them: values the readers must
# bound before anything computes with them or walks them. Each file is
# refused as it is read (exit 2, the file named, in well under a second),
# or fails vps-verify (exit 1) naming what is wrong.

load helpers

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 -o b.layout
	vps-plan a.layout b.layout --yaml -o p.yaml
	vps-stage --budget 1MiB p.yaml --yaml -o s.yaml
}

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	cp "$BATS_FILE_TMPDIR"/a.layout "$BATS_FILE_TMPDIR"/b.layout "$BATS_FILE_TMPDIR"/p.yaml "$BATS_FILE_TMPDIR"/s.yaml .
}

# Give an edited plan or staged plan the hashes of its content, as an
# attacker who knows the format would: vps-verify reports what each stated
# hash should be. A reader that refuses the edit says nothing about hashes,
# and the file keeps the stated ones (the refusal under test comes first).
rehash() {
	local out
	out=$(vps-verify "$1" 2>&1) || true
	sed -nE 's/.*states hash (0x[0-9a-f]+) but (its content )?hashes to (0x[0-9a-f]+).*/s|hash: \1$|hash: \3|/p' \
		<<<"$out" > rehash.sed
	sed -i -f rehash.sed "$1"
}

# within: run a tool that must answer at once. It answers in milliseconds;
# the bound is loose so that a loaded CI machine cannot fail it, and still
# far below what the unbounded code took (minutes, or forever).
within() {
	local start end
	start=$(date +%s%N)
	run timeout 30 "$@"
	end=$(date +%s%N)
	if [ $(((end - start) / 1000000)) -gt 8000 ]; then
		echo "took $(((end - start) / 1000000)) ms: $*" >&2
		return 1
	fi
}

@test "a piece beyond its tensor (bounds near 2^61, strides near 2^60) is refused as it is read" {
	awk '/^  box:/ && !b { sub(/\[\[[0-9]+, [0-9]+\]/, "[[0, 2305843009213693952]"); b = 1 }
	     /^  src_strides:/ && !s { sub(/\[[0-9]+,/, "[1152921504606846976,"); s = 1 } { print }' p.yaml > far.yaml
	rehash far.yaml
	within vps-stage --budget 1MiB far.yaml -o far.staged
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-stage: far.yaml: line 100: 2305843009213693952 is out of range [0, 281474976710656]" ]]
	[ ! -e far.staged ]
	within vps-verify far.yaml
	[ "$status" -eq 2 ]
	# a view past the end of its buffer, inside the tensor
	awk '/^  dst_offset:/ && !d { sub(/[0-9]+$/, 1000000000); d = 1 } { print }' p.yaml > past.yaml
	rehash past.yaml
	within vps-stage --budget 1MiB past.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"past.yaml: line 106: dst_strides: piece 0: destination: elements ["*") lie outside buffer 0 of "*" elements" ]]
}

@test "a stride of 0 (rows that alias) is refused in layouts and plans" {
	vps-layout --model tiny-llama --parallel tp=2 --rank 1 --yaml > l.yaml
	awk '/^    strides: \[[0-9]+, 1\]/ && !d { sub(/\[[0-9]+,/, "[0,"); d = 1 } { print }' l.yaml > alias.yaml
	within vps-verify alias.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-verify: alias.yaml: line "*": strides: rank 1 region "*": stride 0 is 0 (rows that alias each other)" ]]
	awk '/^  dst_strides:/ && !d { sub(/\[[0-9]+,/, "[0,"); d = 1 } { print }' p.yaml > alias.plan.yaml
	rehash alias.plan.yaml
	within vps-verify alias.plan.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"alias.plan.yaml: line 106: dst_strides: piece 0: destination: stride 0 is 0"* ]]
}

@test "a hash of 0 does not turn the hash check off" {
	# an edit inside the buffers, which only the hash reveals to vps-stage
	awk '/^  src_offset:/ && $2 >= 64 && !d { sub(/[0-9]+$/, $2 - 64); d = 1 } { print }' p.yaml |
		sed '3s/^hash: .*/hash: 0x0/' > zero.yaml
	within vps-stage --budget 1MiB zero.yaml -o zero.staged
	[ "$status" -eq 2 ]
	[ "$output" = "vps-stage: zero.yaml: line 3: hash: 0 is not the hash of any plan" ]
	[ ! -e zero.staged ]
	within vps-verify zero.yaml
	[ "$status" -eq 2 ]
	sed '3s/^hash: .*/hash: 0x0/' s.yaml > zero.staged.yaml
	within vps-verify zero.staged.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"zero.staged.yaml: line 3: hash: 0 is not the hash of any staged plan" ]]
	# the plan inside a staged plan too
	awk '/^  hash:/ && !d { sub(/0x[0-9a-f]+$/, "0x0"); d = 1 } { print }' s.yaml > zero.inner.yaml
	within vps-verify zero.inner.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"zero.inner.yaml: line "*": hash: 0 is not the hash of any plan" ]]
}

@test "a frame that claims 63 GiB is refused before it is allocated, naming the file" {
	# header: magic, kind 1 (layout), binary version 3, no flags; then a zstd frame
	# with a checksum and an 8-byte content size of 63 GiB, holding one
	# 16-byte RLE block
	printf '\x89VPS\x01\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00' > big.bin
	printf '\x28\xb5\x2f\xfd\xc4\x00\x00\x00\x00\xc0\x0f\x00\x00\x00\x83\x00\x00\x61\x00\x00\x00\x00' >> big.bin
	for tool in "vps-verify big.bin" "vps-layout -i big.bin" "vps-plan big.bin big.bin"; do
		within $tool
		[ "$status" -eq 2 ] || { echo "$tool: exit $status: $output"; return 1; }
		[[ "$output" == *"big.bin: zstd frame claims 67645734912 bytes, more than its 22 bytes can hold" ]]
	done
	printf '\x03\x00\x05\x00' | dd of=big.bin bs=1 seek=4 conv=notrunc 2>/dev/null # kind 3: staged, version 5
	within vps-exec --rank 0 --master 127.0.0.1:29511 big.bin
	[ "$status" -eq 2 ]
	[[ "$output" == *"big.bin: zstd frame claims 67645734912 bytes"* ]]
}

@test "a huge micro batch is refused, not walked down one by one" {
	within vps-plan a.layout b.layout --global-batch 1099511627776 --micro-batch 1099511627775
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-plan: global batch: more than 16777216 samples is not a batch" ]]
	within vps-plan a.layout b.layout --global-batch 1024 --micro-batch 1099511627775
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-plan: micro batch: more than 16777216 samples is not a batch" ]]
	awk '/^    micro_batch:/ && !d { sub(/[0-9]+$/, "1099511627775"); d = 1 } { print }' s.yaml > mb.yaml
	rehash mb.yaml
	within vps-exec --rank 0 --master 127.0.0.1:29511 mb.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"mb.yaml: line "*": micro_batch: 1099511627775 is out of range [0, 16777216]"* ]]
}

@test "vps-verify refuses a bad stride before walking its elements" {
	# a flat copy stretched to 2^40 elements two apart: walked, 48 TB of
	# bookkeeping
	awk '/^    ext: \[[0-9]+\]$/ && !d { $0 = "    ext: [1099511627776]"; d = 1; e = 1 }
	     e && /^    src_strides:/ { $0 = "    src_strides: [2]"; e = 0 } { print }' s.yaml > walk.yaml
	rehash walk.yaml
	within vps-verify walk.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == *"walk.yaml: line "*": src_strides: transfer 0 op 0 (piece "*"): source: elements [0, 2199023255551) lie outside buffer 0 of "* ]]
}

@test "vps-verify refuses a free before the last stage that reads the buffer" {
	vps-stage --budget 64KiB p.yaml --yaml -o s.yaml
	expect_status 0 vps-verify -q s.yaml
	# free the first source buffer one unit (here: one stage) early
	awk '/^  last_read: \[[0-9]+, [1-9][0-9]*\]$/ && !d { c = $3; sub(/\]/, "", c); sub(/ [0-9]+\]$/, " " (c - 1) "]"); d = 1 }
	     { print }' s.yaml > early.yaml
	rehash early.yaml
	! cmp -s s.yaml early.yaml
	expect_status 1 vps-verify early.yaml
	[[ "$output" == *"early.yaml: free 0: rank 0 buffer 0 is freed after stage "*", but stage "*" still reads it (transfer "*")"* ]]
	[[ "${lines[-1]}" == "early.yaml: FAILED: 1 violation; "* ]]
}

@test "vps-exec refuses a copy past its buffer, or into a buffer the rank lacks, naming the file and the piece" {
	# the first retain of rank 0 (a flat copy): its end moved 16 elements
	# past buffer 0 of B's rank 0
	elements=$(vps-layout -i b.layout --rank 0 --yaml | awk '/^    elements:/ { print $2; exit }')
	awk -v e="$elements" '/^    ext: \[[0-9]+\]$/ && !d { n = substr($2, 2) + 0; d = 1; o = 1 }
	     o && /^    dst_offset:/ { sub(/[0-9]+$/, e - n + 16); o = 0 } { print }' s.yaml > past.yaml
	rehash past.yaml
	within vps-exec --rank 0 --master 127.0.0.1:29511 past.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-exec: rank 0: past.yaml: line "*": dst_strides: transfer 0 op 0 (piece "*"): destination: elements ["*", $((elements + 16))) lie outside buffer 0 of $elements elements" ]]
	awk '/^transfers:/ { t = 1 } t && /^    dst_buffer:/ && !d { sub(/[0-9]+$/, 99); d = 1 } { print }' s.yaml > nobuf.yaml
	rehash nobuf.yaml
	within vps-exec --rank 0 --master 127.0.0.1:29511 nobuf.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-exec: rank 0: nobuf.yaml: line "*": dst_buffer: transfer 0 op 0 (piece "*"): destination: rank 0 has no buffer 99" ]]
}

@test "vps-exec and vps-trainer name the file of a staged plan that does not hash to what it states" {
	sed '0,/^hash: /s/^hash: .*/hash: 0x0123456789abcdef/' s.yaml > staged.yaml
	sed '0,/^  hash: /s/^  hash: .*/  hash: 0x0123456789abcdef/' s.yaml > plan.yaml
	local tool
	for tool in "vps-exec --master 127.0.0.1:29511 --serve s.yaml" "vps-trainer s.yaml"; do
		within ${tool%% *} --registry vps-bats-$$ --rank 0 ${tool#* } staged.yaml
		[ "$status" -eq 2 ]
		[ "$output" = "${tool%% *}: rank 0: staged.yaml: its content does not hash to what it states (edited or damaged; vps-verify shows what is wrong)" ]
		within ${tool%% *} --registry vps-bats-$$ --rank 0 ${tool#* } plan.yaml
		[ "$status" -eq 2 ]
		[[ "$output" == "${tool%% *}: rank 0: plan.yaml: the plan states hash 0x0123456789abcdef but its content hashes to 0x"*" (edited or damaged; vps-verify shows what is wrong)" ]]
	done
}

@test "a model too large for any machine is refused before a size is computed" {
	printf 'vps: model\nversion: 1\nname: huge\nhidden: 2147483648\nlayers: 4\nheads: 1\nhead_dim: 1\nffn: 2147483648\nvocab: 100\n' > m.yaml
	within vps-layout --model ./m.yaml
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-layout: ./m.yaml: line 3: "*" parameters is more than any model has (2^48)" ]]
}
