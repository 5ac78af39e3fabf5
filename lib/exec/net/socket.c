/* Sockets for the network: non-blocking, every wait bounded by a deadline
 * that names the other side, and the addresses a rank listens on. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

double vps_net_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Socket buffers are left to the kernel's autotuning: a fixed size turns
 * it off, and measured slower on loopback (docs/BENCHMARKS.md). */
void vps_net_tune(int fd)
{
	int one = 1;
	/* every wait goes through poll with a deadline: nothing blocks */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Wait for fd to be readable or writable; VPS_ETIMEOUT after timeout. */
static vps_result_t wait_fd(int fd, short ev, double deadline, const char *who)
{
	for (;;) {
		double left = deadline - vps_net_now();
		if (left <= 0)
			return vps_fail(VPS_ETIMEOUT, "%s: no answer", who);
		struct pollfd p = {fd, ev, 0};
		int r = poll(&p, 1, (int)(left * 1000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return vps_fail_errno("%s: poll", who);
		if (r > 0)
			return VPS_OK;
	}
}

vps_result_t vps_net_send_all(int fd, const void *buf, size_t len, double timeout, const char *who)
{
	const unsigned char *p = buf;
	double deadline = vps_net_now() + timeout;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && (errno == EINTR))
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			VPS_CHECK(wait_fd(fd, POLLOUT, deadline, who));
			continue;
		}
		if (n < 0)
			return vps_fail(VPS_EPEER, "%s: %s", who, strerror(errno));
		p += n;
		len -= (size_t)n;
		deadline = vps_net_now() + timeout;
	}
	return VPS_OK;
}

vps_result_t vps_net_recv_all(int fd, void *buf, size_t len, double timeout, const char *who)
{
	unsigned char *p = buf;
	double deadline = vps_net_now() + timeout;
	while (len) {
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			VPS_CHECK(wait_fd(fd, POLLIN, deadline, who));
			continue;
		}
		if (n == 0)
			return vps_fail(VPS_EPEER, "%s: the connection was closed", who);
		if (n < 0)
			return vps_fail(VPS_EPEER, "%s: %s", who, strerror(errno));
		p += n;
		len -= (size_t)n;
		deadline = vps_net_now() + timeout;
	}
	return VPS_OK;
}

vps_result_t vps_net_resolve(const char *host, int port, struct sockaddr_in *sa)
{
	struct addrinfo hints = {0}, *res = NULL;
	char ps[16];
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	int e = getaddrinfo(host, ps, &hints, &res);
	if (e || !res)
		return vps_fail(VPS_EINPUT, "master address %s:%d: %s", host, port, gai_strerror(e));
	memcpy(sa, res->ai_addr, sizeof(*sa));
	freeaddrinfo(res);
	return VPS_OK;
}

static vps_result_t listen_on(const struct sockaddr_in *sa, int backlog, int *fd_out, int *port_out)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		return vps_fail_errno("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0) {
		vps_result_t rc = vps_fail_errno("bind %s:%d", inet_ntoa(sa->sin_addr), ntohs(sa->sin_port));
		close(fd);
		return rc;
	}
	if (listen(fd, backlog) != 0) {
		close(fd);
		return vps_fail_errno("listen");
	}
	struct sockaddr_in got;
	socklen_t gl = sizeof(got);
	getsockname(fd, (struct sockaddr *)&got, &gl);
	*fd_out = fd;
	*port_out = ntohs(got.sin_port);
	return VPS_OK;
}

vps_result_t vps_net_listen(const struct sockaddr_in *sa, int backlog, int *fd, int *port)
{
	VPS_CHECK(listen_on(sa, backlog, fd, port));
	fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
	return VPS_OK;
}

/* The address of this host that reaches host:port (a UDP socket's route
 * lookup: no packet is sent). */
vps_result_t vps_net_route_to(const struct sockaddr_in *to, struct in_addr *local)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return vps_fail_errno("socket");
	struct sockaddr_in got;
	socklen_t l = sizeof(got);
	if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&got, &l) != 0) {
		vps_result_t rc = vps_fail_errno("no route to the master %s", inet_ntoa(to->sin_addr));
		close(fd);
		return rc;
	}
	close(fd);
	*local = got.sin_addr;
	return VPS_OK;
}
