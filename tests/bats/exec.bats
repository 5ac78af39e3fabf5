#!/usr/bin/env bats
# Real switches on this machine: a reference trainer and an executor per
# device, bytes over TCP on loopback or over host ipc (the ranks of a node map
# each other's shared-memory buffers). scripts/demo.sh exits 0 only when every
# rank's digest matches, every destination element equals the pattern,
# padding is zero, the training state was carried and every sample was read
# exactly once.
#
# Every end-to-end case and every failure is a function of the transport;
# each @test names its transport at the start of its title.

load helpers

demo() { # TRANSPORT demo.sh arguments... (switches over $over, default TRANSPORT)
	local transport=$1 dir=$BATS_TEST_TMPDIR/demo
	shift
	run "$TOP/scripts/demo.sh" --budget 1MiB --transport "$transport" --keep "$dir" "$@"
	if [ "$status" -ne 0 ] || [[ "${lines[-1]}" != "digest: match" ]]; then
		echo "$output" | tail -30 >&2
		return 1
	fi
	# every switch of every rank went over that transport, none over another
	local want=${over:-$transport} all n
	all=$(cat "$dir"/exec.*.log | grep -c 'digest: match$' || true)
	n=$(cat "$dir"/exec.*.log | grep -c " over $want; .*digest: match$" || true)
	if [ "$all" -eq 0 ] || [ "$all" -ne "$n" ]; then
		echo "$n of $all switches over $want:" >&2
		cat "$dir"/exec.*.log >&2
		return 1
	fi
}

# Rank RANK of the demo in $BATS_TEST_TMPDIR/demo sent what its plan says
# (its sends, forwards included); its report's bytes_sent in $sent.
sent_as_planned() { # RANK
	local planned
	planned=$("$VPS_BIN/vps-plan" --transfers --rank "$1" --format tsv "$BATS_TEST_TMPDIR/demo/ab.plan" |
		awk -F'\t' '$2 == "send" { n += $7 } END { print n + 0 }')
	sent=$(awk '/^  bytes_sent:/ { print $2; exit }' "$BATS_TEST_TMPDIR/demo/report.$1.yaml")
	[ "$sent" = "$planned" ] || { echo "rank $1 sent $sent, its plan $planned" >&2; return 1; }
}
all_sent_as_planned() { # WORLD: every rank below it
	local r
	for ((r = 0; r < $1; r++)); do
		sent_as_planned "$r" || return 1
	done
}

# ---- the cases, each over the transport given ----

