/* One set of files written from spans: per-file state, staged and zero-copy writes with O_DIRECT and its fallback, an fsync per file when durable, its counters and its errors; alone as a writer job, or driven by a publish's. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crashpoint.h"
#include "direct.h"
#include "fileset.h"
#include "log.h"
#include "sd_checksum.h"

typedef struct {
  int fd;
  int slot;                /* fixed-file slot, -1 none, -2 not asked for yet */
  int tried;               /* O_DIRECT was tried on it (by name: set again on each later descriptor) */
  int odirect;             /* O_DIRECT set: whole blocks only */
  int trim;                /* written past its size (a padded last block): cut back once whole */
  uint64_t base;           /* where in the descriptor's file it starts */
  uint64_t size, left;     /* bytes not yet written */
} fs_file;

struct sd_fileset {
  sd_wjob job;             /* first: sd_fileset_start's job, handed back as this (idle when a caller drives the set) */
  sd_writer *w;
  sd_fileset_req r;
  sd_fill fill;
  sd_zero_copy zc;         /* zero-copy writes of fill */
  fs_file *f;
  sd_chunk *wq, **wq_tail; /* filled chunks waiting for the ring */
  uint32_t *ready;         /* durable: files whose bytes are all written, awaiting fsync */
  size_t ready_head, ready_tail;
  size_t nwhole, nsynced;
  uint64_t ops_left;       /* source bytes still to read */
  sd_fileset_counts n;
  int failed, said_buffered;
  char write_point[40];    /* tests: "<point>_write" (filejob_write), made once, not per write */
  char *where;             /* by name: req.where, kept for the files not yet opened */
  sd_fdset *byname;        /* by name: the descriptors, opened on demand under the writer's cap */
  sd_error err;
};

/* ------------------------------------------------------------------------ *
 * Errors
 * ------------------------------------------------------------------------ */
void sd_fileset_failf(sd_fileset *s, int code, const char *fmt, ...) {
  if (s->failed) return;
  s->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(&s->err, code, fmt, ap);
  va_end(ap);
  sd_writer_kick(s->w);
}

/* A file as messages name it: dir/name, or the folder alone. */
#define FS_PATH(s, f) (s)->r.dir ? (s)->r.dir : "", (s)->r.dir && (f) != SD_FILESET_NONE ? "/" : "", \
                      (f) == SD_FILESET_NONE ? "" : (s)->r.names[f]

void sd_fileset_fail_errno(sd_fileset *s, int e, uint32_t f, const char *what, uint64_t off) {
  int code = sd_err_from_errno(e);
  if (code == SHARDD_E_NO_SPACE)
    sd_fileset_failf(s, code, "no space left writing %s%s%s: %s", FS_PATH(s, f), strerror(e));
  else if (!strcmp(what, "write"))
    sd_fileset_failf(s, code, "%s%s%s: write at offset %llu: %s", FS_PATH(s, f), (unsigned long long)off,
                     strerror(e));
  else
    sd_fileset_failf(s, code, "%s%s%s: %s: %s", FS_PATH(s, f), what, strerror(e));
}

const sd_error *sd_fileset_error(const sd_fileset *s) {
  return s->failed ? &s->err : NULL;
}

static int stopped(const sd_fileset *s) {
  return s->failed || (s->r.stop && *s->r.stop);
}

/* ------------------------------------------------------------------------ *
 * O_DIRECT and its fallback
 * ------------------------------------------------------------------------ */
/* O_DIRECT on (or off) for fd: 0, or -1 with errno when the file system refuses it. */
static int set_odirect(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_DIRECT : fl & ~O_DIRECT);
}

/* Buffered from now on: the file system refused an O_DIRECT write. */
static void go_buffered(sd_fileset *s, uint32_t i) {
  fs_file *ff = &s->f[i];
  set_odirect(ff->fd, 0);
  ff->odirect = 0;
  if (!s->said_buffered) {
    s->said_buffered = 1;
    sd_log_warn("save '%s': writing buffered: %s%s%s refused a direct write (%s); the rest goes through the page cache",
                s->r.tag, FS_PATH(s, i), strerror(EINVAL));
  }
}

