#!/usr/bin/env bash
# A Megatron-Core job's pause against its transfer. tests/megatron/
# check_switch.py trains micro-gpt and micro-moe on 4 ranks on this
# machine's CPUs and switches them through vps-exec: each next
# configuration prepared while the job trains (vps.megatron.Job.prepare),
# the pause the transfer and the hand-over. Each switch's pause is broken
# down from the Job's clocks and the executors' reports, in the same run
# (check_switch.py --pauses). RUNS runs of it (default 3), then one run
# without Job.prepare (the next configuration built in the pause, as the
# Job did before), for scale. Then Megatron-LM's own loop:
# tests/megatron/check_pretrain.py --pauses, RUNS runs (a GPT job whose
# fixed schedule's switches are made ready between two iterations before
# they are due, the same with
# --vps-build-in-pause, a MoE job whose asked-for switches are made in the
# pause). Prints the tables and the
# verdicts against the target (the pause at most 1.2x the slowest rank's
# vps-exec transfer); --doc writes them into docs/BENCHMARKS.md (section
# megatron-pause).
#   scripts/bench/megatron_pause.sh [--doc]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
py=${PYTHON:-$top/build/venv/bin/python}
"$py" -c 'import megatron.core' 2> /dev/null || { echo "megatron_pause.sh: $py has no megatron-core (make venv)" >&2; exit 2; }
make -s all
doc=
if [ "${1:-}" = --doc ]; then doc=1; fi
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
runs=${RUNS:-3}
export VPS_LIBRARY=$top/build/libvps.so VPS_BIN=$top/bin
for run in $(seq "$runs"); do
	"$py" tests/megatron/check_switch.py --optimizer adam --pauses "$t/run$run.json" > "$t/run$run.log"
done
"$py" tests/megatron/check_switch.py --optimizer adam --no-prepare --pauses "$t/unprepared.json" > "$t/unprepared.log"
# the jobs that switch (the others end at a failed switch, by design)
for run in $(seq "$runs"); do
	"$py" tests/megatron/check_pretrain.py -k gpt -k gpt-in-pause -k moe --pauses "$t/pretrain$run.json" \
		> "$t/pretrain$run.log"
