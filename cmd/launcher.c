#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "launcher.h"

static bool env_i64(const char *name, int64_t *v)
{
	const char *s = getenv(name);
	return s && tool_parse_i64(s, v);
}

bool launch_resolve(struct launch *l, bool need_master)
{
	static const struct {
		const char *name, *rank, *world, *local;
	} conv[] = {
		{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
		{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
		{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
	};
	if (l->rank < 0) {
		for (size_t i = 0; i < sizeof(conv) / sizeof(conv[0]); i++) {
			int64_t r, w;
			if (env_i64(conv[i].rank, &r) && env_i64(conv[i].world, &w)) {
				l->rank = r;
				if (l->world < 0)
					l->world = w;
				if (l->local_rank < 0 && !env_i64(conv[i].local, &l->local_rank))
					l->local_rank = -1;
				l->source = conv[i].name;
				break;
			}
		}
	} else {
		l->source = "flags";
		for (size_t i = 0; i < sizeof(conv) / sizeof(conv[0]) && l->local_rank < 0; i++)
			if (!env_i64(conv[i].local, &l->local_rank))
				l->local_rank = -1;
	}
	if (l->rank < 0) {
		tool_usage_error("no rank: give --rank, or run under torchrun (RANK), Slurm (SLURM_PROCID) or Open MPI "
				 "(OMPI_COMM_WORLD_RANK)");
		return false;
	}
	if (l->local_rank < 0)
		l->local_rank = 0;
	if (!need_master)
		return true;
	if (!l->master_host[0]) {
		const char *h = getenv("MASTER_ADDR");
		if (h)
			snprintf(l->master_host, sizeof(l->master_host), "%s", h);
	}
	if (!l->master_port) {
		int64_t p;
		if (env_i64("MASTER_PORT", &p))
			l->master_port = (int)p;
	}
	if (!l->master_host[0] || l->master_port <= 0 || l->master_port > 65535) {
		tool_usage_error("no rendezvous: give --master HOST:PORT or set MASTER_ADDR and MASTER_PORT");
		return false;
	}
	return true;
}

bool launch_master(const char *arg, void *launch, char *why, size_t n)
{
	struct launch *l = launch;
	const char *colon = strrchr(arg, ':');
	int64_t port;
	if (!colon || colon == arg || !tool_parse_i64(colon + 1, &port) || port < 1 || port > 65535 ||
	    (size_t)(colon - arg) >= sizeof(l->master_host)) {
		snprintf(why, n, "'%s' is not HOST:PORT", arg);
		return false;
	}
	snprintf(l->master_host, sizeof(l->master_host), "%.*s", (int)(colon - arg), arg);
	l->master_port = (int)port;
	return true;
}
