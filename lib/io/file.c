/* Bytes and files (vps/io.h): a growable buffer, reading a whole file or
 * standard input, and writing an output so that a failure never leaves it
 * half written. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/internal.h"
#include "vps/io.h"

vps_result_t vps_bytes_append(struct vps_bytes *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		size_t ncap = b->cap ? b->cap : 4096;
		while (ncap < b->len + n)
			ncap *= 2;
		unsigned char *d = realloc(b->data, ncap);
		if (!d)
			return VPS_NOMEM();
		b->data = d;
		b->cap = ncap;
	}
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	return VPS_OK;
}

void vps_bytes_release(struct vps_bytes *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

vps_result_t vps_read_file(const char *path, struct vps_bytes *out)
{
	int fd = 0;
	bool is_stdin = !path || strcmp(path, "-") == 0;
	memset(out, 0, sizeof(*out));
	if (!is_stdin) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return vps_fail(VPS_EINPUT, "%s: %s", path, strerror(errno));
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
			close(fd);
			return vps_fail(VPS_EINPUT, "%s: is a directory", path);
		}
	}
	for (;;) {
		if (out->cap - out->len < 65536) {
			vps_result_t rc = VPS_GROW(out->data, out->cap, out->cap + 65536);
			if (rc) {
				if (!is_stdin)
					close(fd);
				vps_bytes_release(out);
				return rc;
			}
		}
		ssize_t n = read(fd, out->data + out->len, out->cap - out->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0) {
			int e = errno;
			if (!is_stdin)
				close(fd);
			vps_bytes_release(out);
			return vps_fail(VPS_EINPUT, "%s: %s", is_stdin ? "<stdin>" : path, strerror(e));
		}
		if (n == 0)
			break;
		out->len += (size_t)n;
	}
	if (!is_stdin)
		close(fd);
	return VPS_OK;
}

static vps_result_t write_all(int fd, const unsigned char *p, size_t n, const char *what)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (w < 0)
			return vps_fail_errno("%s: write failed", what);
		p += w;
		n -= (size_t)w;
	}
	return VPS_OK;
}

/* The file that path names, through symbolic links in its last component
 * (the kernel follows those in its directories): *out is that path, *exists
 * whether it is there, st what it is. */
static vps_result_t resolve_output(const char *path, char **out, struct stat *st, bool *exists)
{
	char *cur = vps_strdup(path);
	if (!cur)
		return VPS_ENOMEM;
	for (int hops = 0;; hops++) {
		if (lstat(cur, st) != 0) {
			if (errno == ENOENT) {
				*exists = false;
				*out = cur;
				return VPS_OK;
			}
			vps_result_t rc = vps_fail_errno("%s", path);
			free(cur);
			return rc;
		}
		if (!S_ISLNK(st->st_mode)) {
			*exists = true;
			*out = cur;
			return VPS_OK;
		}
		char link[4096];
		ssize_t n = hops < 40 ? readlink(cur, link, sizeof(link)) : -1;
		if (n < 0 || (size_t)n >= sizeof(link)) {
			vps_result_t rc = hops >= 40 ? vps_fail(VPS_EINPUT, "%s: too many levels of symbolic links", path)
				: n < 0 ? vps_fail_errno("%s: read the link %s", path, cur)
					: vps_fail(VPS_EINPUT, "%s: the link %s is too long", path, cur);
			free(cur);
			return rc;
		}
		/* a relative target is relative to the link's directory */
		const char *slash = link[0] == '/' ? NULL : strrchr(cur, '/');
		size_t dir = slash ? (size_t)(slash - cur) + 1 : 0;
		char *next = vps_malloc(dir + (size_t)n + 1);
		if (!next) {
			free(cur);
			return VPS_ENOMEM;
		}
		memcpy(next, cur, dir);
		memcpy(next + dir, link, (size_t)n);
		next[dir + (size_t)n] = '\0';
		free(cur);
		cur = next;
	}
}

/* A character device or a FIFO is written to where it is: renaming a new
 * file over it would replace the device (as root, -o /dev/null would turn
 * the system's /dev/null into a regular file) or the FIFO its reader waits
 * on. */
