#!/usr/bin/env bats
# Lost devices: vps-plan --lost plans from the survivors, lists exactly
# what none of them holds and refuses (exit 3) unless --allow-loss, which
# records those ranges in the plan for vps-verify, vps-stage and the
# executors; and a switch whose device died before it, end to end.

load helpers

# tiny-llama tp=2 on ranks 0 and 1 of node 0; B: tp=1 on rank 0's device
tp2() {
	vps-layout -q --model tiny-llama --parallel tp=2,dp=1 --gpus-per-node 4 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,dp=1 --gpus-per-node 4 -o b.layout
}

@test "tp=2, dp=1, rank 1 lost: refused with exit 3, its TP half listed tensor by tensor, state by state" {
	tp2
	expect_status 3 vps-plan --lost 1 --format tsv a.layout b.layout
	[[ "$output" == *"vps-plan: 136 ranges (42.1 MiB) of the source are held by no surviving rank"* ]]
	run sh -c 'vps-plan --lost 1 --format tsv a.layout b.layout 2>/dev/null'
	[ "${lines[0]}" = "$(printf 'tensor\tstate\tbox\telements\tbytes')" ]
	# 34 tensors TP splits, 4 states each; the norms survive on rank 0
	[ "${#lines[@]}" -eq 137 ]
	printf '%s\n' "${lines[@]}" | grep -qx "$(printf 'embedding.word_embeddings.weight\tparam\t512:1000,0:256\t124928\t249856')"
	printf '%s\n' "${lines[@]}" | grep -qx "$(printf 'decoder.layers.0.self_attention.linear_qkv.weight\texp_avg\t2:4,0:4,0:32,0:256\t65536\t262144')"
	printf '%s\n' "${lines[@]}" | grep -qx "$(printf 'decoder.layers.7.mlp.linear_fc2.weight\tmain_param\t0:256,344:688\t88064\t352256')"
	! printf '%s\n' "${lines[@]}" | grep -q layernorm
	total=$(printf '%s\n' "${lines[@]}" | awk -F'\t' 'NR > 1 { s += $5 } END { print s }')
	[ "$total" -eq 44097536 ]
	# YAML by default, JSON lines on request
	run sh -c 'vps-plan --lost 1 a.layout b.layout 2>/dev/null | head -1'
	[ "$output" = "- {tensor: embedding.word_embeddings.weight, state: param, box: [[512, 1000], [0, 256]], elements: 124928, bytes: 249856}" ]
	run sh -c 'vps-plan --lost 1 --format json a.layout b.layout 2>/dev/null | head -1'
	[ "$output" = '{"tensor":"embedding.word_embeddings.weight","state":"param","box":[[512,1000],[0,256]],"elements":124928,"bytes":249856}' ]
	# no plan was written
	expect_status 3 vps-plan -q --lost 1 a.layout b.layout -o p.plan
	[ ! -e p.plan ]
}

@test "--lost takes a devices file as well as ranks" {
	tp2
	printf 'vps: devices\nversion: 1\ndevices: [[0, 1]]\n' > lost.yaml
	vps-plan --lost 1 --format tsv a.layout b.layout > by-rank.tsv 2>/dev/null || [ $? -eq 3 ]
	vps-plan --lost lost.yaml --format tsv a.layout b.layout > by-device.tsv 2>/dev/null || [ $? -eq 3 ]
	[ -s by-rank.tsv ]
	cmp by-rank.tsv by-device.tsv
	printf 'vps: devices\nversion: 1\ndevices: [[5, 0]]\n' > other.yaml
	expect_status 2 vps-plan --lost other.yaml a.layout b.layout
	[[ "$output" == *"--lost: other.yaml: device (node 5, gpu 0) is not one of the source layout's"* ]]
}

@test "bad --lost input exits 2, saying what" {
	tp2
	expect_status 2 vps-plan --lost 7 a.layout b.layout
	[[ "$output" == *"--lost: rank 7 is outside the source layout's 2 ranks"* ]]
	expect_status 2 vps-plan --lost 0,1 --allow-loss a.layout b.layout
	[[ "$output" == *"every rank of the source layout is lost"* ]]
	expect_status 2 vps-plan --lost 1x a.layout b.layout
	expect_status 2 vps-plan --allow-loss a.layout b.layout
	[[ "$output" == *"--allow-loss goes with --lost"* ]]
	# B still places its rank 0 on the lost device of A's rank 0
	expect_status 2 vps-plan --lost 0 --allow-loss a.layout b.layout
	[[ "$output" == *"--lost: rank 0 of the source is lost, but the target places its rank 0 on that device (node 0 gpu 0)"* ]]
}

