/* What every role of a multi-node save shares: names, ids, local delivery, failed-save memory, a node save's way out. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_int.h"
#include "log.h"
#include "pathsafe.h"

/* ------------------------------------------------------------------------ *
 * Names, ids, paths
 * ------------------------------------------------------------------------ */
/* Characters outside [A-Za-z0-9._-] become '_', so a node name makes a plain file name part. */
static void clean_name(char *dst, size_t n, const char *src, size_t max) {
  size_t k = 0;
  for (size_t i = 0; src[i] && i < max && k + 1 < n; i++) {
    char c = src[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
             c == '_' || c == '-';
    dst[k++] = ok ? c : '_';
  }
  dst[k] = '\0';
}

/* ".shardd-tmp-@NODE@": the folders this node creates start with it, so a
 * restarted daemon removes its own leftovers and nobody else's. */
void sd_cl_tmp_tag(const char *node, char *out, size_t n) {
  char clean[80];
  clean_name(clean, sizeof clean, node, 64);
  snprintf(out, n, ".shardd-tmp-@%s@", clean);
}

/* "TAG-BASE-SAVE-": what every temporary folder of this save made by the node named tag starts with. */
static void tmp_stem(const char *tag, const char *dir, const char *save_id, char *out, size_t n) {
  const char *slash = strrchr(dir, '/');
  const char *base = slash ? slash + 1 : dir;
  char b[100], s[70];
  clean_name(b, sizeof b, base, 64); /* the whole name stays under NAME_MAX */
  clean_name(s, sizeof s, save_id, 64);
  snprintf(out, n, "%s-%s-%s-", tag, b, s);
}

char *sd_cl_tmp_name(sd_cluster *cl, const char *dir, const char *save_id) {
  char stem[SD_PEER_NAME_MAX + 32 + 100 + 70], out[sizeof stem + 48];
  tmp_stem(cl->tmp_tag, dir, save_id, stem, sizeof stem);
  snprintf(out, sizeof out, "%s%ld-%llu", stem, (long)getpid(), (unsigned long long)++cl->tmp_counter);
  return strdup(out);
}

/* Decimal digits up to the end or a '-'; the position after them, or NULL when none. */
static const char *digits(const char *p) {
  const char *q = p;
  while (*q >= '0' && *q <= '9') q++;
  return q == p || q - p > 20 ? NULL : q;
}

int sd_cl_tmp_is_for(const char *leader, const char *dir, const char *save_id, const char *tmp) {
  char tag[SD_PEER_NAME_MAX + 32], stem[SD_PEER_NAME_MAX + 32 + 100 + 70];
  sd_cl_tmp_tag(leader, tag, sizeof tag);
  tmp_stem(tag, dir, save_id, stem, sizeof stem);
  size_t n = strlen(stem);
  if (strncmp(tmp, stem, n) != 0) return 0;
  const char *p = digits(tmp + n);
  if (!p || *p != '-') return 0;
  p = digits(p + 1);
  return p && *p == '\0';
}

char *sd_cl_final_path(sd_cluster *cl, const char *dir) {
  const char *root = cl->d->cfg->root;
  size_t rl = strlen(root);
  while (rl > 1 && root[rl - 1] == '/') rl--;
  size_t n = rl + 1 + strlen(dir) + 1;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%.*s%s%s", (int)rl, root, root[rl - 1] == '/' ? "" : "/", dir);
  return p;
}

void sd_cl_random_id(char out[17]) {
  uint8_t b[8];
  if (sd_peer_random(b, sizeof b) != 0) {
    /* Uniqueness, not secrecy, is what these ids need. */
    uint64_t t = uv_hrtime() ^ (uint64_t)getpid() << 32;
    memcpy(b, &t, sizeof b);
  }
  sd_peer_hex(b, sizeof b, out);
}

sd_csave *sd_cl_find_csave(sd_cluster *cl, const char *save_id) {
  sd_save *s = save_id ? sd_save_find(cl->d, save_id) : NULL;
  return s ? s->cl : NULL;
}

/* ------------------------------------------------------------------------ *
 * Local delivery between this daemon's participant and its leader: queued
 * here, drained by the dispatcher (cluster.c) that set cl->lq_drain.
 * ------------------------------------------------------------------------ */
void sd_cl_local_send(sd_cluster *cl, int to_lead, json_t *hdr, const void *payload, size_t plen) {
  sd_lmsg *m = calloc(1, sizeof *m);
  uint8_t *copy = plen ? malloc(plen) : NULL;
  if (!m || (plen && !copy)) {
    free(m);
    free(copy);
    json_decref(hdr);
    sd_log_error("out of memory queueing a message between this daemon's node and leader roles");
    return;
  }
  if (plen) memcpy(copy, payload, plen);
  m->hdr = hdr;
  m->payload = copy;
  m->plen = plen;
  m->to_lead = to_lead;
  *cl->lqtail = m;
  cl->lqtail = &m->next;
  if (!cl->lq_active) {
    cl->lq_active = 1;
    uv_idle_start(&cl->lq_idle, cl->lq_drain);
  }
}

void sd_cl_maybe_free(sd_cluster *cl) {
  if (cl->shutting && cl->idle_closed == 2 && !cl->leads) free(cl);
}

/* ------------------------------------------------------------------------ *
 * Recently failed saves. A rank that begins a save its node just failed is
 * either retrying (it had begun the failed attempt: a new save starts) or
 * late (it had not: it gets the failure instead of waiting for ranks that
 * already gave up).
 * ------------------------------------------------------------------------ */
void sd_cl_failed_free(sd_cfailed *f) {
  free(f->id);
  free(f->began);
  free(f);
}

sd_cfailed **sd_cl_failed_find(sd_cluster *cl, const char *id) {
  uint64_t now = uv_now(cl->d->loop);
  for (sd_cfailed **pp = &cl->failed; *pp;) {
    sd_cfailed *f = *pp;
    if (now >= f->until) {
      *pp = f->next;
      sd_cl_failed_free(f);
      continue;
    }
    if (strcmp(f->id, id) == 0) return pp;
    pp = &f->next;
  }
  return NULL;
}

void sd_cl_remember_failure(sd_cluster *cl, const sd_save *save) {
  sd_cfailed **old = sd_cl_failed_find(cl, save->id);
  if (old) {
    sd_cfailed *f = *old;
    *old = f->next;
    sd_cl_failed_free(f);
  }
  sd_cfailed *f = calloc(1, sizeof *f);
  if (!f) return;
  f->id = strdup(save->id);
  f->began = calloc(save->world_size, 1);
  if (!f->id || !f->began) {
    sd_cl_failed_free(f);
    return;
  }
  f->world_size = save->world_size;
  for (uint32_t r = 0; r < save->world_size; r++) f->began[r] = save->ranks[r].state != SD_RANK_NONE;
  f->err = save->err;
  f->until = uv_now(cl->d->loop) + SD_LEAD_FORGET_FACTOR * sd_peer_net_timeout(cl->net);
  f->next = cl->failed;
  cl->failed = f;
}

/* ------------------------------------------------------------------------ *
 * Failing from inside: the save must outlive the call, so an I/O reference
 * is held around it; the caller then checks whether it was the last.
 * ------------------------------------------------------------------------ */
static int fail_err_held(sd_csave *cs, sd_error *e) {
  cs->io++;
  sd_save_fail_err(cs->save, e);
  cs->io--;
  if (cs->io == 0) {
    sd_node_finish_failed(cs); /* frees cs */
    return 1;
  }
  return 0;
}

int sd_node_fail_held(sd_csave *cs, int code, const char *fmt, ...) {
  sd_error e;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&e, code, fmt, ap);
  va_end(ap);
  return fail_err_held(cs, &e);
}

