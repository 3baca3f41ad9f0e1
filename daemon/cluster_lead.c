/* The leader of a multi-node save: gathers manifests, plans, assigns, waits for every node's report, publishes. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_lead_int.h"
#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "publish.h"
#include "sd_base64.h"
#include "sd_msg.h"

static void lead_fail(sd_lead *L, const sd_error *e);
static void lead_failf(sd_lead *L, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------------ *
 * To the nodes
 * ------------------------------------------------------------------------ */
static void to_node(sd_lead *L, uint32_t k, json_t *m, const void *payload, size_t plen) {
  lnode *n = &L->nodes[k];
  if (!m) return;
  if (!n->joined || L->cl->shutting || (!n->local && !n->link)) {
    json_decref(m);
    return;
  }
  json_object_set_new(m, "save", json_string(L->id));
  json_object_set_new(m, "tok", json_string(n->tok));
  json_object_set_new(m, "cid", json_string(L->cid));
  if (n->local)
    sd_cl_local_send(L->cl, 0, m, payload, plen);
  else
    sd_peer_send(n->link, m, payload, plen);
}

static void broadcast_abort(sd_lead *L) {
  for (uint32_t k = 0; k < L->nnodes; k++)
    to_node(L, k, json_pack("{s:s,s:s,s:s}", "t", "abort", "code", sd_err_name(L->err.code), "message", L->err.msg),
            NULL, 0);
}

static void fs_done(uv_work_t *req, int status);

static void start_job(sd_lead *L, int kind) {
  fsjob *j = calloc(1, sizeof *j);
  if (!j) {
    if (kind == JOB_CLEANUP) {
      sd_log_error("save '%s': out of memory; temporary folder %s left for the next start-up", L->id,
                   L->tmp ? L->tmp : "-");
      return;
    }
    lead_failf(L, SHARDD_E_NO_MEMORY, "save '%s': out of memory on the leader", L->id);
    return;
  }
  j->L = L;
  j->kind = kind;
  j->root_fd = L->cl->d->root_fd;
  L->busy = 1;
  if (sd_lead_fs_queue(L->cl->d->loop, j, fs_done) != 0) {
    L->busy = 0;
    free(j);
    if (kind != JOB_CLEANUP) lead_failf(L, SHARDD_E_INTERNAL, "save '%s': cannot queue file-system work", L->id);
  }
}

/* ------------------------------------------------------------------------ *
 * Failure: first error wins; every node hears it; the folder goes
 * ------------------------------------------------------------------------ */
static void lead_fail(sd_lead *L, const sd_error *e) {
  if (L->state == L_FAILED) return;
  if (L->state == L_FINISH) {
    /* Every node is done: the outcome is the rename's, not a lost peer's. */
    sd_log_warn("save '%s': %s (after every node finished; publishing goes on)", L->id, e->msg);
    return;
  }
  L->err = *e;
  L->state = L_FAILED;
  L->forget_at = uv_now(L->cl->d->loop) + SD_LEAD_FORGET_FACTOR * sd_peer_net_timeout(L->cl->net);
  sd_log_warn("save '%s' (leading %u nodes) failed (%s): %s", L->id, L->nnodes, sd_err_name(e->code), e->msg);
  broadcast_abort(L);
  if (L->busy) return; /* fs_done cleans up */
  if (L->tmp_made || L->created) start_job(L, JOB_CLEANUP);
  else sd_lead_release_plan(L);
}

static void lead_failf(sd_lead *L, int code, const char *fmt, ...) {
  sd_error e;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&e, code, fmt, ap);
  va_end(ap);
  lead_fail(L, &e);
}

/* ------------------------------------------------------------------------ *
 * Assignments
 * ------------------------------------------------------------------------ */
