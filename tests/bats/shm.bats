#!/usr/bin/env bats
# A /dev/shm too small for a job's state (a container's is 64 MiB unless
# docker run --shm-size says more): vps-trainer, the executors beside it
# and the Python module stop, exit 2 (vps.Error in Python), the state's
# owners saying what /dev/shm needs and has free, and leave nothing in it.
# Before, the objects were made sparse and every process died of SIGBUS at
# its first write to a page the tmpfs could not give. Each test runs in a
# mount namespace of its own, whose /dev/shm is a 20 MiB tmpfs.

load helpers

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=20m tmpfs /dev/shm' 2>/dev/null ||
		skip "needs a mount namespace of its own with a tmpfs on /dev/shm (unshare --mount and mount, as root)"
}

# Run the shell script $1 where /dev/shm is a 20 MiB tmpfs; the last line
# of the output is what /dev/shm holds after it ("left:" and the names).
in_small_shm() {
	run unshare --mount --propagation private sh -c \
		'mount -t tmpfs -o size=20m tmpfs /dev/shm && sh "$1"; echo "left:$(ls -A /dev/shm | tr "\n" " ")"' sh "$1"
	echo "$output"
}

# vps-exec(1)'s EXAMPLES: tp=2 to tp=1,dp=2 on two ranks, 127 MiB a rank
two_ranks() {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout --global-batch 8 | vps-stage --budget 1MiB - -o ab.staged
}

too_small() { # TOOL RANK: its line on a 20 MiB /dev/shm
	echo "$1: rank $2: /dev/shm: needs * MiB, 20.0 MiB free (docker: --shm-size)"
}

@test "vps-exec(1)'s two-rank loop on a small /dev/shm: all four exit 2, the trainers saying what it needs" {
	two_ranks
	# the loop as the page has it, each process's status printed; the
	# executors wait --timeout for registries their trainers never make
	cat > loop.sh <<'EOF'
export VPS_TOKEN=$(vps-exec --new-token)
for r in 0 1; do
    (vps-trainer --rank $r --global-batch 8 ab.staged; echo "trainer $r: exit $?") &
    (vps-exec --rank $r --master 127.0.0.1:29500 --timeout 5 --check ab.staged; echo "exec $r: exit $?") &
done; wait
EOF
	in_small_shm loop.sh
	[ "$status" -eq 0 ]
	local r
	for r in 0 1; do
		grep -qxF "trainer $r: exit 2" <<<"$output"
		grep -qxF "exec $r: exit 2" <<<"$output"
		grep -qx "vps-exec: rank $r: no trainer has created registry .* within [0-9]* s: .*" <<<"$output"
		[ "$(grep -c "^vps-trainer: rank $r: " <<<"$output")" -eq 1 ]
		[[ $(grep "^vps-trainer: rank $r: " <<<"$output") == $(too_small vps-trainer $r) ]]
	done
	! grep -q "Bus error" <<<"$output"
	[ "${lines[-1]}" = "left:" ]
}

@test "vps-trainer alone on a small /dev/shm exits 2 with what it needs, making nothing" {
	two_ranks
	echo 'vps-trainer --rank 1 --global-batch 8 ab.staged; echo "exit $?"' > one.sh
	in_small_shm one.sh
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 3 ]
	[[ ${lines[0]} == $(too_small vps-trainer 1) ]]
	[ "${lines[1]}" = "exit 2" ]
	[ "${lines[2]}" = "left:" ]
}

@test "State.allocate and Registry.alloc_host on a small /dev/shm raise vps.OutOfMemory (VPS_ENOMEM) with what they need" {
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment)"
	cat > alloc.py <<'EOF'
import vps
lay = vps.layout("tiny-llama", "tp=1")
with vps.Registry("vps-bats-shm", lay, 0) as reg:
    try:
        vps.State.allocate(reg, lay, 0)
    except vps.OutOfMemory as e:
        print("allocate:", e.name, e)
    # one buffer of 40 MiB: what the library itself refuses
    try:
        reg.alloc_host(vps.SOURCE, 0, vps.PARAM, vps.FP32, 10 << 20)
    except vps.OutOfMemory as e:
        print("alloc_host:", e.name, e)
    print("entries:", len(reg.entries()))
EOF
	echo "PYTHONPATH='$TOP/python' '$PY' alloc.py; echo \"exit \$?\"" > py.sh
	in_small_shm py.sh
	[ "$status" -eq 0 ]
	[ "${#lines[@]}" -eq 5 ]
	[[ ${lines[0]} == "allocate: VPS_ENOMEM /dev/shm: needs "*" MiB, "*" MiB free (docker: --shm-size)" ]]
	[[ ${lines[1]} == "alloc_host: VPS_ENOMEM /dev/shm: needs 40.0 MiB, "*" MiB free (docker: --shm-size)" ]]
	[ "${lines[2]}" = "entries: 0" ]
	[ "${lines[3]}" = "exit 0" ]
	[ "${lines[4]}" = "left:" ]
}