/* 1 when this node's temporary folder, or one of its files, is gone from under its writes. Only
 * a withdrawal removes them while the save runs (another node lost the leader after its done and
 * took the folder away, cluster_outcome.c) or the leader's clean-up of a save it failed. A stat a
 * file, on a failure path only. */
static int folder_gone(const sd_csave *cs) {
  struct stat st;
  if (cs->tmp_fd < 0) return 0;
  if (fstat(cs->tmp_fd, &st) == 0 && st.st_nlink == 0) return 1;
  for (size_t i = 0; i < cs->nfiles; i++)
    if (fstatat(cs->tmp_fd, cs->fnames[i], &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) return 1;
  return 0;
}

int sd_node_fail_io(sd_csave *cs, int code, const char *fmt, ...) {
  if (cs->stalled) return 0; /* waiting for the leader's word already */
  sd_error e;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&e, code, fmt, ap);
  va_end(ap);
  if (cs->failing || !folder_gone(cs)) return fail_err_held(cs, &e);
  /* Failing here would tell this node's ranks a consequence (an open's ENOENT) for the cause, which
   * only the leader knows, or its loss tells (peer_lost). */
  sd_node_await_leader(cs, e.code, e.msg, "; the temporary folder is gone");
  return 0;
}

void sd_node_await_leader(sd_csave *cs, int code, const char *why, const char *context) {
  cs->stalled = 1;
  sd_log_info("save '%s': %s%s; waiting for the leader's word", cs->save->id, why, context);
  sd_node_to_leader(cs, json_pack("{s:s,s:s,s:s}", "t", "fail", "code", sd_err_name(code), "message", why));
}