static void send_assign(sd_lead *L, uint32_t k) {
  const sd_cplan *P = &L->plan;
  size_t nf = P->plan.nfiles;
  json_t *files = json_array(), *writes = json_array(), *peers = json_object();
  size_t plen = 0;
  for (size_t f = 0; f < nf; f++) {
    uint64_t hdr = P->owner[f] == k ? P->plan.files[f].header_size : 0;
    uint64_t data = P->expect[(size_t)k * nf + f];
    if (!hdr && !data) continue;
    json_array_append_new(files, json_pack("{s:I,s:s,s:I,s:I,s:I}", "f", (json_int_t)f, "name", P->plan.files[f].name,
                                           "size", (json_int_t)P->plan.files[f].file_size, "hdr", (json_int_t)hdr,
                                           "data", (json_int_t)data));
    plen += hdr;
  }
  uint8_t *payload = malloc(plen ? plen : 1);
  if (!payload) {
    json_decref(files);
    json_decref(writes);
    json_decref(peers);
    lead_failf(L, SHARDD_E_NO_MEMORY, "save '%s': out of memory assigning node %u", L->id, k);
    return;
  }
  size_t at = 0;
  for (size_t f = 0; f < nf; f++) {
    if (P->owner[f] != k) continue;
    if (!P->plan.files[f].header_size && !P->expect[(size_t)k * nf + f]) continue;
    memcpy(payload + at, P->plan.files[f].header, P->plan.files[f].header_size);
    at += P->plan.files[f].header_size;
  }
  /* The writes are sorted by node: node k's are one run, found by bisection (64 nodes never scan 64 x all). */
  size_t lo = 0, hi = P->nwrites;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (P->writes[mid].node < k) lo = mid + 1;
    else hi = mid;
  }
  for (size_t i = lo; i < P->nwrites && P->writes[i].node == k; i++) {
    const sd_cwrite *w = &P->writes[i];
    json_t *e = json_array();
    json_array_append_new(e, json_integer((json_int_t)w->id));
    json_array_append_new(e, json_integer(w->file));
    json_array_append_new(e, json_integer((json_int_t)w->base));
    json_array_append_new(e, json_integer(w->dest));
    json_array_append_new(e, json_integer((json_int_t)w->len));
    if (w->part) json_array_append_new(e, json_integer(w->part)); /* one part of a merged box */
    json_array_append_new(writes, e);
  }
  for (uint32_t n = 0; n < L->nnodes; n++) {
    if (n == k) continue;
    char key[16];
    snprintf(key, sizeof key, "%u", n);
    json_object_set_new(peers, key, json_pack("{s:s,s:s}", "addr", L->nodes[n].addr, "name", L->nodes[n].name));
  }
  L->nodes[k].nfiles = json_array_size(files);
  json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:o}", "t", "assign", "tmp", L->tmp, "nfiles", (json_int_t)nf,
                        "write_mode", L->mode == SD_WRITE_SHARED ? "shared" : "owner", "files", files, "writes",
                        writes, "peers", peers);
  if (m && L->sums) json_object_set_new(m, "checksums", json_true());
  /* what commit will say: a node that loses this leader after its done may have to say it itself */
  if (m)
    json_object_set_new(m, "totals", json_pack("[I,I,I]", (json_int_t)P->nfiles_total, (json_int_t)P->ntensors,
                                               (json_int_t)P->total_bytes));
  to_node(L, k, m, payload, plen);
  free(payload);
}

static void after_prepare(sd_lead *L) {
  L->acct = calloc(L->plan.plan.nfiles ? L->plan.plan.nfiles : 1, sizeof *L->acct);
  if (!L->acct ||
      (L->plan.plan.checksums && !(L->sums = calloc(L->plan.plan.nfiles ? L->plan.plan.nfiles : 1, sizeof *L->sums)))) {
    lead_failf(L, SHARDD_E_NO_MEMORY, "save '%s': out of memory on the leader", L->id);
    return;
  }
  L->state = L_WRITE;
  const sd_cplan *P = &L->plan;
  uint64_t fwd = 0, local = 0;
  for (uint32_t k = 0; k < L->nnodes; k++) {
    fwd += P->fwd_bytes[k];
    local += P->local_bytes[k];
  }
  /* What coordinating this save cost the leader: the bench (bench_cluster) reads this line. */
  sd_log_info("save '%s': %zu tensors, %llu boxes from %u nodes in %llu bytes of manifest and table frames (%zu "
              "distinct tables); planned, folder made, in %.3f s", L->id, L->man.ntensors, (unsigned long long)L->man.nslices,
              L->nnodes, (unsigned long long)L->meta_bytes, L->ntables,
              (double)(uv_now(L->cl->d->loop) - L->t0) / 1000.0);
  sd_log_info("save '%s': planned %zu files over %u nodes (%s mode): %llu bytes written where they are held, %llu "
              "forwarded", L->id, P->plan.nfiles, L->nnodes, L->mode == SD_WRITE_SHARED ? "shared" : "owner",
              (unsigned long long)local, (unsigned long long)fwd);
  for (uint32_t k = 0; k < L->nnodes && L->state == L_WRITE; k++) send_assign(L, k);
}

