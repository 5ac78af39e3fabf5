/* Plans: which bytes go from which device to which.
 *
 * The transition world is the union of the devices of layouts A and B,
 * matched by (node, gpu). World rank w < |A| is A's rank w (a device that
 * stays keeps its number, a device that leaves is an A rank missing from
 * B); devices only in B (joins) follow, in B's rank order. For packed
 * device maps this numbering is computed arithmetically, so one rank's plan
 * never enumerates the world.
 *
 * A plan is a list of pieces: a box of one (tensor, state) copied from a
 * source world rank's A buffer to a destination world rank's B buffer. A
 * piece whose source and destination are the same device is a retain (a
 * local copy); every other piece crosses devices. Every destination element
 * is covered by exactly one piece; padding is never planned. */
#ifndef VPS_PLAN_H
#define VPS_PLAN_H

#include "vps/io.h"
#include "vps/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

struct vps_world;
struct vps_bytes;
struct vps_topology;

VPS_API vps_result_t vps_world_new(struct vps_world **out, const struct vps_layout *a, const struct vps_layout *b);
VPS_API void vps_world_free(struct vps_world *w);
VPS_API int64_t vps_world_size(const struct vps_world *w);
/* A's rank on world rank w, or -1 for a joining device. */
VPS_API int64_t vps_world_a_rank(const struct vps_world *w, int64_t wr);
/* B's rank on world rank w, or -1 for a leaving device. */
VPS_API int64_t vps_world_b_rank(const struct vps_world *w, int64_t wr);
VPS_API int64_t vps_world_of_b(const struct vps_world *w, int64_t rb);
VPS_API struct vps_device vps_world_device(const struct vps_world *w, int64_t wr);
/* World rank of a device, or -1 when neither layout uses it. */
VPS_API int64_t vps_world_of_device(const struct vps_world *w, struct vps_device dev);

/* A piece's src_buffer with this bit set names a buffer of the source's B
 * layout, not of its A layout: a relayed piece (a forward), which the
 * source received earlier in the switch and passes on. */
#define VPS_BUFFER_TARGET 0x80000000u
/* With VPS_BUFFER_TARGET, the two bits below it count the hops before the
 * forward's: 0 for a forward of what a holder sent (hop 1), 1 for a
 * forward of a forward (hop 2), 2 for hop 3, the most (a range that a
 * holder's node-mate carries out of the node, which a node's first
 * receiver passes to another node's gateway, which passes it on over its
 * node's links). Never set without VPS_BUFFER_TARGET, never 3. */
#define VPS_BUFFER_HOP_SHIFT 29
#define VPS_BUFFER_HOPS (3u << VPS_BUFFER_HOP_SHIFT)
#define VPS_BUFFER_FLAGS (VPS_BUFFER_TARGET | VPS_BUFFER_HOPS)
#define VPS_MAX_HOP 3
/* The buffer a src_buffer names, without its flags. */
static inline uint32_t vps_buffer_index(uint32_t src_buffer)
{
	return src_buffer & ~VPS_BUFFER_FLAGS;
}
/* 0 for a direct piece (from a holder's A buffer), 1 .. VPS_MAX_HOP for a
 * forward; -1 for hop bits that name no hop. */
static inline int vps_buffer_hop(uint32_t src_buffer)
{
	uint32_t more = (src_buffer & VPS_BUFFER_HOPS) >> VPS_BUFFER_HOP_SHIFT;
	if (!(src_buffer & VPS_BUFFER_TARGET))
		return more ? -1 : 0;
	return more + 1 <= VPS_MAX_HOP ? (int)more + 1 : -1;
}
/* The src_buffer of hop `hop` (0 .. VPS_MAX_HOP) from buffer `index`. */
static inline uint32_t vps_buffer_at_hop(uint32_t index, int hop)
{
	return hop ? index | VPS_BUFFER_TARGET | (uint32_t)(hop - 1) << VPS_BUFFER_HOP_SHIFT : index;
}

