/* A node's part of a multi-node save, the bytes through the ring: headers and blocks that mix its bytes with others', forwarding in windows, receiving in place, fsyncs and the report; its own blocks in cluster_xfer_staged.c. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_int.h"
#include "crashpoint.h"
#include "log.h"
#include "region.h"
#include "sd_checksum.h"
#include "staging.h"

enum { IO_HDR, IO_LOCAL, IO_RECV, IO_SYNC };

typedef struct {
  sd_csave *cs;
  int kind;
  uint32_t lf;
  uint64_t len;
  sd_rbuf *rb;
  sd_lop *op;              /* IO_LOCAL: the rank's bytes it writes */
} cio;

/* ------------------------------------------------------------------------ *
 * Writing through the ring
 * ------------------------------------------------------------------------ */
static int submit(sd_csave *cs, int kind, uint32_t lf, const uint8_t *src, uint64_t len, uint64_t off, sd_rbuf *rb,
                  sd_lop *op);
static int local_after(sd_csave *cs, sd_lop *o);

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

int sd_xfer_fail_if_shrunk(sd_csave *cs) {
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
  if (cs->fds) sd_fdset_put(cs->fds, c->lf);
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
      if (sd_xfer_fail_if_shrunk(cs)) return;
    }
    sd_node_fail_io(cs, code, "node %u ('%s'): %s/%s: %s failed: %s", cs->node_rank, cl->node, cs->save->dir, f->name,
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
      cs->nsynced++;
      sd_fdset_close(cs->fds, c->lf);
      break;
    case IO_RECV:
      sd_xfer_wrote(cs, c->lf, c->len);
      cs->bytes_written += c->len;
      cs->bytes_recv += c->len;
      cl->bytes_recv += c->len;
      rbuf_put(cs, c->rb, 1);
      break;
    case IO_LOCAL:
      sd_crash_point("filejob_mixed"); /* tests: between a mixed block's write and its second reading */
      if (cs->sums && local_after(cs, c->op) != 0) {
        free(c);
        return; /* the save failed, naming the rank */
      }
      cs->ops_done++;
      cs->bytes_local += c->len;
      cl->bytes_local += c->len;
      /* fall through */
    default:
      sd_xfer_wrote(cs, c->lf, c->len);
      cs->bytes_written += c->len;
      break;
  }
  free(c);
  sd_xfer_progress(cs);
}

/* 0, -EAGAIN when every descriptor max_open_files allows is busy (cs waits
 * for one: sd_xfer_progress goes on), or another -errno. */
static int submit(sd_csave *cs, int kind, uint32_t lf, const uint8_t *src, uint64_t len, uint64_t off, sd_rbuf *rb,
                  sd_lop *op) {
  sd_writer *w = cs->cl->d->writer;
  if (!w || !cs->fds) return -ESHUTDOWN;
  /* The descriptor first: at the cap every pending request asks again on each wake, and
   * should cost no allocation while it waits. */
  int fd = sd_fdset_get(cs->fds, lf);
  if (fd < 0) {
    if (fd == -EAGAIN) sd_fdpool_wait(sd_fdset_pool(cs->fds), &cs->fdwait);
    return fd;
  }
  cio *c = calloc(1, sizeof *c);
  if (!c) {
    sd_fdset_put(cs->fds, lf);
    return -ENOMEM;
  }
  c->cs = cs;
  c->op = op;
  c->kind = kind;
  c->lf = lf;
  c->len = len;
  c->rb = rb;
  int rc = kind == IO_SYNC ? sd_writer_raw_fsync(w, fd, on_io, c) : sd_writer_raw_write(w, fd, src, len, off, on_io, c);
  if (rc < 0) {
    sd_fdset_put(cs->fds, lf);
    free(c);
    return rc;
  }
  cs->io++;
  if (rb) rb->refs++;
  return 0;
}

/* A request on files[lf] could not be made (rc: -errno, never -EAGAIN): the save fails. */
static void submit_failed(sd_csave *cs, uint32_t lf, const char *what, int rc) {
  sd_node_fail_io(cs, sd_err_from_errno(-rc), "node %u ('%s'): %s/%s: cannot %s: %s", cs->node_rank, cs->cl->node,
                    cs->save->dir, cs->files[lf].name, what, strerror(-rc));
}

/* There is a descriptor to be had again. */
static void fd_room(sd_fdwaiter *w) {
  sd_csave *cs = (sd_csave *)((char *)w - offsetof(sd_csave, fdwait));
  sd_xfer_progress(cs);
}

int sd_xfer_open(sd_csave *cs) {
  sd_writer *w = cs->cl->d->writer;
  if (!w) return SHARDD_E_SHUTTING_DOWN;
  cs->fdwait.cb = fd_room;
  cs->recv_wait_tail = &cs->recv_wait;
  if (!(cs->sync_q = malloc((cs->nfiles ? cs->nfiles : 1) * sizeof *cs->sync_q)) ||
      sd_fdset_new(sd_writer_fdpool(w), cs->tmp_fd, cs->fnames, cs->nfiles, O_WRONLY, &cs->fds))
    return SHARDD_E_NO_MEMORY;
  for (size_t i = 0; i < cs->nfiles; i++)
    if (cs->files[i].hdr_len + cs->files[i].data == 0) cs->sync_q[cs->sync_tail++] = (uint32_t)i;
  return 0;
}

