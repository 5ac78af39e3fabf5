#!/usr/bin/env bats
# vps-plan as a user runs it.

load helpers

stat() { # key from a --stats listing in $output
	awk -v k="$1:" '$1 == k { print $2 }' <<<"$output"
}

@test "a plan verifies; a rank's plan verifies; the pipeline reads -" {
	vps-layout --model tiny-qwen3-moe --parallel tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 -o a.layout
	vps-layout --model tiny-qwen3-moe --parallel tp=4,pp=1,dp=3,ep=4,etp=1,zero=1 -o b.layout
	vps-plan a.layout b.layout -o ab.plan
	expect_status 0 vps-verify ab.plan
	[[ "$output" == "ab.plan: ok: tiny-qwen3-moe: global plan over 12 world ranks, "* ]]
	vps-layout -i a.layout | vps-plan - b.layout --rank 9 | vps-verify -q -
	vps-plan a.layout b.layout --rank 11 --stats > r11.txt
	grep -q '^a_rank: -1$' r11.txt   # rank 11 joins
}

@test "a rank's plan is the global plan's pieces that involve it" {
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=4,pp=2,dp=1,zero=1 --gpus-per-node 4 -o b.layout
	vps-plan a.layout b.layout --yaml -o all.yaml
	for r in 0 5 9; do
		vps-plan a.layout b.layout --rank $r --yaml -o r.yaml
		n_global=$(awk -v r=$r '/^- src: / { s = $3 } /^  dst: / { if (s == r || $2 == r) n++ } END { print n + 0 }' all.yaml)
		n_rank=$(grep -c '^- src: ' r.yaml)
		[ "$n_global" = "$n_rank" ] || { echo "rank $r: $n_rank pieces, global has $n_global"; return 1; }
	done
}

@test "an edited plan fails verification with the piece named" {
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 -o b.layout
	vps-plan a.layout b.layout --yaml -o p.yaml
	# send a piece from the wrong offset, still inside its buffer (one
	# outside it is refused as it is read: formats.bats)
	awk '/^  src_offset:/ && $2 >= 64 && !done { sub(/[0-9]+$/, $2 - 64); done = 1 } { print }' p.yaml > bad.yaml
	expect_status 1 vps-verify bad.yaml
	[[ "$output" == *"the plan states hash"* ]]
	[[ "$output" == *"does not hold it at buffer"* ]]
	[[ "${lines[-1]}" == "bad.yaml: FAILED: "* ]]
	# drop one piece: its elements are received from no one
	awk 'BEGIN { skip = 0 } /^- src:/ { n++; skip = (n == 3) } !skip { print }' p.yaml > gap.yaml
	expect_status 1 vps-verify gap.yaml
	[[ "$output" == *"elements are received from no one"* ]]
}

@test "the training state splits the global batch over the new data parallelism" {
	vps-layout --model tiny-llama --parallel tp=2,dp=4 -o a.layout
	vps-layout --model tiny-llama --parallel tp=2,dp=3 -o b.layout
	vps-plan a.layout b.layout --global-batch 96 --micro-batch-before 8 --step 1000 --consumed-samples 96000 --yaml -o p.yaml
	grep -A8 '^training:' p.yaml > t.txt
	grep -q 'micro_batch: 8' t.txt
	grep -q 'grad_accum: 4' t.txt
	grep -q 'consumed_samples: 96000' t.txt
	expect_status 2 vps-plan a.layout b.layout --global-batch 100
	[ "$output" = "vps-plan: global batch: 100 samples do not split over dp=3 of the target" ]
}

@test "bad input exits 2 with a message" {
	vps-layout --model tiny-llama -o a.layout
	vps-layout --model tiny-gpt -o b.layout
	expect_status 2 vps-plan a.layout b.layout
	[ "$output" = "vps-plan: the layouts are of different models (tiny-llama, tiny-gpt)" ]
	expect_status 2 vps-plan a.layout a.layout --rank 8
	[ "$output" = "vps-plan: world rank 8 is outside the transition world of 1 ranks" ]
	expect_status 2 vps-plan --transition no-such-thing
	[[ "$output" == "vps-plan: --transition: no transition named 'no-such-thing'"* ]]
	expect_status 2 vps-plan a.layout
	[[ "${lines[0]}" == "vps-plan: expected two layouts or --transition NAME" ]]
}