/* The transit area: memory of a device's own for the switch, a buffer of
 * neither layout. A piece whose dst_buffer is VPS_BUFFER_TRANSIT lands in
 * its destination's area (a device whose NIC has room takes in part of
 * what node-mates need: a transit); a forward whose src_buffer names it
 * (vps_buffer_at_hop(VPS_BUFFER_TRANSIT, hop)) passes it on from there.
 * Offsets into the area count elements of the piece's dtype from its
 * start (byte offset = offset x element size); a device's area is
 * vps_plan_transit_bytes long, from the pieces that land in it. */
#define VPS_BUFFER_TRANSIT 0x1FFFFFFFu

struct vps_piece {
	uint32_t tensor;
	uint8_t state;
	uint8_t dtype;    /* as a region's (vps_piece_dtype): the state's in both layouts */
	struct vps_box box;
	int64_t src, dst; /* world ranks */
	uint32_t src_buffer, dst_buffer;
	int64_t src_offset, dst_offset; /* elements, at box.lo */
	int64_t src_strides[VPS_MAX_DIMS], dst_strides[VPS_MAX_DIMS];
};

static inline enum vps_dtype vps_piece_dtype(const struct vps_piece *p) { return vps_dtype_of(p->dtype, p->state); }

/* Training state that travels with the switch. Values not known when the
 * plan is made are taken from the source trainer at switch time. */
struct vps_training {
	bool known;              /* step and consumed_samples below are set */
	int64_t step;            /* optimizer steps taken */
	int64_t consumed_samples;
	int64_t scheduler_step;  /* learning-rate scheduler position */
	int64_t global_batch;    /* samples per step, unchanged by a switch */
	int64_t micro_batch;     /* under B */
	int64_t grad_accum;      /* micro-batches per step per B data-parallel rank */
	int64_t dp;              /* B's data-parallel size */
};

/* Collective promotion of one (tensor, state), global plans only. */
enum vps_collective_kind { VPS_COLL_BROADCAST, VPS_COLL_SCATTER, VPS_COLL_GATHER };
struct vps_collective {
	uint32_t tensor;
	uint8_t state;
	uint8_t kind;
	int64_t root;    /* the one source (broadcast, scatter) or destination (gather) */
	int64_t peers;   /* number of destinations (sources for gather) */
	int64_t bytes;
};

/* The planner's rules (source choice, piece order), part of what ranks that
 * plan their own parts compare: raise it when a change would make two
 * versions' plans of one transition differ (3: transit; 4: node-mates
 * sharing once, entering once for the senders, the holders' entries by
 * their whole box and the served ranges turning with the tensor; 5: the
 * rotation's ranges are parts of what moves, not of the buffer, and a
 * busy preferred holder of a replicated tensor shares it by weights; 6:
 * weighed holders bring relayed ranges in by their weights, each weighed
 * by what it shares over the destination's link, the ranges receivers
 * take from a relayed region's holders come from all of them in equal
 * parts, and a holder's passes of a region that enters node by node are
 * counted over NVLink alone; 7: a holder's regions that surely enter
 * other receivers' nodes node by node from it count as they go where its
 * direct range of a relayed region is sized). */
#define VPS_PLANNER_RULES 7

/* Lost devices: A ranks gone before the switch (vps-plan --lost). What a
 * survivor holds is planned from a survivor; what none holds is a lost
 * range, one (tensor, state, box), left for the trainer to reload. */
struct vps_lost_range {
	uint32_t tensor;
	uint8_t state;
	uint8_t dtype; /* as a region's */
	struct vps_box box;
};

struct vps_lost {
	int64_t *ranks;                /* A ranks, ascending, distinct */
	size_t nranks;
	struct vps_lost_range *ranges; /* by (tensor, state, box), disjoint */
	size_t nranges;
};

