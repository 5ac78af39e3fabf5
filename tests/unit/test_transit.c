/* Transit, node by node (lib/plan/transit.c): what a node's devices take
 * in from other nodes, rerouted through node-mates. The node's arrivals
 * are made by hand here, on the devices of a real world (tiny-llama from
 * (tp=2, pp=2, dp=2) on four nodes of two to (tp=1, pp=2) on node 0: world
 * ranks 0 and 1 are node 0's devices of B, ranks 2 to 7 lie on nodes 1 to
 * 3), with boxes large enough that the node gains more than its floor of
 * 16 MiB of NIC time. */
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "plan/transit.h"

#define MIB ((int64_t)1 << 20)

struct node {
	struct vps_layout *a, *b;
	struct vps_world *w;
	int64_t devices[4], area_max[4];
	struct vps_transit_node tn;
};

static vps_result_t no_forwards(void *arg, int64_t w, struct vps_pieces *out)
{
	(void)arg;
	(void)w;
	(void)out;
	return VPS_OK;
}

static double busy_sender(void *arg, int64_t w)
{
	(void)w;
	return *(const double *)arg;
}

static bool node_init(struct node *n)
{
	memset(n, 0, sizeof(*n));
	n->a = test_layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1", 2, 0);
	n->b = test_layout("tiny-llama", "tp=1,pp=2,dp=1,zero=1", 2, 0);
	if (!n->a || !n->b)
		return false;
	CHECK_OK(vps_world_new(&n->w, n->a, n->b));
	if (!n->w)
		return false;
	n->devices[0] = 0;
	n->devices[1] = 1;
	n->area_max[0] = n->area_max[1] = 1024 * MIB;
	n->tn = (struct vps_transit_node){.w = n->w, .node = 0, .devices = n->devices, .area_max = n->area_max,
					  .ndevices = 2, .intra = 200e9, .inter = 25e9, .forwards = no_forwards};
	return true;
}

/* Node 0 of four devices (world ranks 0 to 3, tiny-llama tp=2, pp=2 on
 * nodes of four), for what passes between node-mates alone. */
static bool node4_init(struct node *n)
{
	memset(n, 0, sizeof(*n));
	n->a = test_layout("tiny-llama", "tp=2,pp=2,dp=1,zero=1", 4, 0);
	n->b = test_layout("tiny-llama", "tp=2,pp=2,dp=1,zero=1", 4, 0);
	if (!n->a || !n->b)
		return false;
	CHECK_OK(vps_world_new(&n->w, n->a, n->b));
	if (!n->w)
		return false;
	for (int64_t i = 0; i < 4; i++) {
		n->devices[i] = i;
		n->area_max[i] = 1024 * MIB;
	}
	n->tn = (struct vps_transit_node){.w = n->w, .node = 0, .devices = n->devices, .area_max = n->area_max,
					  .ndevices = 4, .intra = 200e9, .inter = 25e9, .forwards = no_forwards};
	return true;
}

static void node_free(struct node *n)
{
	vps_world_free(n->w);
	vps_layout_free(n->a);
	vps_layout_free(n->b);
}

/* A piece of tensor t's param (bf16) rows [lo, hi) of 4096 elements, from
 * world rank src to dst's B buffer 0, contiguous on both sides. */
static struct vps_piece arrival(uint32_t t, int64_t lo, int64_t hi, int64_t src, int64_t dst)
{
	struct vps_piece x = {.tensor = t, .state = VPS_STATE_PARAM, .dtype = vps_dtype_field(VPS_DTYPE_BF16), .src = src, .dst = dst};
	x.box.ndim = 2;
	x.box.lo[0] = lo;
	x.box.hi[0] = hi;
	x.box.hi[1] = 4096;
	x.src_offset = x.dst_offset = lo * 4096;
	x.src_strides[0] = x.dst_strides[0] = 4096;
	x.src_strides[1] = x.dst_strides[1] = 1;
	return x;
}

static void add(struct vps_pieces *s, struct vps_piece x)
{
	CHECK_OK(VPS_GROW(s->v, s->cap, s->n + 1));
	if (s->v)
		s->v[s->n++] = x;
}

