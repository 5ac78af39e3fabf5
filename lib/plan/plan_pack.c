/* Packed pieces (plan_pack.h). A piece is a flags byte naming the fields
 * that differ from the piece before it, those fields, and then its box and
 * offsets as differences: pieces come sorted by (dst, src, tensor, state,
 * buffer, offset), so most fields repeat and the rest are small. Integers
 * are LEB128, signed ones zigzagged. */
#include "util/internal.h"
#include "plan/plan_pack.h"

enum {
	F_DST = 1,     /* dst differs */
	F_SRC = 2,     /* src differs */
	F_TENSOR = 4,  /* tensor, state or the number of axes differ */
	F_BUFFERS = 8, /* src_buffer or dst_buffer differ */
	F_STRIDES = 16 /* a stride differs */
};

static inline size_t put_u(unsigned char *o, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		o[n++] = (unsigned char)(v | 0x80);
		v >>= 7;
	}
	o[n++] = (unsigned char)v;
	return n;
}

static inline size_t put_s(unsigned char *o, int64_t v)
{
	return put_u(o, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static inline uint64_t get_u(const unsigned char **p)
{
	uint64_t v = 0;
	for (int s = 0;; s += 7) {
		unsigned char c = *(*p)++;
		v |= (uint64_t)(c & 0x7f) << s;
		if (!(c & 0x80))
			return v;
	}
}

static inline int64_t get_s(const unsigned char **p)
{
	uint64_t u = get_u(p);
	return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

/* Differences wrap as unsigned: any two int64 values round-trip. */
static inline int64_t sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

/* Most bytes one piece packs into: a flags byte and 10-byte integers. */
#define PIECE_MAX (1 + 10 * (8 + 6 * VPS_MAX_DIMS))

vps_result_t vps_pack_piece(struct vps_packed_block *b, const struct vps_piece *prev, const struct vps_piece *x)
{
	VPS_CHECK(VPS_GROW(b->data, b->cap, b->len + PIECE_MAX));
	unsigned char *o = b->data + b->len, *f = o++;
	int n = x->box.ndim;
	*f = 0;
	if (x->dst != prev->dst) {
		*f |= F_DST;
		o += put_s(o, sub(x->dst, prev->dst));
	}
	if (x->src != prev->src) {
		*f |= F_SRC;
		o += put_s(o, sub(x->src, prev->src));
	}
	if (x->tensor != prev->tensor || x->state != prev->state || n != prev->box.ndim) {
		*f |= F_TENSOR;
		o += put_u(o, x->tensor);
		*o++ = x->state;
		*o++ = (unsigned char)n;
	}
	if (x->src_buffer != prev->src_buffer || x->dst_buffer != prev->dst_buffer) {
		*f |= F_BUFFERS;
		o += put_u(o, x->src_buffer);
		o += put_u(o, x->dst_buffer);
	}
	if (memcmp(x->src_strides, prev->src_strides, sizeof(x->src_strides)) ||
	    memcmp(x->dst_strides, prev->dst_strides, sizeof(x->dst_strides))) {
		*f |= F_STRIDES;
		for (int a = 0; a < VPS_MAX_DIMS; a++) {
			o += put_s(o, x->src_strides[a]);
			o += put_s(o, x->dst_strides[a]);
		}
	}
	for (int a = 0; a < n; a++) {
		o += put_s(o, sub(x->box.lo[a], a < prev->box.ndim ? prev->box.lo[a] : 0));
		o += put_s(o, sub(x->box.hi[a], x->box.lo[a]));
	}
	o += put_s(o, sub(x->src_offset, prev->src_offset));
	o += put_s(o, sub(x->dst_offset, prev->dst_offset));
	b->len = (size_t)(o - b->data);
	b->npieces++;
	return VPS_OK;
}

/* Decode the piece at *p over cur (the piece before it). */
static void unpack(const unsigned char **p, struct vps_piece *cur)
{
	unsigned char f = *(*p)++;
	int was = cur->box.ndim;
	if (f & F_DST)
		cur->dst = add(cur->dst, get_s(p));
	if (f & F_SRC)
		cur->src = add(cur->src, get_s(p));
	if (f & F_TENSOR) {
		cur->tensor = (uint32_t)get_u(p);
		cur->state = *(*p)++;
		int n = *(*p)++;
		for (int a = n; a < VPS_MAX_DIMS; a++)
			cur->box.lo[a] = cur->box.hi[a] = 0;
		cur->box.ndim = n;
	}
	if (f & F_BUFFERS) {
		cur->src_buffer = (uint32_t)get_u(p);
		cur->dst_buffer = (uint32_t)get_u(p);
	}
	if (f & F_STRIDES)
		for (int a = 0; a < VPS_MAX_DIMS; a++) {
			cur->src_strides[a] = get_s(p);
			cur->dst_strides[a] = get_s(p);
		}
	for (int a = 0; a < cur->box.ndim; a++) {
		cur->box.lo[a] = add(a < was ? cur->box.lo[a] : 0, get_s(p));
		cur->box.hi[a] = add(cur->box.lo[a], get_s(p));
	}
	cur->src_offset = add(cur->src_offset, get_s(p));
	cur->dst_offset = add(cur->dst_offset, get_s(p));
}

void vps_packed_free(struct vps_packed *pk)
{
	if (!pk)
		return;
	for (size_t i = 0; i < pk->n; i++)
		free(pk->v[i].data);
	free(pk->v);
	free(pk);
}

void vps_piece_iter_init(struct vps_piece_iter *it, const struct vps_plan *p)
{
	memset(it, 0, sizeof(*it));
	it->p = p;
}

const struct vps_piece *vps_piece_iter_next(struct vps_piece_iter *it)
{
	const struct vps_plan *p = it->p;
	if (!p->packed)
		return it->i < p->npieces ? &p->pieces[it->i++] : NULL;
	const struct vps_packed *pk = p->packed;
	while (it->block < pk->n && it->pos >= pk->v[it->block].len) {
		it->block++;
		it->pos = 0;
	}
	if (it->block >= pk->n)
		return NULL;
	if (it->pos == 0)
		memset(&it->cur, 0, sizeof(it->cur)); /* a block packs from a zeroed piece */
	const unsigned char *q = pk->v[it->block].data + it->pos;
	unpack(&q, &it->cur);
	/* not packed: the source layout says it (a writer's view of one block
	 * has none, and writes no dtype) */
	it->cur.dtype = p->a ? vps_dtype_field(vps_layout_state_dtype(p->a, it->cur.state)) : 0;
	it->pos = (size_t)(q - pk->v[it->block].data);
	it->i++;
	return &it->cur;
}
