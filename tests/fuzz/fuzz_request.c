/* libFuzzer target: a client's byte stream, framed into lines and checked field by field as the daemon does. */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "fuzz_util.h"
#include "pathsafe.h"
#include "publish.h"
#include "sd_base64.h"
#include "sd_format.h"
#include "sd_layout.h"
#include "sd_linebuf.h"
#include "sd_msg.h"
#include "sd_puts_scan.h"
#include "sd_request.h"
#include "sd_reader.h"

/* What this covers:
 * - framing: sd_linebuf fed in random chunks through both the reserve/commit
 *   path the session uses and sd_linebuf_feed, compared line by line with a
 *   plain reference splitter;
 * - sd_msg_parse, sd_msg_op and every sd_msg_* getter with the fields and
 *   limits daemon/ops.c uses, each checked against its contract;
 * - the request checks daemon/ops.c itself calls (proto/request.c: hello,
 *   begin, the tensor and source of a put, the data of a file) with the
 *   save id check, sd_path_check_rel/name, and what each promises of what it
 *   lets through; strict base64 round-trips;
 * - every reply (ok or error, with the client's id) is one valid JSON line;
 * - a begin/put that passed those checks is planned with sd_plan_build and its
 *   header parsed back with sd_st_parse, so hostile names, prefixes and
 *   metadata that pass at request time cannot fail only at plan time.
 * Not reached: what needs daemon state (the save a request names, regions,
 * the shm name check in region.c) and the multi-node begin fields (cluster.c). */

/* ------------------------------------------------------------------------ *
 * Replies
 * ------------------------------------------------------------------------ */
/* The daemon writes every reply with sd_msg_dump: it must be exactly one
 * line that parses back to the same id, ok flag and error code. */
static void check_reply(json_t *reply, json_t *id, int code) {
  FUZZ_CHECK(reply != NULL, "reply is NULL");
  size_t len = 0;
  char *s = sd_msg_dump(reply, &len);
  FUZZ_CHECK(s != NULL && len >= 2, "sd_msg_dump failed");
  FUZZ_CHECK(s[len - 1] == '\n' && s[len] == '\0', "reply not terminated by a newline");
  FUZZ_CHECK(memchr(s, '\n', len - 1) == NULL && strlen(s) == len, "reply is not one line: %s", s);
  json_t *back = NULL;
  sd_error e = {0};
  FUZZ_CHECK(sd_msg_parse(s, len - 1, &back, &e) == 0, "reply does not parse back (%s): %s", e.msg, s);
  FUZZ_CHECK(json_equal(json_object_get(back, "id"), id ? id : json_null()), "id not echoed: %s", s);
  json_t *ok = json_object_get(back, "ok");
  FUZZ_CHECK(json_is_boolean(ok) && json_is_true(ok) == (code == 0), "wrong ok flag: %s", s);
  if (code) {
    json_t *jc = json_object_get(json_object_get(back, "error"), "code");
    json_t *jm = json_object_get(json_object_get(back, "error"), "message");
    FUZZ_CHECK(json_is_string(jc) && sd_err_from_name(json_string_value(jc)) == code,
               "error code %d not carried: %s", code, s);
    FUZZ_CHECK(json_is_string(jm) && json_string_length(jm) > 0, "error without a message: %s", s);
  }
  json_decref(back);
  free(s);
  json_decref(reply);
}

static void reply_err(json_t *id, const sd_error *err) {
  FUZZ_CHECK(err->code < 0, "failure without a code: '%s'", err->msg);
  FUZZ_CHECK(err->msg[0] != '\0', "failure %d without a message", err->code);
  check_reply(sd_msg_error_from(id, err), id, err->code);
}

/* ------------------------------------------------------------------------ *
 * Getters, each checked against its documented contract
 * ------------------------------------------------------------------------ */
static json_t *field_value(const json_t *req, const char *field) {
  json_t *v = json_object_get(req, field);
  return v && !json_is_null(v) ? v : NULL;
}

