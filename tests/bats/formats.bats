#!/usr/bin/env bats
# The two encodings as a user meets them: pipes, conversion, refusals.

load helpers

@test "yaml -> binary -> yaml is byte-identical" {
	vps-layout --model tiny-gpt --parallel tp=2,pp=2,dp=2,zero=1 --rank 0,7 --yaml > a.yaml
	vps-layout -i a.yaml > a.bin
	vps-layout -i - --yaml < a.bin > b.yaml
	cmp a.yaml b.yaml
	head -c 4 a.bin | od -An -tx1 | grep -q '89 56 50 53'
}

@test "a pipeline through - and -o writes files atomically" {
	vps-layout --model tiny-llama --parallel tp=2,dp=2 | vps-layout -i - -o out.layout
	[ -s out.layout ]
	[ -z "$(ls | grep tmp)" ]
	expect_status 0 vps-verify out.layout
	[[ "$output" == "out.layout: ok: tiny-llama: 4 ranks,"* ]]
}

@test "binary output is refused on a terminal" {
	command -v script >/dev/null || skip "script(1) is not installed"
	run script -qec "$VPS_BIN/vps-layout --model tiny-llama" /dev/null
	[ "$status" -eq 2 ]
	[[ "$output" == *"refusing to write binary output to a terminal (use --yaml or -o FILE)"* ]]
}

@test "damaged binary files exit 2 with the reason" {
	vps-layout --model tiny-llama --parallel tp=2 -o good.bin
	head -c 100 good.bin > short.bin
	expect_status 2 vps-verify short.bin
	[[ "$output" == *"short.bin: truncated zstd frame"* ]]
	size=$(stat -c %s good.bin)
	cp good.bin flip.bin
	printf '\x55' | dd of=flip.bin bs=1 seek=$((size - 6)) conv=notrunc 2>/dev/null
	expect_status 2 vps-verify flip.bin
	[[ "$output" == *"flip.bin: corrupt document"* ]]
	cp good.bin future.bin
	printf '\x09' | dd of=future.bin bs=1 seek=6 conv=notrunc 2>/dev/null
	expect_status 2 vps-verify future.bin
	[[ "$output" == *"future.bin: binary layout version 9 is newer than this build reads (4)"* ]]
	# version 1 lacked cp and grouped_gemm: refused by name, not misread
	cp good.bin old.bin
	printf '\x01' | dd of=old.bin bs=1 seek=6 conv=notrunc 2>/dev/null
	expect_status 2 vps-layout -i old.bin
	[ "$output" = "vps-layout: old.bin: binary layout version 1 was written by an older vps (this build reads versions 2 to 4): have that vps write it as YAML (--yaml), which this one reads" ]
	printf 'garbage\0\1' > junk.bin
	expect_status 2 vps-layout -i junk.bin
	[[ "$output" == *"junk.bin: wrong magic"* ]]
}

@test "a hand-edited rank is checked as written" {
	vps-layout --model tiny-llama --parallel tp=2 --rank 1 --yaml > edited.yaml
	# move the first region of rank 1 onto the second
	awk '/offset:/ && ++n == 2 { sub(/offset: [0-9]+/, "offset: 0") } { print }' edited.yaml > bad.yaml
	expect_status 1 vps-verify bad.yaml
	[[ "$output" == *"bad.yaml: rank 1: buffer 0: "*" overlaps "* ]]
	[[ "${lines[-1]}" == "bad.yaml: FAILED: "* ]]
}

@test "bad YAML names the file and line" {
	printf 'vps: layout\nversion: 1\nhash: 0x1\nmodel:\n  name: m\n  hidden: 64\n  layers: 2\n  heads: 4\n  ffn: 64\n  vocab: 99\n  colour: red\n' > m.yaml
	expect_status 2 vps-layout -i m.yaml
	[ "$output" = "vps-layout: m.yaml: line 11: unknown key 'colour'" ]
	# a key given twice: the second is named, with where the first was
	printf 'vps: layout\nversion: 1\nhash: 0x1\nmodel:\n  name: m\n  hidden: 64\n  layers: 2\n  heads: 4\n  ffn: 64\n  vocab: 99\n  layers: 4\n' > m.yaml
	expect_status 2 vps-layout -i m.yaml
	[ "$output" = "vps-layout: m.yaml: line 11: key 'layers' again (first at line 7)" ]
	printf 'vps: topology\nversion: 1\nname: two\nintra_node_bandwidth: 1e11\ninter_node_bandwidth: 1e10\nmemory_bandwidth: 1e12\nlatency: 1e-5\nlatency: 2e-5\n' > t.yaml
	vps-layout -q --model tiny-llama --parallel tp=2 -o a.layout
	expect_status 2 vps-plan --stats --topology t.yaml a.layout a.layout
	[ "$output" = "vps-plan: t.yaml: line 8: key 'latency' again (first at line 7)" ]
}

