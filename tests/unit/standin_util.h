/* For the stand-ins' unit tests: the stand-ins beside this test's build
 * (BUILDDIR/tests/ -> BUILDDIR/standin/), and ranks as forked processes.
 * A rank reports through its exit status: CHILD_CHECK prints what failed
 * and marks the rank failed. */
#ifndef VPS_STANDIN_UTIL_H
#define VPS_STANDIN_UTIL_H

#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static int child_failed;

#define CHILD_CHECK(cond)                                                                                      \
	do {                                                                                                   \
		if (!(cond)) {                                                                                 \
			fprintf(stderr, "  rank %d (pid %d): %s:%d: %s\n", child_rank, (int)getpid(), __FILE__, \
				__LINE__, #cond);                                                              \
			child_failed = 1;                                                                      \
		}                                                                                              \
	} while (0)

static int child_rank = -1;

/* BUILDDIR/standin/NAME, from where this test binary lies. */
static inline void *standin_open(const char *name)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	if (n <= 0)
		return NULL;
	path[n] = '\0';
	char *slash = strrchr(path, '/');
	if (!slash)
		return NULL;
	*slash = '\0';
	slash = strrchr(path, '/');
	if (!slash)
		return NULL;
	snprintf(slash, sizeof(path) - (size_t)(slash - path), "/standin/%s", name);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		fprintf(stderr, "  %s: %s (make standin)\n", path, dlerror());
	return h;
}

/* The path of BUILDDIR/standin/NAME, for VPS_*_LIBRARY. */
static inline void standin_path(const char *name, char *out, size_t n)
{
	char path[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", path, sizeof(path) - 1);
	path[len > 0 ? len : 0] = '\0';
	for (int k = 0; k < 2; k++) {
		char *slash = strrchr(path, '/');
		if (slash)
			*slash = '\0';
	}
	int k = snprintf(out, n, "%s/standin/%s", path, name);
	if (k < 0 || (size_t)k >= n)
		out[0] = '\0';
}

/* Run fn(rank, ctx) in n forked processes, each within `seconds`; the
 * status of each in st[] (its exit code, or 128 + the signal that ended
 * it). */
static inline void run_ranks(int n, int (*fn)(int rank, void *ctx), void *ctx, unsigned seconds, int *st)
{
	pid_t pid[16];
	fflush(NULL);
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		if (pid[r] == 0) {
			child_rank = r;
			alarm(seconds);
			int rc = fn(r, ctx);
			fflush(NULL);
			_exit(rc || child_failed ? 1 : 0);
		}
	}
	for (int r = 0; r < n; r++) {
		int w = 0;
		st[r] = pid[r] > 0 && waitpid(pid[r], &w, 0) == pid[r]
				? (WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w))
				: 255;
	}
}

#endif