/* The ranges no rank of A outside ranks[0..n) holds. Only the listed
 * ranks' views are computed (O(their work), never the world). VPS_EINPUT
 * for a rank outside A. */
VPS_API vps_result_t vps_lost_compute(struct vps_lost *out, const struct vps_layout *a, const int64_t *ranks, size_t n);
VPS_API void vps_lost_release(struct vps_lost *l);
/* The A ranks on the devices of a devices document (an explicit list). */
VPS_API vps_result_t vps_lost_devices(const struct vps_layout *a, const char *path, int64_t **ranks, size_t *n);
/* VPS_EINPUT when B places a rank on a lost device (it cannot receive). */
VPS_API vps_result_t vps_lost_check_target(const struct vps_lost *l, const struct vps_layout *a, const struct vps_layout *b);
VPS_API bool vps_lost_has_rank(const struct vps_lost *l, int64_t ra);
VPS_API int64_t vps_lost_range_bytes(const struct vps_lost_range *r);
VPS_API int64_t vps_lost_bytes(const struct vps_lost *l);
/* Remove the lost ranks from holder sets (progressions are split). */
VPS_API vps_result_t vps_lost_drop_holders(const struct vps_lost *l, struct vps_holders *h);
/* The lost ranges as a document: yaml, tsv or json (enum vps_format). */
VPS_API vps_result_t vps_lost_format(const struct vps_lost *l, const struct vps_layout *a,
			enum vps_format format, struct vps_bytes *out);

struct vps_packed;

struct vps_plan {
	struct vps_layout *a, *b; /* owned */
	struct vps_world *world;
	int64_t scope;            /* -1: all ranks; otherwise the one world rank planned */
	struct vps_piece *pieces; /* sorted by (dst, src, tensor, state, dst buffer, dst offset); NULL when packed */
	size_t npieces;
	struct vps_packed *packed; /* a compact global plan's pieces: read them with vps_piece_iter */
	struct vps_collective *colls;
	size_t ncolls;
	struct vps_training train;
	uint64_t file_hash;       /* the hash a plan file states; 0 when computed */
	struct vps_lost lost;     /* lost A ranks and the ranges no piece fills (holes) */
	uint8_t relay;            /* enum vps_relay it was planned with: ranks planning their own
				   * parts compare it, since it changes who sends (0: none, as before
				   * relays; 1: VPS_RELAY_ALWAYS, what plans with `relay: true` had) */
	/* VPS_RELAY_AUTO with a topology: the bandwidths its choice weighed (0: it
	 * weighed the bytes a device sends), which ranks compare too */
	double relay_intra_bandwidth, relay_inter_bandwidth;
};

/* VPS_EINPUT when a plan read from a file does not hash to what it states
 * (edited by hand, or damaged): tools that act on plans refuse those. */
VPS_API vps_result_t vps_plan_check_hash(const struct vps_plan *p, const char *name);

/* The version of struct vps_plan_opts these headers declare (vps/base.h,
 * "Options structs"): 2 added relay_mode and topology. */
#define VPS_PLAN_OPTS_VERSION 2

/* Where joining devices pass on to each other what they received
 * (docs/relay.md). A region of the target relays only where its joining
 * receivers (devices with no rank of A) number two or more and each group
 * of its holders shares alike:
 * - NEVER: nowhere (the plans of vps before relays);
 * - ALWAYS: wherever its joining receivers outnumber every group of its
 *   holders (the first rule, vps-plan --relay);
 * - AUTO: wherever that lowers the region's busiest sender, by its time on
 *   the plan's topology or else by its bytes, by more than 1% without
 *   making a receiver busier than the region's busiest device was (the
 *   default). Every rank decides alike from the region alone. */
enum vps_relay { VPS_RELAY_NEVER = 0, VPS_RELAY_ALWAYS = 1, VPS_RELAY_AUTO = 2 };