@test "--transition list names every transition with its description; an unknown name, the closest first" {
	local dir=$TOP/configs/transitions f n=0
	expect_status 0 vps-plan --transition list
	[ "${#lines[@]}" -eq "$(ls "$dir"/*.yaml | wc -l)" ]
	# sorted by name, each a file's name and its description
	[ "$(printf '%s\n' "${lines[@]}" | awk '{ print $1 }')" = "$(cd "$dir" && ls -- *.yaml | sed 's/\.yaml$//' | LC_ALL=C sort)" ]
	for f in "$dir"/*.yaml; do
		local name=${f##*/} desc
		name=${name%.yaml}
		desc=$(sed -n 's/^description: "\(.*\)"$/\1/p; s/^description: \([^"].*\)$/\1/p' "$f")
		printf '%s\n' "${lines[@]}" | awk -v n="$name" -v d="$desc" '$1 == n { sub(/^[^ ]+ +/, ""); ok = ($0 == d) } END { exit !ok }' ||
			{ echo "$name: not listed with '$desc'" >&2; return 1; }
		n=$((n + 1))
	done
	[ "$n" -ge 50 ]
	expect_status 2 vps-plan --transition list --stats
	[ "${lines[0]}" = "vps-plan: --transition list lists the transitions: no other options or operands with it" ]
	# a name that names none: 8 closest, those it begins first, then the fewest edits
	expect_status 2 vps-plan --transition llama2-7b-s1
	[[ "$output" == "vps-plan: --transition: no transition named 'llama2-7b-s1'; closest: llama2-7b-s1-s2, llama2-7b-s2-s1, "* ]]
	[[ "$output" == *"; vps-plan --transition list names all $n (looked for llama2-7b-s1.yaml in "* ]]
	local closest
	closest=$(sed -n 's/.*; closest: \(.*\); vps-plan --transition list.*/\1/p' <<<"$output")
	[ "$(tr ',' '\n' <<<"$closest" | wc -l)" -eq 8 ]
	# one character off
	expect_status 2 vps-plan --transition llama-7b-s1-s2
	[[ "$output" == *"; closest: llama2-7b-s1-s2, "* ]]
	expect_status 2 vps-plan --transition gpt3-1.3b-tp-upp
	[[ "$output" == *"; closest: gpt3-1.3b-tp-up, "* ]]
	# a short list is given whole, sorted, as before
	expect_status 2 vps-plan --topology no-such --transition llama2-7b-s1-s2
	[[ "$output" == "vps-plan: --topology: no topology named 'no-such'; known: a800-testbed, dgx-h100 (looked for "* ]]
}

@test "an estimate on a topology" {
	expect_status 0 vps-plan --transition llama2-7b-s1-s2 --stats --topology a800-testbed
	[ "$(stat topology)" = "a800-testbed" ]
	[ "$(stat joining)" = "8" ]
	awk -v e="$(stat estimate_seconds)" 'BEGIN { exit !(e > 0.1 && e < 2) }'
}

@test "--threads changes the time, never the plan: same file for 1 and 3 threads" {
	vps-layout --model tiny-llama --parallel tp=1,pp=1,dp=200,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=50,zero=1 -o b.layout
	vps-plan a.layout b.layout --threads 1 -o one.plan
	vps-plan a.layout b.layout --threads 3 -o three.plan
	vps-plan a.layout b.layout -o default.plan
	cmp one.plan three.plan
	cmp one.plan default.plan
	vps-plan a.layout b.layout --threads 1 --stats --load > one.txt
	vps-plan a.layout b.layout --threads 3 --stats --load > three.txt
	cmp one.txt three.txt
	expect_status 0 vps-verify three.plan
	expect_status 2 vps-plan a.layout b.layout --threads 0
	[[ "$output" == *"--threads: 0 is not from 1 to 256"* ]]
}

