/* One save's way to disk: temporary folder, zero-copy and staged direct-I/O writes through the ring, fsyncs, atomic rename, parent fsync. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crashpoint.h"
#include "direct.h"
#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "publish.h"

#define DIR_TAG 0xffffffffu   /* the fsync of a folder, not of a file */
#define FILES_MAX 0x80000000u

typedef struct {
  const char *name;        /* points into the plan, the request copy or artifact copy */
  int fd;
  int slot;                /* fixed-file slot, -1 none, -2 not asked for yet */
  int direct;              /* opened O_DIRECT: whole blocks only */
  int trim;                /* longer than size (padding, preallocation): cut before fsync */
  uint64_t size;           /* final length */
  uint64_t left;           /* bytes not yet written; 0 queues its fsync */
} pub_file;

typedef enum {
  PH_WRITE,                /* data, headers, artifacts, index; each file fsynced when whole */
  PH_DIRSYNC,              /* the temporary folder */
  PH_PARENTSYNC,           /* after the rename: the folder holding ROOT/DIR */
} pub_phase;

struct sd_publish {
  sd_wjob job;             /* first: the writer hands it back to us */
  char *root_path, *rel_dir, *tag, *tmp_name;
  const char *base;        /* last part of rel_dir */
  int root_fd, parent_fd, tmp_fd;
  unsigned created_parents;
  int overwrite;
  int record_owner;
  uid_t owner_uid;

  size_t nfiles;           /* shards, then artifacts, then the index */
  pub_file *files;
  uint32_t index_file;     /* the index's position in files, or DIR_TAG when there is none */
  unsigned file_mode, dir_mode;
  uint8_t *artifact_bytes;
  char *names;             /* copied artifact names */

  sd_fill fill;            /* the bytes of every file, and the staging cursor */
  sd_fill_file *fill_files;
  sd_write_op *own_ops;    /* a sorted copy when the caller's ops were not sorted */
  sd_shm_span *spans;      /* the request's, sorted by base */
  sd_chunk *wq, **wq_tail; /* filled chunks waiting for the ring */
  sd_direct zc;            /* zero-copy writes of fill */
  uint64_t bytes_direct;   /* file bytes written straight from the clients' segments */
  uint64_t bytes_gathered; /* ... of them gathered from several sources in one writev (not in bytes_direct) */
  uint64_t bytes_sealed;   /* source bytes staged from sealed memfds (no shrink check, no guard) */
  int said_buffered;       /* the O_DIRECT fallback was logged */
  uint32_t *ready;         /* files whose bytes are all written, awaiting fsync */
  size_t ready_head, ready_tail, nsynced;

  uint64_t ops_left;       /* bytes still to read from callers' sources */
  uint64_t bytes_total, bytes_written;
  int released;

  pub_phase phase;
  int hold;                /* sources may still change: do not publish yet */
  int dir_queued, dir_done;
  int renamed, exchanged;

  int failed;
  sd_error err;

  sd_publish_released_cb on_released;
  sd_publish_done_cb on_done;
  void *ud;
};

static unsigned long tmp_counter;

/* ------------------------------------------------------------------------ *
 * Errors
 * ------------------------------------------------------------------------ */
/* Only failures are logged here; the daemon's logger reports the rest. */
static void plog(const sd_publish *p, const char *msg) {
  sd_log_warn("save '%s': publish: %s", p->tag ? p->tag : "?", msg);
}

/* The first failure wins: later ones are usually its consequences. */
static void pub_fail(sd_publish *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pub_fail(sd_publish *p, int code, const char *fmt, ...) {
  if (p->failed) return;
  p->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&p->err, code, fmt, ap);
  va_end(ap);
}

static void fail_errno(sd_publish *p, int e, uint32_t f, const char *what, uint64_t off) {
  const char *name = f == DIR_TAG ? "" : p->files[f].name;
  const char *sep = f == DIR_TAG ? "" : "/";
  int code = sd_err_from_errno(e);
  if (code == SHARDD_E_NO_SPACE)
    pub_fail(p, code, "no space left writing %s%s%s: %s", p->rel_dir, sep, name, strerror(e));
  else if (!strcmp(what, "write"))
    pub_fail(p, code, "%s%s%s: write at offset %llu: %s", p->rel_dir, sep, name, (unsigned long long)off,
             strerror(e));
  else
    pub_fail(p, code, "%s%s%s: %s: %s", p->rel_dir, sep, name, what, strerror(e));
}

