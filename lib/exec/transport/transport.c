/* The one place that says which transports --transport names, and in which
 * order a peer tries them (transport.h). */
#include <stddef.h>

#include "exec/transport/transport.h"

static const struct vps_transport_choice choices[] = {
	{VPS_EXEC_TCP, "tcp", {&vps_transport_tcp, NULL}},
	{VPS_EXEC_IPC, "ipc", {&vps_transport_ipc, NULL}},
	{VPS_EXEC_NCCL, "nccl", {&vps_transport_nccl, NULL}},
	/* within a node the peers map each other's memory; across nodes NCCL */
	{VPS_EXEC_AUTO, "ipc+nccl", {&vps_transport_ipc, &vps_transport_nccl, NULL}},
};

const struct vps_transport_choice *vps_transport_choice(int kind)
{
	for (size_t i = 0; i < sizeof(choices) / sizeof(*choices); i++)
		if ((int)choices[i].kind == kind)
			return &choices[i];
	return NULL;
}
