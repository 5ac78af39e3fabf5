#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "registry/bell.h"
#include "util/internal.h"
#include "vps/registry.h"
#include "vps/units.h"

#define REG_MAGIC "VPSREG\0\1"

struct reg_entry {
	uint32_t role, buffer;
	int32_t state, dtype;
	int64_t elements;
	uint64_t bytes;
	uint32_t where;
	int32_t device;
	char shm_name[VPS_REGISTRY_NAME_MAX + 8];
	uint64_t offset;
	unsigned char ipc[64];
	_Atomic uint32_t released;
	uint32_t pad;
};

struct reg_header {
	char magic[8];
	uint32_t version, header_size, entry_size, max_entries;
	_Atomic uint32_t nentries;
	int32_t owner_pid;
	uint64_t owner_start;
	uint64_t layout_hash;
	int64_t rank;
	uint64_t target_hash;
	int64_t target_rank;
	_Atomic uint32_t state;
	/* rung (incremented, then woken: a futex) at each request and verdict,
	 * so that the side that waits sees it at once (ring, vps_registry_await) */
	_Atomic uint32_t bell;
	_Atomic uint64_t seq;
	/* the executor that holds the registry (one at a time): its pid in the
	 * low 32 bits, the low 32 bits of its start time in the high ones, so
	 * that one compare-and-swap takes it; 0 when none does */
	_Atomic uint64_t executor;
	uint64_t next_object; /* serial of the next buffer object NAME.serial */
	_Atomic uint32_t aborted; /* the executor failed outside a switch */
	uint32_t pad3;
	/* the request its abort ends: the one in flight when it stopped, or the
	 * next one; a later request is a retry, for the executor that comes next */
	_Atomic uint64_t abort_seq;
	char abort_message[256];
	char failure[256];
	struct vps_registry_training training;
	struct reg_entry entries[];
};

struct mapping {
	void *base;
	size_t len;
	char object[VPS_REGISTRY_NAME_MAX + 8]; /* the owner's buffer: its object, removed with it */
};

struct vps_registry {
	char name[VPS_REGISTRY_NAME_MAX + 2];
	struct reg_header *h;
	size_t size;
	bool owner;
	uint64_t executor; /* an executor's handle: the word it holds the registry with */
	uint64_t failed_seq; /* an executor's handle: the last switch it ended as failed */
	/* the trainer's: the executor it started for switch expected_seq (an
	 * executor word; vps_registry_expect_executor) */
	uint64_t expected, expected_seq;
	struct mapping *maps; /* the owner's buffers, or the executor's mappings */
	size_t nmaps, capmaps;
};

/* How long a wait goes without looking at what rings no bell: a trainer's
 * wait for its executor's pid (gone, it cannot say so), an executor's
 * claim for its trainer's. */
#define LOOK_GONE 0.25
#define LOOK_OWNER 0.05

/* Ring the bell (bell.h): the futex is woken without FUTEX_PRIVATE_FLAG,
 * since the waiters are other processes sharing the mapping. */
static void ring(struct reg_header *h)
{
	atomic_fetch_add(&h->bell, 1);
	syscall(SYS_futex, (uint32_t *)&h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint32_t vps_registry_bell(const struct vps_registry *r) { return atomic_load(&r->h->bell); }

bool vps_registry_await(const struct vps_registry *r, uint32_t bell, double seconds)
{
	_Atomic uint32_t *word = &r->h->bell;
	if (atomic_load(word) != bell)
		return true;
	if (!(seconds > 0))
		return false;
	if (seconds > 3600)
		seconds = 3600;
	struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
	if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, bell, &ts, NULL, 0) == 0 || errno == EAGAIN)
		return atomic_load(word) != bell;
	if (errno != ETIMEDOUT && errno != EINTR)
		/* no futex here (a sandbox's filter): wait out the time, as the
		 * looks did before there was a bell, rather than spin */
		nanosleep(&ts, NULL);
	return false;
}

static vps_result_t check_name(const char *name)
{
	size_t n = strlen(name);
	if (!n || n > VPS_REGISTRY_NAME_MAX || strchr(name, '/'))
		return vps_fail(VPS_EINPUT, "registry name '%s': 1 to %d characters, no '/'", name, VPS_REGISTRY_NAME_MAX);
	return VPS_OK;
}

/* Start time of a process in clock ticks since boot (/proc/PID/stat field
 * 22), to tell a live owner from a new process that reused its pid; 0 when
 * it cannot be read. *zombie: the process has exited and awaits its parent
 * (its memory is gone: for a trainer, as dead as a reaped one). */
static uint64_t proc_start(int pid, bool *zombie)
{
	/* open and read, no stdio: vps-trainer's signal handler gets here */
	char path[64], buf[1024];
	*zombie = false;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* fields after the command: state is field 3, starttime field 22 */
	int field = 2;
	for (p++; *p;) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		if (++field == 3)
			*zombie = *p == 'Z' || *p == 'X';
		if (field == 22) {
			unsigned long long v = 0;
			for (; *p >= '0' && *p <= '9'; p++)
				v = v * 10 + (unsigned long long)(*p - '0');
			return v;
		}
		while (*p && *p != ' ')
			p++;
	}
	return 0;
}

static bool owner_alive(const struct reg_header *h)
{
	if (h->owner_pid <= 0)
		return false;
	if (kill(h->owner_pid, 0) != 0 && errno == ESRCH)
		return false;
	bool zombie;
	uint64_t st = proc_start(h->owner_pid, &zombie);
	return !zombie && (st == 0 || st == h->owner_start);
}

bool vps_registry_owner_alive(const struct vps_registry *r) { return owner_alive(r->h); }

static int executor_pid_of(uint64_t word) { return (int)(uint32_t)word; }

/* This process, as an executor word. */
static uint64_t executor_self(void)
{
	bool zombie;
	uint64_t start = proc_start((int)getpid(), &zombie);
	return (uint64_t)(uint32_t)start << 32 | (uint32_t)getpid();
}

/* The executor of a word still runs (a zombie does not: its mappings are
 * gone); as owner_alive, on the low 32 bits of the start time. */
static bool executor_alive(uint64_t word)
{
	int pid = executor_pid_of(word);
	if (pid <= 0)
		return false;
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return false;
	bool zombie;
	uint64_t st = proc_start(pid, &zombie);
	return !zombie && (st == 0 || (uint32_t)st == (uint32_t)(word >> 32));
}

