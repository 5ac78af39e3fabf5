#!/usr/bin/env python3
"""make layers: libvps's objects keep to their rooms' order, with no cycles.

    scripts/layers.py BUILDDIR/lib [SHARED_LIBRARY]

Reads every object under BUILDDIR/lib with nm: which global symbols each
defines and which it uses. An object's room is its folder under lib/
(lib/plan/stats.c is in room "plan", lib/exec/net/net.c in "exec/net", a
file at lib/'s top in room "top"). It fails (exit 1), naming the symbols,
when
  - an object uses a symbol of a room that ROOMS below does not let it use
    (a lower layer reaching up, or a transport reaching into the executor);
  - objects depend on each other in a cycle, even within one room;
  - two sources share a file name (ar keeps one member of a name);
  - given the shared library: it exports a symbol that include/vps/ does
    not declare.
docs/architecture.md draws the same order."""
import collections
import os
import re
import subprocess
import sys

# room: the rooms it may use besides itself (the floor, util, is implied)
ROOMS = {
    "util": [],
    "io": [],
    "model": ["io"],
    "plan": ["io", "model"],
    "stage": ["io", "model", "plan"],
    "inspect": ["io", "model", "plan", "stage"],
    "gpu": [],
    "registry": ["gpu"],
    "trainer": ["io", "model", "plan", "stage", "gpu", "registry"],
    "exec/net": [],
    "exec/transport": ["gpu", "registry", "exec/net"],
    "exec": ["io", "model", "plan", "stage", "gpu", "registry", "exec/net", "exec/transport"],
    "top": None,  # lib/abi.c and the like: may use any room
}


def symbols(path):
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBRCGSVW":
            defined.add(f[2])
        elif len(f) == 2 and f[0] == "U":
            used.add(f[1])
    return defined, used


def room_of(rel):
    d = os.path.dirname(rel)
    return d if d else "top"


def cycles(graph):
    """Strongly connected components of more than one object (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def public_names(include_dir):
    names = set()
    for f in sorted(os.listdir(include_dir)):
        if f.endswith(".h"):
            text = open(os.path.join(include_dir, f)).read()
            names.update(re.findall(r"\b(vps_[A-Za-z0-9_]+)\s*\(", text))
            names.update(re.findall(r"\bextern\b[^;(]*\b(vps_[A-Za-z0-9_]+)\s*(?:\[\s*\])?\s*;", text))
    return names


def main(argv):
    if len(argv) < 2:
        print("usage: layers.py BUILDDIR/lib [SHARED_LIBRARY]", file=sys.stderr)
        return 2
    libdir = argv[1]
    objs = {}
    for dirpath, _, files in os.walk(libdir):
        for f in files:
            if f.endswith(".o"):
                rel = os.path.relpath(os.path.join(dirpath, f), libdir)
                # only objects whose source still exists (a stale build tree
                # keeps objects of moved files)
                if os.path.exists(os.path.join("lib", rel[:-2] + ".c")):
                    objs[rel] = symbols(os.path.join(libdir, rel))
    problems = []
    by_name = collections.defaultdict(list)
    for rel in objs:
        by_name[os.path.basename(rel)].append(rel)
    for name, rels in sorted(by_name.items()):
        if len(rels) > 1:
            problems.append("two sources named %s (%s): the static library keeps one" % (name[:-2] + ".c", ", ".join(sorted(rels))))
    owner = {}
    for rel, (defined, _) in objs.items():
        for s in defined:
            owner[s] = rel
    graph = {rel: set() for rel in objs}
    uses = collections.defaultdict(set)
    for rel, (_, used) in objs.items():
        for s in used:
            o = owner.get(s)
            if o and o != rel:
                graph[rel].add(o)
                uses[(rel, o)].add(s)
    for rel in sorted(objs):
        room = room_of(rel)
        if room not in ROOMS:
            problems.append("lib/%s: room %s is not in scripts/layers.py's ROOMS" % (rel[:-2] + ".c", room))
            continue
        allowed = ROOMS[room]
        if allowed is None:
            continue
        for o in sorted(graph[rel]):
            r = room_of(o)
            if r == room or r == "util" or r in allowed:
                continue
            problems.append("lib/%s (%s) uses lib/%s (%s), which its room may not: %s" %
                            (rel[:-2] + ".c", room, o[:-2] + ".c", r, ", ".join(sorted(uses[(rel, o)]))))
    for comp in cycles(graph):
        edges = []
        for a in comp:
            for b in comp:
                if (a, b) in uses:
                    edges.append("%s -> %s (%s)" % (a[:-2], b[:-2], ", ".join(sorted(uses[(a, b)])[:4])))
        problems.append("cycle between %s: %s" % (", ".join(c[:-2] for c in comp), "; ".join(edges)))
    if len(argv) > 2:
        public = public_names("include/vps")
        out = subprocess.run(["nm", "-D", "--defined-only", argv[2]], capture_output=True, text=True,
                             check=True).stdout
        extra = sorted(f[2] for f in (l.split() for l in out.splitlines())
                       if len(f) == 3 and f[1] in "TDBRW" and f[2] not in public and not f[2].startswith("_"))
        if extra:
            problems.append("%s exports %d symbols include/vps/ does not declare: %s" %
                            (os.path.basename(argv[2]), len(extra), ", ".join(extra[:20]) + (" ..." if len(extra) > 20 else "")))
    for p in problems:
        print("layers: " + p, file=sys.stderr)
    if problems:
        return 1
    print("layers: %d objects in %d rooms, no cycles, each room within its layer%s" %
          (len(objs), len({room_of(r) for r in objs}), ", exports only the public API" if len(argv) > 2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
