/* A bare TCP stream over loopback between two shared-memory objects, the
 * memory a tcp switch moves: the yardstick of scripts/bench/switch_tcp.sh.
 *
 *   shm_stream BYTES [PASSES]
 *
 * Like a switch, the source is an object another process filled and the
 * destination one another process zeroed (the trainers); a child maps the
 * source and sends it, this process maps the destination and receives into
 * it, one send/recv of at most 1 MiB at a time, as iperf3 -l 1M does. Each
 * pass moves every byte once, over one connection, and prints its rate:
 *   pass 1: <GB/s>
 * The first pass through a fresh object is what a one-shot switch can reach
 * on this machine; later passes reuse memory the kernel has moved before. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static char names[2][64];

static void unlink_all(void)
{
	shm_unlink(names[0]);
	shm_unlink(names[1]);
}

/* Make an object as a trainer would: created, sized and written in a
 * process of its own, so that the streaming processes map it fresh. */
static void make_object(const char *name, size_t n, int fill)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
			die(name);
		/* its pages now, as a trainer's (lib/registry): a write to a sparse
		 * object on a /dev/shm too small dies of SIGBUS */
		int err;
		while ((err = posix_fallocate(fd, 0, (off_t)n)) == EINTR)
			;
		if (err) {
			errno = err;
			die(err == ENOSPC ? "/dev/shm: too small for the two objects (docker: --shm-size)" : name);
		}
		unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			die("mmap");
		if (fill)
			for (size_t i = 0; i < n; i++)
				p[i] = (unsigned char)(i * 2654435761u >> 13);
		else
			memset(p, 0, n);
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		exit(1);
}

static unsigned char *map_object(const char *name, size_t n, int writable)
{
	int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
	if (fd < 0)
		die(name);
	void *p = mmap(NULL, n, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: shm_stream BYTES [PASSES]\n");
		return 2;
	}
	char *end;
	unsigned long long bytes = strtoull(argv[1], &end, 10);
	long passes = argc > 2 ? strtol(argv[2], NULL, 10) : 1;
	if (*end || bytes == 0 || bytes > (1ull << 40) || passes < 1 || passes > 100) {
		fprintf(stderr, "shm_stream: BYTES from 1 to 2^40, PASSES from 1 to 100\n");
		return 2;
	}
	size_t n = (size_t)bytes;
	snprintf(names[0], sizeof(names[0]), "/vps-stream-%d-src", (int)getpid());
	snprintf(names[1], sizeof(names[1]), "/vps-stream-%d-dst", (int)getpid());
	atexit(unlink_all);
	make_object(names[0], n, 1);
	make_object(names[1], n, 0);

	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &al) != 0)
		die("listen");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
			die("connect");
		const unsigned char *src = map_object(names[0], n, 0);
		for (long k = 0; k < passes; k++) {
			for (size_t off = 0; off < n;) {
				size_t len = n - off < (1u << 20) ? n - off : (1u << 20);
				ssize_t w = send(s, src + off, len, MSG_NOSIGNAL);
				if (w <= 0)
					die("send");
				off += (size_t)w;
			}
			char ack;
			if (recv(s, &ack, 1, MSG_WAITALL) != 1)
				die("ack");
		}
		_exit(0);
	}
	int s = accept(ls, NULL, NULL);
	if (s < 0)
		die("accept");
	unsigned char *dst = map_object(names[1], n, 1);
	int bad = 0;
	for (long k = 0; k < passes; k++) {
		double t0 = now();
		for (size_t off = 0; off < n;) {
			ssize_t g = recv(s, dst + off, n - off, 0);
			if (g <= 0)
				die("recv");
			off += (size_t)g;
		}
		double t = now() - t0;
		if (send(s, "k", 1, MSG_NOSIGNAL) != 1)
			die("ack");
		printf("pass %ld: %.3f\n", k + 1, (double)n / t / 1e9);
		for (size_t i = 0; i < n; i += 4093)
			bad |= dst[i] != (unsigned char)(i * 2654435761u >> 13);
	}
	int st;
	waitpid(child, &st, 0);
	if (bad || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "shm_stream: the stream arrived %s\n", bad ? "wrong" : "short");
		return 1;
	}
	return 0;
}