vps_result_t vps_registry_expect_executor(struct vps_registry *r, int pid)
{
	if (!r->owner)
		return vps_fail(VPS_EBUSY, "registry %s: only its trainer says which executor it started", r->name);
	if (pid <= 0)
		return vps_fail(VPS_EINPUT, "registry %s: executor pid %d", r->name, pid);
	bool zombie;
	uint64_t start = proc_start(pid, &zombie);
	uint32_t st = atomic_load(&r->h->state);
	uint64_t s = atomic_load(&r->h->seq);
	r->expected = (uint64_t)(uint32_t)start << 32 | (uint32_t)pid;
	r->expected_seq = st == VPS_REG_REQUESTED || st == VPS_REG_RUNNING ? s : s + 1;
	return VPS_OK;
}

int vps_registry_executor_pid(const struct vps_registry *r)
{
	uint64_t word = atomic_load(&r->h->executor);
	return word && executor_alive(word) ? executor_pid_of(word) : 0;
}

/* Whether this handle may write the protocol's fields: the trainer's, or
 * the executor's that still holds the registry. */
static bool holds(const struct vps_registry *r)
{
	return r->owner || (r->executor && atomic_load(&r->h->executor) == r->executor);
}

int vps_registry_owner_pid(const struct vps_registry *r) { return r->h->owner_pid; }

static void shm_path(char *out, size_t n, const char *name) { snprintf(out, n, "/%s", name); }

static void buffer_shm_name(char *out, size_t n, const char *reg, uint64_t serial)
{
	snprintf(out, n, "%s.%" PRIu64, reg, serial);
}

static vps_result_t map_object(const char *name, bool create, size_t size, void **base, size_t *len);
static vps_result_t map_object_prot(const char *name, bool create, bool writable, size_t size, void **base,
				    size_t *len, uint64_t *claimed);

static vps_result_t map_object(const char *name, bool create, size_t size, void **base, size_t *len)
{
	return map_object_prot(name, create, true, size, base, len, NULL);
}

vps_result_t vps_registry_check_object(int fd, const char *name)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return vps_fail_errno("shared memory /dev/shm/%s", name);
	uid_t me = geteuid();
	/* another user's object, or one that others may open, can change under
	 * a switch (or read a job's state out of it): only the executing user's
	 * own, private objects are trusted */
	if (!S_ISREG(st.st_mode))
		return vps_fail(VPS_EINPUT, "shared memory /dev/shm/%s: not a regular file", name);
	if (st.st_uid != me)
		return vps_fail(VPS_EINPUT,
				"shared memory /dev/shm/%s: owned by uid %u, not by this user (uid %u); vps uses only "
				"its own user's objects, of mode 0600",
				name, (unsigned)st.st_uid, (unsigned)me);
	if (st.st_mode & 077)
		return vps_fail(VPS_EINPUT,
				"shared memory /dev/shm/%s: mode %04o lets other users open it; vps uses only objects of "
				"mode 0600 (no group or other access)",
				name, (unsigned)(st.st_mode & 07777));
	return VPS_OK;
}

/* Bytes /dev/shm has free for this user; false when it has no limit
 * (a tmpfs of size 0 reports no blocks) or cannot be asked. */
static bool shm_free(uint64_t *out)
{
	struct statvfs st;
	if (statvfs("/dev/shm", &st) != 0 || !st.f_blocks)
		return false;
	*out = (uint64_t)st.f_bavail * st.f_frsize;
	return true;
}

static int64_t clamp64(uint64_t v) { return v > INT64_MAX ? INT64_MAX : (int64_t)v; }

/* The error of a /dev/shm too small for `need` more bytes: what is free
 * (with the `held` bytes of the failed object, given back with it), and
 * the flag a container (64 MiB of /dev/shm by default) is given more with. */
static vps_result_t shm_full(uint64_t need, uint64_t held)
{
	char n[VPS_UNITS_LEN], f[VPS_UNITS_LEN];
	uint64_t free_bytes;
	vps_format_bytes(clamp64(need), n, sizeof(n));
	if (!shm_free(&free_bytes))
		return vps_fail(VPS_ENOMEM, "/dev/shm: needs %s, and has no room for it (docker: --shm-size)", n);
	return vps_fail(VPS_ENOMEM, "/dev/shm: needs %s, %s free (docker: --shm-size)", n,
			vps_format_bytes(clamp64(free_bytes + held), f, sizeof(f)));
}

vps_result_t vps_registry_check_room(uint64_t bytes)
{
	uint64_t free_bytes;
	return shm_free(&free_bytes) && free_bytes < bytes ? shm_full(bytes, 0) : VPS_OK;
}

/* Where fallocate(2) is not supported (a /dev/shm that is not tmpfs):
 * one byte written into each page allocates it, and fails as a system call
 * (ENOSPC), not as a fault. The object is new: its bytes are zero already. */
static int touch_pages(int fd, size_t at, size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	for (size_t o = at - at % page; o < at + n; o += page) {
		ssize_t w;
		do
			w = pwrite(fd, "", 1, (off_t)o);
		while (w < 0 && errno == EINTR);
		if (w != 1)
			return w < 0 ? errno : EIO;
	}
	return 0;
}

/* Give a new object its pages now. ftruncate alone leaves it sparse: on a
 * /dev/shm too small (a container's 64 MiB) the first write to a page that
 * is not there kills the process with SIGBUS, in the trainer or in the
 * executor that writes its targets. The free-space check first only keeps
 * a request that cannot fit from filling /dev/shm before it fails (other
 * processes' writes would fault meanwhile); it races with them, the
 * reservation does not. In chunks, so that a signal (EINTR: tmpfs gives
 * back what the interrupted call took) costs one chunk, never the progress
 * made. */