@test "--allow-loss: the plan records the lost ranges; vps-verify and vps-stage accept it, and only with them" {
	tp2
	vps-plan -q --lost 1 --allow-loss --yaml a.layout b.layout -o p.yaml
	run vps-verify p.yaml
	[ "$status" -eq 0 ]
	[[ "$output" == *"1 lost rank, 136 lost ranges (42.1 MiB) left for the trainer to reload"* ]]
	! grep -q '^- src: 1$' p.yaml
	vps-stage -q --budget 1MiB p.yaml -o p.staged
	vps-verify -q p.staged
	run vps-plan --lost 1 --allow-loss --stats a.layout b.layout
	[[ "$output" == *"lost_ranks: [1]"* ]]
	[[ "$output" == *"lost_ranges: 136"* ]]
	[[ "$output" == *"lost_bytes: 44097536"* ]]
	# a range left out of the record is a hole nobody accounts for (the
	# last range's three lines, before the plan's last key, its relay mode)
	[ "$(tail -n 1 p.yaml)" = "relay: auto" ]
	{ head -n -4 p.yaml; tail -n 1 p.yaml; } > short.yaml
	expect_status 1 vps-verify short.yaml
	[[ "$output" == *"rank 0: output_layer.weight exp_avg_sq [0:1000, 0:256]: 124928 elements are received from no one"* ]]
	expect_status 2 vps-stage --budget 1MiB short.yaml -o s.staged
	# a range a survivor holds cannot be recorded as lost
	{ head -n -1 p.yaml; printf '  - tensor: decoder.final_layernorm.weight\n    state: param\n    box: [[0, 256]]\n'; tail -n 1 p.yaml; } > more.yaml
	expect_status 1 vps-verify more.yaml
	[[ "$output" == *"is held by rank 0 of the source, which is not lost"* ]]
}

@test "tp=2, dp=2, rank 1 lost: nothing is lost, every piece comes from a survivor, per rank as globally" {
	vps-layout -q --model tiny-llama --parallel tp=2,dp=2 --gpus-per-node 4 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=2,dp=1 --gpus-per-node 4 --first-node 1 -o b.layout
	vps-plan -q --lost 1 --yaml a.layout b.layout -o p.yaml
	grep -q '^  ranks: \[1\]$' p.yaml
	grep -q '^  ranges: \[\]$' p.yaml
	! grep -q '^- src: 1$' p.yaml
	# B's TP rank 1 (world rank 5) takes A's TP rank 1 half from rank 3
	grep -A1 '^- src: 3$' p.yaml | grep -q '^  dst: 5$'
	vps-verify -q p.yaml
	expect_status 2 vps-plan --lost 1 --rank 1 a.layout b.layout
	[[ "$output" == *"world rank 1 is a lost device"* ]]
	for r in 0 2 3 4 5; do
		vps-plan -q --lost 1 --rank $r a.layout b.layout | vps-stage -q --budget 1MiB - -o s.$r.staged
		vps-verify -q s.$r.staged
		# the same records; the pieces numbered in each plan (column 15)
		transfers_of $r --lost 1 a.layout b.layout > mine.$r
		transfers_of $r p.yaml > global.$r
		cmp mine.$r global.$r
	done
}

# A dies before the switch: tp=2, dp=2, ZeRO-1 on node 0; rank 1's
# trainer is killed; B (tp=1, dp=3) uses the three surviving devices. Its
# parameters survive on rank 3; its optimizer shards had no replica.
@test "tcp: a device's trainer killed before the switch: the survivors switch around it, digest of what survived matches" {
	printf 'vps: devices\nversion: 1\ndevices: [[0, 0], [0, 2], [0, 3]]\n' > bdev.yaml
	vps-layout -q --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,dp=3,zero=1 --devices bdev.yaml -o b.layout
	tag=lost$$
	port=$("$TOP/scripts/free-port.sh")
	vps-plan -q --lost 1 --allow-loss --global-batch 12 a.layout b.layout -o ab.plan
	vps-stage -q --budget 1MiB ab.plan -o ab.staged
	vps-verify -q ab.staged
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --global-batch 12 --timeout 60 ab.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for i in $(seq 100); do [ -e "/dev/shm/$tag-1" ] && break; sleep 0.1; done
	kill -9 ${tp[1]}
	wait ${tp[1]} || true
	rm -f /dev/shm/"$tag"-1*
	for r in 0 2 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport tcp --wait --check --timeout 30 \
			ab.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	failed=0
	for r in 0 2 3; do wait ${ep[$r]} || failed=1; wait ${tp[$r]} || failed=1; done
	tail -n 3 e.* t.*
	[ "$failed" = 0 ]
	for r in 0 2 3; do
		grep -q "digest: match$" e.$r
		grep -q "0 wrong elements, 0 dirty padding, training state carried: ok" t.$r
	done
	# the lost list is exactly what rank 1 held and no other rank did
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 --tensor '*' --format tsv |
		awk -F'\t' 'NR > 1 { k = $1 "\t" $2 "\t" $8; n[k]++; if ($3 == "1") one[k] = 1 }
			END { for (k in one) if (n[k] == 1) print k }' | sort > only1
	vps-plan --lost 1 --format tsv a.layout b.layout 2>/dev/null | tail -n +2 | cut -f1-3 | sort > lost || [ $? -eq 3 ]
	[ "$(wc -l < lost)" -eq 51 ]
	cmp only1 lost
	! grep -qv -e main_param -e exp_avg lost
}

@test "a YAML plan says lost only when something was: plans without the key read, and round-trip through binary" {
	tp2
	vps-plan -q --yaml a.layout b.layout -o p.yaml
	! grep -q '^lost:' p.yaml
	vps-verify -q p.yaml
	vps-stage -q --budget 1MiB p.yaml -o p.staged
	vps-plan -q a.layout b.layout -o p.bin
	vps-show p.bin > back.yaml
	cmp back.yaml p.yaml
	# with a loss the key is there, and survives the same round trip
	vps-plan -q --lost 1 --allow-loss a.layout b.layout -o l.bin
	vps-show l.bin > l.yaml
	grep -q '^lost:' l.yaml
	vps-verify -q l.yaml
}