static void commit(sd_lead *L) {
  const sd_cplan *P = &L->plan;
  double secs = (double)(uv_now(L->cl->d->loop) - L->t0) / 1000.0;
  uint64_t fwd = 0, written = 0, zero_copy = 0;
  for (uint32_t k = 0; k < L->nnodes; k++) {
    fwd += L->nodes[k].b_fwd;
    written += L->nodes[k].b_written;
    zero_copy += L->nodes[k].b_zero_copy;
  }
  /* Direct and copied: the sum over the nodes (each logs its own share when the commit reaches it). */
  sd_log_info("save '%s': published %s (%llu files, %llu bytes) from %u nodes, %llu bytes forwarded, %llu bytes "
              "direct, %llu copied, %.3f s after the last seal, %.3f s after the last done", L->id, L->dir,
              (unsigned long long)P->nfiles_total, (unsigned long long)P->total_bytes, L->nnodes,
              (unsigned long long)fwd, (unsigned long long)zero_copy,
              (unsigned long long)(written > zero_copy ? written - zero_copy : 0), secs,
              (double)(uv_now(L->cl->d->loop) - L->t_done) / 1000.0);
  for (uint32_t k = 0; k < L->nnodes; k++)
    to_node(L, k, json_pack("{s:s,s:I,s:I,s:I}", "t", "commit", "files", (json_int_t)P->nfiles_total, "tensors",
                            (json_int_t)P->ntensors, "bytes", (json_int_t)P->total_bytes),
            NULL, 0);
  sd_lead_free(L);
}