static vps_result_t reserve(int fd, const char *name, size_t size)
{
	VPS_CHECK(vps_registry_check_room(size));
	const size_t chunk = (size_t)64 << 20;
	for (size_t at = 0; at < size;) {
		size_t n = size - at < chunk ? size - at : chunk;
		/* fallocate(2), not posix_fallocate: the same fallback under every C
		 * library, and errno from the kernel as it is */
		int err = fallocate(fd, 0, (off_t)at, (off_t)n) == 0 ? 0 : errno;
		if (err == EINTR)
			continue;
		if (err == EOPNOTSUPP || err == ENOSYS)
			err = touch_pages(fd, at, n);
		if (err == ENOSPC)
			return shm_full(size, at);
		if (err == ENOMEM)
			return vps_fail(VPS_ENOMEM, "shared memory /dev/shm/%s: reserve %zu bytes: %s", name, size,
					strerror(err));
		if (err)
			return vps_fail(VPS_ESYS, "shared memory /dev/shm/%s: reserve %zu bytes: %s", name, size,
					strerror(err));
		at += n;
	}
	return VPS_OK;
}

/* claimed (with create; may be NULL): a count of the objects made, raised
 * as soon as the name is this process's (O_EXCL), before the object is
 * sized and reserved, and lowered again when making it fails after that: a
 * trainer stopped while it reserves a large buffer removes that one too
 * (its clean-up removes the serials below the count, from another thread). */
static vps_result_t map_object_prot(const char *name, bool create, bool writable, size_t size, void **base,
				    size_t *len, uint64_t *claimed)
{
	char path[VPS_REGISTRY_NAME_MAX + 16];
	shm_path(path, sizeof(path), name);
	int fd = shm_open(path, create ? O_CREAT | O_EXCL | O_RDWR : writable ? O_RDWR : O_RDONLY, 0600);
	if (fd < 0) {
		int err = errno; /* create looks at EEXIST */
		vps_result_t rc = vps_fail(err == ENOENT ? VPS_ENOTFOUND : VPS_ESYS, "shared memory /dev/shm/%s: %s", name,
					   strerror(err));
		errno = err;
		return rc;
	}
	if (create && claimed)
		__atomic_add_fetch(claimed, 1, __ATOMIC_SEQ_CST);
	if (create) {
		vps_result_t rc = ftruncate(fd, (off_t)size) != 0
					  ? vps_fail_errno("shared memory /dev/shm/%s: resize to %zu bytes", name, size)
					  : reserve(fd, name, size);
		if (rc) {
			close(fd);
			shm_unlink(path);
			if (claimed)
				__atomic_sub_fetch(claimed, 1, __ATOMIC_SEQ_CST);
			errno = 0; /* not EEXIST: the caller retries only a name taken */
			return rc;
		}
	}
	if (!create) {
		vps_result_t rc = vps_registry_check_object(fd, name);
		struct stat st;
		if (!rc && fstat(fd, &st) != 0)
			rc = vps_fail_errno("shared memory /dev/shm/%s", name);
		if (rc) {
			close(fd);
			return rc;
		}
		size = (size_t)st.st_size;
	}
	/* the executor maps what the trainer filled: populate the page tables
	 * now, not one fault per page in the middle of a transfer */
	int flags = MAP_SHARED | (create ? 0 : MAP_POPULATE);
	void *p = size ? mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, flags, fd, 0) : NULL;
	close(fd);
	if (size && p == MAP_FAILED)
		return vps_fail_errno("shared memory /dev/shm/%s: map %zu bytes", name, size);
	*base = p;
	*len = size;
	return VPS_OK;
}

static vps_result_t remember(struct vps_registry *r, void *base, size_t len, const char *object)
{
	VPS_CHECK(VPS_GROW(r->maps, r->capmaps, r->nmaps + 1));
	struct mapping *m = &r->maps[r->nmaps++];
	memset(m, 0, sizeof(*m));
	m->base = base;
	m->len = len;
	if (object)
		snprintf(m->object, sizeof(m->object), "%s", object);
	return VPS_OK;
}

/* A handle on a mapped registry. */
static vps_result_t wrap(const char *name, void *base, size_t len, bool owner, struct vps_registry **out)
{
	struct vps_registry *r = vps_calloc(1, sizeof(*r));
	if (!r) {
		munmap(base, len);
		return VPS_ENOMEM;
	}
	snprintf(r->name, sizeof(r->name), "%s", name);
	r->h = base;
	r->size = len;
	r->owner = owner;
	*out = r;
	return VPS_OK;
}

static vps_result_t attach(struct vps_registry **out, const char *name)
{
	void *base;
	size_t len;
	vps_result_t rc = map_object(name, false, 0, &base, &len);
	if (rc == VPS_ENOTFOUND)
		return vps_fail(rc, "no trainer has created registry %s (/dev/shm/%s: %s)", name, name, strerror(ENOENT));
	VPS_CHECK(rc);
	struct reg_header *h = base;
	static const char none[8];
	if (len < sizeof(*h) || !memcmp(h->magic, none, 8)) {
		/* the trainer is creating it: the magic is written last */
		if (len)
			munmap(base, len);
		return vps_fail(VPS_ENOTFOUND, "registry %s is not ready yet", name);
	}
	if (memcmp(h->magic, REG_MAGIC, 8) != 0) {
		munmap(base, len);
		return vps_fail(VPS_EFORMAT, "registry %s: not a vps registry", name);
	}
	/* read what the messages need before unmapping */
	uint32_t version = h->version, max = h->max_entries, n = atomic_load(&h->nentries);
	if (version != VPS_REGISTRY_VERSION || h->entry_size != sizeof(struct reg_entry)) {
		munmap(base, len);
		return vps_fail(VPS_EFORMAT, "registry %s: version %u, this build reads %d", name, version,
				VPS_REGISTRY_VERSION);
	}
	if (len < sizeof(*h) + (size_t)max * sizeof(struct reg_entry) || n > max) {
		munmap(base, len);
		return vps_fail(VPS_EFORMAT, "registry %s: corrupt: %u of %u entries in %zu bytes", name, n, max, len);
	}
	return wrap(name, base, len, false, out);
}

/* The header of an existing object NAME, read without mapping it, and
 * whether it is a vps registry. *found is false when there is none. */
