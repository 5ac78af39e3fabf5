#include <string.h>

#include "vps/layout.h"
#include "vps/plan.h"
#include "vps/registry.h"

/* Bindings that mirror these structs (python/vps) compare their sizes at
 * load time, so a struct that changes here cannot be misread there. */
size_t vps_abi_size(const char *type)
{
	static const struct {
		const char *name;
		size_t size;
	} sizes[] = {
		{"vps_model", sizeof(struct vps_model)},
		{"vps_parallel", sizeof(struct vps_parallel)},
		{"vps_devices", sizeof(struct vps_devices)},
		{"vps_tensor", sizeof(struct vps_tensor)},
		{"vps_box", sizeof(struct vps_box)},
		{"vps_region", sizeof(struct vps_region)},
		{"vps_coords", sizeof(struct vps_coords)},
		{"vps_buffer", sizeof(struct vps_buffer)},
		{"vps_param", sizeof(struct vps_param)},
		{"vps_rank_view", sizeof(struct vps_rank_view)},
		{"vps_holder", sizeof(struct vps_holder)},
		{"vps_holders", sizeof(struct vps_holders)},
		{"vps_registry_training", sizeof(struct vps_registry_training)},
		{"vps_registry_entry_info", sizeof(struct vps_registry_entry_info)},
		{"vps_topology", sizeof(struct vps_topology)},
	};
	for (size_t i = 0; type && i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (!strcmp(sizes[i].name, type))
			return sizes[i].size;
	return 0;
}
