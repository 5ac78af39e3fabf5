"""The Python module against the library it wraps: layouts and rank views
as the tools print them, errors with the C message and code, the registry
and a rank's state, correspondences and assembly of whole tensors, and a
failed switch that leaves the sources as they were.

    build/venv/bin/python -m unittest discover -s tests/python"""
import ctypes as C
import gc
import os
import pickle
import shutil
import socket
import tempfile
import time
import subprocess
import sys
import unittest
import weakref

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "python"))
os.environ.setdefault("VPS_CONFIG_PATH", os.path.join(TOP, "configs"))
BIN = os.environ.get("VPS_BIN", os.path.join(TOP, "bin"))

import torch  # noqa: E402

import vps  # noqa: E402
from vps import _lib  # noqa: E402


def tool_layout(model, spec, rank, gpn=8):
    """vps-layout's YAML for one rank, as a dict (the YAML is simple enough for json after a load)."""
    import yaml  # PyYAML: the test environment has it (make venv); skip if absent
    out = subprocess.run([os.path.join(BIN, "vps-layout"), "--model", model, "--parallel", spec, "--gpus-per-node",
                          str(gpn), "--rank", str(rank), "--yaml"], check=True, capture_output=True, text=True).stdout
    return yaml.safe_load(out)


class Names(unittest.TestCase):
    def setUp(self):
        self.reg = self.ex = self.tmp = None

    def tearDown(self):
        if self.reg:
            self.reg.close()
        if self.ex:
            self.ex.kill()
            self.ex.wait()
        if self.tmp:
            shutil.rmtree(self.tmp)

    def test_abi_sizes_match(self):
        for name, mirror in _lib._MIRRORS.items():
            self.assertEqual(_lib.lib.vps_abi_size(name.encode()), C.sizeof(mirror), name)
        self.assertEqual(_lib.lib.vps_abi_size(b"no_such_struct"), 0)

    def test_layout_matches_the_tool(self):
        lay = vps.layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1")
        v = lay.rank(5)
        try:
            doc = tool_layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1", 5)
        except ImportError:
            self.skipTest("PyYAML absent (make venv)")
        self.assertEqual(int(str(doc["hash"]), 0), lay.hash)
        r = doc["ranks"][0]
        self.assertEqual([b["elements"] for b in r["buffers"]], [b.elements for b in v.buffers])
        self.assertEqual([vps.STATES[b.state] for b in v.buffers], [b["state"] for b in r["buffers"]])
        self.assertEqual(len(r["regions"]), len(v.regions))
        for mine, theirs in zip(v.regions, r["regions"]):
            self.assertEqual(mine.offset, theirs["offset"])
            self.assertEqual(list(zip(mine.lo, mine.hi)), [tuple(x) for x in theirs["box"]])
            self.assertEqual(v.params[mine.param].local_name, theirs["param"])
        self.assertEqual(tuple(v.coords[:3]), (r["coords"]["tp"], r["coords"]["dp"], r["coords"]["pp"]))

    def test_param_shapes_are_megatrons(self):
        lay = vps.layout("tiny-llama", "tp=2,pp=2,dp=1")
        first, last = lay.rank(0), lay.rank(3)
        # vocabulary padded to a multiple of 128 x tp, then cut
        self.assertEqual(first.param("embedding.word_embeddings.weight").shape, (512, 256))
        self.assertEqual(first.param("decoder.layers.0.self_attention.linear_qkv.weight").shape, (256, 256))
        self.assertEqual(first.param("decoder.layers.0.self_attention.linear_proj.weight").shape, (256, 128))
        self.assertEqual(first.param("decoder.layers.0.mlp.linear_fc1.weight").shape, (688, 256))
        self.assertEqual(first.param("decoder.layers.0.mlp.linear_fc2.weight").shape, (256, 344))
        p = last.param("decoder.layers.7.mlp.linear_fc1.layer_norm_weight")
        self.assertEqual((p.shape, p.local_name), ((256,), "decoder.layers.3.mlp.linear_fc1.layer_norm_weight"))
        self.assertEqual(last.param("output_layer.weight").shape, (512, 256))

    def test_grouped_gemm_experts_are_named_as_te_names_them(self):
        seq = vps.layout("tiny-qwen3-moe", "tp=2,dp=2,ep=2,etp=1,zero=1").rank(1)
        grp = vps.layout("tiny-qwen3-moe", "tp=2,dp=2,ep=2,etp=1,zero=1,grouped_gemm=1").rank(1)
        self.assertTrue(grp.layout.parallel["grouped_gemm"])
        self.assertFalse(seq.layout.parallel["grouped_gemm"])
        # rank 1 is EP rank 1: global expert 6 is its local expert 2
        name = "decoder.layers.3.mlp.experts.local_experts.6.linear_fc2.weight"
        self.assertEqual(seq.param(name).local_name, "decoder.layers.3.mlp.experts.local_experts.2.linear_fc2.weight")
        self.assertEqual(grp.param(name).local_name, "decoder.layers.3.mlp.experts.linear_fc2.weight2")
        self.assertEqual(grp.param(name).shape, seq.param(name).shape)
        self.assertNotEqual(grp.param(name).offset, seq.param(name).offset)

    def test_mla_and_shared_expert_shapes_are_megatrons(self):
        # tiny-deepseek at tp 2: the up projections keep 2 of 4 heads' rows
        # (q: 24 rows a head, kv: 16 + 16), the down projections are whole
        lay = vps.layout("tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1")
        first, last = lay.rank(0), lay.rank(7)
        att = "decoder.layers.0.self_attention."
        self.assertEqual(first.param("decoder.layers.0.input_layernorm.weight").shape, (64,))
        self.assertEqual(first.param(att + "linear_q_down_proj.weight").shape, (48, 64))
        self.assertEqual(first.param(att + "linear_q_up_proj.layer_norm_weight").shape, (48,))
        self.assertEqual(first.param(att + "linear_q_up_proj.weight").shape, (48, 48))
        self.assertEqual(first.param(att + "linear_kv_down_proj.weight").shape, (40, 64))
        self.assertEqual(first.param(att + "linear_kv_up_proj.weight").shape, (64, 32))
        self.assertEqual(first.param(att + "linear_proj.weight").shape, (64, 32))
        # shared experts: a dense MLP of 64 cut by tp, the gated fc1 [gate; up]
        p = last.param("decoder.layers.3.mlp.shared_experts.linear_fc1.weight")
        self.assertEqual((p.shape, p.expert, p.local_name),
                         ((64, 64), False, "decoder.layers.1.mlp.shared_experts.linear_fc1.weight"))
        self.assertEqual(last.param("decoder.layers.3.mlp.shared_experts.linear_fc2.weight").shape, (64, 32))
        # the MTP layer on the last stage, after an embedding copy of its own
        self.assertEqual(last.param("mtp.layers.0.eh_proj.weight").shape, (32, 128))
        emb = last.param("embedding.word_embeddings.weight")
        self.assertEqual((emb.index, emb.output_copy, emb.shape), (0, True, (256, 64)))
        self.assertEqual([p.name for p in last.params if not p.expert and not p.module_buffer][-1],
                         "output_layer.weight")
        gg = vps.layout("tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,grouped_gemm=1").rank(7)
        self.assertEqual(gg.param("mtp.layers.0.mtp_model_layer.mlp.experts.local_experts.5.linear_fc1.weight")
                         .local_name, "mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight1")

    def test_router_bias_is_a_module_buffer(self):
        # TopKRouter's expert_bias: fp32 [experts], whole on every rank of its
        # stage, in the chunk's module_buffer buffer (no optimizer state)
        lay = vps.layout("tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1")
        v = lay.rank(7)
        p = v.param("decoder.layers.3.mlp.router.expert_bias")
        self.assertEqual((p.module_buffer, p.shape, p.local_name, p.offset),
                         (True, (8,), "decoder.layers.1.mlp.router.expert_bias", 8))
        b = v.buffers[v.buffer(vps.MODULE_BUFFER, 0)]
        self.assertEqual((b.dtype, b.sharded, b.elements), (vps.FP32, False, 24))  # layers 2, 3 and MTP's
        self.assertIsNone(lay.rank(0).buffer(vps.MODULE_BUFFER, 0))  # stage 0's layers are dense
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 7)
        s = vps.State.allocate(self.reg, lay, 7)
        bias = s.param(p)
        self.assertEqual((bias.dtype, tuple(bias.shape)), (torch.float32, (8,)))
        bias[2] = 0.25
        self.assertEqual(s.buffer(vps.MODULE_BUFFER)[8 + 2].item(), 0.25)
        with self.assertRaises(vps.Error) as e:
            s.param(p, "exp_avg")
        self.assertIn("no whole exp_avg buffer", str(e.exception))

    def test_errors_carry_the_message_and_code(self):
        with self.assertRaises(vps.Error) as e:
            vps.layout("tiny-llama", "tp=3")
        self.assertEqual((e.exception.code, e.exception.name), (1, "VPS_EINPUT"))
        self.assertIn("tp=3 does not divide heads=8", str(e.exception))
        with self.assertRaises(vps.Error) as e:
            vps.Model("no-such-model")
        # the argument's name, not the command line's flag
        self.assertTrue(str(e.exception).startswith("model: no model named 'no-such-model'; known: "), str(e.exception))
        self.assertEqual(e.exception.name, "VPS_ENOTFOUND")
        with self.assertRaises(vps.Error) as e:
            vps.layout("tiny-llama", "tp=2,pp=x")
        self.assertEqual(str(e.exception), "parallel: pp=x: expected an integer in [1, 1048576]")
        with self.assertRaises(vps.Error) as e:
            vps.layout("tiny-llama", "no-such-configuration")
        self.assertTrue(str(e.exception).startswith("parallel: 'no-such-configuration' is neither"), str(e.exception))
        with self.assertRaises(vps.Error):
            vps.layout("tiny-llama", "tp=2").rank(2)
        with self.assertRaises(vps.Error) as e:
            vps.layout("tiny-llama", "pp=2").rank(0).param("output_layer.weight")
        self.assertIn("rank 0 holds no parameter output_layer.weight under tp=1,pp=2", str(e.exception))

    def test_a_live_registry_is_not_taken(self):
        lay = vps.layout("micro-llama", "tp=1")
        name = "vps-pytest-%d" % os.getpid()
        self.reg = vps.Registry(name, lay, 0)
        with self.assertRaises(vps.Error) as e:
            vps.Registry(name, lay, 0)
        self.assertIn(name, str(e.exception))

    def test_a_switch_whose_executor_exited_before_opening_the_registry_fails(self):
        lay = vps.layout("micro-llama", "tp=1")
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0)
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        proc.wait()
        self.reg.expect_executor(proc.pid)
        seq = self.reg.request()
        with self.assertRaises(vps.PeerFailed) as e:
            self.reg.wait(seq, 10)
        self.assertIn("the executor started for it (pid %d) exited" % proc.pid, str(e.exception))

    def test_state_views_share_the_registered_memory(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4)
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 1)
        s = vps.State.allocate(self.reg, lay, 1)
        entries = self.reg.entries()
        self.assertEqual([e.elements for e in entries], [b.elements for b in s.view.buffers])
        w = s.param("decoder.layers.0.mlp.linear_fc1.weight")
        self.assertEqual(tuple(w.shape), (176, 64))  # SwiGLU: 2 x ffn / tp rows
        w[3, 5] = 1.5
        # the same bytes through the registry's own object
        p = s.view.param("decoder.layers.0.mlp.linear_fc1.weight")
        with open("/dev/shm/" + entries[0].shm_name.decode(), "rb") as f:
            f.seek((p.offset + 3 * 64 + 5) * 2)
            raw = f.read(2)
        self.assertEqual(torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).item(), 1.5)
        self.assertTrue(torch.equal(s.param(p.name, "param"), w))
        with self.assertRaises(vps.Error) as e:
            s.param("decoder.layers.0.mlp.linear_fc1.weight", "main_param")  # a ZeRO shard, not whole
        self.assertIn("no whole main_param buffer", str(e.exception))
        with self.assertRaises(vps.Error):
            s.param(p.name, "momentum")

    def test_adopt_checks_what_it_is_given(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4)
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0)
        v = lay.rank(0)
        host = {b.id: torch.zeros(b.elements, dtype=vps.TORCH_DTYPE[b.dtype]) for b in v.buffers}
        with self.assertRaises(vps.Error) as e:
            vps.State.adopt(self.reg, lay, 0, host)
        self.assertIn("a cpu tensor; host buffers come from State.allocate", str(e.exception))
        with self.assertRaises(vps.Error) as e:
            vps.State.adopt(self.reg, lay, 0, {("exp_avg", 1, False): host[0]})
        self.assertIn("no exp_avg buffer of chunk 1", str(e.exception))
        with self.assertRaises(vps.Error) as e:
            vps.State.adopt(self.reg, lay, 0, {0: host[0]})
        self.assertIn("buffer 1 (main_param, chunk 0): no tensor given", str(e.exception))
        self.assertEqual(self.reg.entries(), [])

    def test_load_pieces_assemble_round_trip_across_layouts(self):
        model = vps.Model("micro-llama")
        g = torch.Generator().manual_seed(7)
        truth = {}

        def full(tid, st):
            if (tid, st) not in truth:
                truth[(tid, st)] = torch.randn(model.tensor_shape(tid), generator=g)
                if st == vps.PARAM:
                    truth[(tid, st)] = truth[(tid, st)].to(torch.bfloat16).float()
            return truth[(tid, st)]

        for spec in ("tp=2,dp=2,zero=1", "pp=2,tp=2", "tp=4"):
            lay = vps.layout(model, spec, gpus_per_node=4)
            pieces = []
            for r in range(lay.world):
                s = vps.State(lay, r)
                s.buffers = [torch.zeros(b.elements, dtype=vps.TORCH_DTYPE[b.dtype]) for b in s.view.buffers]
                s.load(full)
                pieces += list(s.pieces())
            got = vps.assemble(model, pieces, dtype=torch.float32)
            self.assertEqual(got.keys(), truth.keys(), spec)
            for k, v in truth.items():
                self.assertTrue(torch.equal(got[k], v), (spec, k))
        # a replica that disagrees is found
        lay = vps.layout(model, "dp=2", gpus_per_node=4)
        pieces = []
        for r in range(2):
            s = vps.State(lay, r)
            s.buffers = [torch.zeros(b.elements, dtype=vps.TORCH_DTYPE[b.dtype]) for b in s.view.buffers]
            s.load(full)
            if r == 1:
                s.buffers[0][100] += 1
            pieces += list(s.pieces())
        with self.assertRaises(vps.Error) as e:
            vps.assemble(model, pieces)
        self.assertIn("replicas differ", str(e.exception))

    def test_correspondence_of_a_shard(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4)
        v = lay.rank(2)
        main, param = v.buffer(vps.MAIN_PARAM), v.buffer(vps.PARAM)
        m_pos, p_pos = vps.correspondence(v, main, v, param)
        # every element of the shard that a region covers, once, at the logical element's place
        covered = sum(vps.region_index(r).numel() for r in v.regions_of(vps.MAIN_PARAM))
        self.assertEqual(m_pos.numel(), covered)
        self.assertEqual(m_pos.unique().numel(), covered)
        s = vps.State(lay, 2)
        s.buffers = [torch.arange(b.elements, dtype=torch.float32) for b in s.view.buffers]
        for r in v.regions_of(vps.MAIN_PARAM):
            rp = next(x for x in v.regions_of(vps.PARAM) if x.tensor == r.tensor)
            lo = torch.tensor(r.lo) - torch.tensor(rp.lo)
            first = rp.offset + int((lo * torch.tensor(rp.strides)).sum())
            self.assertIn(first, p_pos[m_pos == r.offset].tolist())

    def world_of_one(self, a_spec, b_spec):
        """Layouts, a staged plan a -> b for one rank, and a vps-exec serving it."""
        d = self.tmp = tempfile.mkdtemp()
        for n, spec in (("a", a_spec), ("b", b_spec)):
            subprocess.run([os.path.join(BIN, "vps-layout"), "--model", "micro-llama", "--parallel", spec,
                            "-o", os.path.join(d, n + ".layout")], check=True)
        subprocess.run([os.path.join(BIN, "vps-plan"), os.path.join(d, "a.layout"), os.path.join(d, "b.layout"),
                        "--global-batch", "8", "-o", os.path.join(d, "ab.plan")], check=True)
        subprocess.run([os.path.join(BIN, "vps-stage"), "--budget", "1MiB", os.path.join(d, "ab.plan"),
                        "-o", os.path.join(d, "ab.staged")], check=True)
        port = vps.free_port()
        name = "vps-pytest-%d" % os.getpid()
        with open(os.path.join(d, "exec.log"), "w") as log:
            self.ex = subprocess.Popen([os.path.join(BIN, "vps-exec"), "--registry", name, "--rank", "0", "--world", "1",
                                       "--master", "127.0.0.1:%d" % port, "--wait", "--check", "--timeout", "30",
                                       os.path.join(d, "ab.staged")], stdout=log, stderr=subprocess.STDOUT,
                                      env=dict(os.environ, VPS_TOKEN="0123456789abcdef0123456789abcdef"))
        return name, self.ex

    def exec_log(self):
        with open(os.path.join(self.tmp, "exec.log")) as f:
            return f.read()

    def test_a_free_port_lies_below_the_ephemeral_range(self):
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", vps.free_port()))
        taken.listen()
        ports = {vps.free_port() for _ in range(50)}
        self.assertTrue(all(10000 <= p < low for p in ports), ports)
        self.assertNotIn(taken.getsockname()[1], ports)
        # nobody listens on it: a rank's executor can
        with socket.socket() as s:
            s.bind(("127.0.0.1", ports.pop()))

    def test_a_switch_moves_the_state_bit_for_bit(self):
        name, ex = self.world_of_one("tp=1", "tp=1,zero=1")
        a, b = vps.Layout.load(os.path.join(self.tmp, "a.layout")), vps.Layout.load(os.path.join(self.tmp, "b.layout"))
        self.reg = vps.Registry(name, a, 0)
        s = vps.State.allocate(self.reg, a, 0)
        g = torch.Generator().manual_seed(3)
        for t in s.buffers:
            t.copy_(torch.randn(t.numel(), generator=g).to(t.dtype))
        before = vps.assemble(a.model, list(s.pieces()))
        # Python's garbage collector held off while the job stands still, and on again after
        collecting, wait = [], self.reg.wait
        self.reg.wait = lambda seq, timeout: (collecting.append(gc.isenabled()), wait(seq, timeout))[1]
        self.assertTrue(gc.isenabled())
        # meanwhile: once, with the request made and before the wait
        seen = []
        meanwhile = lambda: seen.append((self.reg.state()[0], len(collecting)))  # noqa: E731
        new, carried = vps.switch(self.reg, s, b, 0, training=vps.Training(step=7, consumed_samples=56, global_batch=8),
                                  timeout=60, meanwhile=meanwhile)
        self.assertEqual(len(seen), 1)
        self.assertIn(seen[0][0], (vps.registry.REQUESTED, vps.registry.RUNNING, vps.registry.DONE))
        self.assertEqual(seen[0][1], 0)
        self.assertEqual((collecting, gc.isenabled()), ([False], True))
        self.assertEqual(ex.wait(60), 0, self.exec_log())
        self.assertIn("digest: match", self.exec_log())
        after = vps.assemble(b.model, list(new.pieces()))
        self.assertEqual(before.keys(), after.keys())
        for k in before:
            self.assertTrue(torch.equal(before[k], after[k]), k)
        self.assertEqual((carried.step, carried.consumed_samples), (7, 56))
        self.assertEqual((self.reg.layout_hash, self.reg.rank), (b.hash, 0))
        self.assertEqual(len(self.reg.entries()), len(new.view.buffers))

    def test_a_failed_switch_leaves_the_sources(self):
        name, ex = self.world_of_one("tp=1", "tp=1,zero=1")
        a = vps.Layout.load(os.path.join(self.tmp, "a.layout"))
        wrong = vps.layout("micro-llama", "dp=1,zero=0,bucket=1000")  # not the plan's target
        self.reg = vps.Registry(name, a, 0)
        s = vps.State.allocate(self.reg, a, 0)
        s.buffers[0].fill_(0.25)
        n = len(self.reg.entries())
        with self.assertRaises(vps.PeerFailed) as e:
            vps.switch(self.reg, s, wrong, 0, training=vps.Training(step=3, global_batch=8), timeout=60)
        self.assertEqual(e.exception.name, "VPS_EPEER")
        self.assertIn("the plan's target is", str(e.exception))
        self.assertTrue(gc.isenabled())
        ex.wait(60)
        # the registry runs the old layout again, the sources registered and intact
        self.assertEqual(self.reg.layout_hash, a.hash)
        self.assertEqual(len(self.reg.entries()), n)
        self.assertTrue(bool((s.buffers[0] == 0.25).all()))

    def test_a_switch_nobody_serves_times_out_and_is_left_alone(self):
        a, b = vps.layout("micro-llama", "tp=1"), vps.layout("micro-llama", "tp=1,zero=1")
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), a, 0)
        s = vps.State.allocate(self.reg, a, 0)
        with self.assertRaises(vps.Timeout) as e:
            vps.switch(self.reg, s, b, 0, training=vps.Training(step=3, global_batch=8), timeout=0.2)
        self.assertEqual(e.exception.name, "VPS_ETIMEOUT")
        self.assertEqual(self.reg.state(), (vps.registry.REQUESTED, e.exception.seq))

    def test_what_meanwhile_raises_leaves_the_switch_under_way(self):
        a, b = vps.layout("micro-llama", "tp=1"), vps.layout("micro-llama", "tp=1,zero=1")
        for raised in (RuntimeError("the caller's"), vps.InvalidInput("the caller's")):
            with self.subTest(raised=type(raised).__name__), \
                    vps.Registry("vps-pytest-%d-%s" % (os.getpid(), type(raised).__name__), a, 0) as reg:
                s = vps.State.allocate(reg, a, 0)

                def meanwhile():
                    raise raised
                with self.assertRaises(type(raised)) as e:
                    vps.switch(reg, s, b, 0, training=vps.Training(step=3, global_batch=8), timeout=60,
                               meanwhile=meanwhile)
                self.assertIs(e.exception, raised)
                # requested, not waited for, nothing undone: as on a timeout
                self.assertEqual(reg.state(), (vps.registry.REQUESTED, e.exception.seq))
                self.assertEqual({x.role for x in reg.entries()}, {vps.SOURCE, vps.TARGET})