static vps_result_t read_header(const char *name, bool *found, struct stat *st, struct reg_header *h, bool *is_reg)
{
	char path[VPS_REGISTRY_NAME_MAX + 16];
	shm_path(path, sizeof(path), name);
	*found = *is_reg = false;
	memset(h, 0, sizeof(*h));
	int fd = shm_open(path, O_RDONLY, 0);
	if (fd < 0) {
		if (errno == ENOENT)
			return VPS_OK;
		return vps_fail_errno("/dev/shm/%s", name);
	}
	*found = true;
	ssize_t n = fstat(fd, st) == 0 ? pread(fd, (void *)h, sizeof(*h), 0) : -1;
	int err = errno;
	close(fd);
	if (n < 0) {
		errno = err;
		return vps_fail_errno("/dev/shm/%s", name);
	}
	*is_reg = S_ISREG(st->st_mode) && (size_t)n == sizeof(*h) && !memcmp(h->magic, REG_MAGIC, 8) &&
		  h->version == VPS_REGISTRY_VERSION && h->entry_size == sizeof(struct reg_entry);
	return VPS_OK;
}

/* Remove the buffer objects a registry made: NAME.N with N below its object
 * counter, regular files of the registry's owner. Anything else whose name
 * starts with NAME. is not the registry's and is left alone. */
static void remove_buffers(const char *name, uint64_t next_object, uid_t uid)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	size_t n = strlen(name);
	for (struct dirent *e; (e = readdir(d));) {
		if (strncmp(e->d_name, name, n) || e->d_name[n] != '.')
			continue;
		/* the serial as buffer_shm_name writes it: digits, no leading zero */
		const char *s = e->d_name + n + 1;
		bool ok = *s && (s[0] != '0' || !s[1]);
		uint64_t v = 0;
		for (const char *c = s; ok && *c; c++) {
			ok = *c >= '0' && *c <= '9' && v <= (UINT64_MAX - 9) / 10;
			v = v * 10 + (uint64_t)(*c - '0');
		}
		struct stat st;
		if (!ok || v >= next_object || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISREG(st.st_mode) || st.st_uid != uid)
			continue;
		char path[sizeof(e->d_name) + 2];
		snprintf(path, sizeof(path), "/%s", e->d_name);
		shm_unlink(path);
	}
	closedir(d);
}

/* Remove the registry NAME and its buffer objects when they are this user's
 * and their trainer is gone (or, with `mine`, is this process); refuse
 * anything else. Without `replace` a stale one is refused too. */
static vps_result_t remove_registry(const char *name, bool replace, bool mine)
{
	bool found, is_reg;
	struct stat st;
	struct reg_header h;
	VPS_CHECK(read_header(name, &found, &st, &h, &is_reg));
	if (!found)
		return VPS_OK;
	if (!is_reg)
		return vps_fail(VPS_EINPUT,
				"/dev/shm/%s exists and is not a vps registry (or its trainer is still creating it); "
				"it is left alone: choose another registry name, or remove it",
				name);
	int pid = h.owner_pid;
	if (owner_alive(&h) && !(mine && pid == (int)getpid()))
		return vps_fail(VPS_EINPUT, "registry %s is in use by pid %d, its live trainer", name, pid);
	uid_t me = geteuid();
	if (st.st_uid != me)
		return vps_fail(VPS_EINPUT,
				"registry %s is stale (its trainer, pid %d, is gone) and owned by uid %u, not by this "
				"user (uid %u): it is left alone; remove /dev/shm/%s",
				name, pid, (unsigned)st.st_uid, (unsigned)me, name);
	if (!replace)
		return vps_fail(VPS_EINPUT, "registry %s is stale (its trainer, pid %d, is gone); remove /dev/shm/%s",
				name, pid, name);
	remove_buffers(name, h.next_object, me);
	char path[VPS_REGISTRY_NAME_MAX + 16];
	shm_path(path, sizeof(path), name);
	if (shm_unlink(path) != 0 && errno != ENOENT)
		return vps_fail_errno("registry %s: remove", name);
	return VPS_OK;
}

vps_result_t vps_registry_unlink(const char *name)
{
	VPS_CHECK(check_name(name));
	return remove_registry(name, true, true);
}

vps_result_t vps_registry_reset(struct vps_registry *r, uint64_t layout_hash, int64_t rank)
{
	uint32_t st = atomic_load(&r->h->state);
	if (st == VPS_REG_REQUESTED || st == VPS_REG_RUNNING)
		return vps_fail(VPS_EINPUT, "registry %s: a switch is under way", r->name);
	atomic_store(&r->h->nentries, 0);
	/* an abort is the word of an executor that stopped; the next switch is
	 * another executor's (a retry after a failed one, an elastic job's next
	 * world), which must not find the old one's stop */
	atomic_store(&r->h->aborted, 0);
	r->h->abort_message[0] = '\0';
	r->h->layout_hash = layout_hash;
	r->h->rank = rank;
	r->h->target_hash = 0;
	r->h->target_rank = -1;
	return VPS_OK;
}

vps_result_t vps_registry_create(struct vps_registry **out, const char *name, uint64_t layout_hash, int64_t rank,
				 uint32_t max_entries, int replace_stale)
{
	VPS_CHECK(check_name(name));
	if (!max_entries || max_entries > (1u << 20))
		return vps_fail(VPS_EINPUT, "registry %s: max_entries must be 1 to %u", name, 1u << 20);
	size_t size = sizeof(struct reg_header) + (size_t)max_entries * sizeof(struct reg_entry);
	void *base;
	size_t len;
	vps_result_t rc = map_object(name, true, size, &base, &len);
	if (rc && errno == EEXIST) {
		VPS_CHECK(remove_registry(name, replace_stale, false));
		rc = map_object(name, true, size, &base, &len);
	}
	if (rc)
		return rc;
	struct reg_header *h = base;
	memset(h, 0, size);
	h->version = VPS_REGISTRY_VERSION;
	h->header_size = sizeof(*h);
	h->entry_size = sizeof(struct reg_entry);
	h->max_entries = max_entries;
	h->owner_pid = (int32_t)getpid();
	bool zombie;
	h->owner_start = proc_start((int)getpid(), &zombie);
	h->layout_hash = layout_hash;
	h->rank = rank;
	h->target_rank = -1;
	atomic_store(&h->state, VPS_REG_IDLE);
	/* the magic last: an executor never sees a half-made registry */
	atomic_thread_fence(memory_order_release);
	memcpy(h->magic, REG_MAGIC, 8);
	return wrap(name, base, len, true, out);
}

