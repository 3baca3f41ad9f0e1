/* libshardd saves: begin, the put variants, files, seal/ready/abort, and save options from the environment. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client_int.h"
#include "sd_base64.h"
#include "sd_error.h"
#include "sd_format.h"
#include "sd_layout.h"
#include "sd_msg.h"
#include "sd_utf8.h"
#include "shardd/shardd.h"

/* ------------------------------------------------------------------------ *
 * Field encoding
 * ------------------------------------------------------------------------ */
static json_t *u64_json(uint64_t v) { return v > (uint64_t)INT64_MAX ? NULL : json_integer((json_int_t)v); }

static int set_u64(shardd_client *c, json_t *obj, const char *key, uint64_t v) {
  json_t *j = u64_json(v);
  if (!j) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "%s %" PRIu64 " does not fit in a JSON integer", key, v);
  json_object_set_new(obj, key, j);
  return 0;
}

static int set_dims(shardd_client *c, json_t *obj, const char *key, const char *name, int ndim,
                    const uint64_t *v) {
  json_t *a = json_array();
  for (int i = 0; i < ndim; i++) {
    json_t *j = u64_json(v[i]);
    if (!j) {
      json_decref(a);
      return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': %s[%d] = %" PRIu64 " is too large",
                   name, key, i, v[i]);
    }
    json_array_append_new(a, j);
  }
  json_object_set_new(obj, key, a);
  return 0;
}

/* Validates a tensor description; *nbytes is its slice's byte size, *sliced whether it names a box. */
static int desc_check(shardd_client *c, const char *save, const shardd_tensor_desc *t, uint64_t *nbytes,
                      int *sliced) {
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put: save id is NULL");
  if (!t || !t->name) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put: tensor name is NULL");
  const char *name = t->name;
  if (!t->dtype) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': dtype is NULL", name);
  sd_dtype dt;
  sd_error e;
  if (sd_dtype_parse(t->dtype, &dt, &e)) return sd_client_fail(c, e.code, "tensor '%s': %s", name, e.msg);
  if (t->ndim < 0 || t->ndim > SD_MAX_DIMS)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': ndim %d is outside 0..%d", name,
                 t->ndim, SD_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': shape is NULL", name);
  if (!t->start != !t->count)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': give both start and count, or neither",
                 name);
  *sliced = t->start != NULL && t->ndim > 0;
  uint64_t n = sd_dtype_size(dt);
  for (int i = 0; i < t->ndim; i++) {
    uint64_t dim = *sliced ? t->count[i] : t->shape[i];
    if (*sliced && (t->start[i] > t->shape[i] || t->count[i] > t->shape[i] - t->start[i]))
      return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT,
                   "tensor '%s': box start %" PRIu64 " count %" PRIu64 " exceeds shape %" PRIu64
                   " in dimension %d",
                   name, t->start[i], t->count[i], t->shape[i], i);
    if (dim != 0 && n > UINT64_MAX / dim)
      return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': byte size overflows", name);
    if (t->shape[i] > (uint64_t)INT64_MAX)
      return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': shape[%d] = %" PRIu64 " is too large",
                   name, i, t->shape[i]);
    n *= dim;
  }
  *nbytes = n;
  return 0;
}

/* Validates a tensor description, computes its slice's byte size, and builds
 * the common part of a put request. */