@test "the relay bound of joins: the section is what scripts/bench/relay_bound.py writes, never above the estimate without relays" {
	# the section's plans are the relaying planner's on every transition, and
	# every on-node rank's transfers: minutes under the sanitizers, where
	# transitions.bats plans a sample of the transitions by default
	[ -z "${VPS_SANITIZED:-}" ] || skip "a document regenerated from some hundred plans: make check runs this, make asan does not"
	run env VPS_BIN="$VPS_BIN" "$VPS_PYTHON" "$TOP/scripts/bench/relay_bound.py" --check
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	# the first table's columns: estimate without relays (7), least time
	# with relays (8), the estimate by default (11): the planner's relays
	# lie between the bound and the point-to-point plan, within 7% of the
	# bound (the last join's holders' node sends 15 ranges over 4 NICs, at
	# most 4 on one, where the bound spreads 3.75)
	run awk -F' *[|] *' '/relay-bound:begin/ { on = 1 } /relay-bound:end/ { on = 0 }
		on && /^[|] llama2-7b [|] tp=/ { n++; if ($8 + 0 > $7 + 0 || !($8 + 0 > 0) || $11 + 0 > $7 + 0 ||
			$11 + 0 < $8 + 0 || $11 + 0 > 1.07 * $8) { print; bad = 1 } }
		END { exit bad || n < 2 }' "$TOP/docs/BENCHMARKS.md"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	# and no transition of configs/transitions gets slower by default
	grep -q '^By default, [0-9]* of the [0-9]* transitions of configs/transitions relay any piece; no estimate gets worse than without relays\.$' \
		"$TOP/docs/BENCHMARKS.md"
}

@test "--relay: receivers pass on what one holder sent; a rank's plan is the global plan's part; a forward from a rank that never received it fails verification" {
	vps-layout --model tiny-llama --parallel tp=1,dp=1,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 -o b.layout
	vps-plan --relay a.layout b.layout --yaml -o r.yaml
	vps-verify r.yaml
	# bytes moved stay the lower bound; the holder sends less than all of them
	run vps-plan --relay a.layout b.layout --stats --load
	[ "$status" -eq 0 ]
	local moved lower sent0
	moved=$(awk '$1 == "bytes_moved:" { print $2 }' <<< "$output")
	lower=$(awk '$1 == "bytes_lower_bound:" { print $2 }' <<< "$output")
	sent0=$(awk '/rank: 0,/ { sub(/,/, "", $5); print $5 }' <<< "$output")
	[ "$moved" = "$lower" ]
	[ "$sent0" -lt "$moved" ]
	for r in 0 1 2 3; do
		# the same records; the pieces numbered in each plan (column 15)
		transfers_of "$r" --relay a.layout b.layout > rank.tsv
		transfers_of "$r" r.yaml > global.tsv
		cmp rank.tsv global.tsv
	done
	# a forward says so (the forward column), and its src_buffer is the
	# relay's B buffer, not a number with the flag bit set
	vps-plan --relay --transfers --rank 1 --format tsv a.layout b.layout |
		awk -F'\t' 'NR == 1 { ok = $14 == "forward" } NR > 1 && $14 == 1 { f++ } NR > 1 && $8 > 1000 { bad++ }
			END { exit !(ok && f > 0 && !bad) }'
	# the first forward (src_buffer with the target bit) now claims rank 3
	# passes on what rank 3 never received from a holder
	awk '/^- src:/ { at = NR; line = $0 } /^  src_buffer: 2147483648$/ && !done { done = at } { l[NR] = $0 }
		END { for (i = 1; i <= NR; i++) print (i == done ? "- src: 3" : l[i]) }' r.yaml > bad.yaml
	expect_status 1 vps-verify bad.yaml
	[[ "$output" == *"relay 3 passes on"*"elements, of which it receives 0 from holders"* ]]
	# devices of A relay only where none ends busier than a holder: pp=4 -> dp=4 gives each stage's layers
	# three receivers that hold none of them and one holder, all devices
	# of A, which plan as without relays, with --relay and by default
	vps-layout -q --model tiny-llama --parallel tp=1,pp=4,dp=1,zero=0 -o p4.layout
	vps-layout -q --model tiny-llama --parallel tp=1,pp=1,dp=4,zero=0 -o d4.layout
	vps-plan -q --no-relay p4.layout d4.layout -o direct.plan
	vps-plan -q --relay p4.layout d4.layout -o relayed.plan
	vps-plan -q p4.layout d4.layout -o auto.plan
	for r in 0 1 2 3; do
		cmp <(transfers_of $r direct.plan) <(transfers_of $r relayed.plan)
		cmp <(transfers_of $r direct.plan) <(transfers_of $r auto.plan)
	done
	# the plan says how it was planned (--relay alone is always): ranks
	# compare that too; one without relays says nothing, as before them
	vps-show relayed.plan | grep -qx 'relay: true'
	vps-show auto.plan | grep -qx 'relay: auto'
	! vps-show direct.plan | grep -q '^relay:'
}