static vps_result_t write_in_place(const char *path, const struct vps_bytes *b, bool binary)
{
	int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return vps_fail_errno("%s: open", path);
	struct stat st;
	vps_result_t rc = VPS_OK;
	if (fstat(fd, &st) != 0)
		rc = vps_fail_errno("%s", path);
	else if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
		rc = vps_fail(VPS_EINPUT, "%s: changed while it was opened; nothing written", path);
	else if (binary && isatty(fd))
		rc = vps_fail(VPS_EINPUT, "%s: refusing to write binary output to a terminal (use --yaml)", path);
	if (!rc)
		rc = write_all(fd, b->data, b->len, path);
	if (close(fd) != 0 && !rc)
		rc = vps_fail_errno("%s: close", path);
	return rc;
}

/* A regular file, or none, is replaced whole: a temporary beside it, renamed
 * over it once complete, so that a failed write leaves the old one. */
static vps_result_t write_replace(const char *path, const char *target, const struct vps_bytes *b,
				  const struct stat *old, bool exists)
{
	size_t n = strlen(target);
	char *tmp = vps_malloc(n + 16);
	if (!tmp)
		return VPS_ENOMEM;
	snprintf(tmp, n + 16, "%s.tmpXXXXXX", target);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		vps_result_t rc = vps_fail_errno("%s: cannot create temporary file", path);
		free(tmp);
		return rc;
	}
	vps_result_t rc = write_all(fd, b->data, b->len, path);
	/* a file replaced keeps its permissions; a new one is 0644 */
	if (!rc && fchmod(fd, exists ? old->st_mode & 07777 : 0644) != 0)
		rc = vps_fail_errno("%s: chmod", tmp);
	if (!rc && fsync(fd) != 0)
		rc = vps_fail_errno("%s: fsync", path);
	if (close(fd) != 0 && !rc)
		rc = vps_fail_errno("%s: close", path);
	/* what was a regular file (or nothing) when looked at must still be:
	 * never rename over a device or a FIFO put there since */
	struct stat now;
	if (!rc && lstat(target, &now) == 0 && !S_ISREG(now.st_mode))
		rc = vps_fail(VPS_EINPUT, "%s: changed while it was written; nothing replaced", path);
	if (!rc && rename(tmp, target) != 0)
		rc = vps_fail_errno("%s: rename", path);
	if (rc)
		unlink(tmp);
	free(tmp);
	return rc;
}

static vps_result_t not_writable(const char *path, const struct stat *st)
{
	return vps_fail(VPS_EINPUT, "%s: is %s; vps writes a regular file, a character device or a FIFO", path,
			S_ISDIR(st->st_mode) ? "a directory" : S_ISBLK(st->st_mode) ? "a block device"
				: S_ISSOCK(st->st_mode) ? "a socket" : "not a file");
}

vps_result_t vps_write_output(const char *path, const struct vps_bytes *b, bool binary)
{
	if (!path || strcmp(path, "-") == 0) {
		if (binary && isatty(STDOUT_FILENO))
			return vps_fail(VPS_EINPUT,
					"refusing to write binary output to a terminal (use --yaml or -o FILE)");
		return write_all(STDOUT_FILENO, b->data, b->len, "<stdout>");
	}
	if (!*path)
		return vps_fail(VPS_EINPUT, "an empty output file name");
	/* what path ends at, through every link (/dev/stdout included) */
	struct stat st;
	if (stat(path, &st) == 0) {
		if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))
			return write_in_place(path, b, binary);
		if (!S_ISREG(st.st_mode))
			return not_writable(path, &st);
	}
	/* a regular file or none: the rename must replace the link's target,
	 * not the link */
	char *target;
	bool exists;
	VPS_CHECK(resolve_output(path, &target, &st, &exists));
	vps_result_t rc = exists && !S_ISREG(st.st_mode) ? not_writable(path, &st)
							 : write_replace(path, target, b, &st, exists);
	free(target);
	return rc;
}
