"""A Megatron-LM job started with megatron.training.pretrain() made
switchable: Megatron-LM's own training loop runs, and between two
iterations a scheduler moves the job to another parallel configuration.

The lines a copy of Megatron-LM's pretrain_gpt.py adds (tests/megatron/
pretrain_gpt.py holds them, marked "vps:"):

    import vps.megatron_training as vps_mt

    args = parse_and_validate_args(extra_args_provider=vps_mt.add_arguments, ...)
    ...
    vps_mt.pretrain(full_config, train_valid_test_datasets_provider,
                    ModelType.encoder_or_decoder, forward_step, ...)

vps_mt.pretrain takes megatron.training.pretrain's arguments and calls it.
Without --vps-control or --vps-switch-to it is Megatron's pretrain and
nothing else. With them, the job is asked to switch by

    --vps-control FILE        a scheduler writes configurations to FILE, a
                              line each (examples/torch/launch.py's control
                              file: "tp=4,pp=2", ":" for "," too, "#"
                              comments); rank 0 reads the lines added since
                              between two iterations, and at once on SIGUSR1
    --vps-switch-to A,B,...   or a fixed schedule: configuration A (colons
    --vps-switch-every K      between its items, "tp=4:pp=2") after
                              iteration K, B after 2K, ...

A configuration names tp, pp, cp, ep, etp, vpp, first and last as
vps-layout(1) does; dp is the rest of the job's world when not given, and
the distributed optimizer and the gradient buckets are the job's own
(zero=1, and bucket= from --overlap-grad-reduce and --ddp-bucket-size). The
world does not change (torchrun keeps it).

What a switch does, after the iteration's logging, evaluation and
checkpoint (Megatron's checkpoint_and_decide_exit):

1. Megatron's train() returns as at its last iteration (vps sets
   args.train_iters to the iteration for the moment), into vps, which
   pretrain() called in train()'s place.
2. Each rank makes its part of the switch's plan (vps-layout, vps-plan
   --rank, vps-stage in --vps-dir/rank-R; vps-plan's default, relays where
   they win, weighed on --vps-topology's links if given, and none wins in
   these switches) and starts
   its own vps-exec, whose rendezvous port rank 0 picks.
3. The new configuration is built with Megatron's own code, from the
   job's arguments updated to it (tensor_model_parallel_size,
   pipeline_model_parallel_size, virtual_pipeline_model_parallel_size,
   context_parallel_size, expert_model_parallel_size,
   expert_tensor_parallel_size, data_parallel_size,
   num_layers_in_first/last_pipeline_stage, sequence_parallel,
   padded_vocab_size): the process groups (initialize.
   _initialize_distributed, whose initialize_model_parallel is
   vps.megatron.initialize_groups: made once per configuration and cached,
   under its policy; the first configuration's, made by
   initialize_megatron, join the cache as training starts:
   vps.megatron.adopt_groups), the seeds (_set_random_seed), the microbatch
   calculator (reconfigure_num_microbatches_calculator), the model's
   TransformerConfig (core_transformer_config_from_args, of the class the
   job's was) and the model and optimizer (setup_model_and_optimizer, with
   nothing to load), under vps.megatron.Job.prepare's skeleton (no weight
   initialised, the parameters and states pointed into the buffers the
   switch fills); then the job's arguments, model config, microbatch
   calculator, seeds and process groups are the running configuration's
   again, and what the build made of them is put in place at the switch.
   The provider's data sets for the new configuration are made too, with
   its groups (Job.prepared_groups), and ahead of a scheduled switch
   Megatron's data iterators of them (see below). Megatron asks for the
   same numbers of samples under every configuration: where its dataset
   builder, deciding under the new groups, gives this rank data sets it
   made before (the same class, samples, indices and config), they are
   those (for GPT, their indices are not made again), kept for the last
   two configurations (_DataSets; Switch.data_sets counts them).
4. vps.megatron.Job.switch moves the state (bf16 parameters, fp32 main
   parameters, Adam's moments; Adam's step, the consumed samples and the
   scheduler's position carried) and hands the new objects the moved
   buffers.
5. The objects pretrain() holds stay the job's: the list of model chunks
   is refilled, the optimizer object becomes the new configuration's (its
   class and attributes are the new one's), the OptimizerParamScheduler is
   the same object pointed at it, and the data iterators (lists, one per
   model chunk, which Megatron's schedules take) are refilled with new ones
   built by Megatron at args.consumed_train_samples and
   args.consumed_valid_samples for the new data-parallel rank and size (of
   the data sets made in 3 where Megatron asks for the same numbers of
   samples), or with those made ahead.
6. train() is called again from args.iteration, as after a checkpoint load:
   it takes the new configuration's schedule and model config, and the
   loss accumulators of the log interval a switch splits carry on. The
   configuration before is collected (gc.collect: its objects are garbage
   in cycles, holding no memory vps moved) at the end of the next
   iteration, not in the pause.

Under a fixed schedule, 2 and 3 are done ahead, before the switch is
due: between two iterations, as training starts and right after each
switch, for the next one (Switch.ready), the executor then waiting for
the request in a process of its own, mapping the job's buffers while the
job trains on. The build is the training thread's: Megatron's builders
swap parallel_state's globals, which an iteration reads, and hold
Python's GIL, so it cannot run beside an iteration; the job stands still
for it between the two iterations (Switch.clocks's `ahead` and
`data_ahead`), not in the pause. With 3 come the data iterators of 5, at
the samples the job will have consumed at the switch: the training's by
the global batch, the validation's by the evaluations Megatron's train()
makes at --eval-interval; where the job consumed other numbers (a
batch-size ramp, a validation Megatron cut short), the switch makes them
again of the data sets made ahead. The pause holds 4 and 5, the transfer
and the hand-over (docs/BENCHMARKS.md, megatron-pause, measures both
ways). A switch asked for through the
control file is known only at the boundary it is read at, and does 2 and
3 in the pause. What a prepared configuration holds until its switch:
its moved state's buffers (vps.megatron.Job.prepare), its process groups
(cached), its data sets and its data loaders (with --num-workers, their
worker processes); a job without the memory for the next
configuration's state beside its own while it trains (its activations and
gradients too) passes --vps-build-in-pause, and only 2 is done ahead.
vps-exec's exit after the switch (its mappings let go, its report
written: the switch was done when Job.switch returned) is waited for at
the next boundary, not in the pause.

So logging, evaluation, and the next checkpoint (save_checkpoint) are the
new configuration's. Four of megatron.training.training's functions are
wrapped while pretrain() runs, and put back after: train,
checkpoint_and_decide_exit, training_log and
build_train_valid_test_data_iterators.

A switch whose executors fail (vps.Error from Job.switch) ends pretrain()
with that error, the job's state where vps.switch leaves it. A vps-exec
that dies fails the switch at once where it was made ahead and died
before it (check_pretrain.py's gpt-dead-exec), or held the job's registry
(the registry's wait looks for it), or died before it opened the registry
(each vps-exec's pid is told to the registry: Registry.expect_executor;
check_pretrain.py's gpt-exec-fails), naming its exit status and log; the
other ranks' executors then wait for it at the rendezvous for
--vps-timeout (under torchrun the failed rank ends them first).

Not supported, and refused before training starts: what vps.megatron.Job
refuses (fp16, the precision-aware optimizer), a job without the
distributed optimizer (which the Job switches; the layout made from the
job's arguments here is ZeRO-1's), a pg_collection passed to pretrain, CUDA graphs, RL, --use-tp-pp-dp-mapping,
--multiple-validation-sets, asynchronous saves with a persistent worker
(train() stops it when it returns), --num-buckets (gradient buckets must be
a size vps can lay out).

The model vps lays out is --vps-model (a vps model file, a name of
configs/models or a Hugging Face config.json) or, by default, made from
the job's arguments (model_from_args): GPT and LLaMA shapes, MoE with
SequentialMLP experts; the Job checks every parameter of Megatron's model
against it when training starts."""
import collections
import contextlib
import dataclasses
import enum
import functools
import gc
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import megatron as _vps_megatron
from ._lib import Error
from .layout import layout as _layout, topology
from .ports import free_port
from .registry import Registry, Training

