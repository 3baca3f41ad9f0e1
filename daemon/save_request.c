/* The save state machine's requests: ranks begin, put, file, declare, ready and seal; waits and lost ranks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pathsafe.h"
#include "save_guard.h"
#include "planner.h"
#include "save_int.h"
#include "sd_grow.h"
#include "sd_layout.h"
#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * Tensor table: names hashed, order of first put kept
 * ------------------------------------------------------------------------ */
SD_NAMED_TABLE(tensor, sd_save, sd_save_tensor, tensors, ntensors, tcap, names, 64)

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
  if (save->keep_last != a->keep_last)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives keep_last %u, earlier ranks gave %u", save->id,
                   a->rank, a->keep_last, save->keep_last);
  if (save->total_parameters != a->total_parameters)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives total_parameters %lld, earlier ranks gave %lld "
                   "(-1: none)", save->id, a->rank, (long long)a->total_parameters, (long long)save->total_parameters);
  if (!metadata_equal(save, a))
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives different metadata than earlier ranks",
                   save->id, a->rank);
  return save->d->multi_node ? save->d->multi_node->join_check(save, a, err) : 0;
}

static int attach_multi_node(sd_save *save, const sd_begin_args *a, sd_error *err) {
  if (!save->d->multi_node)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "save '%s' spans %u nodes, but this daemon cannot join others",
                   a->save, a->nnodes);
  struct sd_csave *cl = NULL;
  int rc = save->d->multi_node->attach(save, a, &cl, err);
  if (rc == 0) save->cl = cl;
  return rc;
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
  if (j && (rc = sd_save_may_place(d, j->uid, j->trusted, a->dir, err)) != 0) return rc;
  sd_save *save = sd_save_new(d, a);
  if (!save) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory creating save '%s'", a->save);
  /* Newest last, so status lists saves in the order they began. */
  sd_save **pp = &d->saves;
  while (*pp) pp = &(*pp)->next;
  *pp = save;
  d->nsaves++;
  *out = save;
  return 0;
}

/* A one-node save id that ended within history_window. Failed: a rank that had not begun it is late and
 * gets its outcome (the ranks it would wait for gave up); one that had is retrying. Committed: exists,
 * unless the begin asks to overwrite (saving to one dir under one id every step is a new save). A
 * multi-node save's node keeps its own record of failures (cluster.c, proto/PEERS.md). */
