/* A node's part of a multi-node save, the bytes: its own blocks through a file set (fileset.c) as a single-node save's files, zero-copy and O_DIRECT where they can, the rest through the ring, forwarding in windows, receiving in place. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_int.h"
#include "fileset.h"
#include "log.h"
#include "pathsafe.h"
#include "region.h"
#include "sd_grow.h"

enum { IO_HDR, IO_LOCAL, IO_RECV, IO_SYNC };

typedef struct {
  sd_csave *cs;
  int kind;
  uint32_t lf;
  uint64_t len;
  sd_rbuf *rb;
} cio;

/* ------------------------------------------------------------------------ *
 * Writing through the ring
 * ------------------------------------------------------------------------ */
static int submit(sd_csave *cs, int kind, uint32_t lf, const uint8_t *src, uint64_t len, uint64_t off, sd_rbuf *rb);

static void send_ack(sd_csave *cs, sd_rbuf *rb) {
  sd_peer *p = sd_peer_find(cs->cl->net, rb->peer_id);
  if (!p) return; /* the sender is gone; its save fails through the leader */
  json_t *a = json_pack("{s:s,s:s,s:s,s:i,s:I}", "t", "ack", "save", cs->save->id, "cid", cs->cid, "node",
                        (int)cs->node_rank, "n", (json_int_t)rb->len);
  sd_peer_send(p, a, NULL, 0);
}

static void rbuf_put(sd_csave *cs, sd_rbuf *rb, int ack) {
  if (--rb->refs > 0) return;
  if (ack) send_ack(cs, rb);
  json_decref(rb->hdr);
  free(rb->data);
  free(rb);
}

/* A rank of this node whose segment is now shorter than when it was
 * attached (a write from it faulted, or a read came up short): that rank's
 * doing, out_of_range naming its region, rather than a disk error. */
static int fail_if_shrunk(sd_csave *cs) {
  for (size_t i = 0; i < cs->nslices; i++) {
    const sd_slice *sl = cs->slices[i].sl;
    sd_error e;
    if (sl->region && sd_region_check(sl->region, &e) == SHARDD_E_OUT_OF_RANGE) {
      sd_node_fail_held(cs, e.code, "save '%s', rank %u: %s", cs->save->id, sl->rank, e.msg);
      return 1;
    }
  }
  return 0;
}

static void on_io(void *ud, int res) {
  cio *c = ud;
  sd_csave *cs = c->cs;
  sd_cluster *cl = cs->cl;
  cs->io--;
  if (res < 0 && !cs->failing) {
    const sd_cfile *f = &cs->files[c->lf];
    int code = sd_err_from_errno(-res);
    const char *what = c->kind == IO_SYNC ? "fsync" : "write";
    if (c->rb) rbuf_put(cs, c->rb, 0);
    int kind = c->kind;
    free(c);
    if (kind == IO_LOCAL && res == -EFAULT) {
      sd_log_debug("save '%s': node %u: %s/%s: write failed: %s", cs->save->id, cs->node_rank, cs->save->dir, f->name,
                   strerror(-res));
      if (fail_if_shrunk(cs)) return;
    }
    sd_node_fail_held(cs, code, "node %u ('%s'): %s/%s: %s failed: %s", cs->node_rank, cl->node, cs->save->dir, f->name,
              what, strerror(-res));
    return;
  }
  if (cs->failing) {
    if (c->rb) rbuf_put(cs, c->rb, 0);
    free(c);
    if (cs->io == 0) sd_node_finish_failed(cs);
    return;
  }
  sd_cfile *f = &cs->files[c->lf];
  switch (c->kind) {
    case IO_SYNC:
      f->sync = 2;
      close(f->fd);
      f->fd = -1;
      break;
    case IO_RECV:
      f->done += c->len;
      cs->bytes_written += c->len;
      cs->bytes_recv += c->len;
      cl->bytes_recv += c->len;
      rbuf_put(cs, c->rb, 1);
      break;
    case IO_LOCAL:
      cs->ops_done++;
      cs->bytes_local += c->len;
      cl->bytes_local += c->len;
      /* fall through */
    default:
      f->done += c->len;
      cs->bytes_written += c->len;
      break;
  }
  free(c);
  sd_xfer_progress(cs);
}

