/* GPU building blocks: the copy kernel against the host's strided copy,
 * the digest kernel against the host's digest (vps_digest_region, and a
 * rank's part of a layout), registration of interior pointers, NCCL's
 * grouped send/receive at W = 1, and the clear refusal where there is no
 * GPU. On a machine without one the GPU parts say they are skipped; make
 * check runs them again on the stand-ins (tests/standin/). */
#include <stdlib.h>

#include "exec/digest.h"
#include "gpu/gpu.h"
#include "harness.h"
#include "io/doc.h"
#include "util/hash.h"
#include "jobs.h"
#include "util/internal.h"
#include "exec/transport/transport.h"
#include "vps/data.h"
#include "vps/registry.h"

static const struct vps_cuda_api *gpu_or_skip(const char *test)
{
	const struct vps_cuda_api *api;
	if (vps_gpu_init(-1, 0, &api)) {
		printf("  %s: skipped, no GPU here (%s)\n", test, vps_last_error());
		return NULL;
	}
	return api;
}

TEST(gpu_absence_is_a_clear_refusal)
{
	const struct vps_cuda_api *api;
	vps_result_t rc = vps_gpu_init(-1, 0, &api);
	if (rc == VPS_OK)
		return; /* a GPU machine: the other tests run */
	CHECK_EQ(rc, VPS_EUNSUPPORTED);
	CHECK(strstr(vps_last_error(), "GPU support is not available") != NULL);
}

static uint64_t next(void) { return harness_random(); }
static int64_t pick(int64_t lo, int64_t hi) { return lo + (int64_t)(next() % (uint64_t)(hi - lo + 1)); }

/* A view of ext inside a row-major parent at least as large: its strides
 * and a random offset in the slack. Returns the parent's element count. */
static int64_t random_view(const struct vps_op *op, int64_t *strides, int64_t *offset)
{
	int64_t shape[VPS_MAX_DIMS], s = 1;
	for (int k = op->ndim - 1; k >= 0; k--) {
		shape[k] = op->ext[k] + pick(0, 3);
		strides[k] = s;
		s *= shape[k];
	}
	*offset = 0;
	for (int k = 0; k < op->ndim; k++)
		*offset += pick(0, shape[k] - op->ext[k]) * strides[k];
	return s;
}

TEST(copy_kernel_equals_the_host_copy)
{
	const struct vps_cuda_api *api = gpu_or_skip("copy_kernel_equals_the_host_copy");
	if (!api)
		return;
	enum { N = 40 };
	struct vps_op ops[N];
	int64_t sn[N], dn[N];
	memset(ops, 0, sizeof(ops));
	int64_t stot = 0, dtot = 0;
	for (int i = 0; i < N; i++) {
		struct vps_op *op = &ops[i];
		op->esize = (uint8_t)(next() & 1 ? 2 : 4);
		op->ndim = (int)pick(1, 4);
		for (int k = 0; k < op->ndim; k++)
			op->ext[k] = pick(1, op->ndim == 1 ? 300000 : 40);
		if (i == 0) { /* rows longer than a warp's 64 KiB chunk */
			op->ndim = 2;
			op->ext[0] = 3;
			op->ext[1] = 70001;
		}
		sn[i] = random_view(op, op->src_strides, &op->src_offset);
		dn[i] = random_view(op, op->dst_strides, &op->dst_offset);
		stot += sn[i] * op->esize + 512;
		dtot += dn[i] * op->esize + 512;
	}
	unsigned char *hs = malloc((size_t)stot), *hd = malloc((size_t)dtot), *back = malloc((size_t)dtot);
	void *ds = NULL, *dd = NULL;
	char err[VPS_CUDA_ERR] = "";
	CHECK(hs && hd && back);
	CHECK(!api->alloc(&ds, (size_t)stot, err) && !api->alloc(&dd, (size_t)dtot, err));
	for (int64_t i = 0; i < stot; i++)
		hs[i] = (unsigned char)next();
	for (int64_t i = 0; i < dtot; i++)
		hd[i] = (unsigned char)(i * 7);
	CHECK(!api->to_device(ds, hs, (size_t)stot, err));
	CHECK(!api->to_device(dd, hd, (size_t)dtot, err));
	/* buffers at odd byte offsets too: misaligned by a few elements */
	struct vps_local_copy c[N];
	struct vps_switch sw = {0};
	sw.where = VPS_WHERE_CUDA;
	sw.gpu = api;
	sw.timeout = 30;
	int64_t sat = 0, dat = 0;
	for (int i = 0; i < N; i++) {
		int64_t sskew = pick(0, 7) * ops[i].esize, dskew = pick(0, 7) * ops[i].esize;
		c[i] = (struct vps_local_copy){&ops[i], (unsigned char *)ds + sat + sskew, (unsigned char *)dd + dat + dskew,
							VPS_WHERE_CUDA};
		vps_copy_strided(hd + dat + dskew + ops[i].dst_offset * ops[i].esize, ops[i].dst_strides,
				 hs + sat + sskew + ops[i].src_offset * ops[i].esize, ops[i].src_strides, ops[i].ext,
				 ops[i].ndim, ops[i].esize);
		sat += sn[i] * ops[i].esize + 512;
		dat += dn[i] * ops[i].esize + 512;
	}
	CHECK_OK(vps_copy_ops(&sw, c, N));
	CHECK(!api->to_host(back, dd, (size_t)dtot, err));
	int64_t wrong = 0;
	for (int64_t i = 0; i < dtot; i++)
		wrong += back[i] != hd[i];
	CHECK_EQ(wrong, 0);
	api->release(ds, err);
	api->release(dd, err);
	free(hs);
	free(hd);
	free(back);
}

