/* Reading checkpoints back: the strict reader's checks, then only the bytes of the boxes asked for, by pread.
 * No shard stays open between calls: a checkpoint of any number of files loads within the
 * descriptor limit, and each read opens its file again and proves it is the file that was checked. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_int.h"
#include "sd_layout.h"
#include "sd_reader.h"

#define SHOW(buf, s) sd_msgstr(buf, sizeof buf, s, strlen(s))

typedef struct {
  const sd_st_tensor *t;
  uint32_t file;            /* index into sd_ckpt.files and ids */
} entry;

typedef struct {
  dev_t dev;
  ino_t ino;
} file_id;

struct shardd_ckpt {
  sd_ckpt ck;
  int dirfd;                /* the folder the names were checked in, held so a rename or chdir cannot redirect them */
  file_id *ids;             /* each file as it was when checked: a file swapped in under its name later is refused */
  entry *by_name;           /* sorted by name (strcmp) */
};

/* Reader calls fail into the thread's error, as shardd_connect does: a
 * checkpoint may be read from many threads at once. */
static int fail_err(const sd_error *e) { return sd_client_connect_fail(e->code, "%s", e->msg); }

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const entry *)a)->t->name, ((const entry *)b)->t->name);
}

/* The header was checked against a file of this size; a file replaced or
 * truncated since then is refused rather than read past its checks. */
static int open_checked(int dirfd, const sd_ckpt_file *f, struct stat *st, sd_error *err) {
  char nb[SD_MSGNAME_MAX];
  int fd = sd_open_regular(dirfd, f->name, SHOW(nb, f->name), st, err);
  if (fd < 0) return -1;
  if ((uint64_t)st->st_size != f->h.file_size) {
    close(fd);
    sd_fail(err, SHARDD_E_FORMAT, "%s: changed while it was being checked", SHOW(nb, f->name));
    return -1;
  }
  return fd;
}

/* File i again, for one read or one deep check, the caller closes it: refused unless it is still
 * the very file (device and inode) whose header was checked. A size changed since is left to the
 * read (too short) and the deep check (truncated or grown), which name it. */
static int open_again(const shardd_ckpt *c, size_t i, sd_error *err) {
  const sd_ckpt_file *f = &c->ck.files[i];
  char nb[SD_MSGNAME_MAX];
  struct stat st;
  int fd = sd_open_regular(c->dirfd, f->name, SHOW(nb, f->name), &st, err);
  if (fd < 0) return -1;
  if (st.st_dev != c->ids[i].dev || st.st_ino != c->ids[i].ino) {
    close(fd);
    sd_fail(err, SHARDD_E_FORMAT, "%s: replaced by another file since the checkpoint was opened",
            SHOW(nb, f->name));
    return -1;
  }
  return fd;
}

static int open_files(shardd_ckpt *c, const char *path, int is_dir, sd_error *err) {
  int dirfd = AT_FDCWD;
  char *parent = NULL;
  if (is_dir) {
    dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } else {
    const char *slash = strrchr(path, '/');
    if (slash) {
      parent = slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
      if (!parent) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
      dirfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
  }
  free(parent);
  if (dirfd == AT_FDCWD) dirfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open the folder: %s", strerror(errno));
  c->dirfd = dirfd;
  c->ids = malloc((c->ck.nfiles ? c->ck.nfiles : 1) * sizeof *c->ids);
  if (!c->ids) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  /* One open at a time: each file's identity is taken, then it is closed again. */
  for (size_t i = 0; i < c->ck.nfiles; i++) {
    struct stat st;
    int fd = open_checked(dirfd, &c->ck.files[i], &st, err);
    if (fd < 0) return err->code;
    c->ids[i] = (file_id){.dev = st.st_dev, .ino = st.st_ino};
    close(fd);
  }
  return 0;
}

static int index_names(shardd_ckpt *c, sd_error *err) {
  c->by_name = calloc(c->ck.ntensors ? c->ck.ntensors : 1, sizeof *c->by_name);
  if (!c->by_name) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  size_t k = 0;
  for (size_t f = 0; f < c->ck.nfiles; f++)
    for (size_t i = 0; i < c->ck.files[f].h.ntensors; i++)
      c->by_name[k++] = (entry){.t = &c->ck.files[f].h.tensors[i], .file = (uint32_t)f};
  if (k) qsort(c->by_name, k, sizeof *c->by_name, cmp_entry);
  return 0;
}

SHARDD_EXPORT int shardd_ckpt_open(const char *path, shardd_ckpt **out) {
  *out = NULL;
  if (!path || !*path)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "path is empty");
  shardd_ckpt *c = calloc(1, sizeof *c);
  if (!c) return sd_client_connect_fail(SHARDD_E_NO_MEMORY, "out of memory");
  c->dirfd = -1;
  sd_error err;
  sd_error_clear(&err);
  struct stat st;
  int rc;
  if (stat(path, &st) != 0) {
    rc = sd_fail(&err, SHARDD_E_IO, "cannot open %s: %s", path, strerror(errno));
  } else {
    int is_dir = S_ISDIR(st.st_mode);
    rc = is_dir ? sd_ckpt_read(path, &c->ck, &err) : sd_ckpt_read_single(path, &c->ck, &err);
    if (!rc) rc = open_files(c, path, is_dir, &err);
    if (!rc) rc = index_names(c, &err);
  }
  if (rc) {
    shardd_ckpt_close(c);
    return fail_err(&err);
  }
  *out = c;
  return 0;
}