@test "--relay --stats: the bounds are those of plans that relay, and the relayed plan of llama2-7b's join meets them" {
	vps-layout -q --model llama2-7b --parallel tp=8,dp=1,zero=1 -o a.layout
	vps-layout -q --model llama2-7b --parallel tp=8,dp=8,zero=1 -o b.layout
	run vps-plan --relay a.layout b.layout --stats --topology a800-testbed
	[ "$status" -eq 0 ]
	stat() { awk -v k="$1:" '$1 == k { print $2 }' <<< "$output"; }
	# a holder sends each of its elements once: its parameters once and
	# each receiver's optimizer shard, which only it holds, and no plan can
	# do with less; the planner's relays reach it
	[ "$(stat bytes_relayed)" -gt 0 ]
	[ "$(stat send_over_bound)" = 1.000 ]
	[ "$(stat max_send_bytes)" -ge "$(stat balanced_send_bound)" ]
	# no bound lies above the estimate of a plan that meets it, and the
	# floor from the layouts alone (each holder sends what only it holds
	# once) meets it too
	awk '$1 == "estimate_over_time_bound:" { exit !($2 >= 1 && $2 <= 1.01) }' <<< "$output"
	awk '$1 == "estimate_over_time_floor:" { exit !($2 >= 1 && $2 <= 1.01) }' <<< "$output"
	# by default the same plan: relays are chosen where they win
	run vps-plan a.layout b.layout --stats --topology a800-testbed
	[ "$(stat relay)" = auto ]
	[ "$(stat bytes_relayed)" -gt 0 ]
	[ "$(stat send_over_bound)" = 1.000 ]
	awk '$1 == "estimate_over_time_floor:" { exit !($2 >= 1 && $2 <= 1.01) }' <<< "$output"
	# without relays the holders send once a receiver, and the bounds say so
	run vps-plan --no-relay a.layout b.layout --stats --topology a800-testbed
	[ "$(stat relay)" = never ]
	[ "$(stat bytes_relayed)" = 0 ]
	[ "$(stat send_over_bound)" = 1.000 ]
	awk '$1 == "balanced_send_bound:" { exit !($2 > 20000000000) }' <<< "$output"
}

