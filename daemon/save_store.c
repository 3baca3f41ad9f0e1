/* A save's memory: lookup, creation and teardown, the finished results kept for late waits, status figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "save_guard.h"
#include "save_int.h"
#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * Lookup
 * ------------------------------------------------------------------------ */
sd_save *sd_save_find(sd_daemon *d, const char *id) {
  for (sd_save *s = d->saves; s; s = s->next)
    if (strcmp(s->id, id) == 0) return s;
  return NULL;
}

int sd_save_alive(sd_daemon *d, const sd_save *save) {
  for (sd_save *s = d->saves; s; s = s->next)
    if (s == save) return 1;
  return 0;
}

/* shardd.save derives a save's id from its dir ("runs:step-3", or a readable part and a hash):
 * an id alone means little to a user who only ever named the dir, so a message that names the
 * save by its id names the dir beside it. The message is cut, if it must be, at its end. */
void sd_save_err_dir(const sd_save *save, sd_error *err) {
  char needle[160], dir_named[240];
  snprintf(needle, sizeof needle, "save '%.128s'", save->id);
  snprintf(dir_named, sizeof dir_named, "dir '%.200s", save->dir);
  char *at = strstr(err->msg, needle);
  if (!at || strncmp(at + strlen(needle), " (dir '", 7) == 0 || strstr(err->msg, dir_named)) return;
  at += strlen(needle);
  char rest[SD_ERRMSG_MAX];
  snprintf(rest, sizeof rest, "%s", at);
  size_t head = (size_t)(at - err->msg);
  snprintf(at, sizeof err->msg - head, " (%s')%s", dir_named, rest);
}

const sd_save_result *sd_save_history_find(sd_daemon *d, const char *id) {
  for (size_t k = 0; k < d->hist_len; k++) {
    size_t i = (d->hist_head + d->hist_cap - 1 - k) % d->hist_cap; /* newest first */
    if (strcmp(d->history[i].id, id) == 0) return &d->history[i];
  }
  return NULL;
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

void sd_save_free(sd_save *save) {
  sd_save_inline_release(save);
  if (save->cl) {
    save->d->multi_node->detach(save);
    save->cl = NULL;
  }
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
  for (size_t i = 0; i < save->nseries; i++) free(save->series[i]);
  free(save);
}

sd_save *sd_save_new(sd_daemon *d, const sd_begin_args *a) {
  sd_save *save = calloc(1, sizeof *save);
  if (!save) return NULL;
  save->d = d;
  save->id = strdup(a->save);
  save->dir = strdup(a->dir);
  save->prefix = strdup(a->prefix ? a->prefix : SD_DEFAULT_PREFIX);
  save->world_size = a->world_size;
  save->max_shard_size = a->max_shard_size ? a->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  save->overwrite = a->overwrite;
  save->keep_last = a->keep_last;
  save->total_parameters = a->total_parameters;
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
    sd_save_free(save);
    return NULL;
  }
  save->t_begin = uv_hrtime();
  return save;
}

uint64_t sd_save_now_ms(void) { return uv_hrtime() / 1000000u; }

void sd_save_touch(sd_save *save) { save->t_active_ms = sd_save_now_ms(); }

/* ------------------------------------------------------------------------ *
 * Finished saves, newest last
 * ------------------------------------------------------------------------ */
void sd_save_history_push(sd_daemon *d, sd_save_result *r) {
  if (d->hist_cap == 0) {
    d->hist_cap = d->cfg && d->cfg->keep_results ? d->cfg->keep_results : 64;
    d->history = calloc(d->hist_cap, sizeof *d->history);
    if (!d->history) {
      d->hist_cap = 0;
      free(r->id);
      free(r->dir);
      free(r->began);
      return;
    }
  }
  sd_save_result *slot = &d->history[d->hist_head];
  if (d->hist_len == d->hist_cap) {
    free(slot->id);
    free(slot->dir);
    free(slot->began);
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
    free(d->history[i].began);
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

void sd_save_unlink(sd_daemon *d, sd_save *save) {
  for (sd_save **pp = &d->saves; *pp; pp = &(*pp)->next) {
    if (*pp == save) {
      *pp = save->next;
      d->nsaves--;
      return;
    }
  }
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

uint64_t sd_save_bytes_zero_copy(const sd_save *save) {
  if (save->cl) return save->d->multi_node->bytes_zero_copy(save);
  return save->pub ? sd_publish_bytes_zero_copy(save->pub) : save->bytes_zero_copy;
}

uint64_t sd_save_bytes_gathered(const sd_save *save) {
  if (save->cl) return 0;
  return save->pub ? sd_publish_bytes_gathered(save->pub) : save->bytes_gathered;
}

const char *sd_save_state_name(const sd_save *save) {
  switch (save->state) {
    case SD_SAVE_OPEN: return save->ndeclared == save->world_size ? "planning" : "open";
    case SD_SAVE_WRITING: return "writing";
    case SD_SAVE_FAILING: return "failing";
  }
  return "unknown";
}
