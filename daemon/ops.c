/* Protocol v1 request handlers: parse and check each field, then hand off to regions and saves. */
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "log.h"
#include "pathsafe.h"
#include "retention.h"
#include "save.h"
#include "sd_artifact.h"
#include "sd_msg.h"
#include "sd_puts_scan.h"
#include "sd_request.h"
#include "session.h"

/* A handler returns its reply, or NULL when it answered on its own (seal)
 * or will answer later (wait). */
typedef json_t *(*op_fn)(sd_session *s, json_t *req, json_t *id);

static json_t *fail(json_t *id, const sd_error *err) { return sd_msg_error_from(id, err); }
/* An error of a request on a save names the save's dir beside its id (sd_save_err_dir), unless
 * the request ended the save, whose own failure already did. */
static json_t *fail_in(sd_session *s, json_t *id, const sd_save *save, sd_error *err) {
  if (save && sd_save_alive(s->d, save)) sd_save_err_dir(save, err);
  return fail(id, err);
}

/* ------------------------------------------------------------------------ *
 * Finding the save a request names
 * ------------------------------------------------------------------------ */
/* Ops on a finished save get its outcome rather than a puzzling no_such_save. */
static int find_save_id(sd_session *s, const char *id, sd_save **out, sd_error *err) {
  *out = sd_save_find(s->d, id);
  if (*out) return 0;
  const sd_save_result *r = sd_save_history_find(s->d, id);
  if (r && r->err.code) {
    *err = r->err;
    return err->code;
  }
  if (r) return sd_fail(err, SHARDD_E_BAD_STATE, "save '%.200s' has already committed", id);
  return sd_fail(err, SHARDD_E_NO_SUCH_SAVE, "no save '%.200s' in flight", id);
}

static int find_save(sd_session *s, const json_t *req, sd_save **out, const char **idp, sd_error *err) {
  const char *id = NULL;
  int rc = sd_msg_str(req, "save", 1, &id, NULL, err);
  if (rc < 0) return rc;
  if (idp) *idp = id;
  return find_save_id(s, id, out, err);
}

/* The save, and the rank this connection plays in it. */
static int rank_in(sd_session *s, sd_save **save, uint32_t *rank, sd_error *err) {
  int r = sd_session_rank_of(s, *save);
  if (r < 0)
    return sd_fail(err, SHARDD_E_BAD_STATE, "this connection has not begun save '%s'", (*save)->id);
  if ((*save)->ranks[r].state == SD_RANK_SEALED)
    return sd_fail(err, SHARDD_E_BAD_STATE, "rank %d has already sealed save '%s'", r, (*save)->id);
  *rank = (uint32_t)r;
  return 0;
}

static int find_rank(sd_session *s, const json_t *req, sd_save **save, uint32_t *rank, sd_error *err) {
  return find_save(s, req, save, NULL, err) || rank_in(s, save, rank, err);
}

/* ------------------------------------------------------------------------ *
 * hello, attach, detach
 * ------------------------------------------------------------------------ */
static json_t *op_hello(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  if (sd_req_hello(req, &err) != 0) return fail(id, &err);
  json_t *r = sd_msg_ok(id);
  json_object_set_new(r, "proto", json_integer(SHARDD_PROTO_VERSION));
  json_object_set_new(r, "server", json_pack("{s:s,s:s}", "name", "shardd", "version", SHARDD_VERSION_STRING));
  json_object_set_new(r, "node", sd_msg_string_lossy(s->d->node));
  /* What a client sizes its puts lines by: a longer line would cost it the connection. */
  json_object_set_new(r, "max_line", json_integer((json_int_t)s->d->cfg->max_line));
  json_object_set_new(r, "max_puts", json_integer(SD_PUTS_MAX));
  return r;
}

/* attach {"fd":true}: the descriptor that came with the line, a sealed memfd. */
static int attach_fd(sd_session *s, json_t *req, sd_region **r, sd_error *err) {
  if (json_object_get(req, "shm"))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "attach: give 'shm' or \"fd\":true, not both");
  if (s->line_fd == -1)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "attach: \"fd\":true but no descriptor came with this line (send it as SCM_RIGHTS in the "
                   "same sendmsg as the line)");
  if (s->line_fd < 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "attach: more than one descriptor came with this line (or one could not be received); "
                   "all were closed");
  int fd = s->line_fd;
  s->line_fd = -1;
  return sd_region_adopt(fd, r, err);
}