static int submit(sd_csave *cs, int kind, uint32_t lf, const uint8_t *src, uint64_t len, uint64_t off, sd_rbuf *rb) {
  cio *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->cs = cs;
  c->kind = kind;
  c->lf = lf;
  c->len = len;
  c->rb = rb;
  int fd = cs->files[lf].fd;
  sd_writer *w = cs->cl->d->writer;
  int rc = !w               ? -ESHUTDOWN
           : kind == IO_SYNC ? sd_writer_raw_fsync(w, fd, on_io, c)
                             : sd_writer_raw_write(w, fd, src, len, off, on_io, c);
  if (rc < 0) {
    free(c);
    return rc;
  }
  cs->io++;
  if (rb) rb->refs++;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Forwarding: frames of runs, a window of unacknowledged bytes per
 * destination. The bytes are copied out of shared memory in the thread
 * pool: a page fault there (memory pressure) must not stall the loop that
 * answers heartbeats.
 * ------------------------------------------------------------------------ */
typedef struct {
  uv_work_t req;
  sd_csave *cs;
  uint32_t dest;
  uint8_t *frame;
  size_t len, at;
  int n;
  struct iovec iov[SD_FWD_RUNS];
} fcopy;

static void copy_work(uv_work_t *req) {
  fcopy *j = req->data;
  size_t at = j->at;
  for (int i = 0; i < j->n; i++) {
    memcpy(j->frame + at, j->iov[i].iov_base, j->iov[i].iov_len);
    at += j->iov[i].iov_len;
  }
}

static void copy_done(uv_work_t *req, int status) {
  fcopy *j = req->data;
  sd_csave *cs = j->cs;
  cs->io--;
  cs->copies--;
  sd_cdest *d = sd_node_dest(cs, j->dest);
  if (!cs->failing && status == 0 && d && d->peer)
    sd_peer_send_frame(d->peer, j->frame, j->len); /* a closing peer fails the save from on_lost */
  else
    free(j->frame);
  free(j);
  if (cs->failing) {
    if (cs->io == 0) sd_node_finish_failed(cs);
    return;
  }
  sd_xfer_progress(cs);
}

/* 1 when the save failed (and may be gone): the caller must not touch cs. */
static int pump_dest(sd_csave *cs, sd_cdest *d) {
  while (d->peer && d->next < d->nruns) {
    uint64_t inflight = d->sent - d->acked, avail = SD_FWD_WINDOW - inflight, left = d->total - d->sent;
    if (inflight >= SD_FWD_WINDOW || (avail < SD_FWD_FRAME && avail < left)) return 0;
    uint64_t budget = avail < SD_FWD_FRAME ? avail : SD_FWD_FRAME;
    struct iovec iov[SD_FWD_RUNS];
    json_t *runs = json_array();
    int n = 0;
    uint64_t total = 0;
    while (d->next < d->nruns && n < SD_FWD_RUNS && total < budget) {
      const sd_fop *r = &d->runs[d->next];
      uint64_t k = r->len - d->next_off;
      if (k > budget - total) k = budget - total;
      json_t *e = json_array();
      json_array_append_new(e, json_integer(r->f));
      json_array_append_new(e, json_integer((json_int_t)(r->off + d->next_off)));
      json_array_append_new(e, json_integer((json_int_t)k));
      json_array_append_new(runs, e);
      iov[n].iov_base = (void *)(r->src + d->next_off);
      iov[n].iov_len = k;
      n++;
      total += k;
      d->next_off += k;
      if (d->next_off == r->len) {
        d->next++;
        d->next_off = 0;
      }
    }
    json_t *h = json_pack("{s:s,s:s,s:s,s:i,s:o}", "t", "data", "save", cs->save->id, "cid", cs->cid, "node",
                          (int)cs->node_rank, "runs", runs);
    fcopy *j = h ? calloc(1, sizeof *j) : NULL;
    if (j) j->frame = sd_frame_alloc(h, total, &j->at, &j->len);
    json_decref(h);
    if (!j || !j->frame) {
      if (j) free(j);
      sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "save '%s': out of memory forwarding to node %u", cs->save->id, d->node);
      return 1;
    }
    j->cs = cs;
    j->dest = d->node;
    j->n = n;
    memcpy(j->iov, iov, (size_t)n * sizeof *iov);
    j->req.data = j;
    if (uv_queue_work(cs->cl->d->loop, &j->req, copy_work, copy_done) != 0) {
      free(j->frame);
      free(j);
      sd_node_fail_held(cs, SHARDD_E_INTERNAL, "save '%s': cannot queue a copy for node %u", cs->save->id, d->node);
      return 1;
    }
    cs->io++;
    cs->copies++;
    d->sent += total;
    cs->bytes_fwd += total;
    cs->cl->bytes_fwd += total;
  }
  return 0;
}