# Every public method of each wrapper of a C handle, called as a user would
# after close(): (name, the call on obj). Run in a child process, so that a
# crash (the library given a freed handle) fails the test instead of ending
# the runner.
CLOSED_CALLS = {
    "Registry": [
        ("layout_hash", "obj.layout_hash"), ("rank", "obj.rank"), ("set_target", "obj.set_target(lay, 0)"),
        ("alloc_host", "obj.alloc_host(0, 0, 0, 0, 16)"), ("free_host", "obj.free_host(4096)"),
        ("add_host", "obj.add_host(0, 0, 0, 0, 16, 'x')"), ("add_cuda", "obj.add_cuda(0, 0, 0, 0, 16, 4096)"),
        ("entries", "obj.entries()"), ("reset", "obj.reset(lay, 0)"), ("request", "obj.request()"),
        ("wait", "obj.wait(1, 0.1)"), ("expect_executor", "obj.expect_executor(os.getpid())"),
        ("state", "obj.state()"), ("training", "obj.training"),
        ("training", "setattr(obj, 'training', vps.Training(step=1))"),
        ("switch", "vps.switch(obj, None, lay, 0, training=vps.Training(step=1))"),
        ("switch", "vps.switch(obj, None, lay, 0)"),
        ("State.allocate", "vps.State.allocate(obj, lay, 0)"),
    ],
    "Layout": [
        ("hash", "obj.hash"), ("world", "obj.world"), ("parallel", "obj.parallel"), ("describe", "obj.describe()"),
        ("coords", "obj.coords(0)"), ("rank", "obj.rank(0)"), ("holders", "obj.holders('output_layer.weight')"),
        ("State", "vps.State(obj, 0)"), ("Registry", "vps.Registry('vps-pytest-closed-%d' % os.getpid(), obj, 0)"),
        ("state_dtype", "obj.state_dtype('param')"), ("states_of", "obj.states_of('output_layer.weight')"),
        ("optimizer_of", "obj.optimizer_of('output_layer.weight')"),
    ],
    "State": [
        ("buffer", "obj.buffer(vps.PARAM)"), ("param", "obj.param('output_layer.weight')"),
        ("index", "obj.index(obj.view.regions[0])"), ("pieces", "list(obj.pieces())"),
        ("load", "obj.load(lambda t, s: None)"), ("register", "obj.register(reg)"),
        ("switch", "vps.switch(reg, obj, lay, 0)"),
    ],
}