/* ------------------------------------------------------------------------ *
 * Tear-down
 * ------------------------------------------------------------------------ */
static void close_file(sd_publish *p, pub_file *pf) {
  if (pf->slot >= 0) sd_writer_file_unslot(p->job.w, pf->slot);
  pf->slot = -1;
  if (pf->fd >= 0) close(pf->fd);
  pf->fd = -1;
}

static void close_all(sd_publish *p) {
  for (size_t i = 0; i < p->nfiles; i++) close_file(p, &p->files[i]);
  if (p->tmp_fd >= 0) close(p->tmp_fd);
  p->tmp_fd = -1;
}

static void pub_free(sd_publish *p) {
  close_all(p);
  if (p->parent_fd >= 0) close(p->parent_fd);
  free(p->root_path);
  free(p->rel_dir);
  free(p->tag);
  free(p->tmp_name);
  free(p->files);
  free(p->artifact_bytes);
  free(p->names);
  free(p->fill_files);
  free(p->own_ops);
  free(p->spans);
  sd_direct_free(&p->zc);
  free(p->ready);
  free(p);
}

/* Leaves no trace: the rename undone if it happened, the temporary folder
 * and any parent folders this save created removed. */
static void discard(sd_publish *p) {
  close_all(p);
  if (p->parent_fd < 0) return; /* sd_path_open_parent took back its own folders */
  if (p->renamed) {
    int rc = p->exchanged
                 ? renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_EXCHANGE)
                 : renameat2(p->parent_fd, p->base, p->parent_fd, p->tmp_name, RENAME_NOREPLACE);
    if (rc < 0) {
      char msg[600];
      snprintf(msg, sizeof msg, "cannot undo the rename of %s: %s", p->rel_dir, strerror(errno));
      plog(p, msg);
    }
    p->renamed = 0;
  }
  if (p->tmp_name) {
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) plog(p, e.msg);
  }
  sd_path_unmake_parents(p->root_fd, p->rel_dir, p->created_parents);
}

static void finish_failed(sd_publish *p) {
  discard(p);
  plog(p, p->err.msg);
  sd_writer_detach(p->job.w, &p->job);
  sd_error err = p->err;
  p->on_done(p, p->ud, &err, NULL);
  pub_free(p);
}

static void finish_ok(sd_publish *p) {
  if (p->exchanged) {
    /* The old checkpoint now sits under the temporary name. Failing to
     * remove it does not unpublish the new one; a restart cleans it up. */
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) plog(p, e.msg);
  }
  sd_writer_detach(p->job.w, &p->job);
  size_t rl = strlen(p->root_path);
  while (rl > 1 && p->root_path[rl - 1] == '/') rl--;
  size_t n = rl + 1 + strlen(p->rel_dir) + 1;
  char *path = malloc(n);
  if (!path) {
    sd_error err;
    sd_fail(&err, SHARDD_E_NO_MEMORY, "published %s but cannot report its path", p->rel_dir);
    p->on_done(p, p->ud, &err, NULL);
  } else {
    snprintf(path, n, "%.*s%s%s", (int)rl, p->root_path,
             p->root_path[rl - 1] == '/' ? "" : "/", p->rel_dir);
    p->on_done(p, p->ud, NULL, path);
    free(path);
  }
  pub_free(p);
}

/* ------------------------------------------------------------------------ *
 * The job as the writer sees it
 * ------------------------------------------------------------------------ */