/* O_DIRECT when the file system takes it; the file then gets its blocks up
 * front (preallocated: the writes overwrite allocated blocks instead of
 * allocating under an exclusive lock). A last block that is not whole goes
 * out padded, so only a file (or region) ending that way grows to whole
 * blocks, and it is cut back once its last write is in. A failure here only
 * loses the optimisation: the writes themselves report a full disk. */
static void go_odirect(sd_fileset *s, uint32_t i) {
  fs_file *ff = &s->f[i];
  ff->tried = 1;
  if (sd_writer_buffered(s->w) || ff->size == 0) return;
  if (set_odirect(ff->fd, 1) < 0) {
    if (!s->said_buffered) {
      s->said_buffered = 1;
      if (s->r.where)
        sd_log_warn("save '%s': writing buffered: %s refuses O_DIRECT (%s)", s->r.tag, s->r.where, strerror(errno));
      else
        sd_log_warn("save '%s': writing buffered: %s%s%s refuses O_DIRECT (%s)", s->r.tag, FS_PATH(s, i),
                    strerror(errno));
    }
    return;
  }
  ff->odirect = 1;
  off_t sized = (off_t)sd_align_up(ff->size);
  ff->trim = (uint64_t)sized > ff->size;
  if (fallocate(ff->fd, 0, (off_t)ff->base, sized) < 0 && ff->trim) (void)!ftruncate(ff->fd, (off_t)ff->base + sized);
}

/* ------------------------------------------------------------------------ *
 * The writes and fsyncs, as the writer sees them
 * ------------------------------------------------------------------------ */
static int file_fd(sd_fileset *s, fs_file *ff, int *fixed) {
  if (ff->slot == -2) ff->slot = sd_writer_file_slot(s->w, ff->fd);
  *fixed = ff->slot >= 0;
  return ff->slot >= 0 ? ff->slot : ff->fd;
}

/* By name: the pool opened file i as fd (the first time, or again after
 * closing it idle to make room): O_DIRECT as before, a fixed slot asked for
 * at its first request. */
static void byname_opened(void *ud, uint32_t i, int fd) {
  sd_fileset *s = ud;
  fs_file *ff = &s->f[i];
  ff->fd = fd;
  ff->slot = s->r.durable ? -2 : -1;
  if (!ff->tried) {
    go_odirect(s, i);
  } else if (ff->odirect && set_odirect(fd, 1) < 0) {
    go_buffered(s, i);
  }
}

/* ... and is about to close it. */
static void byname_closing(void *ud, uint32_t i, int fd) {
  (void)fd;
  sd_fileset *s = ud;
  fs_file *ff = &s->f[i];
  if (ff->slot >= 0) sd_writer_file_unslot(s->w, ff->slot);
  ff->slot = -1;
  ff->fd = -1;
}

static void close_file(sd_fileset *s, uint32_t i) {
  if (s->byname) {
    sd_fdset_close(s->byname, i);
    return;
  }
  fs_file *ff = &s->f[i];
  if (ff->slot >= 0) sd_writer_file_unslot(s->w, ff->slot);
  ff->slot = -1;
  if (ff->fd >= 0) close(ff->fd);
  ff->fd = -1;
}

/* 1 when file i's descriptor can be had now (by name: every one the cap
 * allows is busy until a request completes, which asks again). */
static int file_ready(const sd_fileset *s, uint32_t i) {
  return !s->byname || sd_fdset_ready(s->byname, i);
}

/* File i's descriptor for one request (by name: opened if need be, held
 * until file_done); -1 once the set failed for want of it. */
static int file_take(sd_fileset *s, uint32_t i) {
  if (!s->byname) return s->f[i].fd;
  int fd = sd_fdset_get(s->byname, i);
  if (fd < 0) sd_fileset_fail_errno(s, -fd, i, "open", 0);
  return fd < 0 ? -1 : fd;
}

