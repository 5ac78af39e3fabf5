/* Plans in files (plan_io.h, vps-formats(5)): the body staged plans embed
 * too, a global plan's packed pieces written by threads, and pieces read
 * packed and hashed as they come for tools that only stage or count them. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/sysinfo.h>

#include "io/doc.h"
#include "util/hash.h"
#include "util/internal.h"
#include "model/layout_io.h"
#include "plan/piece.h"
#include "plan/plan_io.h"
#include "plan/plan_pack.h"

static vps_result_t write_strides(struct vps_writer *w, const char *key, const int64_t *s, int n)
{
	return vps_ints_write(w, key, s, n);
}

vps_result_t vps_training_write(struct vps_writer *w, const char *key, const struct vps_training *t)
{
	VPS_CHECK(vps_w_map_begin(w, key));
	VPS_CHECK(vps_w_bool(w, "known", t->known));
	VPS_CHECK(vps_w_int(w, "step", t->step));
	VPS_CHECK(vps_w_int(w, "consumed_samples", t->consumed_samples));
	VPS_CHECK(vps_w_int(w, "scheduler_step", t->scheduler_step));
	VPS_CHECK(vps_w_int(w, "global_batch", t->global_batch));
	VPS_CHECK(vps_w_int(w, "micro_batch", t->micro_batch));
	VPS_CHECK(vps_w_int(w, "grad_accum", t->grad_accum));
	VPS_CHECK(vps_w_int(w, "dp", t->dp));
	return vps_w_map_end(w);
}

vps_result_t vps_training_read(struct vps_reader *r, const char *key, struct vps_training *t)
{
	memset(t, 0, sizeof(*t));
	VPS_CHECK(vps_r_map_begin(r, key));
	VPS_CHECK(vps_r_bool(r, "known", &t->known));
	VPS_CHECK(vps_r_int(r, "step", &t->step, 0, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "consumed_samples", &t->consumed_samples, 0, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "scheduler_step", &t->scheduler_step, 0, INT64_MAX));
	/* batch sizes bound the loops that split them (vps-exec, the trainer) */
	VPS_CHECK(vps_r_int(r, "global_batch", &t->global_batch, 0, VPS_MAX_BATCH));
	VPS_CHECK(vps_r_int(r, "micro_batch", &t->micro_batch, 0, VPS_MAX_BATCH));
	VPS_CHECK(vps_r_int(r, "grad_accum", &t->grad_accum, 0, VPS_MAX_BATCH));
	VPS_CHECK(vps_r_int(r, "dp", &t->dp, 0, VPS_MAX_BATCH));
	return vps_r_map_end(r);
}

/* Tensor names, made once per tensor a document names: a global plan names
 * one tensor in thousands of pieces. */
struct names {
	const struct vps_model *m;
	uint32_t n;
	int32_t *at; /* offset in buf, -1 until made */
	char *buf;
	size_t len, cap;
};

static void names_release(struct names *t)
{
	free(t->at);
	free(t->buf);
}

static vps_result_t tensor_name(struct names *t, uint32_t id, const char **out)
{
	struct vps_tensor ten;
	char name[256];
	if (!t->at) {
		t->n = vps_model_num_tensors(t->m);
		t->at = vps_malloc(((size_t)t->n + 1) * sizeof(*t->at));
		if (!t->at)
			return VPS_ENOMEM;
		for (uint32_t i = 0; i < t->n; i++)
			t->at[i] = -1;
	}
	if (id >= t->n || t->at[id] < 0) {
		VPS_CHECK(vps_model_tensor(t->m, id, &ten));
		size_t k = vps_tensor_name(&ten, name, sizeof(name));
		k = k < sizeof(name) ? k : sizeof(name) - 1;
		if (t->len + k + 1 > INT32_MAX)
			return vps_fail(VPS_EINPUT, "model %s: tensor names too long", t->m->name);
		VPS_CHECK(VPS_GROW(t->buf, t->cap, t->len + k + 1));
		memcpy(t->buf + t->len, name, k + 1);
		t->at[id] = (int32_t)t->len;
		t->len += k + 1;
	}
	*out = t->buf + t->at[id];
	return VPS_OK;
}

static vps_result_t write_piece_named(struct vps_writer *w, const char *name, const struct vps_piece *p)
{
	VPS_CHECK(vps_w_map_begin(w, NULL));
	VPS_CHECK(vps_w_int(w, "src", p->src));
	VPS_CHECK(vps_w_int(w, "dst", p->dst));
	VPS_CHECK(vps_w_str(w, "tensor", name));
	VPS_CHECK(vps_w_str(w, "state", vps_state_name(p->state)));
	VPS_CHECK(vps_box_write(w, "box", &p->box));
	VPS_CHECK(vps_w_int(w, "src_buffer", p->src_buffer));
	VPS_CHECK(vps_w_int(w, "src_offset", p->src_offset));
	VPS_CHECK(write_strides(w, "src_strides", p->src_strides, p->box.ndim));
	VPS_CHECK(vps_w_int(w, "dst_buffer", p->dst_buffer));
	VPS_CHECK(vps_w_int(w, "dst_offset", p->dst_offset));
	VPS_CHECK(write_strides(w, "dst_strides", p->dst_strides, p->box.ndim));
	return vps_w_map_end(w);
}

static vps_result_t write_piece(struct vps_writer *w, const struct vps_model *m, const struct vps_piece *p)
{
	struct vps_tensor t;
	char name[256];
	VPS_CHECK(vps_model_tensor(m, p->tensor, &t));
	vps_tensor_name(&t, name, sizeof(name));
	return write_piece_named(w, name, p);
}

static vps_result_t read_strides(struct vps_reader *r, const char *key, int64_t *s, int n)
{
	uint64_t k;
	VPS_CHECK(vps_r_seq_begin(r, key, &k));
	if (k != (uint64_t)n)
		return vps_r_error(r, key, "one stride per axis of the box");
	for (int i = 0; i < n; i++)
		VPS_CHECK(vps_r_int(r, NULL, &s[i], -VPS_MAX_ELEMENTS, VPS_MAX_ELEMENTS));
	return vps_r_seq_end(r);
}