static void fs_done(uv_work_t *req, int status) {
  fsjob *j = req->data;
  sd_lead *L = j->L;
  sd_cluster *cl = L->cl;
  int kind = j->kind;
  sd_error err = j->err;
  free(j);
  L->busy = 0;
  if (status == UV_ECANCELED && !err.code) sd_fail(&err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  if (L->state == L_FAILED) {
    if (kind != JOB_CLEANUP && (L->tmp_made || L->created) && !L->renamed) {
      start_job(L, JOB_CLEANUP);
      return;
    }
    sd_lead_release_plan(L);
    if (cl->shutting) {
      sd_lead_free(L);
      sd_cl_maybe_free(cl);
    }
    return;
  }
  if (err.code) {
    if (kind == JOB_FINISH) L->state = L_WRITE; /* not published: fail it like any other error */
    lead_fail(L, &err);
    return;
  }
  if (kind == JOB_PREPARE) after_prepare(L);
  else if (kind == JOB_FINISH) commit(L);
  sd_cl_maybe_free(cl);
}

/* ------------------------------------------------------------------------ *
 * Messages from nodes
 * ------------------------------------------------------------------------ */
static void on_join(sd_cluster *cl, sd_lead *L, sd_peer *p, const char *id, const char *tok, uint32_t k, json_t *h) {
  sd_error err = {0};
  if (L && L->state == L_FAILED) {
    if (k < L->nnodes && L->nodes[k].joined) {
      /* This node was part of the failed attempt: it is trying again. */
      if (L->busy) {
        sd_log_warn("save '%s': node %u retries while the last attempt is still being cleaned up", id, k);
      } else {
        sd_lead_free(L);
        L = NULL;
      }
    }
    if (L) {
      /* A latecomer to a save that already failed: tell it why. */
      if (k < L->nnodes && !L->nodes[k].joined) {
        lnode *n = &L->nodes[k];
        n->joined = 1;
        n->local = p == NULL;
        n->link = p;
        snprintf(n->tok, sizeof n->tok, "%s", tok);
      }
      if (k < L->nnodes)
        to_node(L, k, json_pack("{s:s,s:s,s:s}", "t", "abort", "code", sd_err_name(L->err.code), "message", L->err.msg),
                NULL, 0);
      return;
    }
  }
  if (!L && sd_lead_room(cl, id, p ? sd_peer_name(p) : NULL, &err) != 0) {
    sd_log_warn("save '%s': refusing node %u: %s", id, k, err.msg);
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:s}", "t", "abort", "save", id, "tok", tok, "code",
                          sd_err_name(err.code), "message", err.msg);
    if (m && p) sd_peer_send(p, m, NULL, 0);
    else if (m) sd_cl_local_send(cl, 0, m, NULL, 0);
    return;
  }
  if (!L) {
    L = sd_lead_new(cl, id, h, &err);
    if (!L) {
      sd_log_warn("save '%s': refusing node %u: %s", id, k, err.msg);
      return;
    }
    L->t0 = L->t_join = uv_now(cl->d->loop);
    if (p) snprintf(L->begun_by, sizeof L->begun_by, "%s", sd_peer_name(p));
    sd_log_info("leading save '%s' (%u nodes, %u ranks, dir '%s')", id, L->nnodes, L->ws, L->dir);
  }
  if (k >= L->nnodes) {
    lead_failf(L, SHARDD_E_CONFLICT, "save '%s': a node joins as node_rank %u, outside nnodes %u", id, k, L->nnodes);
    return;
  }
  lnode *n = &L->nodes[k];
  if (n->joined) {
    /* Record nothing of the newcomer but tell everyone, itself included. */
    lead_failf(L, SHARDD_E_CONFLICT, "save '%s': two daemons claim node_rank %u (%s and %s)", id, k,
               n->addr[0] ? n->addr : "?", p ? sd_peer_addr(p) : "this daemon");
    return;
  }
  if ((k == 0) != (p == NULL)) {
    n->joined = 1;
    n->local = p == NULL;
    n->link = p;
    snprintf(n->tok, sizeof n->tok, "%s", tok);
    L->njoined++;
    lead_failf(L, SHARDD_E_CONFLICT, "save '%s': node_rank 0 must be the leader's own ranks, but %s claims node %u",
               id, p ? sd_peer_addr(p) : "this daemon", k);
    return;
  }
  n->joined = 1;
  n->local = p == NULL;
  n->link = p;
  snprintf(n->tok, sizeof n->tok, "%s", tok);
  json_t *owner = json_object_get(h, "owner_uid");
  if (!p && json_is_integer(owner) && json_integer_value(owner) >= 0) {
    /* Only this node's own uid means anything on this file system. */
    L->has_owner = 1;
    L->owner_uid = (uid_t)json_integer_value(owner);
  }
  const char *addr = p ? sd_peer_addr(p) : json_string_value(json_object_get(h, "leader"));
  snprintf(n->addr, sizeof n->addr, "%s", addr ? addr : "");
  snprintf(n->name, sizeof n->name, "%s", p ? sd_peer_name(p) : cl->node);
  L->njoined++;
  if (L->state != L_COLLECT) {
    lead_failf(L, SHARDD_E_CONFLICT, "save '%s': node %u joins after planning started", id, k);
    return;
  }
  if (sd_lead_join_differs(L, h, k, &err)) {
    lead_fail(L, &err);
    return;
  }
  if (p && !strchr(n->addr, ':')) {
    lead_failf(L, SHARDD_E_INVALID_ARGUMENT, "save '%s': node %u ('%s') does not listen for peers", id, k, n->name);
    return;
  }
  sd_log_debug("save '%s': node %u ('%s' at %s) joined (%u of %u)", id, k, n->name, n->addr, L->njoined, L->nnodes);
}