static void unpin_region(void *writer, int pin, uint64_t len) { sd_writer_unpin(writer, pin, len); }

/* The pin is in: saves planned from now on write the region as fixed buffers
 * (those planned before go on unpinned). The reference taken for the pin
 * kept the mapping; the region may have been detached meanwhile, and its
 * last reference then unpins it at once. */
static void region_pinned(void *ud, int pin) {
  sd_region *r = ud;
  r->pin = pin;
  sd_region_unref(r);
}

static json_t *op_attach(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  const char *name = NULL;
  json_t *fdv = json_object_get(req, "fd");
  if (fdv && !json_is_boolean(fdv)) {
    sd_fail(&err, SHARDD_E_INVALID_ARGUMENT, "field 'fd' must be a boolean");
    return fail(id, &err);
  }
  int by_fd = json_is_true(fdv);
  if (!by_fd && s->line_fd != -1) {
    sd_fail(&err, SHARDD_E_INVALID_ARGUMENT,
            "attach: a descriptor came with this line but it has no \"fd\":true; it was closed");
    return fail(id, &err);
  }
  if (!by_fd && sd_msg_str(req, "shm", 1, &name, NULL, &err) < 0) return fail(id, &err);
  if (s->regions.n >= s->d->cfg->max_regions) {
    sd_fail(&err, SHARDD_E_LIMIT, "this connection already has %zu regions attached (max_regions=%u)",
            s->regions.n, s->d->cfg->max_regions);
    return fail(id, &err);
  }
  sd_region *r = NULL;
  sd_region_peer peer = {.uid = s->uid, .gid = s->gid, .groups = s->groups, .ngroups = s->ngroups,
                         .trusted_gid = s->d->cfg->trusted_gid};
  if ((by_fd ? attach_fd(s, req, &r, &err) : sd_region_open(name, &peer, &r, &err)) != 0) return fail(id, &err);
  if (r->sealed && s->d->writer && !r->pin) {
    /* Once per attach, not per save: a trainer saves the same arena every N steps. Off the loop: pinning a
     * sparse segment allocates all of it, seconds that would stall every other client. */
    r->unpin = unpin_region;
    r->unpin_ctx = s->d->writer;
    sd_region_ref(r);
    if (sd_writer_pin_start(s->d->writer, (uint8_t *)r->base, r->size, region_pinned, r) != 0) sd_region_unref(r);
  }
  uint32_t rid = 0;
  if (sd_region_table_add(&s->regions, r, &rid, &err) != 0) {
    sd_region_unref(r);
    return fail(id, &err);
  }
  sd_log_debug("client %llu attached %s as region %u (%llu bytes)", (unsigned long long)s->id, r->name, rid,
               (unsigned long long)r->size);
  json_t *m = sd_msg_ok(id);
  json_object_set_new(m, "region", json_integer(rid));
  json_object_set_new(m, "size", json_integer((json_int_t)r->size));
  return m;
}

static json_t *op_detach(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  uint64_t rid = 0;
  if (sd_msg_u64(req, "region", 1, 0, &rid, &err) < 0) return fail(id, &err);
  /* Saves that named the region keep their own reference: only the
   * connection's handle goes away here. */
  if (sd_region_table_remove(&s->regions, rid, &err) != 0) return fail(id, &err);
  return sd_msg_ok(id);
}

/* ------------------------------------------------------------------------ *
 * begin
 * ------------------------------------------------------------------------ */