CLOSED_CHILD = r"""
import json, os, sys
sys.path.insert(0, os.path.join(%(top)r, "python"))
import vps
kind, how, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
lay = vps.layout("micro-llama", "tp=1")
reg = vps.Registry("vps-pytest-%%d" %% os.getpid(), lay, 0)
if kind == "Registry":
    obj = reg
    reg.close()
elif kind == "Layout":
    obj = vps.layout("micro-llama", "tp=1")
    obj.close()
else:
    obj = vps.State.allocate(reg, lay, 0)
    if how == "registry closed":
        reg.close()
        reg = vps.Registry("vps-pytest-%%d" %% os.getpid(), lay, 0)
    else:
        reg.reset(None, -1)
        obj.free()
for call in calls:
    print("call " + call, flush=True)
    try:
        eval(call)
        print("no error", flush=True)
    except vps.Error as e:
        print("%%s %%s" %% (e.name, e), flush=True)
"""


class Optimizers(unittest.TestCase):
    """The optimizer as part of the layout: each tensor's states, their
    dtypes, the layer-wise optimizer's buffers, the 16-bit states of the
    precision-aware optimizer in a rank's state."""

    def setUp(self):
        self.reg = None

    def tearDown(self):
        if self.reg:
            self.reg.close()

    def test_states_follow_the_optimizer_that_steps_each_tensor(self):
        lay = vps.layout("tiny-llama", "dp=2,zero=1,optimizer=muon")
        fc1, emb = "decoder.layers.6.mlp.linear_fc1.weight", "embedding.word_embeddings.weight"
        self.assertEqual(lay.optimizer_of(fc1), "muon")
        self.assertEqual(lay.optimizer_of(emb), "adam")
        self.assertEqual([vps.STATES[s] for s in lay.states_of(fc1)], ["param", "main_param", "momentum_buffer"])
        self.assertEqual([vps.STATES[s] for s in lay.states_of(emb)], ["param", "main_param", "exp_avg", "exp_avg_sq"])
        self.assertEqual(vps.OPTIMIZERS[lay.parallel["optimizer"]], "muon")
        v = lay.rank(1)
        p = v.param(fc1)
        self.assertTrue(p.layerwise)
        self.assertFalse(v.param(emb).layerwise)
        b = v.buffer(vps.MOMENTUM_BUFFER, layerwise=True)
        self.assertTrue(v.buffers[b].layerwise and v.buffers[b].sharded)
        self.assertIsNone(v.buffer(vps.MOMENTUM_BUFFER))
        self.assertIn("layerwise=True", repr(v.buffers[b]))
        # layer 6's matrix is rank 1's, whole, at the start of its shard
        (r,) = v.regions_of(fc1, state="momentum_buffer")
        self.assertEqual((r.buffer, r.offset, r.dtype), (b, 0, vps.FP32))
        self.assertEqual(v.regions_of(fc1, state="param")[0].buffer, v.buffer(vps.PARAM, layerwise=True))
        with self.assertRaises(vps.Error) as e:
            vps.layout("tiny-llama", "dp=2,zero=1").holders(fc1, "momentum_buffer")
        self.assertEqual(str(e.exception), "this layout holds no momentum_buffer (adam keeps none)")

    def test_a_dtensor_layout_holds_adams_states_of_its_fp32_parameter(self):
        lay = vps.layout("llama3-debug", "dp_shard=2,tp=2")
        emb = "embedding.word_embeddings.weight"
        self.assertEqual([vps.STATES[s] for s in lay.states_of(emb)], ["main_param", "exp_avg", "exp_avg_sq"])
        self.assertEqual(lay.optimizer_of(emb), "adam")
        self.assertEqual((lay.parallel["family"], lay.parallel["dp_shard"], lay.parallel["optimizer"]), (1, 2, 0))
        self.assertEqual({vps.DTYPES[r.dtype] for r in lay.rank(0).regions}, {"fp32"})
        with self.assertRaises(vps.InvalidInput) as e:
            lay.holders(emb, "param")
        self.assertEqual(str(e.exception),
                         "this layout holds no param (family=dtensor holds main_param, exp_avg and exp_avg_sq)")
        with self.assertRaises(vps.InvalidInput) as e:
            vps.layout("llama3-debug", "dp_shard=2,optimizer=sgd")
        self.assertIn("optimizer=sgd is Megatron's (family=megatron)", str(e.exception))

    def test_adopt_takes_a_layerwise_buffer_by_its_four_keys(self):
        lay = vps.layout("micro-llama", "dp=2,zero=1,optimizer=muon", gpus_per_node=4)
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0)
        v = lay.rank(0)
        b = v.buffer(vps.MOMENTUM_BUFFER, layerwise=True)
        t = torch.zeros(v.buffers[b].elements)
        with self.assertRaises(vps.InvalidInput) as e:
            vps.State.adopt(self.reg, lay, 0, {("momentum_buffer", 0, False): t})
        self.assertIn("no momentum_buffer buffer of chunk 0", str(e.exception))
        # every buffer found by (state, chunk, expert, layerwise): refused only as host memory
        host = {(vps.STATES[x.state], x.chunk, x.expert, x.layerwise):
                torch.zeros(x.elements, dtype=vps.TORCH_DTYPE[x.dtype]) for x in v.buffers}
        self.assertEqual(len(host), len(v.buffers))
        with self.assertRaises(vps.Error) as e:
            vps.State.adopt(self.reg, lay, 0, host)
        self.assertIn("a cpu tensor; host buffers come from State.allocate", str(e.exception))
        self.assertEqual(self.reg.entries(), [])

    def test_offloaded_states_have_host_buffers_that_adopt_makes(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1,offload=0.5", gpus_per_node=4)
        self.assertEqual(lay.parallel["offload"], 0.5)
        v = lay.rank(1)
        host = [b for b in v.buffers if b.host]
        self.assertEqual(sorted(vps.STATES[b.state] for b in host), ["exp_avg", "exp_avg_sq", "main_param"])
        self.assertIn("host=True", repr(host[0]))
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 1)
        s = vps.State.allocate(self.reg, lay, 1)
        self.assertEqual(s.buffer("exp_avg", host=True).numel(), v.buffers[v.buffer(vps.EXP_AVG, host=True)].elements)
        plain = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4).rank(1)
        self.assertEqual(s.buffer("exp_avg", host=True).numel() + s.buffer("exp_avg").numel(),
                         plain.buffers[plain.buffer(vps.EXP_AVG)].elements)
        self.reg.reset(None, -1)
        s.free()
        # adopt makes the host buffers itself: one given is refused, before anything is registered
        given = {b.id: torch.zeros(b.elements, dtype=vps.TORCH_DTYPE[b.dtype]) for b in v.buffers}
        with self.assertRaises(vps.InvalidInput) as e:
            vps.State.adopt(self.reg, lay, 1, given)
        self.assertIn("host): the layout's host buffers are shared memory adopt() makes; leave it out",
                      str(e.exception))
        self.assertEqual(self.reg.entries(), [])

    def test_precision_aware_states_are_allocated_in_their_dtypes(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2,zero=1,precision_aware=1,exp_avg=bf16", gpus_per_node=4)
        self.assertEqual([vps.DTYPES[lay.state_dtype(s)] for s in ("param", "main_param", "exp_avg", "exp_avg_sq")],
                         ["bf16", "int16", "bf16", "fp32"])
        h = lay.holders("decoder.layers.0.mlp.linear_fc1.weight", "main_param")[0]
        volume = 1
        for lo, hi in zip(h.lo, h.hi):
            volume *= hi - lo
        self.assertEqual(h.bytes, 2 * volume)
        self.reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0)
        s = vps.State.allocate(self.reg, lay, 0)
        self.assertEqual(s.buffer("main_param").dtype, torch.int16)
        self.assertEqual(s.buffer("exp_avg").dtype, torch.bfloat16)
        self.assertEqual([e.dtype for e in self.reg.entries()], [b.dtype for b in s.view.buffers])
        self.assertIn(vps.INT16, [e.dtype for e in self.reg.entries()])
        self.reg.reset(None, -1)
        s.free()