void sd_xfer_wrote(sd_csave *cs, uint32_t lf, uint64_t len) {
  sd_cfile *f = &cs->files[lf];
  f->done += len;
  /* whole: its fsync goes next (a queue, not a scan of every file at every completion) */
  if (len && f->done == f->hdr_len + f->data) cs->sync_q[cs->sync_tail++] = lf;
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

/* A local piece's CRC-32C register, read from its rank's segment on the loop
 * (after: into *reg; before: into o->before): a segment the rank shrank
 * faults here, guarded. -1 on a fault. */
static int local_read(sd_lop *o, int after, uint32_t *reg) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1)) return -1; /* sd_bus_guard is NULL again */
  sd_bus_guard = &jb;
  uint32_t r = sd_crc32c_run(0, o->src, o->len);
  sd_bus_guard = NULL;
  if (after) *reg = r;
  else o->before = r;
  return 0;
}

static void local_fault(sd_csave *cs, const sd_lop *o) {
  const sd_cfile *f = &cs->files[o->lf];
  if (!sd_xfer_fail_if_shrunk(cs))
    sd_node_fail_held(cs, SHARDD_E_IO, "node %u ('%s'): %s/%s: reading the bytes for offset %llu faulted (SIGBUS): "
                      "a rank's shared memory is shorter than when it was attached", cs->node_rank, cs->cl->node,
                      cs->save->dir, f->name, (unsigned long long)o->off);
}

/* A local piece's write is done: its bytes are read again, as fileset.c
 * reads a zero-copy piece, and must be what they were before the write, or
 * the rank changed its memory under it and the save fails naming the rank.
 * Then its share counts. -1 when the save failed. */
static int local_after(sd_csave *cs, sd_lop *o) {
  uint32_t reg;
  if (local_read(o, 1, &reg) != 0) {
    local_fault(cs, o);
    return -1;
  }
  if (reg != o->before) {
    uint32_t rank = 0;
    uint64_t at = 0;
    for (size_t i = 0; i < cs->nslices; i++) {
      const sd_slice *sl = cs->slices[i].sl;
      if (sl->region && o->src >= sl->region->base && o->src < sl->region->base + sl->region->size) {
        rank = sl->rank;
        at = (uint64_t)(o->src - sl->region->base);
        break;
      }
    }
    sd_node_fail_held(cs, SHARDD_E_BAD_STATE, "node %u ('%s'): save '%s': rank %u changed its memory while the daemon "
                      "was writing it (%s/%s at offset %llu, from offset %llu of its segment): a rank must leave its "
                      "arena alone from seal until the save is released", cs->node_rank, cs->cl->node, cs->save->id,
                      rank, cs->save->dir, cs->files[o->lf].name, (unsigned long long)o->off, (unsigned long long)at);
    return -1;
  }
  cs->sums[o->lf] ^= sd_crc32c_shift(reg, cs->files[o->lf].size - (o->off + o->len));
  return 0;
}

/* 1 when the save failed (and may be gone): the caller must not touch cs. */
static int pump_local(sd_csave *cs) {
  while (cs->op_next < cs->nops && cs->io < SD_NODE_INFLIGHT) {
    sd_lop *o = &cs->ops[cs->op_next];
    if (cs->sums && local_read(o, 0, NULL) != 0) {
      local_fault(cs, o);
      return 1;
    }
    int rc = submit(cs, IO_LOCAL, o->lf, o->src, o->len, o->off, NULL, o);
    if (rc == -EAGAIN) return 0;
    if (rc) {
      submit_failed(cs, o->lf, "write", rc);
      return 1;
    }
    cs->op_next++;
  }
  return 0;
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
  json_t *m = json_pack("{s:s,s:s,s:o,s:I,s:I,s:I,s:I,s:I}", "t", "done", "cid", cs->cid, "files", files, "local",
                        (json_int_t)cs->bytes_local, "forwarded", (json_int_t)cs->bytes_fwd, "received",
                        (json_int_t)cs->bytes_recv, "written", (json_int_t)cs->bytes_written, "direct",
                        (json_int_t)cs->bytes_zero_copy);
  if (m && cs->sums) {
    /* [file, share] in the order of files: the XOR of this node's shares, for the leader to combine */
    json_t *sums = json_array();
    for (size_t i = 0; i < cs->nfiles; i++) {
      char hex[SD_CHECKSUM_HEX + 1];
      sd_crc32c_hex(cs->sums[i], hex);
      json_array_append_new(sums, json_pack("[I,s]", (json_int_t)cs->files[i].f, hex));
    }
    json_object_set_new(m, "sums", sums);
  }
  sd_node_to_leader(cs, m);
}