static void pump_local(sd_csave *cs) {
  while (cs->op_next < cs->nops && cs->io < SD_NODE_INFLIGHT) {
    const sd_lop *o = &cs->ops[cs->op_next];
    if (submit(cs, IO_LOCAL, o->lf, o->src, o->len, o->off, NULL) != 0) return;
    cs->op_next++;
  }
}

static void send_done(sd_csave *cs) {
  json_t *files = json_array();
  for (size_t i = 0; i < cs->nfiles; i++) {
    json_t *e = json_array();
    json_array_append_new(e, json_integer(cs->files[i].f));
    json_array_append_new(e, json_integer((json_int_t)cs->files[i].done));
    json_array_append_new(files, e);
  }
  cs->done_sent = 1;
  cs->phase = SD_CP_DONE_SENT;
  sd_log_debug("save '%s': node %u wrote its files (%llu own bytes here, %llu forwarded, %llu received)",
               cs->save->id, cs->node_rank, (unsigned long long)cs->bytes_local, (unsigned long long)cs->bytes_fwd,
               (unsigned long long)cs->bytes_recv);
  sd_node_to_leader(cs, json_pack("{s:s,s:s,s:o,s:I,s:I,s:I,s:I,s:I}", "t", "done", "cid", cs->cid, "files", files,
                                  "local", (json_int_t)cs->bytes_local, "forwarded", (json_int_t)cs->bytes_fwd,
                                  "received", (json_int_t)cs->bytes_recv, "written", (json_int_t)cs->bytes_written,
                                  "direct", (json_int_t)cs->bytes_zero_copy));
}

void sd_xfer_progress(sd_csave *cs) {
  if (cs->failing || cs->stalled || cs->phase != SD_CP_WRITING) return;
  pump_local(cs);
  int sent_all = 1, acked_all = 1;
  for (size_t i = 0; i < cs->ndests; i++) {
    if (pump_dest(cs, &cs->dests[i])) return;
    if (cs->dests[i].next < cs->dests[i].nruns) sent_all = 0;
    if (cs->dests[i].acked < cs->dests[i].total) acked_all = 0;
  }
  /* Shared memory is read by local writes and by copying into frames. */
  if (!cs->released && sent_all && cs->copies == 0 && cs->op_next == cs->nops && cs->ops_done == cs->nops &&
      !cs->staged) {
    cs->released = 1;
    sd_save_released(cs->save);
  }
  int durable = 1;
  for (size_t i = 0; i < cs->nfiles; i++) {
    sd_cfile *f = &cs->files[i];
    if (f->sync == 0 && f->done == f->hdr_len + f->data) {
      if (submit(cs, IO_SYNC, (uint32_t)i, NULL, 0, 0, NULL) == 0) f->sync = 1;
    }
    if (f->sync != 2) durable = 0;
  }
  if (durable && acked_all && cs->io == 0) send_done(cs);
}

/* ------------------------------------------------------------------------ *
 * Receiving forwarded bytes
 * ------------------------------------------------------------------------ */
