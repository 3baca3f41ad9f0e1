/* One save's way to disk: temporary folder, writes through the ring, fsyncs, atomic rename, parent fsync. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "publish_int.h"

#define DIR_TAG 0xffffffffu   /* the fsync of a folder, not of a file */
#define OP_BIT 0x80000000u    /* tag bit: this write reads a caller's source */

typedef struct {
  const char *name;        /* points into the plan, the request copy or artifact copy */
  int fd;
  uint64_t left;           /* bytes not yet written; 0 queues its fsync */
} pub_file;

typedef struct {
  uint64_t off;
  const uint8_t *src;
  uint64_t len;
  uint32_t file;
  uint32_t is_op;
} pub_seg;

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

  size_t nfiles;           /* shards, then artifacts, then the index */
  pub_file *files;
  uint8_t *artifact_bytes;
  char *names;             /* copied artifact names */

  pub_seg *segs;           /* every write, sorted by file then offset */
  size_t nsegs, seg_i;
  uint64_t seg_off;        /* progress inside segs[seg_i] */
  uint32_t *ready;         /* files whose bytes are all written, awaiting fsync */
  size_t ready_head, ready_tail, nsynced;

  uint64_t ops_left;       /* bytes still to read from callers' sources */
  uint64_t bytes_total, bytes_written;
  int released;

  pub_phase phase;
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
  fprintf(stderr, "shardd: publish %s: %s\n", p->tag ? p->tag : "?", msg);
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
  if (e == ENOSPC || e == EDQUOT)
    pub_fail(p, SHARDD_E_NO_SPACE, "no space left writing %s%s%s: %s", p->rel_dir, sep, name,
             strerror(e));
  else if (!strcmp(what, "write"))
    pub_fail(p, SHARDD_E_IO, "%s%s%s: write at offset %llu: %s", p->rel_dir, sep, name,
             (unsigned long long)off, strerror(e));
  else
    pub_fail(p, SHARDD_E_IO, "%s%s%s: %s: %s", p->rel_dir, sep, name, what, strerror(e));
}

/* ------------------------------------------------------------------------ *
 * Tear-down
 * ------------------------------------------------------------------------ */
static void close_all(sd_publish *p) {
  for (size_t i = 0; i < p->nfiles; i++)
    if (p->files[i].fd >= 0) {
      close(p->files[i].fd);
      p->files[i].fd = -1;
    }
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
  free(p->segs);
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
static int job_next(sd_wjob *job, sd_io *io) {
  sd_publish *p = (sd_publish *)job;
  if (p->failed) return 0;
  if (p->phase == PH_WRITE) {
    /* fsyncs first: they end a file, and a file's fsync overlaps the next file's writes */
    if (p->ready_head < p->ready_tail) {
      uint32_t f = p->ready[p->ready_head++];
      io->kind = SD_IO_FSYNC;
      io->fd = p->files[f].fd;
      io->tag = f;
      return 1;
    }
    if (p->seg_i >= p->nsegs) return 0;
    const pub_seg *s = &p->segs[p->seg_i];
    uint64_t chunk = s->len - p->seg_off;
    if (chunk > SD_IO_CHUNK) chunk = SD_IO_CHUNK;
    io->kind = SD_IO_WRITE;
    io->fd = p->files[s->file].fd;
    io->tag = s->file | (s->is_op ? OP_BIT : 0);
    io->off = s->off + p->seg_off;
    io->src = s->src + p->seg_off;
    io->len = (uint32_t)chunk;
    p->seg_off += chunk;
    if (p->seg_off == s->len) {
      p->seg_i++;
      p->seg_off = 0;
    }
    return 1;
  }
  if (p->dir_queued) return 0;
  p->dir_queued = 1;
  io->kind = SD_IO_FSYNC;
  io->fd = p->phase == PH_DIRSYNC ? p->tmp_fd : p->parent_fd;
  io->tag = DIR_TAG;
  return 1;
}

static void job_progress(sd_wjob *job, uint32_t bytes) {
  ((sd_publish *)job)->bytes_written += bytes;
}

static void job_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_publish *p = (sd_publish *)job;
  if (io->tag == DIR_TAG) {
    if (res < 0)
      fail_errno(p, -res, DIR_TAG,
                 p->phase == PH_DIRSYNC ? "fsync of the new folder" : "fsync of its parent", 0);
    else
      p->dir_done = 1;
    return;
  }
  uint32_t f = io->tag & ~OP_BIT;
  if (io->kind == SD_IO_FSYNC) {
    if (res < 0) {
      fail_errno(p, -res, f, "fsync", 0);
      return;
    }
    close(p->files[f].fd);
    p->files[f].fd = -1;
    p->nsynced++;
    return;
  }
  if (res < 0) {
    fail_errno(p, -res, f, "write", io->off + io->done);
    return;
  }
  if (io->tag & OP_BIT) p->ops_left -= io->len;
  if ((p->files[f].left -= io->len) == 0) p->ready[p->ready_tail++] = f;
}

