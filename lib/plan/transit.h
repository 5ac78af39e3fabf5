/* Transit: what a node takes in over its NICs, spread over every NIC of
 * the node.
 *
 * A device that needs none of a range may take part of it in over its
 * NIC, into its transit area, and pass it on over its node's links to the
 * device that needs it (docs/relay.md, "Transit"). Whether and how much is
 * decided node by node from what the node's devices receive alone: that
 * neither changes a sender's bytes nor any other node's, so every rank
 * that plans a piece into the node decides alike from the same pieces. */
#ifndef VPS_TRANSIT_H
#define VPS_TRANSIT_H

#include "util/internal.h"
#include "vps/plan.h"

struct vps_pieces {
	struct vps_piece *v;
	size_t n, cap;
};

/* Pieces the device w passes on as a relay (any destination), for
 * vps_transit_route to leave alone what arrives to be passed on. */
typedef vps_result_t (*vps_forwards_fn)(void *arg, int64_t w, struct vps_pieces *out);

struct vps_transit_node {
	const struct vps_world *w;
	int32_t node;
	const int64_t *devices; /* the node's devices of B (world ranks, ascending) */
	const int64_t *area_max; /* each one's transit area at most, bytes */
	size_t ndevices;
	double intra, inter;    /* bytes/s of a device's NVLink and of its NICs */
	double latency;         /* seconds a message (a new pair of peers costs one) */
	vps_forwards_fn forwards;
	/* the least time device w (a sender into the node) is busy sending
	 * over its NICs whatever the plan: a bound below the plan's estimate */
	double (*least_send)(void *arg, int64_t w);
	/* the bytes device w of the node sends over its NICs in the plan,
	 * which no rerouting inside a node changes (NULL: none) */
	double (*nic_sends)(void *arg, int64_t w);
	void *arg;
};

/* Reroute, in set (every piece whose destination is on the node, each
 * destination's in plan order), part of what devices bound by their NICs'
 * receives take in through node-mates whose NICs have room, where the
 * node's busiest device (NVLink and NIC receives, NVLink sends) gets more
 * than 1% faster: each part a piece to the carrier's transit area and a
 * forward from there. Then, where a device of the node sends one box to
 * two node-mates and is the node's busiest (its NIC sends counted too),
 * one of them passes it on to the other from its B buffer a hop later,
 * where that makes the node's busiest more than 1% faster, a message
 * latency for each new node-mate a device shares with counted against it.
 * The set is then unordered. */
vps_result_t vps_transit_route(const struct vps_transit_node *tn, struct vps_pieces *set);

#endif
