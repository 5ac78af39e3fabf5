/* What the two stand-ins (cuda.c: libvps-cuda-standin.so, nccl.c:
 * libnccl-standin.so) share: the stream through which NCCL's work is
 * ordered with the copy kernels, and how an object of a dead process is
 * told from a live one's.
 *
 * Test instruments, never part of libvps: see docs/exec.md, "The
 * stand-ins". */
#ifndef VPS_STANDIN_H
#define VPS_STANDIN_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The cudaStream_t that the CUDA stand-in hands to NCCL points at this. A
 * grouped exchange is queued as one item, after everything queued before
 * it, as ncclGroupEnd queues NCCL's kernel. run(arg, cancelled, ...) owns
 * arg: it frees it, and does nothing else when cancelled (a kernel before
 * it faulted, which kills a CUDA context). A nonzero return from run is a
 * fault of the stream (sticky), with the message in err. enqueue returns
 * nonzero when the stream is dead already, with the reason in err; arg is
 * then still the caller's. */
#define STANDIN_STREAM_MAGIC 0x53545245414d5331ULL /* "STREAMS1" */
#define STANDIN_ERR 512
typedef int (*standin_run_fn)(void *arg, bool cancelled, char *err);
struct standin_stream {
	uint64_t magic;
	int (*enqueue)(struct standin_stream *s, standin_run_fn run, void *arg, char *err);
};

/* A process's start time (field 22 of /proc/PID/stat), 0 when it is gone
 * or a zombie: a pid and its start time name one process, so a reused pid
 * is not taken for the old one. */
static inline uint64_t standin_start_time(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* the name may hold spaces and parentheses: fields count from the last ')' */
	char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
		return 0;
	p += 2;
	unsigned long long start = 0;
	/* state is field 3; the start time field 22 */
	for (int field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p || sscanf(p, "%llu", &start) != 1)
		return 0;
	return start;
}

static inline bool standin_alive(pid_t pid, uint64_t start)
{
	return pid > 0 && start && standin_start_time(pid) == start;
}

/* Size a new object and give it its pages now, as libvps does with its
 * own (lib/registry): ftruncate alone leaves it sparse, and on a /dev/shm
 * too small (a container's 64 MiB) the first write to a page that is not
 * there kills the process with SIGBUS instead of failing the call. (glibc's
 * posix_fallocate writes into each block itself where the file system has
 * no fallocate.) @return 0, or an errno (ENOSPC). */
static inline int standin_reserve(int fd, size_t size)
{
	if (ftruncate(fd, (off_t)size) != 0)
		return errno;
	int err;
	do
		err = posix_fallocate(fd, 0, (off_t)size);
	while (err == EINTR);
	return err;
}

/* Objects named PREFIX<pid hex>-<start hex>-... of this user whose process
 * is gone are removed: the driver frees a dead process's memory, and NCCL's
 * bootstrap state dies with its ranks. */
static inline void standin_sweep(const char *prefix)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	size_t len = strlen(prefix);
	struct dirent *e;
	while ((e = readdir(d))) {
		unsigned pid;
		unsigned long long start;
		if (strncmp(e->d_name, prefix, len) || sscanf(e->d_name + len, "%x-%llx-", &pid, &start) != 2)
			continue;
		if (standin_alive((pid_t)pid, start))
			continue;
		char path[300];
		struct stat st;
		snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
		if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
			snprintf(path, sizeof(path), "/%s", e->d_name);
			shm_unlink(path);
		}
	}
	closedir(d);
}

#endif