static json_t *op_begin(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_begin_args a = {0};
  sd_req_begin b = {0};
  json_t *reply = NULL;
  if (sd_req_begin_fields(req, &b, &err) || sd_cluster_parse_begin(req, &a, &err) != 0 ||
      sd_req_begin_check(req, &b, &err))
    goto out;
  a.save = b.save;
  a.dir = b.dir;
  a.prefix = b.prefix;
  a.max_shard_size = b.max_shard_size;
  a.overwrite = b.overwrite;
  a.keep_last = (uint32_t)b.keep_last;
  a.total_parameters = b.has_total_parameters > 0 ? (int64_t)b.total_parameters : -1;
  a.rank = (uint32_t)b.rank;
  a.world_size = (uint32_t)b.world_size;
  a.metadata = b.metadata;
  a.nmetadata = b.nmetadata;
  a.has_join_timeout = b.has_join_timeout > 0;
  a.has_idle_timeout = b.has_idle_timeout > 0;
  a.join_timeout = (uint32_t)b.join_timeout;
  a.idle_timeout = (uint32_t)b.idle_timeout;
  long trusted_gid = s->d->cfg ? s->d->cfg->trusted_gid : -1;
  sd_joiner who = {.owner = s, .uid = s->uid, .trusted = sd_session_in_group(s, trusted_gid)};
  if (sd_save_begin(s->d, &who, &a, &err) != 0) goto out;
  sd_log_debug("client %llu began save '%s' as rank %u of %u", (unsigned long long)s->id, a.save, a.rank,
               a.world_size);
  reply = sd_msg_ok(id);
out:
  free(b.metadata);
  return reply ? reply : fail(id, &err);
}

/* ------------------------------------------------------------------------ *
 * put
 * ------------------------------------------------------------------------ */
/* A tensor description and slice box read, as a put's arguments. */
static void put_tensor(const sd_req_tensor *t, sd_put_args *a) {
  a->name = t->name;
  a->dtype = t->dtype;
  a->ndim = t->ndim;
  memcpy(a->shape, t->shape, sizeof a->shape);
  memcpy(a->start, t->start, sizeof a->start);
  memcpy(a->count, t->count, sizeof a->count);
  a->index = t->index;
  a->prefix = t->prefix;
  a->len = t->len;
}

/* Reads the tensor description and the slice box; computes the byte size. */
static int parse_tensor(const json_t *req, unsigned max_name, unsigned max_dims, sd_put_args *a, sd_error *err) {
  sd_req_tensor t;
  if (sd_req_tensor_parse(req, max_name, max_dims, &t, err) != 0) return err->code;
  put_tensor(&t, a);
  return 0;
}

/* Where the bytes are: a region of this connection, or inline base64. */
static int use_source(sd_session *s, const sd_req_source *src, sd_put_args *a, sd_error *err) {
  a->data = src->data;
  a->offset = src->offset;
  a->deferred = src->deferred;
  if (!src->has_region) return 0;
  uint64_t rid = src->region;
  a->region = sd_region_table_get(&s->regions, rid);
  if (!a->region)
    return sd_fail(err, SHARDD_E_NO_SUCH_REGION, "tensor '%s': no region %llu on this connection", a->name,
                   (unsigned long long)rid);
  if (a->offset > a->region->size || a->len > a->region->size - a->offset)
    return sd_fail(err, SHARDD_E_OUT_OF_RANGE,
                   "tensor '%s': bytes [%llu, %llu) lie outside region %llu ('%s', %llu bytes)", a->name,
                   (unsigned long long)a->offset, (unsigned long long)(a->offset + a->len),
                   (unsigned long long)rid, a->region->name, (unsigned long long)a->region->size);
  if (a->len == 0) {
    /* Checked like any put, but nothing to read or to wait for: the save
     * holds no reference to the region for it and never counts it pending. */
    a->region = NULL;
    a->deferred = 0;
  }
  return 0;
}

static int parse_source(sd_session *s, const json_t *req, sd_put_args *a, sd_error *err) {
  sd_req_source src;
  if (sd_req_source_parse(req, a->name, a->len, &src, err) != 0) return err->code;
  return use_source(s, &src, a, err);
}

static json_t *op_put(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  sd_put_args a;
  memset(&a, 0, sizeof a);
  if (find_rank(s, req, &save, &rank, &err) || parse_tensor(req, s->d->cfg->max_name_len, s->d->cfg->max_dims, &a, &err) || parse_source(s, req, &a, &err)) {
    free(a.data);
    return fail_in(s, id, save, &err);
  }
  uint64_t len = a.len;
  int rc = sd_save_put(save, rank, &a, &err); /* may end (and free) the save */
  free(a.data);
  if (rc) return fail_in(s, id, save, &err);
  s->d->counters.puts++;
  s->d->counters.bytes_put += len;
  json_t *m = sd_msg_ok(id);
  json_object_set_new(m, "bytes", json_integer((json_int_t)len));
  return m;
}

