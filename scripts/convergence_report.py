#!/usr/bin/python3
"""Compare a static and a switched run of examples/torch/launch.py (their
run directories, as scripts/convergence.sh leaves them), and optionally a
control run (static, in another configuration): the loss of every step, the
gathered fp32 master weights at the end, the trainer's bit-for-bit check of
each switch and vps-exec's digests. Prints a Markdown table; with --svg,
draws the loss curves and their relative deviation from the static run's.

    convergence_report.py --static DIR --switched DIR [--control DIR]
        --steps N --every K --configs A,B,... --ranks R [--max-rel 1e-3]
        [--svg FILE] [--pointer FILE]

The loss check: every step's loss of the switched run within --max-rel
(relative) of the static run's; with a control, over the steps before the
control's first leaves that bound (a run in another configuration adds its
rounding differently, and trajectories that differ in their last bits
separate in time; once two static configurations disagree, a step's loss
says nothing about a switch). Exit 0 when the loss check holds and every
switch was equal bit for bit with matching digests, 1 when not (each failure
named on stderr), 2 when the runs' files are missing or malformed."""
import argparse
import os
import re
import sys

ME = "convergence_report.py"


def bad_input(what):
    print("%s: %s" % (ME, what), file=sys.stderr)
    sys.exit(2)