int sd_xfer_queue_headers(sd_csave *cs, uint32_t *bad) {
  for (; cs->hdr_next < cs->nfiles; cs->hdr_next++, cs->hdr_at = 0) {
    uint32_t i = (uint32_t)cs->hdr_next;
    const sd_cfile *f = &cs->files[i];
    while (cs->hdr_at < f->hdr_len) {
      uint64_t a = cs->hdr_at, b = a / SD_XFER_BLOCK, e = (b + 1) * SD_XFER_BLOCK;
      if (e > f->hdr_len) e = f->hdr_len;
      if (!f->own || !f->own[b]) {
        int rc = submit(cs, IO_HDR, i, cs->hdrs + cs->hdr_off + a, e - a, a, NULL, NULL);
        if (rc == -EAGAIN) return 0;
        if (rc) {
          *bad = i;
          return rc;
        }
      }
      cs->hdr_at = e;
    }
    cs->hdr_off += f->hdr_len;
  }
  return 0;
}

/* The headers left (sd_xfer_queue_headers). 1 when the save failed. */
static int pump_headers(sd_csave *cs) {
  uint32_t bad = 0;
  int rc = sd_xfer_queue_headers(cs, &bad);
  if (rc) submit_failed(cs, bad, "write", rc);
  return rc != 0;
}

static int recv_runs(sd_csave *cs, sd_rbuf *rb);

/* Received frames whose runs waited for descriptors, in the order they came. 1 when the save failed. */
static int pump_received(sd_csave *cs) {
  while (cs->recv_wait) {
    sd_rbuf *rb = cs->recv_wait;
    if (!(cs->recv_wait = rb->next)) cs->recv_wait_tail = &cs->recv_wait;
    rb->next = NULL;
    int rc = recv_runs(cs, rb);
    if (rc < 0) return 1;
    if (rc > 0) { /* still waiting: first again */
      if (!(rb->next = cs->recv_wait)) cs->recv_wait_tail = &rb->next;
      cs->recv_wait = rb;
      return 0;
    }
  }
  return 0;
}

void sd_xfer_drop_waiting(sd_csave *cs) {
  if (!cs->recv_wait_tail) return; /* no assignment was taken */
  while (cs->recv_wait) {
    sd_rbuf *rb = cs->recv_wait;
    cs->recv_wait = rb->next;
    rbuf_put(cs, rb, 0);
  }
  cs->recv_wait_tail = &cs->recv_wait;
}

void sd_xfer_progress(sd_csave *cs) {
  if (cs->failing || cs->stalled || cs->phase != SD_CP_WRITING) return;
  if (pump_received(cs) || pump_headers(cs) || pump_local(cs)) return;
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
  while (cs->sync_head < cs->sync_tail) {
    uint32_t i = cs->sync_q[cs->sync_head];
    int rc = submit(cs, IO_SYNC, i, NULL, 0, 0, NULL, NULL);
    if (rc == -EAGAIN) break;
    if (rc) {
      submit_failed(cs, i, "fsync", rc);
      return;
    }
    cs->files[i].sync = 1;
    cs->sync_head++;
  }
  if (cs->nsynced == cs->nfiles && acked_all && cs->io == 0) send_done(cs);
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
  rb->run_next = rb->run_pos = 0;
  /* behind the frames already waiting for descriptors, in the order they came */
  if (cs->recv_wait || recv_runs(cs, rb) > 0) {
    *cs->recv_wait_tail = rb;
    cs->recv_wait_tail = &rb->next;
  }
}

/* Hands rb's runs (checked) to the ring from rb->run_next on: 0 when all
 * are, 1 when the rest waits for a descriptor, -1 when the save failed. */
static int recv_runs(sd_csave *cs, sd_rbuf *rb) {
  json_t *runs = json_object_get(rb->hdr, "runs");
  size_t n = json_array_size(runs);
  for (; rb->run_next < n; rb->run_next++) {
    json_t *e = json_array_get(runs, rb->run_next);
    uint32_t f = (uint32_t)json_integer_value(json_array_get(e, 0));
    uint64_t off = (uint64_t)json_integer_value(json_array_get(e, 1));
    uint64_t len = (uint64_t)json_integer_value(json_array_get(e, 2));
    uint32_t lf = (uint32_t)cs->fmap[f];
    int rc = submit(cs, IO_RECV, lf, rb->data + rb->run_pos, len, off, rb, NULL);
    if (rc == -EAGAIN) return 1;
    if (rc) {
      rbuf_put(cs, rb, 0);
      submit_failed(cs, lf, "write", rc);
      return -1;
    }
    /* forwarded bytes count where they are written, from the frame they came in */
    if (cs->sums) cs->sums[lf] ^= sd_crc32c_piece(rb->data + rb->run_pos, len, cs->files[lf].size - (off + len));
    rb->run_pos += len;
  }
  rbuf_put(cs, rb, 1);
  return 0;
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
