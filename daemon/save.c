/* The save state machine: ranks join and describe slices; the last seal plans and publishes; every wait gets the end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "save_guard.h"
#include "planner.h"
#include "save.h"
#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * Lookup
 * ------------------------------------------------------------------------ */
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

sd_save *sd_save_find(sd_daemon *d, const char *id) {
  for (sd_save *s = d->saves; s; s = s->next)
    if (strcmp(s->id, id) == 0) return s;
  return NULL;
}

static int save_alive(sd_daemon *d, const sd_save *save) {
  for (sd_save *s = d->saves; s; s = s->next)
    if (s == save) return 1;
  return 0;
}

const sd_save_result *sd_save_history_find(sd_daemon *d, const char *id) {
  for (size_t k = 0; k < d->hist_len; k++) {
    size_t i = (d->hist_head + d->hist_cap - 1 - k) % d->hist_cap; /* newest first */
    if (strcmp(d->history[i].id, id) == 0) return &d->history[i];
  }
  return NULL;
}

/* ------------------------------------------------------------------------ *
 * Tensor table: names hashed, order of first put kept
 * ------------------------------------------------------------------------ */
static const char *tensor_name(const void *ctx, uint32_t i) { return ((const sd_save *)ctx)->tensors[i]->name; }

static sd_save_tensor *tensor_find(const sd_save *save, const char *name) {
  uint32_t i = sd_nameidx_find(&save->names, name, tensor_name, save);
  return i == SD_NAMEIDX_NONE ? NULL : save->tensors[i];
}

/* Appends t and indexes its name; on failure (-1) neither the array nor the table holds it. */
static int tensor_table_add(sd_save *save, sd_save_tensor *t) {
  if (save->ntensors + 1 > save->tcap) {
    size_t ncap = save->tcap ? save->tcap * 2 : 64;
    sd_save_tensor **nt = realloc(save->tensors, ncap * sizeof *nt);
    if (!nt) return -1;
    save->tensors = nt;
    save->tcap = ncap;
  }
  if (sd_nameidx_insert(&save->names, t->name, (uint32_t)save->ntensors, tensor_name, save) != 0) return -1;
  save->tensors[save->ntensors++] = t;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Creation and teardown
 * ------------------------------------------------------------------------ */
static void kv_free(sd_kv *kv, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free((char *)kv[i].key);
    free((char *)kv[i].value);
  }
  free(kv);
}

static void save_free(sd_save *save) {
  sd_save_inline_release(save);
  if (save->cl) save->d->multi_node->detach(save);
  for (size_t i = 0; i < save->ntensors; i++) {
    sd_save_tensor *t = save->tensors[i];
    for (size_t j = 0; j < t->nslices; j++) {
      free(t->slices[j]->data);
      free(t->slices[j]);
    }
    free(t->slices);
    free(t->name);
    free(t);
  }
  free(save->tensors);
  sd_nameidx_free(&save->names);
  for (size_t i = 0; i < save->nfiles; i++) {
    free(save->files[i].name);
    free(save->files[i].data);
  }
  free(save->files);
  if (save->ranks) {
    for (uint32_t r = 0; r < save->world_size; r++) {
      for (size_t k = 0; k < save->ranks[r].nregions; k++) sd_region_unref(save->ranks[r].regions[k]);
      free(save->ranks[r].regions);
      free(save->ranks[r].pending);
    }
  }
  free(save->ranks);
  if (save->planned) sd_planned_free(save->planned);
  free(save->planned);
  kv_free(save->metadata, save->nmetadata);
  free(save->early_path);
  free(save->id);
  free(save->dir);
  free(save->prefix);
  free(save);
}

static sd_save *save_new(sd_daemon *d, const sd_begin_args *a) {
  sd_save *save = calloc(1, sizeof *save);
  if (!save) return NULL;
  save->d = d;
  save->id = strdup(a->save);
  save->dir = strdup(a->dir);
  save->prefix = strdup(a->prefix ? a->prefix : SD_DEFAULT_PREFIX);
  save->world_size = a->world_size;
  save->max_shard_size = a->max_shard_size ? a->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  save->overwrite = a->overwrite;
  save->ranks = calloc(a->world_size, sizeof *save->ranks);
  save->metadata = calloc(a->nmetadata ? a->nmetadata : 1, sizeof *save->metadata);
  int bad = !save->id || !save->dir || !save->prefix || !save->ranks || !save->metadata;
  for (size_t i = 0; i < a->nmetadata && !bad; i++) {
    save->metadata[i].key = strdup(a->metadata[i].key);
    save->metadata[i].value = strdup(a->metadata[i].value);
    save->nmetadata = i + 1;
    bad = !save->metadata[i].key || !save->metadata[i].value;
  }
  if (bad) {
    save_free(save);
    return NULL;
  }
  save->t_begin = uv_hrtime();
  return save;
}