/* Hold the registry as its executor: compare-and-swap this process's word
 * over none, or over an executor that is gone. Two executors of one job
 * (a duplicate rank), or another job's executors given the same names,
 * would otherwise claim each other's requests and abort each other's
 * trainers. */
static vps_result_t take_executor(struct vps_registry *r)
{
	struct reg_header *h = r->h;
	uint64_t mine = executor_self(), held = atomic_load(&h->executor);
	do {
		if (held && executor_alive(held))
			return vps_fail(VPS_EBUSY, "registry %s is in use by another executor (pid %d%s); one executor "
					"serves a registry",
					r->name, executor_pid_of(held),
					executor_pid_of(held) == (int)getpid() ? ", this process" : "");
	} while (!atomic_compare_exchange_strong(&h->executor, &held, mine));
	r->executor = mine;
	/* the executor before this one is gone: a switch it was running cannot
	 * end now (nobody else moves a running switch on), and what it said
	 * when it stopped is not this executor's */
	if (held && atomic_load(&h->state) == VPS_REG_RUNNING) {
		snprintf(h->failure, sizeof(h->failure), "its executor (pid %d) is gone", executor_pid_of(held));
		uint32_t running = VPS_REG_RUNNING;
		if (atomic_compare_exchange_strong(&h->state, &running, VPS_REG_FAILED))
			ring(h);
	}
	atomic_store(&h->aborted, 0);
	return VPS_OK;
}

vps_result_t vps_registry_open(struct vps_registry **out, const char *name)
{
	VPS_CHECK(check_name(name));
	VPS_CHECK(attach(out, name));
	vps_result_t rc = VPS_OK;
	if (!owner_alive((*out)->h))
		rc = vps_fail(VPS_ESTALE, "registry %s is stale (its trainer, pid %d, is gone)", name, (*out)->h->owner_pid);
	else
		rc = take_executor(*out);
	if (rc) {
		vps_registry_close(*out);
		*out = NULL;
	}
	return rc;
}

void vps_registry_close(struct vps_registry *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nmaps; i++)
		if (r->maps[i].base)
			munmap(r->maps[i].base, r->maps[i].len);
	free(r->maps);
	if (r->owner) {
		char name[VPS_REGISTRY_NAME_MAX + 2];
		snprintf(name, sizeof(name), "%s", r->name);
		munmap(r->h, r->size);
		/* a failure to clean up must not hide why the trainer stopped */
		char saved[1024];
		snprintf(saved, sizeof(saved), "%s", vps_last_error());
		if (remove_registry(name, true, true))
			vps_fail(VPS_OK, "%s", saved);
	} else {
		/* a child that inherited the handle does not hold the registry */
		uint64_t mine = r->executor;
		if (mine && executor_pid_of(mine) == (int)getpid())
			atomic_compare_exchange_strong(&r->h->executor, &mine, 0);
		munmap(r->h, r->size);
	}
	free(r);
}

const char *vps_registry_name(const struct vps_registry *r) { return r->name; }
uint64_t vps_registry_layout_hash(const struct vps_registry *r) { return r->h->layout_hash; }
int64_t vps_registry_rank(const struct vps_registry *r) { return r->h->rank; }
uint64_t vps_registry_target_hash(const struct vps_registry *r) { return r->h->target_hash; }
int64_t vps_registry_target_rank(const struct vps_registry *r) { return r->h->target_rank; }

vps_result_t vps_registry_set_target(struct vps_registry *r, uint64_t target_hash, int64_t target_rank)
{
	r->h->target_hash = target_hash;
	r->h->target_rank = target_rank;
	return VPS_OK;
}

/* The registry sits below the model room: enum vps_dtype's sizes, here. */
static uint64_t dtype_bytes(int dtype) { return dtype == VPS_DTYPE_FP32 ? 4 : 2; }

static vps_result_t add_entry(struct vps_registry *r, int role, uint32_t buffer, int state, int dtype,
			      int64_t elements, struct reg_entry **out)
{
	if (role != VPS_ROLE_SOURCE && role != VPS_ROLE_TARGET)
		return vps_fail(VPS_EINPUT, "registry %s: role must be source (0) or target (1)", r->name);
	if (dtype != VPS_DTYPE_BF16 && dtype != VPS_DTYPE_FP32 && dtype != VPS_DTYPE_INT16)
		return vps_fail(VPS_EINPUT, "registry %s: dtype must be bf16 (0), fp32 (1) or int16 (2)", r->name);
	if (vps_registry_find(r, role, buffer) >= 0)
		return vps_fail(VPS_EINPUT, "registry %s: %s buffer %u is registered twice", r->name,
				role == VPS_ROLE_SOURCE ? "source" : "target", buffer);
	uint32_t n = atomic_load(&r->h->nentries);
	if (n >= r->h->max_entries)
		return vps_fail(VPS_EINPUT, "registry %s: full (%u entries)", r->name, r->h->max_entries);
	struct reg_entry *e = &r->h->entries[n];
	memset(e, 0, sizeof(*e));
	e->role = (uint32_t)role;
	e->buffer = buffer;
	e->state = state;
	e->dtype = dtype;
	e->elements = elements;
	e->bytes = (uint64_t)elements * dtype_bytes(dtype);
	*out = e;
	return VPS_OK;
}

static void publish(struct vps_registry *r)
{
	atomic_fetch_add_explicit(&r->h->nentries, 1, memory_order_release);
}

vps_result_t vps_registry_alloc_host(struct vps_registry *r, enum vps_registry_role role, uint32_t buffer,
			enum vps_state state, enum vps_dtype dtype,
				     int64_t elements, void **ptr)
{
	struct reg_entry *e;
	VPS_CHECK(add_entry(r, role, buffer, state, dtype, elements, &e));
	/* counted once this trainer owns the name, before its pages are
	 * reserved: the clean-up removes only serials below the count, so a
	 * foreign object of that name (EEXIST) is never counted, and one this
	 * trainer is still reserving is */
	buffer_shm_name(e->shm_name, sizeof(e->shm_name), r->name, r->h->next_object);
	void *base;
	size_t len;
	vps_result_t rc = map_object_prot(e->shm_name, true, true, e->bytes ? e->bytes : 1, &base, &len,
					  &r->h->next_object);
	if (rc && errno == EEXIST)
		return vps_fail(VPS_EINPUT,
				"registry %s: /dev/shm/%s exists and is not this registry's (another program's, or "
				"another user's stale trainer's): it is left alone; remove it or choose another registry name",
				r->name, e->shm_name);
	if (rc)
		return rc;
	if (remember(r, base, len, e->shm_name)) {
		munmap(base, len);
		return VPS_ENOMEM;
	}
	e->where = VPS_WHERE_HOST;
	publish(r);
	*ptr = base;
	return VPS_OK;
}