VPS_EINPUT, VPS_ECHECK, VPS_EPEER, VPS_EUNSUPPORTED = 1, 2, 9, 10
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the parallel items a configuration may name; the others are the job's
_SPEC_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "first", "last", "grouped_gemm")


def add_arguments(parser):
    """Megatron's extra_args_provider for vps's arguments (chain another
    with lambda p: add_arguments(other(p)))."""
    g = parser.add_argument_group(title="vps: switching the job's parallel configuration")
    g.add_argument("--vps-control", metavar="FILE",
                   help="switch to each configuration written to FILE, a line each (read between iterations, "
                        "and at once on SIGUSR1 to rank 0)")
    g.add_argument("--vps-switch-to", metavar="A,B,...",
                   help="switch to A after --vps-switch-every iterations, to B after twice as many, ... (colons "
                        "between a configuration's items: tp=4:pp=2)")
    g.add_argument("--vps-switch-every", type=int, default=0, metavar="K")
    g.add_argument("--vps-build-in-pause", action="store_true",
                   help="under --vps-switch-to, build each next configuration in the switch's pause, not while "
                        "the job trains (its plan and vps-exec are still made ahead): the job then never holds "
                        "two configurations' state while it trains")
    g.add_argument("--vps-dir", metavar="DIR",
                   help="each rank's plans, vps-exec logs and reports go to DIR/rank-R (default: a temporary "
                        "directory, removed when the job ends well)")
    g.add_argument("--vps-registry", metavar="PREFIX",
                   help="rank R's registry is /dev/shm/PREFIX-R (default: vps-mlm-PID-RANDOM, rank 0's PID)")
    g.add_argument("--vps-model", metavar="MODEL",
                   help="the model vps lays out (default: made from the job's arguments)")
    g.add_argument("--vps-gpus-per-node", type=int, default=0, metavar="N",
                   help="ranks per node (default: LOCAL_WORLD_SIZE, as torchrun sets it, else the world)")
    g.add_argument("--vps-topology", metavar="T",
                   help="plan each switch for the time on topology T, a name of configs/topologies or a file "
                        "(vps-plan --topology): relays chosen by its links, and ranks whose NICs idle carry part "
                        "of what a node-mate takes in (default: weighed in bytes)")
    g.add_argument("--vps-transport", default="tcp", help="vps-exec's transport (default tcp)")
    g.add_argument("--vps-budget", default="256MiB", help="vps-stage's staging budget (default 256MiB)")
    g.add_argument("--vps-timeout", type=float, default=600.0, help="seconds a switch may take (default 600)")
    return parser


