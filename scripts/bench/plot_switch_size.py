#!/usr/bin/python3
"""Draw switch time against state size from the TSV that
scripts/bench/ckpt_restart.sh --doc writes (docs/bench/switch-vs-size.tsv),
with the GPU's rows that scripts/bench/gpu_section.sh merges in from the
kept GPU check (gpu-*): one line per method, vps's switches,
checkpoint-and-restart through files, through PyTorch's distributed
checkpoint (DCP) and through Megatron-LM's (MCP). Any method in the file is drawn, so a row added later
shows up without a change.

    plot_switch_size.py [TSV [SVG]]

Needs matplotlib (Debian's python3-matplotlib); bad input exits 2."""
import os
import sys

ME = "plot_switch_size.py"
LABELS = {
    "vps-tcp": "vps switch, tcp",
    "vps-ipc": "vps switch, host ipc",
    "ckpt-save": "checkpoint: save (fsync)",
    "ckpt-load": "checkpoint: load (page cache)",
    "ckpt-total": "checkpoint: save + load",
    "ckpt-load-cold": "checkpoint: load (cold cache)",
    "ckpt-total-cold": "checkpoint: save + cold load",
    "dcp-save": "PyTorch DCP: save",
    "dcp-load": "PyTorch DCP: load (page cache)",
    "dcp-total": "PyTorch DCP: save + load",
    "dcp-load-cold": "PyTorch DCP: load (cold cache)",
    "dcp-total-cold": "PyTorch DCP: save + cold load",
    "mcp-save": "Megatron-LM MCP: save",
    "mcp-load": "Megatron-LM MCP: load (page cache)",
    "mcp-total": "Megatron-LM MCP: save + load",
    "mcp-load-cold": "Megatron-LM MCP: load (cold cache)",
    "mcp-total-cold": "Megatron-LM MCP: save + cold load",
    "gpu-vps-ipc": "GPU: vps switch, ipc",
    "gpu-dcp-save": "GPU: PyTorch DCP save",
    "gpu-dcp-load": "GPU: PyTorch DCP load",
    "gpu-dcp-total": "GPU: PyTorch DCP save + load",
}


def fail(what):
    print("%s: %s" % (ME, what), file=sys.stderr)
    sys.exit(2)


def read(path):
    series = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    if not lines or lines[0].split("\t") != ["state_bytes", "method", "seconds"]:
        fail("%s: not a switch-vs-size table (header state_bytes, method, seconds)" % path)
    for n, line in enumerate(lines[1:], 2):
        cols = line.split("\t")
        try:
            size, method, sec = int(cols[0]), cols[1], float(cols[2])
        except (ValueError, IndexError):
            fail("%s:%d: expected a byte count, a method and seconds" % (path, n))
        if size <= 0 or not sec > 0 or len(cols) != 3:
            fail("%s:%d: sizes and times must be positive" % (path, n))
        series.setdefault(method, []).append((size / 1e9, sec))
    if not series:
        fail("%s: no rows" % path)
    return series


def main():
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tsv = sys.argv[1] if len(sys.argv) > 1 else os.path.join(top, "docs/bench/switch-vs-size.tsv")
    svg = sys.argv[2] if len(sys.argv) > 2 else os.path.join(top, "docs/bench/switch-vs-size.svg")
    series = read(tsv)
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "vps"  # the same data draws the same file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method in sorted(series, key=lambda m: (not m.startswith("vps"), m)):
        pts = sorted(series[method])
        dashed = method.endswith(("-cold", "-save", "-load"))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle="--" if dashed else "-",
                label=LABELS.get(method, method))
    ax.set_xlabel("state moved (GB, all ranks)")
    # the restarts take up to hundreds of times as long as the switches: a log scale shows both
    ax.set_yscale("log")
    ax.set_ylabel("seconds, trainer's request to resume (log scale)")
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Switching layouts: vps against checkpoint and restart")
    fig.tight_layout()
    tmp = svg + ".tmp"
    fig.savefig(tmp, format="svg", metadata={"Date": None})
    os.replace(tmp, svg)


if __name__ == "__main__":
    main()