int64_t vps_plan_side_elements(const struct vps_plan *p, bool source, int64_t wr, uint32_t buffer)
{
	/* a transit area is sized by what lands in it (vps_plan_transit_bytes),
	 * which a rank's plan holds only for its own */
	if (buffer == VPS_BUFFER_TRANSIT)
		return source ? -2 : -1;
	int64_t rank = source ? vps_world_a_rank(p->world, wr) : vps_world_b_rank(p->world, wr);
	if (rank < 0)
		return -1;
	int64_t n = vps_layout_buffer_elements(source ? p->a : p->b, rank, buffer);
	return n < 0 ? -2 : n;
}

/* A model's tensors, each made once: vps_model_tensor rebuilds the model's
 * schema, and a global plan's millions of pieces name a few thousand
 * tensors in no order. */
struct tensors {
	const struct vps_model *m;
	uint32_t n;
	struct vps_tensor *v;
	bool *made;
};

static void tensors_release(struct tensors *c)
{
	free(c->v);
	free(c->made);
}

static vps_result_t tensor_of(struct tensors *c, uint32_t id, const struct vps_tensor **out)
{
	if (!c->v) {
		c->n = vps_model_num_tensors(c->m);
		/* zeroed: a one-rank plan touches the few it names */
		c->v = vps_calloc((size_t)c->n + 1, sizeof(*c->v));
		c->made = vps_calloc((size_t)c->n + 1, sizeof(*c->made));
		if (!c->v || !c->made) {
			tensors_release(c);
			memset(c, 0, sizeof(*c));
			return VPS_ENOMEM;
		}
	}
	if (id >= c->n)
		return vps_fail(VPS_EINPUT, "model %s: no tensor %u", c->m->name, id);
	if (!c->made[id]) {
		VPS_CHECK(vps_model_tensor(c->m, id, &c->v[id]));
		c->made[id] = true;
	}
	*out = &c->v[id];
	return VPS_OK;
}

/* What pieces name, each name looked up once: a binary reader hands out
 * each name as one interned string, so its address finds it (a YAML
 * reader's names are as many as its pieces: a full table looks them up). */
struct piece_names {
	struct tensors t;
	const char **key; /* open addressing by address, NULL empty */
	uint32_t *id;
	size_t mask, used;
	const char *state_name; /* the last state looked up, NULL first */
	int state;
	const struct vps_tensor *tensor; /* the last piece's */
	const struct vps_layout *a;      /* the source layout: its states' dtypes */
};

static void piece_names_release(struct piece_names *n)
{
	tensors_release(&n->t);
	free(n->key);
	free(n->id);
}

/* The id of the tensor named s (an error for the reader when none is). */
static vps_result_t tensor_named(struct vps_reader *r, struct piece_names *n, const char *s, uint32_t *id)
{
	const struct vps_model *m = n->t.m;
	if (!n->key) {
		size_t size = 64;
		while (size < 4 * (size_t)vps_model_num_tensors(m))
			size *= 2;
		n->key = vps_calloc(size, sizeof(*n->key));
		n->id = vps_calloc(size, sizeof(*n->id));
		if (!n->key || !n->id) {
			free(n->key);
			free(n->id);
			n->key = NULL;
			n->id = NULL;
			return VPS_ENOMEM;
		}
		n->mask = size - 1;
	}
	size_t i = vps_mix64((uint64_t)(uintptr_t)s) & n->mask;
	while (n->key[i] && n->key[i] != s)
		i = (i + 1) & n->mask;
	if (n->key[i]) {
		*id = n->id[i];
		return VPS_OK;
	}
	if (vps_model_find_tensor(m, s, id))
		return vps_r_error(r, "tensor", "no tensor '%s' in model %s", s, m->name);
	/* at most half full, so that a search ends */
	if (2 * (n->used + 1) <= n->mask + 1) {
		n->key[i] = s;
		n->id[i] = *id;
		n->used++;
	}
	return VPS_OK;
}

/* Refuse piece i of plan when its views leave the buffers they name; t: its
 * tensor. */
static vps_result_t piece_view_check(struct vps_reader *r, const struct vps_plan *plan, size_t i,
				     const struct vps_piece *p, const struct vps_tensor *t)
{
	int64_t ext[VPS_MAX_DIMS], nel[2];
	char what[64];
	for (int k = 0; k < p->box.ndim; k++)
		ext[k] = p->box.hi[k] - p->box.lo[k];
	for (int side = 0; side < 2; side++) {
		uint32_t buffer = side ? p->dst_buffer : p->src_buffer;
		/* a forward's source is the relay's B buffer */
		bool target = side || (buffer & VPS_BUFFER_TARGET);
		nel[side] = vps_buffer_hop(buffer) < 0 ? -2
			    : vps_plan_side_elements(plan, !target, side ? p->dst : p->src, vps_buffer_index(buffer));
	}
	/* the words that name a piece only for one that fails */
	if (vps_box_ok(&p->box, t) && nel[0] != -2 && nel[1] != -2 &&
	    vps_view_ok(p->box.ndim, ext, p->src_offset, p->src_strides, nel[0]) &&
	    vps_view_ok(p->box.ndim, ext, p->dst_offset, p->dst_strides, nel[1]))
		return VPS_OK;
	snprintf(what, sizeof(what), "piece %zu", i);
	VPS_CHECK(vps_box_check(r, "box", what, &p->box, t));
	for (int side = 0; side < 2; side++) {
		int64_t rank = side ? p->dst : p->src;
		uint32_t buffer = side ? p->dst_buffer : p->src_buffer;
		snprintf(what, sizeof(what), "piece %zu: %s", i, side ? "destination" : "source");
		if (nel[side] == -2)
			return vps_r_error(r, side ? "dst_buffer" : "src_buffer", "%s: rank %" PRId64 " has no buffer %u", what,
					   rank, buffer);
		VPS_CHECK(vps_view_check(r, side ? "dst_strides" : "src_strides", what, p->box.ndim, ext,
					 side ? p->dst_offset : p->src_offset, side ? p->dst_strides : p->src_strides, buffer,
					 nel[side]));
	}
	return VPS_OK;
}