static void plan_now(sd_lead *L) {
  if (L->njoined < L->nnodes) {
    lead_failf(L, SHARDD_E_CONFLICT, "save '%s': all %u ranks sealed, but only %u of nnodes=%u nodes joined", L->id,
               L->ws, L->njoined, L->nnodes);
    return;
  }
  /* The leader's checksums setting decides for the save, the assignments tell the nodes; a node
   * too old to hash what it writes (its manifest does not say "sums") means none for this save. */
  int sums = L->cl->d->cfg ? L->cl->d->cfg->checksums : 1;
  for (uint32_t k = 0; sums && k < L->nnodes; k++) {
    if (L->nodes[k].sums) continue;
    sums = 0;
    sd_log_warn("save '%s': node %u ('%s') cannot hash what it writes (an older shardd): no checksums are recorded",
                L->id, k, L->nodes[k].name);
  }
  /* Planned in the thread pool (job_prepare), so a large plan never holds up heartbeats. */
  L->plan_sums = sums;
  L->tmp = sd_cl_tmp_name(L->cl, L->dir, L->id);
  if (!L->tmp) {
    lead_failf(L, SHARDD_E_NO_MEMORY, "save '%s': out of memory on the leader", L->id);
    return;
  }
  L->state = L_PREPARE;
  L->t0 = uv_now(L->cl->d->loop);
  start_job(L, JOB_PREPARE);
}

/* A manifest or table frame: boxes checked as they come; a table not seen yet asked of the node
 * that first names it; the plan once every rank's boxes are in. */
static void on_collect(sd_lead *L, sd_peer *p, uint32_t k, json_t *h, int table) {
  sd_error err = {0};
  if (p) L->meta_bytes += sd_peer_frame_len(p);
  int ready = 0;
  int rc = table ? sd_lead_table(L, k, h, &ready, &err) : sd_lead_manifest(L, k, h, &ready, &err);
  if (rc) {
    lead_fail(L, &err);
    return;
  }
  uint32_t node;
  for (int i; (i = sd_lead_next_ask(L, &node)) >= 0;) {
    char hex[2 * SD_CTABLE_DIGEST + 1];
    sd_ctable_hex(L->tables[i].digest, hex);
    to_node(L, node, json_pack("{s:s,s:s}", "t", "send_table", "digest", hex), NULL, 0);
  }
  if (ready) plan_now(L);
}

/* Every node reported: each file's CRC from the XOR of the shares and its
 * data length, into the index (written by JOB_FINISH) or, for a single
 * file, into sum_hex for JOB_FINISH to write over its header's placeholder. */
static int put_sums(sd_lead *L) {
  sd_plan *plan = &L->plan.plan;
  for (size_t f = 0; f < plan->nfiles; f++)
    L->sums[f] = sd_crc32c_final(L->sums[f], plan->files[f].file_size - plan->files[f].header_size);
  if (plan->needs_index) {
    sd_error err;
    if (sd_index_put_sums(L->plan.index_json, L->plan.index_len, plan, L->sums, &err) != 0) {
      lead_fail(L, &err);
      return -1;
    }
  } else if (plan->nfiles == 1 && plan->files[0].sum_at) {
    sd_crc32c_hex(L->sums[0], L->sum_hex);
  }
  return 0;
}