dense_back() {
	demo "$1" --model tiny-llama --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back
}
dense_vpp() {
	demo "$1" --model tiny-llama --from tp=1,pp=2,dp=2,vpp=2,zero=1 --to tp=2,pp=3,dp=1,first=2,last=2,zero=0
}
dense_grad() {
	demo "$1" --model tiny-llama --from tp=2,dp=2,zero=1,grad=1 --to tp=1,pp=2,dp=2,zero=1,grad=1
}
gpt_tied() {
	demo "$1" --model tiny-gpt --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back
}
moe_ep() {
	demo "$1" --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=2,zero=1
}
moe_own() {
	demo "$1" --model tiny-qwen3-moe --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=2,ep=2,etp=1,zero=1
}
# Context parallelism changes together with TP, PP and DP; and CP with
# experts, whose data parallelism absorbs it.
cp_change() {
	demo "$1" --model tiny-llama --from tp=2,cp=2,pp=1,dp=2,zero=1 --to tp=4,cp=1,pp=2,dp=1,zero=1 --back
}
cp_moe() {
	demo "$1" --model tiny-qwen3-moe --from tp=2,cp=2,pp=1,dp=2,ep=4,etp=1,zero=1 --to tp=2,cp=1,pp=2,dp=2,ep=2,etp=1,zero=1
}
# Sequential experts to grouped-GEMM ones (another registration order, so
# other offsets and ZeRO shards) while EP and PP change, and back.
moe_grouped() {
	demo "$1" --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=1,zero=1,grouped_gemm=1 --back
}
# DeepSeek-V3-shaped: MLA's per-head up projections and whole down
# projections, shared experts in the dense buffer, dense first layers that
# a pipeline stage holds alone; TP, PP and EP change at once.
deepseek() {
	demo "$1" --model tiny-deepseek --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=4,pp=1,dp=2,ep=8,etp=1,zero=1 --back
}
# The CPU-offloaded optimizer: each shard's optimizer states split between
# a host buffer and the GPU one, by the fraction, on both sides; the split
# moves as TP, DP and the fraction change, and back to no offload.
offload() {
	demo "$1" --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,offload=0.5 --to tp=2,pp=1,dp=4,ep=4,etp=1,zero=1,offload=0.3 --back
}
# These three take devices per node: ipc reaches one node's ranks only, so
# over ipc the same switch runs with every device on one node.
join() { # TRANSPORT DEVICES_PER_NODE
	demo "$1" --np "$2" --model tiny-llama --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=2,dp=2,zero=1
}
leave() {
	demo "$1" --np "$2" --model tiny-gpt --from tp=2,pp=2,dp=2,zero=1 --to tp=1,pp=1,dp=3,zero=1
}
# Relayed joins: one holder, more receivers than two. Receivers pass on
# what the holder sent them (vps-plan --relay, or by default where that
# wins, as here): every rank's report sends what its plan says (the relays
# their forwards), and the holder less than every byte moved (each
# receiver's parameters would leave it once per receiver otherwise).
# RELAY: demo.sh's relay option (default --relay; empty: vps-plan's default).
relay_join() { # TRANSPORT DEVICES_PER_NODE DP [demo.sh arguments...]
	local transport=$1 np=$2 dp=$3 relay=(${RELAY---relay})
	shift 3
	demo "$transport" --np "$np" "${relay[@]}" "$@" --model tiny-llama --from tp=1,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=$dp,zero=1
	local dir=$BATS_TEST_TMPDIR/demo sent moved r
	for ((r = 0; r < dp; r++)); do
		sent_as_planned "$r" || return 1
		[ "$r" -eq 0 ] || [ "$sent" -gt 0 ] || { echo "relay $r passed nothing on" >&2; return 1; }
	done
	sent=$(awk '/^  bytes_sent:/ { print $2; exit }' "$dir/report.0.yaml")
	moved=$("$VPS_BIN/vps-plan" -q "$dir/a.layout" "$dir/b.layout" --stats | awk '$1 == "bytes_moved:" { print $2 }')
	[ "$sent" -gt 0 ] && [ "$sent" -lt "$moved" ] || { echo "rank 0 sent $sent of $moved moved: nothing relayed" >&2; return 1; }
}
# Devices that do not join relay by default (docs/relay.md, "Devices that
# do not join"): tiny-llama without ZeRO from pp=4, dp=2 to pp=4, dp=4.
# The new replicas of the first two stages are the devices of A (world
# ranks 0-7) that held the last two; they pass on what the holders sent
# them. Every rank sends what its plan says, forwards included, and
# --check proves every byte; planned by every rank alone, the ranks agree.
relay_from_a() { # TRANSPORT DEVICES_PER_NODE [demo.sh arguments...]
	local transport=$1 np=$2
	shift 2
	demo "$transport" --np "$np" "$@" --model tiny-llama --from tp=1,pp=4,dp=2,zero=0 --to tp=1,pp=4,dp=4,zero=0
	local dir=$BATS_TEST_TMPDIR/demo sent r from_a=0 fwd=()
	for ((r = 0; r < 16; r++)); do
		sent_as_planned "$r" || return 1
		fwd[r]=$("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' '$2 == "send" && $14 != 0 { n += $7 } END { print n + 0 }')
		[ "$r" -ge 8 ] || from_a=$((from_a + fwd[r]))
	done
	[ "$from_a" -gt 0 ] || { echo "no device of A passed anything on" >&2; return 1; }
	# on nodes of four, stage 2's devices (A ranks 4, 5) have more to
	# spare than stage 3's (6, 7) and pass on larger ranges (relay_weigh)
	[ "$np" != 4 ] || [ "${fwd[4]}" -gt "${fwd[6]}" ] ||
		{ echo "ranks 4 and 6 forward ${fwd[4]} and ${fwd[6]} bytes" >&2; return 1; }
}
world6() {
	demo "$1" --np "$2" --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=1,pp=2,dp=3,ep=1,etp=1,zero=0 --back
}

@test "tcp: dense LLaMA: tp, pp, dp with ZeRO-1, and back on the same connections" { dense_back tcp; }
@test "ipc: dense LLaMA: tp, pp, dp with ZeRO-1, and back on the same connections" { dense_back ipc; }

@test "tcp: dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off" { dense_vpp tcp; }
@test "ipc: dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off" { dense_vpp ipc; }

@test "tcp: dense LLaMA: fp32 gradients travel too" { dense_grad tcp; }
@test "ipc: dense LLaMA: fp32 gradients travel too" { dense_grad ipc; }

@test "tcp: GPT with tied embeddings across pipeline stages" { gpt_tied tcp; }
@test "ipc: GPT with tied embeddings across pipeline stages" { gpt_tied ipc; }

@test "tcp: MoE: expert parallelism and expert tensor parallelism" { moe_ep tcp; }
@test "ipc: MoE: expert parallelism and expert tensor parallelism" { moe_ep ipc; }

@test "tcp: MoE: experts move from the dense buffer to their own" { moe_own tcp; }
@test "ipc: MoE: experts move from the dense buffer to their own" { moe_own ipc; }

@test "tcp: context parallelism: cp, tp, pp and dp change at once, and back" { cp_change tcp; }
@test "ipc: context parallelism: cp, tp, pp and dp change at once, and back" { cp_change ipc; }

@test "tcp: context parallelism with experts: expert DP spans CP, then CP goes" { cp_moe tcp; }
@test "ipc: context parallelism with experts: expert DP spans CP, then CP goes" { cp_moe ipc; }
@test "tcp: MoE: sequential experts become grouped-GEMM ones, and back" { moe_grouped tcp; }
@test "ipc: MoE: sequential experts become grouped-GEMM ones, and back" { moe_grouped ipc; }

@test "tcp: the CPU-offloaded optimizer's host and GPU parts of each shard, another fraction, and back" { offload tcp; }
@test "ipc: the CPU-offloaded optimizer's host and GPU parts of each shard, another fraction, and back" { offload ipc; }
@test "tcp: DeepSeek-V3-style: MLA, shared experts, dense first layers, router bias, an MTP layer; tp, pp, ep change, and back" { deepseek tcp; }
@test "ipc: DeepSeek-V3-style: MLA, shared experts, dense first layers, router bias, an MTP layer; tp, pp, ep change, and back" { deepseek ipc; }

@test "tcp: devices join: 4 devices on one node become 8 on two" { join tcp 4; }
@test "ipc: devices join: 4 devices become 8, all on one node" { join ipc 8; }

@test "tcp: devices leave: 8 become 3, a world that is not a power of two" { leave tcp 4; }
@test "ipc: devices leave: 8 become 3 on one node, a world that is not a power of two" { leave ipc 8; }

@test "tcp: a world of 6 devices over two nodes, TP and DP both change" { world6 tcp 3; }
@test "ipc: a world of 6 devices on one node, TP and DP both change" { world6 ipc 6; }

# Each rank plans and stages only its own part; the executors all-reduce
# their per-step demands and cut the same stages before the switch.
per_rank() { # TRANSPORT DEVICES_PER_NODE
	demo "$1" --per-rank --np "$2" --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=1,pp=2,dp=3,ep=1,etp=1,zero=0 --back
}
@test "tcp: every rank plans and stages its own part, a world of 6 over two nodes, and back" { per_rank tcp 3; }
@test "ipc: every rank plans and stages its own part, a world of 6, and back" { per_rank ipc 6; }

@test "tcp: relayed join: dp=1 becomes dp=4, receivers pass pieces on" { relay_join tcp 8 4; }
# without a relay option: vps-plan's default relays where that wins
@test "tcp: a join planned by default relays: dp=1 becomes dp=8 over two nodes" {
	RELAY= relay_join tcp 4 8
	"$VPS_BIN/vps-show" "$BATS_TEST_TMPDIR/demo/ab.plan" | grep -qx 'relay: auto'
}
@test "tcp: a join planned by default by every rank alone relays: dp=1 becomes dp=4" {
	RELAY= relay_join tcp 8 4 --per-rank
}
@test "tcp: relayed join: dp=1 becomes dp=8 over two nodes" { relay_join tcp 4 8; }
# four nodes of two: the holder's node-mate carries ranges out, a node's
# first receiver passes them to another node's gateway (hop 2), which
# passes them on within its node (hop 3)
@test "tcp: relayed join: dp=1 becomes dp=8 over four nodes, hops up to 3" {
	relay_join tcp 2 8
	vps-plan --transfers --rank 2 --format tsv "$BATS_TEST_TMPDIR/demo/ab.plan" | awk -F'\t' '$14 == 3' | grep -q .
}
# one holder, two receivers: sent twice directly, once relayed
@test "tcp: relayed join: dp=1 becomes dp=3, the holder's parameters sent once" { relay_join tcp 8 3; }
# The holder plans alone and forwards nothing: the world's demands, not its
# own, tell it to agree on the forward steps with the relays.
@test "tcp: relayed join planned and staged by every rank alone: dp=1 becomes dp=4" { relay_join tcp 8 4 --per-rank; }
# ipc: the receivers copy from the relays' target buffers, mapped, once
# the relays say the stage that filled them is done
@test "ipc: relayed join: dp=1 becomes dp=4, receivers read the relays' targets" { relay_join ipc 8 4; }
@test "ipc: relayed join: dp=1 becomes dp=8" { relay_join ipc 8 8; }
@test "ipc: relayed join planned and staged by every rank alone: dp=1 becomes dp=8" { relay_join ipc 8 8 --per-rank; }

@test "tcp: devices that do not join relay by default: pp=4, dp=2 becomes dp=4 over four nodes, the busier passing on less" {
	relay_from_a tcp 4
}
@test "ipc: devices that do not join relay by default: pp=4, dp=2 becomes dp=4 on one node" { relay_from_a ipc 16; }
@test "tcp: devices that do not join relay by default, every rank planning and staging its own part" {
	relay_from_a tcp 4 --per-rank
}

# Busy devices of A take a region node by node from its holders
# (docs/relay.md, "Routes that spare busy relays"): tiny-llama from pp=2 to
# pp=4 (dp=4, ZeRO-1) over nodes of two, weighed on a800-testbed. B's
# stage 1 lies on the devices of A's stage 1 (world ranks 4-7, nodes 2
# and 3), busy sending their own stage to the joining devices: each range
# enters each of their nodes from a holder, and they pass it on to their
# node-mate alone. Of the holders (A's stage 0, ranks 0-3) rank 3 keeps
# its ZeRO-1 shards and has time to spare: it brings in more than twice
# the parameters any other does ("Entries by time to spare"). Every rank
# sends what its plan says, --check proves every byte, and planned by
# every rank alone, the ranks agree.
relay_by_node() { # TRANSPORT [demo.sh arguments...]
	demo "$1" --np 2 "${@:2}" --topology a800-testbed --model tiny-llama \
		--from tp=1,pp=2,dp=4,zero=1 --to tp=1,pp=4,dp=4,zero=1
	local dir=$BATS_TEST_TMPDIR/demo sent r fwd=0
	all_sent_as_planned 16
	for r in 4 5 6 7; do
		# forwards (column 14) to a rank on another node (two a node)
		read -r n away < <("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' -v r="$r" '$2 == "send" && $14 != 0 { n += $7; if (int($3 / 2) != int(r / 2)) a += $7 }
				END { print n + 0, a + 0 }')
		[ "$away" = 0 ] || { echo "rank $r forwards $away bytes off its node" >&2; return 1; }
		fwd=$((fwd + n))
	done
	[ "$fwd" -gt 0 ] || { echo "no device of A passed anything on" >&2; return 1; }
	# parameters each holder sends to another node
	local -a brought
	for r in 0 1 2 3; do
		brought[r]=$("$VPS_BIN/vps-plan" --transfers --rank "$r" --state param --format tsv "$dir/ab.plan" |
			awk -F'\t' -v r="$r" '$2 == "send" && int($3 / 2) != int(r / 2) { n += $7 } END { print n + 0 }')
	done
	for r in 0 1 2; do
		[ "${brought[3]}" -gt $((2 * brought[r])) ] ||
			{ echo "rank 3 brought in ${brought[3]} bytes of parameters, rank $r ${brought[r]}" >&2; return 1; }
	done
}
@test "tcp: busy devices of A pass on within their node only, each range entering it from a holder" {
	relay_by_node tcp
}
@test "tcp: busy devices of A pass on within their node, every rank planning and staging its own part" {
	relay_by_node tcp --per-rank
}

# A device busy over NVLink takes part of what its node holds from
# replicas on other nodes over its NIC (docs/relay.md, "Part over the
# NICs"): tiny-qwen3-moe from ep=2 to ep=4 (dp=8) on nodes of four, on
# a800-testbed without its latency. Every rank sends what its plan says,
# --check proves every byte, planned by every rank alone the ranks agree,
# and what crosses nodes is parameters, straight from a replica.
nic_share() { # TRANSPORT [demo.sh arguments...]
	demo "$1" --np 4 "${@:2}" --topology "$(fast_fabric)" --model tiny-qwen3-moe \
		--from tp=1,dp=8,ep=2,zero=1 --to tp=1,dp=8,ep=4,zero=1
	local dir=$BATS_TEST_TMPDIR/demo sent r across=0 n
	for ((r = 0; r < 8; r++)); do
		sent_as_planned "$r" || return 1
		n=$("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' -v r="$r" '$2 == "send" && int($3 / 4) != int(r / 4) {
				if ($5 != "param" || $14 != 0) bad = 1; n += $7 } END { print bad ? -1 : n + 0 }')
		[ "$n" -ge 0 ] || { echo "rank $r sends other than parameters, or forwards, off its node" >&2; return 1; }
		across=$((across + n))
	done
	[ "$across" -gt 0 ] || { echo "no byte crossed nodes" >&2; return 1; }
}
@test "tcp: a device busy over NVLink takes part of its node's data from replicas on other nodes" {
	nic_share tcp
}
@test "tcp: part over the NICs, every rank planning and staging its own part" {
	nic_share tcp --per-rank
}

# Node-mates share what a busy sender sends them alike (docs/relay.md,
# "Sharing once over NVLink"): tiny-llama from pp=4 (dp=1) to dp=4 (pp=1)
# on one node of four, like llama2-13b-ablation-s1-s2, on a800-testbed
# without its latency. Every rank sends what its plan says, --check proves
# every byte, and planned by every rank alone the ranks agree; devices
# pass on to node-mates what they took in, and the busiest sender sends
# less than without relays.
share_once() { # TRANSPORT [demo.sh arguments...]
	local fabric
	fabric=$(fast_fabric)
	demo "$1" --np 4 "${@:2}" --topology "$fabric" --model tiny-llama \
		--from tp=1,pp=4,dp=1,zero=1 --to tp=1,pp=1,dp=4,zero=1
	local dir=$BATS_TEST_TMPDIR/demo sent r fwd=0 n most direct
	for ((r = 0; r < 4; r++)); do
		sent_as_planned "$r" || return 1
		n=$("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' '$2 == "send" && $14 != 0 { n += $7 } END { print n + 0 }')
		fwd=$((fwd + n))
	done
	[ "$fwd" -gt 0 ] || { echo "no device passed anything on" >&2; return 1; }
	most=$("$VPS_BIN/vps-plan" --stats --topology "$fabric" "$dir/a.layout" "$dir/b.layout" 2>/dev/null |
		awk '/^max_send_bytes:/ { print $2 }')
	direct=$("$VPS_BIN/vps-plan" --stats --no-relay --topology "$fabric" "$dir/a.layout" "$dir/b.layout" 2>/dev/null |
		awk '/^max_send_bytes:/ { print $2 }')
	[ "$most" -lt "$direct" ] || { echo "busiest sender: $most bytes, $direct without relays" >&2; return 1; }
}
@test "tcp: node-mates share what a busy sender sends them alike" {
	share_once tcp
}
@test "tcp: sharing once, every rank planning and staging its own part" {
	share_once tcp --per-rank
}

# What busy senders send two node-mates alike enters the node once
# (docs/relay.md, "Entering once for the senders"): tiny-gpt from dp=1 to
# dp=2 (tp=2, pp=2) on nodes of four, on a800-testbed without its
# latency. The joining node's devices of both stages need the tied word
# embedding's slices, two holder records of B, from node 0's devices,
# whose NICs the node cannot relieve: one of them takes a slice in and
# passes it on to the other stage's from its own B buffer. Every rank
# sends what its plan says, --check proves every byte, and planned by
# every rank alone the ranks agree.
senders_entry() { # TRANSPORT [demo.sh arguments...]
	demo "$1" --np 4 "${@:2}" --topology "$(fast_fabric)" --model tiny-gpt \
		--from tp=2,pp=2,dp=1,zero=1 --to tp=2,pp=2,dp=2,zero=1
	local dir=$BATS_TEST_TMPDIR/demo sent r n=0
	all_sent_as_planned 8
	# the word embedding passed on between node 1's devices (ranks 4-7)
	for r in 4 5 6 7; do
		n=$((n + $("$VPS_BIN/vps-plan" --transfers --rank "$r" --tensor embedding.word_embeddings.weight \
			--format tsv "$dir/ab.plan" | awk -F'\t' '$2 == "send" && $14 != 0 && $3 >= 4 { n += $7 } END { print n + 0 }')))
	done
	[ "$n" -gt 0 ] || { echo "no slice of the tied embedding entered node 1 once" >&2; return 1; }
}
@test "tcp: what busy senders send two node-mates alike enters the node once" {
	senders_entry tcp
}
@test "tcp: entering once for the senders, every rank planning and staging its own part" {
	senders_entry tcp --per-rank
}

# Holders with time to spare send a range of a relayed buffer to every
# receiver, relayed by none (docs/relay.md, "A range for every receiver"):
# tiny-llama on nodes of two, like llama2-*-tp-up and -dp-up: B's stage 1
# lies on the devices of A's stages 2 and 3 (world ranks 8-15), busy with
# their own stages, while A's stage 1 (ranks 4-7) has time to spare. From
# tp=1 to tp=2 (pp=4, dp=4, ZeRO-1) on a800-testbed each receiver of a
# slice has a node of its own; from dp=4 to dp=8 two share a node, where
# the range enters once and is passed on (on a fabric whose latency is
# nothing against the bytes, as a800-testbed's against llama2's). Every
# rank sends what its plan says, --check proves every byte, and receivers
# on two nodes or more take the same elements of a relayed tensor straight
# from a holder; planned by every rank alone, the ranks agree.
relay_direct() { # TRANSPORT TO TOPOLOGY [demo.sh arguments...]
	demo "$1" --np 2 "${@:4}" --topology "$3" --model tiny-llama --from tp=1,pp=4,dp=4,zero=1 --to "$2"
	local dir=$BATS_TEST_TMPDIR/demo sent r direct twice
	all_sent_as_planned 32
	# the elements (box) of a tensor that two or more of its receivers take
	# straight from a holder where each takes others of it from relays,
	# and how often two of them on one node (two a node) do
	read -r direct twice < <(for ((r = 0; r < 32; r++)); do
		"$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" | awk -F'\t' 'NR > 1 && $2 == "send"'
	done | awk -F'\t' '{ k = $4 "|" $5; if ($14 != 0) fwd[$3, k] = 1; else { n++; peer[n] = $3; key[n] = k; box[n] = k "|" $6; b[n] = $7 } }
		END { for (i = 1; i <= n; i++) if ((peer[i], key[i]) in fwd && !((box[i], peer[i]) in seen)) {
				seen[box[i], peer[i]] = 1; to[box[i]]++; at[box[i]] = b[i]
				if (++on[box[i], int(peer[i] / 2)] == 2) t++ }
			for (x in to) if (to[x] >= 2) s += at[x] * to[x]; print s + 0, t + 0 }')
	[ "$direct" -gt 0 ] || { echo "no receiver of a relayed tensor took elements straight from a holder that another did too" >&2; return 1; }
	[ "$twice" = 0 ] || { echo "$twice times two receivers on one node took the same elements from a holder" >&2; return 1; }
}
# a800-testbed with next to no latency
fast_fabric() {
	sed 's/^name: .*/name: fast-fabric/; s/^latency: .*/latency: 1e-9/' "$TOP/configs/topologies/a800-testbed.yaml" \
		> "$BATS_TEST_TMPDIR/fast-fabric.yaml"
	echo "$BATS_TEST_TMPDIR/fast-fabric.yaml"
}
@test "tcp: holders with time to spare send a range of a relayed buffer to every receiver" {
	relay_direct tcp tp=2,pp=4,dp=4,zero=1 a800-testbed
}
@test "tcp: a range to every receiver, every rank planning and staging its own part" {
	relay_direct tcp tp=2,pp=4,dp=4,zero=1 a800-testbed --per-rank
}
@test "tcp: a range to every receiver enters a node once, and its first receiver there passes it on" {
	relay_direct tcp tp=1,pp=4,dp=8,zero=1 "$(fast_fabric)"
}

# Transit (docs/exec.md, "The transit area"): tiny-llama from (tp=2, pp=2)
# to (tp=1, pp=2) over nodes of two, weighed on a800-testbed. B's second
# stage lands on node 0's rank 1, and node 1 holds it: rank 0, whose NIC
# has room, takes part of it into its transit area and passes it on over
# the node's links (21 MiB of area, beside the staging budget, which is
# 1 MiB here: many stages). Every rank sends what its plan says, bytes went
# into an area and out of it, and --check proves every byte of B.
transit() { # TRANSPORT [demo.sh arguments...]
	demo "$1" --np 2 --budget 1MiB "${@:2}" --topology a800-testbed --model tiny-llama \
		--from tp=2,pp=2,dp=1,zero=1 --to tp=1,pp=2,dp=1,zero=1
	local dir=$BATS_TEST_TMPDIR/demo planned sent r into out in=0 on=0
	for ((r = 0; r < 4; r++)); do
		# column 8 is the source buffer's index, 10 the destination's, 14 forward
		read -r planned into out < <("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' '$2 == "send" { n += $7; if ($8 == 536870911 && $14 != 0) o += $7 }
				$2 == "recv" && $10 == 536870911 { i += $7 } END { print n + 0, i + 0, o + 0 }')
		sent=$(awk '/^  bytes_sent:/ { print $2; exit }' "$dir/report.$r.yaml")
		[ "$sent" = "$planned" ] || { echo "rank $r sent $sent, its plan $planned" >&2; return 1; }
		in=$((in + into))
		on=$((on + out))
	done
	[ "$in" -gt 0 ] || { echo "nothing went into a transit area" >&2; return 1; }
	[ "$on" = "$in" ] || { echo "$in bytes went into transit areas, $on out of them" >&2; return 1; }
}
@test "tcp: a rank passes on from its transit area what it took in for a node-mate" {
	transit tcp
}
@test "tcp: transit, every rank planning and staging its own part" {
	transit tcp --per-rank
}
@test "nccl: transit through an area of GPU memory (stand-ins)" {
	transit nccl --standin --cuda
}
@test "nccl: transit through an area of GPU memory, every rank planning its own part (stand-ins)" {
	transit nccl --standin --cuda --per-rank
}
@test "auto: node-mates read a GPU transit area over ipc, nccl between nodes (stand-ins)" {
	over=ipc+nccl transit auto --standin --cuda
}
@test "auto: a GPU transit area over ipc, every rank planning its own part (stand-ins)" {
	over=ipc+nccl transit auto --standin --cuda --per-rank
}
# Replicas whose own ZeRO-1 shards differ share the parameters by weights
# (docs/plan.md, rule 6): tiny-llama from tp=2 to tp=4 (dp=4) over nodes of
# four, weighed on a800-testbed. Node 0's data-parallel ranks 2 and 3 send
# their shards to node 1; ranks 0 and 1, whose shards stay, serve more of
# the parameters there: each of node 0's ranks sends off the node at
# least half what the busiest does, every rank what its plan says, and
# --check proves every byte.
@test "tcp: replicas whose own shards differ share the parameters by weights" {
	demo tcp --np 4 --topology a800-testbed --model tiny-llama --from tp=2,pp=1,dp=4,zero=1 --to tp=4,pp=1,dp=4,zero=1
	local dir=$BATS_TEST_TMPDIR/demo planned sent r away least=-1 most=0
	for ((r = 0; r < 16; r++)); do
		read -r planned away < <("$VPS_BIN/vps-plan" --transfers --rank "$r" --format tsv "$dir/ab.plan" |
			awk -F'\t' '$2 == "send" { n += $7; if ($3 >= 4) a += $7 } END { print n + 0, a + 0 }')
		sent=$(awk '/^  bytes_sent:/ { print $2; exit }' "$dir/report.$r.yaml")
		[ "$sent" = "$planned" ] || { echo "rank $r sent $sent, its plan $planned" >&2; return 1; }
		if [ "$r" -lt 4 ]; then # over its NIC: to ranks off node 0
			least=$((least < 0 || away < least ? away : least))
			most=$((away > most ? away : most))
		fi
	done
	[ $((2 * least)) -ge "$most" ] || { echo "node 0's ranks send $least to $most bytes off the node" >&2; return 1; }
}

# A relay that dies: rank 1 of dp=1 -> dp=4 exits at stage 1, before its
# forwards. The holder names it, every rank it was to pass on to names it
# as a relay with the bytes still due, and the holder's sources are intact.
relay_dies() { # TRANSPORT
	local dir=$BATS_TEST_TMPDIR/rd r
	run timeout 120 "$TOP/scripts/demo.sh" --transport "$1" --relay --model tiny-llama --from tp=1,pp=1,dp=1,zero=1 \
		--to tp=1,pp=1,dp=4,zero=1 --timeout 5 --fault-rank 1 exit:1 --keep "$dir"
	[ "$status" -eq 1 ] || { echo "$output" | tail -20; return 1; }
	# a socket that held unread bytes is reset rather than closed (under load)
	grep -qE "rank 1 closed the connection|rank 1: Connection reset" "$dir/exec.0.log" ||
		{ cat "$dir/exec.0.log" >&2; return 1; }
	for r in 2 3; do
		grep -Eq "of forwards still due to rank $r from relays? ([0-9]+, )*1(,|;| and)" "$dir/exec.$r.log" ||
			{ cat "$dir/exec.$r.log" >&2; return 1; }
	done
	grep -q "sources intact" "$dir/trainer.0.log"
	! grep -q DAMAGED "$dir"/trainer.*.log
}
@test "tcp: a relay that dies is named by the holder and by each rank it was to pass on to; sources intact" { relay_dies tcp; }
@test "ipc: a relay that dies is named by the holder and by each rank it was to pass on to; sources intact" { relay_dies ipc; }

@test "auto: within one node auto is ipc, and needs no GPU" {
	over=ipc demo auto --np 2 --model tiny-llama --from tp=2,zero=1 --to tp=1,dp=2,zero=1
}

@test "ipc: a switch between nodes: every rank refuses, naming auto, sources intact" {
	# 2 devices on node 0 join 2 on node 1
	run "$TOP/scripts/demo.sh" --budget 1MiB --transport ipc --keep k --np 2 \
		--model tiny-llama --from tp=2,zero=1 --to tp=2,dp=2,zero=1
	[ "$status" -ne 0 ]
	for r in 0 1 2 3; do
		grep -q "vps-exec: rank $r: transport ipc: rank $r exchanges with a device on node [01], and ipc reaches only this node's ranks (auto uses nccl across nodes)" k/exec.$r.log
		! grep -q "switch 1: sent" k/exec.$r.log
	done
	# the first layout's devices keep their state; the joining ones had none
	# whether its trainer asked before or after the executor stopped
	for r in 0 1; do grep -q "switch 1 failed: the executor stopped: rank $r: transport ipc: .*; sources intact" k/trainer.$r.log; done
	for r in 2 3; do grep -q "switch 1 failed: the executor stopped: rank $r: transport ipc: .*; sources none (joining)" k/trainer.$r.log; done
}

# ---- transports this machine cannot use, or that do not exist ----

small_world() { # two ranks, tp=2 -> dp=2, one node
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	tag=g$$
}

@test "an unknown transport is refused, naming the accepted ones" {
	small_world
	expect_status 2 vps-exec --transport bogus --rank 0 --master 127.0.0.1:$port s.staged
	[ "${lines[0]}" = "vps-exec: --transport: 'bogus' is not tcp, ipc, nccl or auto" ]
}

@test "a registry name with an unknown %-sequence is refused, naming the name" {
	vps-layout --model tiny-llama -q -o a.layout
	vps-plan a.layout a.layout -q | vps-stage --budget 1MiB -q - -o s.staged
	expect_status 2 vps-exec --registry 'vps-%x' --rank 0 --master 127.0.0.1:1 s.staged
	[ "$output" = "vps-exec: rank 0: registry name 'vps-%x': unknown '%x' (%j job, %r world rank, %a source rank, %b target rank, %l local rank, %% a percent sign)" ]
}

@test "nccl without GPU support: every rank stops with exit 2, naming it, sources intact" {
	if ls /dev/nvidia0 >/dev/null 2>&1; then skip "this machine has a GPU"; fi
	small_world
	for r in 0 1; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 20 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport nccl --wait --timeout 5 s.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 1; do
		st=0
		wait ${ep[$r]} || st=$?
		[ "$st" -eq 2 ]
		wait ${tp[$r]} || true
	done
	[ $((SECONDS - start)) -lt 15 ]
	for r in 0 1; do
		grep -q "vps-exec: rank $r: GPU support is not available" e.$r
		grep -q "the executor stopped: rank $r: GPU support is not available.*; sources intact" t.$r
		no_gpu_said_plainly e.$r
	done
}

# Where libvps-cuda.so loads, the reason is said plainly first (no driver,
# an old one, none visible), the CUDA runtime's words after it.
no_gpu_said_plainly() {
	grep -Eq "GPU support is not available: (no usable GPU was found: .+ \(CUDA says: .+\)|libvps-cuda.so cannot be loaded)" "$1"
}

@test "a trainer with --cuda and no GPU support exits 2, naming it; its executor stops" {
	if ls /dev/nvidia0 >/dev/null 2>&1; then skip "this machine has a GPU"; fi
	small_world
	for r in 0 1; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 20 --cuda s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport tcp --timeout 1 s.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 1; do
		st=0
		wait ${tp[$r]} || st=$?
		cat t.$r
		[ "$st" -eq 2 ]
		grep -q "vps-trainer: rank $r: GPU support is not available" t.$r
		no_gpu_said_plainly t.$r
		st=0
		wait ${ep[$r]} || st=$?
		[ "$st" -ne 0 ]
		# no registry was left behind for it to find
		grep -q "vps-exec: rank $r: no trainer has created registry $tag-$r within 1 s" e.$r
	done
	[ $((SECONDS - start)) -lt 15 ]
	[ ! -e "/dev/shm/$tag-0" ] && [ ! -e "/dev/shm/$tag-1" ]
}

# ---- failures: every rank stops within the timeout, sources intact ----
# Each a function of the transport, run over tcp and over ipc. The plans are
# made once, for every run.

setup_file() {
	mkdir "$BATS_FILE_TMPDIR/plans" && cd "$BATS_FILE_TMPDIR/plans" || return 1
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 --gpus-per-node 4 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 64KiB - -o s.staged
	vps-plan a.layout b.layout | vps-stage --budget 128KiB - -o other.staged
}

setup_plan() { # TRANSPORT
	transport=$1
	cp "$BATS_FILE_TMPDIR"/plans/* .
	port=$("$TOP/scripts/free-port.sh")
	tag=bats$$
}

# shown only when a @test fails
show_logs() {
	tail -n 5 e.* t.* 2>/dev/null || true
}

never_comes() {
	setup_plan $1
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 30 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport --wait --timeout 3 s.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 1 3; do wait ${ep[$r]} || true; wait ${tp[$r]} || true; done
	took=$((SECONDS - start))
	# rank 2's trainer has no executor at all: it would wait for its timeout
	kill ${tp[2]} 2>/dev/null || true
	wait ${tp[2]} || true
	show_logs
	[ "$took" -lt 20 ]
	grep -q "bootstrap: rank 2 did not come within 3 s" e.0
	for r in 1 3; do grep -q "vps-exec: rank $r: bootstrap" e.$r; done
	for r in 0 1 3; do grep -q "the executor stopped" t.$r; grep -q "sources intact" t.$r; done
}

@test "tcp: a rank that never comes: every rank stops, naming it, sources intact" { never_comes tcp; }
@test "ipc: a rank that never comes: every rank stops, naming it, sources intact" { never_comes ipc; }

run_with_fault() { # TRANSPORT FAULT [TIMEOUT]: the fault for rank 1, then wait for the others
	setup_plan $1
	local timeout=${3:-3}
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout $((timeout + 7)) s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 2 3; do
		if [ $r = 1 ]; then
			VPS_FAULT=$2 "$VPS_FAULT_BIN/vps-exec" --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport --timeout $timeout s.staged > e.$r 2>&1 &
		else
			vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport --timeout $timeout s.staged > e.$r 2>&1 &
		fi
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 2 3; do wait ${ep[$r]} || true; done
	took=$((SECONDS - start))
	# rank 1 stops on its own unless its fault stopped it: on a loaded
	# machine it may print its reason after its peers have
	case $2 in stall:*) ;; *) for _ in $(seq 50); do kill -0 ${ep[1]} 2>/dev/null || break; sleep 0.1; done ;; esac
	kill -CONT ${ep[1]} 2>/dev/null || true
	kill ${ep[1]} 2>/dev/null || true
	for r in 0 1 2 3; do wait ${ep[$r]} 2>/dev/null || true; wait ${tp[$r]} 2>/dev/null || true; done
	show_logs
}

stalled_peer() {
	run_with_fault $1 stall:5
	[ "$took" -lt 15 ]
	# rank 1's partners see the silence, or its tree neighbour's heartbeats
	# do first (the control tree), and every other rank learns it from the
	# tree: each names rank 1, one of them in stage 5
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -qE "no progress for 3 s from rank 1|rank 1 gave no sign of life for 3 s"
	for r in 0 2 3; do grep -qE "no progress for 3 s from rank 1|rank 1 gave no sign of life for 3 s" e.$r; done
	for r in 0 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
}

@test "tcp: a peer that stops answering mid-transfer: every rank stops within the timeout, naming it and the stage" { stalled_peer tcp; }
@test "ipc: a peer that stops answering mid-transfer: every rank stops within the timeout, naming it and the stage" { stalled_peer ipc; }

dead_peer() {
	run_with_fault $1 exit:5
	[ "$took" -lt 15 ]
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -qE "rank 1 closed the connection|rank 1: Connection reset"
	for r in 0 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
	# rank 1's trainer sees its executor gone
	grep -q "its executor (pid [0-9]*) is gone; sources intact" t.1
}

@test "tcp: a peer that dies mid-transfer: every rank stops, naming it and the stage, sources intact" { dead_peer tcp; }

# Links that break while every process lives (VPS_FAULT=cut: rank 1 shuts
# its data connections down and goes on): no rank left, so no cause comes
# by the control tree; the ranks at the broken links must not wait out
# --timeout (30 s here) for one.
cut_links() {
	run_with_fault $1 cut:5 30
	[ "$took" -lt 15 ]
	grep -h "stage 5 of" e.0 e.1 | grep -q "no rank said why within 5 s: the connection broke while both ranks ran"
	for r in 0 1 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 1 2 3; do grep -q "sources intact" t.$r; done
}

@test "tcp: data connections that break while every rank lives: every rank stops well within the timeout, naming the broken link" { cut_links tcp; }
@test "ipc: data connections that break while every rank lives: every rank stops well within the timeout, naming the broken link" { cut_links ipc; }
@test "ipc: a peer that dies mid-transfer: every rank stops, naming it and the stage, sources intact" { dead_peer ipc; }

other_plan() {
	setup_plan $1
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 20 s.staged > t.$r 2>&1 &
	done
	for r in 0 1 2 3; do
		plan=s.staged
		[ $r = 2 ] && plan=other.staged
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport --wait --timeout 5 $plan > e.$r 2>&1 &
	done
	wait || true
	show_logs
	grep -q "rank 2 holds another staged plan" e.0
	for r in 0 1 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 1 3; do grep -q "sources intact" t.$r; done
}

@test "tcp: a rank with another staged plan: every rank refuses before a byte moves" { other_plan tcp; }
@test "ipc: a rank with another staged plan: every rank refuses before a byte moves" { other_plan ipc; }

# Ranks planning their own parts: one that planned without relays
# (--no-relay) expects its ranges from the holder, which sends them to the
# relays only. The relay mode is part of what ranks compare, so they
# refuse before a byte moves.
@test "tcp: a rank that planned its part without relays while the others relayed: every rank refuses before a byte moves" {
	setup_plan tcp
	vps-layout --model tiny-llama --parallel tp=1,dp=1,zero=1 --gpus-per-node 4 -o r1.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 --gpus-per-node 4 -o r4.layout
	for r in 0 1 2 3; do
		relay=--relay=auto
		[ $r = 2 ] && relay=--no-relay
		vps-plan $relay r1.layout r4.layout --rank $r | vps-stage --budget 64KiB - -o r.$r.staged
		vps-trainer --registry "$tag-$r" --rank $r --timeout 20 r.$r.staged > t.$r 2>&1 &
	done
	for r in 0 1 2 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --wait --timeout 5 r.$r.staged > e.$r 2>&1 &
	done
	wait || true
	show_logs
	grep -q "rank 2 holds another staged plan" e.0
	for r in 0 1 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	grep -q "sources intact" t.0
	for r in 1 2 3; do grep -q "sources none (joining)" t.$r; done
}

other_layout() {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o b.layout
	vps-layout --model tiny-llama --parallel tp=1,pp=2 --gpus-per-node 2 -o c.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o ab.staged
	vps-plan a.layout c.layout | vps-stage --budget 1MiB - -o ac.staged
	port=$("$TOP/scripts/free-port.sh")
	vps-trainer --registry "w$$-0" --rank 0 --timeout 20 ac.staged > t.0 2>&1 &
	vps-trainer --registry "w$$-1" --rank 1 --timeout 20 ac.staged > t.1 2>&1 &
	vps-exec --registry "w$$-%r" --rank 0 --master 127.0.0.1:$port --transport $1 --timeout 5 ab.staged > e.0 2>&1 &
	vps-exec --registry "w$$-%r" --rank 1 --master 127.0.0.1:$port --transport $1 --timeout 5 ab.staged > e.1 2>&1 &
	wait || true
	show_logs
	grep -q "the trainer switches to layout 0x.* the plan's target is 0x" e.0
}

@test "tcp: a registry of another layout is refused by name" { other_layout tcp; }
# Ranks 0 and 1 hold their own parts, staged from their one-rank plans;
# ranks 2 and 3 their parts cut from the global staging: the stages the
# executors agree on are the global staging's, and the switch is whole.
mixed_parts() {
	setup_plan $1
	for r in 0 1; do
		vps-plan a.layout b.layout --rank $r | vps-stage --budget 64KiB - -o p.$r
	done
	for r in 2 3; do
		vps-plan a.layout b.layout | vps-stage --budget 64KiB --rank $r - -o p.$r
	done
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 30 p.$r > t.$r 2>&1 &
	done
	for r in 0 1 2 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport --wait --check --timeout 10 p.$r > e.$r 2>&1 &
	done
	wait || true
	show_logs
	for r in 0 1 2 3; do grep -q "digest: match" e.$r; grep -q "0 wrong elements.*: ok$" t.$r; done
}
@test "tcp: ranks holding their own staged parts and parts of the global staging switch together" { mixed_parts tcp; }

@test "ipc: a registry of another layout is refused by name" { other_layout ipc; }

@test "launcher variables: torchrun, Slurm and Open MPI give the rank" {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	for r in 0 1; do vps-trainer --registry "l$$-$r" --rank $r --timeout 20 s.staged > t.$r 2>&1 & done
	RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
		vps-exec --registry "l$$-%r" --check s.staged > e.0 2>&1 &
	SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
		vps-exec --registry "l$$-%r" --check s.staged > e.1 2>&1 &
	wait
	grep -q "digest: match" e.0
	grep -q "digest: match" e.1
	OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 run vps-exec --master 127.0.0.1:1 s.staged
	[ "$status" -eq 2 ]
	[[ "$output" == *"the launcher's world is 3, the plan's transition world 2"* ]]
	run vps-exec s.staged
	[ "$status" -eq 2 ]
	[[ "$output" == *"no rank: give --rank"* ]]
}

# VPS_FAULT is the tests' interface (docs/exec.md, "Faults for the tests"):
# the executor a user runs has no code for it, the tests' one (make
# fault-bin) alone obeys it. A world of one rank, one stage.
@test "bin/vps-exec ignores VPS_FAULT; only the tests' executor injects it" {
	vps-layout --model tiny-llama --parallel tp=1,dp=1,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=1,zero=0 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 64KiB - -o s.staged
	local tag=bats$$ port exe st
	port=$("$TOP/scripts/free-port.sh")
	for exe in vps-exec "$VPS_FAULT_BIN/vps-exec"; do
		vps-trainer --registry "$tag-0" --rank 0 --timeout 30 s.staged > t.0 2>&1 &
		st=0
		VPS_FAULT=exit:0 "$exe" --registry "$tag-0" --rank 0 --master 127.0.0.1:$port s.staged > e.0 2>&1 || st=$?
		wait $! || true
		cat e.0 t.0
		if [ "$exe" = vps-exec ]; then
			[ "$st" -eq 0 ]
			grep -q "vps-trainer: rank 0: 1 switch, .*: ok" t.0
		else
			[ "$st" -eq 3 ]
			grep -q "its executor (pid [0-9]*) is gone; sources intact" t.0
		fi
	done
	# (the name it reads is in the tests' executor alone)
	strings -a "$VPS_FAULT_BIN/vps-exec" | grep -qx VPS_FAULT
	! strings -a "$VPS_BIN/vps-exec" | grep -qx VPS_FAULT
}

# ---- a rank stopped as the switch starts, a trainer killed mid-switch ----

stopped_at_start() {
	# the default --request-timeout (600 s) must not apply: every rank has
	# heartbeats from rank 0, and rank 0 from every rank, while they wait
	run_with_fault $1 stall:claim
	[ "$took" -lt 15 ]
	grep -q "rank 1 gave no sign of life for 3 s while the ranks waited for the switch" e.0
	for r in 2 3; do grep -q "vps-exec: rank $r: rank 0: rank 1 gave no sign of life" e.$r; done
	for r in 0 2 3; do ! grep -q "switch 1: sent" e.$r; grep -q "sources intact" t.$r; done
}

@test "tcp: a rank stopped as the switch starts: every rank stops within the timeout, not the request timeout" { stopped_at_start tcp; }
@test "ipc: a rank stopped as the switch starts: every rank stops within the timeout, not the request timeout" { stopped_at_start ipc; }

trainer_killed() {
	run_with_fault $1 kill-trainer:2
	# a trainer killed by SIGKILL leaves its registry (stale, for the next
	# trainer of that name to replace): this test's goes now
	rm -f "/dev/shm/$tag-1" "/dev/shm/$tag-1".*
	[ "$took" -lt 15 ]
	grep -q "vps-exec: rank 1: the trainer (pid [0-9]*) of registry $tag-1 died during the switch" e.1
	for r in 0 2 3; do grep -q "vps-exec: rank $r: rank 1 failed: the trainer (pid [0-9]*) of registry $tag-1 died" e.$r; done
	for r in 0 1 2 3; do ! grep -q "digest: match" e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
}

@test "tcp: a trainer killed mid-switch fails the switch on every rank" { trainer_killed tcp; }
@test "ipc: a trainer killed mid-switch fails the switch on every rank" { trainer_killed ipc; }

# ---- a frozen rank, rank 0 included, is named by every other rank ----
# within twice --timeout of when it stopped (vps-exec(1), Failures): rank
# 0 is the control tree's root, rank 2 a leaf of it. The frozen executor is
# stopped (SIGSTOP) as it begins stage 5; the test takes the time the
# kernel reports it stopped and the time each other executor ends.

frozen() { # TRANSPORT RANK
	setup_plan $1
	local bad=$2 T=3 r st now
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 30 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 2 3; do
		if [ $r = $bad ]; then
			VPS_FAULT=stall:5 "$VPS_FAULT_BIN/vps-exec" --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport \
				--timeout $T s.staged > e.$r 2>&1 &
			ep[$r]=$!
		else
			(vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport $transport \
				--timeout $T s.staged > e.$r 2>&1 || true; date +%s.%N > end.$r) &
			ep[$r]=$!
		fi
	done
	for _ in $(seq 1500); do
		st=$(awk '{ print $3 }' /proc/${ep[$bad]}/stat 2>/dev/null || true)
		[ "$st" = T ] && break
		sleep 0.02
	done
	stopped=$(date +%s.%N)
	for r in 0 1 2 3; do [ $r = $bad ] || wait ${ep[$r]} || true; done
	kill -CONT ${ep[$bad]} 2>/dev/null || true
	kill ${ep[$bad]} 2>/dev/null || true
	for r in 0 1 2 3; do wait ${ep[$r]} 2>/dev/null || true; wait ${tp[$r]} 2>/dev/null || true; done
	show_logs
	[ "$st" = T ]
	for r in 0 1 2 3; do
		[ $r = $bad ] && continue
		now=$(cat end.$r)
		echo "rank $r ended $(awk -v a="$stopped" -v b="$now" 'BEGIN { printf "%.2f", b - a }') s after rank $bad stopped" >&2
		awk -v a="$stopped" -v b="$now" -v T=$T 'BEGIN { exit !(b - a <= 2 * T) }'
		grep -qE "rank $bad gave no sign of life for 3 s|no progress for 3 s from rank $bad" e.$r
		grep -q "sources intact" t.$r
	done
}

@test "tcp: a frozen rank 0 is named by every other rank within twice the timeout" { frozen tcp 0; }
@test "tcp: a frozen middle rank is named by every other rank within twice the timeout" { frozen tcp 2; }
@test "ipc: a frozen rank 0 is named by every other rank within twice the timeout" { frozen ipc 0; }