static int put_request(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                       json_t **out, uint64_t *nbytes) {
  *out = NULL;
  int sliced = 0;
  int rc = desc_check(c, save, t, nbytes, &sliced);
  if (rc) return rc;
  const char *name = t->name;
  json_t *req = json_pack("{s:s, s:s, s:s, s:s}", "op", "put", "save", save, "name", name, "dtype",
                          t->dtype);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': name or save is not valid UTF-8", name);
  rc = set_dims(c, req, "shape", name, t->ndim, t->shape);
  if (!rc && sliced) rc = set_dims(c, req, "start", name, t->ndim, t->start);
  if (!rc && sliced) rc = set_dims(c, req, "count", name, t->ndim, t->count);
  if (!rc && t->index >= 0) json_object_set_new(req, "index", json_integer(t->index));
  if (rc) {
    json_decref(req);
    return rc;
  }
  *out = req;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Saves
 * ------------------------------------------------------------------------ */
/* The multi-node fields; the daemon checks them further. */
static int begin_peers(shardd_client *c, json_t *req, const shardd_save_opts *o) {
  if (o->node_rank < 0 || o->node_rank >= o->nnodes)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: node_rank %d is outside nnodes %d", o->node_rank, o->nnodes);
  json_t *leader = o->leader ? json_string(o->leader) : NULL;
  if (!leader)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: nnodes is %d but leader is NULL or not valid UTF-8", o->nnodes);
  json_object_set_new(req, "nnodes", json_integer(o->nnodes));
  json_object_set_new(req, "node_rank", json_integer(o->node_rank));
  json_object_set_new(req, "leader", leader);
  if (o->write_mode) {
    json_t *m = json_string(o->write_mode);
    if (!m) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: write_mode is not valid UTF-8");
    json_object_set_new(req, "write_mode", m);
  }
  return 0;
}

/* A non-negative decimal environment variable: 1 when set, 0 when unset, -1 when malformed. */
static int env_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > INT_MAX) {
    sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable %s='%.40s' is not a non-negative integer", name, s);
    return -1;
  }
  *out = (int)v;
  return 1;
}

SHARDD_EXPORT int shardd_save_opts_from_env(shardd_save_opts *o, char *leader_buf, size_t leader_len) {
  if (!o) return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_save_opts_from_env: opts is NULL");
  int rank = 0, world = 0, nnodes = 1, node = 0, local_rank = 0, local_world = 0, port = SHARDD_DEFAULT_PEER_PORT;
  int r;
  if ((r = env_int("RANK", &rank)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0) return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable RANK is not set (run under torchrun)");
  if ((r = env_int("WORLD_SIZE", &world)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0 || world < 1)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable WORLD_SIZE is not set or is 0");
  if (rank >= world)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "RANK=%d is outside WORLD_SIZE=%d", rank, world);
  int has_lw = env_int("LOCAL_WORLD_SIZE", &local_world);
  if (has_lw < 0) return SHARDD_E_INVALID_ARGUMENT;
  r = env_int("NNODES", &nnodes);
  if (r == 0) r = env_int("GROUP_WORLD_SIZE", &nnodes);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0) nnodes = has_lw && local_world > 0 && world % local_world == 0 ? world / local_world : 1;
  if (nnodes < 1 || nnodes > world)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "nnodes %d does not fit WORLD_SIZE=%d", nnodes, world);
  r = env_int("NODE_RANK", &node);
  if (r == 0) r = env_int("GROUP_RANK", &node);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0 && nnodes > 1)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "%d nodes but neither NODE_RANK nor GROUP_RANK is set", nnodes);
  if (node >= nnodes)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "NODE_RANK=%d is outside %d nodes", node, nnodes);
  r = env_int("LOCAL_RANK", &local_rank);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r > 0 && has_lw > 0 && local_rank >= local_world)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "LOCAL_RANK=%d is outside LOCAL_WORLD_SIZE=%d", local_rank,
                        local_world);
  o->rank = rank;
  o->world_size = world;
  o->nnodes = nnodes;
  o->node_rank = node;
  if (nnodes <= 1) {
    o->leader = NULL;
    return 0;
  }
  const char *explicit_leader = getenv("SHARDD_LEADER");
  const char *addr = getenv("MASTER_ADDR");
  if ((r = env_int("SHARDD_PEER_PORT", &port)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (port < 1 || port > 65535)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "SHARDD_PEER_PORT=%d is not a TCP port", port);
  if (!leader_buf || leader_len == 0)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_save_opts_from_env: no buffer for the leader address");
  int n;
  if (explicit_leader && *explicit_leader)
    n = snprintf(leader_buf, leader_len, "%s", explicit_leader);
  else if (!addr || !*addr)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "%d nodes but MASTER_ADDR (or SHARDD_LEADER) is not set", nnodes);
  else if (strchr(addr, ':') && addr[0] != '[')
    n = snprintf(leader_buf, leader_len, "[%s]:%d", addr, port); /* an IPv6 literal */
  else
    n = snprintf(leader_buf, leader_len, "%s:%d", addr, port);
  if (n < 0 || (size_t)n >= leader_len)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "the leader address does not fit in %zu bytes", leader_len);
  o->leader = leader_buf;
  return 0;
}

