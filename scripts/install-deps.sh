#!/bin/sh
# Install Debian packages a build step lacks: with apt-get when we are root
# and it exists, otherwise print the exact command and fail.
#   install-deps.sh WHAT PACKAGE...   (WHAT names the step: "vps", "make fuzz")
what=$1
shift
[ $# -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "installing: $*"
	apt-get install -y "$@" >/dev/null 2>&1 ||
		{ apt-get update >/dev/null 2>&1 && apt-get install -y "$@" >/dev/null; } ||
		{ echo "apt-get install $* failed" >&2; exit 1; }
else
	echo "$what needs: $*" >&2
	echo "install them with: sudo apt-get install $*" >&2
	exit 1
fi