/* The slices of a puts line: its JSON array, or the scan of the line (sd_puts_scan.h). */
typedef struct {
  const json_t *json;
  const sd_puts_scan *scan;
} puts_slices;

/* The name of a slice of a puts line, for its errors, once it is a name a put accepts. */
static const char *slice_name(const puts_slices *ps, size_t k) {
  if (ps->scan) return ps->scan->slices[k].t.name; /* the scan took only such names */
  const char *name = json_string_value(json_object_get(json_array_get(ps->json, k), "name"));
  sd_error ignored = {0};
  return name && strlen(name) <= SD_NAME_MAX && sd_name_check(name, strlen(name), &ignored) == 0 ? name : NULL;
}

/* Slice k's put arguments. */
static int slice_args(sd_session *s, const puts_slices *ps, size_t k, sd_put_args *a, sd_error *err) {
  if (ps->scan) {
    put_tensor(&ps->scan->slices[k].t, a);
    return use_source(s, &ps->scan->slices[k].src, a, err);
  }
  const json_t *slice = json_array_get(ps->json, k);
  return parse_tensor(slice, s->d->cfg->max_name_len, s->d->cfg->max_dims, a, err) || parse_source(s, slice, a, err);
}

static json_t *puts_reply(sd_session *s, json_t *id, const sd_save *save, sd_error *err, size_t accepted,
                          uint64_t bytes) {
  json_t *m = err ? fail_in(s, id, save, err) : sd_msg_ok(id);
  json_object_set_new(m, "accepted", json_integer((json_int_t)accepted));
  if (!err) json_object_set_new(m, "bytes", json_integer((json_int_t)bytes));
  return m;
}

/* puts: many slices in one line, read, checked and recorded in order, as that many put lines
 * would be; the first one refused (malformed, or by the save: a limit, a mismatch) stops the
 * rest, and "accepted" says how many went in before it. */
static json_t *puts_run(sd_session *s, json_t *id, sd_save *save, uint32_t rank, const puts_slices *ps, size_t n) {
  sd_error err = {0};
  size_t accepted = 0;
  uint64_t bytes = 0;
  for (; accepted < n; accepted++) {
    sd_put_args a;
    memset(&a, 0, sizeof a);
    int rc = slice_args(s, ps, accepted, &a, &err) || sd_save_put(save, rank, &a, &err); /* may end (and free) the save */
    free(a.data);
    if (rc) {
      sd_req_in_batch(&err, accepted, slice_name(ps, accepted));
      break;
    }
    bytes += a.len;
  }
  s->d->counters.puts += accepted;
  s->d->counters.bytes_put += bytes;
  return puts_reply(s, id, save, err.code ? &err : NULL, accepted, bytes);
}

static json_t *op_puts(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  puts_slices ps = {NULL, NULL};
  size_t n = 0;
  if (find_rank(s, req, &save, &rank, &err) || sd_req_puts_slices(req, &ps.json, &n, &err))
    return puts_reply(s, id, save, &err, 0, 0);
  return puts_run(s, id, save, rank, &ps, n);
}

/* The same for a line the scan read: its every field known good but what needs the daemon's
 * state (the save, the regions) and its configured limits, which the caller checked. */
static json_t *op_puts_scanned(sd_session *s, const sd_puts_scan *scan, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  if (find_save_id(s, scan->save, &save, &err) || rank_in(s, &save, &rank, &err))
    return puts_reply(s, id, save, &err, 0, 0);
  puts_slices ps = {NULL, scan};
  return puts_run(s, id, save, rank, &ps, scan->n);
}

/* A scanned puts line is handled from its scan when it came with no descriptor and keeps to the
 * daemon's configured limits (the scan knows only the largest); else it is read as JSON, which
 * says what is wrong. */
static int scan_fits(sd_session *s, const sd_puts_scan *scan) {
  return s->line_fd == -1 && sd_puts_scan_fits(scan, s->d->cfg->max_name_len, s->d->cfg->max_dims);
}

/* ------------------------------------------------------------------------ *
 * file, seal, wait, abort
 * ------------------------------------------------------------------------ */