/* Shared rules: 1 means present, 0 absent and optional, <0 an error naming the field. */
static void check_rc(int rc, const json_t *req, const char *field, int required, const sd_error *err) {
  json_t *v = field_value(req, field);
  if (rc == 1) {
    FUZZ_CHECK(v != NULL, "field '%s' absent but reported present", field);
  } else if (rc == 0) {
    FUZZ_CHECK(v == NULL && !required, "field '%s': rc 0 when present or required", field);
  } else {
    FUZZ_CHECK(rc == SHARDD_E_INVALID_ARGUMENT || rc == SHARDD_E_NO_MEMORY, "field '%s': rc %d", field, rc);
    FUZZ_CHECK(err->code == rc, "field '%s': rc %d but err.code %d", field, rc, err->code);
    FUZZ_CHECK(strstr(err->msg, field) != NULL, "message does not name field '%s': %s", field, err->msg);
    FUZZ_CHECK(required || v != NULL, "absent optional field '%s' failed", field);
  }
}

static int get_str(const json_t *req, const char *field, int required, const char **out, size_t *len,
                   sd_error *err) {
  const char *s = NULL;
  size_t n = 0;
  int rc = sd_msg_str(req, field, required, &s, &n, err);
  check_rc(rc, req, field, required, err);
  if (rc == 1) {
    /* jansson refuses \u0000 and invalid UTF-8, so C string code is safe. */
    FUZZ_CHECK(s && strlen(s) == n && sd_utf8_valid(s, n, NULL), "field '%s' is not a clean string", field);
    *out = s;
    if (len) *len = n;
  }
  return rc;
}

/* Independent judgement of a JSON number against [0, max]: 1 and *val when
 * it is an integral value in range, 0 otherwise. */
static int ref_u64(const json_t *v, uint64_t max, uint64_t *val) {
  if (json_is_integer(v)) {
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > max) return 0;
    *val = (uint64_t)i;
    return 1;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (!(d >= 0) || d >= 18446744073709551616.0 || d != floor(d)) return 0;
    if ((uint64_t)d > max) return 0;
    *val = (uint64_t)d;
    return 1;
  }
  return 0;
}

static int get_u64(const json_t *req, const char *field, int required, uint64_t max, uint64_t *out,
                   sd_error *err) {
  uint64_t got = 0, want = 0;
  int rc = sd_msg_u64(req, field, required, max, &got, err);
  check_rc(rc, req, field, required, err);
  json_t *v = field_value(req, field);
  if (v) {
    int ok = ref_u64(v, max ? max : SD_MSG_INT_MAX, &want);
    FUZZ_CHECK((rc == 1) == ok, "field '%s': getter says %d, reference says %d", field, rc, ok);
    if (ok) FUZZ_CHECK(got == want, "field '%s': %llu, expected %llu", field, (unsigned long long)got,
                       (unsigned long long)want);
  }
  if (rc == 1) *out = got;
  return rc;
}

static int get_bool(const json_t *req, const char *field, int required, int *out, sd_error *err) {
  int b = -1;
  int rc = sd_msg_bool(req, field, required, &b, err);
  check_rc(rc, req, field, required, err);
  if (rc == 1) {
    FUZZ_CHECK(b == json_is_true(field_value(req, field)), "field '%s': wrong bool", field);
    *out = b;
  }
  return rc;
}

static int get_u64_array(const json_t *req, const char *field, int required, size_t max_n, uint64_t max,
                         uint64_t *out, size_t *n, sd_error *err) {
  uint64_t got[SD_MAX_DIMS];
  size_t gn = 0;
  FUZZ_CHECK(max_n <= SD_MAX_DIMS, "harness limit");
  int rc = sd_msg_u64_array(req, field, required, max_n, max, got, &gn, err);
  check_rc(rc, req, field, required, err);
  json_t *v = field_value(req, field);
  if (v) {
    int ok = json_is_array(v) && json_array_size(v) <= max_n;
    for (size_t i = 0; ok && i < json_array_size(v); i++) {
      uint64_t w = 0;
      ok = ref_u64(json_array_get(v, i), max ? max : SD_MSG_INT_MAX, &w);
      if (ok && rc == 1) FUZZ_CHECK(got[i] == w, "field '%s[%zu]': wrong value", field, i);
    }
    FUZZ_CHECK((rc == 1) == ok, "field '%s': getter says %d, reference says %d", field, rc, ok);
  }
  if (rc == 1) {
    FUZZ_CHECK(gn == json_array_size(v), "field '%s': wrong length", field);
    memcpy(out, got, gn * sizeof *got);
    *n = gn;
  }
  return rc;
}

