#!/usr/bin/env bats
# The Python module as a package: pip install of the source tree, in a new
# virtual environment without PyTorch, builds libvps.so with the Makefile
# and puts it and the configs beside the module; the module then works
# from anywhere, with no PYTHONPATH, and says what its torch parts need.

load helpers

# The base interpreter of the tests' Python: for the test environment
# (build/venv), the Python 3.12 that scripts/venv.sh made it from.
setup_file() {
	local base
	if [ -n "${VPS_SANITIZED:-}" ]; then
		# pip builds the plain library of its own: make check runs this, make asan does not
		echo "pip builds its own plain libvps: make check runs this, make asan does not" > "$BATS_FILE_TMPDIR/skip"
		return 0
	fi
	base=$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))' 2>/dev/null) || base=
	if [ -z "$base" ] || ! "$base" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 12))' \
		2>/dev/null; then
		echo "no Python 3.12 with venv and ensurepip (the base of $PY: ${base:-none})" > "$BATS_FILE_TMPDIR/skip"
		return 0
	fi
	# no --system-site-packages: the system's packages (torch among them) stay out
	"$base" -m venv "$BATS_FILE_TMPDIR/venv"
}

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	[ ! -e "$BATS_FILE_TMPDIR/skip" ] || skip "$(cat "$BATS_FILE_TMPDIR/skip")"
	V=$BATS_FILE_TMPDIR/venv
}

# pip in the new environment, none of the test suite's settings (make's
# variables under make asan, the tree's configs) reaching the build
pip_install() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR -u BINDIR -u SANITIZE -u CFLAGS -u LDFLAGS \
		-u VPS_CONFIG_PATH -u PYTHONPATH "$V/bin/python" -m pip --disable-pip-version-check --no-input install "$@"
}

# Python of the new environment from outside the tree, with nothing that
# would point it at the tree
outside() {
	(cd / && env -u VPS_CONFIG_PATH -u VPS_LIBRARY -u PYTHONPATH "$V/bin/python" "$@")
}

@test "pip install of the source tree: vps imports from anywhere with its own libvps.so and configs, no torch needed" {
	local version
	version=$(sed -n 's/.*VPS_VERSION_STRING "\(.*\)"/\1/p' "$TOP/include/vps/base.h")
	touch before
	run pip_install "$TOP"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"Successfully installed vps-$version"* ]]
	# nothing written to the tree but under build/ (ignored)
	run find "$TOP" -path "$TOP/build" -prune -o -newer before -print
	echo "$output"
	[ -z "$output" ]

	run outside -c 'import vps; print(vps.version())'
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = "$version" ]
	# a real call: the library bundled in the environment, micro-llama from the configs beside it
	run outside -c '
import vps, vps._lib
lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4)
print(vps._lib.lib._name)
print(lay.world, len(lay.rank(3).params), vps.__version__)'
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "$(cd "$V/lib/python3.12/site-packages/vps" && pwd)/libvps.so" ]
	[ "${lines[1]}" = "4 27 $version" ]
	# an error of the library, as the subclass of its code
	run outside -c '
import vps
try:
    vps.Model("no-such-model")
except vps.NotFound as e:
    print(type(e).__name__, e.name)'
	[ "$output" = "NotFound VPS_ENOTFOUND" ]

	# without torch: `import vps` and `from vps import *` work, and what needs
	# torch says how to get it
	run outside -c 'import torch'
	[ "$status" -ne 0 ]
	run outside -c 'from vps import *; print(layout("micro-llama", "tp=1").world, "State" in dir())'
	[ "$output" = "1 False" ]
	for part in 'import vps.megatron' 'import vps; vps.State' 'import vps; vps.switch'; do
		run outside -c "$part"
		echo "$output"
		[ "$status" -eq 1 ]
		[[ "${lines[-1]}" == "ModuleNotFoundError: vps."*" needs PyTorch, which $V/bin/python cannot import (No module named 'torch'): "*"make venv"*"pip install torch"* ]]
	done
}

@test "pip install without libyaml's headers says which package is missing, before make fails" {
	# a compiler that has every header but yaml.h
	printf '#!/bin/sh\n[ "$1" = -E ] && grep -q yaml.h && { echo "yaml.h: No such file" >&2; exit 1; }\nexec cc "$@"\n' > cc
	chmod +x cc
	CC=$PWD/cc run pip_install "$TOP"
	echo "$output"
	[ "$status" -ne 0 ]
	[[ "$output" == *"vps: pip install: building libvps.so needs the headers of libyaml: apt-get install libyaml-dev (Debian, Ubuntu), or make deps in the source tree"* ]]
}
