/* The digest kernel's arithmetic (vps_cuda.h's digest), in C that nvcc
 * compiles for the GPU (vps_cuda.cu) and a C compiler for the host: the
 * CUDA stand-in runs the kernel's lanes one after another with it, so that
 * make check holds what each lane reads and sums, its vector loads and its
 * odd ends, to lib/model/data.c's vps_digest_region, which computes the same
 * function element by element (docs/exec.md, The digest).
 *
 * An element's term: k = (block key ^ slot key) | 1, where the block key
 * is vps_mix64(key ^ (block + 1) * 0x9e3779b97f4a7c15), block its logical
 * index >> VPS_DK_BLOCK_BITS, and the slot key vps_mix64((slot + 1) *
 * 0xd1b54a32d192ed03), slot the index's low VPS_DK_BLOCK_BITS bits; then
 * y = (bits ^ 0xffff0000) * k mod 2^64 and the term y ^ (y >> 32). The
 * digest is the sum of the terms mod 2^64. Per element that is two 32-bit
 * multiplies and a few logic operations on a GPU; the slot keys are a
 * table in shared memory and the block key changes every 2048 elements. */
#ifndef VPS_CUDA_DIGEST_H
#define VPS_CUDA_DIGEST_H

#include <stdint.h>
#include <string.h>

#include "vps_cuda.h"

#ifdef __CUDACC__
#define VPS_DK static __host__ __device__ __forceinline__
#else
#define VPS_DK static inline
#endif

enum {
	VPS_DK_BLOCK_BITS = 11,
	VPS_DK_BLOCK = 1 << VPS_DK_BLOCK_BITS,
	VPS_DK_LANES = 32, /* a warp */
	VPS_DK_CHUNK = 8192 /* a unit: the elements of a row one warp sums */
};

/* lib/util/hash.h's vps_mix64, bit for bit */
VPS_DK uint64_t vps_dk_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* k = (block key ^ slot key) | 1 is computed as an even block key xor an
 * odd slot key: one operation a word */
VPS_DK uint64_t vps_dk_slot_key(uint32_t slot)
{
	return vps_dk_mix64(((uint64_t)slot + 1) * 0xd1b54a32d192ed03ULL) | 1;
}

VPS_DK uint64_t vps_dk_block_key(uint64_t key, uint64_t block)
{
	return vps_dk_mix64(key ^ (block + 1) * 0x9e3779b97f4a7c15ULL) & ~1ULL;
}

/* A view as the kernel walks it: rows of row_len elements, each cut into
 * chunks of VPS_DK_CHUNK, one unit of work each. */
struct vps_dk_desc {
	uint64_t addr;       /* byte address of the view's first element */
	uint64_t key;
	uint64_t flat;       /* logical index of the first element */
	uint64_t first_unit; /* units of the descriptors before this one */
	uint64_t row_len;    /* elements of a row */
	uint64_t chunks;     /* units per row */
	int64_t step;        /* the row's stride in the buffer, bytes */
	int64_t fstep;       /* the row's stride in the logical tensor */
	int32_t nouter, esize;
	/* the elements lie off their size's alignment (a buffer at an odd
	 * offset): read byte by byte, since a misaligned load faults and the
	 * fault would end the context */
	int32_t bytewise;
	/* contiguous in the buffer and in the tensor: 16-byte vectors where
	 * the address and the logical index allow */
	int32_t dense;
	int64_t ext[VPS_CUDA_MAX_DIMS];  /* outer extents */
	int64_t str[VPS_CUDA_MAX_DIMS];  /* outer strides, bytes */
	int64_t fstr[VPS_CUDA_MAX_DIMS]; /* outer logical strides */
};

/* Axes of extent 1 dropped, then an axis merged into the next outer one
 * wherever both stride lists step over it exactly: the fewest axes that walk
 * the same elements, so that the innermost one left is as long a row as can
 * be (the copy kernel's rows too). */
