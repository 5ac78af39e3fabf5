#!/usr/bin/env bats
# The checkpoint-and-restart baseline (scripts/bench/ckpt_bench.c,
# scripts/bench/ckpt_restart.sh): it saves and reloads the right bytes, reads
# no more than the new layout needs, and fails on a checkpoint that is
# missing, short, foreign or damaged, so it never times wrong work.
load helpers

ckpt=$TOP/build/bench/ckpt_bench

# tiny-llama, 8 ranks: (tp, pp, dp) = (2, 2, 2) -> (4, 1, 2), ZeRO-1
plan() {
	plain_make -s build/bench/ckpt_bench >/dev/null
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout -q
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 -o b.layout -q
	vps-plan a.layout b.layout 2>/dev/null | vps-stage --budget 64MiB - -o s.staged -q
	mkdir ck
}

@test "ckpt: every rank of B loads its state, checked, reading exactly what it needs" {
	plan
	expect_status 0 "$ckpt" save s.staged ck
	[ "$(ls ck | wc -l)" = 8 ]
	written=$(echo "$output" | awk '$1 == "bytes_written:" { print $2 }')
	# replicas write once: less than all of A's state, more than one copy of the model
	total=$(vps-layout -i a.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	logical=$(vps-layout -i a.layout --stats | awk '$1 == "logical_bytes:" { print $2 }')
	[ "$written" -lt "$total" ] && [ "$written" -ge "$logical" ]
	expect_status 0 "$ckpt" load s.staged ck
	# one line per rank of B, each after its check passed
	[ "$(echo "$output" | grep -c '^rank ')" = 8 ]
	read_bytes=$(echo "$output" | awk '$1 == "rank" { b += $3 } END { print b }')
	need=$(vps-plan a.layout b.layout --stats | awk '$1 == "bytes_moved:" || $1 == "bytes_retained:" { b += $2 } END { print b }')
	[ "$read_bytes" = "$need" ]
}

@test "ckpt: a damaged checkpoint fails the load with the wrong elements counted" {
	plan
	expect_status 0 "$ckpt" save s.staged ck
	printf '\xa5\x5a\xa5\x5a' | dd of=ck/rank-3.ckpt bs=1 seek=8192 conv=notrunc status=none
	expect_status 1 "$ckpt" load s.staged ck
	[[ "$output" == *"wrong elements"* ]]
}

@test "ckpt: a missing, short or foreign checkpoint file fails the load and names the file" {
	plan
	expect_status 0 "$ckpt" save s.staged ck
	cp ck/rank-5.ckpt r5
	rm ck/rank-5.ckpt
	expect_status 1 "$ckpt" load s.staged ck
	[[ "$output" == *"ck/rank-5.ckpt: No such file or directory"* ]]
	head -c 100000 r5 > ck/rank-5.ckpt
	expect_status 1 "$ckpt" load s.staged ck
	[[ "$output" == *"ck/rank-5.ckpt: truncated"* ]]
	cp ck/rank-4.ckpt ck/rank-5.ckpt
	expect_status 1 "$ckpt" load s.staged ck
	[[ "$output" == *"ck/rank-5.ckpt: not rank 5's checkpoint of layout A"* ]]
}

@test "ckpt: bad arguments are a usage error" {
	plain_make -s build/bench/ckpt_bench >/dev/null
	expect_status 2 "$ckpt" restore x y
	[[ "$output" == *usage:* ]]
	expect_status 2 "$ckpt" load nothing.staged ck
	[[ "$output" == *"nothing.staged"* ]]
}

@test "ckpt_restart.sh: vps, the baseline, PyTorch's DCP and Megatron's MCP side by side on a tiny model, and vps against DCP of a DTensor job, rows of figures" {
	framework_job
	CKPT_DIR=$BATS_TEST_TMPDIR MODELS=$TOP/configs/models/tiny-llama.yaml RUNS=1 PYTHON=$PY \
		DT_MODELS=$TOP/tests/torch/models/llama3-tiny.yaml \
		run env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u BUILDDIR -u BINDIR -u SANITIZE -u CFLAGS -u LDFLAGS \
		"$TOP/scripts/bench/ckpt_restart.sh"
	[ "$status" -eq 0 ] || { echo "$output"; false; }
	[ "$(echo "$output" | grep -c '^| 0\.10 |')" = 3 ]
	row=$(echo "$output" | grep '^| 0\.10 |' | head -1)
	# state, two vps pauses, save, load, total, two ratios: all figures
	[ "$(echo "$row" | awk -F'|' '{ n = 0; for (i = 2; i <= 9; i++) if ($i ~ /^ [0-9.]+x? $/) n++; print n }')" = 8 ]
	# DCP's, from the same run: save, load, total, against the files and vps's two
	row=$(echo "$output" | grep '^| 0\.10 |' | sed -n 2p)
	[ "$(echo "$row" | awk -F'|' '{ n = 0; for (i = 2; i <= 8; i++) if ($i ~ /^ [0-9.]+x? $/) n++; print n }')" = 7 ]
	[[ "$output" == *"torch.distributed.checkpoint over gloo, the same run"* ]]
	# MCP's, from the same run: save, load, total, against the files and vps's two
	row=$(echo "$output" | grep '^| 0\.10 |' | tail -1)
	[ "$(echo "$row" | awk -F'|' '{ n = 0; for (i = 2; i <= 8; i++) if ($i ~ /^ [0-9.]+x? $/) n++; print n }')" = 7 ]
	[[ "$output" == *"Megatron-LM's distributed checkpoint (MCP, the paper's baseline: megatron-core 0.19."*"the same run"* ]]
	# the DTensor job's (1.6 MB): two vps pauses, DCP's save, load and total, against vps's two
	[[ "$output" == *"A PyTorch-native job's state, the same run: llama3-tiny, "*"(dp_shard=4 to dp_shard=2,tp=2, 4 ranks"* ]]
	[ "$(echo "$output" | grep -c '^| 0\.00 |')" = 1 ]
	row=$(echo "$output" | grep '^| 0\.00 |')
	[ "$(echo "$row" | awk -F'|' '{ n = 0; for (i = 3; i <= 9; i++) if ($i ~ /^ [0-9.]+x? $/ && $i + 0 > 0) n++; print n }')" = 7 ]
	# the temporary checkpoint directory is gone
	[ -z "$(ls "$BATS_TEST_TMPDIR" | grep vps-ckpt)" ]
}

@test "plot_switch_size.py: a table that is not the baseline's is refused before anything is drawn" {
	printf 'size\tmethod\n' > bad.tsv
	expect_status 2 /usr/bin/python3 "$TOP/scripts/bench/plot_switch_size.py" bad.tsv out.svg
	[[ "$output" == *"bad.tsv: not a switch-vs-size table"* ]]
	printf 'state_bytes\tmethod\tseconds\n100\tvps-tcp\t-1\n' > neg.tsv
	expect_status 2 /usr/bin/python3 "$TOP/scripts/bench/plot_switch_size.py" neg.tsv out.svg
	[[ "$output" == *"neg.tsv:2: sizes and times must be positive"* ]]
	[ ! -e out.svg ]
}

# scripts/bench/ckpt_dcp.py: PyTorch's distributed checkpoint of the same
# state, each rank's regions as DCP shards, loaded resharded and checked
dcp() {
	"$PY" -c 'import torch.distributed.checkpoint' 2>/dev/null || skip "$PY has no torch.distributed.checkpoint"
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout -q
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 -o b.layout -q
	mkdir dcp
}

@test "ckpt_dcp.py: 8 ranks save with DCP, the ranks of B load it resharded, every element checked" {
	framework_job
	dcp
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" save a.layout dcp
	# one file per rank and DCP's metadata
	[ "$(ls dcp/*.distcp | wc -l)" = 8 ]
	[ -s dcp/.metadata ]
	written=$(echo "$output" | awk '$1 == "bytes_written:" { print $2 }')
	logical=$(vps-layout -i a.layout --stats | awk '$1 == "logical_bytes:" { print $2 }')
	total=$(vps-layout -i a.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	# replicas save once: every logical element, not every rank's copy
	[ "$written" -ge "$logical" ] && [ "$written" -lt "$total" ]
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" load b.layout dcp
	[ "$(echo "$output" | grep -c '^rank .* regions loaded, checked$')" = 8 ]
}

@test "ckpt_dcp.py: a damaged DCP checkpoint fails the load with the wrong elements counted" {
	framework_job
	dcp
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" save a.layout dcp
	printf '\xa5\x5a\xa5\x5a' | dd of=dcp/__3_0.distcp bs=1 seek=100000 conv=notrunc status=none
	expect_status 1 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" load b.layout dcp
	[[ "$output" == *"wrong elements, 0 nonzero padding elements after loading the checkpoint"* ]]
}

@test "ckpt_dcp.py: bad arguments are a usage error" {
	dcp
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" restore a.layout dcp
	[[ "$output" == *usage:* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" load nothing.layout dcp
	[[ "$output" == *"nothing.layout: no such layout file"* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dcp.py" save a.layout nodir
	[[ "$output" == *"nodir: not a directory"* ]]
}

# scripts/bench/ckpt_mcp.py: Megatron-LM's own distributed checkpoint of the
# same state, saved by A's jobs and loaded by B's, resharded and checked
mcp() {
	"$PY" -c 'import megatron.training' 2>/dev/null || skip "$PY has no megatron.training (make venv)"
	# two ranks, TP 2 -> DP 2: a tensor-parallel reshard, the ZeRO-1 shards made anew
	vps-layout --model tiny-llama --parallel tp=2,zero=1 -o a.layout -q
	vps-layout --model tiny-llama --parallel dp=2,zero=1 -o b.layout -q
	mkdir mcp
}

@test "ckpt_mcp.py: Megatron's save_checkpoint in A; a damaged file fails its load_checkpoint in B, the wrong elements counted" {
	# (ckpt_restart.sh's test above loads one whole, every element checked)
	framework_job
	mcp
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_mcp.py" save a.layout mcp
	[[ "$output" == *"format: torch_dist, fully_reshardable"* ]]
	[ "$(cat mcp/latest_checkpointed_iteration.txt)" = 1 ]
	[ -s mcp/iter_0000001/.metadata ]
	[ "$(echo "$output" | grep -c '^rank .* regions saved$')" = 2 ]
	# no process of the jobs outlives them (Megatron's writer starts one by spawn)
	[ -z "$(ps -eo args | grep "ckpt_mcp.py\|spawn_main" | grep "$TOP" | grep -v grep)" ]
	f=mcp/iter_0000001/__1_0.distcp
	printf '\xa5\x5a\xa5\x5a' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") / 2)) conv=notrunc status=none
	expect_status 1 "$PY" "$TOP/scripts/bench/ckpt_mcp.py" load b.layout mcp
	[[ "$output" == *"ckpt_mcp.py: load rank "*" wrong elements"* ]]
}

@test "ckpt_mcp.py: bad arguments are a usage error" {
	mcp
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_mcp.py" restore a.layout mcp
	[[ "$output" == *usage:* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_mcp.py" load nothing.layout mcp
	[[ "$output" == *"nothing.layout: no such layout file"* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_mcp.py" save a.layout nodir
	[[ "$output" == *"nodir: not a directory"* ]]
}

# scripts/bench/ckpt_dtensor.py: a PyTorch-native job's DTensors (torchtitan's
# llama3 under FSDP2, then FSDP2 x TP) through PyTorch's DCP as such a job
# checkpoints, loaded resharded and checked
dtensor() {
	"$PY" -c 'import torchtitan' 2>/dev/null || skip "$PY has no torchtitan (make venv)"
	vps-layout --model "$TOP/tests/torch/models/llama3-tiny.yaml" --parallel dp_shard=4 -o a.layout -q
	vps-layout --model "$TOP/tests/torch/models/llama3-tiny.yaml" --parallel dp_shard=2,tp=2 -o b.layout -q
	mkdir dcp
}

@test "ckpt_dtensor.py: A's ranks save get_state_dict with DCP, B's load it resharded, every element checked; a damaged element fails the load" {
	framework_job
	dtensor
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" save a.layout dcp
	# one file per rank and DCP's metadata; every parameter, and AdamW's two moments and step of each
	[ "$(ls dcp/*.distcp | wc -l)" = 4 ]
	[ -s dcp/.metadata ]
	[ "$(echo "$output" | grep -c '^rank [0-3]: 68 entries saved$')" = 4 ]
	expect_status 0 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" load b.layout dcp
	[ "$(echo "$output" | grep -c '^rank .* regions loaded, checked$')" = 4 ]
	# four bytes in the middle of the largest tensor saved
	"$PY" - dcp <<-'EOF'
		import sys
		import torch.distributed.checkpoint as dcp
		md = dcp.FileSystemReader(sys.argv[1]).read_metadata()
		info = max(md.storage_data.values(), key=lambda s: s.length)
		with open("%s/%s" % (sys.argv[1], info.relative_path), "r+b") as f:
		    f.seek(info.offset + info.length // 2)
		    f.write(b"\xa5\x5a\xa5\x5a")
	EOF
	mkdir tmp
	TMPDIR=$PWD/tmp expect_status 1 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" load b.layout dcp
	[[ "$output" == *"ckpt_dtensor.py: load rank "*" wrong elements, 0 nonzero padding elements after loading the checkpoint"* ]]
	# the ranks' store and results are gone, after a failure too (torch makes its own there)
	[ -z "$(ls tmp | grep vps-dcp-)" ]
}

@test "ckpt_dtensor.py: a Megatron layout, a model that is not torchtitan's llama3 and bad arguments are usage errors" {
	dtensor
	vps-layout --model tiny-llama --parallel dp=4 -o m.layout -q
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" save m.layout dcp
	[[ "$output" == *"m.layout: tp=1,pp=1,dp=4,"*" is a Megatron layout; this is a DTensor job's"* ]]
	vps-layout --model tiny-llama --parallel dp_shard=4 -o t.layout -q
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" save t.layout dcp
	[[ "$output" == *"t.layout: tiny-llama is not torchtitan's llama3 (ffn "* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" restore a.layout dcp
	[[ "$output" == *usage:* ]]
	expect_status 2 "$PY" "$TOP/scripts/bench/ckpt_dtensor.py" save a.layout nodir
	[[ "$output" == *"nodir: not a directory"* ]]
	[ -z "$(ls dcp)" ]
}