/* Bytes into dst over its NIC (from other nodes, into B or its area), and
 * what it receives in all (retains aside). */
static void loads(const struct node *n, const struct vps_pieces *s, int64_t dst, int64_t *nic, int64_t *all)
{
	*nic = *all = 0;
	for (size_t i = 0; i < s->n; i++) {
		const struct vps_piece *x = &s->v[i];
		if (x->dst != dst || x->src == x->dst)
			continue;
		*all += vps_piece_bytes(x);
		if (vps_world_device(n->w, x->src).node != 0)
			*nic += vps_piece_bytes(x);
	}
}

/* Rows of tensor t that reach device dst's B buffer 0 (not its area),
 * each counted as often as it lands. */
static int64_t rows_into(const struct vps_pieces *s, uint32_t t, int64_t dst)
{
	int64_t rows = 0;
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i].dst == dst && s->v[i].tensor == t && !vps_piece_to_transit(&s->v[i]))
			rows += s->v[i].box.hi[0] - s->v[i].box.lo[0];
	return rows;
}

/* Device 0 takes 256 MiB in over its NIC; device 1 takes its own from
 * device 0 over NVLink, its NIC idle. Device 1 carries about half of
 * device 0's into its transit area and passes it on a hop later: every
 * row still reaches device 0 once, from the sender's same rows (through
 * the area at the same positions), and the NICs are within 10% of each
 * other. */
TEST(an_idle_nic_carries_half_of_what_its_node_mate_takes_in)
{
	struct node n;
	if (!node_init(&n))
		return;
	struct vps_pieces s = {0};
	add(&s, arrival(0, 0, 16384, 4, 0));  /* 128 MiB */
	add(&s, arrival(1, 0, 16384, 6, 0));  /* 128 MiB */
	add(&s, arrival(2, 0, 4096, 0, 1));   /* 32 MiB over NVLink */
	CHECK_OK(vps_transit_route(&n.tn, &s));
	int64_t nic0, nic1, all0, all1, into = 0, out = 0;
	loads(&n, &s, 0, &nic0, &all0);
	loads(&n, &s, 1, &nic1, &all1);
	CHECK_EQ(all0, 256 * MIB);
	CHECK(nic1 > 0);
	CHECK(10 * (nic0 > nic1 ? nic0 - nic1 : nic1 - nic0) < nic0);
	for (size_t i = 0; i < s.n; i++) {
		const struct vps_piece *x = &s.v[i];
		if (vps_piece_to_transit(x)) {
			CHECK_EQ(x->dst, 1);
			CHECK_EQ(x->dst_offset * 2 % 64, 0);
			into += vps_piece_bytes(x);
		}
		if (vps_piece_from_transit(x)) {
			CHECK_EQ(x->src, 1);
			CHECK_EQ(x->dst, 0);
			CHECK_EQ(vps_buffer_hop(x->src_buffer), 1);
			/* it reads what its arrival put there: the same rows at the same place */
			bool found = false;
			for (size_t k = 0; k < s.n && !found; k++)
				found = vps_piece_to_transit(&s.v[k]) && s.v[k].tensor == x->tensor &&
					vps_box_equal(&s.v[k].box, &x->box) && s.v[k].dst_offset == x->src_offset;
			CHECK(found);
			out += vps_piece_bytes(x);
		}
	}
	CHECK(into > 0);
	CHECK_EQ(into, out);
	CHECK_EQ(rows_into(&s, 0, 0), 16384);
	CHECK_EQ(rows_into(&s, 1, 0), 16384);
	free(s.v);
	node_free(&n);
}

/* Devices 0 and 1 both take tensors 0 and 1 (128 MiB each) in from other
 * nodes, their NICs equally busy: no NIC has room, but each tensor enters
 * the node once, tensor 0 at one device and tensor 1 at the other, each
 * passing it on to the other from its B buffer a hop later. Each NIC takes
 * half what it did; each device still gets every row once. */