struct vps_plan_opts {
	unsigned int version;  /* VPS_PLAN_OPTS_VERSION, as VPS_PLAN_OPTS_INIT sets it */
	int64_t rank;          /* world rank to plan, or -1 for all */
	/* training state (global_batch 0: unknown) */
	struct vps_training train;
	int64_t micro_batch_a; /* micro batch under A, the default for B */
	int threads;           /* global plans: threads (0: the online CPUs); the plan is the same for any */
	bool compact;          /* global plans: keep the pieces packed (pieces NULL; about 25 bytes a
				* piece instead of 184), for tools that only hash, write or count them */
	bool unhashed;         /* compact plans: not hashed while planned (for statistics alone);
				* vps_plan_hash then reads the pieces */
	const int64_t *lost;   /* A ranks whose devices are gone: nothing is planned from them */
	size_t nlost;
	bool allow_loss;       /* plan around ranges no survivor holds (else VPS_ECHECK) */
	bool relay;            /* VPS_RELAY_ALWAYS, whatever relay_mode says (version 1: false is
				* VPS_RELAY_NEVER) */
	/* version 2 */
	enum vps_relay relay_mode; /* where relay is false */
	const struct vps_topology *topology; /* VPS_RELAY_AUTO weighs its bandwidths (NULL: bytes) */
};

/* Every field's default, vps-plan's: every rank, training state unknown,
 * a thread an online CPU, pieces unpacked, nothing lost, relays where they
 * lower the busiest sender's bytes:
 *     struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
 * (every field in order: C++ has no designated initializers before C++20) */
#define VPS_PLAN_OPTS_INIT \
	{ VPS_PLAN_OPTS_VERSION, -1, {false, 0, 0, 0, 0, 0, 0, 0}, 0, 0, false, false, NULL, 0, false, false, \
	  VPS_RELAY_AUTO, NULL }
#define VPS_PLAN_MAX_THREADS 256

/* Plan A -> B. On success the plan owns a and b. */
VPS_API vps_result_t vps_plan_compute(struct vps_plan **out, struct vps_layout *a, struct vps_layout *b,
			      const struct vps_plan_opts *opts);
VPS_API void vps_plan_free(struct vps_plan *p);

/* The pieces of a plan in order, packed or not. The piece returned is valid
 * until the next call. */
struct vps_piece_iter {
	const struct vps_plan *p;
	size_t i, block, pos;
	struct vps_piece cur;
};
VPS_API void vps_piece_iter_init(struct vps_piece_iter *it, const struct vps_plan *p);
VPS_API const struct vps_piece *vps_piece_iter_next(struct vps_piece_iter *it);

/* Bytes of one piece. */
VPS_API int64_t vps_piece_bytes(const struct vps_piece *p);
/* Whether a piece lands in its destination's transit area, or is passed
 * on from its source's. */
static inline bool vps_piece_to_transit(const struct vps_piece *p) { return p->dst_buffer == VPS_BUFFER_TRANSIT; }
static inline bool vps_piece_from_transit(const struct vps_piece *p)
{
	return (p->src_buffer & VPS_BUFFER_TARGET) && vps_buffer_index(p->src_buffer) == VPS_BUFFER_TRANSIT;
}
/* The bytes of world rank w's transit area: the end of the furthest piece
 * of the plan that lands in it (0: none does). A rank's plan holds every
 * piece that lands on it. VPS_EINPUT when a piece's view leaves [0, 2^48)
 * elements. */
VPS_API vps_result_t vps_plan_transit_bytes(const struct vps_plan *p, int64_t w, int64_t *bytes);

/* ---- statistics ---- */
struct vps_topology {
	char name[64];
	int64_t gpus_per_node;
	double intra_node_bandwidth; /* bytes/s per GPU (NVLink) */
	double inter_node_bandwidth; /* bytes/s per GPU (its share of the NICs) */
	double memory_bandwidth;     /* bytes/s for a local copy */
	double latency;              /* seconds per message */
	int64_t gpu_memory;          /* bytes */
};
/* A topology by path or by name (NAME.yaml in search_path); VPS_ENOTFOUND
 * when no topology has that name. */