/* A request on file i ended. */
static void file_done(sd_fileset *s, uint32_t i) {
  if (s->byname) sd_fdset_put(s->byname, i);
}

/* File i has all its bytes: durable, its fsync is queued. */
static void whole(sd_fileset *s, uint32_t i) {
  s->nwhole++;
  if (s->r.durable) s->ready[s->ready_tail++] = i;
}

/* A chunk's data bytes (never its head) against the end of its file. */
static uint32_t chunk_share(const sd_fileset *s, const sd_chunk *c) {
  const sd_fill_file *ff = &s->r.files[c->file];
  uint64_t lo = ff->head_len > c->off ? ff->head_len : c->off, hi = c->off + c->len;
  return lo < hi ? sd_crc32c_piece(c->buf + (lo - c->off), hi - lo, ff->size - hi) : 0;
}

/* A zero-copy piece goes out from the rank's own memory, which the rank can
 * change while the ring writes it: a rank that writes into its arena after
 * seal and before released. So its bytes are read (on the loop) before the
 * write and again once all of it has gone out (after a resubmit, all of it
 * again). Registers that differ mean the file may hold some of either: the
 * set fails naming the rank, rather than record a checksum its file does not
 * have. A change undone before the second read goes unseen. The second read
 * gives the piece's share; its pages are mapped by then (the write mapped
 * them, or the pin did). A segment the client shrank faults here as a staged
 * copy would: guarded. */
static int piece_read(sd_fileset *s, const sd_zero_copy_first *p, int after) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1)) {
    sd_fileset_failf(s, SHARDD_E_IO, "%s%s%s: reading the bytes for offset %llu faulted (SIGBUS): a client's shared "
                     "memory is shorter than when it was attached", FS_PATH(s, p->file),
                     (unsigned long long)(s->f[p->file].base + p->off));
    return -1;
  }
  sd_bus_guard = &jb;
  int n = p->niov ? p->niov : 1, bad = -1;
  uint32_t whole = 0;
  uint64_t pos = 0, bad_pos = 0;
  for (int i = 0; i < n; i++) {
    const uint8_t *src = p->niov ? p->iov[i].iov_base : p->src;
    uint64_t len = p->niov ? p->iov[i].iov_len : p->len;
    uint32_t reg = sd_crc32c_run(0, src, len);
    if (!after) {
      p->before[i] = reg;
    } else {
      if (reg != p->before[i] && bad < 0) bad = i, bad_pos = pos;
      whole = sd_crc32c_shift(whole, len) ^ reg;
    }
    pos += len;
  }
  sd_bus_guard = NULL;
  if (!after) return 0;
  if (bad >= 0) {
    const uint8_t *src = p->niov ? p->iov[bad].iov_base : p->src;
    const sd_shm_span *sp = sd_span_find(s->r.spans, s->r.nspans, src);
    sd_fileset_failf(s, SHARDD_E_BAD_STATE, "save '%s': rank %u changed its memory while the daemon was writing it "
                     "(%s%s%s at offset %llu, from offset %llu of its segment): a rank must leave its arena alone "
                     "from seal until the save is released", s->r.tag, sp ? sp->rank : 0, FS_PATH(s, p->file),
                     (unsigned long long)(s->f[p->file].base + p->off + bad_pos),
                     (unsigned long long)(sp ? (uint64_t)(src - sp->base) : 0));
    return -1;
  }
  s->r.sums[p->file] ^= sd_crc32c_shift(whole, s->r.files[p->file].size - (p->off + p->len));
  return 0;
}

/* A zero-copy write from a client's segment: one to resubmit first, then the next ready stretch. */
static int zero_copy_next(sd_fileset *s, sd_io *io) {
  int fresh;
  if (s->byname && !sd_fdset_room(s->byname)) return 0; /* whichever file it is, one can be had */
  sd_fill_piece *pc = sd_zero_copy_next(&s->zc, &s->fill, &fresh);
  if (!pc) return 0;
  if (file_take(s, pc->file) < 0) return 0;
  if (fresh && s->r.sums && piece_read(s, sd_zero_copy_first_of(&s->zc, pc), 0) < 0) return 0;
  fs_file *ff = &s->f[pc->file];
  sd_zero_copy_io(&s->fill, pc, io);
  io->count = sd_io_count_of(ff->odirect);
  io->fd = file_fd(s, ff, &io->fixed);
  io->off = ff->base + pc->off;
  return 1;
}