/* ------------------------------------------------------------------------ *
 * The end of a save: remember the result, answer waits, let go of memory
 * ------------------------------------------------------------------------ */
static void history_push(sd_daemon *d, sd_save_result *r) {
  if (d->hist_cap == 0) {
    d->hist_cap = d->cfg && d->cfg->keep_results ? d->cfg->keep_results : 64;
    d->history = calloc(d->hist_cap, sizeof *d->history);
    if (!d->history) {
      d->hist_cap = 0;
      free(r->id);
      free(r->dir);
      return;
    }
  }
  sd_save_result *slot = &d->history[d->hist_head];
  if (d->hist_len == d->hist_cap) {
    free(slot->id);
    free(slot->dir);
  } else {
    d->hist_len++;
  }
  *slot = *r;
  d->hist_head = (d->hist_head + 1) % d->hist_cap;
}

void sd_save_history_free(sd_daemon *d) {
  for (size_t k = 0; k < d->hist_len; k++) {
    size_t i = (d->hist_head + d->hist_cap - 1 - k) % d->hist_cap;
    free(d->history[i].id);
    free(d->history[i].dir);
  }
  free(d->history);
  d->history = NULL;
  d->hist_cap = d->hist_len = d->hist_head = 0;
}

json_t *sd_save_result_reply(const sd_save_result *r, json_t *id) {
  if (r->err.code) return sd_msg_error_from(id, &r->err);
  json_t *m = sd_msg_ok(id);
  if (!m) return NULL;
  json_object_set_new(m, "state", json_string("committed"));
  json_object_set_new(m, "save", sd_msg_string_lossy(r->id));
  json_object_set_new(m, "dir", sd_msg_string_lossy(r->dir));
  json_object_set_new(m, "files", json_integer((json_int_t)r->files));
  json_object_set_new(m, "tensors", json_integer((json_int_t)r->tensors));
  json_object_set_new(m, "bytes", json_integer((json_int_t)r->bytes));
  return m;
}

static void send_released(sd_save *save) {
  if (save->released) return;
  save->released = 1;
  for (uint32_t r = 0; r < save->world_size; r++) {
    void *owner = save->ranks[r].owner;
    if (owner && save->ranks[r].state != SD_RANK_NONE) save->d->save_owner->released(owner, save);
  }
}

static void unlink_save(sd_daemon *d, sd_save *save) {
  for (sd_save **pp = &d->saves; *pp; pp = &(*pp)->next) {
    if (*pp == save) {
      *pp = save->next;
      d->nsaves--;
      return;
    }
  }
}

const double sd_save_duration_buckets[SD_DURATION_NBUCKETS] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

static void count_committed(sd_counters *c, uint64_t files, uint64_t bytes, double seconds, double write_seconds) {
  c->saves_committed++;
  c->files_committed += files;
  c->bytes_committed += bytes;
  c->duration_sum += seconds;
  c->write_sum += write_seconds;
  for (int i = 0; i < SD_DURATION_NBUCKETS; i++) {
    if (seconds <= sd_save_duration_buckets[i]) {
      c->duration_buckets[i]++;
      break;
    }
  }
}

static void count_failed(sd_counters *c, int code) {
  c->saves_failed++;
  int i = -code;
  if (i <= 0 || i >= SD_COUNT_CODES) i = -SHARDD_E_INTERNAL;
  c->failed_by_code[i]++;
}

