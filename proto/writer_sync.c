/* Synchronous checkpoint writer with plain pwrite: the oracle for tests and the serial baseline for benchmarks. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_writer_sync.h"

static int write_full(int fd, const void *buf, uint64_t len, uint64_t off) {
  const char *p = buf;
  while (len > 0) {
    /* Linux caps a single write at about 2 GiB; bigger tensors take several. */
    size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
    ssize_t w = pwrite(fd, p, chunk, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return -EIO;
    p += w;
    off += (uint64_t)w;
    len -= (uint64_t)w;
  }
  return 0;
}

static int fsync_path(const char *path, const char *what, sd_error *err) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
  int rc = 0;
  if (fsync(fd) != 0)
    rc = sd_fail(err, sd_err_from_errno(errno), "%s: fsync of %s: %s", path, what, strerror(errno));
  close(fd);
  return rc;
}

/* Creates name in dfd and writes the listed pieces; *created is set once the
 * file exists so the caller knows to remove it on failure. */
static int write_file(int dfd, const char *dir, const char *name, const void *head,
                      uint64_t head_len, const sd_plan_file *pf, const sd_plan *p,
                      const void *const *data, int *created, sd_error *err) {
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return sd_fail(err, sd_err_from_errno(errno), "%s/%s: cannot create: %s", dir, name,
                   strerror(errno));
  *created = 1;
  int r = write_full(fd, head, head_len, 0);
  for (size_t i = 0; pf && r == 0 && i < pf->ntensors; i++) {
    const sd_plan_loc *loc = &p->loc[pf->tensors[i]];
    if (loc->nbytes) r = write_full(fd, data[pf->tensors[i]], loc->nbytes, loc->file_offset);
  }
  int rc = 0;
  if (r != 0)
    rc = sd_fail(err, sd_err_from_errno(-r), "%s/%s: write: %s", dir, name, strerror(-r));
  else if (fsync(fd) != 0)
    rc = sd_fail(err, sd_err_from_errno(errno), "%s/%s: fsync: %s", dir, name, strerror(errno));
  if (close(fd) != 0 && rc == 0)
    rc = sd_fail(err, sd_err_from_errno(errno), "%s/%s: close: %s", dir, name, strerror(errno));
  return rc;
}

int sd_write_checkpoint_sync(const char *dir, const sd_tensor *tensors, const void *const *data,
                             size_t n, const sd_plan_opts *opts, sd_write_result *result,
                             sd_error *err) {
  /* Also tells GCC's -O2 ASan build that dir is not NULL (its -Wformat-overflow fired below). */
  if (!dir) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "no checkpoint folder given");
  sd_plan plan;
  memset(&plan, 0, sizeof plan);
  sd_plan_opts defaults;
  memset(&defaults, 0, sizeof defaults);
  if (!opts) opts = &defaults;
  if (result) memset(result, 0, sizeof *result);

  int rc = sd_plan_build(&plan, tensors, n, opts, err);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    if (plan.loc[i].nbytes && !data[i]) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': no data given for %" PRIu64
                   " bytes", tensors[i].name, plan.loc[i].nbytes);
      sd_plan_free(&plan);
      return rc;
    }
  }
  char *index = NULL;
  size_t index_len = 0;
  if (plan.needs_index && !(index = sd_index_encode(&plan, tensors, &index_len, err))) {
    rc = err && err->code ? err->code : SHARDD_E_INTERNAL;
    sd_plan_free(&plan);
    return rc;
  }

  int *created = calloc(plan.nfiles + 1, sizeof *created);
  if (!created) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    goto out_plan;
  }
  if (mkdir(dir, 0755) != 0) {
    rc = errno == EEXIST ? sd_fail(err, SHARDD_E_EXISTS, "%s: already exists", dir)
                         : sd_fail(err, sd_err_from_errno(errno), "%s: cannot create: %s", dir,
                                   strerror(errno));
    goto out_plan;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    rc = sd_fail(err, SHARDD_E_IO, "%s: cannot open: %s", dir, strerror(errno));
    rmdir(dir);
    goto out_plan;
  }
  uint64_t written = 0;
  for (size_t f = 0; rc == 0 && f < plan.nfiles; f++) {
    const sd_plan_file *pf = &plan.files[f];
    rc = write_file(dfd, dir, pf->name, pf->header, pf->header_size, pf, &plan, data,
                    &created[f], err);
    written += pf->file_size;
  }
  if (rc == 0 && index) {
    rc = write_file(dfd, dir, plan.index_name, index, index_len, NULL, &plan, data,
                    &created[plan.nfiles], err);
    written += index_len;
  }
  if (rc == 0 && fsync(dfd) != 0)
    rc = sd_fail(err, sd_err_from_errno(errno), "%s: fsync: %s", dir, strerror(errno));
  if (rc == 0) {
    /* The new folder's own entry lives in its parent. */
    char *copy = strdup(dir);
    rc = copy ? fsync_path(dirname(copy), "the parent folder", err)
              : sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    free(copy);
  }
  if (rc != 0) {
    for (size_t f = 0; f < plan.nfiles; f++)
      if (created[f]) unlinkat(dfd, plan.files[f].name, 0);
    if (created[plan.nfiles]) unlinkat(dfd, plan.index_name, 0);
    close(dfd);
    rmdir(dir);
    goto out_plan;
  }
  close(dfd);
  if (result) {
    result->nfiles = plan.nfiles;
    result->tensor_bytes = plan.total_size;
    result->file_bytes = written;
  }
out_plan:
  free(created);
  free(index);
  sd_plan_free(&plan);
  return rc;
}