/* Reads a piece's mapping up to its end (the caller ends it, after
 * piece_view_check, so that messages point into it); names->tensor is
 * then its tensor. */
static vps_result_t piece_read(struct vps_reader *r, struct piece_names *names, int64_t world, struct vps_piece *p)
{
	const char *s;
	int64_t x;
	memset(p, 0, sizeof(*p));
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK(vps_r_int(r, "src", &p->src, 0, world - 1));
	VPS_CHECK(vps_r_int(r, "dst", &p->dst, 0, world - 1));
	VPS_CHECK(vps_r_str(r, "tensor", &s));
	VPS_CHECK(tensor_named(r, names, s, &p->tensor));
	VPS_CHECK(tensor_of(&names->t, p->tensor, &names->tensor));
	VPS_CHECK(vps_r_str(r, "state", &s));
	if (s != names->state_name) {
		names->state_name = NULL;
		if (vps_state_parse(s, &names->state))
			return vps_r_error(r, "state", "unknown state '%s'", s);
		names->state_name = s;
	}
	p->state = (uint8_t)names->state;
	p->dtype = vps_dtype_field(vps_layout_state_dtype(names->a, p->state));
	VPS_CHECK(vps_box_read(r, "box", &p->box));
	if (p->box.ndim != names->tensor->ndim)
		return vps_r_error(r, "box", "%d axes, but the tensor has %d", p->box.ndim, names->tensor->ndim);
	VPS_CHECK(vps_r_int(r, "src_buffer", &x, 0, UINT32_MAX));
	p->src_buffer = (uint32_t)x;
	VPS_CHECK(vps_r_int(r, "src_offset", &p->src_offset, 0, VPS_MAX_ELEMENTS));
	VPS_CHECK(read_strides(r, "src_strides", p->src_strides, p->box.ndim));
	VPS_CHECK(vps_r_int(r, "dst_buffer", &x, 0, UINT32_MAX));
	p->dst_buffer = (uint32_t)x;
	VPS_CHECK(vps_r_int(r, "dst_offset", &p->dst_offset, 0, VPS_MAX_ELEMENTS));
	VPS_CHECK(read_strides(r, "dst_strides", p->dst_strides, p->box.ndim));
	return VPS_OK;
}

vps_result_t vps_piece_write(struct vps_writer *w, const struct vps_model *m, const struct vps_piece *p)
{
	return write_piece(w, m, p);
}

/* ---- a packed plan's pieces, written by threads ---- */

/* Blocks written ahead of the one being compressed, per thread. */
#define PARTS_AHEAD 4
#define WRITE_THREADS_MAX 64

struct wpart {
	struct vps_bytes b;
	vps_result_t rc;
	bool ready;
	char err[512];
};