/* A region of a random tensor in a random strided view of a buffer of
 * nelem elements: rows of up to 30,000 elements (several of the kernel's
 * chunks), an innermost stride of 1 or 2, at a random offset. */
static void random_region(struct vps_region *r, struct vps_tensor *t, int64_t *nelem)
{
	memset(r, 0, sizeof(*r));
	memset(t, 0, sizeof(*t));
	t->ndim = (int)pick(1, 4);
	r->box.ndim = t->ndim;
	r->tensor = (uint32_t)pick(0, 5000);
	r->state = (uint8_t)pick(0, VPS_NSTATES - 1);
	for (int k = 0; k < t->ndim; k++) {
		t->shape[k] = pick(1, t->ndim == 1 ? 30000 : 24);
		r->box.lo[k] = pick(0, t->shape[k] - 1);
		r->box.hi[k] = pick(r->box.lo[k] + 1, t->shape[k]);
	}
	int64_t s = pick(1, 2), pad = pick(0, 5);
	for (int k = t->ndim - 1; k >= 0; k--) {
		r->strides[k] = s;
		s *= r->box.hi[k] - r->box.lo[k] + (k == t->ndim - 1 ? 0 : pick(0, 2));
	}
	r->offset = pad;
	*nelem = pad + s + 1;
}

/* The view the digest kernel takes, as vps_cuda.h defines it. */
static struct vps_cuda_digest kernel_view(const struct vps_region *r, const struct vps_tensor *t, const void *dev)
{
	struct vps_cuda_digest v = {0};
	int64_t tstr = 1;
	v.esize = (int32_t)vps_dtype_size(vps_region_dtype(r));
	v.ndim = r->box.ndim;
	for (int k = t->ndim - 1; k >= 0; k--) {
		v.ext[k] = r->box.hi[k] - r->box.lo[k];
		v.strides[k] = r->strides[k];
		v.flat_strides[k] = tstr;
		v.flat += r->box.lo[k] * tstr;
		tstr *= t->shape[k];
	}
	v.key = vps_mix64(((uint64_t)r->tensor << 8) ^ r->state);
	v.addr = (uint64_t)(uintptr_t)dev + (uint64_t)r->offset * (uint64_t)v.esize;
	return v;
}