class Devices(unittest.TestCase):
    """vps.megatron compares the device of Megatron's parameters with its
    buffers': a State made on "cuda" is on the current GPU, which Megatron
    names "cuda:0" (the H200 run of 2026-11-30 refused its own model)."""

    def test_cuda_without_an_index_is_the_current_device(self):
        from unittest import mock
        from vps import megatron as vm
        d = torch.device
        with mock.patch.object(torch.cuda, "current_device", return_value=0):
            self.assertTrue(vm._same_device(d("cuda", 0), d("cuda")))
            self.assertTrue(vm._same_device(d("cuda"), d("cuda", 0)))
            self.assertFalse(vm._same_device(d("cuda", 1), d("cuda")))
        with mock.patch.object(torch.cuda, "current_device", return_value=1):
            self.assertTrue(vm._same_device(d("cuda", 1), d("cuda")))
            self.assertFalse(vm._same_device(d("cuda", 0), d("cuda")))
        self.assertTrue(vm._same_device(d("cpu"), d("cpu")))
        self.assertFalse(vm._same_device(d("cpu"), d("meta")))
        self.assertFalse(vm._same_device(d("cpu"), d("cuda", 0)))


class Closed(unittest.TestCase):
    """A closed object raises vps.Error from every method; it never hands
    the library a freed handle (a crash of the interpreter)."""

    def test_every_method_of_a_closed_object_raises(self):
        import json
        for kind, calls in CLOSED_CALLS.items():
            for how in ("freed", "registry closed") if kind == "State" else ("closed",):
                # one child a kind: a crash ends it, and its last line names the call
                r = subprocess.run([sys.executable, "-c", CLOSED_CHILD % {"top": TOP}, kind, how,
                                    json.dumps([c for _, c in calls])], capture_output=True, text=True, timeout=120)
                lines = r.stdout.splitlines()
                if r.returncode < 0:
                    self.fail("%s (%s): %s: killed by signal %d" % (kind, how, lines[-1] if lines else "setting up",
                                                                     -r.returncode))
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertEqual(len(lines), 2 * len(calls), r.stdout)
                for call, answer in zip(lines[0::2], lines[1::2]):
                    with self.subTest(kind=kind, how=how, call=call):
                        self.assertTrue(answer.startswith("VPS_EINPUT ") and "is closed" in answer, answer)
                        if how == "registry closed":
                            self.assertIn("unmapped", answer)

    def test_the_calls_cover_every_public_method(self):
        # static methods, which take no handle: unlink, check_room
        skip = {"close", "closed", "unlink", "check_room", "free", "allocate", "adopt", "new", "load"}
        for kind, calls in CLOSED_CALLS.items():
            cls = getattr(vps, kind)
            public = {n for n in dir(cls) if not n.startswith("_")} - skip
            self.assertEqual(public - {n for n, _ in calls}, set(), kind)

    def test_close_twice_and_free_twice_do_nothing(self):
        lay = vps.layout("micro-llama", "tp=1")
        reg = vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0)
        s = vps.State.allocate(reg, lay, 0)
        with self.assertRaises(vps.Error):
            s.free()  # still registered: refused, the state kept
        self.assertFalse(s.closed)
        reg.reset(None, -1)
        s.free()
        s.free()
        reg.close()
        reg.close()
        lay.close()
        lay.close()
        self.assertTrue(reg.closed and lay.closed and s.closed)
        self.assertIn("closed", repr(reg))