static int get_str_map(const json_t *req, const char *field, int required, size_t max_n, sd_kv **out,
                       size_t *n, sd_error *err) {
  sd_kv *kv = NULL;
  size_t kn = 0;
  int rc = sd_msg_str_map(req, field, required, max_n, &kv, &kn, err);
  check_rc(rc, req, field, required, err);
  if (rc == 1) {
    json_t *v = field_value(req, field);
    FUZZ_CHECK(kn == json_object_size(v) && kn <= max_n, "field '%s': wrong size", field);
    for (size_t i = 0; i < kn; i++) {
      json_t *x = json_object_get(v, kv[i].key);
      FUZZ_CHECK(json_is_string(x) && strcmp(json_string_value(x), kv[i].value) == 0,
                 "field '%s': pair %zu does not match", field, i);
    }
    *out = kv;
    *n = kn;
  }
  return rc;
}

/* Strict base64 has one spelling per byte string: what sd_req_data decoded
 * must encode back to the input exactly; a refusal names the field. */
static void check_b64(int rc, const char *s, size_t len, const uint8_t *bytes, size_t got, const sd_error *err) {
  if (rc) {
    FUZZ_CHECK(bytes == NULL && (rc == SHARDD_E_INVALID_ARGUMENT || rc == SHARDD_E_NO_MEMORY) && err->code == rc,
               "base64 failure rc %d", rc);
    FUZZ_CHECK(strstr(err->msg, "field 'data'") != NULL, "base64 refusal does not name the field: %s", err->msg);
    return;
  }
  FUZZ_CHECK(bytes != NULL, "base64 success without a buffer");
  size_t elen = sd_b64_encoded_len(got);
  FUZZ_CHECK(elen == len, "base64 %zu chars decoded to %zu bytes, which encode to %zu", len, got, elen);
  char *back = malloc(elen + 1);
  FUZZ_CHECK(back != NULL, "oom");
  FUZZ_CHECK(sd_b64_encode(bytes, got, back) == elen && memcmp(back, s, len) == 0, "base64 does not round-trip");
  free(back);
}

/* ------------------------------------------------------------------------ *
 * Downstream: what passed at request time must plan and read back
 * ------------------------------------------------------------------------ */
static void plan_roundtrip(const sd_tensor *t, const sd_plan_opts *opts, const char *why) {
  sd_plan p;
  sd_error err = {0};
  int rc = sd_plan_build(&p, t, 1, opts, &err);
  FUZZ_CHECK(rc == 0, "%s accepted at request time but planning fails: %s", why, err.msg);
  FUZZ_CHECK(p.nfiles == 1, "one tensor, %zu files", p.nfiles);
  const sd_plan_file *f = &p.files[0];
  sd_st_header h;
  rc = sd_st_parse(f->name, f->header, (size_t)f->header_size, f->file_size, &h, &err);
  FUZZ_CHECK(rc == 0, "%s: planned header does not read back: %s", why, err.msg);
  FUZZ_CHECK(h.ntensors == 1 && strcmp(h.tensors[0].name, t->name) == 0, "%s: tensor name lost", why);
  FUZZ_CHECK(h.tensors[0].dtype == t->dtype && h.tensors[0].ndim == t->ndim &&
                 memcmp(h.tensors[0].shape, t->shape, t->ndim * sizeof t->shape[0]) == 0,
             "%s: tensor type lost", why);
  for (size_t i = 0; i < opts->nmetadata; i++) {
    const sd_kv *kv = &opts->metadata[i];
    const char *want = strcmp(kv->key, "format") == 0 ? "pt" : kv->value;
    size_t j = 0;
    while (j < h.nmeta && strcmp(h.meta[j].key, kv->key) != 0) j++;
    FUZZ_CHECK(j < h.nmeta && strcmp(h.meta[j].value, want) == 0, "%s: metadata pair %zu lost", why, i);
  }
  sd_st_header_free(&h);
  sd_plan_free(&p);
}

/* ------------------------------------------------------------------------ *
 * Ops (field order as in daemon/ops.c)
 * ------------------------------------------------------------------------ */
/* The daemon's max_name_len and max_dims (config.c defaults, or small ones). */
static unsigned cfg_max_name = SD_NAME_MAX, cfg_max_dims = SD_MAX_DIMS;

static int op_hello(const json_t *req, sd_error *err) {
  uint64_t proto = 0;
  sd_error e = {0};
  int got = get_u64(req, "proto", 1, 0, &proto, &e);
  int rc = sd_req_hello(req, err);
  FUZZ_CHECK((rc == 0) == (got == 1 && proto == SHARDD_PROTO_VERSION), "hello: rc %d for proto %llu", rc,
             (unsigned long long)proto);
  return rc;
}