/* ------------------------------------------------------------------------ *
 * To the leader
 * ------------------------------------------------------------------------ */
void sd_node_to_leader(sd_csave *cs, json_t *m) {
  if (!m) return;
  json_object_set_new(m, "save", json_string(cs->save->id));
  json_object_set_new(m, "tok", json_string(cs->tok));
  json_object_set_new(m, "node", json_integer(cs->node_rank));
  if (cs->is_leader)
    sd_cl_local_send(cs->cl, 1, m, NULL, 0);
  else if (cs->link)
    sd_peer_send(cs->link, m, NULL, 0); /* a closing link fails the save from on_lost */
  else
    json_decref(m);
}

/* ------------------------------------------------------------------------ *
 * The end of a node's save
 * ------------------------------------------------------------------------ */
void sd_node_close_files(sd_csave *cs) {
  if (cs->fds) sd_fdpool_unwait(sd_fdset_pool(cs->fds), &cs->fdwait);
  sd_fdset_free(cs->fds);
  cs->fds = NULL;
  if (cs->tmp_fd >= 0) close(cs->tmp_fd);
  cs->tmp_fd = -1;
}

typedef struct {
  uv_work_t req;
  int parent_fd;
  char *tmp;
  sd_error err;
} rmjob;

static void rm_work(uv_work_t *req) {
  rmjob *j = req->data;
  sd_path_remove_tree(j->parent_fd, j->tmp, &j->err);
}

static void rm_done(uv_work_t *req, int status) {
  (void)status;
  rmjob *j = req->data;
  if (j->err.code) sd_log_warn("removing %s: %s", j->tmp, j->err.msg);
  close(j->parent_fd);
  free(j->tmp);
  free(j);
}

/* The leader is gone and never heard that we finished, so it cannot be
 * renaming the folder: removing it is safe, and nobody else will. */
void sd_node_remove_orphan_tmp(sd_csave *cs) {
  if (!cs->leader_lost || cs->done_sent || !cs->tmp || cs->parent_fd < 0) return;
  rmjob *j = calloc(1, sizeof *j);
  if (!j) return;
  j->parent_fd = dup(cs->parent_fd);
  j->tmp = strdup(cs->tmp);
  j->req.data = j;
  if (j->parent_fd < 0 || !j->tmp || uv_queue_work(cs->cl->d->loop, &j->req, rm_work, rm_done) != 0) {
    if (j->parent_fd >= 0) close(j->parent_fd);
    free(j->tmp);
    free(j);
    return;
  }
  sd_log_info("save '%s': the leader was lost; removing its temporary folder %s", cs->save->id, cs->tmp);
}

void sd_node_finish_failed(sd_csave *cs) {
  sd_node_close_files(cs);
  sd_node_remove_orphan_tmp(cs);
  sd_save *save = cs->save;
  sd_error e = save->err;
  sd_save_finish(save, &e, NULL);
}

sd_cdest *sd_node_dest(sd_csave *cs, uint32_t node) {
  for (size_t i = 0; i < cs->ndests; i++)
    if (cs->dests[i].node == node) return &cs->dests[i];
  return NULL;
}
