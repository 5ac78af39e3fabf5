/* Rank, world and rendezvous from flags or the launcher's environment. */
#ifndef VPS_CMD_LAUNCHER_H
#define VPS_CMD_LAUNCHER_H

#include <stdint.h>

struct launch {
	int64_t rank, world, local_rank;
	char master_host[256];
	int master_port;
	const char *source; /* which convention gave the rank */
};

/* Fill what flags left unset (-1, "", 0) from torchrun, Slurm, then Open
 * MPI variables. @return 0, or 2 after printing what is missing. */
int launch_resolve(struct launch *l, bool need_master);

#endif