SHARDD_EXPORT int shardd_begin(shardd_client *c, const shardd_save_opts *o) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!o || !o->save || !o->dir)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: opts, save and dir are required");
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: rank %d is outside world_size %d", o->rank,
                 o->world_size);
  json_t *req = json_pack("{s:s, s:s, s:s, s:i, s:i}", "op", "begin", "save", o->save, "dir", o->dir,
                          "rank", o->rank, "world_size", o->world_size);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: save or dir is not valid UTF-8");
  int rc = 0;
  if (o->max_shard_size) rc = set_u64(c, req, "max_shard_size", o->max_shard_size);
  if (!rc && o->prefix) {
    json_t *p = json_string(o->prefix);
    if (!p) rc = sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: prefix is not valid UTF-8");
    else json_object_set_new(req, "prefix", p);
  }
  if (!rc && o->nmetadata) {
    json_t *md = json_object();
    for (size_t i = 0; !rc && i < o->nmetadata; i++) {
      const char *k = o->metadata ? o->metadata[2 * i] : NULL;
      const char *v = o->metadata ? o->metadata[2 * i + 1] : NULL;
      json_t *jv = v ? json_string(v) : NULL;
      if (!k || !jv || json_object_set_new(md, k, jv) < 0)
        rc = sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT,
                   "begin: metadata pair %zu is NULL or not valid UTF-8", i);
    }
    json_object_set_new(req, "metadata", md);
  }
  if (!rc && o->overwrite) json_object_set_new(req, "overwrite", json_true());
  if (!rc && o->keep_last < 0) rc = sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "begin: keep_last is negative");
  if (!rc && o->keep_last > 0) json_object_set_new(req, "keep_last", json_integer(o->keep_last));
  /* 0 leaves the daemon's default; a negative deadline is sent as 0, "never". */
  if (!rc && o->join_timeout) json_object_set_new(req, "join_timeout",
                                               json_integer(o->join_timeout > 0 ? o->join_timeout : 0));
  if (!rc && o->idle_timeout) json_object_set_new(req, "idle_timeout",
                                               json_integer(o->idle_timeout > 0 ? o->idle_timeout : 0));
  if (!rc && o->total_parameters > 0) rc = set_u64(c, req, "total_parameters", (uint64_t)o->total_parameters);
  if (!rc && o->nnodes > 1) rc = begin_peers(c, req, o);
  if (rc) {
    json_decref(req);
    return rc;
  }
  /* A save id may be reused after the save ended; an old "released" must not
   * let the caller overwrite memory the new save still needs. */
  json_object_del(c->released, o->save);
  return sd_client_request(c, req, NULL);
}

/* Where a region put's bytes are: in place, copied from src first, or in
 * place later ("deferred", announced by shardd_ready or shardd_seal). */
typedef enum { PUT_IN_PLACE, PUT_COPY, PUT_DEFERRED } put_how;

/* Checks where a region put's nbytes are (copying src there first for PUT_COPY); *in_region is 0
 * for an empty slice given no arena, which names no bytes. */