# ---- the model and the configurations, as vps names them ----
def model_from_args(args, vocab):
    """The vps model file (YAML text) of the model the job's arguments
    describe, `vocab` the tokenizer's vocabulary before padding. Raises
    vps.Error (VPS_EUNSUPPORTED) for what it cannot describe: give
    --vps-model then."""
    def refuse(what):
        raise Error(VPS_EUNSUPPORTED, "vps cannot make the model from the job's arguments: %s; give --vps-model"
                    % what)
    if getattr(args, "multi_latent_attention", False):
        refuse("multi-latent attention")
    if getattr(args, "mtp_num_layers", None):
        refuse("multi-token prediction layers")
    if args.normalization not in ("LayerNorm", "RMSNorm"):
        refuse("--normalization %s" % args.normalization)
    if args.position_embedding_type not in ("learned_absolute", "rope"):
        refuse("--position-embedding-type %s" % args.position_embedding_type)
    if args.swiglu:
        activation = "swiglu"
    elif getattr(args, "squared_relu", False) or getattr(args, "quick_geglu", False):
        refuse("an activation other than GeLU and SwiGLU")
    else:
        activation = "gelu"
    heads = args.num_attention_heads
    groups = args.num_query_groups if args.group_query_attention else heads
    lines = ["vps: model", "version: 1", "name: megatron-job", "hidden: %d" % args.hidden_size,
             "layers: %d" % args.num_layers, "heads: %d" % heads, "query_groups: %d" % groups,
             "head_dim: %d" % (args.kv_channels or args.hidden_size // heads), "vocab: %d" % vocab,
             "vocab_divisor: %d" % args.make_vocab_size_divisible_by,
             "norm: %s" % ("rmsnorm" if args.normalization == "RMSNorm" else "layernorm"),
             "activation: %s" % activation]
    if args.position_embedding_type == "learned_absolute":
        lines += ["position: learned", "max_positions: %d" % args.max_position_embeddings]
    else:
        lines.append("position: rope")
    for key, on in (("bias", args.add_bias_linear), ("qkv_bias", args.add_qkv_bias),
                    ("tied_embeddings", not args.untie_embeddings_and_output_weights),
                    ("qk_norm", args.qk_layernorm)):
        if on:
            lines.append("%s: true" % key)
    experts = args.num_experts or 0
    if experts:
        freq = args.moe_layer_freq
        pattern = [1 if i % freq == 0 else 0 for i in range(args.num_layers)] if isinstance(freq, int) else list(freq)
        first = pattern.index(1) if 1 in pattern else len(pattern)
        if pattern != [0] * first + [1] * (len(pattern) - first):
            refuse("--moe-layer-freq %s: vps lays out dense layers first, then MoE layers" % freq)
        lines += ["experts: %d" % experts, "moe_ffn: %d" % (args.moe_ffn_hidden_size or args.ffn_hidden_size)]
        if first:
            lines += ["first_dense: %d" % first, "ffn: %d" % args.ffn_hidden_size]
        if args.moe_shared_expert_intermediate_size:
            lines.append("shared_ffn: %d" % args.moe_shared_expert_intermediate_size)
        if args.moe_router_enable_expert_bias:
            # a module buffer of the routers that Megatron updates every step: vps.megatron moves it
            lines.append("router_bias: true")
    else:
        lines.append("ffn: %d" % args.ffn_hidden_size)
    return "\n".join(lines) + "\n"


def spec_of_args(args):
    """The job's current configuration as a vps parallel spec."""
    par = dict(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
               dp=args.data_parallel_size, cp=args.context_parallel_size, ep=args.expert_model_parallel_size,
               etp=args.expert_tensor_parallel_size or args.tensor_model_parallel_size,
               vpp=args.virtual_pipeline_model_parallel_size or 1)
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    items = ["%s=%d" % kv for kv in par.items()]
    items += ["first=%d" % first] if first else []
    items += ["last=%d" % last] if last else []
    items += ["grouped_gemm=1"] if getattr(args, "moe_grouped_gemm", False) else []
    return ",".join(items + _job_items(args))


def _job_items(args):
    """What every configuration of the job keeps: the distributed optimizer
    and the gradient buckets DDP makes."""
    if not args.overlap_grad_reduce:
        bucket = "0"
    elif args.ddp_bucket_size:
        bucket = str(args.ddp_bucket_size)
    else:
        bucket = "auto"
    return ["zero=1", "bucket=" + bucket]


def complete_spec(spec, args, world):
    """A configuration asked for ("tp=4,pp=2" or "tp=4:pp=2"), completed
    with the job's own items and, when it names none, the data-parallel
    size that fills the world. Raises vps.Error (VPS_EINPUT) naming what
    it refuses."""
    items = [i.strip() for i in spec.replace(":", ",").split(",") if i.strip()]
    par = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in _SPEC_KEYS:
            raise Error(VPS_EINPUT, "%s: %s: a configuration names %s (the distributed optimizer and the "
                        "buckets are the job's)" % (spec, item, ", ".join(_SPEC_KEYS)))
        try:
            par[key] = int(value)
        except ValueError:
            raise Error(VPS_EINPUT, "%s: %s: not a number" % (spec, item)) from None
        if par[key] < 0 or (par[key] == 0 and key not in ("first", "last", "grouped_gemm")):
            raise Error(VPS_EINPUT, "%s: %s: out of range" % (spec, item))
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    if "dp" not in par:
        if world % (tp * pp * cp):
            raise Error(VPS_EINPUT, "%s: tp x pp x cp = %d does not divide the job's %d ranks"
                        % (spec, tp * pp * cp, world))
        par["dp"] = world // (tp * pp * cp)
    if tp * pp * cp * par["dp"] != world:
        raise Error(VPS_EINPUT, "%s: %d ranks; the job has %d (vps.megatron does not change the world)"
                    % (spec, tp * pp * cp * par["dp"], world))
    return ",".join(["%s=%d" % kv for kv in par.items()] + _job_items(args))


def _tool(name):
    for d in (os.environ.get("VPS_BIN"), os.path.join(TOP, "bin")):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        raise Error(VPS_EINPUT, "%s not found: run make, or put vps's tools on PATH (or VPS_BIN)" % name)
    return found


def _run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise Error(VPS_EINPUT, "%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


# ---- what asks for a switch ----
class ControlFile:
    """The configurations a scheduler writes to `path`, a line each, read
    on rank 0 when the file has grown, or at once after SIGUSR1 (as
    examples/torch/launch.py reads its control file)."""

    def __init__(self, path):
        self.path, self.seen, self.woken = path, 0, False
        signal.signal(signal.SIGUSR1, self._wake)

    def _wake(self, *_):
        self.woken = True

    def close(self):
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    def asked(self, iteration):
        """The configurations asked for since the last call, in order."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size == self.seen and not self.woken:
            return []
        self.woken = False
        with open(self.path) as f:
            data = f.read()
        whole = data[:data.rfind("\n") + 1]
        new = whole[self.seen:]
        self.seen = len(whole)
        return [s for s in (line.split("#")[0].strip() for line in new.splitlines()) if s]


class Schedule:
    """--vps-switch-to A,B,... --vps-switch-every K: A after iteration K, B
    after 2K, ..."""

    def __init__(self, specs, every):
        self.specs, self.every = list(specs), every

    def close(self):
        pass

    def asked(self, iteration):
        k = iteration // self.every
        if iteration % self.every or not 1 <= k <= len(self.specs):
            return []
        return [self.specs[k - 1]]

    def upcoming(self, iteration):
        """The next configuration asked for after iteration, and the
        iteration it comes after: (spec, at), or None."""
        k = iteration // self.every + 1
        return (self.specs[k - 1], k * self.every) if k <= len(self.specs) else None


class Switch:
    """One switch of the job: its number k (from 1), the iteration after
    which it happened, the configurations (vps specs) before and after, the
    Layouts, the seconds of its pause (pause: the work made ahead, between
    two iterations, not in them), the vps.Training vps-exec carried, whether
    it was made ready before the pause (ready: a fixed schedule's switch,
    its plan and vps-exec made, and its configuration built by Job.prepare
    unless --vps-build-in-pause; clocks["ahead"] says which), and on each
    rank what the pause held: clocks, vps.megatron.Job.clocks with `began`
    and `ended` (time.time() of the pause's ends), `arguments` (the job's
    arguments, model config and microbatch calculator made the new
    configuration's), `iterators` (the data iterators put in place, or
    made), `data_ahead` (where the data iterators were made ahead: the
    seconds that took, data sets included), `collect`, the collection of the
    configuration before after the first iteration that follows, and `exit`,
    the wait for vps-exec's exit at the next boundary (neither in the
    pause); report, the path of this rank's vps-exec report (vps-exec(1)
    --report); data_sets, how many data sets Megatron's builder made for
    this rank's new iterators and how many it took from those made before
    ({"made": m, "reused": r}: a switch back to a configuration reuses all
    its data sets)."""

    def __init__(self, k, iteration, source, target, source_layout, target_layout):
        self.k, self.iteration, self.source, self.target = k, iteration, source, target
        self.source_layout, self.target_layout = source_layout, target_layout
        self.pause, self.carried = None, None
        self.ready = False
        self.clocks, self.report = None, None
        self.data_sets = None

    def __repr__(self):
        return "Switch(%d after iteration %d: %s -> %s)" % (self.k, self.iteration, self.source, self.target)


# ---- pretrain ----
def check_arguments(args):
    """vps's arguments, among Megatron's: vps.Error (VPS_EINPUT) for a
    combination that asks for nothing or for two things, and the error of
    vps.topology for a --vps-topology it cannot read."""
    if args.vps_control and args.vps_switch_to:
        raise Error(VPS_EINPUT, "--vps-control and --vps-switch-to: the scheduler or a fixed schedule, not both")
    if args.vps_switch_to and args.vps_switch_every < 1:
        raise Error(VPS_EINPUT, "--vps-switch-to needs --vps-switch-every K (K >= 1)")
    if args.vps_switch_every and not args.vps_switch_to:
        raise Error(VPS_EINPUT, "--vps-switch-every without --vps-switch-to")
    if args.vps_build_in_pause and not args.vps_switch_to:
        raise Error(VPS_EINPUT, "--vps-build-in-pause without --vps-switch-to (an asked switch is built in the "
                    "pause)")
    if getattr(args, "vps_topology", None):
        try:  # a name no file has fails the job's start, not its first switch
            topology(args.vps_topology)
        except Error as e:
            raise Error(e.code, "--vps-topology: %s" % e) from None


def pretrain(*args, observer=None, **kwargs):
    """megatron.training.pretrain(*args, **kwargs), switchable (see the
    module's text). observer, if given, is told on every rank, with the
    job's model chunks and optimizer: before_switch(switch, model,
    optimizer) and after_switch(switch, model, optimizer) around each
    switch, and after_iteration(iteration, model, optimizer) at the end
    of every iteration (after Megatron's checkpoint); any it lacks are
    skipped."""
    from megatron.training import get_args
    from megatron.training import training as T

    margs = get_args()
    bound = inspect.signature(T.pretrain).bind(*args, **kwargs)
    check_arguments(margs)
    if not (margs.vps_control or margs.vps_switch_to):
        return T.pretrain(*args, **kwargs)
    job = _Switching(margs, bound.arguments, observer)
    with job.wrapped(T):
        return T.pretrain(*args, **kwargs)


def _become(obj, new):
    """obj takes new's class and attributes: code that holds obj (pretrain()
    holds the optimizer) holds the new object's state."""
    obj.__class__ = new.__class__
    obj.__dict__ = new.__dict__