TEST(digest_kernel_equals_vps_digest_region)
{
	const struct vps_cuda_api *api = gpu_or_skip("digest_kernel_equals_vps_digest_region");
	if (!api)
		return;
	enum { N = 30 };
	struct vps_region r[N];
	struct vps_tensor t[N];
	int64_t n[N], total = 0;
	for (int i = 0; i < N; i++) {
		random_region(&r[i], &t[i], &n[i]);
		total += n[i] * 4 + 512; /* aligned starts, and room for the view moved one byte on */
	}
	unsigned char *h = malloc((size_t)total);
	void *d = NULL;
	char err[VPS_CUDA_ERR] = "";
	CHECK(h && !api->alloc(&d, (size_t)total, err));
	for (int64_t i = 0; i < total; i++)
		h[i] = (unsigned char)next();
	CHECK(!api->to_device(d, h, (size_t)total, err));
	struct vps_cuda_digest v[N];
	uint64_t want = 0, one = 0, got = 0;
	int64_t at = 0;
	for (int i = 0; i < N; i++) {
		size_t es = vps_dtype_size(vps_region_dtype(&r[i]));
		uint64_t mine = vps_digest_region(h + at, &r[i], &t[i]);
		v[i] = kernel_view(&r[i], &t[i], (unsigned char *)d + at);
		/* each view alone, then all of them in one launch */
		CHECK(!api->digest(&v[i], 1, &one, err));
		CHECK(one == mine);
		/* one byte further on: off its elements' alignment, read byte
		 * by byte (a misaligned load would fault and end the context) */
		struct vps_cuda_digest odd = kernel_view(&r[i], &t[i], (unsigned char *)d + at + 1);
		CHECK(!api->digest(&odd, 1, &one, err));
		/* the host's reference reads the same bytes from an aligned copy */
		unsigned char *same = malloc((size_t)n[i] * es + 1);
		CHECK(same != NULL);
		if (same) {
			memcpy(same, h + at + 1, (size_t)n[i] * es);
			CHECK(one == vps_digest_region(same, &r[i], &t[i]));
		}
		free(same);
		want += mine;
		at += (n[i] * (int64_t)es + 256 + 255) / 256 * 256; /* buffers start aligned, as allocators place them */
	}
	CHECK(!api->digest(v, N, &got, err));
	CHECK(got == want);
	CHECK(!api->digest(v, 0, &got, err) && got == 0);
	/* one element's bits changed: the sum changes */
	unsigned char flip = (unsigned char)(h[v[0].addr - (uint64_t)(uintptr_t)d] ^ 1);
	CHECK(!api->to_device((void *)(uintptr_t)v[0].addr, &flip, 1, err));
	CHECK(!api->digest(v, N, &got, err));
	CHECK(got != want);
	/* what the kernel cannot take */
	struct vps_cuda_digest bad = v[1];
	bad.esize = 3;
	CHECK_EQ(api->digest(&bad, 1, &got, err), VPS_CUDA_EINPUT);
	bad = v[1];
	bad.ext[0] = -1;
	CHECK_EQ(api->digest(&bad, 1, &got, err), VPS_CUDA_EINPUT);
	api->release(d, err);
	free(h);
}

TEST(digest_kernel_equals_the_host_on_long_rows_at_every_alignment)
{
	/* rows of several blocks (2048 elements) and chunks (8192), starting
	 * at every logical index and address a 16-byte vector can meet: the
	 * kernel reads 16-byte vectors where both line up, element by element
	 * where they do not, and the odd ends around the vectors */
	const struct vps_cuda_api *api = gpu_or_skip("digest_kernel_equals_the_host_on_long_rows_at_every_alignment");
	if (!api)
		return;
	enum { N = 4 * 8192 + 3 * 2048 + 37 };
	unsigned char *h = malloc((size_t)N * 4 + 64);
	void *d = NULL;
	char err[VPS_CUDA_ERR] = "";
	CHECK(h && !api->alloc(&d, (size_t)N * 4 + 64, err));
	if (!h || !d) {
		free(h);
		return;
	}
	for (int64_t i = 0; i < (int64_t)N * 4 + 64; i++)
		h[i] = (unsigned char)next();
	CHECK(!api->to_device(d, h, (size_t)N * 4 + 64, err));
	static const enum vps_state states[] = {VPS_STATE_PARAM, VPS_STATE_MAIN_PARAM};
	int wrong = 0, cases = 0;
	for (int s = 0; s < 2; s++) {
		int64_t es = (int64_t)vps_dtype_size(vps_state_dtype(states[s]));
		for (int64_t lo = 0; lo < 9; lo++) {
			for (int64_t skew = 0; skew < 16 / es + 1; skew++) {
				int64_t len = N - 16 - (int64_t)(next() % 5000) * (lo & 1);
				struct vps_tensor t = {.ndim = 2, .shape = {3, N}};
				/* row 1 of a [3, N] tensor from column lo: logical
				 * index N + lo, at element skew of the buffer */
				struct vps_region r = {.tensor = (uint32_t)(100 + s), .state = (uint8_t)states[s],
						       .box = {2, {1, lo}, {2, lo + len}}, .offset = skew, .strides = {len, 1}};
				struct vps_cuda_digest v = kernel_view(&r, &t, d);
				uint64_t got = 0;
				CHECK(!api->digest(&v, 1, &got, err));
				wrong += got != vps_digest_region(h, &r, &t);
				cases++;
			}
		}
	}
	CHECK_EQ(wrong, 0);
	CHECK(cases == 9 * (9 + 5));
	api->release(d, err);
	free(h);
}