struct wjob {
	const struct vps_plan *p;
	size_t n, next, taken, ahead;
	bool stop;
	struct wpart *parts;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static vps_result_t write_block(struct vps_writer *w, struct names *names, const struct vps_packed_block *bl)
{
	struct vps_packed one = {.v = (struct vps_packed_block *)bl, .n = 1, .cap = 1};
	struct vps_plan view = {.packed = &one};
	struct vps_piece_iter it;
	const struct vps_piece *x;
	vps_piece_iter_init(&it, &view);
	while ((x = vps_piece_iter_next(&it))) {
		const char *name = "";
		VPS_CHECK(tensor_name(names, x->tensor, &name));
		VPS_CHECK(write_piece_named(w, name, x));
	}
	return VPS_OK;
}

static void *write_worker(void *arg)
{
	struct wjob *j = arg;
	struct names names = {.m = vps_layout_model(j->p->a)};
	struct vps_writer *w = NULL;
	vps_result_t wrc = vps_writer_new_part(&w);
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (!j->stop && j->next < j->n && j->next >= j->taken + j->ahead)
			pthread_cond_wait(&j->cv, &j->mu);
		if (j->stop || j->next >= j->n)
			break;
		struct wpart *part = &j->parts[j->next];
		const struct vps_packed_block *bl = &j->p->packed->v[j->next];
		j->next++;
		pthread_mutex_unlock(&j->mu);
		vps_clear_error();
		vps_result_t rc = wrc ? wrc : write_block(w, &names, bl);
		if (!rc)
			vps_writer_take(w, &part->b);
		else
			snprintf(part->err, sizeof(part->err), "%s", wrc ? "out of memory" : vps_last_error());
		pthread_mutex_lock(&j->mu);
		part->rc = rc;
		part->ready = true;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	vps_writer_free(w);
	names_release(&names);
	return NULL;
}

/* The pieces of a packed plan into w, in order: threads write blocks, this
 * one appends them (and the streaming writer compresses them). false: no
 * thread could be started, write them here. */
static vps_result_t write_packed(struct vps_writer *w, const struct vps_plan *p, bool *done)
{
	int threads = get_nprocs();
	threads = threads > WRITE_THREADS_MAX ? WRITE_THREADS_MAX : threads;
	*done = false;
	if (threads < 2 || p->packed->n < 2)
		return VPS_OK;
	struct wjob j = {.p = p, .n = p->packed->n, .ahead = (size_t)PARTS_AHEAD * (size_t)threads};
	pthread_t tid[WRITE_THREADS_MAX];
	int started = 0;
	j.parts = vps_calloc(j.n, sizeof(*j.parts));
	if (!j.parts)
		return VPS_ENOMEM;
	pthread_mutex_init(&j.mu, NULL);
	pthread_cond_init(&j.cv, NULL);
	for (int t = 0; t < threads; t++)
		if (!pthread_create(&tid[started], NULL, write_worker, &j))
			started++;
	vps_result_t rc = VPS_OK;
	for (size_t k = 0; started && k < j.n && !rc; k++) {
		struct wpart *part = &j.parts[k];
		pthread_mutex_lock(&j.mu);
		while (!part->ready)
			pthread_cond_wait(&j.cv, &j.mu);
		pthread_mutex_unlock(&j.mu);
		rc = part->rc ? vps_fail(part->rc, "%s", part->err) : vps_w_raw(w, part->b.data, part->b.len);
		vps_bytes_release(&part->b);
		pthread_mutex_lock(&j.mu);
		j.taken = k + 1;
		j.stop = rc != VPS_OK;
		pthread_cond_broadcast(&j.cv);
		pthread_mutex_unlock(&j.mu);
	}
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
	for (size_t k = 0; k < j.n; k++)
		vps_bytes_release(&j.parts[k].b);
	free(j.parts);
	pthread_mutex_destroy(&j.mu);
	pthread_cond_destroy(&j.cv);
	*done = started > 0;
	return rc;
}

/* Binary bytes of one piece of each (tensor, state): a piece's fields are
 * fixed-width but for its names and its number of axes, which the tensor
 * fixes. The streaming writer checks the total it is told. */
struct sizes {
	uint32_t *bytes; /* 0: not measured */
	uint8_t *ndim;
	size_t n;
};

/* The lost A ranks and the ranges no piece fills (vps-plan --lost). */
static vps_result_t write_lost(struct vps_writer *w, const struct vps_model *m, const struct vps_lost *l)
{
	/* YAML only when something was lost: plans from before --lost, and
	 * hand-written ones, have no such key */
	if (!l->nranks && vps_writer_is_yaml(w))
		return VPS_OK;
	VPS_CHECK(vps_w_map_begin(w, "lost"));
	VPS_CHECK(vps_w_seq_begin(w, "ranks", l->nranks, true));
	for (size_t i = 0; i < l->nranks; i++)
		VPS_CHECK(vps_w_int(w, NULL, l->ranks[i]));
	VPS_CHECK(vps_w_seq_end(w));
	VPS_CHECK(vps_w_seq_begin(w, "ranges", l->nranges, false));
	for (size_t i = 0; i < l->nranges; i++) {
		const struct vps_lost_range *x = &l->ranges[i];
		struct vps_tensor t;
		char name[256];
		VPS_CHECK(vps_model_tensor(m, x->tensor, &t));
		vps_tensor_name(&t, name, sizeof(name));
		VPS_CHECK(vps_w_map_begin(w, NULL));
		VPS_CHECK(vps_w_str(w, "tensor", name));
		VPS_CHECK(vps_w_str(w, "state", vps_state_name(x->state)));
		VPS_CHECK(vps_box_write(w, "box", &x->box));
		VPS_CHECK(vps_w_map_end(w));
	}
	VPS_CHECK(vps_w_seq_end(w));
	return vps_w_map_end(w);
}

static vps_result_t read_lost_map(struct vps_reader *r, const struct vps_plan *p, struct vps_lost *l);

/* The relay mode a plan was made with (enum vps_relay). YAML: none, as
 * before relays; `relay: true` for ALWAYS, as plans of vps-plan --relay
 * had; `relay: auto`, with the bandwidths its choice weighed when it
 * weighed a topology's. Binary: the mode and both bandwidths (0: bytes);
 * before VPS_FEATURE_RELAY_MODE, a bool (ALWAYS or NEVER). */
static vps_result_t write_relay(struct vps_writer *w, const struct vps_plan *p)
{
	if (!vps_writer_is_yaml(w)) {
		VPS_CHECK(vps_w_int(w, "relay", p->relay));
		VPS_CHECK(vps_w_double(w, "relay_intra_node_bandwidth", p->relay_intra_bandwidth));
		return vps_w_double(w, "relay_inter_node_bandwidth", p->relay_inter_bandwidth);
	}
	if (p->relay == VPS_RELAY_ALWAYS)
		return vps_w_bool(w, "relay", true);
	if (p->relay != VPS_RELAY_AUTO)
		return VPS_OK;
	VPS_CHECK(vps_w_str(w, "relay", "auto"));
	if (!(p->relay_intra_bandwidth > 0))
		return VPS_OK;
	VPS_CHECK(vps_w_double(w, "relay_intra_node_bandwidth", p->relay_intra_bandwidth));
	return vps_w_double(w, "relay_inter_node_bandwidth", p->relay_inter_bandwidth);
}

/* write_relay's fields; an echo gets them as write_relay writes them. */
static vps_result_t read_relay(struct vps_reader *r, struct vps_plan *p)
{
	struct vps_writer *echo = vps_reader_echo_writer(r);
	vps_result_t rc = VPS_OK;
	vps_reader_echo(r, NULL);
	p->relay = VPS_RELAY_NEVER;
	p->relay_intra_bandwidth = p->relay_inter_bandwidth = 0;
	if (vps_reader_is_binary(r) && !vps_reader_has(r, VPS_FEATURE_RELAY_MODE)) {
		/* written before relay modes: relayed or not */
		bool relayed;
		rc = vps_r_bool(r, "relay", &relayed);
		p->relay = !rc && relayed ? VPS_RELAY_ALWAYS : VPS_RELAY_NEVER;
	} else if (vps_reader_is_binary(r)) {
		int64_t mode;
		rc = vps_r_int(r, "relay", &mode, VPS_RELAY_NEVER, VPS_RELAY_AUTO);
		p->relay = (uint8_t)(rc ? 0 : mode);
		if (!rc)
			rc = vps_r_double(r, "relay_intra_node_bandwidth", &p->relay_intra_bandwidth);
		if (!rc)
			rc = vps_r_double(r, "relay_inter_node_bandwidth", &p->relay_inter_bandwidth);
	} else if (vps_r_has(r, "relay")) {
		const char *mode;
		rc = vps_r_str(r, "relay", &mode);
		if (!rc && !strcmp(mode, "auto"))
			p->relay = VPS_RELAY_AUTO;
		else if (!rc && !strcmp(mode, "true"))
			p->relay = VPS_RELAY_ALWAYS;
		else if (!rc && strcmp(mode, "false"))
			rc = vps_r_error(r, "relay", "'%s' is none of true, false and auto", mode);
		bool weighed = vps_r_has(r, "relay_intra_node_bandwidth") || vps_r_has(r, "relay_inter_node_bandwidth");
		if (!rc && weighed && p->relay != VPS_RELAY_AUTO)
			rc = vps_r_error(r, "relay", "only relay: auto weighs bandwidths");
		if (!rc && weighed)
			rc = vps_r_double(r, "relay_intra_node_bandwidth", &p->relay_intra_bandwidth);
		if (!rc && weighed)
			rc = vps_r_double(r, "relay_inter_node_bandwidth", &p->relay_inter_bandwidth);
	}
	/* both or neither, and positive where given */
	bool some = p->relay_intra_bandwidth != 0 || p->relay_inter_bandwidth != 0;
	if (!rc && some && (p->relay != VPS_RELAY_AUTO || !(p->relay_intra_bandwidth > 0) || !(p->relay_inter_bandwidth > 0)))
		rc = vps_r_error(r, "relay", "relay bandwidths must both be positive, and only with relay: auto");
	vps_reader_echo(r, echo);
	return !rc && echo ? write_relay(echo, p) : rc;
}

static vps_result_t read_lost(struct vps_reader *r, const struct vps_plan *p, struct vps_lost *l)
{
	/* the echo (vps-show) gets the map as write_lost words it, sparse in YAML */
	struct vps_writer *echo = vps_reader_echo_writer(r);
	vps_result_t rc = VPS_OK;
	if (vps_reader_is_binary(r) || vps_r_has(r, "lost")) {
		vps_reader_echo(r, NULL);
		rc = read_lost_map(r, p, l);
		vps_reader_echo(r, echo);
	}
	return !rc && echo ? write_lost(echo, vps_layout_model(p->a), l) : rc;
}

static vps_result_t read_lost_map(struct vps_reader *r, const struct vps_plan *p, struct vps_lost *l)
{
	const struct vps_model *m = vps_layout_model(p->a);
	int64_t wa = vps_layout_world(p->a);
	size_t cap = 0;
	uint64_t n;
	VPS_CHECK(vps_r_map_begin(r, "lost"));
	VPS_CHECK(vps_r_seq_begin(r, "ranks", &n));
	if (n >= (uint64_t)wa)
		return vps_r_error(r, "ranks", "%" PRIu64 " lost ranks, but the source has %" PRId64 ": none would survive",
				   n, wa);
	l->ranks = vps_malloc((size_t)n * sizeof(*l->ranks) + 1);
	if (!l->ranks)
		return VPS_ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		int64_t x;
		VPS_CHECK(vps_r_int(r, NULL, &x, 0, wa - 1));
		if (l->nranks && x <= l->ranks[l->nranks - 1])
			return vps_r_error(r, "ranks", "not ascending and distinct at %" PRId64, x);
		if (vps_world_b_rank(p->world, x) >= 0)
			return vps_r_error(r, "ranks", "rank %" PRId64 " is lost but the target places a rank on its device", x);
		l->ranks[l->nranks++] = x;
	}
	VPS_CHECK(vps_r_seq_end(r));
	VPS_CHECK(vps_r_seq_begin(r, "ranges", &n));
	if (n && !l->nranks)
		return vps_r_error(r, "ranges", "lost ranges with no lost rank");
	for (uint64_t i = 0; i < n; i++) {
		struct vps_lost_range x;
		struct vps_tensor t;
		const char *s;
		int st;
		char what[48];
		VPS_CHECK(vps_r_map_begin(r, NULL));
		VPS_CHECK(vps_r_str(r, "tensor", &s));
		if (vps_model_find_tensor(m, s, &x.tensor))
			return vps_r_error(r, "tensor", "no tensor '%s' in model %s", s, m->name);
		VPS_CHECK(vps_r_str(r, "state", &s));
		VPS_CHECK(vps_model_tensor(m, x.tensor, &t));
		if (vps_state_parse(s, &st) || !vps_layout_tensor_has_state(p->a, &t, st))
			return vps_r_error(r, "state", "'%s' is not a state of this tensor in the source", s);
		x.state = (uint8_t)st;
		x.dtype = vps_dtype_field(vps_layout_state_dtype(p->a, st));
		VPS_CHECK(vps_box_read(r, "box", &x.box));
		snprintf(what, sizeof(what), "lost range %" PRIu64, i);
		VPS_CHECK(vps_box_check(r, "box", what, &x.box, &t));
		VPS_CHECK(vps_r_map_end(r));
		VPS_CHECK(VPS_GROW(l->ranges, cap, l->nranges + 1));
		l->ranges[l->nranges++] = x;
	}
	VPS_CHECK(vps_r_seq_end(r));
	return vps_r_map_end(r);
}

