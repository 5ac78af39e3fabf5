#!/usr/bin/env python3
"""What relayed transfers (issue 29) could bring a data-parallel join down
to, at best, next to the point-to-point plan (without relays).

For each join (a model, A and B as parallel specs, B growing only dp, every
A device staying, packed device maps from node 0), it plans A -> B, takes
the busiest sender's node N and counts the bytes that must leave N whatever
the plan: the elements that devices on other nodes need under B and that
only devices on N hold under A, each element once (a relay can pass on what
arrived, never make what no one off N holds). N's NICs carry them at best
evenly: that, over the node's GPUs and the topology's inter-node bandwidth,
is the least time of any plan, relays included, next to the receive side's:
what a node's devices need and none of them holds, each element once,
arrives over the node's NICs at best evenly (a relay inside the node passes
the rest over NVLink), and no device receives faster than over both links.
The joins span nodes (world above one node's GPUs).

"Today" is the plan without relays (vps-plan --no-relay). Next to it,
what the planner's relays do by default (vps-plan with no relay option:
relays where they win), and the issue's targets for the first join, each
said met or not met and why. Then every join of configs/transitions (a
transition with joining devices): its busiest sender over its largest
receive without relays, the number of receivers' worth the busiest holder
sends, and its estimate with and without relays. Last, every transition
of configs/transitions planned by default against without relays: how
many relay anything, and whether any estimate gets worse (the issue's "no
paper transition gets worse").

Nothing here is a timing: every figure follows from the plans and layouts,
so a rerun reproduces the section byte for byte.

  scripts/bench/relay_bound.py           rewrite the relay-bound section of docs/BENCHMARKS.md
  scripts/bench/relay_bound.py --print   print it only
  scripts/bench/relay_bound.py --check   exit 1 when the section differs from a rerun

VPS_BIN picks the tools (default: bin/, built first)."""
import csv
import io
import os
import subprocess
import sys
import tempfile

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOPOLOGY = "a800-testbed"
# (model, A, B): the target and the same shape on the models the
# paper times dp growth for
JOINS = [
    ("llama2-7b", "tp=8,pp=1,dp=1,zero=1", "tp=8,pp=1,dp=8,zero=1"),
    ("llama2-7b", "tp=8,pp=1,dp=1,zero=0", "tp=8,pp=1,dp=8,zero=0"),
    # four receivers of each slice a node: each range crosses into a node
    # once, to its gateway, which passes it on over NVLink
    ("llama2-7b", "tp=2,pp=1,dp=4,zero=0", "tp=2,pp=1,dp=16,zero=0"),
    # and receivers on the holders' node too: they carry ranges out of it
    # (hops up to 3)
    ("llama2-7b", "tp=2,pp=1,dp=1,zero=0", "tp=2,pp=1,dp=16,zero=0"),
]
GiB = float(1 << 30)
# issue 29's targets for the first join
TARGET_RATIO = 1.5
TARGET_SECONDS = 0.25