static void finalize(sd_save *save, const char *final_path) {
  sd_daemon *d = save->d;
  sd_save_result r = {0};
  r.id = strdup(save->id);
  if (final_path) {
    r.dir = strdup(final_path);
    if (save->planned) {
      r.files = save->planned->nfiles;
      r.tensors = save->planned->ntensors;
      r.bytes = save->planned->total_bytes;
    } else if (save->cl) {
      d->multi_node->result(save, &r.files, &r.tensors, &r.bytes);
    }
    uint64_t now = uv_hrtime();
    double secs = (double)(now - save->t_write) / 1e9, total = (double)(now - save->t_begin) / 1e9;
    uint64_t forwarded = 0; /* bytes streamed to peer daemons (multi-node saves) */
    if (save->cl) forwarded = d->multi_node->bytes_forwarded(save);
    count_committed(&d->counters, r.files, r.bytes, total, secs);
    /* The one summary line per save: files, bytes, write seconds, GB/s, forwarded bytes. */
    sd_log_info("committed save '%s' to %s: %llu files, %llu tensors, %llu bytes in %.3f s, %.2f GB/s, "
                "%llu bytes forwarded (%.3f s since the first begin)",
                save->id, final_path, (unsigned long long)r.files, (unsigned long long)r.tensors,
                (unsigned long long)r.bytes, secs, secs > 0 ? (double)r.bytes / secs / 1e9 : 0.0,
                (unsigned long long)forwarded, total);
  } else {
    r.err = save->err;
    if (!r.err.code) sd_fail(&r.err, SHARDD_E_INTERNAL, "save '%s' ended without a result", save->id);
    count_failed(&d->counters, r.err.code);
    sd_log_warn("save '%s' failed (%s): %s", save->id, sd_err_name(r.err.code), r.err.msg);
  }
  json_t *tmpl = sd_save_result_reply(&r, NULL);
  history_push(d, &r);

  /* Out of the daemon's tables first: what follows may re-enter (a send
   * can schedule a close), and the id is free for a new save from now on. */
  unlink_save(d, save);
  for (uint32_t k = 0; k < save->world_size; k++)
    if (save->ranks[k].owner) d->save_owner->left(save->ranks[k].owner, save);
  send_released(save);
  sd_waiter *w = save->waiters;
  save->waiters = NULL;
  while (w) {
    sd_waiter *next = w->next;
    json_t *m = tmpl ? json_copy(tmpl) : NULL;
    if (m) json_object_set(m, "id", w->id);
    json_decref(w->id);
    d->save_owner->waited(w->owner, m);
    free(w);
    w = next;
  }
  json_decref(tmpl);
  save_free(save);
  if (d->shutting_down && d->nsaves == 0 && d->on_idle) d->on_idle(d);
}

/* ------------------------------------------------------------------------ *
 * Failure
 * ------------------------------------------------------------------------ */
void sd_save_fail_err(sd_save *save, const sd_error *err) {
  if (save->err.code) return;
  save->err = *err;
  if (!save->err.code) save->err.code = SHARDD_E_INTERNAL;
  if (save->cl && save->d->multi_node->fail(save)) return; /* finished once its peer writes stop */
  if (save->state == SD_SAVE_WRITING) {
    save->state = SD_SAVE_FAILING;
    if (save->pub) sd_publish_cancel(save->pub, save->err.code, save->err.msg);
    return; /* finalized when the writer reports back */
  }
  if (save->state == SD_SAVE_OPEN) finalize(save, NULL);
}

void sd_save_fail(sd_save *save, int code, const char *fmt, ...) {
  sd_error e;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&e, code, fmt, ap);
  va_end(ap);
  sd_save_fail_err(save, &e);
}

void sd_save_fail_all(sd_daemon *d, int code, const char *why) {
  size_t n = d->nsaves, k = 0;
  sd_save **all = calloc(n ? n : 1, sizeof *all);
  if (!all) return;
  for (sd_save *s = d->saves; s && k < n; s = s->next) all[k++] = s;
  for (size_t i = 0; i < k; i++)
    if (save_alive(d, all[i])) sd_save_fail(all[i], code, "%s; save '%s' was not published", why, all[i]->id);
  free(all);
}

/* ------------------------------------------------------------------------ *
 * Publishing
 * ------------------------------------------------------------------------ */
/* A region whose segment is now shorter than its mapping (the client shrank
 * it): 0, or that region's out_of_range error naming it and its rank. */