int sd_fileset_next(sd_fileset *s, sd_io *io) {
  if (stopped(s)) return 0;
  /* fsyncs first: they end a file, and a file's fsync overlaps the next file's writes */
  if (s->ready_head < s->ready_tail) {
    uint32_t i = s->ready[s->ready_head];
    if (!file_ready(s, i)) return 0;
    s->ready_head++;
    if (file_take(s, i) < 0) return 0;
    io->kind = SD_IO_FSYNC;
    io->fd = file_fd(s, &s->f[i], &io->fixed);
    io->tag = i;
    return 1;
  }
  sd_chunk *c = s->wq;
  if (!c) return zero_copy_next(s, io);
  if (!file_ready(s, c->file)) return 0;
  s->wq = c->next;
  if (!s->wq) s->wq_tail = &s->wq;
  c->next = NULL;
  fs_file *ff = &s->f[c->file];
  if (file_take(s, c->file) < 0) {
    sd_writer_chunk_put(s->w, c);
    return 0;
  }
  /* An O_DIRECT file takes whole blocks: the last one goes out padded with zeros. */
  uint32_t len = ff->odirect ? (uint32_t)sd_align_up(c->len) : c->len;
  if (c->done == 0) io->count = sd_io_count_of(ff->odirect);
  io->kind = SD_IO_WRITE;
  io->fd = file_fd(s, ff, &io->fixed);
  io->buf_index = c->buf_index;
  io->tag = c->file;
  io->off = ff->base + c->off + c->done;
  io->src = c->buf + c->done;
  io->len = len - c->done;
  io->chunk = c;
  return 1;
}

/* Bytes of the files themselves, never the padding of a last block. */
void sd_fileset_progress(sd_fileset *s, const sd_io *io, uint32_t bytes) {
  if (io->kind != SD_IO_WRITE) return;
  const sd_chunk *c = io->chunk;
  uint64_t n = bytes, zc = 0;
  if (!c) {
    if (io->iov) s->n.gathered += bytes;
    else s->n.zero_copy += bytes, zc = bytes;
  } else {
    uint64_t before = (uint64_t)c->done + io->done, after = before + bytes;
    n = (after < c->len ? after : c->len) - (before < c->len ? before : c->len);
  }
  s->n.written += n;
  if (s->r.bytes_written) *s->r.bytes_written += n;
  if (s->r.bytes_zero_copy) *s->r.bytes_zero_copy += zc;
}

/* len more bytes of file i are written; once all are, a padded last block is cut back. */
static void file_wrote(sd_fileset *s, uint32_t i, uint64_t len) {
  fs_file *ff = &s->f[i];
  if (!s->r.point) {
    sd_crash_point("write");
    if (i == s->r.index_file) sd_crash_point("index");
  } else {
    sd_crash_point(s->write_point); /* a write of a node's own files answered */
  }
  if ((ff->left -= len) > 0) return;
  if (ff->trim && ftruncate(ff->fd, (off_t)(ff->base + ff->size)) < 0) {
    sd_fileset_fail_errno(s, errno, i, "truncate to its size", 0);
    return;
  }
  whole(s, i);
}

static void write_ended(sd_fileset *s, const sd_io *io, int res) {
  sd_chunk *c = io->chunk;
  uint32_t i = c->file;
  if (res == -EINVAL && s->f[i].odirect && !stopped(s)) {
    /* Whatever went out stays; the rest goes again through the page cache.
     * A padded last block may have gone out whole: past c->len is padding. */
    go_buffered(s, i);
    uint64_t done = (uint64_t)c->done + io->done;
    c->done = done < c->len ? (uint32_t)done : c->len;
    if (c->done < c->len) {
      c->next = s->wq;
      s->wq = c;
      if (!c->next) s->wq_tail = &c->next;
      return;
    }
    res = (int)c->len;
  }
  sd_writer_chunk_put(s->w, c);
  if (res < 0) {
    sd_fileset_fail_errno(s, -res, i, "write", io->off + io->done);
    return;
  }
  file_wrote(s, i, c->len);
}