class Printing(unittest.TestCase):
    """Objects print with names, not indices; regions_of takes a tensor's
    name; holders() answers vps-layout --tensor."""

    def test_regions_and_buffers_print_names(self):
        v = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4).rank(1)
        r = v.regions_of("main_param")[0]
        self.assertEqual(r.name, v.layout.model.tensor_name(r.tensor))
        self.assertTrue(repr(r).startswith("Region(%s, state=main_param, buffer=" % r.name), repr(r))
        self.assertNotIn("tensor=", repr(r))
        self.assertIn("state=main_param, dtype=fp32", repr(v.buffers[v.buffer(vps.MAIN_PARAM)]))

    def test_regions_of_a_tensor_by_name(self):
        v = vps.layout("micro-llama", "tp=2,dp=2,zero=1", gpus_per_node=4).rank(1)
        name = "decoder.layers.0.mlp.linear_fc1.weight"
        mine = v.regions_of(name)
        self.assertIn(vps.PARAM, {r.state for r in mine})
        self.assertEqual(mine, [r for r in v.regions if r.tensor == v.layout.model.find(name)])
        self.assertTrue(all(r.name == name for r in mine))
        self.assertEqual(v.regions_of(tensor=name, state="exp_avg"), [r for r in mine if r.state == vps.EXP_AVG])
        self.assertEqual(v.regions_of(tensor=v.layout.model.find(name)), mine)
        for bad in ("decoder.layers.0.mlp.nothing", 99, -1):
            with self.assertRaises(vps.Error, msg=repr(bad)) as e:
                v.regions_of(bad)
            self.assertEqual(e.exception.name, "VPS_EINPUT")
        with self.assertRaises(vps.Error) as e:
            v.regions_of(tensor=10 ** 6)
        self.assertIn("not a name nor an id", str(e.exception))

    def test_holders_answers_as_vps_layout_tensor(self):
        import json
        lay = vps.layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1")
        pattern = "decoder.layers.5.*fc1*"
        out = subprocess.run([os.path.join(BIN, "vps-layout"), "--model", "tiny-llama", "--parallel",
                              "tp=2,pp=2,dp=2,zero=1", "--tensor", pattern, "--format", "json"],
                             check=True, capture_output=True, text=True).stdout
        tool = [json.loads(line) for line in out.splitlines()]
        mine = lay.holders(pattern)
        self.assertEqual(len(mine), len(tool))
        for h, t in zip(mine, tool):
            self.assertEqual((h.name, h.state, list(h.ranks), h.buffer, [list(x) for x in zip(h.lo, h.hi)],
                              h.offset, list(h.strides), h.bytes),
                             (t["tensor"], t["state"], list(range(t["base"], t["base"] + t["stride"] * t["count"],
                                                                  t["stride"] or 1)), t["buffer"], t["box"],
                              t["offset"], t["strides"], t["bytes"]))
        # the same answer as each rank's own view
        for h in mine:
            for r in h.ranks:
                held = [x for x in lay.rank(r).regions_of(h.name, state=h.state) if x.offset == h.offset]
                self.assertEqual([(x.lo, x.hi, x.buffer) for x in held], [(h.lo, h.hi, h.buffer)])
        box = lay.holders("embedding.word_embeddings.weight", "main_param", box=[(0, 8), (0, 256)])
        self.assertTrue(box and all(h.lo == (0, 0) and h.hi == (8, 256) for h in box), box)
        self.assertIn("state=main_param, ranks=", repr(box[0]))
        for bad, args in (("no tensor named", ("nothing",)), ("no tensor matching", ("nothing.*",)),
                          ("holds no grad", ("output_layer.weight", "grad")),
                          ("not a state", ("output_layer.weight", "momentum")),
                          ("is outside", ("output_layer.weight", None, [(0, 1), (0, 10 ** 6)]))):
            with self.assertRaises(vps.Error, msg=bad) as e:
                lay.holders(*args)
            self.assertIn(bad, str(e.exception))