static int arena_check(shardd_client *c, const shardd_tensor_desc *t, uint64_t nbytes, shardd_arena *a,
                       uint64_t offset, const void *src, size_t len, put_how copy, int *in_region) {
  *in_region = 0;
  /* An empty slice names no bytes: a rank holding nothing needs no arena. */
  if (!a && nbytes == 0 && !(copy == PUT_COPY && len)) return 0;
  if (!a || a->c != c)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': arena is NULL or belongs to another client",
                 t->name);
  if (offset > a->size || nbytes > a->size - offset)
    return sd_client_fail(c, SHARDD_E_OUT_OF_RANGE,
                 "tensor '%s': %" PRIu64 " bytes at offset %" PRIu64 " lie outside the %zu-byte arena",
                 t->name, nbytes, offset, a->size);
  if (copy == PUT_COPY) {
    if (len != nbytes)
      return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': got %zu bytes, the slice has %" PRIu64,
                   t->name, len, nbytes);
    if (len) memcpy((char *)a->base + offset, src, len);
  }
  *in_region = 1;
  return 0;
}

/* The put request of a slice in arena a at offset, checked on this side; *out is NULL on error. */
static int arena_request(shardd_client *c, const char *save, const shardd_tensor_desc *t, shardd_arena *a,
                         uint64_t offset, const void *src, size_t len, put_how copy, json_t **out) {
  json_t *req;
  uint64_t nbytes;
  int in_region = 0;
  *out = NULL;
  int rc = put_request(c, save, t, &req, &nbytes);
  if (!rc) rc = arena_check(c, t, nbytes, a, offset, src, len, copy, &in_region);
  if (rc) {
    json_decref(req);
    return rc;
  }
  if (in_region) {
    json_object_set_new(req, "region", json_integer(a->region));
    json_object_set_new(req, "offset", json_integer((json_int_t)offset));
    if (copy == PUT_DEFERRED) json_object_set_new(req, "deferred", json_true());
  }
  *out = req;
  return 0;
}

static int put_arena(shardd_client *c, const char *save, const shardd_tensor_desc *t, shardd_arena *a,
                     uint64_t offset, const void *src, size_t len, put_how copy) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  json_t *req;
  int rc = arena_request(c, save, t, a, offset, src, len, copy, &req);
  return rc ? rc : sd_client_request(c, req, NULL);
}

/* ------------------------------------------------------------------------ *
 * put_many: puts lines of many slices each
 * ------------------------------------------------------------------------ */
/* A puts line's size when the daemon's max_line allows it: big enough that a line's own costs
 * (a reply, a round trip hidden by the window) vanish beside its slices', small enough that the
 * daemon's loop turns quickly to its other clients. */
#define PUTS_LINE_BYTES (256u * 1024u)
#define PUTS_LINE_SLICES 2048u
/* puts lines sent ahead of their replies. */
#define PUTS_WINDOW 4

typedef struct {
  const char *save;
  const char *prefix;       /* every slice's file prefix; NULL: the save's */
  const shardd_tensor_desc *t;
  const uint64_t *offsets;
  const uint8_t *in_region; /* per slice, from arena_check */
  size_t n, next;           /* slices; the first not yet in a line */
  size_t *first;            /* the first slice of each line sent, by line number */
  shardd_arena *a;
  int deferred;
  size_t line_bytes, line_slices;
} puts_lines;

static void put_dims(sd_buf *b, const char *key, int ndim, const uint64_t *v) {
  sd_buf_puts(b, key);
  sd_buf_putc(b, '[');
  for (int i = 0; i < ndim; i++) {
    if (i) sd_buf_putc(b, ',');
    sd_buf_put_u64(b, v[i]);
  }
  sd_buf_putc(b, ']');
}