/* Buffered from now on: the file system refused a direct write. */
static void go_buffered(sd_publish *p, pub_file *pf) {
  int fl = fcntl(pf->fd, F_GETFL);
  if (fl >= 0) fcntl(pf->fd, F_SETFL, fl & ~O_DIRECT);
  pf->direct = 0;
  if (!p->said_buffered) {
    p->said_buffered = 1;
    sd_log_warn("save '%s': writing buffered: %s/%s refused a direct write (%s); the rest goes through the page cache",
                p->tag, p->rel_dir, pf->name, strerror(EINVAL));
  }
}

static int file_fd(sd_publish *p, pub_file *pf, int *fixed) {
  if (pf->slot == -2) pf->slot = sd_writer_file_slot(p->job.w, pf->fd);
  *fixed = pf->slot >= 0;
  return pf->slot >= 0 ? pf->slot : pf->fd;
}

static void put_chunk(sd_publish *p, sd_chunk *c) {
  sd_writer_chunk_put(p->job.w, c);
}

static void drop_waiting(sd_publish *p) {
  while (p->wq) {
    sd_chunk *c = p->wq;
    p->wq = c->next;
    put_chunk(p, c);
  }
  p->wq_tail = &p->wq;
}

/* A zero-copy write from a client's segment: one to resubmit first, then the next ready stretch. */
static int direct_next(sd_publish *p, sd_io *io) {
  sd_fill_piece *pc = sd_direct_next(&p->zc, &p->fill);
  if (!pc) return 0;
  pub_file *pf = &p->files[pc->file];
  sd_direct_io(&p->fill, pc, io);
  io->count = sd_io_count_of(pf->direct);
  io->fd = file_fd(p, pf, &io->fixed);
  io->off = pc->off;
  return 1;
}

static int job_next(sd_wjob *job, sd_io *io) {
  sd_publish *p = (sd_publish *)job;
  if (p->failed) return 0;
  if (p->phase == PH_WRITE) {
    /* fsyncs first: they end a file, and a file's fsync overlaps the next file's writes */
    if (p->ready_head < p->ready_tail) {
      uint32_t f = p->ready[p->ready_head++];
      io->kind = SD_IO_FSYNC;
      io->fd = file_fd(p, &p->files[f], &io->fixed);
      io->tag = f;
      return 1;
    }
    sd_chunk *c = p->wq;
    if (!c) return direct_next(p, io);
    p->wq = c->next;
    if (!p->wq) p->wq_tail = &p->wq;
    c->next = NULL;
    pub_file *pf = &p->files[c->file];
    /* A direct file takes whole blocks: the last one goes out padded with
     * zeros, and the file is cut to its size before its fsync. */
    uint32_t len = pf->direct ? (uint32_t)sd_align_up(c->len) : c->len;
    if (len > c->len) pf->trim = 1;
    if (c->done == 0) io->count = sd_io_count_of(pf->direct);
    io->kind = SD_IO_WRITE;
    io->fd = file_fd(p, pf, &io->fixed);
    io->buf_index = c->buf_index;
    io->tag = c->file;
    io->off = c->off + c->done;
    io->src = c->buf + c->done;
    io->len = len - c->done;
    io->chunk = c;
    return 1;
  }
  if (p->dir_queued) return 0;
  p->dir_queued = 1;
  io->kind = SD_IO_FSYNC;
  io->fd = p->phase == PH_DIRSYNC ? p->tmp_fd : p->parent_fd;
  io->tag = DIR_TAG;
  return 1;
}

/* Bytes of the file itself, never the padding of a last block. */
static void job_progress(sd_wjob *job, const sd_io *io, uint32_t bytes) {
  sd_publish *p = (sd_publish *)job;
  const sd_chunk *c = io->chunk;
  if (!c) {
    if (io->kind == SD_IO_WRITE) p->bytes_written += bytes, *(io->iov ? &p->bytes_gathered : &p->bytes_direct) += bytes;
    return;
  }
  uint64_t before = (uint64_t)c->done + io->done, after = before + bytes;
  p->bytes_written += (after < c->len ? after : c->len) - (before < c->len ? before : c->len);
}