/* Checks every run of a data frame against our files, then writes them in place. */
void sd_xfer_recv_apply(sd_csave *cs, sd_rbuf *rb) {
  json_t *runs = json_object_get(rb->hdr, "runs");
  const char *cid = json_string_value(json_object_get(rb->hdr, "cid"));
  if (!cid || strcmp(cid, cs->cid) != 0) {
    sd_log_debug("save '%s': dropping data for another attempt", cs->save->id);
    json_decref(rb->hdr);
    free(rb->data);
    free(rb);
    return;
  }
  size_t n = json_is_array(runs) ? json_array_size(runs) : 0;
  uint64_t pos = 0;
  const char *bad = NULL;
  for (size_t i = 0; i < n && !bad; i++) {
    json_t *e = json_array_get(runs, i);
    json_t *jf = json_array_get(e, 0), *jo = json_array_get(e, 1), *jl = json_array_get(e, 2);
    if (json_array_size(e) != 3 || !json_is_integer(jf) || !json_is_integer(jo) || !json_is_integer(jl)) {
      bad = "a malformed run";
      break;
    }
    json_int_t f = json_integer_value(jf), off = json_integer_value(jo), len = json_integer_value(jl);
    if (f < 0 || (uint64_t)f >= cs->plan_files || cs->fmap[f] < 0) bad = "bytes for a file this node does not write";
    else if (off < 0 || len <= 0 || (uint64_t)len > rb->len - pos) bad = "runs longer than the payload";
    else {
      sd_cfile *cf = &cs->files[cs->fmap[f]];
      if ((uint64_t)off < cf->hdr_len || (uint64_t)off > cf->size || (uint64_t)len > cf->size - (uint64_t)off)
        bad = "bytes outside a file's data";
      else if (cf->own) {
        for (uint64_t b = (uint64_t)off / SD_XFER_BLOCK; b <= ((uint64_t)off + (uint64_t)len - 1) / SD_XFER_BLOCK; b++)
          if (cf->own[b]) bad = "bytes where the plan has only this node's own";
      }
    }
    pos += (uint64_t)len;
  }
  if (!bad && pos != rb->len) bad = "runs that do not add up to the payload";
  if (!bad && rb->len > cs->recv_expect) bad = "more bytes than the plan sends here";
  if (bad) {
    uint32_t from = rb->from;
    json_decref(rb->hdr);
    free(rb->data);
    free(rb);
    sd_node_fail_held(cs, SHARDD_E_PROTOCOL, "save '%s': node %u sent %s", cs->save->id, from, bad);
    return;
  }
  cs->recv_expect -= rb->len;
  rb->refs = 1; /* ours, until every run is queued */
  pos = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(runs, i);
    uint32_t f = (uint32_t)json_integer_value(json_array_get(e, 0));
    uint64_t off = (uint64_t)json_integer_value(json_array_get(e, 1));
    uint64_t len = (uint64_t)json_integer_value(json_array_get(e, 2));
    if (submit(cs, IO_RECV, (uint32_t)cs->fmap[f], rb->data + pos, len, off, rb) != 0) {
      rbuf_put(cs, rb, 0);
      sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "save '%s': out of memory queueing received bytes", cs->save->id);
      return;
    }
    pos += len;
  }
  rbuf_put(cs, rb, 1);
}

void sd_node_on_data(sd_cluster *cl, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen) {
  const char *id = json_string_value(json_object_get(hdr, "save"));
  sd_csave *cs = sd_cl_find_csave(cl, id);
  json_t *jn = json_object_get(hdr, "node");
  if (!cs || cs->failing || cs->stalled || !json_is_integer(jn) || json_integer_value(jn) < 0 ||
      json_integer_value(jn) >= (json_int_t)cs->nnodes || sd_peer_is_outgoing(p)) {
    json_decref(hdr);
    free(payload);
    return;
  }
  sd_rbuf *rb = calloc(1, sizeof *rb);
  if (!rb) {
    json_decref(hdr);
    free(payload);
    sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "save '%s': out of memory receiving bytes", cs->save->id);
    return;
  }
  rb->cs = cs;
  rb->peer_id = sd_peer_id(p);
  rb->from = (uint32_t)json_integer_value(jn);
  rb->hdr = hdr;
  rb->data = payload;
  rb->len = plen;
  if (cs->phase == SD_CP_OPEN) {
    /* The sender got its assignment before we got ours: hold it; the
     * sender's window bounds how much can pile up. */
    sd_rbuf **pp = &cs->pending;
    while (*pp) pp = &(*pp)->next;
    *pp = rb;
    return;
  }
  sd_xfer_recv_apply(cs, rb);
}

void sd_node_on_ack(sd_cluster *cl, sd_peer *p, json_t *hdr) {
  const char *id = json_string_value(json_object_get(hdr, "save"));
  const char *cid = json_string_value(json_object_get(hdr, "cid"));
  sd_csave *cs = sd_cl_find_csave(cl, id);
  json_t *jn = json_object_get(hdr, "node"), *jb = json_object_get(hdr, "n");
  if (!cs || cs->failing || cs->phase != SD_CP_WRITING || !cid || strcmp(cid, cs->cid) != 0 || !json_is_integer(jn) ||
      !json_is_integer(jb))
    return;
  for (size_t i = 0; i < cs->ndests; i++) {
    sd_cdest *d = &cs->dests[i];
    if (d->node != (uint64_t)json_integer_value(jn) || d->peer != p) continue;
    json_int_t n = json_integer_value(jb);
    if (n < 0 || (uint64_t)n > d->sent - d->acked) {
      sd_node_fail_held(cs, SHARDD_E_PROTOCOL, "save '%s': node %u acknowledged bytes it was never sent", cs->save->id,
                d->node);
      return;
    }
    d->acked += (uint64_t)n;
    sd_xfer_progress(cs);
    return;
  }
}

