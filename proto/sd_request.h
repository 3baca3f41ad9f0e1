/* The pure checks of client requests (proto/request.c): each field read and judged before any daemon state is touched. */
#ifndef SD_REQUEST_H
#define SD_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "sd_error.h"
#include "sd_format.h"

#define SD_SAVE_ID_MAX 128
#define SD_WORLD_MAX 65536
#define SD_PREFIX_MAX 128
#define SD_METADATA_MAX 1024
/* keep_last: at most this many checkpoints kept per owner and parent folder. */
#define SD_KEEP_LAST_MAX 1000000

/* A save id names the temporary folder and appears in logs: 1 to
 * SD_SAVE_ID_MAX bytes of letters, digits and -_.:@+=, not starting with '.'. */
int sd_save_id_check(const char *id, sd_error *err);

/* hello: the client's protocol must be the one this daemon speaks. */
int sd_req_hello(const json_t *req, sd_error *err);

/* begin: the single-node fields. Pointers borrow from req; metadata is
 * allocated (free it whatever the result). */
typedef struct {
  const char *save, *dir, *prefix;
  uint64_t rank, world_size, max_shard_size;
  uint64_t keep_last;      /* 0: not given, keep every older checkpoint */
  sd_kv *metadata;
  size_t nmetadata;
  int overwrite;
  /* deadlines in seconds (0: never); has_*: the field was given, else the daemon's default applies */
  uint64_t join_timeout, idle_timeout;
  int has_join_timeout, has_idle_timeout;
  /* the index's metadata.total_parameters; has_*: given, else the tensors' elements are counted */
  uint64_t total_parameters;
  int has_total_parameters;
} sd_req_begin;

/* The longest deadline a begin may ask for, in seconds (a week). */
#define SD_DEADLINE_MAX 604800

/* Reads every field, in this order: save (and its id check), dir, rank,
 * world_size, max_shard_size, prefix, metadata, overwrite, keep_last,
 * join_timeout, idle_timeout, total_parameters. */
int sd_req_begin_fields(const json_t *req, sd_req_begin *b, sd_error *err);
/* Then judges them together: max_shard_size at least 1 when given, a plain
 * prefix, metadata 'format' only "pt", keep_last in [1, SD_KEEP_LAST_MAX]
 * when given. */
int sd_req_begin_check(const json_t *req, const sd_req_begin *b, sd_error *err);

/* put: the tensor and the slice box, with the slice's byte size. */
typedef struct {
  const char *name;        /* borrowed from req */
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  uint64_t start[SD_MAX_DIMS], count[SD_MAX_DIMS];
  int64_t index;           /* -1 when not given */
  const char *prefix;      /* its file series' prefix, borrowed from req; NULL when not given */
  uint64_t len;            /* bytes of the slice */
} sd_req_tensor;

/* max_name and max_dims are the daemon's configured limits (SHARDD_E_LIMIT past them). */
int sd_req_tensor_parse(const json_t *req, unsigned max_name, unsigned max_dims, sd_req_tensor *t, sd_error *err);
/* Its last checks, on fields read already: the prefix, the element counts, the box in the shape;
 * sets len. Shared with the scan of a puts line (sd_puts_scan.h). */
int sd_req_tensor_finish(sd_req_tensor *t, sd_error *err);

/* put: where the bytes of a slice of len bytes of tensor `name` are. Either
 * inline (data set, owned by the caller on success), or in a region the
 * caller looks up (has_region: region and offset given), or nowhere for an
 * empty slice given neither. */
typedef struct {
  uint8_t *data;
  int has_region;
  uint64_t region, offset;
  int deferred;            /* region bytes put in place later ("ready" or seal) */
} sd_req_source;

int sd_req_source_parse(const json_t *req, const char *name, uint64_t len, sd_req_source *src, sd_error *err);

/* puts: at most this many slices in one request. Each is recorded on the event loop before
 * the next request of any client is read, so the bound keeps one line from holding the
 * others up for long (about a hundredth of a second at the daemon's cost per slice). */
#define SD_PUTS_MAX 16384

/* puts: the array of slices (each an object with a put's fields but 'save'), 0 to SD_PUTS_MAX
 * of them; *slices borrows from req. */
int sd_req_puts_slices(const json_t *req, const json_t **slices, size_t *n, sd_error *err);

/* Rewrites err's message for slice k of a puts line: "slices[k]: tensor 'NAME': ..." (name NULL
 * when it could not be read; the tensor is not named twice). */
void sd_req_in_batch(sd_error *err, size_t k, const char *name);

/* Decodes the strict base64 of field 'data' of `kind` `name` ("tensor 'w'",
 * "file 'a.json'"), naming them both in the error. */
int sd_req_data(const char *data, size_t dlen, const char *kind, const char *name, uint8_t **bytes,
                size_t *got, sd_error *err);

#endif
