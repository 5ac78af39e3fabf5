#!/bin/sh
# Install the Debian packages a make step needs and this machine lacks, in
# one line that says what: with apt-get when we are root and it exists,
# otherwise print the exact command and fail.
#   install-deps.sh WHAT PACKAGE...   (WHAT names the step: "make", "make check")
# A package counts as present when what it gives is here (a header the
# compiler $CC finds, a command on PATH), however it came: a bats or a
# python3 built by hand will do. A package with no such probe (the fuzzers'
# runtime libraries, which the Makefile probes by linking) is installed as
# asked.
what=$1
shift
has() { # PACKAGE
	case $1 in
	libyaml-dev) echo '#include <yaml.h>' | ${CC:-cc} -E - ;;
	libzstd-dev) echo '#include <zstd.h>' | ${CC:-cc} -E - ;;
	groff-base) command -v groff ;;
	librsvg2-bin) command -v rsvg-convert ;;
	pkgconf) command -v pkg-config ;;
	bats | jq | zstd | python3) command -v "$1" ;;
	*) false ;;
	esac >/dev/null 2>&1
}
missing=
for p in "$@"; do
	has "$p" || missing="$missing $p"
done
set -- $missing
[ $# -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "$what: installing $* (apt-get)"
	apt-get install -y "$@" >/dev/null 2>&1 ||
		{ apt-get update >/dev/null 2>&1 && apt-get install -y "$@" >/dev/null; } ||
		{ echo "$what: apt-get install $* failed" >&2; exit 1; }
else
	echo "$what needs: $*" >&2
	echo "install them with: sudo apt-get install $*" >&2
	exit 1
fi