/* len more bytes of file f are on disk; once all are, it is cut to size and its fsync queued. */
static void file_wrote(sd_publish *p, uint32_t f, uint64_t len) {
  pub_file *pf = &p->files[f];
  sd_crash_point("write");
  if (f == p->index_file) sd_crash_point("index");
  if ((pf->left -= len) > 0) return;
  if (pf->trim && ftruncate(pf->fd, (off_t)pf->size) < 0) {
    fail_errno(p, errno, f, "truncate to its size", 0);
    return;
  }
  p->ready[p->ready_tail++] = f;
}

static void write_complete(sd_publish *p, const sd_io *io, int res) {
  sd_chunk *c = io->chunk;
  uint32_t f = io->tag;
  pub_file *pf = &p->files[f];
  if (res == -EINVAL && pf->direct && !p->failed) {
    /* Whatever went out stays; the rest goes again through the page cache.
     * A padded last block may have gone out whole: past c->len is padding. */
    go_buffered(p, pf);
    uint64_t done = (uint64_t)c->done + io->done;
    c->done = done < c->len ? (uint32_t)done : c->len;
    if (c->done < c->len) {
      c->next = p->wq;
      p->wq = c;
      if (!c->next) p->wq_tail = &c->next;
      return;
    }
    res = (int)c->len;
  }
  put_chunk(p, c);
  if (res < 0) {
    fail_errno(p, -res, f, "write", io->off + io->done);
    return;
  }
  file_wrote(p, f, c->len);
}

/* A zero-copy write ended: its pages leave the daemon's page tables, as a
 * staged copy's do. A segment the client shrank makes it fail with EFAULT
 * (save.c then reports the region as out_of_range). */
static void direct_complete(sd_publish *p, const sd_io *io, int res) {
  sd_fill_piece *pc = io->req;
  pub_file *pf = &p->files[pc->file];
  uint64_t done;
  int buffered;
  res = sd_direct_complete(&p->zc, pc, res, io, pf->direct && !p->failed, &done, &buffered);
  p->ops_left -= done;
  if (buffered) go_buffered(p, pf);
  if (res == 1) {
    pf->left -= done;
    return;
  }
  if (res < 0) {
    fail_errno(p, -res, pc->file, "write", io->off + io->done);
    return;
  }
  file_wrote(p, pc->file, done);
}

static void job_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_publish *p = (sd_publish *)job;
  if (io->tag != DIR_TAG) res = sd_fault_point(io->kind == SD_IO_FSYNC ? "fsync" : "write", res);
  if (io->tag == DIR_TAG) {
    if (res < 0)
      fail_errno(p, -res, DIR_TAG,
                 p->phase == PH_DIRSYNC ? "fsync of the new folder" : "fsync of its parent", 0);
    else
      p->dir_done = 1;
    return;
  }
  uint32_t f = io->tag;
  if (io->kind == SD_IO_FSYNC) {
    if (res < 0) {
      fail_errno(p, -res, f, "fsync", 0);
      return;
    }
    close_file(p, &p->files[f]);
    p->nsynced++;
    sd_crash_point("fsync");
    if (f == p->index_file) sd_crash_point("index");
    return;
  }
  if (io->chunk)
    write_complete(p, io, res);
  else
    direct_complete(p, io, res);
}

static int job_stage(sd_wjob *job, sd_chunk *c) {
  sd_publish *p = (sd_publish *)job;
  if (p->failed || p->phase != PH_WRITE) return 0;
  return sd_fill_next(&p->fill, c->cap, c);
}

static void job_fill(sd_wjob *job, sd_chunk *c) {
  sd_fill_copy(&((sd_publish *)job)->fill, c);
}

static void job_filled(sd_wjob *job, sd_chunk *c) {
  sd_publish *p = (sd_publish *)job;
  p->ops_left -= c->src_bytes;
  p->bytes_sealed += c->src_sealed;
  if (c->fault) {
    /* save.c names the client's segment that shrank, when it finds it. */
    const char *why = c->fault == EFAULT    ? "faulted (SIGBUS): a client's shared memory is shorter than when it was attached"
                      : c->fault == ENODATA ? "came up short: a client's shared memory is shorter than when it was attached"
                                            : strerror(c->fault);
    pub_fail(p, SHARDD_E_IO, "%s/%s: reading the bytes for offset %llu %s%s", p->rel_dir, p->files[c->file].name,
             (unsigned long long)c->fault_off, c->fault == EFAULT || c->fault == ENODATA ? "" : "from shared memory: ",
             why);
  }
  if (p->failed) {
    put_chunk(p, c);
    return;
  }
  c->next = NULL;
  *p->wq_tail = c;
  p->wq_tail = &c->next;
}