class Api(unittest.TestCase):
    """What a caller programs against: an exception class per result code,
    keyword-only options, context managers, names documented, and the
    module without PyTorch."""

    def test_a_class_per_result_code_with_the_librarys_number(self):
        from vps import errors
        names = {c: _lib.lib.vps_result_name(c) for c in range(64)}
        self.assertEqual(names[0], b"VPS_OK")
        self.assertIsNone(names[63])
        self.assertEqual(vps.CODES, {c: n.decode() for c, n in names.items() if n})
        by_result = {cls.result: cls for cls in errors._CLASSES}
        for want in ("NotFound", "Timeout", "PeerFailed", "Stale", "Busy", "InvalidInput", "CheckFailed",
                     "Unsupported"):
            self.assertIn(want, vps.__all__)
        for code, name in vps.CODES.items():
            if code == 0:
                continue
            cls = by_result[name]  # every code the library has, a class
            self.assertIs(getattr(vps, cls.__name__), cls)
            self.assertTrue(issubclass(cls, vps.Error), cls)
            self.assertEqual(cls.code, code)
            # made from the code or by the class, the same error
            for e in (vps.Error(code, "what went wrong"), cls("what went wrong")):
                self.assertIs(type(e), cls)
                self.assertEqual((e.code, e.name, e.message, str(e)),
                                 (code, name, "what went wrong", "what went wrong"))
        e = pickle.loads(pickle.dumps(vps.Timeout("late")))
        self.assertEqual((type(e), e.code, str(e)), (vps.Timeout, vps.Timeout.code, "late"))
        # a code this module does not know: a plain Error, named by its number
        e = vps.Error(99, "new")
        self.assertEqual((type(e), e.name), (vps.Error, "VPS_E99"))
        with self.assertRaises(TypeError):
            vps.Error("a message without a code")

    def test_the_library_raises_the_class_of_its_code(self):
        with self.assertRaises(vps.NotFound):
            vps.Model("no-such-model")
        with self.assertRaises(vps.InvalidInput):
            vps.layout("tiny-llama", "tp=3")
        lay = vps.layout("micro-llama", "tp=1")
        with self.assertRaises(vps.InvalidInput) as e:
            lay.rank(0).param("no.such.parameter")
        self.assertIn("holds no parameter no.such.parameter", str(e.exception))
        half = vps.layout("micro-llama", "tp=2", gpus_per_node=2)
        s = vps.State(half, 0)
        s.buffers = [torch.ones(b.elements, dtype=vps.TORCH_DTYPE[b.dtype]) for b in s.view.buffers]
        with self.assertRaises(vps.CheckFailed) as e:
            vps.assemble(half.model, s.pieces())  # rank 1's half is missing
        self.assertIn("held by no rank", str(e.exception))

    def test_a_topology_by_name_or_file_as_vps_plan_reads_it(self):
        t = vps.topology("a800-testbed")
        self.assertEqual((t.name, t.gpus_per_node, t.inter_node_bandwidth, t.intra_node_bandwidth, t.path),
                         ("a800-testbed", 8, 25e9, 200e9, "a800-testbed"))
        self.assertIsInstance(t, vps.Topology)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "two.yaml")
            with open(path, "w") as f:
                f.write("vps: topology\nversion: 1\nname: two\ngpus_per_node: 2\nintra_node_bandwidth: 1e11\n"
                        "inter_node_bandwidth: 1e10\nmemory_bandwidth: 1e12\nlatency: 1e-5\n")
            t = vps.topology(path)
            self.assertEqual((t.name, t.gpus_per_node, t.latency, t.gpu_memory, t.path), ("two", 2, 1e-5, 0, path))
            with open(path, "w") as f:
                f.write("vps: topology\nversion: 1\nname: two\nintra_node_bandwidth: 1e11\n"
                        "inter_node_bandwidth: 0\nmemory_bandwidth: 1e12\nlatency: 1e-5\n")
            with self.assertRaises(vps.InvalidInput) as e:
                vps.topology(path)
            self.assertIn("bandwidths must be positive", str(e.exception))
        with self.assertRaises(vps.NotFound) as e:
            vps.topology("no-such-cluster")
        self.assertIn("known: a800-testbed", str(e.exception))
        with self.assertRaises(vps.InvalidInput) as e:
            vps.topology(os.path.join(TOP, "configs", "models", "tiny-llama.yaml"))
        self.assertIn("a model, not a topology", str(e.exception))

    def test_switch_takes_training_timeout_and_device_by_keyword_only(self):
        import inspect
        params = inspect.signature(vps.switch).parameters
        self.assertEqual([n for n, p in params.items() if p.kind == p.KEYWORD_ONLY],
                         ["training", "timeout", "device", "target", "clocks", "free", "meanwhile"])
        lay = vps.layout("micro-llama", "tp=1")
        with vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0) as reg:
            with self.assertRaises(TypeError):
                vps.switch(reg, None, lay, 0, vps.Training(step=1))
            with self.assertRaises(TypeError):
                vps.switch(reg, None, lay, 0, None, 600.0)
            self.assertEqual(reg.entries(), [])  # refused before anything was done

    def test_switch_refuses_a_target_made_for_another_layout_or_rank(self):
        lay, other = vps.layout("micro-llama", "tp=1"), vps.layout("micro-llama", "tp=2", gpus_per_node=2)
        with vps.Registry("vps-pytest-%d" % os.getpid(), lay, 0) as reg:
            with vps.State.allocate(reg, lay, 0) as src, vps.State.allocate(reg, lay, 0, vps.TARGET) as tgt:
                n = len(reg.entries())
                for to, rank in ((other, 0), (lay, -1)):
                    with self.assertRaises(vps.InvalidInput) as e:
                        vps.switch(reg, src, to, rank, target=tgt)
                    self.assertIn("the target given is", str(e.exception))
                # refused before anything was done: the registry and both states as they were
                self.assertEqual(len(reg.entries()), n)
                self.assertFalse(src.closed or tgt.closed)
                reg.reset(None, -1)

    def test_layout_registry_and_state_are_context_managers(self):
        with vps.layout("micro-llama", "tp=1") as lay:
            self.assertEqual(lay.world, 1)
        self.assertTrue(lay.closed)
        lay = vps.layout("micro-llama", "tp=1")
        name = "vps-pytest-%d" % os.getpid()
        with vps.Registry(name, lay, 0) as reg:
            with vps.State.allocate(reg, lay, 0) as s:
                s.buffers[0].fill_(1)
                self.assertEqual(len(reg.entries()), len(s.view.buffers))
            # the registry runs nothing now, and the state's memory is gone
            self.assertTrue(s.closed)
            self.assertEqual((reg.layout_hash, reg.rank, reg.entries()), (0, -1, []))
            with self.assertRaises(vps.InvalidInput):
                s.param("output_layer.weight")
            # a state the registry no longer runs is freed, the registry left alone
            other = vps.layout("micro-llama", "tp=1,zero=1")
            reg.reset(lay, 0)
            with vps.State.allocate(reg, lay, 0) as s:
                reg.reset(other, 0)
            self.assertTrue(s.closed)
            self.assertEqual((reg.layout_hash, reg.rank), (other.hash, 0))
        self.assertTrue(reg.closed)
        self.assertFalse([f for f in os.listdir("/dev/shm") if f.startswith(name)])

    def test_every_public_name_is_documented_and_typed(self):
        import inspect
        import vps.dtensor
        import vps.hf
        import vps.megatron
        for mod in (vps, vps.megatron, vps.dtensor, vps.elastic, vps.hf):
            for n in mod.__all__:
                obj = getattr(mod, n)
                if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                    continue
                with self.subTest(name="%s.%s" % (mod.__name__, n)):
                    self.assertTrue((obj.__doc__ or "").strip())
                members = [(n, obj)] if inspect.isfunction(obj) else \
                    [("%s.%s" % (n, m), v.fget if isinstance(v, property) else getattr(v, "__func__", v))
                     for m, v in vars(obj).items() if not m.startswith("_") or m == "__init__"]
                for what, f in members:
                    if not inspect.isfunction(f):
                        continue
                    with self.subTest(name="%s.%s" % (mod.__name__, what)):
                        if not what.endswith("__init__"):
                            self.assertTrue((f.__doc__ or "").strip())
                        # the core API has type hints: every argument and the result
                        if mod is vps:
                            sig = inspect.signature(f)
                            self.assertEqual([p for p, v in sig.parameters.items() if v.annotation is v.empty
                                              and p not in ("self", "cls") and v.kind not in (v.VAR_POSITIONAL,)],
                                             [])
                            self.assertIsNot(sig.return_annotation, sig.empty)

    def test_without_torch_the_module_imports_and_says_what_needs_it(self):
        # torch made unimportable, as in a Python that lacks it
        child = r"""
import sys
sys.modules["torch"] = None
sys.path.insert(0, %r)
import vps
from vps import *
print(layout("micro-llama", "tp=2", gpus_per_node=2).world, "State" in dir(), vps.NotFound.__name__)
for part in ("vps.State", "vps.switch", "vps.assemble"):
    try:
        eval(part)
    except ModuleNotFoundError as e:
        print(part, e.name, e)
for part in ("vps.megatron", "vps.dtensor", "vps.elastic"):
    try:
        __import__(part)
    except ModuleNotFoundError as e:
        print(part, e.name, e)
""" % os.path.join(TOP, "python")
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "2 False NotFound")
        self.assertEqual(len(lines), 7, r.stdout)
        for line, part in zip(lines[1:], ("vps.State", "vps.switch", "vps.assemble", "vps.megatron", "vps.dtensor",
                                          "vps.elastic")):
            self.assertTrue(line.startswith(part + " torch vps."), line)
            self.assertIn(" needs PyTorch, which %s cannot import (" % sys.executable, line)
            self.assertIn("make venv makes build/venv", line)
            self.assertIn("pip install torch", line)