TEST(what_two_devices_take_in_alike_enters_the_node_once)
{
	struct node n;
	if (!node_init(&n))
		return;
	struct vps_pieces s = {0};
	for (uint32_t t = 0; t < 2; t++)
		for (int64_t d = 0; d < 2; d++)
			add(&s, arrival(t, 0, 16384, 2 + 2 * t + d, d));
	CHECK_OK(vps_transit_route(&n.tn, &s));
	int64_t nic0, nic1, all0, all1;
	loads(&n, &s, 0, &nic0, &all0);
	loads(&n, &s, 1, &nic1, &all1);
	CHECK_EQ(nic0, 128 * MIB);
	CHECK_EQ(nic1, 128 * MIB);
	CHECK_EQ(all0, 256 * MIB);
	CHECK_EQ(all1, 256 * MIB);
	int forwards = 0;
	for (size_t i = 0; i < s.n; i++) {
		const struct vps_piece *x = &s.v[i];
		CHECK(!vps_piece_to_transit(x));
		if (x->src_buffer & VPS_BUFFER_TARGET) {
			CHECK_EQ(vps_buffer_index(x->src_buffer), 0);
			CHECK_EQ(vps_buffer_hop(x->src_buffer), 1);
			CHECK(x->src != x->dst && x->src <= 1);
			forwards++;
		}
	}
	CHECK_EQ(forwards, 2);
	for (uint32_t t = 0; t < 2; t++)
		for (int64_t d = 0; d < 2; d++)
			CHECK_EQ(rows_into(&s, t, d), 16384);
	free(s.v);
	node_free(&n);
}

/* The node as it was: where a sender into it must be as busy as its
 * busiest device whatever the plan (the estimate cannot gain), and where
 * the gain is below 16 MiB of NIC time. */
TEST(a_node_that_cannot_gain_is_left_alone)
{
	struct node n;
	if (!node_init(&n))
		return;
	double busy = 1.0; /* seconds: above the node's 10 ms */
	n.tn.least_send = busy_sender;
	n.tn.arg = &busy;
	struct vps_pieces s = {0};
	add(&s, arrival(0, 0, 16384, 4, 0));
	add(&s, arrival(1, 0, 16384, 6, 0));
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 2);
	n.tn.least_send = NULL;
	s.n = 0;
	add(&s, arrival(0, 0, 2048, 4, 0)); /* 16 MiB: half of it to carry */
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 1);
	CHECK(!vps_piece_to_transit(&s.v[0]));
	free(s.v);
	node_free(&n);
}

/* NVLink bytes each device of node4 sends (to node-mates) in the set. */
static void nvl_sends(const struct vps_pieces *s, int64_t out[4])
{
	memset(out, 0, 4 * sizeof(*out));
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i].src != s->v[i].dst && s->v[i].src >= 0 && s->v[i].src < 4)
			out[s->v[i].src] += vps_piece_bytes(&s->v[i]);
}

/* Device 0 sends tensor 0 (128 MiB) to each of its three node-mates over
 * NVLink, the node's busiest device three times over: it sends it once,
 * and the node-mates pass it on from one to the next, each from its B
 * buffer where it landed, the hop after it landed there. Every device
 * still gets every row once, at its own addresses; devices 0 to 2 send
 * 128 MiB each, device 3 nothing; nothing goes through an area. */
TEST(a_busy_sender_sends_what_its_node_mates_share_once)
{
	struct node n;
	if (!node4_init(&n))
		return;
	struct vps_pieces s = {0};
	for (int64_t d = 1; d < 4; d++) {
		struct vps_piece x = arrival(0, 0, 16384, 0, d);
		x.dst_offset += d * 1024; /* each device's B buffer at its own place */
		add(&s, x);
	}
	CHECK_OK(vps_transit_route(&n.tn, &s));
	int64_t sent[4];
	nvl_sends(&s, sent);
	for (int d = 0; d < 4; d++)
		CHECK_EQ(sent[d], d < 3 ? 128 * MIB : 0);
	for (int64_t d = 1; d < 4; d++)
		CHECK_EQ(rows_into(&s, 0, d), 16384);
	for (size_t i = 0; i < s.n; i++) {
		const struct vps_piece *x = &s.v[i];
		CHECK(!vps_piece_to_transit(x) && !vps_piece_from_transit(x));
		CHECK_EQ(x->dst_offset, x->box.lo[0] * 4096 + x->dst * 1024);
		if (x->src == 0) {
			CHECK_EQ(x->src_buffer, 0);
			continue;
		}
		/* a relay's own copy, where it landed, the hop after */
		CHECK(x->src_buffer & VPS_BUFFER_TARGET);
		CHECK_EQ(vps_buffer_index(x->src_buffer), 0);
		CHECK_EQ(x->src_offset, x->box.lo[0] * 4096 + x->src * 1024);
		int landed = -1;
		for (size_t k = 0; k < s.n; k++)
			if (s.v[k].dst == x->src)
				landed = vps_buffer_hop(s.v[k].src_buffer);
		CHECK_EQ(vps_buffer_hop(x->src_buffer), landed + 1);
	}
	free(s.v);
	node_free(&n);
}

