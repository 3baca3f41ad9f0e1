/* The end of a save: failure (first error wins), planning and publishing, the result counted and told to the owner. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "planner.h"
#include "save_int.h"
#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * The end of a save: count it, answer waits, let go of memory
 * ------------------------------------------------------------------------ */
static void send_released(sd_save *save) {
  if (save->released) return;
  save->released = 1;
  for (uint32_t r = 0; r < save->world_size; r++) {
    void *owner = save->ranks[r].owner;
    if (owner && save->ranks[r].state != SD_RANK_NONE) save->d->save_owner->released(owner, save);
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
    if (save->cl) {
      /* This node's share, in its own summary line and counters. */
      save->bytes_zero_copy = d->multi_node->bytes_zero_copy(save);
      save->bytes_copied = d->multi_node->bytes_written(save) - save->bytes_zero_copy;
    }
    uint64_t now = uv_hrtime();
    double secs = (double)(now - save->t_write) / 1e9, total = (double)(now - save->t_begin) / 1e9;
    uint64_t forwarded = 0; /* bytes streamed to peer daemons (multi-node saves) */
    if (save->cl) forwarded = d->multi_node->bytes_forwarded(save);
    count_committed(&d->counters, r.files, r.bytes, total, secs);
    d->counters.bytes_zero_copy += save->bytes_zero_copy;
    d->counters.bytes_gathered += save->bytes_gathered;
    d->counters.bytes_copied += save->bytes_copied;
    d->counters.bytes_copied_sealed += save->bytes_sealed;
    /* The one summary line per save: files, bytes, write seconds, GB/s, zero-copy, gathered and copied bytes, forwarded bytes. */
    sd_log_info("committed save '%s' to %s: %llu files, %llu tensors, %llu bytes in %.3f s, %.2f GB/s, "
                "%llu bytes forwarded, %llu bytes direct, %llu gathered, %llu copied (%.3f s since the first begin)",
                save->id, final_path, (unsigned long long)r.files, (unsigned long long)r.tensors,
                (unsigned long long)r.bytes, secs, secs > 0 ? (double)r.bytes / secs / 1e9 : 0.0,
                (unsigned long long)forwarded, (unsigned long long)save->bytes_zero_copy,
                (unsigned long long)save->bytes_gathered, (unsigned long long)save->bytes_copied, total);
  } else {
    r.err = save->err;
    if (!r.err.code) sd_fail(&r.err, SHARDD_E_INTERNAL, "save '%s' ended without a result", save->id);
    count_failed(&d->counters, r.err.code);
    sd_log_warn("save '%s' failed (%s): %s", save->id, sd_err_name(r.err.code), r.err.msg);
  }
  json_t *tmpl = sd_save_result_reply(&r, NULL);
  r.t_end_ms = sd_save_now_ms();
  r.world_size = save->world_size;
  if (!final_path && !save->cl && (r.began = calloc((save->world_size + 7) / 8, 1)) != NULL)
    for (uint32_t k = 0; k < save->world_size; k++)
      if (save->ranks[k].state != SD_RANK_NONE) r.began[k / 8] |= (uint8_t)(1u << (k % 8));
  sd_save_history_push(d, &r);

  /* Out of the daemon's tables first: what follows may re-enter (a send
   * can schedule a close), and the id is free for a new save from now on. */
  sd_save_unlink(d, save);
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
  /* After every answer went out: retention never delays or fails a commit. */
  if (final_path && d->save_owner->committed) d->save_owner->committed(save, final_path);
  sd_save_free(save);
  if (d->shutting_down && d->nsaves == 0 && d->on_idle) d->on_idle(d);
}

/* ------------------------------------------------------------------------ *
 * Failure
 * ------------------------------------------------------------------------ */
void sd_save_fail_err(sd_save *save, sd_error *err) {
  sd_save_err_dir(save, err);
  if (save->err.code) return;
  save->err = *err;
  if (!save->err.code) save->err.code = SHARDD_E_INTERNAL;
  if (save->cl) {
    /* The multi-node part stops its writes: with some in flight the save ends once they stop (sd_save_finish). */
    if (save->d->multi_node->fail(save)) {
      save->state = SD_SAVE_FAILING;
      return;
    }
    save->state = SD_SAVE_OPEN;
  }
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
    if (sd_save_alive(d, all[i])) sd_save_fail(all[i], code, "%s; save '%s' was not published", why, all[i]->id);
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

void sd_save_writing(sd_save *save) {
  save->state = SD_SAVE_WRITING;
  save->t_write = uv_hrtime();
}

static void on_released(sd_publish *pub, void *ud) {
  (void)pub;
  send_released(ud);
}

static void on_done(sd_publish *pub, void *ud, const sd_error *err, const char *final_path) {
  sd_save *save = ud;
  save->bytes_zero_copy = sd_publish_bytes_zero_copy(pub);
  save->bytes_gathered = sd_publish_bytes_gathered(pub);
  save->bytes_copied = sd_publish_bytes_written(pub) - save->bytes_zero_copy - save->bytes_gathered;
  save->bytes_sealed = sd_publish_bytes_sealed(pub);
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
      .owner_trusted = save->owner_trusted,
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
  sd_save_writing(save);
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