# What sets the estimate: --stats names the device, and --load's seconds
# say the same: its seconds are the estimate's, and no rank's are more; the
# NIC columns add up to the bytes that cross nodes, each within its rank's.
@test "--stats says which device sets the estimate, and --load each device's bytes over its NICs and time" {
	run vps-plan --transition llama2-7b-s1-s2 --stats --load --topology a800-testbed
	[ "$status" -eq 0 ]
	[[ "$output" == *'estimate_by: "world rank 5 (node 0 gpu 5): its sends over its NICs, 11794153472, and 7 peers"'* ]]
	awk -F'[{}]' -v est="$(stat estimate_seconds)" -v inter="$(stat bytes_inter_node)" '
		/^  - \{rank: / {
			n = split($2, kv, ", ")
			for (i = 1; i <= n; i++) { split(kv[i], p, ": "); f[p[1]] = p[2] }
			if (f["nic_send"] > f["send"] || f["nic_recv"] > f["recv"]) { print "rank " f["rank"] ": NIC bytes above its own"; bad = 1 }
			ns += f["nic_send"]; nr += f["nic_recv"]
			if (f["seconds"] + 0 > est + 0) { print "rank " f["rank"] ": " f["seconds"] " s, above the estimate"; bad = 1 }
			if (f["rank"] == 5 && f["seconds"] + 0 != est + 0) { print "rank 5: " f["seconds"] " s; estimate " est; bad = 1 }
		}
		END {
			if (ns != inter || nr != inter) { print "NIC bytes " ns ", " nr "; bytes_inter_node " inter; bad = 1 }
			exit bad
		}' <<< "$output"
	# without a topology, no time: the bytes alone
	run vps-plan --transition llama2-7b-s1-s2 --stats --load
	[[ "$output" != *estimate_by* ]]
	! grep -q '^  - {rank: .*seconds' <<< "$output"
	[[ "$output" == *'{rank: 5, send: 11794153472, recv: 5667422208, nic_send: 11794153472, nic_recv: 0, retain: 0}'* ]]
}

# Four receivers of each slice a node: each range crosses into a node once,
# to its gateway, which passes it on over NVLink (second hops, forward 2).
# The relayed estimate meets the floor, and --stats says what sets it.
@test "--relay across nodes: a range enters each node once, and the estimate meets the floor, which --stats names" {
	vps-layout -q --model llama2-7b --parallel tp=2,dp=4,zero=0 -o a.layout
	vps-layout -q --model llama2-7b --parallel tp=2,dp=16,zero=0 -o b.layout
	vps-plan -q --relay a.layout b.layout -o r.plan
	run vps-plan --relay --stats --topology a800-testbed a.layout b.layout
	[ "$status" -eq 0 ]
	stat() { awk -v k="$1:" '$1 == k { print $2 }' <<< "$output"; }
	[ "$(stat estimate_over_time_floor)" = 1.000 ]
	[[ "$output" == *'time_floor_by: "what leaves node 0, over its NICs"'* ]]
	relayed_inter=$(stat bytes_inter_node) relayed_estimate=$(stat estimate_seconds)
	# rank 8, a receiver on node 1, passes on to others of its node (and
	# only of its node) ranges it took in from outside; the node takes in
	# a third or less of what it takes without relays
	vps-plan --transfers --rank 8 --format tsv r.plan > t8.tsv
	awk -F'\t' '$2 == "send" && $14 == 2 { n++; if (int($3 / 8) != 1) bad = 1 } END { exit !(n > 0 && !bad) }' t8.tsv
	# without relays: several times the time, and the NIC bytes
	run vps-plan --relay=never --stats --topology a800-testbed a.layout b.layout
	awk -v r="$relayed_estimate" '$1 == "estimate_seconds:" { exit !($2 > 3 * r) }' <<< "$output"
	[ "$(stat bytes_inter_node)" -ge $((3 * relayed_inter)) ]
}

# Nodes that relay a stage together bound the relayed floor (docs/relay.md,
# "What no other node can carry"): in llama2-70b-tp-down-back A's stage 1
# (node 1) enters B's stage 1 on nodes 2 and 3, whose NICs carry their own
# stages out. The floor is those three nodes' 24 NICs, and the plan, whose
# ranged route its own model put there, lies within 1.02x of it (1.050x of
# the floor that bounded each node alone); gpt3-1.3b-dp-up-back, whose
# receivers keep the tied embedding, within 1.01x (the rotation's ranges
# are parts of what moves: 1.029x when they were parts of the buffer).
@test "on a800-testbed: a set of nodes that relay together bounds the floor, and the plans lie near it" {
	run vps-plan --transition llama2-70b-tp-down-back --stats --topology a800-testbed
	[ "$status" -eq 0 ]
	[[ "$output" == *'time_floor_by: "what the nodes of 24 NICs from node 1 send, entering each other and leaving, over their NICs"'* ]]
	awk '$1 == "estimate_over_relayed_time_floor:" { exit !($2 >= 1 && $2 <= 1.02) }' <<< "$output"
	run vps-plan --transition gpt3-1.3b-dp-up-back --stats --topology a800-testbed
	[ "$status" -eq 0 ]
	awk '$1 == "estimate_over_relayed_time_floor:" { exit !($2 >= 1 && $2 <= 1.01) }' <<< "$output"
}

# Who sends what on the paper's testbed (docs/relay.md, "Holders' entries
# by their whole box, served ranges in turn" and "Sharing once over
# NVLink"): llama2-7b-tp-down-back lies within 1.02x of its relayed floor
# (1.06x when the holders' entries were counted by their part of a
# region); in llama2-13b-tp-down-back node 1's NICs carry within 2% of
# each other (10%, when one member served the largest range of every
# region); in llama2-13b-ablation-s1-s2 node-mates pass on to each other
# what their node's holders send them alike, within their node only, and
# the busiest sends less than without relays.
@test "on a800-testbed: the tensor-parallel joins' holders and node-mates share their sends" {
	run vps-plan --transition llama2-7b-tp-down-back --stats --topology a800-testbed
	[ "$status" -eq 0 ]
	awk '$1 == "estimate_over_relayed_time_floor:" { exit !($2 <= 1.02) }' <<< "$output"
	run vps-plan --transition llama2-13b-tp-down-back --stats --load --topology a800-testbed
	[ "$status" -eq 0 ]
	awk -F'[{}]' '/^  - \{rank: / {
			n = split($2, kv, ", ")
			for (i = 1; i <= n; i++) { split(kv[i], p, ": "); f[p[1]] = p[2] }
			if (f["rank"] >= 8 && f["rank"] < 16) { if (f["nic_send"] > most) most = f["nic_send"]; if (!least || f["nic_send"] < least) least = f["nic_send"] }
		}
		END { if (!(least > 0 && most <= 1.02 * least)) { print "node 1 NICs: " least " to " most; exit 1 } }' <<< "$output"
	vps-plan -q --transition llama2-13b-ablation-s1-s2 --topology a800-testbed -o s.plan
	for r in 2 12; do
		vps-plan --transfers --rank "$r" --format tsv s.plan |
			awk -F'\t' -v r="$r" '$2 == "send" && $14 != 0 { n++; if (int($3 / 8) != int(r / 8)) bad = 1 } END { exit !(n > 0 && !bad) }'
	done
	most=$(vps-plan --transition llama2-13b-ablation-s1-s2 --stats --topology a800-testbed | awk '$1 == "max_send_bytes:" { print $2 }')
	direct=$(vps-plan --transition llama2-13b-ablation-s1-s2 --stats --no-relay --topology a800-testbed | awk '$1 == "max_send_bytes:" { print $2 }')
	[ "$most" -lt "$direct" ]
}

