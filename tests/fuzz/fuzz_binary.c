/* libFuzzer harness: the binary readers (layouts, plans, staged plans;
 * man/vps-formats.5 BINARY ENCODING).
 *
 * The first byte picks the kind (bits 0-1) and how the rest is taken (bit
 * 7). Clear: the rest is the whole file, header and zstd frame, as a tool
 * reads it. Set: the rest is the decompressed payload, which the harness
 * puts in a valid header and a checksummed frame, so that mutations reach
 * the fields rather than stopping at the frame's checksum. Each accepted
 * document is written and read back (fuzz_common.h). */
#include <zstd.h>

#include "fuzz_common.h"
#include "io/doc_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const int doc_kind[] = {VPS_DOC_LAYOUT, VPS_DOC_PLAN, VPS_DOC_STAGED};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int k = (data[0] & 3) % 3;
	const uint8_t *d = data + 1;
	size_t n = size - 1;
	if (!(data[0] & 0x80)) {
		fuzz_document((enum fuzz_doc)k, d, n);
		return 0;
	}
	size_t bound = ZSTD_compressBound(n);
	uint8_t *file = malloc(16 + bound);
	if (!file)
		abort();
	memset(file, 0, 16);
	memcpy(file, "\x89VPS", 4);
	file[4] = (uint8_t)doc_kind[k];
	file[6] = (uint8_t)vps_doc_binary_version(doc_kind[k]); /* the one this build reads */
	ZSTD_CCtx *c = ZSTD_createCCtx();
	if (!c)
		abort();
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
	ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
	size_t z = ZSTD_compress2(c, file + 16, bound, d, n);
	ZSTD_freeCCtx(c);
	if (ZSTD_isError(z))
		abort();
	fuzz_document((enum fuzz_doc)k, file, 16 + z);
	free(file);
	return 0;
}