static int late_begin(sd_daemon *d, const sd_begin_args *a, sd_error *err) {
  unsigned window = d->cfg ? d->cfg->history_window : 300;
  const sd_save_result *r = a->nnodes > 1 || !window ? NULL : sd_save_history_find(d, a->save);
  uint64_t now = sd_save_now_ms();
  if (!r || now - r->t_end_ms >= (uint64_t)window * 1000u) return 0;
  unsigned ago = (unsigned)((now - r->t_end_ms) / 1000u);
  if (!r->err.code && a->overwrite) return 0;
  if (!r->err.code)
    return sd_fail(err, SHARDD_E_EXISTS,
                   "save '%s' (dir '%s') has just committed to %.300s: pass overwrite to save it again, or give "
                   "this save another dir or id",
                   a->save, a->dir, r->dir ? r->dir : "?");
  if (r->began && a->rank < r->world_size && (r->began[a->rank / 8] >> (a->rank % 8) & 1)) return 0;
  return sd_fail(err, SHARDD_E_SAVE_FAILED, "save '%s' (dir '%s') failed %u s ago, before rank %u began (%s: %s)",
                 a->save, a->dir, ago, a->rank, sd_err_name(r->err.code), r->err.msg);
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
  if (!save && (rc = late_begin(d, a, err)) != 0) return rc;
  if (save) {
    /* Another user's save is not there to be joined: refused without harming it. */
    if (j->uid != save->owner_uid)
      return sd_fail(err, SHARDD_E_PERMISSION, "save '%s' belongs to uid %u; uid %u may not join it", save->id,
                     (unsigned)save->owner_uid, (unsigned)j->uid);
    int mine = d->save_owner->rank_of(j->owner, save);
    if (mine >= 0)
      return sd_fail(err, SHARDD_E_BAD_STATE, "this connection already is rank %d of save '%s' (dir '%s')", mine,
                     save->id, save->dir);
    if (save->world_size != a->world_size) {
      sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives world_size %u, earlier ranks gave %u",
              save->id, a->rank, a->world_size, save->world_size);
      sd_save_fail_err(save, err);
      return err->code;
    }
    if (save->ranks[a->rank].state != SD_RANK_NONE)
      return sd_fail(err, SHARDD_E_BAD_STATE,
                     "rank %u of save '%s' (dir '%s') has already begun: an earlier save to that dir is still in "
                     "flight; wait for it to end before saving there again, or save to another dir",
                     a->rank, save->id, save->dir);
    if (save->state != SD_SAVE_OPEN)
      return sd_fail(err, SHARDD_E_BAD_STATE,
                     "save '%s' (dir '%s') is ending: wait for it to end before saving there again", save->id,
                     save->dir);
    if (disagreement(save, a, err)) {
      sd_save_fail_err(save, err);
      return err->code;
    }
  } else {
    rc = create_save(d, j, a, &save, err);
    if (rc) return rc;
    const sd_config *cfg = d->cfg;
    save->join_timeout = a->has_join_timeout ? a->join_timeout : cfg ? cfg->join_timeout : 300;
    save->idle_timeout = a->has_idle_timeout ? a->idle_timeout : cfg ? cfg->idle_timeout : 600;
    if (a->nnodes > 1 && (rc = attach_multi_node(save, a, err)) != 0) {
      sd_save_unlink(d, save);
      sd_save_free(save);
      return rc;
    }
    save->owner_uid = j->uid;
    save->owner_trusted = j->trusted;
    sd_save_deadlines_arm(d);
  }
  if (d->save_owner->joined(j->owner, save, a->rank) != 0) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory joining save '%s'", save->id);
    if (save->nbegun == 0) {
      sd_save_unlink(d, save);
      sd_save_free(save);
    }
    return rc;
  }
  save->ranks[a->rank].state = SD_RANK_BEGUN;
  save->ranks[a->rank].owner = j->owner;
  save->nbegun++;
  sd_save_touch(save);
  if (save->cl) d->multi_node->began(save, a->rank);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * put, file, seal
 * ------------------------------------------------------------------------ */
static int rank_hold_region(sd_rank *rk, sd_region *r) {
  for (size_t i = 0; i < rk->nregions; i++)
    if (rk->regions[i] == r) return 0;
  if (SD_GROW(rk->regions, rk->cap, rk->nregions + 1, 4)) return -1;
  sd_region_ref(r);
  rk->regions[rk->nregions++] = r;
  return 0;
}

/* Room for one more deferred put, made before anything is recorded. */
static int rank_reserve_pending(sd_rank *rk) {
  return SD_GROW(rk->pending, rk->pcap, rk->npending + 1, 16);
}

/* The save's own copy of a put's file prefix, kept once however many tensors name it (NULL for
 * the save's own prefix), so a tensor's prefix is compared by pointer. */
static int series_of(sd_save *save, const sd_put_args *a, const char **out, sd_error *err) {
  *out = NULL;
  if (!a->prefix || strcmp(a->prefix, save->prefix) == 0) return 0;
  for (size_t i = 0; i < save->nseries; i++)
    if (strcmp(save->series[i], a->prefix) == 0) {
      *out = save->series[i];
      return 0;
    }
  if (save->nseries == SD_MAX_SERIES - 1)
    return sd_fail(err, SHARDD_E_LIMIT, "tensor '%s': save '%s' already names %d file prefixes besides '%s'; "
                   "prefix '%s' refused", a->name, save->id, SD_MAX_SERIES - 1, save->prefix, a->prefix);
  if (!(save->series[save->nseries] = strdup(a->prefix)))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
  *out = save->series[save->nseries++];
  return 0;
}