def read_loss(path, steps):
    """{step: (loss, config)} of a loss log ('STEP LOSS CONFIG' lines)."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        bad_input("%s: %s" % (path, e.strerror))
    out = {}
    for n, line in enumerate(lines, 1):
        f = line.split()
        try:
            step, loss = int(f[0]), float(f[1])
        except (IndexError, ValueError):
            bad_input("%s: line %d: not 'STEP LOSS CONFIG'" % (path, n))
        if step in out or not 1 <= step <= steps:
            bad_input("%s: line %d: step %d repeated or outside 1..%d" % (path, n, step, steps))
        out[step] = (loss, f[2] if len(f) > 2 else "")
    if len(out) != steps:
        bad_input("%s: %d steps logged, the run had %d" % (path, len(out), steps))
    return out


def log_matches(path, pat):
    """The groups of every line of path that pat matches, numbers as ints."""
    out = []
    try:
        for line in open(path):
            m = pat.match(line)
            if m:
                out.append(tuple(int(g) if g.isdigit() else g for g in m.groups()))
    except OSError as e:
        bad_input("%s: %s" % (path, e.strerror))
    return out


def switch_lines(train_log, switches, every, configs):
    """(how many of the expected switches rank 0 logged as "switch K at step S
    to CFG: ... equal bit for bit", problems)."""
    seen = log_matches(train_log, re.compile(r"^train\.py: switch (\d+) at step (\d+) to (\S+): .*equal bit for bit"))
    want = [(k, k * every, configs[k % len(configs)]) for k in range(1, switches + 1)]
    ok = len(set(seen) & set(want))
    if seen != want:
        return ok, ["%s: switches checked bit for bit: %s; expected %s" % (train_log, seen, want)]
    return ok, []


def digests(run_dir, ranks, switches):
    """(matches, problems) over every rank's vps-exec log."""
    pat = re.compile(r"^vps-exec: rank (\d+): switch (\d+): .*digest: (\S+)")
    matches, problems = 0, []
    for r in range(ranks):
        path = os.path.join(run_dir, "exec.%d.log" % r)
        got = log_matches(path, pat)
        want = [(r, k, "match") for k in range(1, switches + 1)]
        if got != want:
            problems.append("%s: digests %s; expected %s" % (path, got, want))
        matches += sum(1 for g in got if g[2] == "match")
    return matches, problems


def master_deviation(a_path, b_path):
    """Largest absolute deviation, largest relative one (max|a-b| / max|a|,
    per tensor) and the tensors they occur in, over two saved master files."""
    import torch
    def load(path):
        try:
            return torch.load(path)
        except OSError as e:
            bad_input("%s: %s" % (path, e.strerror))
        except Exception as e:  # torch.load's own errors: pickle, zip, RuntimeError
            bad_input("%s: not a saved dict of tensors: %s" % (path, e))
    a, b = load(a_path), load(b_path)
    if not all(isinstance(m, dict) and all(torch.is_tensor(t) for t in m.values()) for m in (a, b)):
        bad_input("%s or %s: not a saved dict of tensors" % (a_path, b_path))
    if sorted(a) != sorted(b):
        return None, ["master weights: the runs saved different tensors: %s" % sorted(set(a) ^ set(b))]
    worst_abs, worst_rel, problems = (0.0, ""), (0.0, ""), []
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            problems.append("master weights: %s: %s %s against %s %s" % (name, x.dtype, tuple(x.shape),
                                                                          y.dtype, tuple(y.shape)))
            continue
        d = (x.double() - y.double()).abs().max().item()
        if d != d:  # a NaN in either: as far apart as can be
            d = float("inf")
        scale = x.double().abs().max().item()
        rel = d / scale if scale else (0.0 if d == 0 else float("inf"))
        if d > worst_abs[0] or not worst_abs[1]:
            worst_abs = (d, name)
        if rel > worst_rel[0] or not worst_rel[1]:
            worst_rel = (rel, name)
    return (worst_abs, worst_rel, len(a), sum(t.numel() for t in a.values())), problems


def draw(path, steps, runs, every, switches, configs, max_rel, checked):
    """runs: [(label, {step: (loss, config)}, relative deviations or None, colour, style)]."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "vps-convergence"
    import matplotlib.pyplot as plt
    xs = list(range(1, steps + 1))
    fig, (top, bot) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for label, loss, rel, colour, style in runs:
        top.plot(xs, [loss[s][0] for s in xs], color=colour, lw=style[0], ls=style[1], label=label)
        if rel is not None:
            pos = [(s, r) for s, r in zip(xs, rel) if r > 0]
            bot.plot([p[0] for p in pos], [p[1] for p in pos], ".", ms=style[2], color=colour, label=label)
    lo, hi = top.get_ylim()
    for k in range(1, switches + 1):
        for ax in (top, bot):
            ax.axvline(k * every + 0.5, color="grey", lw=0.6, ls=":")
    for k in range(switches + 1):
        top.text(k * every + 2, hi - 0.03 * (hi - lo), configs[k % len(configs)].replace(",", "\n"),
                 fontsize=7, va="top", color="dimgrey")
    top.set_ylabel("loss")
    top.legend(loc="lower left", fontsize=8)
    top.set_title("micro-llama, 4 ranks, same data: loss per step (dotted lines: the switches)", fontsize=10)
    bot.set_yscale("log")
    bot.axhline(max_rel, color="black", lw=0.8, ls="--")
    bot.text(2, max_rel, "%g" % max_rel, fontsize=7, va="bottom")
    if checked < steps:
        bot.axvspan(0, checked + 0.5, color="tab:green", alpha=0.08, lw=0)
        bot.text(checked, bot.get_ylim()[0], "checked to step %d " % checked, fontsize=7, ha="right", va="bottom")
    bot.set_ylabel("|loss - static| / static")
    bot.set_xlabel("step (no point: the same loss as the static run's)")
    bot.legend(loc="lower right", fontsize=7)
    bot.set_xlim(0, steps + 1)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def deviation(static, other, steps, max_rel):
    """Relative deviation of each step's loss (index step - 1), the worst
    step, the first step over max_rel (0 when none) and the steps equal."""
    rel = []
    for s in range(1, steps + 1):
        x, y = static[s][0], other[s][0]
        r = abs(y - x) / abs(x) if x else (0.0 if y == x else float("inf"))
        rel.append(float("inf") if r != r else r)  # a NaN loss is over any bound
    worst = max(range(steps), key=lambda i: rel[i]) + 1
    over = next((i + 1 for i in range(steps) if rel[i] > max_rel), 0)
    equal = sum(1 for s in range(1, steps + 1) if static[s][0] == other[s][0])
    return rel, worst, over, equal


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--static", required=True)
    a.add_argument("--switched", required=True)
    a.add_argument("--control", help="a static run in another configuration")
    a.add_argument("--steps", type=int, required=True)
    a.add_argument("--every", type=int, required=True)
    a.add_argument("--configs", required=True, help="the switched run's configurations, comma-separated")
    a.add_argument("--control-config", default="", help="the control run's configuration (for the table)")
    a.add_argument("--ranks", type=int, required=True)
    a.add_argument("--max-rel", type=float, default=1e-3)
    a.add_argument("--svg")
    a.add_argument("--pointer", help="write a one-line summary here")
    args = a.parse_args()
    if args.steps < 1 or args.every < 1 or args.ranks < 1:
        bad_input("--steps, --every and --ranks must be positive")
    configs = [c.replace(":", ",") for c in args.configs.split(",")]
    ctrl_cfg = args.control_config.replace(":", ",")
    switches = (args.steps - 1) // args.every if len(configs) > 1 else 0
    steps, max_rel = args.steps, args.max_rel
    static = read_loss(os.path.join(args.static, "loss.txt"), steps)
    switched = read_loss(os.path.join(args.switched, "loss.txt"), steps)
    control = read_loss(os.path.join(args.control, "loss.txt"), steps) if args.control else None
    fails = []
    rel, worst, over, equal = deviation(static, switched, steps, max_rel)
    # the steps over which a step's loss can judge a switch
    checked = steps
    if control:
        c_rel, c_worst, c_over, c_equal = deviation(static, control, steps, max_rel)
        if c_over:
            checked = c_over - 1
        if checked <= args.every:
            fails.append("loss: the control leaves %g of the static run at step %d, before the first switch's "
                         "first step (%d): the loss cannot judge a switch (switch sooner)"
                         % (max_rel, c_over, args.every + 1))
    in_window = [i + 1 for i in range(checked) if rel[i] > max_rel]
    if in_window:
        fails.append("loss: %d of steps 1-%d deviate by more than %g relative (first %d, worst %d: %.3g)"
                     % (len(in_window), checked, max_rel, in_window[0],
                        max(in_window, key=lambda s: rel[s - 1]), max(rel[s - 1] for s in in_window)))
    w_worst = max(range(1, checked + 1), key=lambda s: rel[s - 1]) if checked else 0
    bit_ok, bit_problems = switch_lines(os.path.join(args.switched, "train.0.log"), switches, args.every, configs)
    fails += bit_problems
    matched, digest_problems = digests(args.switched, args.ranks, switches)
    fails += digest_problems
    static_pt = os.path.join(args.static, "master.pt")
    master, problems = master_deviation(static_pt, os.path.join(args.switched, "master.pt"))
    fails += problems
    c_master = None
    if control:
        c_master, problems = master_deviation(static_pt, os.path.join(args.control, "master.pt"))
        fails += problems
    tail_n = min(args.every, steps)

    def tail_mean(loss):
        return sum(loss[s][0] for s in range(steps - tail_n + 1, steps + 1)) / tail_n

    def loss_row(rel, worst, over, equal, loss):
        return ("largest %.3g at step %d (static %.9g, this run %.9g); first over %g: %s; "
                "steps with the static run's loss: %d"
                % (rel[worst - 1], worst, static[worst][0], loss[worst][0], max_rel,
                   "step %d" % over if over else "none", equal))

    def master_row(m):
        (d_abs, n_abs), (d_rel, n_rel), n_t, n_el = m
        return "absolute %.3g in `%s`; relative %.3g in `%s`" % (d_abs, n_abs, d_rel, n_rel)

    order = " -> ".join(configs[k % len(configs)] for k in range(switches + 1))
    rows = [
        ("steps", "%d, the same global batches in the same order in every run" % steps),
        ("static run", "`%s` throughout" % configs[0]),
        ("switched run", "every %d steps: `%s`" % (args.every, order)),
    ]
    if control:
        rows.append(("control run", "`%s` throughout (static, another configuration)" % ctrl_cfg))
    rows += [
        ("switches with the state equal bit for bit", "%d of %d (rank 0 gathers the whole state before and "
                                                       "after each)" % (bit_ok, switches)),
        ("vps-exec digests that match", "%d of %d (%d switches x %d ranks)"
         % (matched, switches * args.ranks, switches, args.ranks)),
        ("loss, switched vs static", loss_row(rel, worst, over, equal, switched)),
    ]
    if control:
        rows.append(("loss, control vs static", loss_row(c_rel, c_worst, c_over, c_equal, control)))
    rows.append(("loss checked within %g" % max_rel,
                 "steps 1-%d%s: switched run's largest deviation there %.3g (step %d)"
                 % (checked, " (until the control leaves the bound)" if checked < steps else "",
                    rel[w_worst - 1] if checked else 0.0, w_worst)))
    rows.append(("mean loss over the last %d steps" % tail_n, "static %.4f, switched %.4f%s (step 1: %.4f)"
                 % (tail_mean(static), tail_mean(switched),
                    ", control %.4f" % tail_mean(control) if control else "", static[1][0])))
    if master:
        rows.append(("fp32 master weights at the end, switched vs static", master_row(master)))
    if c_master:
        rows.append(("fp32 master weights at the end, control vs static", master_row(c_master)))
    rows.append(("verdict", ("every switch bit for bit; loss within %g of the static run's at steps 1-%d"
                             % (max_rel, checked)) if not fails else "**FAILED**: " + "; ".join(fails)))
    print("| measure | result |")
    print("|---|---|")
    for k, v in rows:
        print("| %s | %s |" % (k, v))
    if master:
        print()
        print("Master weights: %d tensors, %d elements; relative is, per tensor, the largest absolute "
              "difference over the static run's largest absolute value." % (master[2], master[3]))
    if args.pointer:
        with open(args.pointer, "w") as f:
            f.write("micro-llama, 4 ranks, %d steps, %d switches through %s: %s; loss within %g of the static "
                    "run's at steps 1-%d%s; largest deviation over all steps %.2g%s. "
                    "See [convergence.md](convergence.md).\n"
                    % (steps, switches, ", ".join("`%s`" % c for c in configs),
                       "every switch equal bit for bit, every digest a match" if not bit_problems and not digest_problems
                       else "NOT every switch equal bit for bit with matching digests",
                       max_rel, checked, " (while a static `%s` run is)" % ctrl_cfg if checked < steps else "",
                       rel[worst - 1], " (that static run: %.2g)" % c_rel[c_worst - 1] if control else ""))
    if args.svg:
        runs = [("static (%s)" % configs[0], static, None, "tab:blue", (1.6, "-", 0)),
                ("switched every %d steps" % args.every, switched, rel, "tab:red", (1.0, "--", 3))]
        if control:
            runs.append(("control, static (%s)" % ctrl_cfg, control, c_rel, "grey", (0.7, "-", 2)))
        draw(args.svg, steps, runs, args.every, switches, configs, max_rel, checked)
    for f in fails:
        print("%s: %s" % (ME, f), file=sys.stderr)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