static void write_complete(sd_fileset *s, const sd_io *io, int res) {
  uint32_t i = io->chunk->file;
  write_ended(s, io, res);
  file_done(s, i);
}

/* A zero-copy write ended: its pages leave the daemon's page tables, as a
 * staged copy's do. A segment the client shrank makes it fail with EFAULT. */
static void zero_copy_ended(sd_fileset *s, const sd_io *io, int res) {
  sd_fill_piece *pc = io->req;
  fs_file *ff = &s->f[pc->file];
  uint64_t done;
  int buffered, can_buffer = ff->odirect && !stopped(s);
  /* read again once all of it went out, before its pages leave the daemon's page tables */
  if (s->r.sums && !s->failed && sd_zero_copy_outcome(pc, res, io, can_buffer) == 0)
    piece_read(s, sd_zero_copy_first_of(&s->zc, pc), 1);
  res = sd_zero_copy_complete(&s->zc, pc, res, io, can_buffer, &done, &buffered);
  s->ops_left -= done;
  if (buffered) go_buffered(s, pc->file);
  if (res == 1) {
    ff->left -= done;
    return;
  }
  if (res < 0) {
    sd_fileset_fail_errno(s, -res, pc->file, "write", io->off + io->done);
    return;
  }
  file_wrote(s, pc->file, done);
}

static void zero_copy_complete(sd_fileset *s, const sd_io *io, int res) {
  uint32_t i = ((const sd_fill_piece *)io->req)->file;
  zero_copy_ended(s, io, res);
  file_done(s, i);
}

static void synced(sd_fileset *s, uint32_t i, int res) {
  file_done(s, i);
  if (res < 0) {
    sd_fileset_fail_errno(s, -res, i, "fsync", 0);
    return;
  }
  close_file(s, i);
  s->nsynced++;
  if (!s->r.point) {
    sd_crash_point("fsync");
    if (i == s->r.index_file) sd_crash_point("index");
  }
}

void sd_fileset_complete(sd_fileset *s, const sd_io *io, int res) {
  /* tests: the kernel's answer replaced (SHARDD_TEST_FAULT), maybe as if half had gone out first
   * (a gathered write's iovecs would have moved: never so) */
  int half;
  res = sd_fault_point_part(s->r.point ? s->r.point : io->kind == SD_IO_FSYNC ? "fsync" : "write", res, &half);
  sd_io part;
  if (half && io->kind == SD_IO_WRITE && !io->iov && io->len > SD_DIO_ALIGN) {
    part = *io;
    part.done = (io->len / 2) & ~(SD_DIO_ALIGN - 1);
    io = &part;
    sd_log_info("save '%s': test fault: half of a %s write went out", s->r.tag, io->chunk ? "staged" : "zero-copy");
  }
  if (io->kind == SD_IO_FSYNC)
    synced(s, io->tag, res);
  else if (io->chunk)
    write_complete(s, io, res);
  else
    zero_copy_complete(s, io, res);
}

int sd_fileset_stage(sd_fileset *s, sd_chunk *c) {
  return stopped(s) ? 0 : sd_fill_next(&s->fill, c->cap, c);
}

void sd_fileset_fill(sd_fileset *s, sd_chunk *c) {
  sd_fill_copy(&s->fill, c);
  c->sum = s->r.sums && !c->fault ? chunk_share(s, c) : 0;
}

