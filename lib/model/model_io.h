/* Reading and writing a model inside another document (a layout embeds its
 * model so that it stands alone). */
#ifndef VPS_MODEL_IO_H
#define VPS_MODEL_IO_H

#include "io/doc.h"
#include "vps/model.h"

/* Write the model as the mapping `key`, every field present. */
vps_result_t vps_model_write(struct vps_writer *w, const char *key, const struct vps_model *m);
/* Read the mapping `key` (vps form; optional fields take their defaults). */
vps_result_t vps_model_read(struct vps_reader *r, const char *key, struct vps_model *m);

#endif