VPS_DK int vps_dk_merge_axes(int ndim, const int64_t *ext_in, const int64_t *a_in, const int64_t *b_in, int64_t *ext,
			     int64_t *a, int64_t *b)
{
	int w = 0;
	for (int k = 0; k < ndim; k++) {
		if (ext_in[k] == 1)
			continue;
		if (w && a[w - 1] == a_in[k] * ext_in[k] && b[w - 1] == b_in[k] * ext_in[k]) {
			ext[w - 1] *= ext_in[k];
			a[w - 1] = a_in[k];
			b[w - 1] = b_in[k];
			continue;
		}
		ext[w] = ext_in[k];
		a[w] = a_in[k];
		b[w] = b_in[k];
		w++;
	}
	return w;
}

/* A view (extents checked: none negative, none 0) as rows. */
VPS_DK void vps_dk_describe(const struct vps_cuda_digest *v, struct vps_dk_desc *d)
{
	int64_t ext[VPS_CUDA_MAX_DIMS], st[VPS_CUDA_MAX_DIMS], ft[VPS_CUDA_MAX_DIMS];
	int w = vps_dk_merge_axes(v->ndim, v->ext, v->strides, v->flat_strides, ext, st, ft);
	memset(d, 0, sizeof(*d));
	d->addr = v->addr;
	d->key = v->key;
	d->flat = (uint64_t)v->flat;
	d->esize = v->esize;
	/* strides are whole elements: the first one's address decides */
	d->bytewise = v->addr % (uint64_t)v->esize != 0;
	if (w == 0) {
		d->row_len = 1;
		d->step = v->esize;
		d->fstep = 1;
		d->nouter = 0;
	} else {
		d->row_len = (uint64_t)ext[w - 1];
		d->step = st[w - 1] * v->esize;
		d->fstep = ft[w - 1];
		d->nouter = w - 1;
	}
	d->dense = !d->bytewise && d->step == v->esize && d->fstep == 1;
	for (int k = 0; k < d->nouter; k++) {
		d->ext[k] = ext[k];
		d->str[k] = st[k] * v->esize;
		d->fstr[k] = ft[k];
	}
	d->chunks = (d->row_len + VPS_DK_CHUNK - 1) / VPS_DK_CHUNK;
}

/* The descriptors of views v[0..n) in d (the empty ones left out: *m of
 * them); returns the units of work. */
VPS_DK uint64_t vps_dk_prepare(const struct vps_cuda_digest *v, size_t n, struct vps_dk_desc *d, size_t *m)
{
	uint64_t units = 0;
	*m = 0;
	for (size_t i = 0; i < n; i++) {
		int empty = 0;
		for (int k = 0; k < v[i].ndim; k++)
			empty |= v[i].ext[k] == 0;
		if (empty)
			continue;
		struct vps_dk_desc *q = &d[(*m)++];
		vps_dk_describe(&v[i], q);
		uint64_t rows = 1;
		for (int k = 0; k < q->nouter; k++)
			rows *= (uint64_t)q->ext[k];
		q->first_unit = units;
		units += rows * q->chunks;
	}
	return units;
}

/* A lane's key of the block it is in, recomputed when it moves on. */
struct vps_dk_block {
	uint64_t block, key;
};

VPS_DK uint64_t vps_dk_key(const struct vps_dk_desc *q, struct vps_dk_block *b, uint64_t index)
{
	uint64_t block = index >> VPS_DK_BLOCK_BITS;
	if (block != b->block) {
		b->block = block;
		b->key = vps_dk_block_key(q->key, block);
	}
	return b->key;
}