static int do_rename(sd_publish *p) {
  sd_error err;
  if (sd_publish_swap_in(p->parent_fd, p->tmp_name, p->base, p->rel_dir, p->overwrite, &p->exchanged, &err) != 0) {
    pub_fail(p, err.code, "%s", err.msg);
    return -1;
  }
  p->renamed = 1;
  return 0;
}

static void job_poll(sd_wjob *job) {
  sd_publish *p = (sd_publish *)job;
  if (!p->failed && !p->released && p->ops_left == 0) {
    p->released = 1;
    if (p->on_released) p->on_released(p, p->ud); /* may cancel p */
  }
  if (p->failed) {
    drop_waiting(p);
    if (p->job.inflight == 0 && p->job.filling == 0) finish_failed(p);
    return;
  }
  if (p->phase == PH_WRITE && p->nsynced == p->nfiles && p->job.inflight == 0 && !p->hold) {
    p->phase = PH_DIRSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_DIRSYNC && p->dir_done) {
    sd_crash_point("dirsync");
    if (do_rename(p) < 0) {
      finish_failed(p); /* nothing is in flight after the folder's fsync */
      return;
    }
    sd_crash_point("rename");
    p->phase = PH_PARENTSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_PARENTSYNC && p->dir_done) {
    sd_crash_point("parentsync");
    finish_ok(p);
  }
}

static void job_fail(sd_wjob *job, int code, const char *why) {
  sd_publish_cancel((sd_publish *)job, code, why);
}

static const sd_wjob_ops pub_ops = {
  .next = job_next,
  .complete = job_complete,
  .progress = job_progress,
  .stage = job_stage,
  .fill = job_fill,
  .filled = job_filled,
  .poll = job_poll,
  .fail = job_fail,
};

/* ------------------------------------------------------------------------ *
 * Start
 * ------------------------------------------------------------------------ */
static char *dupstr(const char *s) {
  return s ? strdup(s) : NULL;
}