/* One slice's object, the fields of a put but 'save'. */
static void put_slice(sd_buf *b, const puts_lines *l, size_t i) {
  const shardd_tensor_desc *t = &l->t[i];
  sd_buf_puts(b, "{\"name\":");
  sd_buf_json_str(b, t->name, strlen(t->name));
  sd_buf_puts(b, ",\"dtype\":");
  sd_buf_json_str(b, t->dtype, strlen(t->dtype));
  put_dims(b, ",\"shape\":", t->ndim, t->shape);
  if (t->start && t->ndim > 0) {
    put_dims(b, ",\"start\":", t->ndim, t->start);
    put_dims(b, ",\"count\":", t->ndim, t->count);
  }
  if (t->index >= 0) {
    sd_buf_puts(b, ",\"index\":");
    sd_buf_put_u64(b, (uint64_t)t->index);
  }
  if (l->prefix) {
    sd_buf_puts(b, ",\"prefix\":");
    sd_buf_json_str(b, l->prefix, strlen(l->prefix));
  }
  if (l->in_region[i]) {
    sd_buf_puts(b, ",\"region\":");
    sd_buf_put_u64(b, (uint64_t)l->a->region);
    sd_buf_puts(b, ",\"offset\":");
    sd_buf_put_u64(b, l->offsets[i]);
    if (l->deferred) sd_buf_puts(b, ",\"deferred\":true");
  }
  sd_buf_putc(b, '}');
}

/* The next puts line: as many of the slices left as fit the line's budget (one at least). */
static int puts_line(shardd_client *c, void *ctx, size_t k, json_int_t id, sd_buf *out) {
  (void)c;
  puts_lines *l = ctx;
  if (l->next >= l->n) return 1;
  l->first[k] = l->next;
  sd_buf_puts(out, "{\"op\":\"puts\",\"id\":");
  sd_buf_put_u64(out, (uint64_t)id);
  sd_buf_puts(out, ",\"save\":");
  sd_buf_json_str(out, l->save, strlen(l->save));
  sd_buf_puts(out, ",\"slices\":[");
  for (size_t taken = 0; l->next < l->n && taken < l->line_slices; taken++) {
    size_t before = out->len;
    if (taken) sd_buf_putc(out, ',');
    put_slice(out, l, l->next);
    if (taken && out->len + 3 > l->line_bytes) { /* over: it starts the next line */
      out->len = before;
      break;
    }
    l->next++;
  }
  sd_buf_puts(out, "]}\n");
  return 0;
}

/* Every slice checked on this side, so that a local refusal sends nothing. */
static int puts_check(shardd_client *c, puts_lines *l, uint8_t *in_region, size_t *failed) {
  if (!sd_utf8_valid(l->save, strlen(l->save), NULL))
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put_many: save id is not valid UTF-8");
  sd_error err = {0};
  if (l->prefix && sd_prefix_check(l->prefix, &err)) return sd_client_fail(c, err.code, "put_many: %s", err.msg);
  for (size_t i = 0; i < l->n; i++) {
    uint64_t nbytes = 0;
    int sliced = 0, in = 0, rc = desc_check(c, l->save, &l->t[i], &nbytes, &sliced);
    if (!rc && !sd_utf8_valid(l->t[i].name, strlen(l->t[i].name), NULL))
      rc = sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': name is not valid UTF-8", l->t[i].name);
    if (!rc && l->t[i].index > (int64_t)SD_MSG_INT_MAX)
      rc = sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': index %" PRId64 " is too large", l->t[i].name,
                          l->t[i].index);
    if (!rc)
      rc = arena_check(c, &l->t[i], nbytes, l->a, l->offsets[i], NULL, 0,
                       l->deferred ? PUT_DEFERRED : PUT_IN_PLACE, &in);
    if (rc) {
      *failed = i;
      return rc;
    }
    in_region[i] = (uint8_t)in;
  }
  return 0;
}

/* Older daemons (no max_puts in their hello): one put line per slice, pipelined. */
static int put_many_singly(shardd_client *c, const char *save, const char *prefix, const shardd_tensor_desc *t,
                           const uint64_t *offsets, size_t n, shardd_arena *a, int deferred, size_t *failed) {
  json_t **reqs = calloc(n ? n : 1, sizeof *reqs);
  if (!reqs) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "put_many: cannot hold %zu requests", n);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    rc = arena_request(c, save, &t[i], a, offsets[i], NULL, 0, deferred ? PUT_DEFERRED : PUT_IN_PLACE, &reqs[i]);
    if (!rc && prefix) json_object_set_new(reqs[i], "prefix", json_string(prefix));
  }
  if (!rc) rc = sd_client_request_many(c, reqs, n, failed);
  else for (size_t k = 0; k < n; k++) json_decref(reqs[k]);
  free(reqs);
  return rc;
}