done
stamp=$(scripts/bench/doc-stamp.sh "RUNS=$runs scripts/bench/megatron_pause.sh${doc:+ --doc}")
table=$("$py" - "$t" "$runs" "$stamp" <<'PY'
import json, statistics, sys
t, runs, stamp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
every = [json.load(open("%s/run%d.json" % (t, r + 1))) for r in range(runs)]
unprepared = json.load(open("%s/unprepared.json" % t))
ms = lambda x: "%.1f" % (x * 1e3)  # noqa: E731


def per_switch(runs):
    """Each switch of the runs' jobs: the job, the first run's switch, every
    run's, the median over the runs of one of its parts, and each run's R."""
    for job in runs[0]:
        for k, first in enumerate(runs[0][job]):
            ps = [run[job][k] for run in runs]
            yield job, first, ps, lambda part, ps=ps: statistics.median(p[part] for p in ps), \
                [p["pause"] / p["transfer"] for p in ps]


print(stamp)
print()
print("Per switch, the median over %d runs (ms); R is the pause over the transfer, each run's, then the median."
      % runs)
print()
print("| job | switch | pause | arrival | transfer (stages) | beside it: hand-over | wake | registry | groups | build | "
      "attach | R per run | R |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
ratios, own = [], []
for job, first, ps, med, r in per_switch(every):
    ratios += r
    own += [p["groups"] + p["build"] + p["attach"] + p["registry"] for p in ps]
    print("| %s | %s -> %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s | %.2f |" % (
        job, first["from"], first["to"], ms(med("pause")), ms(med("arrival")), ms(med("transfer")),
        ms(med("stages")), ms(med("meanwhile")), ms(med("wake")), ms(med("registry")), ms(med("groups")), ms(med("build")),
        ms(med("attach")), " ".join("%.2f" % x for x in r), statistics.median(r)))
ahead = [p["ahead"] for run in every for job in run for p in run[job] if p["ahead"]]
print()
print("Before the pause, in Job.prepare (the slowest rank's, median over every switch, ms): the next State "
      "allocated and registered %s, process groups %s (made, or taken from the cache: %s), build under the "
      "skeleton %s, pointed into the State %s."
      % (ms(statistics.median(a["target"] for a in ahead)), ms(statistics.median(a["groups"] for a in ahead)),
         "the median is a cache hit's" if statistics.median(a["groups"] for a in ahead) < 0.005 else "mostly made",
         ms(statistics.median(a["build"] for a in ahead)), ms(statistics.median(a["attach"] for a in ahead))))
un = [p for job in unprepared for p in unprepared[job]]
print()
print("Without Job.prepare (one run, every switch building its configuration in the pause): pause %s-%s ms, "
      "of which groups %s-%s, build %s-%s, attach %s-%s; %.1f-%.1fx the transfer."
      % (ms(min(p["pause"] for p in un)), ms(max(p["pause"] for p in un)), ms(min(p["groups"] for p in un)),
         ms(max(p["groups"] for p in un)), ms(min(p["build"] for p in un)), ms(max(p["build"] for p in un)),
         ms(min(p["attach"] for p in un)), ms(max(p["attach"] for p in un)),
         min(p["pause"] / p["transfer"] for p in un), max(p["pause"] / p["transfer"] for p in un)))
switches = [p for run in every for job in run for p in run[job]]
arrival = [p["arrival"] / p["transfer"] for p in switches]
wake = [p["wake"] / p["transfer"] for p in switches]
rest = [(p["pause"] - p["arrival"] - p["wake"]) / p["transfer"] for p in switches]
print()
worst, median = max(ratios), statistics.median(ratios)
print("Target: the pause at most 1.2x the transfer, every switch. Verdict: %s: the largest R is %.2f, the "
      "median %.2f over %d switches. What the Job does in the pause (groups, build, attach, the "
      "registry) is at most %s ms, median %s ms; the arrival alone is %.2f-%.2fx the transfer (median %.2f), "
      "the wake-up (the last trainer running again after its executor's verdict) %.2f-%.2fx (median %.2f); "
      "the pause less the two is at most %.2fx the transfer (median %.2f)."
      % ("met" if worst <= 1.2 else "not met", worst, median, len(ratios), ms(max(own)),
         ms(statistics.median(own)), min(arrival), max(arrival), statistics.median(arrival), min(wake), max(wake),
         statistics.median(wake), max(rest), statistics.median(rest)))
pretrain = [json.load(open("%s/pretrain%d.json" % (t, r + 1))) for r in range(runs)]
print()
print("Megatron-LM's pretrain() (tests/megatron/check_pretrain.py, vps.megatron_training), per switch, the median "
      "over %d runs (ms): the pause from the last rank stopping to the last training again; in it Job.switch (its "
      "arrival, transfer, the hand-over beside it, and groups, build and attach as above), then the job's arguments and model config, and "
      "the data iterators (taken, or made), and the data sets they are of (over the ranks: made, and taken from "
      "those made before); built: the configuration made ahead, by the training thread between "
      "two iterations right after the switch before (*ahead*: Job.prepare, then the data sets and iterators at "
      "the samples foreseen; the job trains on after it), or in the pause (--vps-build-in-pause, or a switch "
      "asked for through the control file); after the pause, the collection of the configuration before, at the "
      "end of the next iteration, and the wait for vps-exec's exit, at the next boundary." % runs)
print()
print("| job | switch | built | pause | Job.switch | arrival | transfer | beside it: hand-over | groups | build | "
      "attach | arguments | iterators | data sets made, reused | ahead: prepare | ahead: data | after: collect | "
      "after: exit | R per run | R |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
ready_r, asked_r = [], []
switches = list(per_switch(pretrain))
for job, first, ps, med, r in switches:
    (ready_r if first["ahead"] else asked_r).extend(r)
    ahead = [sum(p["ahead"].values()) for p in ps if p["ahead"]]
    data = [p["data_ahead"] for p in ps if p["data_ahead"] is not None]
    print("| %s | %s -> %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d, %d | %s | %s | %s | %s | "
          "%s | %.2f |" % (
        job, first["from"], first["to"], "ahead" if first["ahead"] else "in the pause", ms(med("pause")),
        ms(med("job")), ms(med("arrival")), ms(med("transfer")), ms(med("meanwhile")), ms(med("groups")), ms(med("build")),
        ms(med("attach")), ms(med("arguments")), ms(med("iterators")), *first["data_sets"],
        ms(statistics.median(ahead)) if ahead else "-", ms(statistics.median(data)) if data else "-",
        ms(med("collect")), ms(med("exit")), " ".join("%.2f" % x for x in r), statistics.median(r)))
print()
# what the training loop stood still for: the pause, and the work ahead between two iterations
stood = {True: [], False: []}
for _, first, ps, _, _ in switches:
    stood[bool(first["ahead"])].append(
        [p["pause"] + (sum(p["ahead"].values()) + p["data_ahead"] if p["ahead"] else 0) for p in ps])
ready, asked = stood[True], stood[False]
print("Target: the pause at most 1.2x the transfer. Verdict: %s: switches built ahead (a fixed schedule) R "
      "%.2f-%.2f (median %.2f); built in the pause R %.2f-%.2f."
      % ("met" if max(ready_r + asked_r) <= 1.2 else "not met", min(ready_r), max(ready_r),
         statistics.median(ready_r), min(asked_r), max(asked_r)))
print()
print("What the training loop stands still for a switch, its pause and the work ahead together (the median over "
      "the runs of each switch, ms): built ahead %s; built in the pause %s. The work ahead is not hidden behind "
      "an iteration here: the training thread does it between two iterations (Megatron's builders swap "
      "parallel_state's globals, which an iteration reads, and hold Python's GIL)."
      % (", ".join(ms(statistics.median(s)) for s in ready), ", ".join(ms(statistics.median(s)) for s in asked)))
PY
)
echo "$table"
if [ -n "$doc" ]; then
	echo "$table" | scripts/bench/doc-section.sh megatron-pause docs/BENCHMARKS.md
fi