static int regions_check(const sd_save *save, sd_error *err) {
  for (uint32_t r = 0; r < save->world_size; r++)
    for (size_t k = 0; k < save->ranks[r].nregions; k++)
      if (sd_region_check(save->ranks[r].regions[k], err) != 0) {
        char why[SD_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        return sd_fail(err, err->code, "save '%s', rank %u: %s", save->id, r, why);
      }
  return 0;
}

static void publish_done(sd_save *save, const sd_error *err, const char *final_path) {
  save->pub = NULL;
  if (err && err->code) {
    /* A write that faulted (EFAULT) because a client shrank its segment is
     * reported as that client's doing, naming the region, not as a disk error. */
    sd_error shrunk = {0};
    if (err->code == SHARDD_E_IO && !save->err.code && regions_check(save, &shrunk) == SHARDD_E_OUT_OF_RANGE)
      err = &shrunk;
    if (!save->err.code) save->err = *err;
    finalize(save, NULL);
    return;
  }
  /* Published even if a late abort or shutdown asked otherwise: the
   * checkpoint is on disk, so report what is true. */
  finalize(save, final_path ? final_path : save->dir);
}

void sd_save_finish(sd_save *save, const sd_error *err, const char *final_path) {
  publish_done(save, err, final_path);
}

void sd_save_released(sd_save *save) { send_released(save); }

static void on_released(sd_publish *pub, void *ud) {
  (void)pub;
  send_released(ud);
}

static void on_done(sd_publish *pub, void *ud, const sd_error *err, const char *final_path) {
  (void)pub;
  sd_save *save = ud;
  if (save->in_start) {
    /* Reported from inside sd_publish_start: finish after it returns. */
    save->done_early = 1;
    if (err) save->early_err = *err;
    if (final_path) save->early_path = strdup(final_path);
    return;
  }
  publish_done(save, err, final_path);
}

static void start_write(sd_save *save) {
  sd_daemon *d = save->d;
  sd_error err = {0};
  if (regions_check(save, &err) != 0) {
    sd_save_fail_err(save, &err);
    return;
  }
  save->planned = calloc(1, sizeof *save->planned);
  if (!save->planned) {
    sd_save_fail(save, SHARDD_E_NO_MEMORY, "out of memory planning save '%s'", save->id);
    return;
  }
  if (sd_planner_build(save, save->planned, &err) != 0) {
    sd_save_fail_err(save, &err);
    return;
  }
  sd_planned *p = save->planned;
  sd_publish_req req = {
      .op_ready = p->op_ready,
      .hold = save->nsealed < save->world_size,
      .root_fd = d->root_fd,
      .root_path = d->cfg->root,
      .rel_dir = save->dir,
      .overwrite = save->overwrite,
      .file_mode = d->cfg->file_mode,
      .dir_mode = d->cfg->dir_mode,
      .record_owner = 1,
      .owner_uid = save->owner_uid,
      .plan = &p->plan,
      .ops = p->ops,
      .nops = p->nops,
      .spans = p->spans,
      .nspans = p->nspans,
      .artifacts = p->artifacts,
      .nartifacts = p->nartifacts,
      .index_json = p->index_json,
      .index_len = p->index_len,
      .tag = save->id,
      .on_released = on_released,
      .on_done = on_done,
      .ud = save,
  };
  sd_log_debug("save '%s': %zu tensors, %zu files, %zu writes, %llu bytes", save->id, p->ntensors,
               p->plan.nfiles, p->nops, (unsigned long long)p->total_bytes);
  save->state = SD_SAVE_WRITING;
  save->t_write = uv_hrtime();
  save->in_start = 1;
  sd_publish *pub = NULL;
  int rc = sd_publish_start(d->writer, &req, &pub, &err);
  save->in_start = 0;
  if (rc != 0 && !save->done_early) {
    save->state = SD_SAVE_OPEN;
    if (!err.code) sd_fail(&err, rc, "cannot start writing save '%s'", save->id);
    sd_save_fail_err(save, &err);
    return;
  }
  if (save->done_early) {
    sd_error e = save->early_err;
    publish_done(save, e.code ? &e : NULL, save->early_path);
    return;
  }
  save->pub = pub;
  /* Failed while the plan was being built (cannot happen today, but keep
   * the invariant that a FAILING save always has its writer cancelled). */
  if (save->err.code) sd_publish_cancel(pub, save->err.code, save->err.msg);
}

void sd_save_maybe_start(sd_save *save) {
  if (save->cl) {
    /* Peers plan at the leader once every rank sealed: "declared" changes nothing there. */
    if (save->state == SD_SAVE_OPEN && !save->err.code) save->d->multi_node->sealed(save); /* the leader plans */
    return;
  }
  if (save->err.code) return;
  if (save->state == SD_SAVE_OPEN && save->ndeclared == save->world_size) {
    start_write(save); /* may end the save */
    return;
  }
  if (save->state == SD_SAVE_WRITING && save->pub && save->nsealed == save->world_size) {
    sd_log_debug("save '%s': every rank sealed with %llu of %llu bytes written", save->id,
                 (unsigned long long)sd_publish_bytes_written(save->pub),
                 (unsigned long long)sd_publish_bytes_total(save->pub));
    sd_publish_unhold(save->pub);
  }
}

/* ------------------------------------------------------------------------ *
 * begin
 * ------------------------------------------------------------------------ */
static int metadata_equal(const sd_save *save, const sd_begin_args *a) {
  if (save->nmetadata != a->nmetadata) return 0;
  for (size_t i = 0; i < a->nmetadata; i++) {
    size_t j = 0;
    while (j < save->nmetadata && strcmp(save->metadata[j].key, a->metadata[i].key) != 0) j++;
    if (j == save->nmetadata || strcmp(save->metadata[j].value, a->metadata[i].value) != 0) return 0;
  }
  return 1;
}

/* First disagreement between a joining rank and the save, or 0. */
static int disagreement(const sd_save *save, const sd_begin_args *a, sd_error *err) {
  const char *prefix = a->prefix ? a->prefix : SD_DEFAULT_PREFIX;
  uint64_t mss = a->max_shard_size ? a->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  if (strcmp(save->dir, a->dir) != 0)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives dir '%.200s', earlier ranks gave '%.200s'",
                   save->id, a->rank, a->dir, save->dir);
  if (strcmp(save->prefix, prefix) != 0)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives prefix '%.100s', earlier ranks gave '%.100s'",
                   save->id, a->rank, prefix, save->prefix);
  if (save->max_shard_size != mss)
    return sd_fail(err, SHARDD_E_CONFLICT,
                   "save '%s': rank %u gives max_shard_size %llu, earlier ranks gave %llu", save->id,
                   a->rank, (unsigned long long)mss, (unsigned long long)save->max_shard_size);
  if (save->overwrite != a->overwrite)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives overwrite %s, earlier ranks gave %s",
                   save->id, a->rank, a->overwrite ? "true" : "false", save->overwrite ? "true" : "false");
  if (!metadata_equal(save, a))
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives different metadata than earlier ranks",
                   save->id, a->rank);
  return save->d->multi_node ? save->d->multi_node->join_check(save, a, err) : 0;
}