SHARDD_EXPORT int shardd_put_many(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                  const uint64_t *offsets, size_t n, shardd_arena *a, int deferred,
                                  size_t *failed) {
  return shardd_put_many_prefix(c, save, NULL, t, offsets, n, a, deferred, failed);
}

SHARDD_EXPORT int shardd_put_many_prefix(shardd_client *c, const char *save, const char *prefix,
                                         const shardd_tensor_desc *t, const uint64_t *offsets, size_t n,
                                         shardd_arena *a, int deferred, size_t *failed) {
  size_t failed_at = 0;
  if (failed) *failed = 0;
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put: save id is NULL");
  if (n && (!t || !offsets)) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put_many: tensors or offsets is NULL");
  if (n == 0) return sd_client_ok(c);
  puts_lines l = {.save = save, .prefix = prefix, .t = t, .offsets = offsets, .n = n, .a = a, .deferred = deferred};
  uint8_t *in_region = malloc(n);
  /* Lines hold a slice each at least: n lines at most. */
  l.first = malloc(n * sizeof *l.first);
  int rc = !in_region || !l.first ? sd_client_fail(c, SHARDD_E_NO_MEMORY, "put_many: cannot hold %zu slices", n)
                                  : puts_check(c, &l, in_region, &failed_at);
  if (!rc && !c->max_puts) {
    rc = put_many_singly(c, save, prefix, t, offsets, n, a, deferred, &failed_at);
  } else if (!rc) {
    l.in_region = in_region;
    l.line_bytes = c->max_line && c->max_line < PUTS_LINE_BYTES ? (size_t)c->max_line : PUTS_LINE_BYTES;
    l.line_slices = c->max_puts < PUTS_LINE_SLICES ? (size_t)c->max_puts : PUTS_LINE_SLICES;
    size_t line = 0;
    int64_t accepted = -1;
    rc = sd_client_pipeline(c, PUTS_WINDOW, puts_line, &l, &line, &accepted);
    /* The refused slice: the failing line's first plus the slices the daemon took from it. */
    if (rc) failed_at = l.first[line] + (accepted > 0 ? (size_t)accepted : 0);
  }
  if (failed) *failed = failed_at;
  free(in_region);
  free(l.first);
  return rc;
}

SHARDD_EXPORT int shardd_put(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                             shardd_arena *a, uint64_t offset) {
  return put_arena(c, save, t, a, offset, NULL, 0, PUT_IN_PLACE);
}

SHARDD_EXPORT int shardd_put_deferred(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                      shardd_arena *a, uint64_t offset) {
  return put_arena(c, save, t, a, offset, NULL, 0, PUT_DEFERRED);
}

SHARDD_EXPORT int shardd_put_copy(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                  shardd_arena *a, uint64_t offset, const void *src, size_t len) {
  if (c && len && !src) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "put_copy: src is NULL");
  return put_arena(c, save, t, a, offset, src, len, PUT_COPY);
}

/* Sets key to the base64 text of data. */
static int set_b64(shardd_client *c, json_t *req, const char *key, const void *data, size_t len) {
  size_t elen = sd_b64_encoded_len(len);
  char *b = elen < SIZE_MAX ? malloc(elen + 1) : NULL;
  if (!b) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode %zu bytes as base64", len);
  sd_b64_encode(data, len, b);
  /* Base64 is ASCII, so jansson's UTF-8 scan of a possibly large string is wasted work. */
  json_t *s = json_stringn_nocheck(b, elen);
  free(b);
  if (!s) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode %zu bytes as base64", len);
  json_object_set_new(req, key, s);
  return 0;
}