static void on_done(sd_lead *L, uint32_t k, json_t *h) {
  if (L->state != L_WRITE || L->nodes[k].done) {
    lead_failf(L, SHARDD_E_INTERNAL, "save '%s': node %u reported out of turn", L->id, k);
    return;
  }
  const sd_cplan *P = &L->plan;
  json_t *files = json_object_get(h, "files");
  size_t nent = json_array_size(files);
  uint32_t *shares = L->sums ? malloc((nent ? nent : 1) * sizeof *shares) : NULL;
  if (L->sums && !shares) {
    lead_failf(L, SHARDD_E_NO_MEMORY, "save '%s': out of memory on the leader", L->id);
    return;
  }
  char why[SD_ERRMSG_MAX / 2];
  const char *bad = sd_cplan_done_mismatch(P, k, L->dir, files, json_object_get(h, "sums"), shares, why, sizeof why);
  if (bad) {
    free(shares);
    lead_failf(L, SHARDD_E_PROTOCOL, "save '%s': node %u ('%s', %s) reported %s", L->id, k, L->nodes[k].name,
               L->nodes[k].addr, bad);
    return;
  }
  for (size_t i = 0; i < nent; i++) {
    size_t f = (size_t)json_integer_value(json_array_get(json_array_get(files, i), 0));
    L->acct[f] += sd_cplan_assigned(P, k, f);
    if (shares) L->sums[f] ^= shares[i];
  }
  free(shares);
  lnode *n = &L->nodes[k];
  n->done = 1;
  n->b_local = (uint64_t)json_integer_value(json_object_get(h, "local"));
  n->b_fwd = (uint64_t)json_integer_value(json_object_get(h, "forwarded"));
  n->b_recv = (uint64_t)json_integer_value(json_object_get(h, "received"));
  n->b_written = (uint64_t)json_integer_value(json_object_get(h, "written")); /* 0 from an older node */
  n->b_zero_copy = (uint64_t)json_integer_value(json_object_get(h, "direct")); /* the wire keeps "direct": older peers send it */
  L->ndone++;
  sd_log_debug("save '%s': node %u is durable (%u of %u)", L->id, k, L->ndone, L->nnodes);
  if (L->ndone < L->nnodes) return;
  /* Every byte of every file written once, by the node the plan gave it to. */
  for (size_t f = 0; f < P->plan.nfiles; f++)
    if (L->acct[f] != P->plan.files[f].file_size) {
      lead_failf(L, SHARDD_E_INTERNAL, "save '%s': the nodes wrote %llu of the %llu bytes of %s/%s", L->id,
                 (unsigned long long)L->acct[f], (unsigned long long)P->plan.files[f].file_size, L->dir,
                 P->plan.files[f].name);
      return;
    }
  L->t_done = uv_now(L->cl->d->loop);
  if (L->sums && put_sums(L) != 0) return;
  L->state = L_FINISH;
  start_job(L, JOB_FINISH);
}

void sd_lead_on_msg(sd_cluster *cl, sd_peer *p, json_t *h, uint8_t *payload, size_t plen) {
  (void)plen;
  free(payload);
  const char *t = json_string_value(json_object_get(h, "t"));
  const char *id = json_string_value(json_object_get(h, "save"));
  const char *tok = json_string_value(json_object_get(h, "tok"));
  json_t *jk = json_object_get(h, "node");
  sd_error e;
  if (!t || !id || sd_save_id_check(id, &e) || !tok || strlen(tok) != 16 || !json_is_integer(jk) ||
      json_integer_value(jk) < 0 || json_integer_value(jk) >= SD_NNODES_MAX) {
    sd_log_warn("peer %s: malformed '%.40s' message; ignored", p ? sd_peer_addr(p) : "(local)", t ? t : "?");
    json_decref(h);
    return;
  }
  uint32_t k = (uint32_t)json_integer_value(jk);
  sd_lead *L = sd_lead_find(cl, id);
  if (!strcmp(t, "join")) {
    on_join(cl, L, p, id, tok, k, h);
    json_decref(h);
    return;
  }
  /* Everything else must come from the node that joined, on its connection. */
  if (!L || L->state == L_FAILED || k >= L->nnodes || !L->nodes[k].joined || strcmp(L->nodes[k].tok, tok) != 0 ||
      (p ? L->nodes[k].link != p : !L->nodes[k].local)) {
    sd_log_debug("save '%s': dropping '%.40s' from node %u (no such attempt in flight)", id, t, k);
    json_decref(h);
    return;
  }
  if (!strcmp(t, "manifest") || !strcmp(t, "table")) {
    on_collect(L, p, k, h, t[0] == 't');
  } else if (!strcmp(t, "began")) {
    json_t *jr = json_object_get(h, "rank");
    json_int_t r = json_is_integer(jr) ? json_integer_value(jr) : -1;
    if (r >= 0 && r < (json_int_t)L->ws && !L->began[r]) {
      L->began[r] = 1;
      L->nbegan++;
    }
  } else if (!strcmp(t, "done")) {
    on_done(L, k, h);
  } else if (!strcmp(t, "fail")) {
    const char *code = json_string_value(json_object_get(h, "code"));
    const char *msg = json_string_value(json_object_get(h, "message"));
    sd_error err;
    int c = code ? sd_err_from_name(code) : SHARDD_E_INTERNAL;
    sd_fail(&err, c == SHARDD_E_PROTOCOL ? SHARDD_E_INTERNAL : c, "%s", msg ? msg : "a node failed the save");
    lead_fail(L, &err);
  }
  json_decref(h);
}