int sd_save_put(sd_save *save, uint32_t rank, sd_put_args *a, sd_error *err) {
  sd_save_touch(save);
  if (save->ranks[rank].declared)
    return sd_fail(err, SHARDD_E_BAD_STATE, "tensor '%s': rank %u has declared its puts complete in save '%s'",
                   a->name, rank, save->id);
  const char *series = NULL;
  if (series_of(save, a, &series, err)) return err->code;
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
      sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u declares %s %s, rank %u declared %s %s", a->name,
              rank, sd_dtype_name(a->dtype), sd_fmt_dims(now, sizeof now, a->ndim, a->shape), t->first_rank,
              sd_dtype_name(t->dtype), sd_fmt_dims(was, sizeof was, t->ndim, t->shape));
      sd_save_fail_err(save, err);
      return err->code;
    }
    if (a->index >= 0 && t->index >= 0 && a->index != t->index) {
      sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u gives index %lld, an earlier put gave %lld",
              a->name, rank, (long long)a->index, (long long)t->index);
      sd_save_fail_err(save, err);
      return err->code;
    }
    if (series != t->prefix) {
      sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u puts it in files of prefix '%s', rank %u in '%s'",
              a->name, rank, series ? series : save->prefix, t->first_rank, t->prefix ? t->prefix : save->prefix);
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
    if (!t || !t->name || tensor_add(save, t) != 0) {
      if (t) free(t->name);
      free(t);
      free(sl);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
    }
    t->dtype = a->dtype;
    t->ndim = a->ndim;
    memcpy(t->shape, a->shape, a->ndim * sizeof(uint64_t));
    t->index = -1;
    t->prefix = series;
    t->first_rank = rank;
  }
  if (SD_GROW(t->slices, t->cap, t->nslices + 1, 2)) {
    free(sl);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", a->name);
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

int sd_save_file(sd_save *save, uint32_t rank, const char *name, uint8_t *data, size_t len, int part,
                 sd_error *err) {
  sd_save_touch(save);
  if (save->ranks[rank].declared) {
    free(data);
    return sd_fail(err, SHARDD_E_BAD_STATE, "file '%s': rank %u has declared its puts complete in save '%s'",
                   name, rank, save->id);
  }
  for (size_t i = 0; i < save->nfiles; i++) {
    sd_save_artifact *f = &save->files[i];
    if (strcmp(f->name, name) != 0 || (part && f->part && f->rank != rank)) continue;
    /* Every rank running the same save code sends the same config.json (and a part again, the same). */
    if (f->part == part && f->len == len && (len == 0 || memcmp(f->data, data, len) == 0)) {
      free(data);
      return 0;
    }
    free(data);
    if (f->part != part)
      sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends %s, rank %u %s", name, rank,
              part ? "its part of it" : "all of it", f->rank, f->part ? "its part" : "all of it");
    else if (f->rank == rank)
      sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends different contents than it sent before", name, rank);
    else
      sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends different contents than rank %u", name, rank,
              f->rank);
    sd_save_fail_err(save, err);
    return err->code;
  }
  if (sd_save_inline_check(save, "file", name, len, err)) {
    free(data);
    return err->code;
  }
  if (SD_GROW(save->files, save->fcap, save->nfiles + 1, 4)) {
    free(data);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
  }
  char *copy = strdup(name);
  if (!copy) {
    free(data);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
  }
  save->files[save->nfiles++] = (sd_save_artifact){.name = copy, .data = data, .len = len, .rank = rank, .part = part};
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
  sd_save_touch(save);
  if (save_failed(save, err)) return err->code;
  sd_rank *rk = &save->ranks[rank];
  if (rk->declared)
    return sd_fail(err, SHARDD_E_BAD_STATE, "rank %u has already declared its puts in save '%s'", rank, save->id);
  rank_declare(save, rk);
  return 0;
}

int sd_save_ready(sd_save *save, uint32_t rank, const sd_region *r, uint64_t upto, sd_error *err) {
  sd_save_touch(save);
  if (save_failed(save, err)) return err->code;
  pending_settle(save, &save->ranks[rank], r, upto);
  return 0;
}

int sd_save_seal(sd_save *save, uint32_t rank, sd_error *err) {
  sd_save_touch(save);
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
  if (!sd_save_alive(d, save)) return;
  if (save->ranks[rank].state == SD_RANK_BEGUN && !save->err.code)
    sd_save_fail(save, SHARDD_E_CLIENT_LOST, "rank %u of save '%s' disconnected before seal", rank, save->id);
}

