#!/usr/bin/env bats
# Every example of every man page runs as written, and prints what the
# page shows (tests/bats/examples.py says how, and which markers in a page
# say that a block is output, a file, or not run here). README.md's run so
# too, in a fresh clone after make demo (tests/bats/readme.bats).
#
# Each page runs in a scratch directory that looks like the source tree
# (its top-level entries linked there: the pages' commands that run "from
# the source tree" find configs/ and scripts/, and what they write lands in
# the scratch directory), with the tools under test first on PATH and none
# of the test suite's settings (no VPS_TOKEN, no VPS_CONFIG_PATH), in a
# mount and network namespace of its own: the examples' fixed port 29500
# and default registry names vps-R meet no other job on this machine. An
# editor (vi, $EDITOR) saves unchanged and a pager pages nothing: what a
# user does by hand there is not the example's business. The files a page
# presumes a user has (a Hugging Face checkpoint's config.json, a report of
# vps-exec) come from tests/bats/examples/; temporary files go to the
# test's directory.

load helpers

run_examples() { # PAGE (relative to the source tree)
	unshare -mn true 2>/dev/null || skip "needs a mount and network namespace of its own (unshare -mn, as root)"
	local d=$BATS_TEST_TMPDIR/tree f
	mkdir -p "$d" "$BATS_TEST_TMPDIR/shims"
	for f in "$TOP"/* "$TOP"/.gitignore; do
		[ -e "$f" ] && ln -s "$f" "$d/${f##*/}"
	done
	# what the pages presume a user has (tests/bats/examples/README)
	cp -R "$TOP"/tests/bats/examples/* "$d"/
	rm "$d"/README
	printf '#!/bin/sh\nexit 0\n' > "$BATS_TEST_TMPDIR/shims/vi"
	printf '#!/bin/sh\nexec cat "$@"\n' > "$BATS_TEST_TMPDIR/shims/less"
	chmod +x "$BATS_TEST_TMPDIR/shims/vi" "$BATS_TEST_TMPDIR/shims/less"
	run env -u VPS_TOKEN -u VPS_CONFIG_PATH -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR \
		-u BINDIR -u SANITIZE -u CFLAGS -u LDFLAGS \
		PATH="$VPS_BIN:$BATS_TEST_TMPDIR/shims:$PATH" EDITOR=true VPS_SRC="$TOP" TMPDIR="$BATS_TEST_TMPDIR" \
		unshare -mn python3 "$TOP/tests/bats/examples.py" --isolated "$TOP/$1" "$d"
	# a block not run is said on every run; what failed is what CI must show
	grep -v ': not run: ' <<<"$output" || true
	[ "$status" -eq 0 ]
}

@test "vps(7)'s examples run as written" { run_examples man/vps.7; }
@test "vps-layout(1)'s examples run as written" { run_examples man/vps-layout.1; }
@test "vps-plan(1)'s examples run as written" { run_examples man/vps-plan.1; }
@test "vps-stage(1)'s examples run as written" { run_examples man/vps-stage.1; }
@test "vps-verify(1)'s examples run as written" { run_examples man/vps-verify.1; }
@test "vps-show(1)'s examples run as written" { run_examples man/vps-show.1; }
@test "vps-exec(1)'s examples run as written" { run_examples man/vps-exec.1; }
@test "vps-trainer(1)'s examples run as written" { run_examples man/vps-trainer.1; }
@test "vps-formats(5)'s examples run as written" { run_examples man/vps-formats.5; }

@test "every page of man/ has its test above" {
	local f
	for f in "$TOP"/man/*.[157]; do
		grep -qF "run_examples man/${f##*/};" "$BATS_TEST_FILENAME" || { echo "man/${f##*/} has no test here" >&2; return 1; }
	done
}
