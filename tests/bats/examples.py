#!/usr/bin/env python3
"""Run the examples of a man page (roff: .EX to .EE) or of a Markdown file
(blocks indented 4 spaces, or fenced), verbatim, as a user would type them,
and check what they print.

    examples.py PAGE DIR          run PAGE's examples in DIR (a scratch directory)
    examples.py --list PAGE       list PAGE's examples and what is done with each

Every block is a command block unless a marker says otherwise. A marker is a
comment right before the block (roff: a line `.\\" example: WHAT`; Markdown:
`<!-- example: WHAT -->`), WHAT one of:

    output [status N] [any order] [times vary]
        what the command block before printed (its standard output and
        error): compared line by line, a line "..." standing for any lines;
        with status N the block before exits N, not 0; any order compares
        the lines sorted (processes that print at once); times vary lets
        durations, rates and floating-point seconds differ.
    file NAME
        the content of the file NAME, written into the directory for the
        blocks after it to use; one that starts "vps: " must be a vps
        document vps-show -t reads.
    prints nothing
        a command block that must print nothing, on standard output or
        error (an example the page calls quiet).
    not run: WHY
        not run here (it needs a GPU, a cluster, or it is not a command: a
        table, a formula, a message shown for its form). WHY is required.
    transcript [any order] [times vary]
        a transcript (below) whose output is compared so.

A block whose first line starts with "$ " is a transcript: each "$ " line
a command, the lines after it until the next what it prints.

All the command blocks of a page run in one bash session in DIR, in order,
so that files, variables and exports carry from block to block, as at a
prompt: one complete command at a time, each of which must succeed (the
last of a block: exit as its output block says), every command of a
pipeline too (pipefail; one cut off by SIGPIPE when its reader is done,
as `| head` does, is no failure); `wait` without operands waits for every
background job and fails when one did (a prompt's `wait` says nothing of
them; a user reads their messages). Prints what it did, one line a block,
and exits 1 when a block failed or printed other than the page shows."""
import argparse
import os
import re
import subprocess
import sys

ESCAPES = {"-": "-", "e": "\\", "&": "", "(aq": "'", "(dq": '"', " ": " ", "(em": "\u2014", "(en": "\u2013",
           "(mu": "\u00d7", "(<=": "\u2264", "(>=": "\u2265", "(bu": "\u2022", "|": "", "^": "", "%": ""}


class PageError(Exception):
    pass


def unroff(line, where):
    """A line of an example with roff's escapes undone; an escape the test
    does not know is an error (it could not know what a user sees)."""
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        rest = line[i + 1:]
        m = re.match(r"f(\[[^]]*\]|\(..|.)", rest)
        if m:  # a font change: no text
            i += 1 + len(m.group(0))
            continue
        for k, v in ESCAPES.items():
            if rest.startswith(k):
                out.append(v)
                i += 1 + len(k)
                break
        else:
            raise PageError("%s: an escape examples.py does not know: \\%s" % (where, rest[:3]))
    return "".join(out)


class Block:
    def __init__(self, page, line, text, marker):
        self.page, self.line, self.text, self.marker = page, line, text, marker
        self.kind, self.opts, self.status, self.why, self.name = "commands", set(), 0, "", ""
        m = marker
        if m is None:
            if text and text[0].startswith("$ "):
                self.kind = "transcript"
            return
        if m == "prints nothing":
            self.opts.add("prints nothing")
        elif m.startswith("not run:"):
            self.kind, self.why = "not run", m[len("not run:"):].strip()
            if not self.why:
                raise PageError("%s:%d: 'not run:' without a reason" % (page, line))
        elif m.startswith("file "):
            self.kind, self.name = "file", m[5:].strip()
        elif m.startswith("output") or m.startswith("transcript"):
            self.kind = "output" if m.startswith("output") else "transcript"
            rest = m[len(self.kind):].strip()
            if self.kind == "transcript" and not (text and text[0].startswith("$ ")):
                raise PageError("%s:%d: a transcript's first line starts with '$ '" % (page, line))
            st = re.search(r"\bstatus (\d+)\b", rest)
            if st:
                self.status = int(st.group(1))
                rest = rest.replace(st.group(0), "")
            for opt in ("any order", "times vary"):
                if opt in rest:
                    self.opts.add(opt)
                    rest = rest.replace(opt, "")
            if rest.strip(" ,;"):
                raise PageError("%s:%d: unknown option of %s: %s" % (page, line, self.kind, rest.strip()))
        else:
            raise PageError("%s:%d: unknown marker: example: %s" % (page, line, m))

    def where(self):
        return "%s:%d" % (self.page, self.line)