static json_t *op_file(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  const char *path = NULL, *data = NULL;
  size_t dlen = 0, got = 0;
  uint8_t *bytes = NULL;
  int part = 0;
  if (find_rank(s, req, &save, &rank, &err) || sd_msg_str(req, "path", 1, &path, NULL, &err) < 0 ||
      sd_path_check_name(path, &err) || sd_artifact_name_check(save->prefix, path, &err) ||
      sd_msg_str(req, "data", 1, &data, &dlen, &err) < 0 || sd_msg_bool(req, "part", 0, &part, &err) < 0)
    return fail_in(s, id, save, &err);
  if (sd_req_data(data, dlen, "file", path, &bytes, &got, &err) != 0) return fail_in(s, id, save, &err);
  if (sd_save_file(save, rank, path, bytes, got, part, &err) != 0) return fail_in(s, id, save, &err);
  json_t *m = sd_msg_ok(id);
  json_object_set_new(m, "bytes", json_integer((json_int_t)got));
  return m;
}

static json_t *op_seal(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  if (find_rank(s, req, &save, &rank, &err) || sd_save_seal(save, rank, &err)) return fail_in(s, id, save, &err);
  /* Reply first: planning may end the save at once, and its wait answers
   * must not overtake this reply. */
  sd_session_send(s, sd_msg_ok(id));
  sd_session_flush(s);
  sd_save_maybe_start(save);
  return NULL;
}

/* ------------------------------------------------------------------------ *
 * declared, ready: streaming a save while its bytes are still being copied
 * ------------------------------------------------------------------------ */
static json_t *op_declared(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  if (find_rank(s, req, &save, &rank, &err) || sd_save_declared(save, rank, &err)) return fail_in(s, id, save, &err);
  /* Reply first, as for seal: planning may end the save at once. */
  sd_session_send(s, sd_msg_ok(id));
  sd_session_flush(s);
  sd_save_maybe_start(save);
  return NULL;
}

static json_t *op_ready(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  uint32_t rank = 0;
  uint64_t rid = 0, upto = 0;
  if (find_rank(s, req, &save, &rank, &err) || sd_msg_u64(req, "region", 1, 0, &rid, &err) < 0 ||
      sd_msg_u64(req, "upto", 1, 0, &upto, &err) < 0)
    return fail_in(s, id, save, &err);
  sd_region *r = sd_region_table_get(&s->regions, rid);
  if (!r) {
    sd_fail(&err, SHARDD_E_NO_SUCH_REGION, "ready: no region %llu on this connection", (unsigned long long)rid);
    return fail_in(s, id, save, &err);
  }
  if (upto > r->size) {
    sd_fail(&err, SHARDD_E_OUT_OF_RANGE, "ready: 'upto' %llu is past the end of region %llu ('%s', %llu bytes)",
            (unsigned long long)upto, (unsigned long long)rid, r->name, (unsigned long long)r->size);
    return fail_in(s, id, save, &err);
  }
  if (sd_save_ready(save, rank, r, upto, &err)) return fail_in(s, id, save, &err);
  return sd_msg_ok(id);
}

static json_t *op_wait(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  const char *sid = NULL;
  if (sd_msg_str(req, "save", 1, &sid, NULL, &err) < 0) return fail(id, &err);
  sd_save *save = sd_save_find(s->d, sid);
  if (save) {
    if (sd_save_add_waiter(save, s, id, &err) != 0) return fail(id, &err);
    s->pending_waits++;
    return NULL;
  }
  const sd_save_result *r = sd_save_history_find(s->d, sid);
  if (r) return sd_save_result_reply(r, id);
  sd_fail(&err, SHARDD_E_NO_SUCH_SAVE, "no save '%.200s' in flight or recently finished", sid);
  return fail(id, &err);
}