vps_result_t vps_registry_add_host(struct vps_registry *r, enum vps_registry_role role, uint32_t buffer,
			enum vps_state state, enum vps_dtype dtype,
				   int64_t elements, const char *shm_name, uint64_t offset)
{
	struct reg_entry *e;
	if (strlen(shm_name) > VPS_REGISTRY_NAME_MAX)
		return vps_fail(VPS_EINPUT, "shared memory name '%s' is too long", shm_name);
	VPS_CHECK(add_entry(r, role, buffer, state, dtype, elements, &e));
	snprintf(e->shm_name, sizeof(e->shm_name), "%s", shm_name);
	e->offset = offset;
	e->where = VPS_WHERE_HOST;
	publish(r);
	return VPS_OK;
}

vps_result_t vps_registry_add_cuda(struct vps_registry *r, enum vps_registry_role role, uint32_t buffer,
			enum vps_state state, enum vps_dtype dtype,
				   int64_t elements, int device, const void *ipc_handle, uint64_t offset)
{
	struct reg_entry *e;
	VPS_CHECK(add_entry(r, role, buffer, state, dtype, elements, &e));
	e->where = VPS_WHERE_CUDA;
	e->device = device;
	memcpy(e->ipc, ipc_handle, sizeof(e->ipc));
	e->offset = offset;
	publish(r);
	return VPS_OK;
}

vps_result_t vps_registry_add_cuda_ptr(struct vps_registry *r, enum vps_registry_role role, uint32_t buffer,
			enum vps_state state, enum vps_dtype dtype,
				       int64_t elements, const void *ptr)
{
	const struct vps_cuda_api *gpu;
	VPS_CHECK(vps_gpu_api(&gpu));
	unsigned char handle[VPS_CUDA_IPC_HANDLE];
	uint64_t offset = 0, alloc = 0;
	int device = 0;
	char err[VPS_CUDA_ERR] = "";
	int rc = gpu->ipc_handle(ptr, handle, &offset, &alloc, &device, err);
	if (rc)
		return vps_gpu_result(rc, err, r->name);
	uint64_t bytes = (uint64_t)(elements < 0 ? 0 : elements) * dtype_bytes(dtype);
	if (elements < 0 || offset > alloc || bytes > alloc - offset)
		return vps_fail(VPS_EINPUT, "registry %s: buffer %u: %" PRId64 " elements at offset %" PRIu64
				" overrun their GPU allocation of %" PRIu64 " bytes", r->name, buffer, elements, offset, alloc);
	return vps_registry_add_cuda(r, role, buffer, state, dtype, elements, device, handle, offset);
}

uint32_t vps_registry_num_entries(const struct vps_registry *r)
{
	return atomic_load_explicit(&r->h->nentries, memory_order_acquire);
}

vps_result_t vps_registry_entry(const struct vps_registry *r, uint32_t i, struct vps_registry_entry_info *out)
{
	if (i >= vps_registry_num_entries(r))
		return vps_fail(VPS_EINPUT, "registry %s: no entry %u", r->name, i);
	const struct reg_entry *e = &r->h->entries[i];
	memset(out, 0, sizeof(*out));
	out->role = (int)e->role;
	out->buffer = e->buffer;
	out->state = e->state;
	out->dtype = e->dtype;
	out->elements = e->elements;
	out->bytes = e->bytes;
	out->where = (int)e->where;
	snprintf(out->shm_name, sizeof(out->shm_name), "%s", e->shm_name);
	out->offset = e->offset;
	out->device = e->device;
	memcpy(out->ipc_handle, e->ipc, sizeof(out->ipc_handle));
	out->released = (int)atomic_load(&((struct reg_entry *)e)->released);
	return VPS_OK;
}

int64_t vps_registry_find(const struct vps_registry *r, enum vps_registry_role role, uint32_t buffer)
{
	uint32_t n = vps_registry_num_entries(r);
	for (uint32_t i = 0; i < n; i++)
		if (r->h->entries[i].role == (uint32_t)role && r->h->entries[i].buffer == buffer)
			return i;
	return -1;
}

vps_result_t vps_registry_map(struct vps_registry *r, uint32_t i, bool writable, void **ptr)
{
	struct vps_registry_entry_info e;
	VPS_CHECK(vps_registry_entry(r, i, &e));
	if (e.where != VPS_WHERE_HOST)
		return vps_fail(VPS_EUNSUPPORTED, "registry %s: entry %u is GPU memory, which is not mapped into the host",
				r->name, i);
	void *base;
	size_t len;
	VPS_CHECK(map_object_prot(e.shm_name, false, writable, 0, &base, &len, NULL));
	if (e.offset > len || e.bytes > len - e.offset) { /* no wrap-around */
		munmap(base, len);
		return vps_fail(VPS_EINPUT, "registry %s: entry %u needs %" PRIu64 " bytes at offset %" PRIu64
				" of /dev/shm/%s, which has %zu", r->name, i, e.bytes, e.offset, e.shm_name, len);
	}
	if (remember(r, base, len, NULL)) {
		munmap(base, len);
		return VPS_ENOMEM;
	}
	*ptr = (unsigned char *)base + e.offset;
	return VPS_OK;
}

vps_result_t vps_registry_free_host(struct vps_registry *r, void *ptr)
{
	size_t i = 0;
	while (i < r->nmaps && (r->maps[i].base != ptr || !r->maps[i].object[0]))
		i++;
	if (!r->owner || !ptr || i == r->nmaps)
		return vps_fail(VPS_EINPUT, "registry %s: no host buffer of its own at %p", r->name, ptr);
	uint32_t n = vps_registry_num_entries(r);
	for (uint32_t k = 0; k < n; k++)
		if (r->h->entries[k].where == VPS_WHERE_HOST && !strcmp(r->h->entries[k].shm_name, r->maps[i].object))
			return vps_fail(VPS_EINPUT, "registry %s: /dev/shm/%s is still registered (entry %u)", r->name,
					r->maps[i].object, k);
	/* an executor that still maps it keeps its pages until it unmaps */
	char path[VPS_REGISTRY_NAME_MAX + 16];
	shm_path(path, sizeof(path), r->maps[i].object);
	munmap(r->maps[i].base, r->maps[i].len);
	int failed = shm_unlink(path) != 0 && errno != ENOENT;
	vps_result_t rc = failed ? vps_fail_errno("registry %s: remove /dev/shm/%s", r->name, r->maps[i].object) : VPS_OK;
	r->maps[i] = r->maps[--r->nmaps];
	return rc;
}

