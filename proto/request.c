/* The pure checks of client requests, shared by daemon/ops.c and the request fuzzer: fields read and judged, no state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_base64.h"
#include "sd_msg.h"
#include "sd_request.h"

int sd_save_id_check(const char *id, sd_error *err) {
  size_t n = strlen(id);
  if (n == 0 || n > SD_SAVE_ID_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'save' must be 1 to %d bytes", SD_SAVE_ID_MAX);
  /* The id names the temporary folder and appears in logs: keep it tame. */
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || c == '.' || c == ':' || c == '@' || c == '+' || c == '=';
    if (!ok || (i == 0 && c == '.'))
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "field 'save' may hold only letters, digits and -_.:@+= (not starting with '.'),"
                     " got '%.200s'", id);
  }
  return 0;
}

int sd_req_hello(const json_t *req, sd_error *err) {
  uint64_t proto = 0;
  if (sd_msg_u64(req, "proto", 1, 0, &proto, err) < 0) return err->code;
  if (proto != SHARDD_PROTO_VERSION)
    return sd_fail(err, SHARDD_E_UNSUPPORTED_PROTO, "protocol %llu is not supported (this daemon speaks %d)",
                   (unsigned long long)proto, SHARDD_PROTO_VERSION);
  return 0;
}

int sd_req_begin_fields(const json_t *req, sd_req_begin *b, sd_error *err) {
  if (sd_msg_str(req, "save", 1, &b->save, NULL, err) < 0 || sd_save_id_check(b->save, err) ||
      sd_msg_str(req, "dir", 1, &b->dir, NULL, err) < 0 ||
      sd_msg_u64(req, "rank", 1, SD_WORLD_MAX, &b->rank, err) < 0 ||
      sd_msg_u64(req, "world_size", 1, SD_WORLD_MAX, &b->world_size, err) < 0 ||
      sd_msg_u64(req, "max_shard_size", 0, 0, &b->max_shard_size, err) < 0 ||
      sd_msg_str(req, "prefix", 0, &b->prefix, NULL, err) < 0 ||
      sd_msg_str_map(req, "metadata", 0, SD_METADATA_MAX, &b->metadata, &b->nmetadata, err) < 0 ||
      sd_msg_bool(req, "overwrite", 0, &b->overwrite, err) < 0 ||
      sd_msg_u64(req, "keep_last", 0, SD_KEEP_LAST_MAX, &b->keep_last, err) < 0 ||
      (b->has_join_timeout = sd_msg_u64(req, "join_timeout", 0, SD_DEADLINE_MAX, &b->join_timeout, err)) < 0 ||
      (b->has_idle_timeout = sd_msg_u64(req, "idle_timeout", 0, SD_DEADLINE_MAX, &b->idle_timeout, err)) < 0 ||
      (b->has_total_parameters = sd_msg_u64(req, "total_parameters", 0, 0, &b->total_parameters, err)) < 0)
    return err->code;
  return 0;
}

int sd_req_begin_check(const json_t *req, const sd_req_begin *b, sd_error *err) {
  if (json_object_get(req, "max_shard_size") && !json_is_null(json_object_get(req, "max_shard_size")) &&
      b->max_shard_size == 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'max_shard_size' must be at least 1");
  /* 0 would delete the checkpoint just committed: "keep nothing" is not retention. */
  if (json_object_get(req, "keep_last") && !json_is_null(json_object_get(req, "keep_last")) && b->keep_last == 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'keep_last' must be at least 1 (the save being committed)");
  if (b->prefix && (strlen(b->prefix) > SD_PREFIX_MAX || sd_prefix_check(b->prefix, err) != 0)) {
    if (!err->code)
      sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'prefix' must be at most %d bytes", SD_PREFIX_MAX);
    return err->code;
  }
  for (size_t i = 0; i < b->nmetadata; i++) {
    if (strcmp(b->metadata[i].key, "format") == 0 && strcmp(b->metadata[i].value, "pt") != 0)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "metadata 'format' must be \"pt\" (transformers requires it)");
  }
  return 0;
}

int sd_req_tensor_parse(const json_t *req, unsigned max_name, unsigned max_dims, sd_req_tensor *t, sd_error *err) {
  size_t nlen = 0, n = 0, ns = 0, nc = 0;
  const char *dtype = NULL;
  uint64_t index = 0;
  if (sd_msg_str(req, "name", 1, &t->name, &nlen, err) < 0) return err->code;
  if (nlen > max_name)
    return sd_fail(err, SHARDD_E_LIMIT, "a tensor name of %zu bytes is over max_name_len=%u", nlen, max_name);
  if (sd_name_check(t->name, nlen, err) != 0) return err->code;
  const json_t *shape = json_object_get(req, "shape");
  if (json_is_array(shape) && json_array_size(shape) > max_dims)
    return sd_fail(err, SHARDD_E_LIMIT, "tensor '%s': 'shape' has %zu dimensions, over max_dims=%u", t->name,
                   json_array_size(shape), max_dims);
  if (sd_msg_str(req, "dtype", 1, &dtype, NULL, err) < 0) return err->code;
  if (sd_dtype_parse(dtype, &t->dtype, err) != 0) return err->code;
  if (sd_msg_u64_array(req, "shape", 1, SD_MAX_DIMS, 0, t->shape, &n, err) < 0) return err->code;
  t->ndim = (uint32_t)n;
  int has_start = sd_msg_u64_array(req, "start", 0, SD_MAX_DIMS, 0, t->start, &ns, err);
  if (has_start < 0) return err->code;
  int has_count = sd_msg_u64_array(req, "count", 0, SD_MAX_DIMS, 0, t->count, &nc, err);
  if (has_count < 0) return err->code;
  if (has_start != has_count)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': give both 'start' and 'count', or neither",
                   t->name);
  if (!has_start) {
    memset(t->start, 0, sizeof t->start);
    memcpy(t->count, t->shape, sizeof t->count);
  } else if (ns != n || nc != n) {
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor '%s': 'start' and 'count' need %zu entries each (one per dimension of 'shape')",
                   t->name, n);
  }
  int has_index = sd_msg_u64(req, "index", 0, 0, &index, err);
  if (has_index < 0) return err->code;
  t->index = has_index ? (int64_t)index : -1;
  t->prefix = NULL;
  if (sd_msg_str(req, "prefix", 0, &t->prefix, NULL, err) < 0) return err->code;
  return sd_req_tensor_finish(t, err);
}