static int op_attach(const json_t *req, sd_error *err) {
  const char *name = NULL;
  if (get_str(req, "shm", 1, &name, NULL, err) < 0) return err->code;
  return 0;
}

static int op_detach(const json_t *req, sd_error *err) {
  uint64_t rid = 0;
  if (get_u64(req, "region", 1, 0, &rid, err) < 0) return err->code;
  return 0;
}

/* Every getter's contract on the fields begin reads (the real checks stop at the first refusal). */
static void check_begin_getters(const json_t *req) {
  sd_error e = {0};
  const char *s = NULL;
  uint64_t u = 0;
  int b = 0;
  sd_kv *md = NULL;
  size_t nmd = 0;
  get_str(req, "save", 1, &s, NULL, &e);
  get_str(req, "dir", 1, &s, NULL, &e);
  get_u64(req, "rank", 1, SD_WORLD_MAX, &u, &e);
  get_u64(req, "world_size", 1, SD_WORLD_MAX, &u, &e);
  get_u64(req, "max_shard_size", 0, 0, &u, &e);
  get_str(req, "prefix", 0, &s, NULL, &e);
  if (get_str_map(req, "metadata", 0, SD_METADATA_MAX, &md, &nmd, &e) == 1) free(md);
  get_bool(req, "overwrite", 0, &b, &e);
}

/* The real begin checks (daemon/ops.c; the multi-node fields are cluster.c's
 * and not linked here), then sd_save_begin's own before it touches state. */
static int op_begin(const json_t *req, sd_error *err) {
  check_begin_getters(req);
  sd_req_begin b = {0};
  int rc = sd_req_begin_fields(req, &b, err);
  if (!rc) rc = sd_req_begin_check(req, &b, err);
  if (rc) goto out;
  FUZZ_CHECK(sd_save_id_check(b.save, NULL) == 0 && strlen(b.save) <= SD_SAVE_ID_MAX && b.save[0] != '.',
             "save id '%s' let through", b.save);
  FUZZ_CHECK(!field_value(req, "max_shard_size") || b.max_shard_size > 0, "max_shard_size 0 let through");
  for (size_t i = 0; i < b.nmetadata; i++)
    FUZZ_CHECK(strcmp(b.metadata[i].key, "format") != 0 || strcmp(b.metadata[i].value, "pt") == 0,
               "metadata format '%s' let through", b.metadata[i].value);
  if (b.world_size == 0 || b.world_size > SD_WORLD_MAX) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'world_size' must be in [1, %d]", SD_WORLD_MAX);
    goto out;
  }
  if (b.rank >= b.world_size) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'rank' is outside [0, world_size)");
    goto out;
  }
  if ((rc = sd_path_check_rel(b.dir, err)) != 0) {
    FUZZ_CHECK(rc == SHARDD_E_BAD_PATH, "dir check rc %d", rc);
    goto out;
  }
  sd_tensor t = {.name = "w", .dtype = SD_DT_F32, .ndim = 1, .shape = {3}, .index = -1};
  sd_plan_opts opts = {.max_shard_size = b.max_shard_size, .prefix = b.prefix, .metadata = b.metadata,
                       .nmetadata = b.nmetadata};
  plan_roundtrip(&t, &opts, "begin (prefix, metadata, max_shard_size)");
out:
  free(b.metadata);
  return rc;
}

/* Every getter's contract on the fields put reads. */
static void check_put_getters(const json_t *req) {
  sd_error e = {0};
  const char *s = NULL;
  uint64_t u = 0, v[SD_MAX_DIMS];
  size_t n = 0;
  int b = 0;
  get_str(req, "name", 1, &s, NULL, &e);
  get_str(req, "dtype", 1, &s, NULL, &e);
  get_u64_array(req, "shape", 1, SD_MAX_DIMS, 0, v, &n, &e);
  get_u64_array(req, "start", 0, SD_MAX_DIMS, 0, v, &n, &e);
  get_u64_array(req, "count", 0, SD_MAX_DIMS, 0, v, &n, &e);
  get_u64(req, "index", 0, 0, &u, &e);
  get_str(req, "data", 0, &s, NULL, &e);
  get_u64(req, "region", 0, 0, &u, &e);
  get_u64(req, "offset", 0, 0, &u, &e);
  get_bool(req, "deferred", 0, &b, &e);
}