@test "every paper configuration verifies" {
	for f in "$TOP"/configs/parallel/*.yaml; do
		name=$(basename "$f" .yaml)
		vps-layout --parallel "$name" | vps-verify -q - || { echo "FAILED: $name"; return 1; }
	done
}

@test "a document of the wrong kind, to every tool that reads one: what it is, and what makes the kind expected" {
	local C=$TOP/configs
	vps-layout --model tiny-llama --parallel tp=2 -q -o a.layout
	vps-layout --model tiny-llama --parallel dp=2 -q -o b.layout
	vps-layout -i a.layout --yaml -q -o layout.yaml
	vps-plan a.layout b.layout -q -o ab.plan
	vps-plan a.layout b.layout --yaml -q -o plan.yaml
	vps-stage --budget 1M ab.plan -q -o ab.staged
	vps-stage --budget 1M ab.plan --yaml -q -o staged.yaml
	cp "$TOP/tests/bats/examples/report.0.yaml" report.yaml
	vps-show -q --binary -o report.bin report.yaml
	cp "$C/models/tiny-llama.yaml" model.yaml
	cp "$C/parallel/llama2-7b-2-2-2.yaml" parallel.yaml
	cp "$C/topologies/a800-testbed.yaml" topology.yaml
	cp "$C/transitions/llama2-7b-s1-s2.yaml" transition.yaml
	printf 'vps: devices\nversion: 1\ndevices:\n- [0, 0]\n- [0, 1]\n' > devices.yaml
	printf 'vps: budgets\nversion: 1\nbudgets: [1M]\n' > budgets.yaml
	# each file, the kind it is
	local -A kind=([a.layout]=layout [layout.yaml]=layout [ab.plan]=plan [plan.yaml]=plan [ab.staged]="staged plan"
		[staged.yaml]="staged plan" [report.yaml]=report [report.bin]=report [model.yaml]=model
		[parallel.yaml]="parallel configuration" [topology.yaml]=topology [transition.yaml]=transition
		[devices.yaml]="devices document" [budgets.yaml]="budgets document")
	# each place a tool reads a document: the kinds it takes, the command (F the file)
	local slots=(
		"layout|vps-layout -i F"
		"layout|vps-plan F b.layout"
		"plan|vps-stage --budget 1M F"
		"staged plan|vps-exec --rank 0 --world 2 --master 127.0.0.1:1 --timeout 1 F"
		"staged plan|vps-trainer --rank 0 --timeout 1 F"
		"layout, a plan or a staged plan|vps-verify F"
		"plan or a staged plan|vps-plan --transfers --rank 0 F"
		"budgets document|vps-stage --budgets F ab.plan"
		"topology|vps-plan --topology F a.layout b.layout"
		"model|vps-layout --parallel tp=1 --model F"
		"parallel configuration|vps-layout --model tiny-llama --parallel F"
		"devices document|vps-layout --model tiny-llama --devices F"
		"transition|vps-plan --transition F"
	)
	local -A how=()
	local slot want cmd f tool n=0 msg hint
	for slot in "${slots[@]}"; do
		want=${slot%%|*} cmd=${slot#*|} tool=${cmd%% *}
		for f in "${!kind[@]}"; do
			# a file of a kind the slot takes is not wrong
			[[ "a $want" =~ (^a |, a | or a )${kind[$f]}(,|$| or) ]] && continue
			run ${cmd/F/./$f}
			[ "$status" -eq 2 ] || { echo "${cmd/F/./$f}: exit $status: $output" >&2; return 1; }
			msg=$(grep -v 'Try ' <<<"$output" | head -1)
			[[ "$msg" =~ ^$tool:\ (rank\ 0:\ )?\./$f(:\ line\ [0-9]+)?:\ a\ ${kind[$f]},\ not\ a\ $want\ \((.+)\)$ ]] ||
				{ echo "${cmd/F/./$f}: $msg" >&2; return 1; }
			hint=${BASH_REMATCH[3]}
			# one table: the same words for one kind expected, whatever the tool
			[ -z "${how[$want]:-}" ] || [ "${how[$want]}" = "$hint" ] ||
				{ echo "$want: '${how[$want]}' and '$hint'" >&2; return 1; }
			how[$want]=$hint
			n=$((n + 1))
		done
	done
	[ "$n" -ge 140 ]
	# the commands it names are the tools' own
	[ "${how[layout]}" = "vps-layout --model MODEL --parallel SPEC -o FILE makes one" ]
	[ "${how[plan]}" = "vps-plan A B -o FILE makes one, from layouts A and B" ]
	[ "${how[staged plan]}" = "vps-plan A B | vps-stage --budget SIZE - -o FILE makes one" ]
	[ "${how[plan or a staged plan]}" = "vps-plan and vps-stage make them" ]
	[[ "${how[transition]}" == "vps-plan --transition list names those of configs/transitions; "* ]]
	[[ "${how[parallel configuration]}" == "configs/parallel holds them; vps-formats(5) PARALLEL DOCUMENTS says how to write one" ]]
}

@test "binary documents from before the family and optimizer keys read as Megatron's Adam in fp32, hash and all" {
	old="$TOP/tests/bats/old"
	# tests/bats/old/README: written by the vps before the family and optimizer keys
	[ "$(head -c 8 "$old/tiny-llama.v2.layout" | od -An -tx1 | tr -d ' ')" = 8956505301000200 ]
	expect_status 0 vps-layout -i "$old/tiny-llama.v2.layout" --yaml
	[[ "$output" == *"hash: 0x91d375860c695369"* ]]
	[[ "$output" != *"optimizer"* && "$output" != *"family"* && "$output" != *"dp_shard"* ]]
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 --rank 1 --yaml > now.yaml
	vps-layout -i "$old/tiny-llama.v2.layout" --yaml | cmp - now.yaml
	# converted, it is this build's binary layout
	vps-layout -i "$old/tiny-llama.v2.layout" -o new.layout
	[ "$(head -c 8 new.layout | od -An -tx1 | tr -d ' ')" = 8956505301000400 ]
	vps-layout -i new.layout --yaml | cmp - now.yaml
	expect_status 0 vps-verify "$old/tiny-llama.v3.plan"
	[[ "$output" == *"ok: tiny-llama: global plan over 4 world ranks, 628 pieces"* ]]
	expect_status 0 vps-verify "$old/tiny-llama.v3.staged"
	vps-show "$old/tiny-llama.v3.plan" | vps-show - -o plan.bin
	expect_status 0 vps-verify plan.bin
	vps-show "$old/tiny-llama.v3.staged" -o staged.yaml
	grep -q '^vps: staged' staged.yaml
}

@test "binary plans from before the relay modes read their relay bool as always, hash and all" {
	old="$TOP/tests/bats/old"
	# tests/bats/old/README: plan and staged plan binary 4, relayed (vps-plan --relay)
	[ "$(head -c 8 "$old/tiny-llama.v4.relay.plan" | od -An -tx1 | tr -d ' ')" = 8956505302000400 ]
	expect_status 0 vps-verify "$old/tiny-llama.v4.relay.plan"
	[[ "$output" == *"ok: tiny-llama: global plan over 4 world ranks, 1360 pieces (408 retains)"* ]]
	expect_status 0 vps-verify "$old/tiny-llama.v4.relay.staged"
	vps-layout --model tiny-llama --parallel tp=2 -o a.layout
	vps-layout --model tiny-llama --parallel dp=4 -o b.layout
	vps-plan a.layout b.layout --relay --yaml > now.yaml
	grep -q '^relay: true$' now.yaml
	vps-show "$old/tiny-llama.v4.relay.plan" | cmp - now.yaml
	# converted, it is this build's binary plan, relay mode and all
	vps-show --binary "$old/tiny-llama.v4.relay.plan" -o plan.bin
	[ "$(head -c 8 plan.bin | od -An -tx1 | tr -d ' ')" = 8956505302000600 ]
	vps-show plan.bin | cmp - now.yaml
	vps-show "$old/tiny-llama.v4.relay.staged" -o staged.yaml
	grep -q '^  relay: true$' staged.yaml
}

@test "binary documents from before offload read without it, hash and all, and convert to this build's" {
	old="$TOP/tests/bats/old"
	# tests/bats/old/README: layout binary 3, plan and staged plan binary 5
	[ "$(head -c 8 "$old/tiny-llama.v3.layout" | od -An -tx1 | tr -d ' ')" = 8956505301000300 ]
	[ "$(head -c 8 "$old/tiny-llama.v5.plan" | od -An -tx1 | tr -d ' ')" = 8956505302000500 ]
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,optimizer=muon --rank 1 --yaml > now.yaml
	vps-layout -i "$old/tiny-llama.v3.layout" --yaml | cmp - now.yaml
	! grep -q 'host\|offload' now.yaml
	vps-layout -i "$old/tiny-llama.v3.layout" -o new.layout
	[ "$(head -c 8 new.layout | od -An -tx1 | tr -d ' ')" = 8956505301000400 ]
	vps-layout -i new.layout --yaml | cmp - now.yaml
	expect_status 0 vps-verify "$old/tiny-llama.v5.plan"
	[[ "$output" == *"ok: tiny-llama: global plan over 4 world ranks, 628 pieces (192 retains)"* ]]
	expect_status 0 vps-verify "$old/tiny-llama.v5.staged"
	# its layouts are this build's, without offload: their hashes in the plan are theirs
	vps-layout --model tiny-llama --parallel tp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel dp=4,zero=1 -o b.layout
	vps-show "$old/tiny-llama.v5.plan" > plan.yaml
	for l in a b; do
		h=$(vps-layout -i $l.layout --yaml | awk '/^hash:/ { print $2; exit }')
		grep -q "$h" plan.yaml
	done
	vps-show --binary "$old/tiny-llama.v5.plan" -o plan.bin
	[ "$(head -c 8 plan.bin | od -An -tx1 | tr -d ' ')" = 8956505302000600 ]
	vps-show plan.bin | cmp - plan.yaml
}

@test "the optimizer's keys are written only where they are not Adam's, and come back" {
	vps-layout --model tiny-llama --parallel dp=2,zero=1 --yaml > adam.yaml
	! grep -q 'optimizer\|exp_avg\|precision_aware' adam.yaml
	vps-layout --model tiny-llama --parallel dp=2,zero=1,optimizer=muon,scalar=lion --rank 1 --yaml > muon.yaml
	grep -q '^  optimizer: muon$' muon.yaml
	grep -q '^  scalar: lion$' muon.yaml
	grep -q 'group: dense_layerwise' muon.yaml
	grep -q 'state: momentum_buffer' muon.yaml
	vps-layout -i muon.yaml | vps-layout -i - --yaml | cmp - muon.yaml
	vps-layout --model tiny-llama --parallel dp=2,zero=1,precision_aware=1,exp_avg_sq=bf16 --rank 0 --yaml > pa.yaml
	grep -q 'dtype: int16' pa.yaml
	vps-layout -i pa.yaml | vps-layout -i - --yaml | cmp - pa.yaml
	expect_status 0 vps-verify pa.yaml
	# a parallel file with the keys, and one with a bad value
	printf 'vps: parallel\nversion: 1\ndp: 2\nzero: 1\noptimizer: lion\n' > lion.yaml
	expect_status 0 vps-layout --model tiny-llama --parallel ./lion.yaml --stats
	[[ "$output" == *"optimizer: lion"* ]]
	printf 'vps: parallel\nversion: 1\ndp: 2\noptimizer: adagrad\n' > bad.yaml
	expect_status 2 vps-layout --model tiny-llama --parallel ./bad.yaml
	[ "$output" = "vps-layout: ./bad.yaml: line 4: optimizer: unknown optimizer 'adagrad' (adam, sgd, muon, lion)" ]
}
