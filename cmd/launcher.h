/* Rank, world and rendezvous from flags or the launcher's environment. */
#ifndef VPS_CMD_LAUNCHER_H
#define VPS_CMD_LAUNCHER_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"

struct launch {
	int64_t rank, world, local_rank;
	char master_host[256];
	int master_port;
	const char *source; /* which convention gave the rank */
};

/* Fill what flags left unset (-1, "", 0) from torchrun, Slurm, then Open
 * MPI variables. @return false after a usage error that says what is missing. */
bool launch_resolve(struct launch *l, bool need_master);
/* A TOOL_FUNC for --master HOST:PORT into a struct launch. */
tool_parse_fn launch_master;

#endif