static int do_rename(sd_publish *p) {
  int rc = renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_NOREPLACE);
  if (rc < 0 && errno == EEXIST && p->overwrite) {
    /* Swap in one step, so ROOT/DIR always holds a whole checkpoint. */
    rc = renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_EXCHANGE);
    if (rc == 0)
      p->exchanged = 1;
    else if (errno == ENOENT) /* the old one went away meanwhile */
      rc = renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_NOREPLACE);
  }
  if (rc < 0) {
    if (errno == EEXIST)
      pub_fail(p, SHARDD_E_EXISTS, "'%s' already exists under the root", p->rel_dir);
    else
      pub_fail(p, SHARDD_E_IO, "cannot rename the new folder to '%s': %s", p->rel_dir,
               strerror(errno));
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
    if (p->job.inflight == 0) finish_failed(p);
    return;
  }
  if (p->phase == PH_WRITE && p->nsynced == p->nfiles && p->job.inflight == 0) {
    p->phase = PH_DIRSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_DIRSYNC && p->dir_done) {
    if (do_rename(p) < 0) {
      finish_failed(p); /* nothing is in flight after the folder's fsync */
      return;
    }
    p->phase = PH_PARENTSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_PARENTSYNC && p->dir_done) {
    finish_ok(p);
  }
}

static void job_shutdown(sd_wjob *job) {
  sd_publish_cancel((sd_publish *)job, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
}

static const sd_wjob_ops pub_ops = {
  .next = job_next,
  .complete = job_complete,
  .progress = job_progress,
  .poll = job_poll,
  .shutdown = job_shutdown,
};

/* ------------------------------------------------------------------------ *
 * Start
 * ------------------------------------------------------------------------ */
static int seg_cmp(const void *a, const void *b) {
  const pub_seg *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return 0;
}

static char *dupstr(const char *s) {
  return s ? strdup(s) : NULL;
}

/* Characters outside [A-Za-z0-9._-] become '_', so any save id makes a plain name. */
static void append_clean(char *dst, size_t *n, const char *s, size_t max) {
  for (size_t i = 0; s[i] && i < max; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    dst[(*n)++] = ok ? c : '_';
  }
  dst[*n] = '\0';
}

/* Files, sizes and writes, checked and laid out before anything touches the disk. */
static int prepare(sd_publish *p, const sd_publish_req *req, uint64_t **extent, sd_error *err) {
  const sd_plan *plan = req->plan;
  size_t nf = plan->nfiles + req->nartifacts + (plan->needs_index ? 1 : 0);
  if (nf >= OP_BIT) return sd_fail(err, SHARDD_E_LIMIT, "too many files in one checkpoint");
  p->files = calloc(nf ? nf : 1, sizeof *p->files);
  p->ready = calloc(nf ? nf : 1, sizeof *p->ready);
  *extent = calloc(nf ? nf : 1, sizeof **extent);
  if (!p->files || !p->ready || !*extent) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish files");
  p->nfiles = nf;
  for (size_t i = 0; i < nf; i++) p->files[i].fd = -1;

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

  size_t nsegs = 0;
  for (size_t i = 0; i < plan->nfiles; i++) nsegs += plan->files[i].header_size > 0;
  for (size_t i = 0; i < req->nops; i++) nsegs += req->ops[i].len > 0;
  nsegs += req->nartifacts + 1;
  p->segs = malloc(nsegs * sizeof *p->segs);
  if (!p->segs) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish writes");

  pub_seg *s = p->segs;
  uint32_t f = 0;
  for (; f < plan->nfiles; f++) {
    const sd_plan_file *pf = &plan->files[f];
    int rc = sd_path_check_name(pf->name, err);
    if (rc) return rc;
    if (pf->header_size > pf->file_size)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: header is larger than the file", pf->name);
    p->files[f].name = pf->name;
    (*extent)[f] = pf->file_size;
    if (pf->header_size)
      *s++ = (pub_seg){0, (const uint8_t *)pf->header, pf->header_size, f, 0};
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
    *s++ = (pub_seg){op->file_offset, op->src, op->len, op->file, 1};
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
    (*extent)[f] = a->len;
    if (a->len) *s++ = (pub_seg){0, ab, a->len, f, 0};
    ab += a->len;
  }
  if (plan->needs_index) {
    int rc = sd_path_check_name(plan->index_name, err);
    if (rc) return rc;
    if (!req->index_json)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: the plan needs an index but none was given",
                     plan->index_name);
    p->files[f].name = plan->index_name;
    (*extent)[f] = req->index_len;
    if (req->index_len) *s++ = (pub_seg){0, (const uint8_t *)req->index_json, req->index_len, f, 0};
    f++;
  }
  p->nsegs = (size_t)(s - p->segs);

  /* Sorted writes go out sequentially per file, and each file finishes
   * (and is fsynced) while the next one is still being written. */
  qsort(p->segs, p->nsegs, sizeof *p->segs, seg_cmp);
  for (size_t i = 0; i < p->nsegs; i++) {
    const pub_seg *c = &p->segs[i];
    if (i > 0 && c[-1].file == c->file && c[-1].off + c[-1].len > c->off)
      return sd_fail(err, SHARDD_E_INTERNAL, "writes overlap in %s at offset %llu",
                     p->files[c->file].name, (unsigned long long)c->off);
    p->files[c->file].left += c->len;
    p->bytes_total += c->len;
  }
  return 0;
}