class Elastic(unittest.TestCase):
    """vps.elastic: the groups of a layout, the switch protocol on the job's
    store, and a world built in the background."""

    def setUp(self):
        import vps.elastic
        self.el = vps.elastic

    def test_axis_groups(self):
        lay = vps.layout("micro-llama", "tp=2,dp=2", 8)
        self.assertEqual(self.el.axis_groups(lay, "tp"), [[0, 1], [2, 3]])
        self.assertEqual(self.el.axis_groups(lay, "dp"), [[0, 2], [1, 3]])
        # ordered by the other coordinates, tp first: rank 2 is (tp 0, dp 1), rank 1 (tp 1, dp 0)
        self.assertEqual(self.el.axis_groups(lay, "pp"), [[0], [2], [1], [3]])
        # each axis's groups, then the job's: every process makes them in this order
        self.assertEqual(self.el.layout_groups(lay)[-1], [0, 1, 2, 3])
        with self.assertRaises(vps.Error):
            self.el.axis_groups(lay, "zz")

    @staticmethod
    def eventually(fn):
        """fn()'s value once true (a key set by one client of the store is seen
        by another a moment later, as the trainers' polls allow for)."""
        deadline = time.monotonic() + 10
        while True:
            v = fn()
            if v or time.monotonic() > deadline:
                return v
            time.sleep(0.01)

    def test_protocol(self):
        agent = self.el.Agent(timeout=30)
        job = self.el.Job("127.0.0.1", agent.port, timeout=30, agent=True)
        job.ask(1, {"config": "dp=8", "world": 8})
        self.assertEqual(self.eventually(agent.asks), [{"config": "dp=8", "world": 8, "switch": 1}])
        self.assertEqual(agent.asks(), [])
        self.assertFalse(job.ready(1))
        agent.ready(1)
        self.assertTrue(self.eventually(lambda: job.ready(1)))
        self.assertEqual(agent.request("tp=2,dp=2"), 1)
        self.assertEqual(self.eventually(lambda: job.request(1)), "tp=2,dp=2")
        self.assertIsNone(job.request(2))
        # the first word on an abandoned switch stays
        job.abandon(2, "process 5 exited with status 3 before it joined")
        agent.abandon(2, "later")
        self.assertEqual(self.eventually(lambda: agent.abandoned(2)), "process 5 exited with status 3 before it joined")
        self.assertIsNone(job.abandoned(1))
        agent.verdict(2, 1, "old")
        self.assertEqual(job.verdict(2, 1, 5), "old")
        self.assertTrue(job.verdict(2, 2, 0.05).startswith("stop: "))
        self.assertFalse(agent.finished())
        job.finish()
        self.assertTrue(self.eventually(agent.finished))
        self.assertIsNone(job.wait_asked(2))

    def test_world_built_in_the_background(self):
        agent = self.el.Agent(timeout=30)
        jobs = [self.el.Job("127.0.0.1", agent.port, timeout=30) for _ in range(2)]
        builds = [j.build(1, r, 2, [[0, 1]]) for r, j in enumerate(jobs)]
        worlds = [b.result(30) for b in builds]
        out = [torch.tensor([float(r + 1)]) for r in range(2)]
        works = [torch.distributed.all_reduce(t, group=w.group([0, 1]), async_op=True) for t, w in zip(out, worlds)]
        for w in works:
            w.wait()
        self.assertEqual([t.item() for t in out], [3.0, 3.0])

    def test_a_retired_world_lets_its_groups_go_in_a_thread(self):
        agent = self.el.Agent(timeout=30)
        jobs = [self.el.Job("127.0.0.1", agent.port, timeout=30) for _ in range(2)]
        worlds = [b.result(30) for b in [j.build(1, r, 2, [[0, 1]]) for r, j in enumerate(jobs)]]
        gone = [weakref.ref(w.group([0, 1])) for w in worlds]
        threads = [w.retire() for w in worlds]
        self.assertTrue(all(t.name == "vps-world-1-retired" for t in threads))
        for t in threads:
            t.join(30)
        self.assertEqual([g() for g in gone], [None, None])
        for w in worlds:
            self.assertIn("retired", repr(w))
            with self.assertRaisesRegex(vps.InvalidInput, "world 1: retired"):
                w.group([0, 1])
            with self.assertRaisesRegex(vps.InvalidInput, "world 1: retired"):
                w.prepare([[0, 1]], jobs[0].store)


if __name__ == "__main__":
    unittest.main()