def roff_blocks(path):
    name = os.path.basename(path)
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, marker, i = [], None, 0
    while i < len(lines):
        ln = lines[i]
        m = re.match(r'^\.\\"\s*example:\s*(.*)$', ln)
        if m:
            if marker is not None:
                raise PageError("%s:%d: two markers before one example" % (name, i + 1))
            marker = m.group(1).strip()
        elif ln.startswith(".EX"):
            start, text = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith(".EE"):
                if not lines[i].startswith('.\\"'):
                    text.append(unroff(lines[i], "%s:%d" % (name, i + 1)))
                i += 1
            blocks.append(Block(name, start, text, marker))
            marker = None
        elif ln.startswith(".SH") and marker is not None:
            raise PageError("%s:%d: a marker with no example after it in its section" % (name, i + 1))
        i += 1
    if marker is not None:
        raise PageError("%s: a marker after the last example" % name)
    return blocks


def markdown_blocks(path):
    name = os.path.basename(path)
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, marker, i, prev_blank = [], None, 0, True
    while i < len(lines):
        ln = lines[i]
        m = re.match(r"^<!--\s*example:\s*(.*?)\s*-->$", ln)
        if m:
            marker = m.group(1)
            prev_blank = True
            i += 1
            continue
        if ln.startswith("```"):
            start, text = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                text.append(lines[i])
                i += 1
            blocks.append(Block(name, start + 1, text, marker))
            marker, prev_blank = None, False
            i += 1
            continue
        if ln.startswith("    ") and prev_blank:
            start, text = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                text.append(lines[i][4:])
                i += 1
            while text and not text[-1].strip():
                text.pop()
            blocks.append(Block(name, start, text, marker))
            marker, prev_blank = None, True
            continue
        prev_blank = not ln.strip()
        i += 1
    return blocks


def blocks_of(path):
    bs = markdown_blocks(path) if path.endswith(".md") else roff_blocks(path)
    for k, b in enumerate(bs):
        if b.kind == "output" and (k == 0 or bs[k - 1].kind != "commands"):
            raise PageError("%s: an output block that follows no command block" % b.where())
        if b.kind == "output" and "prints nothing" in bs[k - 1].opts:
            raise PageError("%s: an output block after a block that prints nothing" % b.where())
    return bs


# ---- comparing what was printed with what the page shows ----
TIME = re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e[-+]?\d+)? ?(ns|us|ms|s|[kMGT]?B/s)\b")
LONG_FLOAT = re.compile(r"(?<![\w.])\d+\.\d{6,}(e[-+]?\d+)?\b")


def normal(line, opts):
    if "times vary" in opts:
        line = TIME.sub("<time>", line)
        line = LONG_FLOAT.sub("<float>", line)
    return line


# What a tool says while it waits (a peer, a trainer, a request): whether it
# is said depends on how long the wait lasts, that is on the machine's load,
# so a page shows it only where the wait is the point of the example
WAIT_NOTICE = re.compile(r"^vps-[a-z]+: (rank -?\d+: )?waiting for ")


def shows(want, got, opts):
    """None when got shows the lines of want (each "..." any lines), else why not."""
    want = [normal(w, opts) for w in want]
    got = [normal(g, opts) for g in got]
    if not any(WAIT_NOTICE.match(w) for w in want):
        got = [g for g in got if not WAIT_NOTICE.match(g)]
    if "any order" in opts:
        if any(w.strip() == "..." for w in want):
            # the lines shown are among those printed, in any order
            left = list(got)
            for w in want:
                if w.strip() == "...":
                    continue
                if w not in left:
                    return "in any order: %r not printed" % w
                left.remove(w)
            return None
        if sorted(want) != sorted(got):
            missing = [w for w in want if w not in got]
            extra = [g for g in got if g not in want]
            return "in any order: missing %s; not shown %s" % (missing[:3], extra[:3])
        return None
    pos, skip = 0, False
    for n, w in enumerate(want):
        if w.strip() == "...":
            skip = True
            continue
        if skip:
            while pos < len(got) and got[pos] != w:
                pos += 1
        if pos >= len(got) or got[pos] != w:
            return "shown line %d, %r, %s" % (n + 1, w, "not printed" if pos >= len(got)
                                                     else "printed as %r" % got[pos])
        pos += 1
        skip = False
    if not skip and pos < len(got):
        return "printed more than shown: %r" % got[pos]
    return None