SHARDD_EXPORT int shardd_put_inline(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                    const void *data, size_t len) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  json_t *req;
  uint64_t nbytes;
  int rc = put_request(c, save, t, &req, &nbytes);
  if (rc) return rc;
  if (len != nbytes || (len && !data)) {
    json_decref(req);
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': got %zu bytes, the slice has %" PRIu64,
                 t->name, data || !len ? len : 0, nbytes);
  }
  rc = set_b64(c, req, "data", data, len);
  if (rc) {
    json_decref(req);
    return rc;
  }
  return sd_client_request(c, req, NULL);
}

static int send_file(shardd_client *c, const char *save, const char *path, const void *data, size_t len, int part) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save || !path || (len && !data))
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "file: save, path and data are required");
  json_t *req = json_pack("{s:s, s:s, s:s}", "op", "file", "save", save, "path", path);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "file '%s': save or path is not valid UTF-8", path);
  if (part) json_object_set_new(req, "part", json_true());
  int rc = set_b64(c, req, "data", data, len);
  if (rc) {
    json_decref(req);
    return rc;
  }
  return sd_client_request(c, req, NULL);
}

SHARDD_EXPORT int shardd_file(shardd_client *c, const char *save, const char *path, const void *data,
                              size_t len) {
  return send_file(c, save, path, data, len, 0);
}

SHARDD_EXPORT int shardd_file_part(shardd_client *c, const char *save, const char *path, const void *data,
                                   size_t len) {
  return send_file(c, save, path, data, len, 1);
}

static int simple_op(shardd_client *c, const char *op, const char *save) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "%s: save id is NULL", op);
  json_t *req = json_pack("{s:s, s:s}", "op", op, "save", save);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "%s: save id is not valid UTF-8", op);
  return sd_client_request(c, req, NULL);
}

SHARDD_EXPORT int shardd_seal(shardd_client *c, const char *save) { return simple_op(c, "seal", save); }
SHARDD_EXPORT int shardd_declared(shardd_client *c, const char *save) { return simple_op(c, "declared", save); }

SHARDD_EXPORT int shardd_ready(shardd_client *c, const char *save, shardd_arena *a, uint64_t upto) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "ready: save id is NULL");
  if (!a || a->c != c) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "ready: arena is NULL or belongs to another client");
  if (upto > a->size)
    return sd_client_fail(c, SHARDD_E_OUT_OF_RANGE, "ready: %" PRIu64 " is past the end of the %zu-byte arena", upto, a->size);
  json_t *req = json_pack("{s:s, s:s, s:I, s:I}", "op", "ready", "save", save, "region", (json_int_t)a->region,
                          "upto", (json_int_t)upto);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "ready: save id is not valid UTF-8");
  return sd_client_request(c, req, NULL);
}
SHARDD_EXPORT int shardd_abort(shardd_client *c, const char *save) { return simple_op(c, "abort", save); }

SHARDD_EXPORT int shardd_wait_or_abort(shardd_client *c, const char *save, int timeout_ms, shardd_result *out) {
  int rc = shardd_wait(c, save, timeout_ms, out);
  if (rc != SHARDD_E_TIMEOUT) return rc;
  char why[sizeof c->err];
  snprintf(why, sizeof why, "%s", c->err);
  /* Abort, then take the pending wait's answer: only then is the save over
   * in the daemon (the answer is "aborted", or the commit that won the race). */
  int arc = shardd_abort(c, save);
  if (arc != 0 && arc != SHARDD_E_BAD_STATE && arc != SHARDD_E_NO_SUCH_SAVE) return arc;
  rc = shardd_wait(c, save, c->timeout_ms, out);
  if (rc == 0) return 0;
  if (rc != SHARDD_E_ABORTED) return rc;
  return sd_client_fail(c, SHARDD_E_TIMEOUT, "%s; aborted it (nothing was published)", why);
}