SHARDD_EXPORT void shardd_ckpt_close(shardd_ckpt *c) {
  if (!c) return;
  if (c->dirfd >= 0) close(c->dirfd);
  free(c->ids);
  free(c->by_name);
  sd_ckpt_free(&c->ck);
  free(c);
}

SHARDD_EXPORT size_t shardd_ckpt_count(const shardd_ckpt *c) { return (size_t)c->ck.ntensors; }

SHARDD_EXPORT int shardd_ckpt_tensor(const shardd_ckpt *c, size_t i, shardd_tensor_info *out) {
  if (i >= c->ck.ntensors)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT,
                                  "tensor number %zu is past the %" PRIu64 " tensors", i,
                                  c->ck.ntensors);
  const sd_st_tensor *t = c->by_name[i].t;
  *out = (shardd_tensor_info){.name = t->name, .dtype = sd_dtype_name(t->dtype),
                              .ndim = (int)t->ndim, .shape = t->shape,
                              .nbytes = t->end - t->begin,
                              .file = c->ck.files[c->by_name[i].file].name};
  return 0;
}

static const entry *find(const shardd_ckpt *c, const char *name) {
  sd_st_tensor key = {.name = (char *)name};
  entry k = {.t = &key, .file = 0};
  return bsearch(&k, c->by_name, (size_t)c->ck.ntensors, sizeof k, cmp_entry);
}

SHARDD_EXPORT int shardd_ckpt_find(const shardd_ckpt *c, const char *name, size_t *i) {
  const entry *e = name ? find(c, name) : NULL;
  if (!e) {
    char nb[SD_MSGNAME_MAX];
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "tensor '%s' is not in the checkpoint",
                                  name ? SHOW(nb, name) : "(null)");
  }
  *i = (size_t)(e - c->by_name);
  return 0;
}

typedef struct {
  int fd;
  char *buf;
  const char *file;
} read_ctx;

static int read_run(void *ud, uint64_t file_off, uint64_t buf_off, uint64_t len) {
  read_ctx *r = ud;
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pread(r->fd, r->buf + buf_off + done, (size_t)(len - done), (off_t)(file_off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      char nb[SD_MSGNAME_MAX];
      return sd_client_connect_fail(SHARDD_E_IO, "%s: cannot read %" PRIu64 " bytes at %" PRIu64 ": %s",
                                    SHOW(nb, r->file), len - done, file_off + done,
                                    n == 0 ? "the file is shorter than its header says" : strerror(errno));
    }
    done += (uint64_t)n;
  }
  return 0;
}

SHARDD_EXPORT int shardd_ckpt_read(const shardd_ckpt *c, const char *name, const uint64_t *start,
                                   const uint64_t *count, void *buf, size_t len) {
  const entry *e = name ? find(c, name) : NULL;
  char nb[SD_MSGNAME_MAX];
  if (!e)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "tensor '%s' is not in the checkpoint",
                                  name ? SHOW(nb, name) : "(null)");
  const sd_st_tensor *t = e->t;
  if ((start == NULL) != (count == NULL))
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT,
                                  "tensor '%s': give both start and count, or neither",
                                  SHOW(nb, name));
  sd_box box;
  for (uint32_t d = 0; d < t->ndim; d++) {
    box.start[d] = start ? start[d] : 0;
    box.count[d] = count ? count[d] : t->shape[d];
  }
  sd_error err;
  sd_error_clear(&err);
  if (sd_box_check(t->name, t->ndim, t->shape, &box, &err) != 0) return fail_err(&err);
  uint64_t numel = 1;
  for (uint32_t d = 0; d < t->ndim; d++) numel *= box.count[d]; /* within shape: cannot overflow */
  uint64_t need = numel * sd_dtype_size(t->dtype);
  if ((uint64_t)len != need)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT,
                                  "tensor '%s': the box holds %" PRIu64 " bytes but the buffer has %zu",
                                  SHOW(nb, name), need, len);
  if (need && !buf)
    return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "tensor '%s': buffer is NULL",
                                  SHOW(nb, name));
  if (need == 0) return 0;
  const sd_ckpt_file *f = &c->ck.files[e->file];
  read_ctx r = {.fd = open_again(c, e->file, &err), .buf = buf, .file = f->name};
  if (r.fd < 0) return fail_err(&err);
  int rc = sd_box_runs(t->ndim, t->shape, sd_dtype_size(t->dtype), &box, f->h.data_start + t->begin,
                       read_run, &r);
  close(r.fd);
  return rc;
}

static int open_for_verify(void *ud, size_t i, sd_error *err) { return open_again(ud, i, err); }

static void close_after_verify(void *ud, size_t i, int fd) {
  (void)ud, (void)i;
  close(fd);
}

SHARDD_EXPORT int shardd_ckpt_verify(const shardd_ckpt *c) {
  if (!c) return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "checkpoint is NULL");
  sd_error err;
  sd_error_clear(&err);
  /* Each file proven to be the one whose header was checked, as reads do: the bytes compared are
   * the bytes later reads get. */
  sd_ckpt_fds each = {.open = open_for_verify, .close = close_after_verify, .ud = (void *)c};
  if (sd_ckpt_verify_each(&c->ck, &each, &err) != 0) return fail_err(&err);
  return 0;
}