/* Write the body; counted (a counting writer): measure one piece of each
 * (tensor, state) and add the others' bytes to *counted instead. */
static vps_result_t write_body(struct vps_writer *w, const struct vps_plan *p, uint64_t hash, uint64_t *counted)
{
	const struct vps_model *m = vps_layout_model(p->a);
	struct names names = {.m = m};
	struct sizes sz = {0};
	vps_result_t rc = VPS_OK;
	if (counted) {
		sz.n = (size_t)vps_model_num_tensors(m) * VPS_NSTATES;
		sz.bytes = vps_calloc(sz.n + 1, sizeof(*sz.bytes));
		sz.ndim = vps_calloc(sz.n + 1, sizeof(*sz.ndim));
		if (!sz.bytes || !sz.ndim) {
			free(sz.bytes);
			free(sz.ndim);
			return VPS_ENOMEM;
		}
	}
	VPS_CHECK(vps_w_u64hex(w, "hash", hash));
	VPS_CHECK(vps_w_int(w, "scope", p->scope));
	VPS_CHECK(vps_w_int(w, "world", vps_world_size(p->world)));
	VPS_CHECK(vps_w_map_begin(w, "source"));
	VPS_CHECK(vps_layout_write(w, p->a, NULL, 0));
	VPS_CHECK(vps_w_map_end(w));
	VPS_CHECK(vps_w_map_begin(w, "target"));
	VPS_CHECK(vps_layout_write(w, p->b, NULL, 0));
	VPS_CHECK(vps_w_map_end(w));
	VPS_CHECK(vps_training_write(w, "training", &p->train));
	VPS_CHECK(vps_w_seq_begin(w, "pieces", p->npieces, false));
	struct vps_piece_iter it;
	const struct vps_piece *x;
	bool written = false;
	if (!counted && p->packed && !vps_writer_is_yaml(w))
		rc = write_packed(w, p, &written);
	vps_piece_iter_init(&it, p);
	while (!rc && !written && (x = vps_piece_iter_next(&it))) {
		const char *name = "";
		size_t k = (size_t)x->tensor * VPS_NSTATES + x->state;
		if (counted && k < sz.n && sz.bytes[k] && sz.ndim[k] == x->box.ndim) {
			*counted += sz.bytes[k];
			continue;
		}
		uint64_t before = vps_writer_count(w);
		rc = tensor_name(&names, x->tensor, &name);
		if (!rc)
			rc = write_piece_named(w, name, x);
		if (!rc && counted && k < sz.n && vps_writer_count(w) - before <= UINT32_MAX) {
			sz.bytes[k] = (uint32_t)(vps_writer_count(w) - before);
			sz.ndim[k] = (uint8_t)x->box.ndim;
		}
	}
	names_release(&names);
	free(sz.bytes);
	free(sz.ndim);
	VPS_CHECK(rc);
	VPS_CHECK(vps_w_seq_end(w));
	VPS_CHECK(vps_w_seq_begin(w, "collectives", p->ncolls, false));
	for (size_t i = 0; i < p->ncolls; i++) {
		const struct vps_collective *c = &p->colls[i];
		struct vps_tensor t;
		char name[256];
		VPS_CHECK(vps_model_tensor(m, c->tensor, &t));
		vps_tensor_name(&t, name, sizeof(name));
		VPS_CHECK(vps_w_map_begin(w, NULL));
		VPS_CHECK(vps_w_str(w, "tensor", name));
		VPS_CHECK(vps_w_str(w, "state", vps_state_name(c->state)));
		VPS_CHECK(vps_w_str(w, "kind", vps_collective_name(c->kind)));
		VPS_CHECK(vps_w_int(w, "root", c->root));
		VPS_CHECK(vps_w_int(w, "peers", c->peers));
		VPS_CHECK(vps_w_int(w, "bytes", c->bytes));
		VPS_CHECK(vps_w_map_end(w));
	}
	VPS_CHECK(vps_w_seq_end(w));
	VPS_CHECK(write_lost(w, m, &p->lost));
	return write_relay(w, p);
}