static json_t *op_abort(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  sd_save *save = NULL;
  const char *sid = NULL;
  int rc = find_save(s, req, &save, &sid, &err);
  if (rc == 0 && s->uid != save->owner_uid) {
    sd_fail(&err, SHARDD_E_PERMISSION, "save '%s' belongs to uid %u; uid %u may not abort it", save->id,
            (unsigned)save->owner_uid, (unsigned)s->uid);
    return fail_in(s, id, save, &err);
  }
  if (rc == 0) {
    int r = sd_session_rank_of(s, save);
    if (r >= 0)
      sd_save_fail(save, SHARDD_E_ABORTED, "save '%s' aborted by rank %d", save->id, r);
    else
      sd_save_fail(save, SHARDD_E_ABORTED, "save '%s' aborted by a client (pid %d)", save->id, (int)s->pid);
    return sd_msg_ok(id);
  }
  /* Aborting what already failed is a no-op; a commit cannot be undone. */
  const sd_save_result *h = sid ? sd_save_history_find(s->d, sid) : NULL;
  if (h && h->err.code) return sd_msg_ok(id);
  return fail(id, &err);
}

/* ------------------------------------------------------------------------ *
 * delete: a checkpoint its caller committed
 * ------------------------------------------------------------------------ */
/* dir relative to the root, or absolute beneath it (as `wait` reports it): the relative part. */
static int delete_rel(const sd_daemon *d, const char *dir, const char **rel, sd_error *err) {
  *rel = dir;
  if (dir[0] != '/') return sd_path_check_rel(dir, err);
  const char *root = d->cfg->root;
  size_t n = strlen(root);
  while (n > 1 && root[n - 1] == '/') n--;
  if (strncmp(dir, root, n) != 0 || dir[n] != '/')
    return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%.200s' is outside the root %s", dir, root);
  while (dir[n] == '/') n++;
  *rel = dir + n;
  return sd_path_check_rel(*rel, err);
}

static json_t *op_delete(sd_session *s, json_t *req, json_t *id) {
  sd_error err = {0};
  const char *dir = NULL, *rel = NULL;
  if (sd_msg_str(req, "dir", 1, &dir, NULL, &err) < 0 || delete_rel(s->d, dir, &rel, &err)) return fail(id, &err);
  for (sd_save *v = s->d->saves; v; v = v->next)
    if (strcmp(v->dir, rel) == 0) {
      sd_fail(&err, SHARDD_E_CONFLICT, "'%s' is the destination of save '%s', still in flight", rel, v->id);
      return fail(id, &err);
    }
  if (sd_retention_delete(s->d->loop, s->d->root_fd, rel, s->uid, &err) != 0) return fail(id, &err);
  sd_log_info("uid %u deleted '%s'", (unsigned)s->uid, rel);
  json_t *m = sd_msg_ok(id);
  json_object_set_new(m, "dir", sd_msg_string_lossy(rel));
  return m;
}

/* ------------------------------------------------------------------------ *
 * status
 * ------------------------------------------------------------------------ */
void sd_ops_status_fill(sd_daemon *d, json_t *m, int with_metrics) {
  json_t *saves = json_array();
  for (sd_save *v = d->saves; v; v = v->next) {
    json_t *o = json_object();
    json_object_set_new(o, "save", sd_msg_string_lossy(v->id));
    json_object_set_new(o, "dir", sd_msg_string_lossy(v->dir));
    json_object_set_new(o, "state", json_string(sd_save_state_name(v)));
    json_object_set_new(o, "world_size", json_integer(v->world_size));
    json_object_set_new(o, "ranks_begun", json_integer(v->nbegun));
    json_object_set_new(o, "ranks_sealed", json_integer(v->nsealed));
    json_object_set_new(o, "ranks_declared", json_integer(v->ndeclared));
    json_object_set_new(o, "tensors", json_integer((json_int_t)v->ntensors));
    json_object_set_new(o, "files", json_integer((json_int_t)v->nfiles));
    json_object_set_new(o, "bytes_planned", json_integer((json_int_t)sd_save_bytes_planned(v)));
    json_object_set_new(o, "bytes_written", json_integer((json_int_t)sd_save_bytes_written(v)));
    json_object_set_new(o, "bytes_zero_copy", json_integer((json_int_t)sd_save_bytes_zero_copy(v)));
    /* deprecated spelling of bytes_zero_copy, kept one release for scripts that read it */
    json_object_set_new(o, "bytes_direct", json_integer((json_int_t)sd_save_bytes_zero_copy(v)));
    json_object_set_new(o, "bytes_gathered", json_integer((json_int_t)sd_save_bytes_gathered(v)));
    json_object_set_new(o, "bytes_copied", json_integer((json_int_t)(sd_save_bytes_written(v) - sd_save_bytes_zero_copy(v) -
                                                                     sd_save_bytes_gathered(v))));
    if (v->cl) sd_cluster_status_save(v, o);
    json_array_append_new(saves, o);
  }
  json_object_set_new(m, "saves", saves);
  json_object_set_new(m, "clients", json_integer((json_int_t)d->nsessions));
  json_object_set_new(m, "regions", json_integer((json_int_t)sd_region_live()));
  json_object_set_new(m, "totals", json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "saves_committed",
                                             (json_int_t)d->counters.saves_committed, "saves_failed",
                                             (json_int_t)d->counters.saves_failed, "bytes_written",
                                             (json_int_t)d->counters.bytes_committed, "bytes_zero_copy",
                                             (json_int_t)d->counters.bytes_zero_copy, "bytes_direct",
                                             (json_int_t)d->counters.bytes_zero_copy, "bytes_gathered",
                                             (json_int_t)d->counters.bytes_gathered, "bytes_copied",
                                             (json_int_t)d->counters.bytes_copied));
  sd_cluster_status(d, m);
  if (with_metrics) json_object_set_new(m, "metrics", d->metrics_view ? d->metrics_view(d) : json_object());
}

