/* Strided copies on the host: a box of elements between two views of
 * memory (include/vps/data.h). Every room that moves bytes uses them: the
 * transports, the trainer's checks, the benchmarks. */
#include <string.h>

#include "vps/data.h"

void vps_rowmajor_strides(const int64_t *ext, int ndim, int64_t *strides)
{
	int64_t s = 1;
	for (int k = ndim - 1; k >= 0; k--) {
		strides[k] = s;
		s *= ext[k];
	}
}

void vps_copy_strided(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
		      const int64_t *ext, int ndim, size_t esize)
{
	/* Fold the innermost axes that are contiguous in both views into one run. */
	int inner = ndim - 1;
	int64_t run = 1;
	if (ndim > 0 && dst_strides[inner] == 1 && src_strides[inner] == 1) {
		run = ext[inner];
		while (inner > 0 && dst_strides[inner - 1] == run && src_strides[inner - 1] == run) {
			inner--;
			run *= ext[inner];
		}
		inner--;
	}
	int64_t idx[VPS_MAX_DIMS] = {0};
	int64_t outer = 1;
	for (int k = 0; k <= inner; k++)
		outer *= ext[k];
	unsigned char *d = dst;
	const unsigned char *s = src;
	for (int64_t o = 0; o < outer; o++) {
		int64_t doff = 0, soff = 0;
		for (int k = 0; k <= inner; k++) {
			doff += idx[k] * dst_strides[k];
			soff += idx[k] * src_strides[k];
		}
		if (inner == ndim - 1) {
			memcpy(d + (size_t)doff * esize, s + (size_t)soff * esize, esize);
		} else {
			memcpy(d + (size_t)doff * esize, s + (size_t)soff * esize, (size_t)run * esize);
		}
		for (int k = inner; k >= 0; k--) {
			if (++idx[k] < ext[k])
				break;
			idx[k] = 0;
		}
	}
}