VPS_API vps_result_t vps_topology_load(struct vps_topology *t, const char *arg, const char *search_path);

/* The least time any direct plan of A -> B can take on topo, from the two
 * layouts alone (never from a plan, so a planner's bug cannot move it and
 * the estimate together), latency aside. Each device that needs an element
 * under B and does not hold it under A receives it straight from a device
 * that holds it: bytes only same-node holders have cross its NVLink, those
 * only other nodes' holders have cross its NIC, the rest either. On the
 * sending side, the devices of a replica set (the ranks holding one region
 * alike) send between them every element only they hold to each device
 * that needs it, and the busiest sends at least the average. The floor is
 * the largest, over receivers and replica sets, of max(local / intra,
 * remote / inter, all / (intra + inter)), per device; out says which. */
enum vps_floor_by {
	VPS_FLOOR_RECEIVER,  /* a device's bytes to receive (device) */
	VPS_FLOOR_SENDERS,   /* what a set of senders shares (device: its first, senders of them) */
	VPS_FLOOR_NODE_IN,   /* what must enter a node over its NICs (device.node; relayed floors) */
	VPS_FLOOR_NODE_OUT,  /* what must leave a node over its NICs (device.node, senders: its GPUs) */
	VPS_FLOOR_NODES_OUT, /* what a set of nodes must send over their NICs, relays' entries among
			      * them and exits from them (device.node: the first, senders: their GPUs;
			      * relayed floors) */
};
struct vps_time_floor {
	double seconds;
	struct vps_device device;  /* the device that sets it */
	bool receives;             /* its bytes to receive set it; else those a set of senders shares */
	int64_t senders;           /* sending: the devices that share the bytes below (it is one) */
	int64_t local_bytes;       /* bytes over NVLink only */
	int64_t remote_bytes;      /* over a NIC only */
	int64_t either_bytes;      /* over either */
	enum vps_floor_by by;      /* which of the above sets it; last, so that the fields before keep
				    * their offsets */
};
/* What sets a device's estimated time: the larger of its NVLink bytes
 * (sent or received) over the intra-node bandwidth and its NIC bytes over
 * the inter-node one, or its local copies (read and written) over the
 * memory bandwidth. */
enum vps_estimate_by {
	VPS_ESTIMATE_NVLINK_SEND,
	VPS_ESTIMATE_NVLINK_RECV,
	VPS_ESTIMATE_NIC_SEND,
	VPS_ESTIMATE_NIC_RECV,
	VPS_ESTIMATE_COPY,
};
struct vps_estimate {
	double seconds;            /* the device's time, its peers' latencies included */
	int64_t rank;              /* its world rank */
	struct vps_device device;
	enum vps_estimate_by by;
	int64_t bytes;             /* the bytes that set it */
	int64_t peers;             /* the devices it exchanges with, a message latency each */
};
struct vps_plan_stats {
	int64_t world;
	int64_t joining, leaving;
	int64_t pieces, retains;
	int64_t bytes_moved, bytes_retained, bytes_lower_bound;
	int64_t bytes_intra_node, bytes_inter_node;
	int64_t max_send_bytes, max_recv_bytes;
	int64_t balanced_send_bound; /* the least possible busiest sender */
	int64_t balanced_bound;      /* the least possible busiest device, send or receive */
	int64_t peers_max;           /* most peers of one device */
	bool have_estimate;
	double estimate_seconds;
	double time_bound_seconds;   /* the least time any plan can take on the topology, latency aside */
	double time_floor_seconds;   /* vps_time_floor's, from the layouts alone */
	int64_t *send, *recv;        /* per world rank, when asked */
	int64_t bytes_relayed;       /* moved by relays passing on what they received (--relay); last,
				      * so that the fields before keep their offsets */
	struct vps_time_floor time_floor; /* what sets time_floor_seconds; after them for the same reason */
	/* with a topology, the busiest device: what sets estimate_seconds */
	struct vps_estimate estimate;
	/* per world rank, when asked (load), as send and recv: the bytes of
	 * them over its NICs, its local copies; with a topology, its time */
	int64_t *nic_send, *nic_recv, *retain;
	double *seconds;
	/* moved into transit areas (bytes_moved counts them, and again as they
	 * are passed on): bytes_moved less these is what reaches B */
	int64_t bytes_transit;
};