/* Files, sizes and writes, checked and laid out before anything touches the disk. */
static int prepare(sd_publish *p, const sd_publish_req *req, sd_error *err) {
  const sd_plan *plan = req->plan;
  size_t nf = plan->nfiles + req->nartifacts + (plan->needs_index ? 1 : 0);
  if (nf >= FILES_MAX) return sd_fail(err, SHARDD_E_LIMIT, "too many files in one checkpoint");
  p->files = calloc(nf ? nf : 1, sizeof *p->files);
  p->ready = calloc(nf ? nf : 1, sizeof *p->ready);
  p->fill_files = calloc(nf ? nf : 1, sizeof *p->fill_files);
  if (!p->files || !p->ready || !p->fill_files) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish files");
  p->nfiles = nf;
  p->index_file = DIR_TAG;
  p->wq_tail = &p->wq;
  for (size_t i = 0; i < nf; i++) {
    p->files[i].fd = -1;
    p->files[i].slot = -2;
  }

  size_t art_bytes = 0, name_bytes = 0;
  for (size_t i = 0; i < req->nartifacts; i++) {
    int rc = sd_path_check_name(req->artifacts[i].name, err);
    if (rc) return rc;
    if (req->artifacts[i].len && !req->artifacts[i].data)
      return sd_fail(err, SHARDD_E_INTERNAL, "file '%s' has no bytes", req->artifacts[i].name);
    art_bytes += req->artifacts[i].len;
    name_bytes += strlen(req->artifacts[i].name) + 1;
  }
  p->artifact_bytes = malloc(art_bytes ? art_bytes : 1);
  p->names = malloc(name_bytes ? name_bytes : 1);
  if (!p->artifact_bytes || !p->names) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish files");

  sd_fill_file *ff = p->fill_files;
  uint32_t f = 0;
  for (; f < plan->nfiles; f++) {
    const sd_plan_file *pf = &plan->files[f];
    int rc = sd_path_check_name(pf->name, err);
    if (rc) return rc;
    if (pf->header_size > pf->file_size)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: header is larger than the file", pf->name);
    p->files[f].name = pf->name;
    ff[f] = (sd_fill_file){(const uint8_t *)pf->header, pf->header_size, pf->file_size};
  }
  for (size_t i = 0; i < req->nops; i++) {
    const sd_write_op *op = &req->ops[i];
    if (op->len == 0) continue;
    if (op->file >= plan->nfiles)
      return sd_fail(err, SHARDD_E_INTERNAL, "write %zu names file %u of %zu", i, op->file,
                     plan->nfiles);
    uint64_t size = plan->files[op->file].file_size;
    if (!op->src || op->len > size || op->file_offset > size - op->len)
      return sd_fail(err, SHARDD_E_INTERNAL, "write %zu (%llu bytes at %llu) lies outside %s", i,
                     (unsigned long long)op->len, (unsigned long long)op->file_offset,
                     plan->files[op->file].name);
    p->ops_left += op->len;
  }
  uint8_t *ab = p->artifact_bytes;
  char *nb = p->names;
  for (size_t i = 0; i < req->nartifacts; i++, f++) {
    const sd_artifact *a = &req->artifacts[i];
    size_t nl = strlen(a->name) + 1;
    memcpy(nb, a->name, nl);
    p->files[f].name = nb;
    nb += nl;
    if (a->len) memcpy(ab, a->data, a->len);
    ff[f] = (sd_fill_file){ab, a->len, a->len};
    ab += a->len;
  }
  if (plan->needs_index) {
    int rc = sd_path_check_name(plan->index_name, err);
    if (rc) return rc;
    if (!req->index_json)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: the plan needs an index but none was given",
                     plan->index_name);
    p->files[f].name = plan->index_name;
    p->index_file = f;
    ff[f] = (sd_fill_file){(const uint8_t *)req->index_json, req->index_len, req->index_len};
    f++;
  }
  p->fill.files = ff;
  p->fill.nfiles = nf;
  if (req->nspans && !(p->spans = sd_fill_set_spans(&p->fill, req->spans, req->nspans)))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish sources");
  if (req->op_ready && !sd_fill_ops_sorted(req->ops, req->nops))
    return sd_fail(err, SHARDD_E_INTERNAL, "publish: streamed writes must come sorted");
  if (sd_fill_set_ops(&p->fill, req->ops, req->nops, &p->own_ops) != 0)
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish writes");
  p->fill.ready = req->op_ready;
  /* Each file's writes in order: none may overlap another or the header. */
  const sd_write_op *prev = NULL;
  for (size_t i = 0; i < p->fill.nops; i++) {
    const sd_write_op *c = &p->fill.ops[i];
    if (c->len == 0) continue;
    uint64_t floor = prev && prev->file == c->file ? prev->file_offset + prev->len : ff[c->file].head_len;
    if (c->file_offset < floor)
      return sd_fail(err, SHARDD_E_INTERNAL, "writes overlap in %s at offset %llu",
                     p->files[c->file].name, (unsigned long long)c->file_offset);
    prev = c;
  }
  /* Every byte of every file is written (bytes no write covers as zeros). */
  for (size_t i = 0; i < nf; i++) {
    p->files[i].size = p->files[i].left = ff[i].size;
    p->bytes_total += ff[i].size;
  }
  return 0;
}

/* O_DIRECT when the file system takes it; the file then gets its blocks up
 * front (preallocated: the writes overwrite allocated blocks instead of
 * allocating under an exclusive lock) and its size rounded up to whole
 * blocks, cut back once the last write is in. */