# Relays are on by default (--relay=auto): a region relays where its
# busiest sender gets faster, else the plan is the direct one. tiny-llama
# without ZeRO: dp=1 -> dp=4 (three receivers of one holder) relays, as
# --relay does; dp=4 -> dp=6 (two receivers of four holders) does not, its
# pieces the direct plan's; dp=3 -> dp=6 (three receivers of three holders)
# does, where --relay=always (the receivers outnumber the holders) does
# not. Never slower than without relays, vps-verify passes every plan and
# every rank's part is the global plan's.
@test "by default vps-plan relays where that wins: --no-relay, --relay=never|auto|always, --relay alone" {
	vps-layout -q --model tiny-llama --parallel tp=1,dp=1,zero=0 -o d1.layout
	for dp in 3 4 6; do vps-layout -q --model tiny-llama --parallel tp=1,dp=$dp,zero=0 -o d$dp.layout; done
	stat() { awk -v k="$1:" '$1 == k { print $2 }' <<< "$output"; }
	stats() { # A B OPTION...: vps-plan --stats into $output
		run vps-plan "${@:3}" "$1" "$2" --stats --topology a800-testbed
		[ "$status" -eq 0 ] || { echo "$output" >&2; return 1; }
	}
	stats d1.layout d4.layout
	[ "$(stat relay)" = auto ] && [ "$(stat bytes_relayed)" -gt 0 ]
	auto_est=$(stat estimate_seconds)
	stats d1.layout d4.layout --relay=auto
	[ "$(stat relay)" = auto ] && [ "$(stat bytes_relayed)" -gt 0 ]
	stats d1.layout d4.layout --relay
	[ "$(stat relay)" = always ] && [ "$(stat bytes_relayed)" -gt 0 ]
	stats d1.layout d4.layout --relay=always
	[ "$(stat relay)" = always ] && [ "$(stat bytes_relayed)" -gt 0 ]
	stats d1.layout d4.layout --relay=never
	[ "$(stat relay)" = never ] && [ "$(stat bytes_relayed)" = 0 ]
	stats d1.layout d4.layout --no-relay
	[ "$(stat relay)" = never ] && [ "$(stat bytes_relayed)" = 0 ]
	awk -v a="$auto_est" '$1 == "estimate_seconds:" { exit !(a < $2) }' <<< "$output"
	# two receivers of four holders: no region relays
	stats d4.layout d6.layout
	[ "$(stat bytes_relayed)" = 0 ]
	vps-plan -q d4.layout d6.layout -o auto.plan
	vps-plan -q --no-relay d4.layout d6.layout -o direct.plan
	for r in 0 4 5; do
		cmp <(transfers_of $r direct.plan) <(transfers_of $r auto.plan)
	done
	# three of three: relayed by default, not by the count of --relay
	stats d3.layout d6.layout
	[ "$(stat bytes_relayed)" -gt 0 ]
	stats d3.layout d6.layout --relay
	[ "$(stat bytes_relayed)" = 0 ]
	vps-plan -q d3.layout d6.layout -o auto.plan
	expect_status 0 vps-verify auto.plan
	for r in 0 3 5; do
		transfers_of $r d3.layout d6.layout > rank.tsv
		transfers_of $r auto.plan > global.tsv
		cmp rank.tsv global.tsv
	done
	# what a relay mode is, and what goes with what
	expect_status 2 vps-plan --relay=sometimes d1.layout d4.layout
	[[ "$output" == *"--relay: 'sometimes' is none of never, auto and always"* ]]
	expect_status 2 vps-plan --relay --no-relay d1.layout d4.layout
	[[ "$output" == *"--no-relay does not go with --relay"* ]]
	expect_status 2 vps-plan --no-relay=yes d1.layout d4.layout
}

