/* A node's part of a multi-node save: join, report slices, take the assignment, commit or fail; bytes in cluster_xfer.c. */
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
#include "owner.h"
#include "pathsafe.h"
#include "publish.h"
#include "sd_escape.h"
#include "sd_grow.h"
#include "sd_msg.h"
#include "writer.h"


static const char *mode_str(sd_write_mode m) { return m == SD_WRITE_SHARED ? "shared" : "owner"; }

/* ------------------------------------------------------------------------ *
 * begin: join the leader
 * ------------------------------------------------------------------------ */
int sd_node_begin(sd_save *save, const sd_begin_args *a, sd_csave **out, sd_error *err) {
  sd_cluster *cl = save->d->cluster;
  if (strlen(a->leader) >= SD_PEER_ADDR_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'leader' is too long");
  sd_csave *cs = calloc(1, sizeof *cs);
  if (!cs) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for save '%s'", a->save);
  cs->save = save;
  cs->cl = cl;
  cs->nnodes = a->nnodes;
  cs->node_rank = a->node_rank;
  snprintf(cs->leader, sizeof cs->leader, "%s", a->leader);
  cs->mode = (sd_write_mode)a->write_mode;
  cs->is_leader = a->node_rank == 0;
  cs->parent_fd = cs->tmp_fd = -1;
  cs->reported = calloc(save->world_size, 1);
  if (!cs->reported) {
    free(cs);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for save '%s'", a->save);
  }
  sd_cl_random_id(cs->tok);
  if (!cs->is_leader) {
    cs->link = sd_peer_connect(cl->net, cs->leader, err);
    if (!cs->link) {
      free(cs->reported);
      free(cs);
      return err->code;
    }
  }
  *out = cs;
  json_t *md = json_object();
  for (size_t i = 0; i < save->nmetadata; i++)
    json_object_set_new(md, save->metadata[i].key, json_string(save->metadata[i].value));
  json_t *j = json_pack("{s:s,s:i,s:i,s:s,s:s,s:I,s:b,s:s,s:s,s:o,s:I}", "t", "join", "nnodes", (int)cs->nnodes,
                        "world_size", (int)save->world_size, "dir", save->dir, "prefix", save->prefix,
                        "max_shard_size", (json_int_t)save->max_shard_size, "overwrite", save->overwrite,
                        "write_mode", mode_str(cs->mode), "leader", cs->leader, "metadata", md, "owner_uid",
                        (json_int_t)save->owner_uid);
  /* Only when set, so a leader of an older build sees the join it knows. */
  if (save->keep_last) json_object_set_new(j, "keep_last", json_integer(save->keep_last));
  if (save->total_parameters >= 0) json_object_set_new(j, "total_parameters", json_integer(save->total_parameters));
  if (j) json_object_set_new(j, "join_timeout", json_integer(save->join_timeout));
  sd_node_to_leader(cs, j);
  sd_log_debug("save '%s': node %u of %u, leader %s%s", save->id, cs->node_rank, cs->nnodes, cs->leader,
               cs->is_leader ? " (this daemon)" : "");
  return 0;
}

/* ------------------------------------------------------------------------ *
 * The end
 * ------------------------------------------------------------------------ */
int sd_node_fail(sd_csave *cs) {
  if (cs->failing) return cs->io > 0;
  cs->failing = 1;
  sd_save *save = cs->save;
  if (!cs->from_leader)
    sd_node_to_leader(cs, json_pack("{s:s,s:s,s:s}", "t", "fail", "code", sd_err_name(save->err.code), "message",
                            save->err.msg));
  for (sd_rbuf *r = cs->pending; r;) {
    sd_rbuf *n = r->next;
    json_decref(r->hdr);
    free(r->data);
    free(r);
    r = n;
  }
  cs->pending = NULL;
  sd_xfer_drop_waiting(cs);
  /* The file set of its own blocks sees the stop only when the writer polls it, and an idle one is
   * polled by nothing else: a failure from outside it (a mixed block's rank, the leader) left it, and
   * the save, waiting forever. */
  if (cs->staged && cs->cl->d->writer) sd_writer_kick(cs->cl->d->writer);
  if (cs->io > 0) return 1;
  sd_node_close_files(cs);
  sd_node_remove_orphan_tmp(cs);
  return 0; /* nothing in flight: the core ends the save right away */
}

void sd_node_free(sd_csave *cs) {
  if (!cs) return;
  if (cs->save->err.code && !cs->cl->shutting) sd_cl_remember_failure(cs->cl, cs->save);
  if (cs->io) sd_log_error("save '%s': freed with %u writes in flight", cs->save->id, cs->io);
  sd_xfer_drop_waiting(cs);
  sd_node_close_files(cs);
  if (cs->parent_fd >= 0) close(cs->parent_fd);
  for (size_t i = 0; i < cs->nfiles; i++) {
    free(cs->files[i].name);
    free(cs->files[i].own);
  }
  free(cs->files);
  free(cs->fnames);
  free(cs->sync_q);
  for (size_t i = 0; i < cs->ndests; i++) free(cs->dests[i].runs);
  free(cs->dests);
  for (sd_rbuf *r = cs->pending; r;) {
    sd_rbuf *n = r->next;
    json_decref(r->hdr);
    free(r->data);
    free(r);
    r = n;
  }
  free(cs->fmap);
  free(cs->sums);
  free(cs->hdrs);
  free(cs->ops);
  free(cs->slices);
  free(cs->boxes);
  sd_node_tables_free(cs);
  free(cs->reported);
  free(cs->tmp);
  free(cs);
}

/* ------------------------------------------------------------------------ *
 * The assignment: which files this node writes, and where each of its slices goes
 * ------------------------------------------------------------------------ */
typedef struct {
  sd_csave *cs;
  uint32_t dest;           /* node_rank */
  uint32_t f, lf;
  uint64_t size;
  const uint8_t *src;
  int oom, bad;
} runctx;

static int add_run(void *ud, uint64_t dst, uint64_t src, uint64_t len) {
  runctx *c = ud;
  sd_csave *cs = c->cs;
  if (len == 0) return 0;
  if (dst > c->size || len > c->size - dst) {
    c->bad = 1;
    return -1;
  }
  if (c->dest == cs->node_rank) {
    if (cs->nops % 1024 == 0) {
      sd_lop *n = realloc(cs->ops, (cs->nops + 1024) * sizeof *n);
      if (!n) {
        c->oom = 1;
        return -1;
      }
      cs->ops = n;
    }
    cs->ops[cs->nops++] = (sd_lop){.lf = c->lf, .off = dst, .src = c->src + src, .len = len};
    return 0;
  }
  sd_cdest *d = sd_node_dest(cs, c->dest);
  if (SD_GROW(d->runs, d->cap, d->nruns + 1, 256)) {
    c->oom = 1;
    return -1;
  }
  /* Adjacent runs of one file merge into one. */
  if (d->nruns > 0) {
    sd_fop *last = &d->runs[d->nruns - 1];
    if (last->f == c->f && last->off + last->len == dst && last->src + last->len == c->src + src) {
      last->len += len;
      d->total += len;
      return 0;
    }
  }
  d->runs[d->nruns++] = (sd_fop){.f = c->f, .off = dst, .src = c->src + src, .len = len};
  d->total += len;
  return 0;
}

static int json_u64(json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* The leader's folder (or a file in it) is not there: only a failed save
 * removes it, so this is a consequence, not the cause. */
#define GONE 1

/* Opens the temporary folder the leader made and the files this node writes. */
static int open_files(sd_csave *cs, json_t *files, size_t plen, char *why, size_t wn) {
  sd_save *save = cs->save;
  sd_error e = {0};
  unsigned created = 0;
  const char *base = NULL;
  if (sd_path_open_parent(save->d->root_fd, save->dir, 0, &cs->parent_fd, &created, &base, &e) != 0) {
    snprintf(why, wn, "%s", e.msg);
    return SHARDD_E_IO;
  }
  cs->tmp_fd = sd_openat_beneath(cs->parent_fd, cs->tmp, O_RDONLY | O_DIRECTORY, 0);
  if (cs->tmp_fd < 0) {
    snprintf(why, wn, "cannot open the temporary folder %s beside '%s': %s", cs->tmp, save->dir, strerror(-cs->tmp_fd));
    return cs->tmp_fd == -ENOENT ? GONE : SHARDD_E_IO;
  }
  /* A folder with a recorded owner was published: no assignment writes into one. */
  uid_t owner;
  if (sd_owner_read(cs->tmp_fd, &owner) == 1) {
    snprintf(why, wn, "the assignment's temporary folder %s beside '%s' is a committed checkpoint (owner uid %u)",
             cs->tmp, save->dir, (unsigned)owner);
    free(cs->tmp); /* never removed as an orphan either */
    cs->tmp = NULL;
    return SHARDD_E_PROTOCOL;
  }
  size_t n = json_array_size(files);
  cs->files = calloc(n ? n : 1, sizeof *cs->files);
  cs->fnames = calloc(n ? n : 1, sizeof *cs->fnames);
  if (!cs->files || !cs->fnames) return SHARDD_E_NO_MEMORY;
  uint64_t hoff = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(files, i);
    sd_cfile *f = &cs->files[cs->nfiles];
    uint64_t fi = 0;
    const char *name = json_string_value(json_object_get(o, "name"));
    if (json_u64(json_object_get(o, "f"), &fi) || fi >= cs->plan_files || cs->fmap[fi] >= 0 || !name ||
        sd_path_check_name(name, &e) || json_u64(json_object_get(o, "size"), &f->size) ||
        json_u64(json_object_get(o, "hdr"), &f->hdr_len) || json_u64(json_object_get(o, "data"), &f->data) ||
        f->hdr_len > f->size || f->data > f->size - f->hdr_len || f->hdr_len > plen - hoff) {
      snprintf(why, wn, "file entry %zu is malformed", i);
      return SHARDD_E_PROTOCOL;
    }
    f->f = (uint32_t)fi;
    f->name = strdup(name);
    if (!f->name) return SHARDD_E_NO_MEMORY;
    cs->fnames[cs->nfiles] = f->name;
    cs->fmap[fi] = (int32_t)cs->nfiles++;
    /* There, and a file the leader made: opened only when written (sd_xfer_progress), so a node
     * holds no more descriptors than max_open_files allows, however many files it writes. */
    struct stat st;
    int bad = fstatat(cs->tmp_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (bad) {
      snprintf(why, wn, "cannot open %s/%s: %s", save->dir, name,
               bad == EINVAL ? "not a regular file" : strerror(bad));
      return bad == ENOENT ? GONE : sd_err_from_errno(bad);
    }
    hoff += f->hdr_len;
  }
  return sd_xfer_open(cs) ? SHARDD_E_NO_MEMORY : 0;
}

static int take_assignment(sd_csave *cs, json_t *h, uint8_t *payload, size_t plen, char *why, size_t wn) {
  const char *cid = json_string_value(json_object_get(h, "cid"));
  const char *tmp = json_string_value(json_object_get(h, "tmp"));
  json_t *files = json_object_get(h, "files"), *writes = json_object_get(h, "writes"),
         *peers = json_object_get(h, "peers");
  uint64_t nf = 0;
  sd_error e = {0};
  if (!cid || strlen(cid) != 16 || !tmp || sd_path_check_name(tmp, &e) || json_u64(json_object_get(h, "nfiles"), &nf) ||
      nf > (1u << 24) || !json_is_array(files) || !json_is_array(writes) || !json_is_object(peers)) {
    snprintf(why, wn, "the assignment is malformed");
    return SHARDD_E_PROTOCOL;
  }
  /* Whatever the leader says, this node writes into, and on losing it removes, only a temporary
   * folder of this save made by that leader: never a checkpoint, nor any other folder. */
  const char *leader = cs->is_leader || !cs->link ? cs->cl->node : sd_peer_name(cs->link);
  if (!sd_cl_tmp_is_for(leader, cs->save->dir, cs->save->id, tmp)) {
    sd_escbuf eb;
    snprintf(why, wn, "the assignment's temporary folder '%s' is not one of this save's (leader '%s')",
             sd_esc(&eb, tmp), leader);
    return SHARDD_E_PROTOCOL;
  }
  snprintf(cs->cid, sizeof cs->cid, "%s", cid);
  /* What the commit will say, for a node that has to learn the outcome itself (cluster_outcome.c). */
  json_t *tot = json_object_get(h, "totals");
  if (json_array_size(tot) == 3) {
    uint64_t v[3];
    if (!json_u64(json_array_get(tot, 0), &v[0]) && !json_u64(json_array_get(tot, 1), &v[1]) &&
        !json_u64(json_array_get(tot, 2), &v[2]))
      cs->r_files = v[0], cs->r_tensors = v[1], cs->r_bytes = v[2];
  }
  cs->tmp = strdup(tmp);
  cs->plan_files = (uint32_t)nf;
  cs->fmap = malloc((nf ? nf : 1) * sizeof *cs->fmap);
  cs->hdrs = payload;
  if (!cs->tmp || !cs->fmap) return SHARDD_E_NO_MEMORY;
  for (uint64_t i = 0; i < nf; i++) cs->fmap[i] = -1;
  int rc = open_files(cs, files, plen, why, wn);
  if (rc) return rc;
  /* The leader's checksums setting decides for every node (absent: an older leader, none). */
  if (json_is_true(json_object_get(h, "checksums")) &&
      !(cs->sums = calloc(cs->nfiles ? cs->nfiles : 1, sizeof *cs->sums)))
    return SHARDD_E_NO_MEMORY;

  size_t nw = json_array_size(writes);
  uint64_t data_total = 0, local_total = 0;
  for (size_t i = 0; i < cs->nfiles; i++) data_total += cs->files[i].data;
  for (size_t i = 0; i < nw; i++) {
    json_t *w = json_array_get(writes, i);
    uint64_t id, f, base, dest, len, part = 0;
    size_t we = json_array_size(w);
    if ((we != 5 && we != 6) || json_u64(json_array_get(w, 0), &id) || json_u64(json_array_get(w, 1), &f) ||
        json_u64(json_array_get(w, 2), &base) || json_u64(json_array_get(w, 3), &dest) ||
        json_u64(json_array_get(w, 4), &len) || (we == 6 && json_u64(json_array_get(w, 5), &part)) ||
        id >= cs->nboxes || f >= nf || dest >= cs->nnodes || part > cs->boxes[id].n ||
        (part ? cs->slices[cs->boxes[id].first + part - 1].sl->len : cs->boxes[id].len) != len) {
      snprintf(why, wn, "write entry %zu is malformed", i);
      return SHARDD_E_PROTOCOL;
    }
    runctx c = {.cs = cs, .dest = (uint32_t)dest, .f = (uint32_t)f};
    if (dest == cs->node_rank) {
      if (cs->fmap[f] < 0) {
        snprintf(why, wn, "write entry %zu targets a file this node was not given", i);
        return SHARDD_E_PROTOCOL;
      }
      c.lf = (uint32_t)cs->fmap[f];
      c.size = cs->files[c.lf].size;
      local_total += len;
    } else {
      c.size = UINT64_MAX; /* the receiver checks its own files */
      if (!sd_node_dest(cs, (uint32_t)dest)) {
        sd_cdest *nd = realloc(cs->dests, (cs->ndests + 1) * sizeof *nd);
        if (!nd) return SHARDD_E_NO_MEMORY;
        cs->dests = nd;
        sd_cdest *d = &cs->dests[cs->ndests++];
        memset(d, 0, sizeof *d);
        d->node = (uint32_t)dest;
        char key[16];
        snprintf(key, sizeof key, "%u", d->node);
        json_t *pe = json_object_get(peers, key);
        const char *addr = dest == 0 ? cs->leader : json_string_value(json_object_get(pe, "addr"));
        const char *name = json_string_value(json_object_get(pe, "name"));
        if (!addr || strlen(addr) >= sizeof d->addr) {
          snprintf(why, wn, "no address for node %u", d->node);
          return SHARDD_E_PROTOCOL;
        }
        snprintf(d->addr, sizeof d->addr, "%s", addr);
        snprintf(d->name, sizeof d->name, "%s", name ? name : "");
      }
    }
    /* A merged box: each member slice maps its own bytes against the tensor's place in the file
     * (part p + 1: member p alone, where the leader split the box). */
    for (uint32_t m = part ? (uint32_t)part - 1 : 0; m < (part ? part : cs->boxes[id].n); m++) {
      const sd_save_tensor *t = cs->slices[cs->boxes[id].first + m].t;
      const sd_slice *sl = cs->slices[cs->boxes[id].first + m].sl;
      c.src = sl->region ? sl->region->base + sl->offset : sl->data;
      sd_box b;
      memset(&b, 0, sizeof b);
      memcpy(b.start, sl->dims, t->ndim * sizeof(uint64_t));
      memcpy(b.count, sl->dims + t->ndim, t->ndim * sizeof(uint64_t));
      sd_box_runs(t->ndim, t->shape, sd_dtype_size(t->dtype), &b, base, add_run, &c);
      if (c.oom) return SHARDD_E_NO_MEMORY;
      if (c.bad) {
        snprintf(why, wn, "tensor '%s' would land outside its file", t->name);
        return SHARDD_E_PROTOCOL;
      }
    }
  }
  if (local_total > data_total) {
    snprintf(why, wn, "the plan has this node write more than its files hold");
    return SHARDD_E_PROTOCOL;
  }
  cs->recv_expect = data_total - local_total;
  sd_error e2 = {0};
  int rc2 = sd_xfer_begin(cs, &e2);
  if (rc2) snprintf(why, wn, "%s", e2.msg);
  return rc2;
}

static void on_assign(sd_csave *cs, json_t *h, uint8_t *payload, size_t plen) {
  sd_save *save = cs->save;
  if (cs->phase != SD_CP_OPEN) {
    free(payload);
    sd_node_fail_held(cs, SHARDD_E_PROTOCOL, "save '%s': a second assignment from the leader", save->id);
    return;
  }
  char why[SD_ERRMSG_MAX] = "";
  cs->phase = SD_CP_WRITING;
  sd_save_writing(save);
  cs->io++; /* hold: nothing may finish the save while we set it up */
  int rc = take_assignment(cs, h, payload, plen, why, sizeof why);
  cs->io--;
  if (rc == GONE) {
    /* Tell the leader and let it decide: it has failed the save already
     * (its abort carries the cause), or it is lost (so is the link), or,
     * if someone else removed the folder, it fails the save with this. */
    sd_node_await_leader(cs, SHARDD_E_IO, why, "");
    return;
  }
  if (rc) {
    if (rc == SHARDD_E_NO_MEMORY) snprintf(why, sizeof why, "out of memory");
    sd_node_fail_held(cs, rc == SHARDD_E_PROTOCOL ? SHARDD_E_INTERNAL : rc, "save '%s', node %u ('%s'): %s", save->id,
              cs->node_rank, cs->cl->node, why);
    return;
  }
  for (size_t i = 0; i < cs->ndests; i++) {
    sd_error e = {0};
    sd_cdest *d = &cs->dests[i];
    d->peer = d->node == 0 && cs->link ? cs->link : sd_peer_connect(cs->cl->net, d->addr, &e);
    if (!d->peer) {
      sd_node_fail_held(cs, SHARDD_E_PEER_LOST, "save '%s': cannot reach node %u (%s): %s", save->id, d->node, d->addr, e.msg);
      return;
    }
  }
  uint64_t fwd = 0;
  for (size_t i = 0; i < cs->ndests; i++) fwd += cs->dests[i].total;
  sd_log_info("save '%s': node %u writes %zu files (%zu local writes), forwards %llu bytes to %zu nodes, expects %llu",
               save->id, cs->node_rank, cs->nfiles, cs->nops, (unsigned long long)fwd, cs->ndests,
               (unsigned long long)cs->recv_expect);
  sd_rbuf *pend = cs->pending;
  cs->pending = NULL;
  while (pend && !cs->failing) {
    sd_rbuf *next = pend->next;
    cs->io++;
    sd_xfer_recv_apply(cs, pend);
    cs->io--;
    pend = next;
    if (cs->failing && cs->io == 0) {
      while (pend) {
        sd_rbuf *n = pend->next;
        json_decref(pend->hdr);
        free(pend->data);
        free(pend);
        pend = n;
      }
      sd_node_finish_failed(cs);
      return;
    }
  }
  while (pend) {
    sd_rbuf *n = pend->next;
    json_decref(pend->hdr);
    free(pend->data);
    free(pend);
    pend = n;
  }
  sd_xfer_progress(cs);
}

/* ------------------------------------------------------------------------ *
 * From the leader
 * ------------------------------------------------------------------------ */
static void on_commit(sd_csave *cs, json_t *h) {
  sd_save *save = cs->save;
  if (cs->phase != SD_CP_DONE_SENT) {
    sd_node_fail_held(cs, SHARDD_E_INTERNAL, "save '%s': the leader committed before this node reported", save->id);
    return;
  }
  uint64_t v;
  if (!json_u64(json_object_get(h, "files"), &v)) cs->r_files = v;
  if (!json_u64(json_object_get(h, "tensors"), &v)) cs->r_tensors = v;
  if (!json_u64(json_object_get(h, "bytes"), &v)) cs->r_bytes = v;
  char *path = sd_cl_final_path(cs->cl, save->dir);
  sd_node_close_files(cs);
  sd_log_info("save '%s' committed by the leader; node %u wrote %llu bytes of its own here, forwarded %llu, "
              "received %llu", save->id, cs->node_rank, (unsigned long long)cs->bytes_local,
              (unsigned long long)cs->bytes_fwd, (unsigned long long)cs->bytes_recv);
  sd_save_finish(save, NULL, path ? path : save->dir);
  free(path);
}

void sd_node_on_leader_msg(sd_cluster *cl, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen) {
  const char *t = json_string_value(json_object_get(hdr, "t"));
  const char *id = json_string_value(json_object_get(hdr, "save"));
  const char *tok = json_string_value(json_object_get(hdr, "tok"));
  sd_csave *cs = sd_cl_find_csave(cl, id);
  if (!cs || !t || !tok || strcmp(tok, cs->tok) != 0 || (p ? cs->link != p : !cs->is_leader) || cs->failing) {
    sd_log_debug("dropping '%.40s' for save '%.128s': not for a save of ours in flight", t ? t : "?", id ? id : "?");
    json_decref(hdr);
    free(payload);
    return;
  }
  if (!strcmp(t, "assign")) {
    on_assign(cs, hdr, payload, plen);
  } else if (!strcmp(t, "send_table")) {
    free(payload);
    sd_node_send_table(cs, hdr);
  } else if (!strcmp(t, "commit")) {
    free(payload);
    on_commit(cs, hdr);
  } else {
    free(payload);
    const char *code = json_string_value(json_object_get(hdr, "code"));
    const char *msg = json_string_value(json_object_get(hdr, "message"));
    sd_error e;
    sd_fail(&e, code ? sd_err_from_name(code) : SHARDD_E_INTERNAL, "%s", msg ? msg : "the leader failed the save");
    if (e.code == SHARDD_E_PROTOCOL) e.code = SHARDD_E_INTERNAL;
    cs->from_leader = 1;
    sd_save_fail_err(cs->save, &e);
  }
  json_decref(hdr);
}

/* ------------------------------------------------------------------------ *
 * What the leader may send
 * ------------------------------------------------------------------------ */
size_t sd_node_assign_cap(sd_cluster *cl, const sd_peer *p, size_t *payload_max) {
  const sd_config *cfg = cl->d->cfg;
  size_t cap = 0;
  *payload_max = 0;
  for (sd_save *s = cl->d->saves; s; s = s->next) {
    const sd_csave *cs = s->cl;
    if (!cs || cs->link != p || cs->phase != SD_CP_OPEN) continue;
    /* Files: a tensor lies in one file, and the plan gives a node only files where it holds bytes
     * (it owns them, or writes its own bytes there), and at most one file of no bytes at all (the
     * shard of zero-size tensors left open at the end): one per tensor it holds bytes of, + 1.
     * The reported slices are a tensor's in a run, so counting the runs counts at least its tensors. */
    size_t files = 1;
    const sd_save_tensor *last = NULL;
    for (size_t i = 0; i < cs->nslices; i++) {
      if (cs->slices[i].sl->len == 0 || cs->slices[i].t == last) continue;
      last = cs->slices[i].t;
      files++;
    }
    /* Per file an entry (its name under the 128-byte prefix, four numbers), per kept slice a write
     * (five numbers), per other node a name and an address; a header (at most max_header) per file:
     * the headers hold tensors of other nodes too, which this node cannot count. */
    size_t need = SD_PEER_CONTROL_MAX + 512 * files + 128 * cs->nslices + 1600 * (size_t)cs->nnodes;
    size_t headers = cfg && cfg->max_header < SD_PEER_PAYLOAD_MAX / files ? files * cfg->max_header : SD_PEER_PAYLOAD_MAX;
    if (need > cap) cap = need;
    if (headers > *payload_max) *payload_max = headers;
  }
  return cap < SD_PEER_HEADER_MAX ? cap : SD_PEER_HEADER_MAX;
}

/* ------------------------------------------------------------------------ *
 * Lost connections
 * ------------------------------------------------------------------------ */
void sd_node_peer_lost(sd_cluster *cl, sd_peer *p, int code, const char *why) {
  sd_daemon *d = cl->d;
  size_t n = 0;
  for (sd_save *s = d->saves; s; s = s->next) n++;
  char **ids = calloc(n ? n : 1, sizeof *ids);
  if (!ids) return;
  size_t k = 0;
  for (sd_save *s = d->saves; s; s = s->next) {
    sd_csave *cs = s->cl;
    if (!cs) continue;
    int hit = cs->link == p;
    for (size_t i = 0; i < cs->ndests; i++) hit |= cs->dests[i].peer == p;
    if (hit) ids[k++] = strdup(s->id);
  }
  for (size_t i = 0; i < k; i++) {
    sd_csave *cs = ids[i] ? sd_cl_find_csave(cl, ids[i]) : NULL;
    if (!cs) {
      free(ids[i]);
      continue;
    }
    sd_save *save = cs->save;
    int ready = sd_peer_was_ready(p);
    if (cs->link == p) {
      cs->link = NULL;
      cs->leader_lost = 1;
      cs->from_leader = 1;
      for (size_t j = 0; j < cs->ndests; j++)
        if (cs->dests[j].peer == p) cs->dests[j].peer = NULL;
      if (cs->done_sent && !cs->failing)
        sd_node_learn_outcome(cs); /* the leader may have published: the root tells */
      else if (code != SHARDD_E_PEER_LOST)
        sd_save_fail(save, code, "save '%s': %s", save->id, why);
      else if (ready)
        sd_save_fail(save, SHARDD_E_PEER_LOST, "node 0 (the leader, %s) was lost during save '%s'", cs->leader,
                     save->id);
      else
        sd_save_fail(save, SHARDD_E_PEER_LOST, "save '%s': node 0 (the leader): %s", save->id, why);
    } else {
      uint32_t node = 0;
      const char *addr = "";
      for (size_t j = 0; j < cs->ndests; j++)
        if (cs->dests[j].peer == p) {
          cs->dests[j].peer = NULL;
          node = cs->dests[j].node;
          addr = cs->dests[j].addr;
        }
      if (!cs->failing) {
        if (code != SHARDD_E_PEER_LOST)
          sd_save_fail(save, code, "save '%s': %s", save->id, why);
        else
          sd_save_fail(save, SHARDD_E_PEER_LOST, "node %u (%s) was lost during save '%s'", node, addr, save->id);
      }
    }
    free(ids[i]);
  }
  free(ids);
}