/* A rank's part of a layout, its buffers in one allocation at 256-byte
 * aligned offsets (as vps-trainer and PyTorch's allocator place them). */
static void *upload_rank(const struct vps_cuda_api *api, const struct job *j, int64_t rank, void **dev)
{
	const struct vps_rank_view *v = &j->views[rank];
	size_t total = 256, at = 256;
	char err[VPS_CUDA_ERR] = "";
	for (size_t b = 0; b < v->nbuffers; b++)
		total += ((size_t)v->buffers[b].elements * vps_dtype_size(v->buffers[b].dtype) + 255) / 256 * 256;
	void *base = NULL;
	CHECK(!api->alloc(&base, total, err));
	for (size_t b = 0; base && b < v->nbuffers; b++) {
		size_t bytes = (size_t)v->buffers[b].elements * vps_dtype_size(v->buffers[b].dtype);
		dev[b] = (unsigned char *)base + at;
		CHECK(!api->to_device(dev[b], j->bufs[rank][b], bytes, err));
		at += (bytes + 255) / 256 * 256;
	}
	return base;
}

TEST(a_ranks_digest_on_the_gpu_equals_the_hosts)
{
	const struct vps_cuda_api *api = gpu_or_skip("a_ranks_digest_on_the_gpu_equals_the_hosts");
	if (!api)
		return;
	static const struct { const char *model, *spec; } cases[] = {
		{"tiny-llama", "tp=2,pp=2,dp=2,zero=1"},
		{"tiny-qwen3-moe", "tp=2,pp=1,dp=2,ep=2,etp=1,zero=1"},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
		struct vps_layout *l = test_layout(cases[c].model, cases[c].spec, 8, 0);
		if (!l)
			continue;
		struct job j;
		job_alloc(&j, l);
		job_fill(&j);
		uint64_t host_sum = 0, gpu_sum = 0;
		for (int64_t rank = 0; rank < j.n; rank++) {
			void **dev = calloc(j.views[rank].nbuffers + 1, sizeof(*dev));
			void *base = dev ? upload_rank(api, &j, rank, dev) : NULL;
			uint64_t host = 0, gpu = 1, mixed = 2;
			size_t nb = j.views[rank].nbuffers;
			uint8_t *where = calloc(nb + 1, 1), *half = calloc(nb + 1, 1);
			void **both = calloc(nb + 1, sizeof(*both));
			CHECK(where && half && both);
			for (size_t b = 0; where && half && both && b < nb; b++) {
				where[b] = VPS_WHERE_CUDA;
				/* every other buffer left in host memory, as offloaded state is */
				half[b] = b % 2 ? VPS_WHERE_HOST : VPS_WHERE_CUDA;
				both[b] = b % 2 ? j.bufs[rank][b] : dev[b];
			}
			CHECK_OK(vps_exec_digest(l, rank, (void *const *)j.bufs[rank], &host));
			CHECK_OK(vps_exec_digest_part(l, rank, dev, NULL, true, where, api, &gpu));
			CHECK_OK(vps_exec_digest_part(l, rank, both, NULL, true, half, api, &mixed));
			CHECK(host == gpu);
			CHECK(host == mixed);
			free(where);
			free(half);
			free(both);
			host_sum += host;
			gpu_sum += gpu;
			char err[VPS_CUDA_ERR];
			if (base)
				api->release(base, err);
			free(dev);
		}
		CHECK(host_sum == gpu_sum);
		job_free(&j);
		vps_layout_free(l);
	}
}