/* ------------------------------------------------------------------------ *
 * Regions made only of this node's bytes (its header and its own ranks'
 * slices, in blocks of SD_XFER_BLOCK): the single-node path (fileset.c,
 * pubfill.c), staged by the copy workers and written with O_DIRECT, in the
 * writer's counters. A whole file of them (a pipeline layout, any file that
 * takes nothing from other nodes) is one region. Blocks that also take
 * other nodes' bytes (forwarded here, or written in place by them in shared
 * mode) go through the ring as the pieces arrive, buffered: they share
 * pages with bytes that come later or from elsewhere. Regions are whole
 * aligned blocks, so the two never share a page.
 * ------------------------------------------------------------------------ */
typedef struct sd_xstaged {
  sd_csave *cs;
  size_t n, cap;           /* regions */
  uint32_t *lf;            /* region -> files[] */
  uint64_t *bases;         /* region -> its offset in the file */
  int *fds;
  const char **names;
  sd_fill_file *files;
  int *extra;              /* per files[]: a second descriptor (O_DIRECT) for a file also written buffered, or -1 */
  size_t nextra;
  sd_write_op *ops;
  size_t nops, opcap;
  sd_shm_span *spans;
  size_t nspans;
  uint64_t data;           /* slice bytes in the regions */
} sd_xstaged;

static void xs_free(sd_xstaged *xs) {
  if (!xs) return;
  for (size_t i = 0; i < xs->nextra; i++)
    if (xs->extra[i] >= 0) close(xs->extra[i]);
  free(xs->extra);
  free(xs->lf);
  free(xs->bases);
  free(xs->fds);
  free(xs->names);
  free(xs->files);
  free(xs->ops);
  free(xs->spans);
  free(xs);
}