# ---- the session ----
PRELUDE = r'''
# the examples' session (examples.py): a prompt that runs one complete
# command at a time and records how each ended
set -o pipefail
wait() {
	if [ $# -gt 0 ]; then builtin wait "$@"; return; fi
	local p rc=0 st
	for p in $(jobs -p); do
		builtin wait "$p" || { st=$?; rc=$st; echo "examples.py: background job $p exited with status $st" >&2; }
	done
	return $rc
}
__cmd() { # OUT STATUS_FILE COMMAND: run COMMAND here, output appended to OUT,
	# "STATUS PIPESTATUS..." to STATUS_FILE; $? as the command before left it
	local __x __out=$1 __stf=$2 __c=$3
	set --
	( exit "${__last:-0}" )
	eval "$__c"$'\n''__ps=("${PIPESTATUS[@]}")' >> "$__out" 2>&1
	__last=0
	for __x in "${__ps[@]}"; do [ "$__x" = 0 ] || __last=$__x; done
	echo "$__last ${__ps[*]}" > "$__stf"
	__ps=()
}
'''


def commands_of(text, where):
    """The complete commands of a block, in order: lines joined until bash
    parses them (a loop, a continued line, a quoted newline)."""
    out, cur = [], []
    for ln in text:
        cur.append(ln)
        src = "\n".join(cur)
        if ln.endswith("\\"):
            continue  # continued on the next line (bash -n takes a last backslash as nothing)
        if subprocess.run(["bash", "-n", "-c", src], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0:
            if src.strip() and not all(x.strip().startswith("#") or not x.strip() for x in cur):
                out.append(src)
            cur = []
    if cur:
        raise PageError("%s: the block does not parse as bash: %s" % (where, "\n".join(cur)[:200]))
    return out


def run_page(path, d, timeout):
    bs = blocks_of(path)
    ex = os.path.join(d, ".ex")
    os.makedirs(ex, exist_ok=True)
    script = [PRELUDE]
    for k, b in enumerate(bs):
        if b.kind == "commands":
            b.unparsed = None
            try:
                b.commands = commands_of(b.text, b.where())
            except PageError as e:
                b.commands, b.unparsed = [], str(e)
            for j, c in enumerate(b.commands):
                script.append("__cmd .ex/out.%d .ex/status.%d.%d %s" % (k, k, j, sh_quote(c)))
        elif b.kind == "transcript":
            b.commands = [ln[2:] for ln in b.text if ln.startswith("$ ")]
            for j, c in enumerate(b.commands):
                script.append("__cmd .ex/out.%d.%d .ex/status.%d.%d %s" % (k, j, k, j, sh_quote(c)))
        elif b.kind == "file":
            with open(os.path.join(d, b.name), "w") as fh:
                fh.write("\n".join(b.text) + "\n")
            if b.text and b.text[0].startswith("vps: "):
                # a vps document: the tools must read it as one
                script.append("__cmd .ex/out.%d .ex/status.%d.0 %s" % (k, k, sh_quote("vps-show -t " + b.name)))
    with open(os.path.join(ex, "session.sh"), "w") as fh:
        fh.write("\n".join(script) + "\n")
    try:
        r = subprocess.run(["bash", os.path.join(ex, "session.sh")], cwd=d, timeout=timeout, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        session_out = r.stdout
    except subprocess.TimeoutExpired:
        session_out = "(the session ran past %d s)" % timeout
    bad = 0
    for k, b in enumerate(bs):
        if b.kind == "file" and b.text and b.text[0].startswith("vps: "):
            st = lines_of(os.path.join(ex, "status.%d.0" % k))
            if st is None or not ended_well(st[0], 0):
                bad = 1
                print("%s: FAILED: file %s: not a document vps-show -t reads: %s" % (
                    b.where(), b.name, " ".join(lines_of(os.path.join(ex, "out.%d" % k)) or ["(not run)"])))
                continue
            print("%s: file %s (a vps document, read by vps-show -t)" % (b.where(), b.name))
            continue
        if b.kind in ("not run", "file"):
            print("%s: %s%s" % (b.where(), b.kind, ": " + b.why if b.why else " " + b.name))
            continue
        if b.kind == "output":
            continue
        if b.kind == "transcript":
            why = check_transcript(b, k, ex)
        else:
            why = check_commands(bs, b, k, ex)
        if why is None:
            print("%s: ok (%s)" % (b.where(), b.kind))
            continue
        bad = 1
        print("%s: FAILED: %s" % (b.where(), why))
        print("  the block:")
        for ln in b.text:
            print("    " + ln)
        out = os.path.join(ex, "out.%d" % k)
        if os.path.exists(out):
            print("  what it printed:")
            for ln in open(out, errors="replace").read().splitlines()[-40:]:
                print("    " + ln)
        if why.startswith("not run") and session_out.strip():
            print("  the session said: " + session_out.strip()[-2000:])
    return bad


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def lines_of(path):
    try:
        return open(path, errors="replace").read().splitlines()
    except OSError:
        return None


def ended_well(status, want):
    """A command's "STATUS PIPESTATUS..." line: it exited want, and every
    earlier command of its pipeline succeeded or was cut off by the reader
    leaving (SIGPIPE, as `... | head` does at any prompt)."""
    st = [int(x) for x in status.split()]
    last, pipe = st[0], st[1:]
    if pipe:
        if pipe[-1] != want or any(x not in (0, 141) for x in pipe[:-1]):
            return False
        return True
    return last == want


def check_commands(bs, b, k, ex):
    if b.unparsed:
        return "not a command block (mark it, or correct it): " + b.unparsed
    nxt = bs[k + 1] if k + 1 < len(bs) and bs[k + 1].kind == "output" else None
    want = nxt.status if nxt else 0
    for j, c in enumerate(b.commands):
        st = lines_of(os.path.join(ex, "status.%d.%d" % (k, j)))
        if st is None:
            return "not run (the session stopped before it, or ran past its time)"
        w = want if j == len(b.commands) - 1 else 0
        if not ended_well(st[0], w):
            return "exit status %s (pipeline: %s), not %d, of: %s" % (st[0].split()[0], st[0], w, c)
    if "prints nothing" in b.opts:
        printed = lines_of(os.path.join(ex, "out.%d" % k)) or []
        if printed:
            return "printed %d lines, where the page says it prints nothing: %r" % (len(printed), printed[0])
    if nxt:
        why = shows(nxt.text, lines_of(os.path.join(ex, "out.%d" % k)) or [], nxt.opts)
        if why:
            return "its output (%s): %s" % (nxt.where(), why)
    return None


def check_transcript(b, k, ex):
    j, want = -1, {}
    for ln in b.text:
        if ln.startswith("$ "):
            j += 1
            want[j] = []
        else:
            want[j].append(ln)
    for j in sorted(want):
        got = lines_of(os.path.join(ex, "out.%d.%d" % (k, j)))
        if got is None:
            return "not run: command %d (the session stopped before it)" % (j + 1)
        why = shows(want[j], got, b.opts)
        if why:
            return "command %d: %s\n  printed: %s" % (j + 1, why, "\n    ".join([""] + got[:30]))
    return None


def loopback_up():
    """Bring lo up in a new network namespace (no ip(8) needed)."""
    import fcntl
    import socket
    import struct
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as so:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(so, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(so, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--isolated", action="store_true",
                   help="inside unshare -mn: a tmpfs of its own on /dev/shm and lo up, so that the examples' fixed "
                        "ports (29500) and registry names (vps-0) meet no other job on this machine")
    a.add_argument("--list", action="store_true", help="list the examples, run nothing")
    a.add_argument("--timeout", type=int, default=900, help="seconds the whole page may take")
    a.add_argument("page")
    a.add_argument("dir", nargs="?")
    args = a.parse_args()
    try:
        if args.list:
            for b in blocks_of(args.page):
                print("%s: %s%s" % (b.where(), b.kind, (": " + b.why) if b.why else ""))
            return 0
        if not args.dir:
            a.error("a directory to run in")
        if args.isolated:
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/dev/shm"], check=True)
            loopback_up()
        return run_page(args.page, args.dir, args.timeout)
    except PageError as e:
        print("examples.py: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