void vps_registry_release(struct vps_registry *r, uint32_t i)
{
	if (holds(r) && i < vps_registry_num_entries(r))
		atomic_store(&r->h->entries[i].released, 1);
}

/* ---- protocol ---- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The failure of a request an executor's abort ended. */
static void stopped_failure(struct reg_header *h)
{
	snprintf(h->failure, sizeof(h->failure), "the executor stopped: %.200s", h->abort_message);
}

vps_result_t vps_registry_request(struct vps_registry *r, uint64_t *seq)
{
	uint32_t st = atomic_load(&r->h->state);
	if (st == VPS_REG_REQUESTED || st == VPS_REG_RUNNING)
		return vps_fail(VPS_EINPUT, "registry %s: a switch is already under way", r->name);
	uint64_t s = atomic_load(&r->h->seq) + 1;
	/* the request an executor's abort ends fails at once, and is spent: the
	 * trainer's retry after it waits for the executor started for it, which
	 * may not have taken the registry yet */
	if (atomic_load(&r->h->aborted) && atomic_load(&r->h->abort_seq) == s) {
		stopped_failure(r->h);
		atomic_store(&r->h->seq, s);
		atomic_store(&r->h->state, VPS_REG_FAILED);
		ring(r->h);
		*seq = s;
		return vps_fail(VPS_EPEER, "switch %" PRIu64 " failed: %.230s", s, r->h->failure);
	}
	r->h->failure[0] = '\0';
	/* an executor killed before it closed left its word: the wait below
	 * must not take this request for one that executor dropped */
	uint64_t ex = atomic_load(&r->h->executor);
	if (ex && !executor_alive(ex))
		atomic_compare_exchange_strong(&r->h->executor, &ex, 0);
	atomic_store(&r->h->seq, s);
	atomic_store(&r->h->state, VPS_REG_REQUESTED);
	ring(r->h);
	*seq = s;
	return VPS_OK;
}

/* Seconds a wait that started at start, with timeout (< 0: none), may
 * still sleep before it must look, at most `most`. */
static double sleep_for(double start, double timeout, double most)
{
	double left = timeout < 0 ? most : start + timeout - now();
	return left < most ? left : most;
}

vps_result_t vps_registry_wait(struct vps_registry *r, uint64_t seq, double timeout)
{
	double start = now(), looked = -1;
	for (;;) {
		/* read before looking: what happens from here on rings it */
		uint32_t bell = atomic_load(&r->h->bell);
		uint32_t st = atomic_load(&r->h->state);
		uint64_t s = atomic_load(&r->h->seq);
		if (s == seq && st == VPS_REG_DONE)
			return VPS_OK;
		if (s == seq && st == VPS_REG_FAILED)
			return vps_fail(VPS_EPEER, "switch %" PRIu64 " failed: %.255s", seq, r->h->failure);
		/* an abort made as this request was posted ends it, unless an
		 * executor after the one that stopped has claimed it */
		if (s == seq && st == VPS_REG_REQUESTED && atomic_load(&r->h->aborted) &&
		    atomic_load(&r->h->abort_seq) == seq) {
			uint32_t requested = VPS_REG_REQUESTED;
			if (r->owner) {
				stopped_failure(r->h);
				if (!atomic_compare_exchange_strong(&r->h->state, &requested, VPS_REG_FAILED))
					continue;
			}
			return vps_fail(VPS_EPEER, "switch %" PRIu64 " failed: the executor stopped: %.200s", seq,
					r->h->abort_message);
		}
		/* an executor that died mid-switch cannot say so: look for it, and
		 * end its switch, so that the trainer may ask again; so too one that
		 * held the registry when it was requested and died before claiming
		 * it (a launcher killed it frozen), and the one the trainer started
		 * for this switch, dead before it opened the registry */
		uint64_t ex = atomic_load(&r->h->executor);
		bool expects = r->expected && r->expected_seq == seq;
		double t = now();
		bool looked_for = s == seq && (looked < 0 || t - looked >= LOOK_GONE) &&
				  (st == VPS_REG_RUNNING || (st == VPS_REG_REQUESTED && (ex || expects)));
		if (looked_for)
			looked = t;
		bool never_came = looked_for && st == VPS_REG_REQUESTED && !ex && !executor_alive(r->expected);
		if (looked_for && (never_came || (ex ? !executor_alive(ex) : st == VPS_REG_RUNNING))) {
			char gone[96] = "its executor is gone";
			if (never_came)
				snprintf(gone, sizeof(gone), "the executor started for it (pid %d) exited, and none holds the "
					 "registry", executor_pid_of(r->expected));
			else if (ex)
				snprintf(gone, sizeof(gone), "its executor (pid %d) is gone", executor_pid_of(ex));
			uint32_t running = st;
			if (r->owner) {
				snprintf(r->h->failure, sizeof(r->h->failure), "%s", gone);
				if (!atomic_compare_exchange_strong(&r->h->state, &running, VPS_REG_FAILED))
					continue; /* claimed or ended meanwhile */
			}
			return vps_fail(VPS_EPEER, "switch %" PRIu64 " failed: %s", seq, gone);
		}
		if (timeout >= 0 && t - start > timeout) {
			char what[256];
			vps_registry_describe(r, what, sizeof(what));
			return vps_fail(VPS_ETIMEOUT, "registry %s: switch %" PRIu64 " not done after %.1f s: %s", r->name,
					seq, timeout, what);
		}
		/* the verdict rings; a death does not, and is looked for again */
		vps_registry_await(r, bell, sleep_for(start, timeout, LOOK_GONE) + 1e-4);
	}
}