static int attach_multi_node(sd_save *save, const sd_begin_args *a, sd_error *err) {
  if (!save->d->multi_node)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "save '%s' spans %u nodes, but this daemon cannot join others",
                   a->save, a->nnodes);
  return save->d->multi_node->attach(save, a, err);
}

static int create_save(sd_daemon *d, const sd_joiner *j, const sd_begin_args *a, sd_save **out, sd_error *err) {
  int rc = sd_path_check_rel(a->dir, err);
  if (rc) return rc;
  for (sd_save *s = d->saves; s; s = s->next)
    if (strcmp(s->dir, a->dir) == 0)
      return sd_fail(err, SHARDD_E_CONFLICT, "dir '%s' is already the destination of save '%s'", a->dir, s->id);
  if (d->cfg && d->nsaves >= d->cfg->max_saves)
    return sd_fail(err, SHARDD_E_LIMIT, "%zu saves are in flight (max_saves=%u); save '%s' cannot begin",
                   d->nsaves, d->cfg->max_saves, a->save);
  int exists = 0;
  rc = sd_path_exists(d->root_fd, a->dir, &exists, err);
  if (rc) return rc;
  if (exists && !a->overwrite)
    return sd_fail(err, SHARDD_E_EXISTS, "'%s' already exists under the root (pass overwrite to replace it)",
                   a->dir);
  if (exists && j && (rc = sd_save_may_overwrite(d, j->uid, j->trusted, a->dir, err)) != 0) return rc;
  sd_save *save = save_new(d, a);
  if (!save) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory creating save '%s'", a->save);
  /* Newest last, so status lists saves in the order they began. */
  sd_save **pp = &d->saves;
  while (*pp) pp = &(*pp)->next;
  *pp = save;
  d->nsaves++;
  *out = save;
  return 0;
}

int sd_save_begin(sd_daemon *d, const sd_joiner *j, const sd_begin_args *a, sd_error *err) {
  if (d->shutting_down) return sd_fail(err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  if (a->world_size == 0 || a->world_size > SD_WORLD_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'world_size' must be in [1, %d]", SD_WORLD_MAX);
  if (a->rank >= a->world_size)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'rank' is %u, outside [0, world_size=%u)",
                   a->rank, a->world_size);
  sd_save *save = sd_save_find(d, a->save);
  int rc;
  if (save) {
    /* Another user's save is not there to be joined: refused without harming it. */
    if (j->uid != save->owner_uid)
      return sd_fail(err, SHARDD_E_PERMISSION, "save '%s' belongs to uid %u; uid %u may not join it", save->id,
                     (unsigned)save->owner_uid, (unsigned)j->uid);
    int mine = d->save_owner->rank_of(j->owner, save);
    if (mine >= 0)
      return sd_fail(err, SHARDD_E_BAD_STATE, "this connection already is rank %d of save '%s'", mine, save->id);
    if (save->world_size != a->world_size) {
      sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives world_size %u, earlier ranks gave %u",
              save->id, a->rank, a->world_size, save->world_size);
      sd_save_fail_err(save, err);
      return err->code;
    }
    if (save->ranks[a->rank].state != SD_RANK_NONE)
      return sd_fail(err, SHARDD_E_BAD_STATE, "rank %u of save '%s' has already begun", a->rank, save->id);
    if (save->state != SD_SAVE_OPEN)
      return sd_fail(err, SHARDD_E_BAD_STATE, "save '%s' is ending", save->id);
    if (disagreement(save, a, err)) {
      sd_save_fail_err(save, err);
      return err->code;
    }
  } else {
    rc = create_save(d, j, a, &save, err);
    if (rc) return rc;
    if (a->nnodes > 1 && (rc = attach_multi_node(save, a, err)) != 0) {
      unlink_save(d, save);
      save_free(save);
      return rc;
    }
    save->owner_uid = j->uid;
  }
  if (d->save_owner->joined(j->owner, save, a->rank) != 0) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory joining save '%s'", save->id);
    if (save->nbegun == 0) {
      unlink_save(d, save);
      save_free(save);
    }
    return rc;
  }
  save->ranks[a->rank].state = SD_RANK_BEGUN;
  save->ranks[a->rank].owner = j->owner;
  save->nbegun++;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * put, file, seal
 * ------------------------------------------------------------------------ */