# A plan records how it was planned: nothing without relays, `relay: true`
# for --relay (as plans of vps-plan --relay before relay modes, which
# still read and stage), `relay: auto` by default, with the bandwidths of
# the topology its choice weighed when given one. Ranks that planned their
# parts otherwise refuse each other (vps-exec; tests/unit/test_stage.c).
@test "a plan says how it chose relays; --relay plans read as before" {
	vps-layout -q --model tiny-llama --parallel tp=1,dp=1,zero=1 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,dp=4,zero=1 -o b.layout
	vps-plan -q --relay a.layout b.layout --yaml -o always.yaml
	grep -qx 'relay: true' always.yaml
	! grep -q '^relay_' always.yaml
	vps-plan -q a.layout b.layout --yaml -o auto.yaml
	grep -qx 'relay: auto' auto.yaml
	! grep -q '^relay_' auto.yaml
	vps-plan -q --topology a800-testbed a.layout b.layout --yaml -o weighed.yaml
	grep -qx 'relay: auto' weighed.yaml
	grep -qx 'relay_inter_node_bandwidth: 2.5e+10' weighed.yaml
	vps-plan -q --no-relay a.layout b.layout --yaml -o never.yaml
	! grep -q '^relay' never.yaml
	for f in always auto weighed never; do
		expect_status 0 vps-verify $f.yaml
		vps-stage -q --budget 64MiB $f.yaml -o $f.staged
		expect_status 0 vps-verify $f.staged
		# the staged plan (binary) holds the plan's, which says the same
		vps-show $f.staged > $f.shown
		cmp <(grep '^relay' $f.yaml) <(grep '^  relay' $f.shown | sed 's/^  //')
	done
	# the rank plans of each mode are the global plan's parts
	transfers_of 2 --topology a800-testbed a.layout b.layout > rank.tsv
	cmp rank.tsv <(transfers_of 2 weighed.yaml)
	sed 's/^relay: true$/relay: perhaps/' always.yaml > bad.yaml
	expect_status 2 vps-verify bad.yaml
	[[ "$output" == *"relay: 'perhaps' is none of true, false and auto"* ]]
}