vps_result_t vps_plan_write_body(struct vps_writer *w, const struct vps_plan *p)
{
	return write_body(w, p, vps_plan_hash(p), NULL);
}

vps_result_t vps_plan_count_body(struct vps_writer *w, const struct vps_plan *p, uint64_t *more)
{
	return write_body(w, p, 0, more);
}

/* Binary plans are measured, then compressed as they are written: a global
 * plan's payload is about 300 bytes a piece (1.3 GB at 16,384 ranks), its
 * file a tenth of that. */
vps_result_t vps_plan_serialize(const struct vps_plan *p, bool yaml, struct vps_bytes *out)
{
	struct vps_writer *w;
	vps_result_t rc;
	if (yaml) {
		VPS_CHECK(vps_writer_new(&w, VPS_DOC_PLAN, true));
		rc = write_body(w, p, vps_plan_hash(p), NULL);
	} else {
		uint64_t more = 0;
		VPS_CHECK(vps_writer_new_counting(&w, VPS_DOC_PLAN));
		rc = write_body(w, p, 0, &more);
		uint64_t n = vps_writer_count(w) + more;
		vps_writer_free(w);
		w = NULL;
		if (!rc)
			rc = vps_writer_new_streaming(&w, VPS_DOC_PLAN, n);
		if (!rc)
			rc = write_body(w, p, vps_plan_hash(p), NULL);
	}
	if (!rc)
		rc = vps_writer_finish(w, out);
	vps_writer_free(w);
	return rc;
}

/* Pieces read into packed blocks of this many: a block packs against the
 * piece before it, so any size works; this keeps a block's growth cheap. */
#define READ_BLOCK_PIECES 65536

static vps_result_t read_piece_packed(struct vps_plan *p, const struct vps_piece *x, struct vps_piece *prev)
{
	struct vps_packed *pk = p->packed;
	if (!pk->n || pk->v[pk->n - 1].npieces >= READ_BLOCK_PIECES) {
		VPS_CHECK(vps_grow((void **)&pk->v, &pk->cap, pk->n + 1, sizeof(*pk->v)));
		memset(&pk->v[pk->n++], 0, sizeof(*pk->v));
		memset(prev, 0, sizeof(*prev));
	}
	VPS_CHECK(vps_pack_piece(&pk->v[pk->n - 1], prev, x));
	*prev = *x;
	return VPS_OK;
}

vps_result_t vps_plan_read_body(struct vps_reader *r, struct vps_plan **out, uint64_t *stored_hash)
{
	return vps_plan_read_body_as(r, out, stored_hash, false);
}

/* A compact plan's pieces as they are read: each checked against its
 * buffers, packed and hashed, in order. */
struct packing {
	struct vps_piece prev;
	struct tensors t;
	size_t index;
	uint64_t hash;
};

static vps_result_t pack_checked(struct vps_reader *r, struct vps_plan *p, struct packing *k,
				 const struct vps_piece *x)
{
	const struct vps_tensor *t;
	VPS_CHECK(tensor_of(&k->t, x->tensor, &t));
	VPS_CHECK(piece_view_check(r, p, k->index, x, t));
	VPS_CHECK(read_piece_packed(p, x, &k->prev));
	k->hash = vps_piece_hash(x, k->hash);
	k->index++;
	return VPS_OK;
}

/* ---- a binary plan's pieces checked, packed and hashed by a second
 * thread while this one decompresses and parses the next (about half the
 * work each) ---- */

#define CHECK_BATCH_PIECES 4096
#define CHECK_BATCHES 8

