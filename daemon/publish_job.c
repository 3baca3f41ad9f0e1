/* A publish as the writer's job: its files' writes (staged and zero-copy) and fsyncs, the folder's fsync, the swap-in, the parent's fsync, and its end either way. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crashpoint.h"
#include "log.h"
#include "pathsafe.h"
#include "publish_int.h"

/* ------------------------------------------------------------------------ *
 * Errors
 * ------------------------------------------------------------------------ */
void sd_publish_log(const sd_publish *p, const char *msg) {
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

void sd_publish_free(sd_publish *p) {
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

void sd_publish_discard(sd_publish *p) {
  close_all(p);
  if (p->parent_fd < 0) return; /* sd_path_open_parent took back its own folders */
  if (p->renamed) {
    int rc = p->exchanged
                 ? renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_EXCHANGE)
                 : renameat2(p->parent_fd, p->base, p->parent_fd, p->tmp_name, RENAME_NOREPLACE);
    if (rc < 0) {
      char msg[600];
      snprintf(msg, sizeof msg, "cannot undo the rename of %s: %s", p->rel_dir, strerror(errno));
      sd_publish_log(p, msg);
    }
    p->renamed = 0;
  }
  if (p->tmp_name) {
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) sd_publish_log(p, e.msg);
  }
  sd_path_unmake_parents(p->root_fd, p->rel_dir, p->created_parents);
}

static void finish_failed(sd_publish *p) {
  sd_publish_discard(p);
  sd_publish_log(p, p->err.msg);
  sd_writer_detach(p->job.w, &p->job);
  sd_error err = p->err;
  p->on_done(p, p->ud, &err, NULL);
  sd_publish_free(p);
}

static void finish_ok(sd_publish *p) {
  if (p->exchanged) {
    /* The old checkpoint now sits under the temporary name. Failing to
     * remove it does not unpublish the new one; a restart cleans it up. */
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) sd_publish_log(p, e.msg);
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
  sd_publish_free(p);
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

const sd_wjob_ops sd_publish_ops = {
  .next = job_next,
  .complete = job_complete,
  .progress = job_progress,
  .stage = job_stage,
  .fill = job_fill,
  .filled = job_filled,
  .poll = job_poll,
  .fail = job_fail,
};

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