@test "the summary says how many devices join and leave whenever they change" {
	# the same 8 ranks, 8 GPUs a node against 4: half the devices are others
	vps-layout -q --model tiny-llama --parallel tp=2,dp=4 --gpus-per-node 8 -o a8.layout
	vps-layout -q --model tiny-llama --parallel tp=2,dp=4 --gpus-per-node 4 -o b4.layout
	run vps-plan a8.layout b4.layout -o ab.plan
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" == "plan: "*" moved, the lower bound; busiest device "*"; 4 joining, 4 leaving" ]]
	# the same devices: nothing said of them
	vps-layout -q --model tiny-llama --parallel tp=1,dp=8 --gpus-per-node 8 -o c8.layout
	run vps-plan a8.layout c8.layout -o ac.plan
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" != *joining* ]]
}

@test "a plan moves every state of one optimizer and refuses to switch optimizers, naming the state" {
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,optimizer=muon -o muon.a -q
	vps-layout --model tiny-llama --parallel dp=4,zero=1,optimizer=muon -o muon.b -q
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 -o adam.a -q
	vps-layout --model tiny-llama --parallel tp=2,dp=2,optimizer=sgd -o sgd.a -q
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,precision_aware=1 -o pa.a -q
	expect_status 0 vps-plan muon.a muon.b -o ab.plan -q
	expect_status 0 vps-verify ab.plan
	expect_status 0 vps-plan --transfers --rank 0 --state momentum_buffer --format tsv ab.plan
	[ "${#lines[@]}" -gt 1 ]
	[[ "${lines[1]}" == *$'\tmomentum_buffer\t'* ]]
	expect_status 2 vps-plan adam.a muon.b
	[ "$output" = "vps-plan: the source steps the 2-D weights with adam, the target with muon: the source holds exp_avg, which the target has not; vps moves each state once and drops none (switching optimizers is out of scope)" ]
	expect_status 2 vps-plan sgd.a muon.b
	[ "$output" = "vps-plan: the source steps the 2-D weights with sgd, the target with muon: their momentum_buffer is not the same state, and switching optimizers is out of scope" ]
	expect_status 2 vps-plan adam.a pa.a
	[ "$output" = "vps-plan: the source holds main_param as fp32, the target as int16 (precision_aware, exp_avg, exp_avg_sq): vps moves bytes, it does not convert them" ]
	vps-layout --model tiny-llama --parallel pp=2,dp=2,optimizer=sgd -o sgd.b -q
	expect_status 0 vps-plan sgd.a sgd.b -o sgd.plan -q
	expect_status 2 vps-plan --transfers --rank 0 --state exp_avg --format tsv sgd.plan
	[ "$output" = "vps-plan: this plan moves no exp_avg (sgd keeps none)" ]
}