class _Executor:
    """A rank's vps-exec for a switch: a thread of its own runs the tools
    that make the rank's part of the plan (`tools`, one after the other)
    and then starts vps-exec (`argv`), while the job builds the
    configuration (the tools run in processes of their own, the thread
    waits without the GIL); started() waits for it and raises what it
    raised. Its log and report are files in the rank's directory."""

    def __init__(self, tools, argv, env, log, report, rank):
        self.proc, self.error, self.stopped = None, None, False
        self.log, self.report, self.rank = open(log, "w"), report, rank
        self.thread = threading.Thread(target=self._start, args=(tools, argv, env), name="vps-exec rank %d" % rank,
                                       daemon=True)
        self.thread.start()

    def _start(self, tools, argv, env):
        try:
            for cmd in tools:
                _run(cmd)
            if not self.stopped:
                self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        except BaseException as e:  # raised by started(), in the job's thread
            self.error = e

    def started(self):
        self.thread.join()
        if self.error is not None:
            raise self.error

    def stop(self):
        """For a switch that does not come, or fails."""
        self.stopped = True
        self.thread.join()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
            self.proc.wait()
        self.log.close()

    def wait(self, k, timeout):
        self.started()
        rc = self.proc.wait(timeout=timeout)
        self.log.close()
        if rc:
            raise Error(VPS_EPEER, "switch %d: vps-exec rank %d exited with status %d (%s)"
                        % (k, self.rank, rc, self.log.name))


class _Ahead:
    """A fixed schedule's next switch made ready while the job trains: its
    configuration, its number and its vps-exec (the Job prepared the
    configuration)."""

    def __init__(self, spec, k, executor):
        self.spec, self.k, self.executor = spec, k, executor

    def stop(self):
        self.executor.stop()


class _Data:
    """The next switch's data, made ahead (_data_ahead): the provider's data
    sets ({(vp_stage, numbers of samples): data sets}), Megatron's iterators
    of them at the consumed (training, validation) samples foreseen, the
    loaders' do_train, do_valid and do_test, and the seconds it took."""

    def __init__(self, consumed):
        self.consumed, self.datasets = consumed, {}
        self.iterators, self.flags, self.seconds = None, None, None
        self.data_sets = None  # the data sets made and reused (_DataSets)

    def fits(self, args):
        """Whether the job consumed what was foreseen."""
        return self.iterators is not None and self.consumed == (args.consumed_train_samples,
                                                               args.consumed_valid_samples)


class _DataSets:
    """The data sets Megatron's dataset builder made on this rank, handed
    back where the builder asks for one of the same kind again. A switch
    has Megatron make the data iterators again, with the next
    configuration's groups; it asks the provider for the same numbers of
    samples under every configuration, and the provider's builder decides
    by its is_built_on_rank, under the new groups, whether this rank holds
    data sets. Where it does and made the same before (the same class,
    numbers of samples, split, indices and config), the data set is the
    one made then: for GPT, its document, sample and shuffle indices, most
    of what making the iterators took. The builder's barriers run as they
    would, on every rank alike; only the constructor is not called again.
    A data set is read only (GPTDataset's one cache, of masks and
    positions, is the same for every sample), so one serves the chunks and
    configurations that ask for it. Kept: the data sets the last two
    makings used (`KEEP`: the running configuration's and the one before
    it, which a switch back returns to); older ones are let go when a new
    making starts."""

    KEEP = 2

    def __init__(self):
        self.entries = []  # [class, its arguments, the data set, the making that last used it]
        self.making = 0
        self.counts = collections.Counter()  # made, reused: this making's
        self.lock = threading.Lock()  # the builder may build splits on threads

    def next_making(self):
        """A new making of data iterators: returns its counts."""
        with self.lock:
            self.making += 1
            self.entries = [e for e in self.entries if e[3] >= self.making - self.KEEP]
            self.counts = collections.Counter()
            return self.counts

    def patched(self, build_generic_dataset):
        """BlendedMegatronDatasetBuilder.build_generic_dataset, whose
        constructor call is looked up here first."""
        def ours(cls, is_built_on_rank, synchronize_ranks, *args):
            def made(*a):
                with self.lock:
                    for e in self.entries:
                        if e[0] is cls and _same_dataset_arguments(cls, e[1], a):
                            e[3] = self.making
                            self.counts["reused"] += 1
                            return e[2]
                data_set = cls(*a)
                with self.lock:
                    self.entries.append([cls, a, data_set, self.making])
                    self.counts["made"] += 1
                return data_set
            return build_generic_dataset(made, is_built_on_rank, synchronize_ranks, *args)
        return staticmethod(ours)


def _same_dataset_arguments(cls, old, new):
    """Whether Megatron's builder asks for the data set made of `old` again.
    A mid-level data set's first argument, the low-level data set, is made
    anew by every build from its path and config (the arguments after it),
    so its class stands for it."""
    from megatron.core.datasets.megatron_dataset import MegatronDataset
    if len(old) != len(new):
        return False
    if isinstance(cls, type) and issubclass(cls, MegatronDataset) and old:
        if type(old[0]) is not type(new[0]):
            return False
        old, new = old[1:], new[1:]
    return all(_same_argument(a, b) for a, b in zip(old, new))


