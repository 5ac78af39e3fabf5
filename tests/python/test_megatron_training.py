"""vps.megatron_training's parts that need no running job: the configurations
a job is asked for, completed with its own items; the vps model made from
Megatron's arguments, against the model file of the same shape; what asks
for a switch (the control file and its SIGUSR1, the fixed schedule); the
thread that makes a switch's plan and starts its vps-exec; the samples a
job will have consumed when a scheduled switch comes, which its data
iterators are made ahead at; the data sets a switch takes from those made
before; and the jobs it refuses. tests/megatron/check_pretrain.py runs the whole.

    build/venv/bin/python -m unittest discover -s tests/python"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import unittest

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "python"))
os.environ.setdefault("VPS_CONFIG_PATH", os.path.join(TOP, "configs"))

import vps  # noqa: E402
from vps import megatron_training as mt  # noqa: E402

MICRO_GPT = os.path.join(TOP, "tests", "megatron", "models", "micro-gpt.yaml")


def megatron_args(**kw):
    """The arguments Megatron's parser gives micro-gpt's job (the defaults of
    what the functions read), changed by kw."""
    a = dict(hidden_size=64, num_layers=4, num_attention_heads=4, group_query_attention=False,
             num_query_groups=1, kv_channels=16, ffn_hidden_size=256, make_vocab_size_divisible_by=128,
             normalization="LayerNorm", swiglu=False, squared_relu=False, position_embedding_type="learned_absolute",
             max_position_embeddings=64, add_bias_linear=True, add_qkv_bias=True,
             untie_embeddings_and_output_weights=False, qk_layernorm=False, num_experts=None,
             moe_ffn_hidden_size=None, moe_layer_freq=1, moe_shared_expert_intermediate_size=None,
             moe_router_enable_expert_bias=False, multi_latent_attention=False, mtp_num_layers=None,
             tensor_model_parallel_size=2, pipeline_model_parallel_size=1, data_parallel_size=2,
             context_parallel_size=1, expert_model_parallel_size=1, expert_tensor_parallel_size=2,
             virtual_pipeline_model_parallel_size=None, decoder_first_pipeline_num_layers=None,
             decoder_last_pipeline_num_layers=None, moe_grouped_gemm=False, overlap_grad_reduce=False,
             ddp_bucket_size=None, use_distributed_optimizer=True, bf16=True, cuda_graph_impl="none",
             perform_rl_step=False, use_tp_pp_dp_mapping=False, multiple_validation_sets=False, async_save=False,
             use_persistent_ckpt_worker=False, ddp_num_buckets=None, dataloader_type="single")
    a.update(kw)
    return argparse.Namespace(**a)


class Configurations(unittest.TestCase):
    def test_completed_with_the_jobs_items(self):
        args = megatron_args()
        self.assertEqual(mt.complete_spec("pp=2", args, 4), "pp=2,dp=2,zero=1,bucket=0")
        self.assertEqual(mt.complete_spec("tp=2:pp=2", args, 4), "tp=2,pp=2,dp=1,zero=1,bucket=0")
        self.assertEqual(mt.complete_spec(" ep=4 ", args, 4), "ep=4,dp=4,zero=1,bucket=0")
        over = megatron_args(overlap_grad_reduce=True)
        self.assertEqual(mt.complete_spec("tp=4", over, 8), "tp=4,dp=2,zero=1,bucket=auto")
        sized = megatron_args(overlap_grad_reduce=True, ddp_bucket_size=100000)
        self.assertEqual(mt.complete_spec("tp=4", sized, 8), "tp=4,dp=2,zero=1,bucket=100000")

    def test_refused(self):
        args = megatron_args()
        for spec, why in (("tp=3", "tp x pp x cp = 3 does not divide the job's 4 ranks"),
                          ("tp=2,dp=4", "8 ranks; the job has 4"),
                          ("zero=0", "zero=0: a configuration names"),
                          ("bucket=0", "bucket=0: a configuration names"),
                          ("tp=x", "tp=x: not a number"),
                          ("tp=0", "tp=0: out of range"),
                          ("tp", "tp: a configuration names")):
            with self.assertRaises(vps.Error) as e:
                mt.complete_spec(spec, args, 4)
            self.assertEqual(e.exception.code, 1, spec)
            self.assertIn(why, str(e.exception), spec)

    def test_the_jobs_own(self):
        self.assertEqual(mt.spec_of_args(megatron_args()), "tp=2,pp=1,dp=2,cp=1,ep=1,etp=2,vpp=1,zero=1,bucket=0")
        pp = megatron_args(tensor_model_parallel_size=1, expert_tensor_parallel_size=1, pipeline_model_parallel_size=2,
                           virtual_pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=1,
                           decoder_last_pipeline_num_layers=3)
        self.assertEqual(mt.spec_of_args(pp), "tp=1,pp=2,dp=2,cp=1,ep=1,etp=1,vpp=2,first=1,last=3,zero=1,bucket=0")


class Model(unittest.TestCase):
    def layout_of(self, text, spec):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
        try:
            return vps.layout(f.name, spec, 4)
        finally:
            os.unlink(f.name)

    def test_micro_gpt_from_its_arguments(self):
        # the job's arguments make micro-gpt: every rank holds the same tensors at the same offsets
        text = mt.model_from_args(megatron_args(), 256)
        for spec in ("tp=2,dp=2,zero=1", "pp=2,dp=2,zero=1"):
            ours, theirs = self.layout_of(text, spec), vps.layout(MICRO_GPT, spec, 4)
            for r in range(4):
                a, b = ours.rank(r), theirs.rank(r)
                self.assertEqual([(p.name, p.offset, p.elements) for p in a.params],
                                 [(p.name, p.offset, p.elements) for p in b.params], (spec, r))
                self.assertEqual([x.elements for x in a.buffers], [x.elements for x in b.buffers], (spec, r))

    def test_moe(self):
        args = megatron_args(num_experts=4, moe_ffn_hidden_size=128, swiglu=True, normalization="RMSNorm",
                             position_embedding_type="rope", add_bias_linear=False, add_qkv_bias=False,
                             group_query_attention=True, num_query_groups=2, moe_layer_freq=[0, 1, 1, 1])
        text = mt.model_from_args(args, 256)
        for line in ("experts: 4", "moe_ffn: 128", "first_dense: 1", "ffn: 256", "query_groups: 2",
                     "activation: swiglu", "position: rope", "norm: rmsnorm"):
            self.assertIn(line + "\n", text)
        self.assertEqual(self.layout_of(text, "ep=4,dp=4").world, 4)
        self.assertNotIn("router_bias", text)
        # DeepSeek-V3's aux-loss-free balancing: the routers' expert bias, a buffer the switch moves
        biased = mt.model_from_args(megatron_args(num_experts=4, moe_router_enable_expert_bias=True), 256)
        self.assertIn("router_bias: true\n", biased)
        lay = self.layout_of(biased, "ep=4,dp=4")
        self.assertTrue(any("expert_bias" in p.name for p in lay.rank(0).params))

    def test_refused(self):
        for kw, why in ((dict(multi_latent_attention=True), "multi-latent attention"),
                        (dict(mtp_num_layers=1), "multi-token prediction"),
                        (dict(squared_relu=True), "an activation other than GeLU and SwiGLU"),
                        (dict(position_embedding_type="none"), "--position-embedding-type none"),
                        (dict(num_experts=4, moe_layer_freq=[1, 0, 1, 1]), "dense layers first")):
            with self.assertRaises(vps.Error) as e:
                mt.model_from_args(megatron_args(**kw), 256)
            self.assertEqual(e.exception.code, 10, kw)
            self.assertIn(why, str(e.exception), kw)
            self.assertIn("give --vps-model", str(e.exception), kw)


class Asking(unittest.TestCase):
    def test_control_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "control")
            c = mt.ControlFile(path)
            try:
                self.assertEqual(c.asked(1), [])  # no file yet
                with open(path, "w") as f:
                    f.write("tp=2:pp=2  # the scheduler's\n\n# a comment\nep=4\npp=")
                self.assertEqual(c.asked(2), ["tp=2:pp=2", "ep=4"])  # whole lines only
                self.assertEqual(c.asked(3), [])
                with open(path, "a") as f:
                    f.write("2\n")
                self.assertEqual(c.asked(4), ["pp=2"])
                # SIGUSR1 has the file read at once, though it did not grow
                os.kill(os.getpid(), signal.SIGUSR1)
                self.assertTrue(c.woken)
                self.assertEqual(c.asked(5), [])
                self.assertFalse(c.woken)
            finally:
                c.close()
            self.assertEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL)

    def test_arguments(self):
        def vps_args(**kw):
            a = dict(vps_control=None, vps_switch_to=None, vps_switch_every=0, vps_build_in_pause=False)
            a.update(kw)
            return argparse.Namespace(**a)
        mt.check_arguments(vps_args())
        mt.check_arguments(vps_args(vps_control="c"))
        mt.check_arguments(vps_args(vps_switch_to="pp=2", vps_switch_every=3))
        mt.check_arguments(vps_args(vps_switch_to="pp=2", vps_switch_every=3, vps_build_in_pause=True))
        for kw, why in ((dict(vps_control="c", vps_switch_to="pp=2", vps_switch_every=3), "not both"),
                        (dict(vps_control="c", vps_build_in_pause=True), "an asked switch is built in the pause"),
                        (dict(vps_switch_to="pp=2"), "needs --vps-switch-every"),
                        (dict(vps_switch_every=3), "without --vps-switch-to")):
            with self.assertRaises(vps.Error) as e:
                mt.check_arguments(vps_args(**kw))
            self.assertEqual(e.exception.code, 1, kw)
            self.assertIn(why, str(e.exception), kw)
        mt.check_arguments(vps_args(vps_switch_to="pp=2", vps_switch_every=3, vps_topology="a800-testbed"))
        with self.assertRaises(vps.NotFound) as e:
            mt.check_arguments(vps_args(vps_switch_to="pp=2", vps_switch_every=3, vps_topology="no-such-cluster"))
        self.assertIn("--vps-topology: topology: no topology named 'no-such-cluster'", str(e.exception))

    def test_schedule(self):
        s = mt.Schedule(["pp=2", "tp=2"], 3)
        self.assertEqual([(i, s.asked(i)) for i in range(1, 11) if s.asked(i)], [(3, ["pp=2"]), (6, ["tp=2"])])
        # what the job makes ready ahead: from the start, and after each switch, the next one
        self.assertEqual([s.upcoming(i) for i in (0, 2, 3, 5, 6, 9)],
                         [("pp=2", 3), ("pp=2", 3), ("tp=2", 6), ("tp=2", 6), None, None])


class Executors(unittest.TestCase):
    """A switch's tools and vps-exec, started by a thread beside the job's
    build (here: commands that stand in for them)."""

    def executor(self, tools, argv):
        d = tempfile.mkdtemp(prefix="vps-test-exec-")
        self.addCleanup(shutil.rmtree, d, True)
        return mt._Executor(tools, argv, dict(os.environ), os.path.join(d, "exec1.log"), os.path.join(d, "r"), 3)

    def test_a_tool_that_fails_is_raised_and_nothing_started(self):
        ex = self.executor([[sys.executable, "-c", "pass"], [sys.executable, "-c", "import sys; "
                                                              "sys.exit('vps-plan: a.layout: bad')"]], ["true"])
        with self.assertRaises(vps.Error) as e:
            ex.started()
        self.assertEqual(e.exception.code, 1)
        self.assertIn("vps-plan: a.layout: bad", str(e.exception))
        self.assertIsNone(ex.proc)
        ex.stop()

    def test_its_exit_status(self):
        ex = self.executor([], [sys.executable, "-c", "import sys; print('said'); sys.exit(3)"])
        ex.started()
        with self.assertRaises(vps.Error) as e:
            ex.wait(2, 30)
        self.assertEqual(e.exception.code, 9)
        self.assertIn("switch 2: vps-exec rank 3 exited with status 3", str(e.exception))
        with open(ex.log.name) as f:
            self.assertEqual(f.read(), "said\n")
        ok = self.executor([], ["true"])
        ok.wait(1, 30)

    def test_stopped_for_a_switch_that_does_not_come(self):
        ex = self.executor([], [sys.executable, "-c", "import time; time.sleep(60)"])
        ex.started()
        ex.stop()
        self.assertIsNotNone(ex.proc.poll())
        self.assertTrue(ex.log.closed)


class DataAhead(unittest.TestCase):
    """The data iterators made ahead of a scheduled switch are taken only
    where the job consumed the samples foreseen."""

    def switching(self, **kw):
        job = mt._Switching.__new__(mt._Switching)
        job.args = argparse.Namespace(**dict(dict(eval_interval=4, do_valid=True, full_validation=False,
                                                  start_eval_at_iter=None, eval_iters=2, eval_global_batch_size=8),
                                             **kw))
        return job

    def test_the_evaluations_train_makes_before_the_switch(self):
        job = self.switching()
        # after iterations 4 and 8 of 1 to 9; none of 1 to 3; the switch's own iteration's too
        self.assertEqual(job._evaluated(0, 9), 2 * 2 * 8)
        self.assertEqual(job._evaluated(0, 3), 0)
        self.assertEqual(job._evaluated(3, 4), 2 * 8)
        self.assertEqual(job._evaluated(4, 6), 0)
        self.assertEqual(self.switching(start_eval_at_iter=6)._evaluated(0, 9), 2 * 8)
        self.assertEqual(self.switching(do_valid=False)._evaluated(0, 9), 0)
        self.assertEqual(self.switching(eval_interval=None)._evaluated(0, 9), 0)

    def test_taken_only_where_the_job_consumed_what_was_foreseen(self):
        data = mt._Data((96, 16))
        args = argparse.Namespace(consumed_train_samples=96, consumed_valid_samples=16)
        self.assertFalse(data.fits(args))  # nothing made
        data.iterators = [[1], [2], [3]]
        self.assertTrue(data.fits(args))
        for changed in ({"consumed_train_samples": 88}, {"consumed_valid_samples": 24}):
            self.assertFalse(data.fits(argparse.Namespace(**dict(vars(args), **changed))), changed)


class DataSets(unittest.TestCase):
    """The data sets Megatron's builder made are handed back where it asks
    for the same again (a switch makes the iterators again), and let go two
    makings after their last use."""

    def setUp(self):
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
        self.Builder, self.cls = BlendedMegatronDatasetBuilder, MockGPTDataset
        tokenizer = NullTokenizer(100)

        def config(seed=1, sequence_length=16):
            return GPTDatasetConfig(random_seed=seed, sequence_length=sequence_length, split="90,5,5",
                                    tokenizer=tokenizer,
                                    reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        self.config = config
        self.memo = mt._DataSets()
        generic = BlendedMegatronDatasetBuilder.__dict__["build_generic_dataset"]
        BlendedMegatronDatasetBuilder.build_generic_dataset = self.memo.patched(generic.__func__)
        self.addCleanup(setattr, BlendedMegatronDatasetBuilder, "build_generic_dataset", generic)

    def build(self, sizes=(32, 8, 8), **kw):
        return self.Builder(self.cls, list(sizes), lambda: True, self.config(**kw)).build()

    def test_the_same_asked_again_is_the_same(self):
        first = self.build()
        self.assertEqual(dict(self.memo.counts), {"made": 3})
        counts = self.memo.next_making()
        again = self.build()
        self.assertEqual(dict(counts), {"reused": 3})
        self.assertTrue(all(x is y for x, y in zip(first, again)))
        self.assertEqual(again[0][5]["tokens"].tolist(), first[0][5]["tokens"].tolist())

    def test_other_samples_seeds_or_sequences_are_made(self):
        first = self.build()
        for kw in ({"sizes": (40, 8, 8)}, {"seed": 2}, {"sequence_length": 32}):
            counts = self.memo.next_making()
            other = self.build(**kw)
            self.assertEqual(counts["made"], 3 if "sizes" not in kw else 1, kw)
            self.assertIsNot(other[0], first[0], kw)

    def test_let_go_two_makings_after_their_last_use(self):
        first = self.build()
        self.memo.next_making()
        self.build(seed=2)
        self.memo.next_making()
        self.assertIs(self.build()[0], first[0])  # a switch back: A, B, A
        for _ in range(3):
            self.memo.next_making()
        self.assertEqual(self.memo.entries, [])
        self.assertIsNot(self.build()[0], first[0])


class Refusals(unittest.TestCase):
    def test_jobs_it_cannot_switch(self):
        for kw, why in ((dict(use_distributed_optimizer=False), "--use-distributed-optimizer"),
                        (dict(bf16=False), "--bf16"),
                        (dict(cuda_graph_impl="local"), "CUDA graphs"),
                        (dict(perform_rl_step=True), "RL training"),
                        (dict(use_tp_pp_dp_mapping=True), "--use-tp-pp-dp-mapping"),
                        (dict(multiple_validation_sets=True), "--multiple-validation-sets"),
                        (dict(async_save=True, use_persistent_ckpt_worker=True), "persistent worker"),
                        (dict(ddp_num_buckets=4), "--ddp-num-buckets"),
                        (dict(dataloader_type="external"), "--dataloader-type external")):
            with self.assertRaises(vps.Error) as e:
                mt._Switching._refuse_unsupported(megatron_args(**kw))
            self.assertEqual(e.exception.code, 10, kw)
            self.assertIn(why, str(e.exception), kw)
        mt._Switching._refuse_unsupported(megatron_args())


if __name__ == "__main__":
    unittest.main()