static void shape_str(char *buf, size_t n, uint32_t ndim, const uint64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (uint32_t i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

static int rank_hold_region(sd_rank *rk, sd_region *r) {
  for (size_t i = 0; i < rk->nregions; i++)
    if (rk->regions[i] == r) return 0;
  if (rk->nregions == rk->cap) {
    size_t ncap = rk->cap ? rk->cap * 2 : 4;
    sd_region **nr = realloc(rk->regions, ncap * sizeof *nr);
    if (!nr) return -1;
    rk->regions = nr;
    rk->cap = ncap;
  }
  sd_region_ref(r);
  rk->regions[rk->nregions++] = r;
  return 0;
}

/* Room for one more deferred put, made before anything is recorded. */
static int rank_reserve_pending(sd_rank *rk) {
  if (rk->npending < rk->pcap) return 0;
  size_t ncap = rk->pcap ? rk->pcap * 2 : 16;
  sd_slice **np = realloc(rk->pending, ncap * sizeof *np);
  if (!np) return -1;
  rk->pending = np;
  rk->pcap = ncap;
  return 0;
}

int sd_save_put(sd_save *save, uint32_t rank, sd_put_args *a, sd_error *err) {
  if (save->ranks[rank].declared)
    return sd_fail(err, SHARDD_E_BAD_STATE, "tensor '%s': rank %u has declared its puts complete in save '%s'",
                   a->name, rank, save->id);
  sd_save_tensor *t = tensor_find(save, a->name);
  const sd_config *cfg = save->d->cfg;
  if (cfg && !t && save->ntensors >= cfg->max_tensors)
    return sd_fail(err, SHARDD_E_LIMIT, "save '%s' already has %zu tensors (max_tensors=%llu); tensor '%s' refused",
                   save->id, save->ntensors, (unsigned long long)cfg->max_tensors, a->name);
  if (cfg && save->nslices >= cfg->max_slices)
    return sd_fail(err, SHARDD_E_LIMIT, "save '%s' already has %llu slices (max_slices=%llu); tensor '%s' refused",
                   save->id, (unsigned long long)save->nslices, (unsigned long long)cfg->max_slices, a->name);
  if (t) {
    if (t->dtype != a->dtype || t->ndim != a->ndim ||
        memcmp(t->shape, a->shape, a->ndim * sizeof(uint64_t)) != 0) {
      char was[256], now[256];
      shape_str(was, sizeof was, t->ndim, t->shape);
      shape_str(now, sizeof now, a->ndim, a->shape);
      sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u declares %s %s, rank %u declared %s %s", a->name,
              rank, sd_dtype_name(a->dtype), now, t->first_rank, sd_dtype_name(t->dtype), was);
      sd_save_fail_err(save, err);
      return err->code;
    }
    if (a->index >= 0 && t->index >= 0 && a->index != t->index) {
      sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u gives index %lld, an earlier put gave %lld",
              a->name, rank, (long long)a->index, (long long)t->index);
      sd_save_fail_err(save, err);
      return err->code;
    }
  }
  if (a->data && sd_save_inline_check(save, "tensor", a->name, a->len, err)) return err->code;
  sd_rank *rk = &save->ranks[rank];
  sd_slice *sl = calloc(1, sizeof *sl + 2 * a->ndim * sizeof(uint64_t));
  if (!sl || (a->region && rank_hold_region(rk, a->region) != 0) ||
      (a->deferred && rank_reserve_pending(rk) != 0)) {
    free(sl);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
  }
  if (!t) {
    t = calloc(1, sizeof *t);
    if (t) t->name = strdup(a->name);
    if (!t || !t->name || tensor_table_add(save, t) != 0) {
      if (t) free(t->name);
      free(t);
      free(sl);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
    }
    t->dtype = a->dtype;
    t->ndim = a->ndim;
    memcpy(t->shape, a->shape, a->ndim * sizeof(uint64_t));
    t->index = -1;
    t->first_rank = rank;
  }
  if (t->nslices == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 2;
    sd_slice **ns = realloc(t->slices, ncap * sizeof *ns);
    if (!ns) {
      free(sl);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
    }
    t->slices = ns;
    t->cap = ncap;
  }
  if (a->index >= 0) t->index = a->index;
  sl->rank = rank;
  sl->region = a->region;
  sl->offset = a->offset;
  if (a->data) sd_save_inline_add(save, a->len);
  sl->data = a->data;
  a->data = NULL;
  sl->len = a->len;
  memcpy(sl->dims, a->start, a->ndim * sizeof(uint64_t));
  memcpy(sl->dims + a->ndim, a->count, a->ndim * sizeof(uint64_t));
  t->slices[t->nslices++] = sl;
  if (a->deferred) {
    sl->deferred = 1;
    rk->pending[rk->npending++] = sl;
  }
  save->nslices++;
  rk->bytes += a->len;
  save->bytes_put += a->len;
  return 0;
}

