#!/usr/bin/env bats
# The Python module (python/vps) and the PyTorch trainer that switches
# mid-training (examples/torch), as a user runs them.

load helpers

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment)"
}

@test "the module's unit tests pass against the library" {
	run "$PY" -m unittest discover -s "$TOP/tests/python"
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "make install puts a module that finds its own library and configs" {
	# the plain build, even under make asan (helpers.bash)
	plain_make -s install PREFIX="$PWD/inst" >/dev/null
	site=$(echo "$PWD"/inst/lib/python3*/dist-packages)
	cd /
	run env -u VPS_CONFIG_PATH PYTHONPATH="$site" "$PY" -c '
import vps, vps._lib as L
lay = vps.layout("tiny-llama", "tp=2,dp=2,zero=1")
print(L._candidates()[0], lay.world, len(lay.rank(3).params))'
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "$BATS_TEST_TMPDIR/inst/lib/libvps.so 4 51" ]
}

# Every step's loss of a run that switches through three layouts (TP, PP,
# DP and ZeRO-1 all change) against the static run of the same global batch
# and data: within 1e-3 relative, and the state equal bit for bit across
# each switch.
@test "a run switching every 10 steps through three layouts trains as the static run" {
	common=(--nproc 4 --model micro-llama --gpus-per-node 4 --steps 40 --global-batch 8 --micro-batch 2)
	run "$PY" "$TOP/examples/torch/launch.py" "${common[@]}" --dir static --configs tp=2:dp=2:zero=1 \
		--loss-log static/loss.txt
	echo "$output"
	[ "$status" -eq 0 ]
	run "$PY" "$TOP/examples/torch/launch.py" "${common[@]}" --dir switched --check-switch --switch-every 10 \
		--configs tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2 --loss-log switched/loss.txt
	echo "$output"
	[ "$status" -eq 0 ]
	cat switched/train.0.log
	[ "$(grep -c 'equal bit for bit' switched/train.0.log)" -eq 3 ]
	[ "$(cat switched/exec.*.log | grep -c 'digest: match')" -eq 12 ]
	[ "$(wc -l < static/loss.txt)" -eq 40 ]
	[ "$(cut -d' ' -f3 switched/loss.txt | uniq | tr '\n' ' ')" = "tp=2,dp=2,zero=1 pp=2,dp=2 tp=2,pp=2 tp=2,dp=2,zero=1 " ]
	run paste -d' ' static/loss.txt switched/loss.txt
	echo "$output" | awk '{ d = ($2 - $5) / $2; if (d < 0) d = -d; if (d > m) m = d; if ($1 != $4) bad = 1 }
		END { printf "largest relative deviation %.3g\n", m; exit (m > 1e-3 || bad || NR != 40) }'
	# the loss went down: it learns
	awk 'NR == 1 { a = $2 } END { exit !($2 < a - 0.5) }' switched/loss.txt
}

@test "launch.py refuses a configuration the job's ranks do not fill, before starting anything" {
	expect_status 2 "$PY" "$TOP/examples/torch/launch.py" --nproc 2 --dir r --model micro-llama --configs tp=4
	[[ "$output" == *"--configs: tp=4 has a world of 4 ranks, --nproc is 2"* ]]
	[ ! -e r ]
	expect_status 2 "$PY" "$TOP/examples/torch/launch.py" --nproc 2 --dir r --model micro-llama --configs tp=3
	[[ "$output" == *"tp=3 does not divide heads=8 of micro-llama"* ]]
	expect_status 2 "$PY" "$TOP/examples/torch/launch.py" --nproc 2 --dir r --model micro-llama --configs cp=2
	[[ "$output" == *"--configs: cp=2: context parallelism is not implemented by this example (cp=2)"* ]]
	[ ! -e r ]
}

@test "an executor that dies stops the job, and the job leaves nothing in /dev/shm" {
	# the launcher's registries are vps-torch-PID-RANK (other tests' objects come and go)
	ls /dev/shm | grep '^vps-torch-' > before || true
	VPS_FAULT=exit:1 expect_status 1 "$PY" "$TOP/examples/torch/launch.py" --nproc 4 --dir r --model micro-llama \
		--gpus-per-node 4 --steps 4 --switch-every 2 --global-batch 8 --micro-batch 2 \
		--configs tp=2:dp=2:zero=1,pp=2:dp=2
	[[ "$output" == *"executor "*" exited with status"* ]]
	ls /dev/shm | grep '^vps-torch-' > after || true
	run comm -13 before after
	echo "left: $output"
	[ -z "$output" ]
}
