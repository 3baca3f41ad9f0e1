/* The leader's folder work on worker threads: temporary folder and sized shard files, then artifacts, index, owner and the publish. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_lead_int.h"
#include "crashpoint.h"
#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "publish.h"

/* ------------------------------------------------------------------------ *
 * The file system, in the thread pool so heartbeats never wait on a disk
 * ------------------------------------------------------------------------ */
static int write_file(int dirfd, const char *name, const uint8_t *data, size_t len, unsigned mode, sd_error *err,
                      const char *dir) {
  int fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "'%s' is given twice in %s", name, dir);
    return sd_fail(err, sd_err_from_errno(errno), "cannot create %s/%s: %s", dir, name, strerror(errno));
  }
  fchmod(fd, mode);
  size_t at = 0;
  while (at < len) {
    ssize_t w = pwrite(fd, data + at, len - at, (off_t)at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      return sd_fail(err, sd_err_from_errno(e), "%s/%s: write at offset %zu: %s", dir, name, at, strerror(e));
    }
    at += (size_t)w;
  }
  if (fsync(fd) < 0) {
    int e = errno;
    close(fd);
    return sd_fail(err, sd_err_from_errno(e), "%s/%s: fsync: %s", dir, name, strerror(e));
  }
  close(fd);
  return 0;
}

/* The temporary folder, and every shard file in it at its final size:
 * nodes only open and write, so no node can race another's create. */
static int job_prepare(fsjob *j) {
  sd_lead *L = j->L;
  sd_error *err = &j->err;
  const char *base = NULL;
  int rc = sd_path_open_parent(j->root_fd, L->dir, 1, &L->parent_fd, &L->created, &base, err);
  if (rc) return rc;
  int fd = sd_openat_beneath(L->parent_fd, base, O_PATH, 0);
  if (fd >= 0) {
    struct stat st;
    int isdir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    if (!L->overwrite)
      return sd_fail(err, SHARDD_E_EXISTS, "'%s' already exists under the root (pass overwrite to replace it)",
                     L->dir);
    if (!isdir) return sd_fail(err, SHARDD_E_EXISTS, "'%s' exists and is not a folder", L->dir);
  } else if (fd == -ELOOP || fd == -EXDEV) {
    return sd_fail(err, SHARDD_E_BAD_PATH, "'%s' is a symlink", L->dir);
  }
  if (mkdirat(L->parent_fd, L->tmp, L->dir_mode) < 0)
    return sd_fail(err, sd_err_from_errno(errno), "cannot create a temporary folder beside '%s': %s", L->dir,
                   strerror(errno));
  L->tmp_made = 1;
  int tfd = sd_openat_beneath(L->parent_fd, L->tmp, O_RDONLY | O_DIRECTORY, 0);
  if (tfd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", L->dir, strerror(-tfd));
  fchmod(tfd, L->dir_mode);
  for (size_t i = 0; i < L->plan.plan.nfiles && !rc; i++) {
    const sd_plan_file *pf = &L->plan.plan.files[i];
    int f = openat(tfd, pf->name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, L->file_mode);
    if (f < 0) {
      rc = sd_fail(err, sd_err_from_errno(errno), "cannot create %s/%s: %s", L->dir, pf->name, strerror(errno));
      break;
    }
    fchmod(f, L->file_mode);
    if (ftruncate(f, (off_t)pf->file_size) < 0)
      rc = sd_fail(err, sd_err_from_errno(errno), "cannot size %s/%s: %s", L->dir, pf->name, strerror(errno));
    close(f);
  }
  close(tfd);
  return rc;
}

/* Every node's files are durable: artifacts and index, the folder, the rename, the parent. */
static int job_finish(fsjob *j) {
  sd_lead *L = j->L;
  sd_error *err = &j->err;
  sd_crash_point("lead_index"); /* tests: every node is durable, the index not yet written */
  int tfd = sd_openat_beneath(L->parent_fd, L->tmp, O_RDONLY | O_DIRECTORY, 0);
  if (tfd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", L->dir, strerror(-tfd));
  int rc = 0;
  for (size_t i = 0; i < L->man.nfiles && !rc; i++)
    rc = write_file(tfd, L->man.files[i].name, L->man.files[i].data, L->man.files[i].len, L->file_mode, err, L->dir);
  if (!rc && L->plan.plan.needs_index)
    rc = write_file(tfd, L->plan.plan.index_name, (const uint8_t *)L->plan.index_json, L->plan.index_len,
                    L->file_mode, err, L->dir);
  if (!rc && L->has_owner) {
    /* Before the folder's fsync and rename: it is never visible without its owner. */
    int orc = sd_owner_record(tfd, L->owner_uid);
    if (orc < 0)
      sd_log_warn("cannot record the owner (uid %u) of '%s': %s; only root, the daemon's uid and trusted_group"
                  " members may overwrite it", (unsigned)L->owner_uid, L->dir, strerror(-orc));
  }
  if (!rc) rc = sd_publish_dir(L->parent_fd, tfd, L->tmp, L->dir, L->overwrite, L->id, &L->renamed, err);
  close(tfd);
  return rc;
}

int sd_lead_fs_cleanup(fsjob *j) {
  sd_lead *L = j->L;
  if (L->tmp_made && !L->renamed && L->parent_fd >= 0) {
    sd_error e = {0};
    if (sd_path_remove_tree(L->parent_fd, L->tmp, &e) != 0) sd_log_warn("save '%s': %s", L->id, e.msg);
    L->tmp_made = 0;
  }
  if (L->created) sd_path_unmake_parents(j->root_fd, L->dir, L->created);
  L->created = 0;
  return 0;
}

void sd_lead_fs_work(uv_work_t *req) {
  fsjob *j = req->data;
  if (j->kind == JOB_PREPARE) job_prepare(j);
  else if (j->kind == JOB_FINISH) job_finish(j);
  else sd_lead_fs_cleanup(j);
}
