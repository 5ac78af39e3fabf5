#!/usr/bin/env bats
# Real switches on this machine: a reference trainer and an executor per
# device, bytes over TCP on loopback. scripts/demo.sh exits 0 only when every
# rank's digest matches, every destination element equals the pattern,
# padding is zero, the training state was carried and every sample was read
# exactly once.

load helpers

demo() {
	run "$TOP/scripts/demo.sh" --budget 1MiB "$@"
	if [ "$status" -ne 0 ] || [[ "${lines[-1]}" != "digest: match" ]]; then
		echo "$output" | tail -30 >&2
		return 1
	fi
}

@test "dense LLaMA: tp, pp, dp with ZeRO-1, and back on the same connections" {
	demo --model tiny-llama --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back
}

@test "dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off" {
	demo --model tiny-llama --from tp=1,pp=2,dp=2,vpp=2,zero=1 --to tp=2,pp=3,dp=1,first=2,last=2,zero=0
}

@test "dense LLaMA: fp32 gradients travel too" {
	demo --model tiny-llama --from tp=2,dp=2,zero=1,grad=1 --to tp=1,pp=2,dp=2,zero=1,grad=1
}

@test "GPT with tied embeddings across pipeline stages" {
	demo --model tiny-gpt --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back
}

@test "MoE: expert parallelism and expert tensor parallelism" {
	demo --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=2,zero=1
}

@test "MoE: experts move from the dense buffer to their own" {
	demo --model tiny-qwen3-moe --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=2,ep=2,etp=1,zero=1
}

@test "devices join: 4 devices on one node become 8 on two" {
	demo --model tiny-llama --np 4 --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=2,dp=2,zero=1
}

@test "devices leave: 8 become 3, a world that is not a power of two" {
	demo --model tiny-gpt --np 4 --from tp=2,pp=2,dp=2,zero=1 --to tp=1,pp=1,dp=3,zero=1
}

@test "a world of 6 devices, TP and DP both change" {
	demo --model tiny-qwen3-moe --np 3 --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=1,pp=2,dp=3,ep=1,etp=1,zero=0 --back
}

# ---- failures: every rank stops within the timeout, sources intact ----

setup_plan() {
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 --gpus-per-node 4 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 64KiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	tag=bats$$
}

@test "a rank that never comes: every rank stops, naming it, sources intact" {
	setup_plan
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 30 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --wait --timeout 3 s.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 1 3; do wait ${ep[$r]} || true; wait ${tp[$r]} || true; done
	[ $((SECONDS - start)) -lt 20 ]
	# rank 2's trainer has no executor at all: it would wait for its timeout
	kill ${tp[2]} 2>/dev/null || true
	wait ${tp[2]} || true
	grep -q "bootstrap: rank 2 did not come within 3 s" e.0
	for r in 1 3; do grep -q "vps-exec: rank $r: bootstrap" e.$r; done
	for r in 0 1 3; do grep -q "the executor stopped" t.$r; grep -q "sources intact" t.$r; done
}

run_with_fault() { # fault for rank 1, then wait for the others
	setup_plan
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 10 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 2 3; do
		if [ $r = 1 ]; then
			VPS_FAULT=$1 vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --timeout 3 s.staged > e.$r 2>&1 &
		else
			vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --timeout 3 s.staged > e.$r 2>&1 &
		fi
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 2 3; do wait ${ep[$r]} || true; done
	took=$((SECONDS - start))
	kill -CONT ${ep[1]} 2>/dev/null || true
	kill ${ep[1]} 2>/dev/null || true
	for r in 0 1 2 3; do wait ${ep[$r]} 2>/dev/null || true; wait ${tp[$r]} 2>/dev/null || true; done
}

@test "a peer that stops answering mid-transfer: every rank stops within the timeout, naming it and the stage" {
	run_with_fault stall:5
	[ "$took" -lt 15 ]
	# rank 1's partners see the silence; the rest learn it through rank 0
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -q "no progress for 3 s from rank 1"
	for r in 0 2 3; do grep -q "vps-exec: rank $r: " e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
}

@test "a peer that dies mid-transfer: every rank stops, naming it and the stage, sources intact" {
	run_with_fault exit:5
	[ "$took" -lt 15 ]
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -qE "rank 1 closed the connection|rank 1: Connection reset"
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
	# rank 1's trainer sees its executor gone
	grep -q "its executor (pid [0-9]*) is gone; sources intact" t.1
}

@test "a rank with another staged plan: every rank refuses before a byte moves" {
	setup_plan
	vps-plan a.layout b.layout | vps-stage --budget 128KiB - -o other.staged
	for r in 0 1 2 3; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 20 s.staged > t.$r 2>&1 &
	done
	for r in 0 1 2 3; do
		plan=s.staged
		[ $r = 2 ] && plan=other.staged
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --wait --timeout 5 $plan > e.$r 2>&1 &
	done
	wait || true
	grep -q "rank 2 holds another staged plan" e.0
	for r in 0 1 3; do grep -q "sources intact" t.$r; done
}

@test "a registry of another layout is refused by name" {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o b.layout
	vps-layout --model tiny-llama --parallel tp=1,pp=2 --gpus-per-node 2 -o c.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o ab.staged
	vps-plan a.layout c.layout | vps-stage --budget 1MiB - -o ac.staged
	port=$("$TOP/scripts/free-port.sh")
	vps-trainer --registry "w$$-0" --rank 0 --timeout 20 ac.staged > t.0 2>&1 &
	vps-trainer --registry "w$$-1" --rank 1 --timeout 20 ac.staged > t.1 2>&1 &
	vps-exec --registry "w$$-%r" --rank 0 --master 127.0.0.1:$port --timeout 5 ab.staged > e.0 2>&1 &
	vps-exec --registry "w$$-%r" --rank 1 --master 127.0.0.1:$port --timeout 5 ab.staged > e.1 2>&1 &
	wait || true
	grep -q "the trainer switches to layout 0x.* the plan's target is 0x" e.0
}

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