def run(binp, *args):
    r = subprocess.run([os.path.join(binp, args[0])] + list(args[1:]), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("relay_bound.py: %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def tsv(text):
    return list(csv.DictReader(io.StringIO(text), delimiter="\t"))


def parse_box(s):
    return tuple(tuple(int(v) for v in ax.split(":")) for ax in s.split(","))


def volume(box):
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def intersects(x, y):
    return all(a[0] < b[1] and b[0] < a[1] for a, b in zip(x, y))


def stats_of(text):
    """The scalar lines of vps-plan --stats (YAML, raw numbers)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(" ") or ":" not in line:
            continue
        k, v = line.split(":", 1)
        out[k.strip()] = v.strip().strip('"')
    return out


def topology():
    t = {}
    with open(os.path.join(TOP, "configs", "topologies", TOPOLOGY + ".yaml")) as f:
        for line in f:
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                t[k.strip()] = v.strip()
    return int(t["gpus_per_node"]), float(t["inter_node_bandwidth"]), float(t["intra_node_bandwidth"])


def bound(binp, tmp, model, a, b):
    gpn, inter, intra = topology()
    la, lb = os.path.join(tmp, "a.lay"), os.path.join(tmp, "b.lay")
    run(binp, "vps-layout", "--model", model, "--parallel", a, "--gpus-per-node", str(gpn), "-o", la, "-q")
    run(binp, "vps-layout", "--model", model, "--parallel", b, "--gpus-per-node", str(gpn), "-o", lb, "-q")
    st = stats_of(run(binp, "vps-plan", "--no-relay", la, lb, "--stats", "--load", "--topology", TOPOLOGY, "-q"))
    rl = stats_of(run(binp, "vps-plan", la, lb, "--stats", "--topology", TOPOLOGY, "-q"))
    if st["leaving"] != "0":
        sys.exit("relay_bound.py: %s %s -> %s: devices leave; only joins are counted" % (model, a, b))
    world = int(st["world"])
    if world <= gpn:
        sys.exit("relay_bound.py: %s %s -> %s: one node; nothing crosses a NIC" % (model, a, b))
    loads = {}
    for line in run(binp, "vps-plan", "--no-relay", la, lb, "--stats", "--load", "-q").splitlines():
        if line.strip().startswith("- {rank:"):
            f = dict(kv.split(": ") for kv in line.strip()[3:-1].split(", "))
            loads[int(f["rank"])] = int(f["send"])
    busiest = max(sorted(loads), key=lambda r: loads[r])
    node = busiest // gpn
    on_node = [r for r in range(world) if r // gpn == node]
    # who holds what under A: records with their member ranks
    held = {}
    for rec in tsv(run(binp, "vps-layout", "-i", la, "--tensor", "*", "--format", "tsv")):
        ranks = [int(rec["base"]) + j * int(rec["stride"]) for j in range(int(rec["count"]))]
        held.setdefault((rec["tensor"], rec["state"]), []).append((parse_box(rec["box"]), ranks))
    must = {}  # (tensor, state) -> {box: bytes}, boxes identical or disjoint
    for r in on_node:
        for x in tsv(run(binp, "vps-plan", "--no-relay", "--transfers", "--rank", str(r), "--format", "tsv", la, lb)):
            if x["direction"] != "send" or int(x["peer"]) // gpn == node:
                continue
            key, box = (x["tensor"], x["state"]), parse_box(x["box"])
            holders = [rk for hb, rks in held[key] if intersects(hb, box) for rk in rks]
            if any(h // gpn != node for h in holders):
                continue
            boxes = must.setdefault(key, {})
            if box in boxes:
                continue
            if any(intersects(box, y) for y in boxes):
                sys.exit("relay_bound.py: %s %s: overlapping boxes sent; the count would be wrong" % key)
            boxes[box] = int(x["bytes"]) // volume(box) * volume(box)
    leave = sum(sum(v.values()) for v in must.values())
    # each other node: what its devices receive, each element once (they
    # are joins or hold none of it: what they hold they retain)
    arrive = {}
    for r in range(world):
        k = r // gpn
        if k == node:
            continue
        seen = arrive.setdefault(k, {})
        for x in tsv(run(binp, "vps-plan", "--no-relay", "--transfers", "--rank", str(r), "--format", "tsv", la, lb)):
            if x["direction"] != "recv":
                continue
            key, box = (x["tensor"], x["state"]), parse_box(x["box"])
            boxes = seen.setdefault(key, {})
            if box in boxes:
                continue
            if any(intersects(box, y) for y in boxes):
                sys.exit("relay_bound.py: %s %s: overlapping boxes received; the count would be wrong" % key)
            boxes[box] = int(x["bytes"])
    gpus = {k: sum(1 for r in range(world) if r // gpn == k) for k in arrive}
    recv = int(st["max_recv_bytes"])
    node_s = leave / (len(on_node) * inter)
    recv_s = max([sum(sum(v.values()) for v in seen.values()) / (gpus[k] * inter) for k, seen in arrive.items()] +
                 [recv / (intra + inter)])
    return {
        "model": model, "a": a, "b": b, "world": world,
        "send": int(st["max_send_bytes"]), "recv": recv,
        "estimate": float(st["estimate_seconds"]),
        "leave_per_gpu": leave / len(on_node),
        "best": max(node_s, recv_s), "node_s": node_s, "recv_s": recv_s,
        "relay_send": int(rl["max_send_bytes"]), "relay_recv": int(rl["max_recv_bytes"]),
        "relay_estimate": float(rl["estimate_seconds"]),
    }


def table(rows):
    out = ["| model | A -> B | world | busiest send / largest receive, without relays | "
           "at best with relays | estimate without relays | least time with relays | gain at most | "
           "by default: busiest send / largest receive | by default: estimate |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| %s | %s -> %s | %d | %.2f GiB / %.2f GiB = %.1fx | %.2f GiB = %.1fx | %.3f s | %.3f s (%s) | %.2fx "
                   "| %.2f GiB / %.2f GiB = %.1fx | %.3f s |" % (
            r["model"], r["a"], r["b"], r["world"], r["send"] / GiB, r["recv"] / GiB, r["send"] / r["recv"],
            r["leave_per_gpu"] / GiB, r["leave_per_gpu"] / r["recv"], r["estimate"], r["best"],
            "the node's NICs" if r["node_s"] >= r["recv_s"] else "the receive side",
            r["estimate"] / r["best"], r["relay_send"] / GiB, r["relay_recv"] / GiB,
            r["relay_send"] / r["relay_recv"], r["relay_estimate"]))
    return "\n".join(out) + "\n"


def targets(r):
    """The issue's targets for its join r, met or not, from the figures."""
    ratio, best_ratio = r["relay_send"] / r["relay_recv"], r["leave_per_gpu"] / r["recv"]
    lines = ["Issue 29's targets for %s %s -> %s on %s:" % (r["model"], r["a"], r["b"], TOPOLOGY), ""]
    for what, target, got, today, best, unit in (
            ("busiest device's sent bytes at most %.1fx the largest receive" % TARGET_RATIO,
             TARGET_RATIO, ratio, r["send"] / r["recv"], best_ratio, "x"),
            ("estimate at most %.2f s" % TARGET_SECONDS, TARGET_SECONDS, r["relay_estimate"], r["estimate"],
             r["best"], " s")):
        fmt = "%.1f" if unit == "x" else "%.3f"
        said = "- %s: by default " + fmt + "%s (without relays " + fmt + "%s): "
        said %= (what, got, unit, today, unit)
        if got <= target:
            said += "met."
        elif best > target:
            said += ("**not met**, and no plan can meet it: at best " + fmt + "%s, since under ZeRO-1 each "
                     "holder alone has the optimizer shards the other nodes' ranks need, distinct pieces "
                     "that must leave it once each (docs/relay.md, \"What the bound says first\").") % (best, unit)
        else:
            said += ("**not met**; the bound (" + fmt + "%s) allows it: the planner's relays fall short.") % (best, unit)
        lines.append(said)
    return "\n".join(lines) + "\n"


def transitions(binp):
    """Every transition's estimate on the topology, without relays and by
    default: the joins' table, and the count of those that relay or get
    worse."""
    out = ["| transition | world | joining | busiest send / largest receive, without relays | without relays "
           "| by default | faster by |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    tdir = os.path.join(TOP, "configs", "transitions")
    n = relayed = 0
    worse, most, serving, gains = [], 0.0, [], []
    for f in sorted(os.listdir(tdir)):
        if not f.endswith(".yaml"):
            continue
        path = os.path.join(tdir, f)
        st = stats_of(run(binp, "vps-plan", "--no-relay", "--transition", path, "--stats", "--topology", TOPOLOGY,
                          "-q"))
        rl = stats_of(run(binp, "vps-plan", "--transition", path, "--stats", "--topology", TOPOLOGY, "-q"))
        n += 1
        relayed += rl["bytes_relayed"] != "0"
        today, with_relay = float(st["estimate_seconds"]), float(rl["estimate_seconds"])
        if with_relay > today:
            worse.append("%s (%.3f s -> %.3f s)" % (f[:-5], today, with_relay))
        if st["joining"] == "0":
            continue
        ratio = int(st["max_send_bytes"]) / int(st["max_recv_bytes"])
        most = max(most, ratio)
        if round(ratio, 2) > 2.0:  # 2.00x is two receivers exactly
            serving.append("%s (%.2fx faster)" % (f[:-5], today / with_relay))
        if round(today / with_relay, 2) > 1.0:
            gains.append(today / with_relay)
        out.append("| %s | %s | %s | %.2fx | %.3f s | %.3f s | %.2fx |" % (
            f[:-5], st["world"], st["joining"], int(st["max_send_bytes"]) / int(st["max_recv_bytes"]),
            today, with_relay, today / with_relay))
    out.append("")
    if serving:
        out.append("Joins whose busiest holder serves more than two receivers: %s." % ", ".join(serving))
    else:
        out.append("No join here has its busiest holder send more than two receivers' worth (at most %.2fx): "
                   "the issue's \"every join whose holders serve more than two receivers gets faster\" has no "
                   "case among them; %s." % (most, "yet %d of them get faster by default, by "
                                              "%.2fx to %.2fx" % (len(gains), min(gains), max(gains))
                                              if gains else "none gains"))
    out.append("")
    out.append("By default, %d of the %d transitions of configs/transitions relay any piece; %s." % (
        relayed, n, "no estimate gets worse than without relays" if not worse else
        "**not met** (\"no paper transition's estimate gets worse\"): estimates worse: " + ", ".join(worse) +
        ". The planner relays where a region's busiest sender gains (docs/relay.md)"))
    return "\n".join(out) + "\n"


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "write"
    if mode not in ("write", "--print", "--check"):
        sys.exit("usage: scripts/bench/relay_bound.py [--print | --check]")
    binp = os.environ.get("VPS_BIN")
    if not binp:
        subprocess.run(["make", "-s", "-C", TOP, "all"], check=True)
        binp = os.path.join(TOP, "bin")
    with tempfile.TemporaryDirectory() as tmp:
        body = ("Generated by `scripts/bench/relay_bound.py` (figures from plans and layouts, "
                "topology %s; no timing).\n\n" % TOPOLOGY)
        rows = [bound(binp, tmp, *j) for j in JOINS]
        body += table(rows) + "\n" + targets(rows[0])
        body += "\nThe joins of configs/transitions (estimates on %s):\n\n" % TOPOLOGY + transitions(binp)
    if mode == "--print":
        sys.stdout.write(body)
        return
    doc = os.path.join(TOP, "docs", "BENCHMARKS.md")
    if mode == "--check":
        with open(doc) as f:
            text = f.read()
        b, e = "<!-- relay-bound:begin -->\n", "<!-- relay-bound:end -->"
        have = text[text.index(b) + len(b):text.index(e)] if b in text and e in text else None
        if have != body:
            sys.exit("relay_bound.py: docs/BENCHMARKS.md's relay-bound section differs from a rerun")
        return
    subprocess.run([os.path.join(TOP, "scripts", "bench", "doc-section.sh"), "relay-bound", doc],
                   input=body, text=True, check=True)
    sys.stdout.write(body)


if __name__ == "__main__":
    main()