/* Element j of a row at p (its byte address): its bits. */
VPS_DK uint32_t vps_dk_bits(const struct vps_dk_desc *q, const unsigned char *p)
{
#ifdef __CUDA_ARCH__
	if (q->bytewise) {
		uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8;
		if (q->esize == 4)
			bits |= (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		return bits;
	}
	return q->esize == 2 ? (uint32_t)*(const uint16_t *)p : *(const uint32_t *)p;
#else
	if (q->esize == 2) {
		uint16_t b;
		memcpy(&b, p, 2);
		return b;
	}
	uint32_t b;
	memcpy(&b, p, 4);
	return b;
#endif
}

/* 16 bytes at a 16-byte aligned address, read once (the read-only path) */
VPS_DK void vps_dk_load16(const unsigned char *p, uint32_t w[4])
{
#ifdef __CUDA_ARCH__
	uint4 x = __ldg((const uint4 *)p);
	w[0] = x.x;
	w[1] = x.y;
	w[2] = x.z;
	w[3] = x.w;
#else
	memcpy(w, p, 16);
#endif
}

/* slot keys s[0] and s[1], s 16-byte aligned: one 128-bit load */
VPS_DK void vps_dk_keys(const uint64_t *s, uint64_t k[2])
{
#ifdef __CUDA_ARCH__
	ulonglong2 x = *(const ulonglong2 *)s;
	k[0] = x.x;
	k[1] = x.y;
#else
	k[0] = s[0];
	k[1] = s[1];
#endif
}

/* An element's term from its key k (odd), in the 32-bit halves a GPU
 * multiplies: w times k's low word, wide, and w times k's high word added
 * to the high half (two multiplies; left to itself nvcc makes four
 * instructions of them). */
VPS_DK uint64_t vps_dk_term(uint64_t k, uint32_t bits)
{
	uint32_t w = bits ^ 0xffff0000u, lo, hi;
#ifdef __CUDA_ARCH__
	asm("{\n\t.reg .u64 p;\n\tmul.wide.u32 p, %2, %3;\n\tmov.b64 {%0, %1}, p;\n\tmad.lo.u32 %1, %2, %4, %1;\n\t}"
	    : "=&r"(lo), "=&r"(hi)
	    : "r"(w), "r"((uint32_t)k), "r"((uint32_t)(k >> 32)));
#else
	uint64_t p = (uint64_t)w * (uint32_t)k;
	lo = (uint32_t)p;
	hi = (uint32_t)(p >> 32) + w * (uint32_t)(k >> 32);
#endif
	return (uint64_t)hi << 32 | (lo ^ hi);
}

/* the terms of a 16-byte vector of fp32 (4 elements) or bf16 (8) in a
 * block of key key, s its first slot key (16-byte aligned) */
VPS_DK uint64_t vps_dk_vector4(uint64_t key, const uint32_t w[4], const uint64_t *s)
{
	uint64_t k[4], sum = 0;
	vps_dk_keys(s, k);
	vps_dk_keys(s + 2, k + 2);
	for (int i = 0; i < 4; i++)
		sum += vps_dk_term(key ^ k[i], w[i]);
	return sum;
}

VPS_DK uint64_t vps_dk_vector2(uint64_t key, const uint32_t w[4], const uint64_t *s)
{
	uint64_t k[8], sum = 0;
	for (int i = 0; i < 4; i++)
		vps_dk_keys(s + 2 * i, k + 2 * i);
	for (int i = 0; i < 4; i++) {
		sum += vps_dk_term(key ^ k[2 * i], w[i] & 0xffffu);
		sum += vps_dk_term(key ^ k[2 * i + 1], w[i] >> 16);
	}
	return sum;
}

/* Lane lane's share of n 16-byte vectors from p, the first of logical
 * index index (a multiple of its elements): block by block, vectors lane,
 * lane + 32, ... of each, two in flight. bf16 is a constant where it is
 * inlined, so each kind of element gets a loop of its own. */
VPS_DK uint64_t vps_dk_vectors(const struct vps_dk_desc *q, const unsigned char *p, uint64_t index, uint64_t n,
			       int lane, const uint64_t *slot, int bf16)
{
	uint64_t per = bf16 ? 8 : 4, sum = 0;
	while (n) {
		uint64_t in = index & (VPS_DK_BLOCK - 1), room = (VPS_DK_BLOCK - in) / per, m = room < n ? room : n;
		uint64_t key = vps_dk_block_key(q->key, index >> VPS_DK_BLOCK_BITS), v = (uint64_t)lane;
		const uint64_t *s = slot + in;
		for (; v + VPS_DK_LANES < m; v += 2 * VPS_DK_LANES) {
			uint32_t a[4], b[4];
			vps_dk_load16(p + 16 * v, a);
			vps_dk_load16(p + 16 * (v + VPS_DK_LANES), b);
			sum += bf16 ? vps_dk_vector2(key, a, s + per * v) : vps_dk_vector4(key, a, s + per * v);
			sum += bf16 ? vps_dk_vector2(key, b, s + per * (v + VPS_DK_LANES))
				    : vps_dk_vector4(key, b, s + per * (v + VPS_DK_LANES));
		}
		if (v < m) {
			uint32_t a[4];
			vps_dk_load16(p + 16 * v, a);
			sum += bf16 ? vps_dk_vector2(key, a, s + per * v) : vps_dk_vector4(key, a, s + per * v);
		}
		index += m * per;
		n -= m;
		if (n)
			p += 16 * m;
	}
	return sum;
}

/* Lane `lane`'s share of unit u of descriptors d[0..n): in the general
 * case elements lane, lane + 32, ... of its chunk; in a dense row whose
 * 16-byte vectors can start where the logical index is a multiple of
 * their elements (4 fp32, 8 bf16), vectors lane, lane + 32, ... and one
 * element of the odd ends before the first vector and after the last. The
 * sum over the lanes and the units is the views' digest; slot holds the
 * VPS_DK_BLOCK slot keys. */
VPS_DK uint64_t vps_dk_lane(const struct vps_dk_desc *d, int n, uint64_t u, int lane, const uint64_t *slot)
{
	int lo = 0, hi = n - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) >> 1;
		if (d[mid].first_unit <= u)
			lo = mid;
		else
			hi = mid - 1;
	}
	const struct vps_dk_desc *q = &d[lo];
	uint64_t k = u - q->first_unit;
	uint64_t row = k / q->chunks, chunk = k - row * q->chunks;
	uint64_t off = 0, flat = q->flat;
	for (int a = q->nouter - 1; a >= 0; a--) {
		uint64_t e = (uint64_t)q->ext[a];
		uint64_t i = row % e;
		row /= e;
		off += i * (uint64_t)q->str[a];
		flat += i * (uint64_t)q->fstr[a];
	}
	uint64_t begin = chunk * VPS_DK_CHUNK;
	uint64_t end = q->row_len - begin < VPS_DK_CHUNK ? q->row_len : begin + VPS_DK_CHUNK;
	const unsigned char *base = (const unsigned char *)(uintptr_t)(q->addr + off);
	struct vps_dk_block b = {~0ULL, 0};
	uint64_t sum = 0, es = (uint64_t)q->esize;
	if (q->dense) {
		uint64_t per = 16 / es, first = begin + (per - (flat + begin) % per) % per;
		first = first < end ? first : end;
		if (!(((uintptr_t)base + first * es) & 15)) {
			uint64_t nvec = (end - first) / per, last = first + nvec * per;
			/* the odd ends, fewer than per elements each: the first
			 * lanes take the head, the next ones the tail */
			uint64_t nhead = first - begin, j = (uint64_t)lane < nhead ? begin + (uint64_t)lane
										  : last + ((uint64_t)lane - nhead);
			if (j < end)
				sum += vps_dk_term(vps_dk_key(q, &b, flat + j) ^ slot[(flat + j) & (VPS_DK_BLOCK - 1)],
						   vps_dk_bits(q, base + j * es));
			if (es == 2)
				sum += vps_dk_vectors(q, base + first * es, flat + first, nvec, lane, slot, 1);
			else
				sum += vps_dk_vectors(q, base + first * es, flat + first, nvec, lane, slot, 0);
			return sum;
		}
	}
	for (uint64_t j = begin + (uint64_t)lane; j < end; j += VPS_DK_LANES) {
		uint64_t index = flat + j * (uint64_t)q->fstep;
		sum += vps_dk_term(vps_dk_key(q, &b, index) ^ slot[index & (VPS_DK_BLOCK - 1)],
				   vps_dk_bits(q, base + (int64_t)j * q->step));
	}
	return sum;
}

#endif