def _same_argument(a, b):
    import numpy
    if type(a) is not type(b):
        return False
    if isinstance(a, numpy.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(numpy.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_argument(x, y) for x, y in zip(a, b))
    if a is None or isinstance(a, (bool, int, float, str, bytes, enum.Enum)) or dataclasses.is_dataclass(a):
        try:
            return bool(a == b)
        except Exception:  # a field NumPy will not compare as one truth value: not the same, to be safe
            return False
    # data sets the builder made (a blend's parts): the same objects
    return a is b


class _Built:
    """What _build made of the job's arguments for a configuration (by its
    layout's hash), of the model config (cfg_container's model and ddp) and
    of Python's and NumPy's random states (_set_random_seed seeds them)."""

    def __init__(self, layout, arguments, configs, seeds):
        self.layout, self.arguments, self.configs, self.seeds = layout, arguments, configs, seeds


def _configs(cfg):
    """pretrain()'s cfg_container's model config and DDP config, which a
    configuration has its own of (_update_model_config)."""
    return (getattr(cfg, "model", None), cfg.ddp) if cfg is not None else None


def _set_configs(cfg, configs):
    if cfg is not None:
        if configs[0] is not None:
            cfg.model = configs[0]
        cfg.ddp = configs[1]


# what setup_model_and_optimizer is told or sets only while it builds: the job's own stay
_BUILD_ONLY = frozenset(("load", "pretrained_checkpoint", "ckpt_convert_format", "moe_use_upcycling", "iteration",
                         "train_iters", "num_floating_point_operations_so_far"))


class _Switching:
    """One rank of a job that pretrain() runs and vps switches."""

    def __init__(self, args, pretrain_args, observer):
        import torch.distributed as dist
        self.args, self.observer = args, observer
        self.p = dict(pretrain_args)
        if self.p.get("pg_collection") is not None:
            raise Error(VPS_EUNSUPPORTED, "pretrain(pg_collection=...): vps makes Megatron's process groups again "
                        "at a switch, from the job's arguments")
        self._refuse_unsupported(args)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.gpus_per_node = args.vps_gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        if args.vps_switch_to:
            self.asks = Schedule(args.vps_switch_to.split(","), args.vps_switch_every)
        else:
            self.asks = ControlFile(args.vps_control) if self.rank == 0 else None
        self.job = self.reg = None
        self.switches, self.pending = [], None
        self.ahead = None  # the next switch, made ready while the job trains (_ahead)
        self.built = None  # what the last build changed in the job's arguments (_build)
        self.data = None  # the next switch's data sets and iterators, made ahead (_data_ahead)
        # the last switch and the data iterators it dropped, when the configuration before it is still to be
        # collected
        self.garbage = None
        self.exiting = None  # the last switch and its vps-exec, when it is still to exit (_exited)
        self.ckpt_ctx = None
        self.train_iters = None
        self.carry_log = None
        self.keep_dir = bool(args.vps_dir)
        self.dir = None
        self.optimizer = self.scheduler = None
        self.model = self.iterators = None
        self.queue, self.test_list, self.test_elements = [], None, []
        self.data_sets = _DataSets()

    @staticmethod
    def _refuse_unsupported(args):
        why = None
        if not args.use_distributed_optimizer:
            why = "the job does not use the distributed optimizer (--use-distributed-optimizer)"
        elif not args.bf16:
            why = "the job's parameters are not bf16 (--bf16)"
        elif args.cuda_graph_impl != "none":
            why = "CUDA graphs (--cuda-graph-impl) hold the configuration's model"
        elif args.perform_rl_step:
            why = "RL training (--perform-rl-step)"
        elif args.use_tp_pp_dp_mapping:
            why = "--use-tp-pp-dp-mapping: vps lays out Megatron's default rank order tp-cp-ep-dp-pp"
        elif args.multiple_validation_sets:
            why = "--multiple-validation-sets"
        elif args.async_save and args.use_persistent_ckpt_worker:
            why = "asynchronous saves with a persistent worker (train() stops the worker when it returns)"
        elif args.ddp_num_buckets:
            why = "--ddp-num-buckets (vps lays out buckets of a size: --ddp-bucket-size)"
        elif args.dataloader_type == "external":
            why = "--dataloader-type external (vps rebuilds the data iterators for the new data-parallel ranks)"
        if why:
            raise Error(VPS_EUNSUPPORTED, "vps cannot switch this job: " + why)

    # ---- Megatron's functions, wrapped while pretrain() runs ----
    def wrapped(self, T):
        import contextlib
        names = ("train", "checkpoint_and_decide_exit", "training_log", "build_train_valid_test_data_iterators")
        originals = {n: getattr(T, n) for n in names}
        ours = {"train": self._train, "checkpoint_and_decide_exit": self._between,
                "training_log": self._training_log, "build_train_valid_test_data_iterators": self._iterators}

        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder as B
        generic = B.__dict__["build_generic_dataset"]

        @contextlib.contextmanager
        def patched():
            self.T, self.orig = T, originals
            for n in names:
                setattr(T, n, ours[n])
            B.build_generic_dataset = self.data_sets.patched(generic.__func__)
            try:
                yield
            finally:
                for n in names:
                    setattr(T, n, originals[n])
                B.build_generic_dataset = generic
                self.close()
        return patched()

    def _iterators(self, provider):
        """Megatron's iterators, each as a list of one when the model has one
        chunk (Megatron's schedules take a list of one as the iterator): the
        objects pretrain() holds are lists, refilled at a switch. With VPP
        pretrain() makes the lists itself, of what this returns."""
        out = self.orig["build_train_valid_test_data_iterators"](provider)
        if self.args.virtual_pipeline_model_parallel_size is not None:
            self.test_elements.append(out[2])
            return out
        out = tuple([it] for it in out)
        self.test_list = out[2]
        return out

    def _training_log(self, loss_dict, total_loss_dict, *rest, **kw):
        # the log interval's sums go on across a switch, which gives train() a new dict
        if self.carry_log is not None and self.carry_log is not total_loss_dict and not total_loss_dict:
            total_loss_dict.update(self.carry_log)
        self.carry_log = total_loss_dict
        return self.orig["training_log"](loss_dict, total_loss_dict, *rest, **kw)

    def _between(self, model, optimizer, opt_param_scheduler, iteration, *rest):
        """Megatron's checkpoint_and_decide_exit, then what vps does between
        two iterations: tell the observer, and ask whether to switch."""
        if self.garbage is not None:
            # the configuration before the last switch is garbage in cycles (its chunks, their DDP hooks, their
            # config) holding no memory vps moved: collected here, out of the pause, as --manual-gc collects;
            # its data iterators, dropped here, are freed at once
            t = time.monotonic()
            sw, self.garbage = self.garbage[0], None
            gc.collect()
            sw.clocks["collect"] = time.monotonic() - t
        self._exited()
        if self.orig["checkpoint_and_decide_exit"](model, optimizer, opt_param_scheduler, iteration, *rest):
            return True
        self._tell("after_iteration", iteration, model, optimizer)
        if iteration >= self.args.train_iters:
            return False
        spec = self._next(iteration)
        if spec is not None:
            # train() ends as at its last iteration; _train switches and calls it again
            self.pending = spec
            self.train_iters = self.args.train_iters
            self.args.train_iters = iteration
        else:
            # the schedule's next, when the one before it was refused
            self._ahead(iteration)
        return False

    def _next(self, iteration):
        """The configuration to switch to now, the same on every rank, or None."""
        import torch.distributed as dist
        choice = [None]
        if self.rank == 0:
            self.queue += self.asks.asked(iteration)
            while self.queue and choice[0] is None:
                spec = self.queue.pop(0)
                try:
                    full = complete_spec(spec, self.args, self.world)
                    _layout(self.model_path, full, self.gpus_per_node)
                    choice[0] = full
                except Error as e:
                    _say("vps: %s: %s (ignored)" % (spec, e))
        dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def _tell(self, what, *a):
        fn = getattr(self.observer, what, None)
        if fn:
            fn(*a)

    # ---- the training loop, called again after each switch ----
    def _train(self, *a, **kw):
        from megatron.core.utils import get_model_config
        from megatron.training import get_timers
        args = self.args
        bound = inspect.signature(self.orig["train"]).bind(*a, **kw)
        arg = bound.arguments
        self.start(arg["model"], arg["optimizer"], arg["opt_param_scheduler"],
                   [arg["train_data_iterator"], arg["valid_data_iterator"]])
        self.ckpt_ctx = arg["checkpointing_context"]
        self._ahead(args.iteration)
        while True:
            iteration, flops = self.orig["train"](*bound.args, **bound.kwargs)
            if self.pending is None:
                return iteration, flops
            spec, self.pending = self.pending, None
            args.train_iters, self.train_iters = self.train_iters, None
            # train() starts from these, as after loading a checkpoint
            args.iteration, args.num_floating_point_operations_so_far = iteration, flops
            # the log interval's clock stands still while the job switches
            get_timers()("interval-time").stop()
            self.switch(spec, iteration)
            arg["config"] = get_model_config(self.model[0])
            self._ahead(iteration)

    def start(self, model, optimizer, scheduler, iterators):
        """The first entry into train(): the job's state into vps's buffers."""
        if self.job is not None:
            return
        import torch.distributed as dist
        from megatron.training import get_tokenizer
        args = self.args
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.iterators = list(iterators)
        tag = [None, os.environ.get("VPS_TOKEN")]
        if self.rank == 0:
            tag[0] = args.vps_registry or "vps-mlm-%d-%x" % (os.getpid(), int.from_bytes(os.urandom(4), "little"))
            if not tag[1]:
                tag[1] = _run([_tool("vps-exec"), "--new-token"]).strip()
        dist.broadcast_object_list(tag, src=0)
        self.tag, self.token = tag
        base = args.vps_dir or tempfile.mkdtemp(prefix="%s-rank%d-" % (self.tag, self.rank))
        self.dir = os.path.join(base, "rank-%d" % self.rank) if args.vps_dir else base
        os.makedirs(self.dir, exist_ok=True)
        if args.vps_model:
            self.model_path = args.vps_model
        else:
            self.model_path = os.path.join(self.dir, "model.yaml")
            with open(self.model_path, "w") as f:
                f.write(model_from_args(args, get_tokenizer().vocab_size))
        self.spec = spec_of_args(args)
        lay = _layout(self.model_path, self.spec, self.gpus_per_node)
        if lay.world != self.world:
            raise Error(VPS_ECHECK, "%s: %d ranks; the job has %d" % (self.spec, lay.world, self.world))
        self.lay = lay
        self.reg = Registry("%s-%d" % (self.tag, self.rank), lay, self.rank)
        # vps: Megatron's parameters, main parameters and moments become views of vps's buffers
        self._adopt_groups(lay)
        self.job = _vps_megatron.Job(self.reg, lay, self.rank, model, optimizer)
        if self.rank == 0:
            _say("vps: %s switchable on %d ranks (model: %s), its state in vps's buffers; plans and logs in %s"
                 % (self.spec, self.world, args.vps_model or "made from the job's arguments", base))

    def close(self):
        try:
            self._exited()
        except Error as e:
            # pretrain() ends on an error of its own
            _say("vps: %s" % e)
        if self.ahead is not None:
            self.ahead.stop()
            self.ahead = None
        if self.asks:
            self.asks.close()
        if self.job:
            self.job.close()
        if self.reg:
            self.reg.close()
        self.job = self.reg = None
        if self.dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- a switch ----
    def switch(self, spec, iteration):
        import torch.distributed as dist
        from megatron.training import print_rank_0
        args = self.args
        k = len(self.switches) + 1
        target = _layout(self.model_path, spec, self.gpus_per_node)
        sw = Switch(k, iteration, self.spec, spec, self.lay, target)
        self._tell("before_switch", sw, self.model, self.optimizer)
        t0, began = time.monotonic(), time.time()
        ahead, self.ahead = self.ahead, None
        data, self.data = self.data, None
        if ahead is not None and (ahead.spec, ahead.k) == (spec, k):
            executor, sw.ready = ahead.executor, True
            rc = executor.proc.poll()
            if rc is not None:
                # else the job would wait --vps-timeout for it
                executor.stop()
                self.job.discard()
                raise Error(VPS_EPEER, "switch %d: vps-exec rank %d, started ahead, exited with status %d before "
                            "the switch (%s)" % (k, self.rank, rc, executor.log.name))
        else:
            data = None
            if ahead is not None:
                ahead.stop()
                self.job.discard()
            executor = self._executor(sw)

        def build(lay):
            # vps-exec's tools ran beside it
            made = self._build(lay)
            executor.started()
            self.reg.expect_executor(executor.proc.pid)
            return made
        if sw.ready:
            self.reg.expect_executor(executor.proc.pid)
        training = Training(step=self.job.step, consumed_samples=args.consumed_train_samples,
                            scheduler_step=self.scheduler.num_steps, global_batch=args.global_batch_size,
                            micro_batch=args.micro_batch_size)
        try:
            # what Job.prepare made ahead, or built now when nothing was
            model, optimizer, carried = self.job.switch(target, self.rank, training, build,
                                                        timeout=args.vps_timeout)
        except BaseException as e:
            rc = executor.proc.poll() if executor.proc is not None else None
            executor.stop()
            if isinstance(e, Error) and e.code == VPS_EPEER and rc:
                # it exited on its own (before it opened the registry, say): its log says why
                raise Error(VPS_EPEER, "switch %d: vps-exec rank %d exited with status %d (%s): %s"
                            % (k, self.rank, rc, executor.log.name, e)) from e
            raise
        for field in ("step", "consumed_samples", "scheduler_step"):
            if getattr(carried, field) != getattr(training, field):
                executor.stop()
                raise Error(VPS_ECHECK, "switch %d carried %s %d; the job was at %d"
                            % (k, field, getattr(carried, field), getattr(training, field)))
        clocks = dict(self.job.clocks)
        t = time.monotonic()
        self._enter(target)
        _become(self.optimizer, optimizer)
        # pretrain() holds the list of chunks, refilled, and the scheduler, whose optimizer object became the
        # new one: it gives the new parameter groups the learning rate of its position
        self.model[:] = model
        self.scheduler.step(increment=0)
        clocks["arguments"] = time.monotonic() - t
        t = time.monotonic()
        if data is not None and data.fits(args):
            for flag, ahead_value in zip(("do_train", "do_valid", "do_test"), data.flags):
                setattr(args, flag, getattr(args, flag, False) or ahead_value)
            new, sw.data_sets = data.iterators, dict(data.data_sets)
            clocks["data_ahead"] = data.seconds
        else:
            new, made = self._made_iterators(data.datasets if data is not None else {},
                                             args.virtual_pipeline_model_parallel_size)
            sw.data_sets = dict(made)
        dropped = self._install_iterators(new)
        clocks["iterators"] = time.monotonic() - t
        self.garbage, self.exiting = (sw, dropped), (sw, executor)
        self.spec, self.lay = spec, target
        sw.pause, sw.carried = time.monotonic() - t0, carried
        clocks.update(began=began, ended=time.time())
        sw.clocks, sw.report = clocks, executor.report
        self.switches.append(sw)
        dist.barrier()
        print_rank_0("vps: switch %d after iteration %d: %s -> %s in %.2f s (state moved by vps-exec, model and "
                     "optimizer made by Megatron %s)" % (k, iteration, sw.source, sw.target, sw.pause,
                                                         "before the pause" if sw.ready else "in it"))
        self._tell("after_switch", sw, self.model, self.optimizer)

    def _exited(self):
        """The last switch's vps-exec exited, with status 0. The switch was
        done when Job.switch returned (with --check, the digests matched);
        what vps-exec does after it (letting go of its mappings, writing
        its report) is not the pause's, and the job trains meanwhile: its
        exit is waited for at the next boundary (Switch.clocks["exit"]),
        before another vps-exec is started."""
        if self.exiting is None:
            return
        (sw, executor), self.exiting = self.exiting, None
        t = time.monotonic()
        executor.wait(sw.k, self.args.vps_timeout)
        sw.clocks["exit"] = time.monotonic() - t

    def _ahead(self, iteration):
        """A fixed schedule's next switch made ready while the job trains:
        this rank's part of its plan, staged, and its vps-exec started,
        waiting for the request (it maps the job's buffers meanwhile), and
        its configuration prepared by the Job (Job.prepare: its buffers,
        process groups, model and optimizer, built by _build), so that the
        pause holds the transfer and the hand-over. Every rank calls it at
        the same point (rank 0 picks the executors' port; groups are made
        by all ranks together); a configuration that the switch will refuse
        is left to it."""
        self._exited()
        if self.ahead is not None or not isinstance(self.asks, Schedule):
            return
        nxt = self.asks.upcoming(iteration)
        if nxt is None or nxt[1] >= self.args.train_iters:
            return
        try:
            spec = complete_spec(nxt[0], self.args, self.world)
            target = _layout(self.model_path, spec, self.gpus_per_node)
        except Error:
            return
        k = len(self.switches) + 1
        executor = self._executor(Switch(k, nxt[1], self.spec, spec, self.lay, target))
        try:
            if not self.args.vps_build_in_pause:
                self.job.prepare(target, self.rank, self._build)
                self.data = self._data_ahead(target, iteration, nxt[1])
            executor.started()
        except BaseException:
            executor.stop()
            self.job.discard()
            self.data = None
            raise
        self.ahead = _Ahead(spec, k, executor)

    def _data_ahead(self, target, now, at):
        """The data sets and iterators of the prepared configuration
        `target` for its switch after iteration `at` (pretrain_gpt.py's
        index was the largest part of the pause when made in it; Megatron's
        loaders' agreement on what to train, valid and test, a broadcast over
        the world, the largest once the rest was ahead), made now, at
        iteration `now`, by Megatron with target's process groups and
        arguments at the samples the job will have consumed by then: the
        training's by the global batch (a batch-size ramp's differ), the
        validation's by the evaluations Megatron's train() makes at its
        eval interval. The switch takes the iterators where the job consumed
        what was foreseen (_Data.fits), else makes them again of these
        data sets."""
        from megatron.training import get_args
        args = self.args
        t = time.monotonic()
        data = _Data((args.consumed_train_samples + (at - now) * args.global_batch_size,
                      args.consumed_valid_samples + self._evaluated(now, at)))
        with self.job.prepared_groups(), self._as_built(target, iteration=at, consumed_train_samples=data.consumed[0],
                                                        consumed_valid_samples=data.consumed[1]):
            built = get_args()
            data.iterators, data.data_sets = self._made_iterators(data.datasets,
                                                                  built.virtual_pipeline_model_parallel_size)
            data.flags = tuple(bool(getattr(built, flag, False)) for flag in ("do_train", "do_valid", "do_test"))
        data.seconds = time.monotonic() - t
        return data

    def _evaluated(self, now, at):
        """The validation samples train()'s evaluations after iterations
        now + 1 to at consume (Megatron's train() and evaluate())."""
        args = self.args
        if not (args.eval_interval and getattr(args, "do_valid", False)) or args.full_validation:
            return 0
        start = args.start_eval_at_iter or 0
        evaluations = sum(1 for it in range(now + 1, at + 1) if it % args.eval_interval == 0 and it >= start)
        return evaluations * args.eval_iters * args.eval_global_batch_size

    def _executor(self, sw):
        """This rank's part of the switch's plan, and its vps-exec, started
        by a thread (_Executor) once rank 0 has picked the executors'
        port."""
        import torch.distributed as dist
        args = self.args
        d = self.dir
        where = [None]
        if self.rank == 0:
            host = socket.gethostbyname(os.environ.get("MASTER_ADDR", "127.0.0.1"))
            where[0] = "%s:%d" % (host, free_port(host))
        dist.broadcast_object_list(where, src=0)
        tools, paths = [], []
        for name, spec in (("c%d.layout" % (sw.k - 1), sw.source), ("c%d.layout" % sw.k, sw.target)):
            paths.append(os.path.join(d, name))
            tools.append([_tool("vps-layout"), "-q", "--model", self.model_path, "--parallel", spec,
                          "--gpus-per-node", str(self.gpus_per_node), "-o", paths[-1]])
        plan, staged = (os.path.join(d, "switch%d.%s" % (sw.k, x)) for x in ("plan", "staged"))
        weigh = ["--topology", args.vps_topology] if args.vps_topology else []
        tools.append([_tool("vps-plan"), "-q", "--rank", str(self.rank)] + weigh + [
            paths[0], paths[1], "--global-batch", str(args.global_batch_size), "--micro-batch",
            str(args.micro_batch_size), "-o", plan])
        tools.append([_tool("vps-stage"), "-q", "--budget", args.vps_budget, plan, "-o", staged])
        report = os.path.join(d, "report%d.yaml" % sw.k)
        argv = [_tool("vps-exec"), "--registry", self.reg.name, "--rank", str(self.rank), "--world",
                str(self.world), "--master", where[0], "--transport", args.vps_transport, "--wait", "--check",
                "--timeout", str(int(args.vps_timeout)), "--report", report, staged]
        return _Executor(tools, argv, dict(os.environ, VPS_TOKEN=self.token), os.path.join(d, "exec%d.log" % sw.k),
                         report, self.rank)

    def _build(self, lay):
        """Megatron's model and optimizer for `lay`, made by Megatron's own
        code from the job's arguments updated to it (Job.prepare calls it:
        ahead, while the job trains, or in the pause). When it returns,
        the job's arguments, model config, microbatch calculator and
        Python's and NumPy's random states are the running configuration's
        again; what the build made of them is kept (self.built) for the
        switch to put in place (_enter)."""
        import random
        import numpy as np
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.training import training as T
        cfg = self.p.get("cfg_container")
        seeds = (random.getstate(), np.random.get_state())
        with self._arguments_kept() as args:
            running = dict(vars(args))
            try:
                self._set_parallel(args, lay.parallel)
                self._make_groups(lay)
                self._update_model_config(args)
                # nothing to load: the state is the one the switch moved
                args.load = args.pretrained_checkpoint = args.ckpt_convert_format = None
                args.moe_use_upcycling = False
                model, optimizer, _ = T.setup_model_and_optimizer(
                    self.p["model_type"], model_provider_func=self.p.get("model_provider"),
                    checkpointing_context=self.ckpt_ctx, cfg_container=cfg,
                    pg_collection=ProcessGroupCollection.use_mpu_process_groups())
                self.built = _Built(
                    lay.hash, {key: v for key, v in vars(args).items()
                               if key not in _BUILD_ONLY and (key not in running or v is not running[key])},
                    _configs(cfg), (random.getstate(), np.random.get_state()))
            finally:
                random.setstate(seeds[0])
                np.random.set_state(seeds[1])
        return model, optimizer

    @contextlib.contextmanager
    def _arguments_kept(self):
        """The job's arguments (yielded), model config and microbatch
        calculator as they are now again after the block."""
        from megatron.training import get_args
        args = get_args()
        running = dict(vars(args))
        cfg = self.p.get("cfg_container")
        configs = _configs(cfg)
        try:
            yield args
        finally:
            vars(args).clear()
            vars(args).update(running)
            _set_configs(cfg, configs)
            self._microbatches(args)

    def _apply(self, target):
        """The job's arguments, model config and microbatch calculator made
        those _build made for target."""
        from megatron.training import get_args
        built = self.built
        if built is None or built.layout != target.hash:
            raise Error(VPS_ECHECK, "switch to %s: the job's arguments were built for another configuration"
                        % target.describe())
        args = get_args()
        vars(args).update(built.arguments)
        _set_configs(self.p.get("cfg_container"), built.configs)
        self._microbatches(args)
        return args

    @contextlib.contextmanager
    def _as_built(self, target, **also):
        """A block run with the arguments (and `also` of them) _build made
        for target; the job's own after."""
        with self._arguments_kept():
            vars(self._apply(target)).update(also)
            yield

    def _enter(self, target):
        """The switch to target: the job's arguments, model config,
        microbatch calculator and Python's and NumPy's random states those
        _build made for it (the Job installed its process groups and
        torch's random states)."""
        import random
        import numpy as np
        self._apply(target)
        random.setstate(self.built.seeds[0])
        np.random.set_state(self.built.seeds[1])
        self.built = None

    def _set_parallel(self, args, par):
        if not hasattr(self, "sequence_parallel"):
            self.sequence_parallel = args.sequence_parallel
            self.overlap_p2p = (args.overlap_p2p_comm, args.align_param_gather)
        args.tensor_model_parallel_size = par["tp"]
        args.pipeline_model_parallel_size = args.transformer_pipeline_model_parallel_size = par["pp"]
        args.virtual_pipeline_model_parallel_size = par["vpp"] if par["vpp"] > 1 else None
        args.num_virtual_stages_per_pipeline_rank = args.virtual_pipeline_model_parallel_size
        args.num_layers_per_virtual_pipeline_stage = None
        args.context_parallel_size = par["cp"]
        args.expert_model_parallel_size = par["ep"]
        args.expert_tensor_parallel_size = par["etp"]
        args.data_parallel_size = par["dp"]
        args.decoder_first_pipeline_num_layers = par["first"] or None
        args.decoder_last_pipeline_num_layers = par["last"] or None
        args.sequence_parallel = self.sequence_parallel and par["tp"] > 1
        args.overlap_p2p_comm, args.align_param_gather = self.overlap_p2p if par["vpp"] > 1 else (False, False)
        if args.pad_vocab_size:
            from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
            from megatron.training import get_tokenizer
            args.padded_vocab_size = vocab_size_with_padding(get_tokenizer().vocab_size, args,
                                                             logging_enabled=False)
        self._microbatches(args)

    @staticmethod
    def _microbatches(args):
        """Megatron's microbatch calculator for the arguments' data-parallel size."""
        from megatron.core.num_microbatches_calculator import (reconfigure_num_microbatches_calculator,
                                                               update_num_microbatches)
        reconfigure_num_microbatches_calculator(
            rank=args.rank, global_batch_size=args.global_batch_size, micro_batch_size=args.micro_batch_size,
            data_parallel_size=args.data_parallel_size * args.gtp_weight_remat_size,
            decrease_batch_size_if_needed=args.decrease_batch_size_if_needed,
            step_batch_size_schedule=args.step_batch_size_schedule, seq_length=args.seq_length)
        update_num_microbatches(args.consumed_train_samples, consistency_check=True, verbose=False)

    def _make_groups(self, lay):
        """Megatron's process groups and seeds for the arguments, as
        initialize_megatron makes them (_initialize_distributed,
        _set_random_seed), the groups from vps.megatron's cache:
        _initialize_distributed's call of initialize_model_parallel becomes
        vps.megatron.initialize_groups(lay, with its other arguments), which
        makes a configuration's groups once and installs the same groups
        when it comes back (Job.prepare put the running ones aside)."""
        from megatron.training import initialize as I
        args = self.args
        self._initialize_distributed(lambda kwargs: _vps_megatron.initialize_groups(lay, **kwargs))
        I._set_random_seed(args.seed, args.data_parallel_random_init, args.te_rng_tracker,
                           args.inference_rng_tracker, use_cudagraphable_rng=args.cuda_graph_impl != "none")

    def _initialize_distributed(self, initialize):
        """Megatron's _initialize_distributed, its parallel_state's
        initialize_model_parallel(tp, pp, vpp, **kwargs) calling
        initialize(kwargs, the sizes left out: the arguments' own)."""
        from megatron.training import initialize as I
        mpu = I.mpu

        class Proxy:
            """parallel_state, as _initialize_distributed reads it."""

            def __getattr__(self, name):
                return getattr(mpu, name)

            @staticmethod
            def model_parallel_is_initialized():
                return False

            @staticmethod
            def initialize_model_parallel(tp, pp, vpp=None, **kwargs):
                for size in ("context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size"):
                    kwargs.pop(size, None)
                initialize(kwargs)

        I.mpu = Proxy()
        try:
            I._initialize_distributed(self.p.get("get_embedding_ranks"), self.p.get("get_position_embedding_ranks"),
                                      self.p.get("store"))
        finally:
            I.mpu = mpu

    def _adopt_groups(self, lay):
        """The process groups initialize_megatron made for the job's first
        configuration into vps.megatron's cache, under the arguments the
        builds give initialize_groups: a switch back to it installs them
        (vps.megatron.adopt_groups)."""
        asked = []
        self._initialize_distributed(asked.append)
        if len(asked) == 1:  # none without a device: then no build makes groups either
            _vps_megatron.adopt_groups(lay, **asked[0])

    def _update_model_config(self, args):
        """The model config pretrain() builds from (cfg_container.model),
        made for the new configuration: its TransformerConfig from the
        arguments, as pretrain_gpt.py makes it, of the class the job's was;
        the padded vocabulary; a fresh DDP config (DDP resolves its bucket
        size into it)."""
        cfg = self.p.get("cfg_container")
        if cfg is None:
            return
        from megatron.training.training import get_megatron_ddp_config
        cfg.ddp = get_megatron_ddp_config(args)
        mc = getattr(cfg, "model", None)
        if mc is None:
            return
        if args.yaml_cfg is not None:
            from megatron.training.yaml_arguments import core_transformer_config_from_yaml
            transformer = core_transformer_config_from_yaml(args, "language_model")
        else:
            from megatron.training.arguments import core_transformer_config_from_args
            transformer = core_transformer_config_from_args(args, config_class=type(mc.transformer))
        changes = {"transformer": transformer}
        if not getattr(mc, "should_pad_vocab", True) and args.padded_vocab_size is not None:
            changes["vocab_size"] = args.padded_vocab_size
        cfg.model = dataclasses.replace(mc, **changes)

    def _made_iterators(self, datasets, vpp):
        """Megatron's data iterators (train, valid, test: a list each, an
        item per model chunk) for the configuration the job's arguments and
        process groups are now, at its consumed samples; of the data sets
        in `datasets` ({(vp_stage, numbers of samples): data sets}) where
        Megatron asks for the same numbers, the others made by the provider
        and kept there; and the counts of data sets the builder made and
        took from those made before (_DataSets)."""
        provider = self.p["train_valid_test_dataset_provider"]
        build = self.orig["build_train_valid_test_data_iterators"]
        counts = self.data_sets.next_making()

        def source(vp_stage):
            part = provider if vp_stage is None else functools.partial(provider, vp_stage=vp_stage)

            def made(nums):
                key = (vp_stage, tuple(nums))
                if key not in datasets:
                    datasets[key] = part(nums)
                return datasets[key]
            if getattr(provider, "is_distributed", False):
                made.is_distributed = True
            return made
        if vpp is not None:
            return [list(x) for x in zip(*(build(source(vp_stage)) for vp_stage in range(vpp)))], counts
        return [[x] for x in build(source(None))], counts

    def _install_iterators(self, new):
        """The data iterators `new` into the lists pretrain() holds; the
        configuration before's kept for the collection after the next
        iteration (returned: freeing its loaders and data sets took
        milliseconds of the pause)."""
        args = self.args
        dropped = [list(have) for have in self.iterators]
        for have, got in zip(self.iterators, new[:2]):
            have[:] = got
        # pretrain() evaluates on its test iterator after training
        if self.test_list is not None:
            dropped.append(list(self.test_list))
            self.test_list[:] = new[2]
        elif [x is None for x in self.test_elements] == [y is None for y in new[2]]:
            for have, got in zip(self.test_elements, new[2]):
                if have is not None:
                    dropped.append(have.__dict__)
                    _become(have, got)
        elif args.do_test:
            args.do_test = False
            if self.rank == 0:
                _say("vps: pretrain()'s evaluation on the test set after training is left out: it holds a test "
                     "iterator per model chunk of the first configuration, %d, and this one has %d"
                     % (len(self.test_elements), len(new[2])))
        return dropped


def _say(line):
    # one write: print's two (line, then newline) interleave with other ranks' lines under python -u
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
