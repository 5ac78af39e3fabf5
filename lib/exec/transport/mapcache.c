/* Registered buffers mapped into the executor, kept across switches.
 *
 * A switch's targets are the next switch's sources, so under --serve they
 * stay mapped: the first pass over a fresh mapping of host memory is slow
 * on virtual machines (docs/exec.md), and opening a CUDA IPC handle costs
 * milliseconds. Everything else is unmapped when its switch ends, so the
 * trainer's freed sources are not pinned by the executor.
 *
 * While the executor waits for a request it maps what the trainer has
 * registered and reads one byte of every page (vps_mapcache_prefetch,
 * vps_mapcache_warm), so that first pass falls before the pause, not in
 * it; what it could not reach in time is touched when the switch maps it,
 * in the attach, so a transfer's time is the transport's. It opens the
 * CUDA IPC handles of what the trainer registered then too, and those of
 * the peers' sources that a transport learned of before the request (ipc's
 * prepare), so that the pause opens none. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "util/internal.h"
#include "exec/transport/transport.h"

struct map_entry {
	uint32_t where;
	char shm_name[VPS_REGISTRY_NAME_MAX + 8];
	unsigned char ipc[64];
	void *base;
	size_t len;
	bool writable;  /* host: mapped with PROT_WRITE now */
	bool keep;      /* outlives this switch */
	bool used;      /* used in this switch */
	bool peer;      /* prefetched for a peer's buffer (its trainer's, not ours) */
	bool carried;   /* kept from the switch before, for the next */
	size_t touched; /* host: bytes from the start read once through this mapping */
};

struct vps_mapcache {
	struct map_entry *v;
	size_t n, cap;
	uint64_t warm_bytes, cold_bytes;
	uint64_t opened; /* objects mapped and IPC handles opened */
};

/* One read a page: the first pass through a mapping, whatever it costs,
 * done here rather than inside a transfer. */
static size_t touch(struct map_entry *e, size_t budget)
{
	if (e->where != VPS_WHERE_HOST || !e->base)
		return 0;
	const size_t page = 4096;
	size_t end = e->len - e->touched > budget ? e->touched + budget : e->len, done = e->touched;
	volatile const unsigned char *q = e->base;
	unsigned sink = 0;
	for (size_t at = e->touched; at < end; at += page)
		sink += q[at];
	(void)sink;
	e->touched = end;
	return end - done;
}

vps_result_t vps_mapcache_new(struct vps_mapcache **out)
{
	*out = vps_calloc(1, sizeof(**out));
	return *out ? VPS_OK : VPS_ENOMEM;
}

static void unmap(struct map_entry *e, const struct vps_cuda_api *gpu)
{
	if (e->where == VPS_WHERE_HOST) {
		if (e->base && e->len)
			munmap(e->base, e->len);
	} else if (gpu && e->base) {
		char err[VPS_CUDA_ERR];
		gpu->ipc_close(e->base, err);
	}
	e->base = NULL;
}

void vps_mapcache_free(struct vps_mapcache *c)
{
	if (!c)
		return;
	const struct vps_cuda_api *gpu = NULL;
	for (size_t i = 0; i < c->n; i++) {
		if (c->v[i].where == VPS_WHERE_CUDA && !gpu && vps_gpu_api(&gpu))
			gpu = NULL;
		unmap(&c->v[i], gpu);
	}
	free(c->v);
	free(c);
}

void vps_mapcache_end_switch(struct vps_mapcache *c, const struct vps_cuda_api *gpu)
{
	size_t w = 0;
	for (size_t i = 0; i < c->n; i++) {
		struct map_entry *e = &c->v[i];
		if (!e->keep) {
			unmap(e, gpu);
			continue;
		}
		e->keep = e->used = false;
		e->carried = true;
		c->v[w++] = *e;
	}
	c->n = w;
}