int sd_save_file(sd_save *save, uint32_t rank, const char *name, uint8_t *data, size_t len,
                 sd_error *err) {
  if (save->ranks[rank].declared) {
    free(data);
    return sd_fail(err, SHARDD_E_BAD_STATE, "file '%s': rank %u has declared its puts complete in save '%s'",
                   name, rank, save->id);
  }
  for (size_t i = 0; i < save->nfiles; i++) {
    sd_save_artifact *f = &save->files[i];
    if (strcmp(f->name, name) != 0) continue;
    /* Every rank running the same save code sends the same config.json. */
    if (f->len == len && (len == 0 || memcmp(f->data, data, len) == 0)) {
      free(data);
      return 0;
    }
    free(data);
    sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends different contents than rank %u", name, rank,
            f->rank);
    sd_save_fail_err(save, err);
    return err->code;
  }
  if (sd_save_inline_check(save, "file", name, len, err)) {
    free(data);
    return err->code;
  }
  if (save->nfiles == save->fcap) {
    size_t ncap = save->fcap ? save->fcap * 2 : 4;
    sd_save_artifact *nf = realloc(save->files, ncap * sizeof *nf);
    if (!nf) {
      free(data);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
    }
    save->files = nf;
    save->fcap = ncap;
  }
  char *copy = strdup(name);
  if (!copy) {
    free(data);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
  }
  save->files[save->nfiles++] = (sd_save_artifact){.name = copy, .data = data, .len = len, .rank = rank};
  sd_save_inline_add(save, len);
  save->bytes_put += len;
  return 0;
}

/* A rank's pending (deferred) puts by region, then by where their bytes end. */
static int pending_cmp(const void *a, const void *b) {
  const sd_slice *x = *(sd_slice *const *)a, *y = *(sd_slice *const *)b;
  if (x->region != y->region) return (uintptr_t)x->region < (uintptr_t)y->region ? -1 : 1;
  uint64_t ex = x->offset + x->len, ey = y->offset + y->len;
  return ex < ey ? -1 : ex > ey;
}

static size_t settle_one(sd_save *save, sd_slice *sl) {
  sl->deferred = 0;
  return save->planned ? sd_planned_slice_ready(save->planned, sl) : 0;
}