void sd_fileset_filled(sd_fileset *s, sd_chunk *c) {
  s->ops_left -= c->src_bytes;
  s->n.sealed += c->src_sealed;
  if (c->fault) {
    /* The caller names the client's segment that shrank, when it finds it. */
    const char *why = c->fault == EFAULT    ? "faulted (SIGBUS): a client's shared memory is shorter than when it was attached"
                      : c->fault == ENODATA ? "came up short: a client's shared memory is shorter than when it was attached"
                                            : strerror(c->fault);
    sd_fileset_failf(s, SHARDD_E_IO, "%s%s%s: reading the bytes for offset %llu %s%s", FS_PATH(s, c->file),
                     (unsigned long long)c->fault_off,
                     c->fault == EFAULT || c->fault == ENODATA ? "" : "from shared memory: ", why);
  }
  if (stopped(s)) {
    sd_writer_chunk_put(s->w, c);
    return;
  }
  if (s->r.sums) s->r.sums[c->file] ^= c->sum;
  c->next = NULL;
  *s->wq_tail = c;
  s->wq_tail = &c->next;
}

void sd_fileset_drop(sd_fileset *s) {
  while (s->wq) {
    sd_chunk *c = s->wq;
    s->wq = c->next;
    sd_writer_chunk_put(s->w, c);
  }
  s->wq_tail = &s->wq;
}

int sd_fileset_released(const sd_fileset *s) {
  return s->ops_left == 0;
}

int sd_fileset_done(const sd_fileset *s) {
  return (s->r.durable ? s->nsynced : s->nwhole) == s->r.nfiles;
}

const sd_fileset_counts *sd_fileset_counts_of(const sd_fileset *s) {
  return &s->n;
}

/* ------------------------------------------------------------------------ *
 * Life cycle
 * ------------------------------------------------------------------------ */
int sd_fileset_new(sd_writer *w, const sd_fileset_req *req, sd_fileset **out, sd_error *err) {
  *out = NULL;
  size_t nf = req->nfiles ? req->nfiles : 1;
  sd_fileset *s = calloc(1, sizeof *s);
  if (s) s->f = calloc(nf, sizeof *s->f);
  if (s && req->durable) s->ready = calloc(nf, sizeof *s->ready);
  if (!s || !s->f || (req->durable && !s->ready)) {
    if (s) free(s->f), free(s->ready);
    free(s);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "save '%s': no memory for its files' writes", req->tag);
  }
  s->w = w;
  s->r = *req;
  if (req->point) snprintf(s->write_point, sizeof s->write_point, "%s_write", req->point);
  s->wq_tail = &s->wq;
  s->fill = (sd_fill){.files = req->files, .nfiles = req->nfiles, .ops = req->ops, .nops = req->nops,
                      .spans = req->spans, .nspans = req->nspans, .ready = req->op_ready};
  for (size_t i = 0; i < req->nops; i++) s->ops_left += req->ops[i].len;
  int by_name = req->by_name;
  if (by_name && sd_fdset_new(sd_writer_fdpool(w), req->dir_fd, req->names, req->nfiles, O_WRONLY, &s->byname)) {
    free(s->ready);
    free(s->f);
    free(s);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "save '%s': no memory for its files' writes", req->tag);
  }
  if (by_name) sd_fdset_hooks(s->byname, byname_opened, byname_closing, s);
  for (uint32_t i = 0; i < req->nfiles; i++) {
    s->f[i].fd = by_name ? -1 : req->fds[i];
    s->f[i].slot = req->durable ? -2 : -1; /* a descriptor the caller keeps may close under a slot */
    s->f[i].size = s->f[i].left = req->files[i].size;
    s->f[i].base = req->bases ? req->bases[i] : 0;
    if (!by_name) go_odirect(s, i);
    if (s->f[i].left == 0) whole(s, i);
  }
  s->r.fds = NULL; /* read at the start only */
  /* no memory for the copy: the warning names the file instead */
  s->r.where = s->where = by_name && req->where ? strdup(req->where) : NULL;
  /* One O_DIRECT file tells for the device (by name: the first with bytes,
   * opened a moment for it, outside the pool: every descriptor the cap
   * allows may be busy with other saves). */
  int probe = -1;
  for (uint32_t i = 0; i < req->nfiles && probe < 0; i++) {
    if (!by_name) {
      if (s->f[i].odirect) probe = s->f[i].fd;
      continue;
    }
    if (!s->f[i].size) continue;
    int fd = openat(req->dir_fd, req->names[i], O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      sd_fileset_fail_errno(s, errno, i, "open", 0);
      break;
    }
    if (!sd_writer_buffered(w) && set_odirect(fd, 1) == 0) probe = fd;
    else close(fd);
    break;
  }
  if (s->failed) {
    sd_fail(err, s->err.code, "%s", s->err.msg);
    sd_fileset_free(s);
    return err->code;
  }
  sd_zero_copy_init(&s->zc, &s->fill, probe, req->gather);
  if (by_name && probe >= 0) close(probe);
  *out = s;
  return 0;
}