static vps_result_t map_host(const char *name, bool writable, void **base, size_t *len)
{
	char path[VPS_REGISTRY_NAME_MAX + 16];
	snprintf(path, sizeof(path), "/%s", name);
	int fd = shm_open(path, writable ? O_RDWR : O_RDONLY, 0);
	if (fd < 0)
		return vps_fail(errno == ENOENT ? VPS_ENOTFOUND : VPS_ESYS, "shared memory /dev/shm/%s: %s", name,
				strerror(errno));
	struct stat st;
	vps_result_t rc = vps_registry_check_object(fd, name);
	if (!rc && fstat(fd, &st) != 0)
		rc = vps_fail_errno("shared memory /dev/shm/%s", name);
	if (rc) {
		close(fd);
		return rc;
	}
	size_t size = (size_t)st.st_size;
	void *p = size ? mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0)
		       : NULL;
	close(fd);
	if (size && p == MAP_FAILED)
		return vps_fail_errno("shared memory /dev/shm/%s: map %zu bytes", name, size);
	*base = p;
	*len = size;
	return VPS_OK;
}

static bool same_object(const struct map_entry *e, const struct vps_buffer_desc *d)
{
	if (e->where != d->where)
		return false;
	if (d->where == VPS_WHERE_HOST)
		return !strcmp(e->shm_name, d->shm_name);
	return !memcmp(e->ipc, d->ipc, sizeof(e->ipc));
}

static vps_result_t check_desc(const struct vps_buffer_desc *d, const struct vps_cuda_api *gpu)
{
	if (d->where != VPS_WHERE_HOST && d->where != VPS_WHERE_CUDA)
		return vps_fail(VPS_EINPUT, "buffer %u: unknown memory kind %u", d->buffer, d->where);
	if (d->where == VPS_WHERE_HOST && (!memchr(d->shm_name, 0, sizeof(d->shm_name)) || !d->shm_name[0] ||
					   strchr(d->shm_name, '/')))
		return vps_fail(VPS_EINPUT, "buffer %u: not a shared-memory object name", d->buffer);
	if (d->where == VPS_WHERE_CUDA && !gpu)
		return vps_fail(VPS_EUNSUPPORTED, "buffer %u is GPU memory and GPU support is not loaded", d->buffer);
	return VPS_OK;
}

/* The entry that maps d's object as asked, or NULL. A source may use the
 * cached writable mapping of a target not in use (made read-only). */
static vps_result_t find(struct vps_mapcache *c, const struct vps_buffer_desc *d, bool writable, struct map_entry **out)
{
	struct map_entry *e = NULL;
	/* host memory: a source and a target are separate mappings (a source
	 * is read-only); a kept target becomes a source by mprotect, which
	 * keeps its page tables */
	for (size_t i = 0; i < c->n && !e; i++) {
		struct map_entry *x = &c->v[i];
		if (!same_object(x, d))
			continue;
		if (d->where == VPS_WHERE_CUDA || x->writable == writable)
			e = x;
		else if (!writable && x->writable && !x->used) {
			if (mprotect(x->base, x->len, PROT_READ) != 0)
				return vps_fail_errno("shared memory /dev/shm/%s: make read-only", d->shm_name);
			x->writable = false;
			e = x;
		}
	}
	*out = e;
	return VPS_OK;
}

static vps_result_t add(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *d,
			bool writable, struct map_entry **out)
{
	VPS_CHECK(VPS_GROW(c->v, c->cap, c->n + 1));
	struct map_entry n = {0};
	n.where = d->where;
	if (d->where == VPS_WHERE_HOST) {
		snprintf(n.shm_name, sizeof(n.shm_name), "%s", d->shm_name);
		VPS_CHECK(map_host(d->shm_name, writable, &n.base, &n.len));
		n.writable = writable;
	} else {
		memcpy(n.ipc, d->ipc, sizeof(n.ipc));
		uint64_t bytes = 0;
		char err[VPS_CUDA_ERR] = "";
		int rc = gpu->ipc_open(d->ipc, &n.base, &bytes, err);
		if (rc)
			return vps_gpu_result(rc, err, "open a CUDA IPC handle");
		n.len = (size_t)bytes;
	}
	c->v[c->n++] = n;
	c->opened++;
	*out = &c->v[c->n - 1];
	return VPS_OK;
}