/* The node as it was where sharing gains too little: a busy sender whose
 * node-mates take nothing alike (one box each), one whose box arrives in
 * 128 KiB pieces (a message's latency would cost more than their bytes
 * save), and one whose gain a message's latency for each new node-mate
 * outweighs (a 1 s latency). */
TEST(a_share_that_gains_too_little_is_left_alone)
{
	struct node n;
	if (!node4_init(&n))
		return;
	struct vps_pieces s = {0};
	for (int64_t d = 1; d < 4; d++)
		add(&s, arrival((uint32_t)d, 0, 16384, 0, d));
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 3);
	s.n = 0;
	for (int64_t d = 1; d < 4; d++)
		add(&s, arrival(0, 0, 16, 0, d)); /* 128 KiB */
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 3);
	for (size_t i = 0; i < s.n; i++)
		CHECK_EQ(s.v[i].src, 0);
	s.n = 0;
	for (int64_t d = 1; d < 4; d++)
		add(&s, arrival(0, 0, 16384, 0, d));
	n.tn.latency = 1.0;
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 3);
	for (size_t i = 0; i < s.n; i++)
		CHECK_EQ(s.v[i].src, 0);
	free(s.v);
	node_free(&n);
}

/* Devices 0 and 1 both take tensor 0 (128 MiB) in from other nodes, from
 * senders busier than the node can ever be (1 s against its 5 ms): the
 * node cannot gain, but the senders can. The tensor enters the node once,
 * and one device passes it on to the other from its B buffer a hop later:
 * the senders send half what they did, each device still gets every row
 * once. Where a message's latency (1 s) would make the node's busiest
 * busier, nothing changes. */
TEST(what_busy_senders_send_two_devices_alike_enters_the_node_once)
{
	struct node n;
	if (!node_init(&n))
		return;
	double busy = 1.0;
	n.tn.least_send = busy_sender;
	n.tn.arg = &busy;
	struct vps_pieces s = {0};
	add(&s, arrival(0, 0, 16384, 4, 0));
	add(&s, arrival(0, 0, 16384, 6, 1));
	CHECK_OK(vps_transit_route(&n.tn, &s));
	int64_t nic0, nic1, all0, all1;
	loads(&n, &s, 0, &nic0, &all0);
	loads(&n, &s, 1, &nic1, &all1);
	CHECK_EQ(nic0 + nic1, 128 * MIB);
	CHECK_EQ(all0, 128 * MIB);
	CHECK_EQ(all1, 128 * MIB);
	for (int64_t d = 0; d < 2; d++)
		CHECK_EQ(rows_into(&s, 0, d), 16384);
	int forwards = 0;
	for (size_t i = 0; i < s.n; i++)
		if (s.v[i].src_buffer & VPS_BUFFER_TARGET) {
			CHECK_EQ(vps_buffer_hop(s.v[i].src_buffer), 1);
			CHECK(s.v[i].src <= 1 && s.v[i].dst <= 1 && s.v[i].src != s.v[i].dst);
			forwards++;
		}
	CHECK_EQ(forwards, 1);
	s.n = 0;
	add(&s, arrival(0, 0, 16384, 4, 0));
	add(&s, arrival(0, 0, 16384, 6, 1));
	n.tn.latency = 1.0;
	CHECK_OK(vps_transit_route(&n.tn, &s));
	CHECK_EQ(s.n, 2);
	for (size_t i = 0; i < s.n; i++)
		CHECK(s.v[i].src >= 4);
	free(s.v);
	node_free(&n);
}