void sd_fileset_close(sd_fileset *s) {
  if (!s->r.durable) return;
  for (uint32_t i = 0; i < s->r.nfiles; i++) close_file(s, i);
}

void sd_fileset_free(sd_fileset *s) {
  if (!s) return;
  sd_fileset_close(s);
  sd_fdset_free(s->byname);
  sd_zero_copy_free(&s->zc);
  free(s->where);
  free(s->ready);
  free(s->f);
  free(s);
}

/* ------------------------------------------------------------------------ *
 * The set as a job of its own
 * ------------------------------------------------------------------------ */
static int job_next(sd_wjob *job, sd_io *io) {
  return sd_fileset_next((sd_fileset *)job, io);
}

static void job_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_fileset_complete((sd_fileset *)job, io, res);
}

static void job_progress(sd_wjob *job, const sd_io *io, uint32_t bytes) {
  sd_fileset_progress((sd_fileset *)job, io, bytes);
}

static int job_stage(sd_wjob *job, sd_chunk *c) {
  return sd_fileset_stage((sd_fileset *)job, c);
}

static void job_fill(sd_wjob *job, sd_chunk *c) {
  sd_fileset_fill((sd_fileset *)job, c);
}

static void job_filled(sd_wjob *job, sd_chunk *c) {
  sd_fileset_filled((sd_fileset *)job, c);
}

static void finish(sd_fileset *s) {
  sd_writer_detach(s->w, &s->job);
  sd_fileset_cb cb = s->r.cb;
  void *ud = s->r.ud;
  sd_error err = s->err;
  int failed = s->failed;
  sd_fileset_free(s);
  cb(ud, failed ? &err : NULL);
}

static void job_poll(sd_wjob *job) {
  sd_fileset *s = (sd_fileset *)job;
  if (!s->failed && s->r.stop && *s->r.stop) sd_fileset_failf(s, SHARDD_E_ABORTED, "save '%s': stopped", s->r.tag);
  if (s->failed) sd_fileset_drop(s);
  if (job->inflight || job->filling) return;
  if (s->failed || sd_fileset_done(s)) finish(s);
}

static void job_fail(sd_wjob *job, int code, const char *why) {
  sd_fileset_failf((sd_fileset *)job, code, "%s", why);
}

static const sd_wjob_ops fs_ops = {.next = job_next, .complete = job_complete, .progress = job_progress,
                                   .stage = job_stage, .fill = job_fill, .filled = job_filled,
                                   .poll = job_poll, .fail = job_fail};

int sd_fileset_start(sd_writer *w, const sd_fileset_req *req, sd_error *err) {
  sd_fileset *s;
  int rc = sd_fileset_new(w, req, &s, err);
  if (rc) return rc;
  s->job.ops = &fs_ops;
  s->job.w = w;
  /* tests: a stall here lets a client shrink its segment under the writes */
  if (req->point) sd_crash_point(req->point);
  if (sd_writer_attach(w, &s->job, err) != 0) {
    if (!req->by_name) /* given descriptors never asked for a slot: still the caller's */
      for (size_t i = 0; i < req->nfiles; i++) s->f[i].fd = -1;
    sd_fileset_free(s);
    return err->code;
  }
  sd_writer_pump(w);
  sd_writer_kick(w); /* a poll soon: files of no bytes end the set there */
  return 0;
}