/* A put's fields, of a put line or of one slice of a puts line. */
static int put_fields(const json_t *req, sd_error *err) {
  check_put_getters(req);
  sd_req_tensor t;
  if (sd_req_tensor_parse(req, cfg_max_name, cfg_max_dims, &t, err) != 0) return err->code;
  const char *dtype = json_string_value(json_object_get(req, "dtype"));
  FUZZ_CHECK(dtype && strcmp(sd_dtype_name(t.dtype), dtype) == 0, "dtype '%s' parsed as %s", dtype,
             sd_dtype_name(t.dtype));
  FUZZ_CHECK(strlen(t.name) <= cfg_max_name, "max_name_len let %zu bytes through", strlen(t.name));
  FUZZ_CHECK(t.ndim <= cfg_max_dims, "max_dims let %u dimensions through", t.ndim);
  uint64_t numel = 1;
  for (uint32_t i = 0; i < t.ndim; i++) {
    FUZZ_CHECK(t.start[i] <= t.shape[i] && t.count[i] <= t.shape[i] - t.start[i], "box check let dim %u escape", i);
    FUZZ_CHECK(t.count[i] == 0 || numel <= UINT64_MAX / t.count[i], "slice element count overflows");
    numel *= t.count[i];
  }
  FUZZ_CHECK(t.len / sd_dtype_size(t.dtype) == numel && t.len % sd_dtype_size(t.dtype) == 0,
             "slice of %llu elements said to hold %llu bytes", (unsigned long long)numel, (unsigned long long)t.len);
  sd_req_source src;
  int rc = sd_req_source_parse(req, t.name, t.len, &src, err);
  const char *data = json_string_value(json_object_get(req, "data"));
  if (data && (rc == 0 || strstr(err->msg, "field 'data'")))
    check_b64(rc, data, strlen(data), src.data, t.len, err);
  if (rc) return rc;
  if (src.data) {
    FUZZ_CHECK(!src.has_region && !src.deferred, "inline data with a region or deferred");
    free(src.data);
  } else if (!src.has_region) {
    FUZZ_CHECK(t.len == 0 && !src.deferred, "a slice of %llu bytes with no source", (unsigned long long)t.len);
  }
  /* A tensor whose full byte size overflows can never be covered by real
   * slices, so only sizes that fit are expected to plan. */
  sd_tensor full = {.name = t.name, .dtype = t.dtype, .ndim = t.ndim, .index = t.index};
  memcpy(full.shape, t.shape, sizeof full.shape);
  sd_error e2 = {0};
  uint64_t nbytes = 0;
  if (sd_tensor_nbytes(&full, &nbytes, &e2) == 0) {
    sd_plan_opts opts = {0};
    plan_roundtrip(&full, &opts, "put (name, dtype, shape, index)");
  }
  return 0;
}

static int op_put(const json_t *req, sd_error *err) {
  const char *save = NULL;
  if (get_str(req, "save", 1, &save, NULL, err) < 0) return err->code;
  return put_fields(req, err);
}

/* Each slice as its own put; the first refused is named by its place. */
static int op_puts(const json_t *req, sd_error *err) {
  const char *save = NULL;
  const json_t *slices = NULL;
  size_t n = 0;
  if (get_str(req, "save", 1, &save, NULL, err) < 0 || sd_req_puts_slices(req, &slices, &n, err) != 0)
    return err->code;
  FUZZ_CHECK(json_is_array(slices) && n == json_array_size(slices) && n <= SD_PUTS_MAX, "puts let %zu slices through",
             n);
  for (size_t k = 0; k < n; k++) {
    const json_t *slice = json_array_get(slices, k);
    FUZZ_CHECK(json_is_object(slice), "slice %zu is not an object", k);
    if (put_fields(slice, err) == 0) continue;
    char want[32];
    snprintf(want, sizeof want, "slices[%zu]: ", k);
    sd_req_in_batch(err, k, json_string_value(json_object_get(slice, "name")));
    FUZZ_CHECK(strncmp(err->msg, want, strlen(want)) == 0, "a refused slice not named by its place: %s", err->msg);
    return err->code;
  }
  return 0;
}