static int op_cmp(const void *a, const void *b) {
  const sd_write_op *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

static int span_cmp(const void *a, const void *b) {
  const sd_shm_span *x = a, *y = b;
  return x->base < y->base ? -1 : x->base > y->base;
}

static void on_staged(void *ud, const sd_error *err) {
  sd_xstaged *xs = ud;
  sd_csave *cs = xs->cs;
  cs->io--;
  cs->staged = NULL;
  if (cs->failing) {
    xs_free(xs);
    if (cs->io == 0) sd_node_finish_failed(cs);
    return;
  }
  if (err) {
    xs_free(xs);
    sd_log_debug("save '%s': node %u: its own files: %s", cs->save->id, cs->node_rank, err->msg);
    if (err->code == SHARDD_E_IO && fail_if_shrunk(cs)) return;
    sd_node_fail_held(cs, err->code, "node %u ('%s'): %s", cs->node_rank, cs->cl->node, err->msg);
    return;
  }
  /* cs->bytes_written and bytes_zero_copy grew as the job wrote */
  for (size_t k = 0; k < xs->n; k++) cs->files[xs->lf[k]].done += xs->files[k].size;
  cs->bytes_local += xs->data;
  cs->cl->bytes_local += xs->data;
  xs_free(xs);
  sd_xfer_progress(cs);
}

static int blk_len(const sd_cfile *f, uint64_t b) {
  uint64_t end = (b + 1) * (uint64_t)SD_XFER_BLOCK;
  return (int)((end < f->size ? end : f->size) - b * SD_XFER_BLOCK);
}

/* Adds [off, off + len) of file f to its blocks' counts of own bytes. */
static void cover(uint32_t *cov, uint64_t off, uint64_t len) {
  while (len > 0) {
    uint64_t b = off / SD_XFER_BLOCK, room = (b + 1) * SD_XFER_BLOCK - off, k = len < room ? len : room;
    cov[b] += (uint32_t)k;
    off += k;
    len -= k;
  }
}

/* The region holding offset off of files[lf] (off in an own block). */
static size_t region_of(const sd_xstaged *xs, uint32_t lf, uint64_t off) {
  size_t lo = 0, hi = xs->n; /* regions are sorted by file, then base */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (xs->lf[mid] < lf || (xs->lf[mid] == lf && xs->bases[mid] <= off)) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

static int add_region(sd_xstaged *xs, uint32_t lf, int fd, const char *name, uint64_t base, uint64_t size,
                      const uint8_t *head, uint64_t head_len) {
  /* five arrays of one length: each grows from the same capacity to the same one */
  size_t a = xs->cap, b = a, c = a, d = a, e = a, need = xs->n + 1;
  if (SD_GROW(xs->lf, a, need, 16) || SD_GROW(xs->bases, b, need, 16) || SD_GROW(xs->fds, c, need, 16) ||
      SD_GROW(xs->names, d, need, 16) || SD_GROW(xs->files, e, need, 16))
    return -1;
  xs->cap = a;
  xs->lf[xs->n] = lf;
  xs->bases[xs->n] = base;
  xs->fds[xs->n] = fd;
  xs->names[xs->n] = name;
  xs->files[xs->n] = (sd_fill_file){head, head_len, size};
  xs->n++;
  return 0;
}

static int add_op(sd_xstaged *xs, uint32_t region, uint64_t off, const uint8_t *src, uint64_t len) {
  if (SD_GROW(xs->ops, xs->opcap, xs->nops + 1, 1024)) return -1;
  uint32_t flags = sd_span_find(xs->spans, xs->nspans, src) ? SD_WOP_SHARED : 0;
  xs->ops[xs->nops++] = (sd_write_op){region, off, src, len, flags, 0};
  xs->data += len;
  return 0;
}

/* Finds each file's own blocks (f->own) and makes them regions. */
static int find_regions(sd_csave *cs, sd_xstaged *xs) {
  uint64_t hoff = 0;
  for (size_t i = 0; i < cs->nfiles; i++) {
    sd_cfile *f = &cs->files[i];
    uint64_t nb = (f->size + SD_XFER_BLOCK - 1) / SD_XFER_BLOCK;
    const uint8_t *head = cs->hdrs + hoff;
    hoff += f->hdr_len;
    if (nb == 0) continue;
    uint32_t *cov = calloc(nb, sizeof *cov);
    f->own = calloc(nb, 1);
    if (!cov || !f->own) {
      free(cov);
      return -1;
    }
    cover(cov, 0, f->hdr_len);
    for (size_t k = 0; k < cs->nops; k++)
      if (cs->ops[k].lf == i) cover(cov, cs->ops[k].off, cs->ops[k].len);
    uint64_t nown = 0;
    for (uint64_t b = 0; b < nb; b++) nown += f->own[b] = cov[b] == (uint32_t)blk_len(f, b);
    free(cov);
    int fd = f->fd;
    if (nown && nown < nb) {
      /* Also written through the page cache: the direct writes get a descriptor of their own. */
      fd = xs->extra[i] = sd_openat_beneath(cs->tmp_fd, f->name, O_WRONLY, 0);
      if (fd < 0) memset(f->own, 0, nb), nown = 0;
    }
    if (!nown) {
      free(f->own);
      f->own = NULL;
      continue;
    }
    for (uint64_t b = 0; b < nb;) {
      if (!f->own[b]) {
        b++;
        continue;
      }
      uint64_t e = b;
      while (e < nb && f->own[e]) e++;
      uint64_t base = b * SD_XFER_BLOCK, end = e * SD_XFER_BLOCK < f->size ? e * SD_XFER_BLOCK : f->size;
      uint64_t hl = f->hdr_len > base ? f->hdr_len - base : 0;
      if (add_region(xs, (uint32_t)i, fd, f->name, base, end - base, head + (hl ? base : 0), hl < end - base ? hl : end - base))
        return -1;
      b = e;
    }
  }
  return 0;
}

/* Moves the parts of the local writes that fall in own blocks into xs;
 * the rest stay in cs->ops, cut at block edges. */
static int split_ops(sd_csave *cs, sd_xstaged *xs) {
  sd_lop *keep = NULL;
  size_t nkeep = 0, cap = 0;
  for (size_t i = 0; i < cs->nops; i++) {
    const sd_lop o = cs->ops[i];
    const sd_cfile *f = &cs->files[o.lf];
    for (uint64_t at = 0; at < o.len;) {
      uint64_t off = o.off + at, b = off / SD_XFER_BLOCK, end = off;
      int own = f->own && f->own[b];
      /* a run of blocks of the same kind */
      while (end < o.off + o.len && (f->own && f->own[end / SD_XFER_BLOCK]) == own)
        end = (end / SD_XFER_BLOCK + 1) * SD_XFER_BLOCK;
      if (end > o.off + o.len) end = o.off + o.len;
      if (own) {
        size_t r = region_of(xs, o.lf, off);
        if (add_op(xs, (uint32_t)r, off - xs->bases[r], o.src + at, end - off)) goto oom;
      } else {
        if (SD_GROW(keep, cap, nkeep + 1, 1024)) goto oom;
        keep[nkeep++] = (sd_lop){o.lf, off, o.src + at, end - off};
      }
      at = end - o.off;
    }
  }
  free(cs->ops);
  cs->ops = keep;
  cs->nops = nkeep;
  if (xs->nops) qsort(xs->ops, xs->nops, sizeof *xs->ops, op_cmp);
  return 0;
oom:
  free(keep);
  return -1;
}

static int collect_spans(sd_csave *cs, sd_xstaged *xs) {
  size_t cap = 0;
  for (size_t i = 0; i < cs->nslices; i++) {
    const sd_region *r = cs->slices[i].sl->region;
    if (!r) continue;
    if (SD_GROW(xs->spans, cap, xs->nspans + 1, 64)) return -1;
    xs->spans[xs->nspans++] = (sd_shm_span){r->base, r->size, r->fd, r->sealed, r->pin};
  }
  if (xs->nspans) qsort(xs->spans, xs->nspans, sizeof *xs->spans, span_cmp);
  size_t u = 0; /* one span per segment */
  for (size_t i = 0; i < xs->nspans; i++)
    if (u == 0 || xs->spans[i].base != xs->spans[u - 1].base) xs->spans[u++] = xs->spans[i];
  xs->nspans = u;
  return 0;
}

int sd_xfer_begin(sd_csave *cs, sd_error *err) {
  sd_xstaged *xs = calloc(1, sizeof *xs);
  int rc = 0;
  if (xs) xs->extra = malloc((cs->nfiles ? cs->nfiles : 1) * sizeof *xs->extra);
  if (!xs || !xs->extra) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    goto out;
  }
  xs->nextra = cs->nfiles;
  for (size_t i = 0; i < cs->nfiles; i++) xs->extra[i] = -1;
  if (find_regions(cs, xs) != 0 || collect_spans(cs, xs) != 0 || split_ops(cs, xs) != 0) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    goto out;
  }
  /* Header bytes outside own blocks go through the ring (they sit in the payload in the order of the file list). */
  uint64_t hoff = 0;
  for (size_t i = 0; i < cs->nfiles; i++) {
    sd_cfile *f = &cs->files[i];
    for (uint64_t a = 0; a < f->hdr_len;) {
      uint64_t b = a / SD_XFER_BLOCK, e = (b + 1) * SD_XFER_BLOCK;
      if (e > f->hdr_len) e = f->hdr_len;
      if ((!f->own || !f->own[b]) && submit(cs, IO_HDR, (uint32_t)i, cs->hdrs + hoff + a, e - a, a, NULL) != 0) {
        rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory queueing a header");
        goto out;
      }
      a = e;
    }
    hoff += f->hdr_len;
  }
  if (xs->n) {
    sd_writer *w = cs->cl->d->writer;
    if (!w) {
      rc = sd_fail(err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
      goto out;
    }
    xs->cs = cs;
    sd_fileset_req r = {.fds = xs->fds, .names = xs->names, .files = xs->files, .bases = xs->bases,
                        .nfiles = xs->n, .ops = xs->ops, .nops = xs->nops, .spans = xs->spans,
                        .nspans = xs->nspans, .dir = cs->save->dir, .point = "filejob", .stop = &cs->failing,
                        .bytes_written = &cs->bytes_written, .bytes_zero_copy = &cs->bytes_zero_copy, .tag = cs->save->id,
                        .cb = on_staged, .ud = xs};
    cs->io++;
    cs->staged = xs;
    if ((rc = sd_fileset_start(w, &r, err)) != 0) {
      cs->io--;
      cs->staged = NULL;
      goto out;
    }
    xs = NULL;
  }
out:
  xs_free(xs);
  return rc;
}