/* Statistics of a global plan. load: fill the per-rank arrays (send,
 * recv, nic_send, nic_recv, retain; seconds with a topology). topo may be
 * NULL. */
VPS_API vps_result_t vps_plan_stats(const struct vps_plan *p, const struct vps_topology *topo, bool load,
			    struct vps_plan_stats *s);
VPS_API void vps_plan_stats_release(struct vps_plan_stats *s);

VPS_API vps_result_t vps_time_floor(const struct vps_layout *a, const struct vps_layout *b, const struct vps_topology *topo,
			    struct vps_time_floor *out);
/* The floor of plans whose receivers may pass on what they received
 * (vps_plan_opts.relay): a relay on a device's node may have anything it
 * needs, so each device's bytes to receive count at both bandwidths
 * together (receives is true); and a replica set need send an element only
 * it holds once, not once a device that needs it (receives is false). */
VPS_API vps_result_t vps_time_floor_relayed(const struct vps_layout *a, const struct vps_layout *b,
				    const struct vps_topology *topo, struct vps_time_floor *out);

/* ---- transitions: a model and two configurations (configs/transitions) ---- */
struct vps_transition {
	char name[128];
	char description[256];
	double paper_seconds; /* the paper's measured switch time, 0 if none */
	/* the paper's baselines for it (table hybrid_merged), 0 if none:
	 * MCP's checkpoint save and load, HotSpa's switch */
	double paper_mcp_save_seconds, paper_mcp_load_seconds;
	double paper_hotspa_seconds;
};
/* Build layouts A and B from a transition document: name (looked up in
 * trans_path) or path. Models and parallel configurations it names are
 * looked up in model_path and parallel_path. VPS_ENOTFOUND when one of
 * these names nothing. */
VPS_API vps_result_t vps_transition_load(const char *arg, const char *trans_path, const char *model_path,
				 const char *parallel_path, struct vps_transition *info, struct vps_layout **a,
				 struct vps_layout **b);
/* The transitions of trans_path, the NAME.yaml files of its directories
 * (each name once, the first directory's), sorted by name: each one's
 * name as vps_transition_load takes it and its description, the other
 * fields 0. *list (NULL when there are none) is freed with free().
 * @return VPS_EINPUT (naming the file) for one whose head cannot be read. */
VPS_API vps_result_t vps_transition_list(const char *trans_path, struct vps_transition **list, size_t *n);

/* ---- files ---- */
struct vps_bytes;
VPS_API vps_result_t vps_plan_serialize(const struct vps_plan *p, bool yaml, struct vps_bytes *out);
VPS_API vps_result_t vps_plan_parse(struct vps_plan **out, const char *name, const void *data, size_t len);
VPS_API vps_result_t vps_plan_load(struct vps_plan **out, const char *path);
/* The same; compact: a global plan's pieces stay packed, for tools that read
 * them in order (vps_piece_iter), as vps-stage does. */
VPS_API vps_result_t vps_plan_parse_as(struct vps_plan **out, const char *name, const void *data, size_t len, bool compact);
VPS_API vps_result_t vps_plan_load_as(struct vps_plan **out, const char *path, bool compact);
VPS_API uint64_t vps_plan_hash(const struct vps_plan *p);

VPS_API const char *vps_collective_name(enum vps_collective_kind kind);

#ifdef __cplusplus
}
#endif

#endif