static int op_file(const json_t *req, sd_error *err) {
  const char *save = NULL, *path = NULL, *data = NULL;
  size_t dlen = 0, got = 0;
  uint8_t *bytes = NULL;
  if (get_str(req, "save", 1, &save, NULL, err) < 0 || get_str(req, "path", 1, &path, NULL, err) < 0 ||
      sd_path_check_name(path, err) || get_str(req, "data", 1, &data, &dlen, err) < 0)
    return err->code;
  int rc = sd_req_data(data, dlen, "file", path, &bytes, &got, err);
  check_b64(rc, data, dlen, bytes, got, err);
  free(bytes);
  return rc;
}

static int op_save_only(const json_t *req, sd_error *err) {
  const char *save = NULL;
  if (get_str(req, "save", 1, &save, NULL, err) < 0) return err->code;
  return 0;
}

static int op_status(const json_t *req, sd_error *err) {
  (void)req;
  (void)err;
  return 0;
}

static const struct {
  const char *name;
  int (*fn)(const json_t *req, sd_error *err);
} ops[] = {
    {"hello", op_hello}, {"attach", op_attach},    {"detach", op_detach},      {"begin", op_begin},
    {"put", op_put},     {"file", op_file},        {"seal", op_save_only},     {"wait", op_save_only},
    {"abort", op_save_only}, {"status", op_status}, {"puts", op_puts},
};

/* A puts line the scan takes (what the daemon then reads without jansson) is one jansson and the
 * field getters take too, with the same values. */
static void check_scan(const sd_puts_scan *p, const json_t *req) {
  const json_t *slices = NULL;
  const char *op = NULL;
  size_t n = 0;
  sd_error err = {0};
  FUZZ_CHECK(req && sd_msg_op(req, &op, &err) == 0 && strcmp(op, "puts") == 0, "scanned a line that is no puts");
  FUZZ_CHECK(json_integer_value(json_object_get(req, "id")) == p->id, "scanned id %lld", (long long)p->id);
  FUZZ_CHECK(strcmp(json_string_value(json_object_get(req, "save")), p->save) == 0, "scanned save '%s'", p->save);
  FUZZ_CHECK(sd_req_puts_slices(req, &slices, &n, &err) == 0 && n == p->n, "scanned %zu slices: %s", p->n, err.msg);
  for (size_t k = 0; k < n; k++) {
    const json_t *o = json_array_get(slices, k);
    const sd_puts_slice *s = &p->slices[k];
    sd_req_tensor t;
    sd_req_source src;
    FUZZ_CHECK(sd_req_tensor_parse(o, SD_NAME_MAX, SD_MAX_DIMS, &t, &err) == 0, "scanned slice %zu: %s", k, err.msg);
    FUZZ_CHECK(sd_req_source_parse(o, t.name, t.len, &src, &err) == 0, "scanned slice %zu: %s", k, err.msg);
    FUZZ_CHECK(strcmp(s->t.name, t.name) == 0 && s->name_len == strlen(t.name) && s->t.dtype == t.dtype &&
                   s->t.ndim == t.ndim && s->t.index == t.index && s->t.len == t.len && !s->t.prefix == !t.prefix &&
                   (!t.prefix || strcmp(s->t.prefix, t.prefix) == 0),
               "slice %zu scanned otherwise", k);
    for (uint32_t d = 0; d < t.ndim; d++)
      FUZZ_CHECK(s->t.shape[d] == t.shape[d] && s->t.start[d] == t.start[d] && s->t.count[d] == t.count[d],
                 "slice %zu dim %u scanned otherwise", k, d);
    FUZZ_CHECK(!src.data && s->src.has_region == src.has_region && s->src.region == src.region &&
                   s->src.offset == src.offset && s->src.deferred == src.deferred,
               "slice %zu's source scanned otherwise", k);
  }
}