vps_result_t vps_mapcache_map(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *d,
			      bool writable, bool keep, bool warm, void **ptr)
{
	VPS_CHECK(check_desc(d, gpu));
	struct map_entry *e;
	VPS_CHECK(find(c, d, writable, &e));
	bool opened_before = e != NULL;
	if (!e)
		VPS_CHECK(add(c, gpu, d, writable, &e));
	if (warm && e->where == VPS_WHERE_HOST) {
		if (e->touched >= e->len)
			c->warm_bytes += d->bytes;
		else
			c->cold_bytes += d->bytes;
		touch(e, SIZE_MAX);
	} else if (warm) {
		/* GPU memory: ready once its handle is open */
		if (opened_before)
			c->warm_bytes += d->bytes;
		else
			c->cold_bytes += d->bytes;
	}
	e->used = true;
	e->keep |= keep;
	uint64_t end;
	if (__builtin_add_overflow(d->offset, d->bytes, &end) || end > e->len) {
		if (d->where == VPS_WHERE_HOST)
			return vps_fail(VPS_EINPUT, "buffer %u needs %" PRIu64 " bytes at offset %" PRIu64
					" of /dev/shm/%s, which has %zu", d->buffer, d->bytes, d->offset, d->shm_name, e->len);
		return vps_fail(VPS_EINPUT, "buffer %u needs %" PRIu64 " bytes at offset %" PRIu64
				" of a GPU allocation of %zu", d->buffer, d->bytes, d->offset, e->len);
	}
	*ptr = (unsigned char *)e->base + d->offset;
	return VPS_OK;
}

vps_result_t vps_mapcache_prefetch(struct vps_mapcache *c, const struct vps_cuda_api *gpu,
				   const struct vps_buffer_desc *d, bool writable, bool peer)
{
	VPS_CHECK(check_desc(d, gpu));
	struct map_entry *e;
	VPS_CHECK(find(c, d, writable, &e));
	if (!e) {
		VPS_CHECK(add(c, gpu, d, writable, &e));
		e->peer = peer;
	}
	return VPS_OK;
}

bool vps_mapcache_warm(struct vps_mapcache *c, size_t budget)
{
	for (size_t i = 0; i < c->n && budget; i++)
		budget -= touch(&c->v[i], budget);
	for (size_t i = 0; i < c->n; i++)
		if (c->v[i].where == VPS_WHERE_HOST && c->v[i].touched < c->v[i].len)
			return true;
	return false;
}

void vps_mapcache_prune(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *registered,
			size_t n)
{
	size_t w = 0;
	for (size_t i = 0; i < c->n; i++) {
		struct map_entry *e = &c->v[i];
		/* a kept target stays until the switch after it ends: the trainer
		 * re-registers it as a source, and a scan between its reset and
		 * that would otherwise close what the next switch reads */
		bool keep = e->used || e->peer || e->carried;
		for (size_t k = 0; k < n && !keep; k++)
			keep = same_object(e, &registered[k]);
		if (!keep) {
			unmap(e, gpu);
			continue;
		}
		c->v[w++] = *e;
	}
	c->n = w;
}

void vps_mapcache_take_stats(struct vps_mapcache *c, uint64_t *warm_bytes, uint64_t *cold_bytes)
{
	*warm_bytes = c->warm_bytes;
	*cold_bytes = c->cold_bytes;
	c->warm_bytes = c->cold_bytes = 0;
}

uint64_t vps_mapcache_take_opened(struct vps_mapcache *c)
{
	uint64_t n = c->opened;
	c->opened = 0;
	return n;
}

void vps_mapcache_close(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *d)
{
	size_t w = 0;
	for (size_t i = 0; i < c->n; i++) {
		struct map_entry *e = &c->v[i];
		if (same_object(e, d) && !e->keep) {
			unmap(e, gpu);
			continue;
		}
		c->v[w++] = *e;
	}
	c->n = w;
}
