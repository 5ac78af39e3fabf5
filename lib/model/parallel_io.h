/* Parallel configurations and device maps inside documents. */
#ifndef VPS_PARALLEL_IO_H
#define VPS_PARALLEL_IO_H

#include "io/doc.h"
#include "vps/parallel.h"

vps_result_t vps_parallel_read(struct vps_reader *r, const char *key, struct vps_parallel *p);
vps_result_t vps_parallel_write(struct vps_writer *w, const char *key, const struct vps_parallel *p);
vps_result_t vps_devices_read(struct vps_reader *r, const char *key, struct vps_devices *d);
vps_result_t vps_devices_write(struct vps_writer *w, const char *key, const struct vps_devices *d);

#endif