/* sd_ops_dispatch without the daemon. */
static void handle_line(const char *line, size_t len) {
  sd_error err = {0};
  json_t *req = NULL;
  sd_puts_scan scan;
  int scanned = sd_puts_scan_line(line, len, &scan);
  int parse_rc = sd_msg_parse(line, len, &req, &err);
  if (scanned) check_scan(&scan, req);
  sd_puts_scan_free(&scan);
  if (parse_rc != 0) {
    FUZZ_CHECK(req == NULL && err.code == SHARDD_E_BAD_REQUEST, "parse failure rc %d", err.code);
    reply_err(NULL, &err);
    return;
  }
  FUZZ_CHECK(json_is_object(req), "sd_msg_parse returned a non-object");
  json_t *id = json_object_get(req, "id");
  const char *op = NULL;
  if (sd_msg_op(req, &op, &err) != 0) {
    FUZZ_CHECK(err.code == SHARDD_E_BAD_REQUEST, "op failure rc %d", err.code);
    reply_err(id, &err);
    json_decref(req);
    return;
  }
  int found = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0] && !found; i++) {
    if (strcmp(ops[i].name, op) != 0) continue;
    found = 1;
    if (ops[i].fn(req, &err) != 0)
      reply_err(id, &err);
    else
      check_reply(sd_msg_ok(id), id, 0);
  }
  if (!found) {
    sd_fail(&err, SHARDD_E_UNKNOWN_OP, "unknown op '%.100s'", op);
    reply_err(id, &err);
  }
  json_decref(req);
}

/* ------------------------------------------------------------------------ *
 * Framing
 * ------------------------------------------------------------------------ */
static uint32_t next_rand(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

/* Byte 0 picks the line cap (bit 7: small, so the too-long path is
 * reachable), the name and dimension limits (bit 6: small) and seeds the
 * chunk sizes; the rest is what the client sent. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t ctl = data[0];
  const char *S = (const char *)data + 1;
  size_t total = size - 1;
  size_t max_line = (ctl & 0x80) ? 8 + (size_t)(ctl & 0x3f) * 4 : 0;
  cfg_max_name = (ctl & 0x40) ? 8 : SD_NAME_MAX;
  cfg_max_dims = (ctl & 0x40) ? 2 : SD_MAX_DIMS;
  uint32_t rng = 0x9e3779b9u ^ ctl;
  sd_linebuf lb;
  sd_linebuf_init(&lb, max_line);
  if (!max_line) max_line = SD_LINE_MAX_DEFAULT;
  size_t fed = 0, pos = 0;
  int closed = 0;
  while (fed < total && !closed) {
    size_t chunk = 1 + next_rand(&rng) % 97;
    if (chunk > total - fed) chunk = total - fed;
    if (next_rand(&rng) & 1) {
      size_t avail = 0;
      char *p = sd_linebuf_reserve(&lb, chunk, &avail);
      FUZZ_CHECK(p != NULL && avail >= chunk, "reserve gave %zu of %zu bytes", avail, chunk);
      memcpy(p, S + fed, chunk);
      sd_linebuf_commit(&lb, chunk);
    } else {
      sd_error err = {0};
      FUZZ_CHECK(sd_linebuf_feed(&lb, S + fed, chunk, &err) == 0, "feed failed: %s", err.msg);
    }
    fed += chunk;
    for (;;) {
      char *line = NULL;
      size_t len = 0;
      sd_error err = {0};
      int rc = sd_linebuf_next(&lb, &line, &len, &err);
      const char *nl = memchr(S + pos, '\n', fed - pos);
      size_t n = nl ? (size_t)(nl - (S + pos)) : fed - pos;
      if (rc < 0) {
        FUZZ_CHECK(rc == SHARDD_E_BAD_REQUEST && err.code == rc, "framing rc %d", rc);
        FUZZ_CHECK(n > max_line, "line of %zu bytes refused (cap %zu)", n, max_line);
        reply_err(NULL, &err);
        closed = 1; /* framing is lost: the session hangs up */
        break;
      }
      if (rc == 0) {
        FUZZ_CHECK(!nl, "a complete line at %zu was not handed out", pos);
        FUZZ_CHECK(n <= max_line, "pending %zu bytes over the cap %zu not refused", n, max_line);
        FUZZ_CHECK(sd_linebuf_pending(&lb) == n, "pending %zu, expected %zu", sd_linebuf_pending(&lb), n);
        break;
      }
      FUZZ_CHECK(rc == 1 && nl, "line handed out without a newline");
      FUZZ_CHECK(n <= max_line, "line of %zu bytes over the cap %zu accepted", n, max_line);
      size_t want = n > 0 && S[pos + n - 1] == '\r' ? n - 1 : n;
      FUZZ_CHECK(len == want && memcmp(line, S + pos, len) == 0 && line[len] == '\0',
                 "line at %zu differs from the reference split", pos);
      pos += n + 1;
      handle_line(line, len);
    }
  }
  sd_linebuf_free(&lb);
  return 0;
}