static int go_direct(sd_publish *p, pub_file *pf) {
  if (sd_writer_buffered(p->job.w) || pf->size == 0) return 0;
  int fl = fcntl(pf->fd, F_GETFL);
  if (fl < 0 || fcntl(pf->fd, F_SETFL, fl | O_DIRECT) < 0) {
    if (!p->said_buffered) {
      p->said_buffered = 1;
      sd_log_warn("save '%s': writing buffered: %s%s%s refuses O_DIRECT (%s)", p->tag, p->root_path,
                  p->root_path[0] && p->root_path[strlen(p->root_path) - 1] == '/' ? "" : "/", p->rel_dir,
                  strerror(errno));
    }
    return 0;
  }
  pf->direct = 1;
  /* A failure here only loses the optimisation: the writes themselves
   * report a full disk or a file too large, naming the file and offset. */
  off_t sized = (off_t)sd_align_up(pf->size);
  if (fallocate(pf->fd, 0, 0, sized) == 0 || ftruncate(pf->fd, sized) == 0)
    pf->trim = (uint64_t)sized > pf->size;
  return 0;
}

/* The temporary folder and every file in it. */
static int make_files(sd_publish *p, sd_error *err) {
  char name[NAME_MAX + 1];
  sd_publish_tmp_name(name, p->base, p->tag, ++tmp_counter);
  if (!(p->tmp_name = strdup(name))) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");

  if (mkdirat(p->parent_fd, p->tmp_name, 0700) < 0) {
    int e = errno;
    free(p->tmp_name);
    p->tmp_name = NULL; /* not ours: never remove it */
    return sd_fail(err, sd_err_from_errno(e),
                   "cannot create a temporary folder beside '%s': %s", p->rel_dir, strerror(e));
  }
  p->tmp_fd = sd_openat_beneath(p->parent_fd, p->tmp_name, O_RDONLY | O_DIRECTORY, 0);
  if (p->tmp_fd < 0)
    return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", p->rel_dir,
                   strerror(-p->tmp_fd));

  int rc = 0;
  for (size_t i = 0; i < p->nfiles && !rc; i++) {
    pub_file *pf = &p->files[i];
    /* The folder is fresh and the name plain, so nothing here can be a symlink. */
    pf->fd = openat(p->tmp_fd, pf->name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, p->file_mode);
    if (pf->fd < 0) {
      int e = errno;
      if (e == EEXIST)
        rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "'%s' is given twice in %s", pf->name,
                     p->rel_dir);
      else
        rc = sd_fail(err, sd_err_from_errno(e),
                     "cannot create %s/%s: %s", p->rel_dir, pf->name, strerror(e));
    } else if (fchmod(pf->fd, p->file_mode) < 0) {
      rc = sd_fail(err, SHARDD_E_IO, "cannot set the mode of %s/%s: %s", p->rel_dir, pf->name, strerror(errno));
    } else {
      rc = go_direct(p, pf);
    }
    if (!rc && pf->left == 0) p->ready[p->ready_tail++] = (uint32_t)i;
  }
  /* Exactly the configured modes, whatever the daemon's umask; the folder's
   * last, so a mode without owner write cannot stop the files being made. */
  /* Set before the rename, so the folder is never visible without its owner. */
  int orc = !rc && p->record_owner ? sd_owner_record(p->tmp_fd, p->owner_uid) : 0;
  if (orc < 0)
    sd_log_warn("cannot record the owner (uid %u) of '%s': %s; only root, the daemon's uid and trusted_group"
                " members may overwrite it",
                (unsigned)p->owner_uid, p->rel_dir, strerror(-orc));
  if (!rc && fchmod(p->tmp_fd, p->dir_mode) < 0)
    rc = sd_fail(err, SHARDD_E_IO, "cannot set the mode of the folder for '%s': %s", p->rel_dir, strerror(errno));
  return rc;
}

/* The zero-copy stretches; one O_DIRECT file tells for the folder's device. */
static void plan_direct(sd_publish *p) {
  int probe = -1;
  for (size_t i = 0; i < p->nfiles && probe < 0; i++)
    if (p->files[i].direct) probe = p->files[i].fd;
  sd_direct_init(&p->zc, &p->fill, probe, 1);
}