static json_t *op_status(sd_session *s, json_t *req, json_t *id) {
  json_t *m = sd_msg_ok(id);
  /* Opt-in ("metrics": true) so a plain status stays short for people typing. */
  sd_ops_status_fill(s->d, m, json_is_true(json_object_get(req, "metrics")));
  return m;
}

/* ------------------------------------------------------------------------ *
 * Dispatch
 * ------------------------------------------------------------------------ */
static const struct {
  const char *name;
  op_fn fn;
} ops[] = {
    {"hello", op_hello}, {"attach", op_attach}, {"detach", op_detach}, {"begin", op_begin},
    {"put", op_put},     {"file", op_file},     {"seal", op_seal},     {"wait", op_wait},
    {"abort", op_abort}, {"status", op_status}, {"declared", op_declared}, {"ready", op_ready},
    {"delete", op_delete}, {"puts", op_puts},
};

void sd_ops_dispatch(sd_session *s, const char *line, size_t len) {
  sd_error err = {0};
  json_t *req = s->line_req; /* a long line, parsed off the loop */
  s->line_req = NULL;
  const sd_puts_scan *scan = s->line_puts; /* or scanned off the loop; the session frees it */
  sd_puts_scan here;
  if (!req && !scan && sd_puts_scan_line(line, len, &here)) scan = &here;
  if (scan && scan_fits(s, scan)) {
    json_t *id = json_integer((json_int_t)scan->id);
    json_t *reply = op_puts_scanned(s, scan, id);
    if (reply) sd_session_send(s, reply);
    json_decref(id);
    if (scan == &here) sd_puts_scan_free(&here);
    return;
  }
  if (scan == &here) sd_puts_scan_free(&here);
  else if (scan) line = scan->line, len = scan->len; /* the line the scan kept */
  if (!req && sd_msg_parse(line, len, &req, &err) != 0) {
    sd_session_send(s, sd_msg_error_from(NULL, &err));
    return;
  }
  json_t *id = json_object_get(req, "id");
  const char *op = NULL;
  if (sd_msg_op(req, &op, &err) != 0) {
    sd_session_send(s, sd_msg_error_from(id, &err));
    json_decref(req);
    return;
  }
  op_fn fn = NULL;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0] && !fn; i++)
    if (strcmp(ops[i].name, op) == 0) fn = ops[i].fn;
  if (!fn) {
    sd_fail(&err, SHARDD_E_UNKNOWN_OP, "unknown op '%.100s'", op);
    sd_session_send(s, sd_msg_error_from(id, &err));
    json_decref(req);
    return;
  }
  /* Only attach takes a descriptor; one sent with anything else is refused
   * (the session closes it). */
  if (s->line_fd != -1 && fn != op_attach) {
    sd_fail(&err, SHARDD_E_INVALID_ARGUMENT, "op '%s' takes no descriptor; the one sent with it was closed", op);
    sd_session_send(s, sd_msg_error_from(id, &err));
    json_decref(req);
    return;
  }
  json_t *reply = fn(s, req, id);
  if (reply) sd_session_send(s, reply);
  json_decref(req);
}
