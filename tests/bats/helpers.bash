# Shared by the Bats tests: the tools under test first on PATH, a scratch
# directory per test, the source tree's configs.
VPS_BIN=${VPS_BIN:-$BATS_TEST_DIRNAME/../../bin}
PATH=$VPS_BIN:$PATH
TOP=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
# the tools again, with the executor that injects VPS_FAULT (make fault-bin;
# docs/exec.md, "Faults for the tests"): bin/vps-exec ignores it
VPS_FAULT_BIN=${VPS_FAULT_BIN:-$TOP/build/fault-bin}
export VPS_CONFIG_PATH=$TOP/configs
# the Python of the tests: make's PYTHON, by default the test environment
# (make venv: torch, megatron-core, transformers, numpy, PyYAML, Pillow)
PY=${VPS_PYTHON:-$TOP/build/venv/bin/python}
# the job token every multi-rank test shares (vps-exec(1) SECURITY)
export VPS_TOKEN=${VPS_TOKEN:-0123456789abcdef0123456789abcdef}

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
}

# run and check the exit status in one step
expect_status() {
	local want=$1
	shift
	run "$@"
	if [ "$status" -ne "$want" ]; then
		echo "expected exit $want, got $status from: $*" >&2
		echo "$output" >&2
		return 1
	fi
}

# Under make asan: a PyTorch or Megatron-Core job spends its minutes in
# Python, which loads the plain build's libvps (it cannot load a sanitized
# one), and make check has run it; the sanitized pass keeps CI's time for the
# C tools' tests.
framework_job() {
	[ -z "${VPS_SANITIZED:-}" ] || skip "a framework job in Python: make check runs it, make asan does not"
}

# make in the source tree, of the plain build: under make asan the sanitized
# build's settings reach the tests in MAKEFLAGS and, as the command line's
# variables, in the environment; a program or a Python process not built
# with the sanitizer cannot load that build's libvps.so
plain_make() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR -u BINDIR -u SANITIZE \
		-u CFLAGS -u LDFLAGS make -C "$TOP" "$@"
}

# The objects PREFIX-* in /dev/shm that a job left, against the list BEFORE
# it started (a file of `ls /dev/shm | grep ^PREFIX-`). The launchers name
# theirs PREFIX-PID-...: an object of a process still running is another
# job's on this machine (tests of other checkouts run beside these), not a
# leftover; one whose process is gone and that is still there after that
# was seen is left behind (a job removes its objects before it exits).
# Names of another form (PREFIX-RUN-..., a torchrun job's run id) are
# another kind of job's, never these launchers'.
shm_left() { # PREFIX BEFORE
	local name pid
	ls /dev/shm | grep "^$1-" | comm -13 "$2" - | while read -r name; do
		pid=${name#"$1"-}
		pid=${pid%%-*}
		[[ $pid =~ ^[0-9]+$ ]] || continue
		kill -0 "$pid" 2>/dev/null && continue
		[ -e "/dev/shm/$name" ] && echo "$name"
	done
	return 0
}

# Rank R's transfers (vps-plan --transfers --rank R --format tsv ARGS...:
# layouts A B with options, or a plan) as records to compare between
# plans: the piece column (15), each plan's own numbering, left out.
transfers_of() { # R ARGS...
	local r=$1
	shift
	vps-plan --transfers --rank "$r" --format tsv "$@" | cut -f1-14
}