/* The temporary folder, every file in it, each sized to its final length. */
static int make_files(sd_publish *p, const uint64_t *extent, sd_error *err) {
  char name[NAME_MAX + 1];
  size_t n = 0;
  append_clean(name, &n, SD_TMP_PREFIX, sizeof SD_TMP_PREFIX);
  append_clean(name, &n, p->base, 96);
  name[n++] = '-';
  append_clean(name, &n, p->tag, 64);
  snprintf(name + n, sizeof name - n, "-%ld-%lu", (long)getpid(), ++tmp_counter);
  if (!(p->tmp_name = strdup(name))) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");

  if (mkdirat(p->parent_fd, p->tmp_name, 0755) < 0) {
    int e = errno;
    free(p->tmp_name);
    p->tmp_name = NULL; /* not ours: never remove it */
    return sd_fail(err, e == ENOSPC || e == EDQUOT ? SHARDD_E_NO_SPACE : SHARDD_E_IO,
                   "cannot create a temporary folder beside '%s': %s", p->rel_dir, strerror(e));
  }
  p->tmp_fd = sd_openat_beneath(p->parent_fd, p->tmp_name, O_RDONLY | O_DIRECTORY, 0);
  if (p->tmp_fd < 0)
    return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", p->rel_dir,
                   strerror(-p->tmp_fd));

  uint64_t *end = calloc(p->nfiles ? p->nfiles : 1, sizeof *end);
  if (!end) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  for (size_t i = 0; i < p->nsegs; i++) {
    const pub_seg *s = &p->segs[i];
    if (s->off + s->len > end[s->file]) end[s->file] = s->off + s->len;
  }
  int rc = 0;
  for (size_t i = 0; i < p->nfiles && !rc; i++) {
    pub_file *pf = &p->files[i];
    /* The folder is fresh and the name plain, so nothing here can be a symlink. */
    pf->fd = openat(p->tmp_fd, pf->name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (pf->fd < 0) {
      int e = errno;
      if (e == EEXIST)
        rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "'%s' is given twice in %s", pf->name,
                     p->rel_dir);
      else
        rc = sd_fail(err, e == ENOSPC || e == EDQUOT ? SHARDD_E_NO_SPACE : SHARDD_E_IO,
                     "cannot create %s/%s: %s", p->rel_dir, pf->name, strerror(e));
    } else if (end[i] < extent[i] && ftruncate(pf->fd, (off_t)extent[i]) < 0) {
      /* A stretch no write covers (zero-size tensors only, in practice)
       * still has to exist: the file is sized before the writes land. */
      int e = errno;
      rc = sd_fail(err, e == ENOSPC || e == EDQUOT ? SHARDD_E_NO_SPACE : SHARDD_E_IO,
                   "cannot size %s/%s: %s", p->rel_dir, pf->name, strerror(e));
    }
    if (!rc && pf->left == 0) p->ready[p->ready_tail++] = (uint32_t)i;
  }
  free(end);
  return rc;
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
  p->on_released = req->on_released;
  p->on_done = req->on_done;
  p->ud = req->ud;
  p->root_path = dupstr(req->root_path);
  p->rel_dir = dupstr(req->rel_dir);
  p->tag = dupstr(req->tag ? req->tag : "save");
  if (!p->root_path || !p->rel_dir || !p->tag) {
    pub_free(p);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  }

  uint64_t *extent = NULL;
  rc = prepare(p, req, &extent, err);
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
  if (!rc) rc = make_files(p, extent, err);
  free(extent);
  if (!rc) rc = sd_writer_attach(w, &p->job, err);
  if (rc) {
    p->err = *err;
    discard(p);
    plog(p, err->msg);
    pub_free(p);
    return rc;
  }
  *out = p;
  sd_writer_pump(w);
  if (p->ops_left == 0 || p->ready_tail > 0) sd_writer_kick(w); /* nothing may complete to poll us */
  return 0;
}

void sd_publish_cancel(sd_publish *p, int code, const char *why) {
  /* Past the rename the checkpoint is in place; only the parent's fsync
   * remains, and finishing it beats unpublishing a whole checkpoint. */
  if (p->failed || p->renamed) return;
  pub_fail(p, code, "%s", why ? why : sd_err_message(code));
  sd_writer_kick(p->job.w);
}

uint64_t sd_publish_bytes_written(const sd_publish *p) {
  return p->bytes_written;
}

uint64_t sd_publish_bytes_total(const sd_publish *p) {
  return p->bytes_total;
}