int sd_publish_start(sd_writer *w, const sd_publish_req *req, sd_publish **out, sd_error *err) {
  *out = NULL;
  if (!w || !req || !req->plan || !req->on_done || !req->root_path)
    return sd_fail(err, SHARDD_E_INTERNAL, "publish: incomplete request");
  int rc = sd_path_check_rel(req->rel_dir, err);
  if (rc) return rc;
  sd_publish *p = calloc(1, sizeof *p);
  if (!p) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  p->job.ops = &pub_ops;
  p->root_fd = req->root_fd;
  p->parent_fd = p->tmp_fd = -1;
  p->overwrite = req->overwrite;
  p->file_mode = req->file_mode ? req->file_mode & 07777 : 0644;
  p->dir_mode = req->dir_mode ? req->dir_mode & 07777 : 0755;
  p->record_owner = req->record_owner;
  p->owner_uid = req->owner_uid;
  p->on_released = req->on_released;
  p->on_done = req->on_done;
  p->ud = req->ud;
  p->hold = req->hold;
  p->root_path = dupstr(req->root_path);
  p->rel_dir = dupstr(req->rel_dir);
  p->tag = dupstr(req->tag ? req->tag : "save");
  if (!p->root_path || !p->rel_dir || !p->tag) {
    pub_free(p);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  }

  p->job.w = w; /* for go_direct; attach sets it again */
  rc = prepare(p, req, err);
  if (!rc) rc = sd_path_open_parent(p->root_fd, p->rel_dir, 1, &p->parent_fd,
                                    &p->created_parents, &p->base, err);
  if (!rc) {
    int fd = sd_openat_beneath(p->parent_fd, p->base, O_PATH, 0);
    if (fd >= 0) {
      struct stat st;
      int isdir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
      close(fd);
      if (!p->overwrite)
        rc = sd_fail(err, SHARDD_E_EXISTS, "'%s' already exists under the root", p->rel_dir);
      else if (!isdir)
        rc = sd_fail(err, SHARDD_E_EXISTS, "'%s' exists and is not a folder", p->rel_dir);
    } else if (fd == -ELOOP || fd == -EXDEV) {
      rc = sd_fail(err, SHARDD_E_BAD_PATH, "'%s' is a symlink", p->rel_dir);
    } else if (fd != -ENOENT) {
      rc = sd_fail(err, SHARDD_E_IO, "'%s': %s", p->rel_dir, strerror(-fd));
    }
  }
  if (!rc) rc = make_files(p, err);
  if (!rc) plan_direct(p);
  if (!rc) rc = sd_writer_attach(w, &p->job, err);
  if (rc) {
    p->err = *err;
    discard(p);
    plog(p, err->msg);
    pub_free(p);
    return rc;
  }
  *out = p;
  sd_crash_point("start");
  sd_writer_pump(w);
  sd_writer_kick(w); /* a poll soon, whatever completes: release, empty files, failures */
  return 0;
}

void sd_publish_cancel(sd_publish *p, int code, const char *why) {
  /* Past the rename the checkpoint is in place; only the parent's fsync
   * remains, and finishing it beats unpublishing a whole checkpoint. */
  if (p->failed || p->renamed) return;
  pub_fail(p, code, "%s", why ? why : sd_err_message(code));
  sd_writer_kick(p->job.w);
}

void sd_publish_poke(sd_publish *p) {
  if (!p->failed) sd_writer_kick(p->job.w);
}

void sd_publish_unhold(sd_publish *p) {
  p->hold = 0;
  sd_writer_kick(p->job.w);
}

uint64_t sd_publish_bytes_written(const sd_publish *p) {
  return p->bytes_written;
}

uint64_t sd_publish_bytes_direct(const sd_publish *p) {
  return p->bytes_direct;
}

uint64_t sd_publish_bytes_gathered(const sd_publish *p) {
  return p->bytes_gathered;
}

uint64_t sd_publish_bytes_sealed(const sd_publish *p) {
  return p->bytes_sealed;
}

uint64_t sd_publish_bytes_total(const sd_publish *p) {
  return p->bytes_total;
}
