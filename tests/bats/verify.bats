#!/usr/bin/env bats
# vps-verify on plans with transit: arrivals into a device's transit area
# (dst_buffer 536870911, VPS_BUFFER_TRANSIT) and forwards out of it
# (src_buffer 2684354559 at hop 1), made by vps-plan on a topology, verify
# globally, staged, and rank by rank; edited by hand, each way of breaking
# them is named (man/vps-verify.1, "Transit areas").

load helpers

# tiny-llama (tp=2, pp=2) -> (tp=1, pp=2), two GPUs a node, on a800-testbed:
# rank 0 takes in part of what rank 1 needs and passes it on.
transit_plan() {
	vps-layout -q --model tiny-llama --parallel tp=2,pp=2,dp=1 --gpus-per-node 2 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,pp=2,dp=1 --gpus-per-node 2 -o b.layout
	vps-plan -q --topology a800-testbed a.layout b.layout "$@"
}

# edit_piece PLAN.yaml MARK N KEY VALUE: in the Nth piece of the plan that
# has the line MARK, set KEY to VALUE (a plan's YAML: one key a line).
edit_piece() {
	"$PY" - "$@" <<'PY'
import sys
path, mark, n, key, val = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
lines = open(path).read().split("\n")
starts = [i for i, l in enumerate(lines) if l.startswith("- src: ")]
seen = 0
for k, s in enumerate(starts):
    e = starts[k + 1] if k + 1 < len(starts) else len(lines)
    if any(lines[i].strip() == mark for i in range(s, e)):
        seen += 1
        if seen == n:
            for i in range(s, e):
                if lines[i][2:].startswith(key + ":"):
                    lines[i] = lines[i][:2] + key + ": " + val
                    break
            else:
                sys.exit("no " + key)
            break
else:
    sys.exit("no piece %d with %s" % (n, mark))
open(path, "w").write("\n".join(lines))
PY
}

# piece_index PLAN.yaml MARK N: the number vps-verify gives the Nth piece
# that has the line MARK (its place among the plan's pieces, from 0)
piece_index() {
	awk -v mark="$2" -v n="$3" '/^- src: / { i++ } { sub(/^  /, "") } $0 == mark && ++seen == n { print i - 1; exit }' "$1"
}

# broken FILE MARK N KEY VALUE: ab.yaml with that edit (edit_piece) as
# FILE, which vps-verify fails (exit 1), its output in $output
broken() {
	cp ab.yaml "$1"
	edit_piece "$@"
	expect_status 1 vps-verify "$1"
}

@test "vps-verify: a plan with transit verifies: global, staged, each rank's, each rank's staged part" {
	transit_plan -o ab.plan
	# it has arrivals into an area, and forwards out of one
	vps-plan --transfers --rank 0 --format tsv ab.plan | awk -F '\t' '$10 == 536870911 { n++ } END { exit !n }'
	vps-plan --transfers --rank 1 --format tsv ab.plan | awk -F '\t' '$8 == 536870911 && $14 == 1 { n++ } END { exit !n }'
	vps-stage -q --budget 64MiB ab.plan -o ab.staged
	run vps-verify ab.plan ab.staged
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "ab.plan: ok: tiny-llama: global plan over 4 world ranks, 437 pieces (100 retains), 84.2 MiB moved" ]
	[[ "${lines[1]}" == "ab.staged: ok: tiny-llama: "* ]]
	local r
	for r in 0 1 2 3; do
		vps-stage -q --budget 64MiB --rank $r ab.plan -o g$r.staged
		transit_plan --rank $r -o r$r.plan
		vps-stage -q --budget 64MiB r$r.plan -o r$r.staged
	done
	run vps-verify g0.staged g1.staged g2.staged g3.staged r0.plan r1.plan r2.plan r3.plan \
		r0.staged r1.staged r2.staged r3.staged
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c ': ok: ' <<<"$output")" -eq 12 ]
}

@test "vps-verify: forwards out of a transit area of what never arrived, of other elements, and arrivals that overlap or come from no holder fail" {
	transit_plan --yaml -o ab.yaml
	vps-verify -q ab.yaml
	local fwd1 fwd2 in1
	fwd1=$(piece_index ab.yaml "src_buffer: 2684354559" 1)
	fwd2=$(piece_index ab.yaml "src_buffer: 2684354559" 2)
	in1=$(piece_index ab.yaml "dst_buffer: 536870911" 1)
	[ -n "$fwd1" ] && [ -n "$fwd2" ] && [ -n "$in1" ]
	# the first forward out of rank 0's area reads bytes no piece brings there
	broken f.yaml "src_buffer: 2684354559" 1 src_offset 1000000000
	grep -q "^f.yaml: piece $fwd1 (decoder.layers.4.self_attention.linear_proj.weight param \[0:256, 0:128\]): relay 0 passes on from its transit area at offset 1000000000 what no piece brings there$" <<<"$output"
	# the second ([0:256, 128:256]) reads where the first arrived: other elements
	broken o.yaml "src_buffer: 2684354559" 2 src_offset 0
	grep -q "^o.yaml: piece $fwd2 (.* param \[0:256, 128:256\]): relay 0 passes on from its transit area at offset 0 other elements: piece $in1 (decoder.layers.4.self_attention.linear_proj.weight param \[0:256, 0:128\]) brings them there$" <<<"$output"
	# the second arrival (fp32, at element 16: byte 64) on the first's
	# bytes (bf16, from byte 0)
	broken v.yaml "dst_buffer: 536870911" 2 dst_offset 16
	grep -q "^v.yaml: rank 0: transit area: piece $in1 (.* param \[0:256, 0:128\]) overlaps piece $((in1 + 1)) (.* main_param \[0:256, 0:128\]) at byte 64$" <<<"$output"
	# the first arrival from rank 3, which holds the other columns
	broken h.yaml "dst_buffer: 536870911" 1 src 3
	grep -q "^h.yaml: piece [0-9]* (.* param \[0:256, 0:128\]): source 3 does not hold it at buffer 0 offset 1550592 under the source layout$" <<<"$output"
	# an arrival is no B element: one moved into B buffer 0 of rank 0 is
	# received there at no region (rank 0 holds pipeline stage 0)
	broken b.yaml "dst_buffer: 536870911" 1 dst_buffer 0
	grep -q "^b.yaml: piece [0-9]* (.*): destination 0 has no region for it at buffer 0 offset 0" <<<"$output"
	# a one-rank plan checks the forwards of its rank out of its own area
	transit_plan --rank 0 --yaml -o r0.yaml
	edit_piece r0.yaml "src_buffer: 2684354559" 1 src_offset 1000000000
	expect_status 1 vps-verify r0.yaml
	grep -q "relay 0 passes on from its transit area at offset 1000000000 what no piece brings there$" <<<"$output"
}