/* ------------------------------------------------------------------------ *
 * Lost nodes, shutdown
 * ------------------------------------------------------------------------ */
void sd_lead_peer_lost(sd_cluster *cl, sd_peer *p, int code, const char *why) {
  (void)why;
  for (sd_lead *L = cl->leads, *next; L; L = next) {
    next = L->next;
    for (uint32_t k = 0; k < L->nnodes; k++) {
      lnode *n = &L->nodes[k];
      if (n->link != p) continue;
      n->link = NULL;
      if (L->state == L_FAILED) continue;
      if (code == SHARDD_E_PEER_LOST || code == SHARDD_E_SHUTTING_DOWN)
        lead_failf(L, SHARDD_E_PEER_LOST, "node %u (%s) was lost during save '%s'", k, n->addr, L->id);
      else
        lead_failf(L, code, "save '%s': node %u (%s): %s", L->id, k, n->addr, why);
    }
  }
}

/* "nodes 1, 2" or "ranks 4, 5": the first few indices i < n with missing(i), and how many more. */
static void missing_list(const sd_lead *L, int nodes, char *out, size_t size) {
  uint32_t n = nodes ? L->nnodes : L->ws, c = 0, shown = 0;
  for (uint32_t i = 0; i < n; i++) c += nodes ? !L->nodes[i].joined : !L->began[i];
  size_t k = (size_t)snprintf(out, size, "%s%s ", nodes ? "node" : "rank", c == 1 ? "" : "s");
  for (uint32_t i = 0; i < n && k < size; i++) {
    if (nodes ? L->nodes[i].joined : L->began[i]) continue;
    if (shown == 16) {
      snprintf(out + k, size - k, " and %u more", c - shown);
      break;
    }
    k += (size_t)snprintf(out + k, size - k, "%s%u", shown++ ? ", " : "", i);
  }
}

void sd_lead_tick(sd_cluster *cl) {
  uint64_t now = uv_now(cl->d->loop);
  char who[512];
  for (sd_lead *L = cl->leads, *next; L; L = next) {
    next = L->next;
    if (L->state != L_COLLECT || !L->join_timeout || now - L->t_join < (uint64_t)L->join_timeout * 1000u) continue;
    if (L->njoined < L->nnodes) {
      /* Their daemons may be up (peer_timeout never fires): their trainers never came. */
      missing_list(L, 1, who, sizeof who);
      lead_failf(L, SHARDD_E_TIMEOUT, "save '%s': %s of %u never began within join_timeout %u s", L->id, who,
                 L->nnodes, L->join_timeout);
    } else if (L->nbegan < L->ws) {
      missing_list(L, 0, who, sizeof who);
      lead_failf(L, SHARDD_E_TIMEOUT, "save '%s': %s of %u never began within join_timeout %u s (every node did)",
                 L->id, who, L->ws, L->join_timeout);
    }
  }
}

void sd_lead_shutdown(sd_cluster *cl) {
  for (sd_lead *L = cl->leads, *next; L; L = next) {
    next = L->next;
    if (L->state != L_FAILED)
      lead_failf(L, SHARDD_E_SHUTTING_DOWN, "save '%s': the leader is shutting down; nothing was published", L->id);
    for (uint32_t k = 0; k < L->nnodes; k++) L->nodes[k].link = NULL;
  }
  /* What is not busy goes now; a running job frees its save when it returns. */
  for (sd_lead *L = cl->leads, *next; L; L = next) {
    next = L->next;
    if (L->busy) continue;
    fsjob j = {.L = L, .kind = JOB_CLEANUP, .root_fd = cl->d->root_fd};
    sd_lead_fs_cleanup(&j);
    sd_lead_free(L);
  }
}