TEST(interior_pointers_register_with_their_offset)
{
	const struct vps_cuda_api *api = gpu_or_skip("interior_pointers_register_with_their_offset");
	if (!api)
		return;
	void *base = NULL;
	char err[VPS_CUDA_ERR] = "";
	CHECK(!api->alloc(&base, 1 << 20, err));
	struct vps_registry *r;
	CHECK_OK(vps_registry_create(&r, "vps-test-gpu-reg", 1, 0, 4, 1));
	CHECK_OK(vps_registry_add_cuda_ptr(r, VPS_ROLE_SOURCE, 0, 0, 1, 1000, (unsigned char *)base + 4096));
	struct vps_registry_entry_info e;
	CHECK_OK(vps_registry_entry(r, 0, &e));
	CHECK_EQ(e.where, VPS_WHERE_CUDA);
	CHECK_EQ(e.offset, 4096);
	CHECK_EQ(e.bytes, 4000);
	/* past the allocation's end: refused */
	CHECK_EQ(vps_registry_add_cuda_ptr(r, VPS_ROLE_SOURCE, 1, 0, 1, 1 << 18, (unsigned char *)base + 4096),
		 VPS_EINPUT);
	/* host memory is not device memory */
	static float host[16];
	CHECK(vps_registry_add_cuda_ptr(r, VPS_ROLE_SOURCE, 2, 0, 1, 16, host) != VPS_OK);
	vps_registry_close(r);
	api->release(base, err);
}

TEST(nccl_grouped_send_and_receive_to_itself)
{
	const struct vps_cuda_api *api = gpu_or_skip("nccl_grouped_send_and_receive_to_itself");
	if (!api)
		return;
	unsigned char id[VPS_CUDA_NCCL_ID];
	char err[VPS_CUDA_ERR] = "";
	void *comm = NULL;
	if (api->nccl_id(id, err)) {
		printf("  nccl_grouped_send_and_receive_to_itself: skipped, %s\n", err);
		return;
	}
	CHECK(!api->nccl_init(&comm, 1, 0, id, err));
	enum { BYTES = 3 << 20 };
	unsigned char *h = malloc(BYTES), *back = malloc(BYTES);
	void *a = NULL, *b = NULL;
	CHECK(!api->alloc(&a, BYTES, err) && !api->alloc(&b, BYTES, err));
	for (int i = 0; i < BYTES; i++)
		h[i] = (unsigned char)next();
	CHECK(!api->to_device(a, h, BYTES, err));
	CHECK(!api->fill(b, 0, BYTES, err));
	struct vps_cuda_p2p p[2] = {{(uint64_t)(uintptr_t)a, BYTES, 0, 1}, {(uint64_t)(uintptr_t)b, BYTES, 0, 0}};
	CHECK(!api->nccl_exchange(comm, p, 2, err));
	CHECK(!api->sync(comm, 30, err));
	CHECK(!api->to_host(back, b, BYTES, err));
	CHECK(!memcmp(h, back, BYTES));
	api->nccl_free(comm, err);
	api->release(a, err);
	api->release(b, err);
	free(h);
	free(back);
}

TEST(views_outside_their_buffers_are_refused)
{
	struct vps_op op = {0};
	op.esize = 2;
	op.ndim = 2;
	op.ext[0] = 4;
	op.ext[1] = 8;
	op.src_strides[0] = 8;
	op.src_strides[1] = 1;
	op.dst_strides[0] = 16;
	op.dst_strides[1] = 1;
	int64_t src[1] = {64}, dst[1] = {2 * (3 * 16 + 8)};
	CHECK_OK(vps_check_op(&op, src, 1, dst, 1));
	op.dst_offset = 1; /* one element past the end */
	CHECK_EQ(vps_check_op(&op, src, 1, dst, 1), VPS_EINPUT);
	op.dst_offset = 0;
	op.src_buffer = 1; /* no such buffer */
	CHECK_EQ(vps_check_op(&op, src, 1, dst, 1), VPS_EINPUT);
	op.src_buffer = 0;
	op.src_strides[0] = 0; /* aliasing rows */
	CHECK_EQ(vps_check_op(&op, src, 1, NULL, 0), VPS_EINPUT);
	op.src_strides[0] = INT64_MAX / 2; /* overflow */
	CHECK_EQ(vps_check_op(&op, src, 1, NULL, 0), VPS_EINPUT);
}