/* The first pending put of region r, or (flagged) the first one of r not yet ready. */
static size_t pending_seek(const sd_rank *rk, const sd_region *r, int flagged) {
  size_t lo = 0, hi = rk->npending;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const sd_slice *sl = rk->pending[mid];
    int before = (uintptr_t)sl->region < (uintptr_t)r || (sl->region == r && flagged && !sl->deferred);
    if (before) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Flags the pending puts of rank rk whose bytes lie in region r below upto
 * (r NULL: all of them) and pokes the writer when any of them is planned
 * already. Once the rank has declared, its list is sorted and kept: a ready
 * always flags a prefix of its region's run, so each call costs a binary
 * search plus the puts it flags, however often a client says ready. */
static void pending_settle(sd_save *save, sd_rank *rk, const sd_region *r, uint64_t upto) {
  size_t flagged = 0;
  if (!r) {
    for (size_t i = 0; i < rk->npending; i++)
      if (rk->pending[i]->deferred) flagged += settle_one(save, rk->pending[i]);
    rk->npending = 0;
  } else if (rk->declared) {
    for (size_t i = pending_seek(rk, r, 1); i < rk->npending; i++) {
      sd_slice *sl = rk->pending[i];
      if (sl->region != r || sl->offset + sl->len > upto) break;
      flagged += settle_one(save, sl);
    }
  } else {
    size_t keep = 0; /* before declared: puts may still come, so drop the ready ones */
    for (size_t i = 0; i < rk->npending; i++) {
      sd_slice *sl = rk->pending[i];
      if (sl->region != r || sl->offset + sl->len > upto) rk->pending[keep++] = sl;
      else flagged += settle_one(save, sl);
    }
    rk->npending = keep;
  }
  if (flagged && save->pub) sd_publish_poke(save->pub);
}

static void rank_declare(sd_save *save, sd_rank *rk) {
  if (rk->declared) return;
  rk->declared = 1;
  save->ndeclared++;
  if (rk->npending > 1) qsort(rk->pending, rk->npending, sizeof *rk->pending, pending_cmp);
}

/* Requests on a save that has failed get its error. */
static int save_failed(const sd_save *save, sd_error *err) {
  if (!save->err.code) return 0;
  *err = save->err;
  return err->code;
}

int sd_save_declared(sd_save *save, uint32_t rank, sd_error *err) {
  if (save_failed(save, err)) return err->code;
  sd_rank *rk = &save->ranks[rank];
  if (rk->declared)
    return sd_fail(err, SHARDD_E_BAD_STATE, "rank %u has already declared its puts in save '%s'", rank, save->id);
  rank_declare(save, rk);
  return 0;
}

int sd_save_ready(sd_save *save, uint32_t rank, const sd_region *r, uint64_t upto, sd_error *err) {
  if (save_failed(save, err)) return err->code;
  pending_settle(save, &save->ranks[rank], r, upto);
  return 0;
}

int sd_save_seal(sd_save *save, uint32_t rank, sd_error *err) {
  sd_rank *rk = &save->ranks[rank];
  if (rk->state == SD_RANK_SEALED)
    return sd_fail(err, SHARDD_E_BAD_STATE, "rank %u has already sealed save '%s'", rank, save->id);
  rk->state = SD_RANK_SEALED;
  save->nsealed++;
  pending_settle(save, rk, NULL, 0); /* sealed: every byte is in place */
  rank_declare(save, rk);
  return 0;
}

int sd_save_add_waiter(sd_save *save, void *owner, json_t *id, sd_error *err) {
  sd_waiter *w = calloc(1, sizeof *w);
  if (!w) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory waiting for save '%s'", save->id);
  w->owner = owner;
  w->id = json_incref(id ? id : json_null());
  sd_waiter **pp = &save->waiters;
  while (*pp) pp = &(*pp)->next;
  *pp = w;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Connections going away
 * ------------------------------------------------------------------------ */
size_t sd_save_drop_waiters(sd_daemon *d, const void *owner) {
  size_t dropped = 0;
  for (sd_save *save = d->saves; save; save = save->next) {
    for (sd_waiter **pp = &save->waiters; *pp;) {
      sd_waiter *w = *pp;
      if (w->owner != owner) {
        pp = &w->next;
        continue;
      }
      *pp = w->next;
      json_decref(w->id);
      free(w);
      dropped++;
    }
  }
  return dropped;
}

void sd_save_rank_forget(sd_save *save, uint32_t rank) { save->ranks[rank].owner = NULL; }

void sd_save_rank_lost(sd_daemon *d, sd_save *save, uint32_t rank) {
  if (!save_alive(d, save)) return;
  if (save->ranks[rank].state == SD_RANK_BEGUN && !save->err.code)
    sd_save_fail(save, SHARDD_E_CLIENT_LOST, "rank %u of save '%s' disconnected before seal", rank, save->id);
}

/* ------------------------------------------------------------------------ *
 * Status
 * ------------------------------------------------------------------------ */
uint64_t sd_save_bytes_planned(const sd_save *save) {
  return save->planned && save->planned->have_plan ? save->planned->total_bytes : save->bytes_put;
}

void sd_save_writing_totals(const sd_daemon *d, uint64_t *writing, uint64_t *pending) {
  *writing = *pending = 0;
  for (const sd_save *s = d->saves; s; s = s->next) {
    if (s->state != SD_SAVE_WRITING) continue;
    (*writing)++;
    uint64_t total = s->pub ? sd_publish_bytes_total(s->pub) : 0, done = sd_save_bytes_written(s);
    *pending += total > done ? total - done : 0;
  }
}

uint64_t sd_save_bytes_written(const sd_save *save) {
  if (save->cl) return save->d->multi_node->bytes_written(save);
  return save->pub ? sd_publish_bytes_written(save->pub) : 0;
}

const char *sd_save_state_name(const sd_save *save) {
  switch (save->state) {
    case SD_SAVE_OPEN: return save->ndeclared == save->world_size ? "planning" : "open";
    case SD_SAVE_WRITING: return "writing";
    case SD_SAVE_FAILING: return "failing";
  }
  return "unknown";
}
