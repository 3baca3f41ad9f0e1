/* Checkpoint ownership on disk: an xattr on the published folder; the checkpoint's files stay as they are. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <sys/stat.h>

#include "log.h"
#include "owner.h"
#include "pathsafe.h"

static int record_as(int dirfd, const char *name, const char *trusted_name, uid_t uid) {
  char v[16];
  int n = snprintf(v, sizeof v, "%u", (unsigned)uid);
  if (fsetxattr(dirfd, name, v, (size_t)n, 0) == 0) return 0;
  int e = errno;
  /* Only root may write trusted.*; it is the fallback where user.* is refused. */
  if (geteuid() == 0 && fsetxattr(dirfd, trusted_name, v, (size_t)n, 0) == 0) return 0;
  return -e;
}

int sd_owner_record(int dirfd, uid_t uid) {
  return record_as(dirfd, SD_OWNER_XATTR, SD_OWNER_XATTR_TRUSTED, uid);
}

static int read_one(int dirfd, const char *name, uid_t *uid) {
  char v[16];
  ssize_t n = fgetxattr(dirfd, name, v, sizeof v - 1);
  if (n < 0) return errno == ENODATA || errno == ENOTSUP || errno == EPERM ? 0 : -errno;
  v[n] = 0;
  char *end = NULL;
  unsigned long u = strtoul(v, &end, 10);
  if (n == 0 || *end || u > (uid_t)-1) return -EINVAL;
  *uid = (uid_t)u;
  return 1;
}

static int read_as(int dirfd, const char *name, const char *trusted_name, uid_t *uid) {
  int rc = read_one(dirfd, name, uid);
  if (rc != 0) return rc;
  return read_one(dirfd, trusted_name, uid);
}

int sd_owner_read(int dirfd, uid_t *uid) {
  return read_as(dirfd, SD_OWNER_XATTR, SD_OWNER_XATTR_TRUSTED, uid);
}

int sd_owner_of(int root_fd, const char *rel, int *found, uid_t *uid, sd_error *err) {
  *found = 0;
  /* Not O_DIRECTORY: a plain file in the way has no owner either; O_NONBLOCK: a FIFO must not hang us. */
  int fd = sd_openat_beneath(root_fd, rel, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0)
    return sd_fail(err, -fd == ELOOP || -fd == EXDEV ? SHARDD_E_BAD_PATH : SHARDD_E_IO,
                   "cannot open '%s' to read its owner: %s", rel, strerror(-fd));
  int rc = sd_owner_read(fd, uid);
  close(fd);
  if (rc < 0) return sd_fail(err, SHARDD_E_IO, "cannot read the owner of '%s': %s", rel, strerror(-rc));
  *found = rc;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Who may save where
 * ------------------------------------------------------------------------ */
/* A checkpoint: its recorded owner, or (made before owners were recorded,
 * or where no attribute could be set) an index or single file inside. */
static int is_checkpoint(int dirfd, int *found, uid_t *owner) {
  *found = sd_owner_read(dirfd, owner) == 1;
  if (*found) return 1;
  static const char *const marks[] = {"model.safetensors.index.json", "model.safetensors"};
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
    struct stat st;
    if (fstatat(dirfd, marks[i], &st, AT_SYMLINK_NOFOLLOW) == 0) return 1;
  }
  return 0;
}

int sd_owner_check_place(int root_fd, const char *rel, uid_t uid, int trusted_member, sd_error *err) {
  char above[SD_REL_PATH_MAX + 1];
  size_t len = strnlen(rel, SD_REL_PATH_MAX + 1);
  if (len > SD_REL_PATH_MAX) return 0; /* sd_path_check_rel refuses it */
  /* The first folder made for another uid, refused only once no checkpoint below it is: that is the closer rule. */
  size_t foreign_at = 0;
  uid_t foreign = 0;
  for (const char *slash = strchr(rel, '/'); slash; slash = strchr(slash + 1, '/')) {
    size_t n = (size_t)(slash - rel);
    memcpy(above, rel, n);
    above[n] = '\0';
    /* O_NONBLOCK: whatever sits there, opening it must not wait. */
    int fd = sd_openat_beneath(root_fd, above, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0);
    /* Missing (made for this save), a file in the way or a symlink: the path's own checks say so. */
    if (fd < 0) break;
    int found = 0;
    uid_t owner = 0, maker = 0;
    int ckpt = is_checkpoint(fd, &found, &owner);
    int made = !ckpt && read_as(fd, SD_FOLDER_XATTR, SD_FOLDER_XATTR_TRUSTED, &maker) == 1;
    close(fd);
    if (ckpt && found)
      return sd_fail(err, SHARDD_E_CONFLICT,
                     "'%s' lies inside the checkpoint '%s', committed by uid %u: no save may be published inside a "
                     "checkpoint",
                     rel, above, (unsigned)owner);
    if (ckpt)
      return sd_fail(err, SHARDD_E_CONFLICT,
                     "'%s' lies inside the checkpoint '%s' (no recorded owner): no save may be published inside a "
                     "checkpoint",
                     rel, above);
    if (made && maker != uid && !trusted_member && !foreign_at) {
      foreign_at = n;
      foreign = maker;
    }
  }
  if (foreign_at)
    return sd_fail(err, SHARDD_E_PERMISSION,
                   "'%s' lies under '%.*s', a folder shardd made for uid %u: uid %u may not save beneath it (only "
                   "uid %u or members of trusted_group may)",
                   rel, (int)foreign_at, rel, (unsigned)foreign, (unsigned)uid, (unsigned)foreign);
  return 0;
}

void sd_owner_mark_made(int root_fd, const char *rel, unsigned created, uid_t uid) {
  char path[SD_REL_PATH_MAX + 1];
  size_t len = strnlen(rel, SD_REL_PATH_MAX);
  memcpy(path, rel, len);
  path[len] = '\0';
  for (unsigned i = 0; i < created; i++) {
    char *slash = strrchr(path, '/');
    if (!slash) return;
    *slash = '\0';
    int fd = sd_openat_beneath(root_fd, path, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0);
    int rc = fd < 0 ? fd : record_as(fd, SD_FOLDER_XATTR, SD_FOLDER_XATTR_TRUSTED, uid);
    if (fd >= 0) close(fd);
    if (rc < 0)
      sd_log_warn("cannot record uid %u on the folder '%s' made for it: %s; any uid may save beneath it",
             (unsigned)uid, path, strerror(-rc));
  }
}