vps_result_t vps_registry_claim(struct vps_registry *r, uint64_t after_seq, double timeout, uint64_t *seq)
{
	double start = now();
	for (;;) {
		if (!holds(r) || r->owner)
			return vps_fail(VPS_EBUSY, "registry %s: this handle is not the executor that holds it", r->name);
		uint32_t bell = atomic_load(&r->h->bell);
		uint32_t want = VPS_REG_REQUESTED;
		uint64_t s = atomic_load(&r->h->seq);
		if (s > after_seq && atomic_compare_exchange_strong(&r->h->state, &want, VPS_REG_RUNNING)) {
			*seq = s;
			return VPS_OK;
		}
		if (!owner_alive(r->h))
			return vps_fail(VPS_EPEER, "registry %s: the trainer (pid %d) is gone", r->name, r->h->owner_pid);
		if (timeout >= 0 && now() - start > timeout)
			return vps_fail(VPS_ETIMEOUT, "registry %s: no switch requested within %.1f s", r->name, timeout);
		/* the request rings; a trainer's death does not */
		vps_registry_await(r, bell, sleep_for(start, timeout, LOOK_OWNER) + 1e-4);
	}
}

void vps_registry_finish(struct vps_registry *r, uint64_t seq, int ok, const char *message)
{
	if (!holds(r) || atomic_load(&r->h->seq) != seq)
		return;
	if (!ok) {
		snprintf(r->h->failure, sizeof(r->h->failure), "%s", message ? message : "failed");
		r->failed_seq = seq;
	}
	atomic_store(&r->h->state, ok ? VPS_REG_DONE : VPS_REG_FAILED);
	ring(r->h);
}

void vps_registry_abort(struct vps_registry *r, const char *message)
{
	if (!holds(r))
		return;
	struct reg_header *h = r->h;
	uint64_t s = atomic_load(&h->seq);
	uint32_t st = atomic_load(&h->state);
	/* a switch this executor ended as failed was told why already */
	if (st == VPS_REG_FAILED && r->failed_seq == s)
		return;
	snprintf(h->abort_message, sizeof(h->abort_message), "%s", message ? message : "failed");
	bool in_flight = st == VPS_REG_REQUESTED || st == VPS_REG_RUNNING;
	atomic_store(&h->abort_seq, in_flight ? s : s + 1);
	atomic_store(&h->aborted, 1);
	if (in_flight) {
		/* the request it ends fails now: no later executor claims it */
		stopped_failure(h);
		atomic_compare_exchange_strong(&h->state, &st, VPS_REG_FAILED);
	}
	ring(h);
}

int vps_registry_state(const struct vps_registry *r, uint64_t *seq)
{
	if (seq)
		*seq = atomic_load(&r->h->seq);
	return (int)atomic_load(&r->h->state);
}

const char *vps_registry_failure(const struct vps_registry *r) { return r->h->failure; }

const char *vps_registry_state_name(enum vps_registry_state state)
{
	static const char *const names[] = {"idle", "requested", "running", "done", "failed"};
	return state >= 0 && state < (int)(sizeof(names) / sizeof(*names)) ? names[state] : "unknown";
}

void vps_registry_describe(const struct vps_registry *r, char *out, size_t size)
{
	int st = vps_registry_state(r, NULL), ex = vps_registry_executor_pid(r);
	const char *name = vps_registry_state_name(st);
	if (!ex && st == VPS_REG_REQUESTED)
		snprintf(out, size, "%s; no executor has attached to it (is vps-exec running, with the same --registry?)",
			 name);
	else if (st == VPS_REG_REQUESTED)
		snprintf(out, size, "requested; its executor (pid %d) has not claimed it yet: it meets the other ranks first",
			 ex);
	else if (st == VPS_REG_RUNNING && ex)
		snprintf(out, size, "running in its executor (pid %d), which waits for the other ranks or moves the state",
			 ex);
	else if (st == VPS_REG_RUNNING)
		snprintf(out, size, "running, and its executor is gone");
	else if (st == VPS_REG_FAILED)
		snprintf(out, size, "failed: %.200s", r->h->failure);
	else
		snprintf(out, size, "%s", name);
}

vps_result_t vps_registry_expand(const char *pattern, const struct vps_registry_name_parts *parts, char *out,
				 size_t size)
{
	size_t len = 0;
	char room[VPS_REGISTRY_NAME_MAX + 2];
	/* written to room first: a pattern expands to a name or to nothing */
	for (const char *c = pattern; *c; c++) {
		char piece[24];
		if (*c != '%') {
			piece[0] = *c;
			piece[1] = '\0';
		} else if (c[1] == 'j') {
			snprintf(piece, sizeof(piece), "%08" PRIx32, (uint32_t)parts->job);
		} else if (c[1] == 'r' || c[1] == 'a' || c[1] == 'b' || c[1] == 'l') {
			int64_t v = c[1] == 'r' ? parts->rank : c[1] == 'a' ? parts->a_rank : c[1] == 'b' ? parts->b_rank
													   : parts->local_rank;
			snprintf(piece, sizeof(piece), "%" PRId64, v);
		} else if (c[1] == '%') {
			snprintf(piece, sizeof(piece), "%%");
		} else {
			return vps_fail(VPS_EINPUT, "registry name '%s': unknown '%%%.1s' (%%j job, %%r world rank, %%a source "
					"rank, %%b target rank, %%l local rank, %%%% a percent sign)", pattern, c + 1);
		}
		if (*c == '%')
			c++;
		size_t n = strlen(piece);
		if (len + n > VPS_REGISTRY_NAME_MAX)
			return vps_fail(VPS_EINPUT, "registry name '%s': longer than %d characters", pattern,
					VPS_REGISTRY_NAME_MAX);
		memcpy(room + len, piece, n);
		len += n;
	}
	room[len] = '\0';
	VPS_CHECK(check_name(room));
	if (len >= size)
		return vps_fail(VPS_EINPUT, "registry name '%s': no room for it", pattern);
	memcpy(out, room, len + 1);
	return VPS_OK;
}

void vps_registry_get_training(const struct vps_registry *r, struct vps_registry_training *t)
{
	*t = r->h->training;
}

void vps_registry_set_training(struct vps_registry *r, const struct vps_registry_training *t)
{
	if (holds(r))
		r->h->training = *t;
}