int sd_req_tensor_finish(sd_req_tensor *t, sd_error *err) {
  if (t->prefix && (strlen(t->prefix) > SD_PREFIX_MAX || sd_prefix_check(t->prefix, err) != 0)) {
    if (strlen(t->prefix) > SD_PREFIX_MAX)
      sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': field 'prefix' must be at most %d bytes", t->name,
              SD_PREFIX_MAX);
    return err->code;
  }
  uint64_t numel = 0;
  if (sd_tensor_numel(t->name, t->ndim, t->shape, &numel, err) != 0) return err->code;
  sd_box box;
  memcpy(box.start, t->start, sizeof box.start);
  memcpy(box.count, t->count, sizeof box.count);
  if (sd_box_check(t->name, t->ndim, t->shape, &box, err) != 0) return err->code;
  if (sd_tensor_numel(t->name, t->ndim, t->count, &numel, err) != 0) return err->code;
  unsigned esize = sd_dtype_size(t->dtype);
  if (numel > UINT64_MAX / esize)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': the slice's byte size overflows", t->name);
  t->len = numel * esize;
  return 0;
}

int sd_req_data(const char *data, size_t dlen, const char *kind, const char *name, uint8_t **bytes,
                size_t *got, sd_error *err) {
  if (sd_b64_decode(data, dlen, bytes, got, err) == 0) return 0;
  if (!err->code) err->code = SHARDD_E_INVALID_ARGUMENT;
  char why[SD_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", err->msg);
  return sd_fail(err, err->code, "%s '%s': field 'data': %s", kind, name, why);
}

int sd_req_source_parse(const json_t *req, const char *name, uint64_t len, sd_req_source *src, sd_error *err) {
  const char *data = NULL;
  size_t dlen = 0;
  memset(src, 0, sizeof *src);
  int has_data = sd_msg_str(req, "data", 0, &data, &dlen, err);
  if (has_data < 0) return err->code;
  int has_region = sd_msg_u64(req, "region", 0, 0, &src->region, err);
  if (has_region < 0) return err->code;
  int has_offset = sd_msg_u64(req, "offset", 0, 0, &src->offset, err);
  if (has_offset < 0) return err->code;
  if (has_data && (has_region || has_offset))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor '%s': give either 'region' and 'offset' or 'data', not both", name);
  if (sd_msg_bool(req, "deferred", 0, &src->deferred, err) < 0) return err->code;
  if (src->deferred && has_data)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "tensor '%s': 'deferred' needs 'region' and 'offset' (inline 'data' is in place already)", name);
  if (has_data) {
    size_t got = 0;
    uint8_t *bytes = NULL;
    if (sd_req_data(data, dlen, "tensor", name, &bytes, &got, err) != 0) return err->code;
    if (got != len) {
      free(bytes);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': 'data' holds %zu bytes, the slice needs %llu",
                     name, got, (unsigned long long)len);
    }
    src->data = bytes;
    return 0;
  }
  /* A slice of no bytes (an uneven split leaving this rank nothing) reads
   * nothing, so a rank that holds nothing needs no shared memory. */
  if (len == 0 && !has_region && !has_offset) {
    src->deferred = 0;
    return 0;
  }
  if (!has_region || !has_offset)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': give 'region' and 'offset' (or inline 'data')",
                   name);
  src->has_region = 1;
  return 0;
}

int sd_req_puts_slices(const json_t *req, const json_t **slices, size_t *n, sd_error *err) {
  const json_t *a = json_object_get(req, "slices");
  if (!a || json_is_null(a)) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'slices' is required");
  if (!json_is_array(a)) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'slices' must be an array");
  size_t count = json_array_size(a);
  if (count > SD_PUTS_MAX)
    return sd_fail(err, SHARDD_E_LIMIT, "puts: %zu slices in one request, over the %d a request may hold", count,
                   SD_PUTS_MAX);
  for (size_t k = 0; k < count; k++)
    if (!json_is_object(json_array_get(a, k)))
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "slices[%zu] must be an object (the fields of a put)", k);
  *slices = a;
  *n = count;
  return 0;
}

void sd_req_in_batch(sd_error *err, size_t k, const char *name) {
  char why[SD_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", err->msg);
  if (!name || strncmp(why, "tensor '", 8) == 0)
    sd_fail(err, err->code, "slices[%zu]: %s", k, why);
  else
    sd_fail(err, err->code, "slices[%zu]: tensor '%.200s': %s", k, name, why);
}