struct check_job {
	struct vps_reader *r;
	struct vps_plan *p;
	struct packing k;
	struct vps_piece *ring;       /* CHECK_BATCHES batches of CHECK_BATCH_PIECES */
	size_t count[CHECK_BATCHES];
	uint64_t filled, taken;       /* batches handed over, and done with */
	bool done;                    /* no more will come */
	vps_result_t rc;              /* the first piece refused, and why */
	char err[1024];
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void *check_worker(void *arg)
{
	struct check_job *j = arg;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (j->taken == j->filled && !j->done)
			pthread_cond_wait(&j->cv, &j->mu);
		if (j->taken == j->filled)
			break;
		size_t slot = (size_t)(j->taken % CHECK_BATCHES), n = j->count[slot];
		pthread_mutex_unlock(&j->mu);
		const struct vps_piece *v = &j->ring[slot * CHECK_BATCH_PIECES];
		vps_result_t rc = VPS_OK;
		vps_clear_error();
		for (size_t i = 0; i < n && !rc; i++)
			rc = pack_checked(j->r, j->p, &j->k, &v[i]);
		pthread_mutex_lock(&j->mu);
		j->taken++;
		if (rc) {
			j->rc = rc;
			snprintf(j->err, sizeof(j->err), "%s", vps_last_error());
		}
		pthread_cond_broadcast(&j->cv);
		if (rc)
			break;
	}
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

/* Where the next batch is to be filled, once the checker has room for it;
 * NULL once the checker refused a piece. */
static struct vps_piece *check_room(struct check_job *j)
{
	pthread_mutex_lock(&j->mu);
	while (!j->rc && j->filled - j->taken >= CHECK_BATCHES)
		pthread_cond_wait(&j->cv, &j->mu);
	bool refused = j->rc != VPS_OK;
	pthread_mutex_unlock(&j->mu);
	return refused ? NULL : &j->ring[(size_t)(j->filled % CHECK_BATCHES) * CHECK_BATCH_PIECES];
}

static void check_hand_over(struct check_job *j, size_t n, bool last)
{
	pthread_mutex_lock(&j->mu);
	if (n)
		j->count[j->filled++ % CHECK_BATCHES] = n;
	j->done = last;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

/* n pieces into p->packed, checked, packed and hashed into k here or, j
 * not NULL, by j's thread (started; its own packing). */
static vps_result_t read_pieces_packed(struct vps_reader *r, struct vps_plan *p, int64_t world, uint64_t n,
				       struct packing *k, struct check_job *j)
{
	struct piece_names names = {.t.m = vps_layout_model(p->a), .a = p->a};
	struct vps_piece one, *batch = NULL;
	size_t filled = 0;
	vps_result_t rc = VPS_OK;
	for (uint64_t i = 0; i < n && !rc; i++) {
		if (j && !filled && !(batch = check_room(j)))
			break;
		struct vps_piece *x = j ? &batch[filled] : &one;
		rc = piece_read(r, &names, world, x);
		/* the messages of a binary document name no place in it: its
		 * pieces are checked after their mapping ends */
		if (!rc && !j)
			rc = pack_checked(r, p, k, x);
		if (!rc)
			rc = vps_r_map_end(r);
		if (rc)
			break;
		p->npieces++;
		if (j && ++filled == CHECK_BATCH_PIECES) {
			check_hand_over(j, filled, false);
			filled = 0;
		}
	}
	/* what was read is checked even after a failure here: a piece
	 * refused before it is the first failure */
	if (j)
		check_hand_over(j, filled, true);
	piece_names_release(&names);
	return rc;
}

/* The pieces of a plan whose layouts are read. compact (a global plan read
 * to be staged or counted) keeps them packed, about 25 bytes a piece, not
 * 184, and hashes them as they are read: packed pieces never change. */
static vps_result_t read_pieces(struct vps_reader *r, struct vps_plan *p, int64_t world, bool compact)
{
	uint64_t n;
	VPS_CHECK(vps_r_seq_begin(r, "pieces", &n));
	if (compact)
		p->packed = vps_calloc(1, sizeof(*p->packed));
	else
		p->pieces = vps_malloc((size_t)n * sizeof(*p->pieces) + 1);
	if (compact ? !p->packed : !p->pieces)
		return VPS_ENOMEM;
	if (!compact) {
		struct piece_names names = {.t.m = vps_layout_model(p->a), .a = p->a};
		vps_result_t rc = VPS_OK;
		for (uint64_t i = 0; i < n && !rc; i++) {
			struct vps_piece *x = &p->pieces[i];
			rc = piece_read(r, &names, world, x);
			if (!rc)
				rc = piece_view_check(r, p, (size_t)i, x, names.tensor);
			if (!rc)
				rc = vps_r_map_end(r);
			if (!rc)
				p->npieces++;
		}
		piece_names_release(&names);
		return rc ? rc : vps_r_seq_end(r);
	}
	struct packing k = {.t.m = vps_layout_model(p->a), .hash = vps_plan_hash_start(p)};
	struct check_job j = {.r = r, .p = p, .k = k};
	pthread_t tid;
	bool threaded = false;
	/* YAML messages name lines, which the reader moves past; an echo
	 * writes as it reads */
	if (vps_reader_is_binary(r) && !vps_reader_echo_writer(r) && n > CHECK_BATCH_PIECES && get_nprocs() > 1 &&
	    (j.ring = vps_malloc((size_t)CHECK_BATCHES * CHECK_BATCH_PIECES * sizeof(*j.ring)))) {
		pthread_mutex_init(&j.mu, NULL);
		pthread_cond_init(&j.cv, NULL);
		threaded = !pthread_create(&tid, NULL, check_worker, &j);
		if (!threaded) {
			pthread_mutex_destroy(&j.mu);
			pthread_cond_destroy(&j.cv);
		}
	}
	vps_result_t rc = read_pieces_packed(r, p, world, n, &k, threaded ? &j : NULL);
	if (threaded) {
		pthread_join(tid, NULL);
		pthread_mutex_destroy(&j.mu);
		pthread_cond_destroy(&j.cv);
		k = j.k;
		if (j.rc)
			rc = vps_fail(j.rc, "%s", j.err);
	}
	free(j.ring);
	tensors_release(&k.t);
	VPS_CHECK(rc);
	p->packed->hashed = true;
	p->packed->hash = k.hash;
	return vps_r_seq_end(r);
}

static vps_result_t read_collective(struct vps_reader *r, const struct vps_plan *p, int64_t world,
				    struct vps_collective *c)
{
	const char *s;
	int st;
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK(vps_r_str(r, "tensor", &s));
	if (vps_model_find_tensor(vps_layout_model(p->a), s, &c->tensor))
		return vps_r_error(r, "tensor", "no tensor '%s'", s);
	VPS_CHECK(vps_r_str(r, "state", &s));
	if (vps_state_parse(s, &st))
		return vps_r_error(r, "state", "unknown state '%s'", s);
	c->state = (uint8_t)st;
	VPS_CHECK(vps_r_str(r, "kind", &s));
	c->kind = 255;
	for (int k = 0; k < 3; k++)
		if (!strcmp(s, vps_collective_name(k)))
			c->kind = (uint8_t)k;
	if (c->kind == 255)
		return vps_r_error(r, "kind", "expected broadcast, scatter or gather, not '%s'", s);
	VPS_CHECK(vps_r_int(r, "root", &c->root, 0, world - 1));
	VPS_CHECK(vps_r_int(r, "peers", &c->peers, 0, world));
	VPS_CHECK(vps_r_int(r, "bytes", &c->bytes, 0, VPS_MAX_ELEMENTS * 8));
	return vps_r_map_end(r);
}

static vps_result_t read_collectives(struct vps_reader *r, struct vps_plan *p, int64_t world)
{
	uint64_t n;
	VPS_CHECK(vps_r_seq_begin(r, "collectives", &n));
	p->colls = vps_calloc((size_t)n + 1, sizeof(*p->colls));
	if (!p->colls)
		return VPS_ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		VPS_CHECK(read_collective(r, p, world, &p->colls[i]));
		p->ncolls++;
	}
	return vps_r_seq_end(r);
}

vps_result_t vps_plan_read_body_as(struct vps_reader *r, struct vps_plan **out, uint64_t *stored_hash, bool compact)
{
	vps_result_t rc;
	int64_t world;
	struct vps_plan *p = vps_calloc(1, sizeof(*p));
	if (!p)
		return VPS_ENOMEM;
	VPS_CHECK_GOTO(vps_r_u64hex(r, "hash", stored_hash), rc, fail);
	if (!*stored_hash) {
		/* 0 would mean "computed here, nothing to check": no hash is 0 */
		rc = vps_r_error(r, "hash", "0 is not the hash of any plan");
		goto fail;
	}
	VPS_CHECK_GOTO(vps_r_int(r, "scope", &p->scope, -1, INT64_MAX), rc, fail);
	VPS_CHECK_GOTO(vps_r_int(r, "world", &world, 1, INT64_MAX), rc, fail);
	VPS_CHECK_GOTO(vps_r_map_begin(r, "source"), rc, fail);
	VPS_CHECK_GOTO(vps_layout_read(r, &p->a), rc, fail);
	VPS_CHECK_GOTO(vps_r_map_end(r), rc, fail);
	VPS_CHECK_GOTO(vps_r_map_begin(r, "target"), rc, fail);
	VPS_CHECK_GOTO(vps_layout_read(r, &p->b), rc, fail);
	VPS_CHECK_GOTO(vps_r_map_end(r), rc, fail);
	VPS_CHECK_GOTO(vps_world_new(&p->world, p->a, p->b), rc, fail);
	if (vps_world_size(p->world) != world || p->scope >= world) {
		rc = vps_r_error(r, "world", "%" PRId64 " does not match the layouts' transition world of %" PRId64, world,
				 vps_world_size(p->world));
		goto fail;
	}
	VPS_CHECK_GOTO(vps_training_read(r, "training", &p->train), rc, fail);
	/* a one-rank plan is small either way */
	VPS_CHECK_GOTO(read_pieces(r, p, world, compact && p->scope < 0), rc, fail);
	VPS_CHECK_GOTO(read_collectives(r, p, world), rc, fail);
	VPS_CHECK_GOTO(read_lost(r, p, &p->lost), rc, fail);
	VPS_CHECK_GOTO(read_relay(r, p), rc, fail);
	*out = p;
	return VPS_OK;
fail:
	vps_plan_free(p);
	return rc;
}

vps_result_t vps_plan_parse(struct vps_plan **out, const char *name, const void *data, size_t len)
{
	return vps_plan_parse_as(out, name, data, len, false);
}

vps_result_t vps_plan_parse_as(struct vps_plan **out, const char *name, const void *data, size_t len, bool compact)
{
	struct vps_reader *r;
	uint64_t stored;
	VPS_CHECK(vps_reader_new(&r, name, data, len, VPS_DOC_PLAN));
	*out = NULL;
	vps_result_t rc = vps_plan_read_body_as(r, out, &stored, compact);
	if (!rc)
		rc = vps_reader_finish(r);
	if (!rc)
		(*out)->file_hash = stored;
	if (rc && *out) {
		vps_plan_free(*out);
		*out = NULL;
	}
	vps_reader_free(r);
	return rc;
}

vps_result_t vps_plan_load(struct vps_plan **out, const char *path)
{
	return vps_plan_load_as(out, path, false);
}

vps_result_t vps_plan_load_as(struct vps_plan **out, const char *path, bool compact)
{
	struct vps_bytes b;
	*out = NULL;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_plan_parse_as(out, path && strcmp(path, "-") ? path : "<stdin>", b.data, b.len, compact);
	vps_bytes_release(&b);
	return rc;
}

vps_result_t vps_plan_check_hash(const struct vps_plan *p, const char *name)
{
	if (p->file_hash && p->file_hash != vps_plan_hash(p))
		return vps_fail(VPS_EINPUT,
				"%s: the plan states hash 0x%016" PRIx64 " but its content hashes to 0x%016" PRIx64
				" (edited or damaged; vps-verify shows what is wrong)",
				name, p->file_hash, vps_plan_hash(p));
	return VPS_OK;
}
