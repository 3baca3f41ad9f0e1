/* The atomic step of every publish, and the whole publish of a finished folder for worker threads. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "crashpoint.h"
#include "log.h"
#include "pathsafe.h"
#include "publish_swap.h"

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

void sd_publish_tmp_name(char name[NAME_MAX + 1], const char *base, const char *tag, unsigned long counter) {
  size_t n = 0;
  append_clean(name, &n, SD_TMP_PREFIX, sizeof SD_TMP_PREFIX);
  append_clean(name, &n, base, 96);
  name[n++] = '-';
  append_clean(name, &n, tag, 64);
  snprintf(name + n, NAME_MAX + 1 - n, "-%ld-%lu", (long)getpid(), counter);
}

int sd_publish_swap_in(int parent_fd, const char *tmp, const char *base, const char *rel_dir, int overwrite,
                       int *exchanged, sd_error *err) {
  *exchanged = 0;
  int rc = renameat2(parent_fd, tmp, parent_fd, base, RENAME_NOREPLACE);
  if (rc < 0 && errno == EEXIST && overwrite) {
    /* Swap in one step, so ROOT/DIR always holds a whole checkpoint. */
    rc = renameat2(parent_fd, tmp, parent_fd, base, RENAME_EXCHANGE);
    if (rc == 0)
      *exchanged = 1;
    else if (errno == ENOENT) /* the old one went away meanwhile */
      rc = renameat2(parent_fd, tmp, parent_fd, base, RENAME_NOREPLACE);
  }
  if (rc < 0) {
    if (errno == EEXIST) return sd_fail(err, SHARDD_E_EXISTS, "'%s' already exists under the root", rel_dir);
    return sd_fail(err, SHARDD_E_IO, "cannot rename the new folder to '%s': %s", rel_dir, strerror(errno));
  }
  return 0;
}

int sd_publish_dir(int parent_fd, int tmp_fd, const char *tmp, const char *rel_dir, int overwrite,
                   const char *tag, int *renamed, sd_error *err) {
  *renamed = 0;
  if (fsync(tmp_fd) < 0)
    return sd_fail(err, sd_err_from_errno(errno),
                   "%s: fsync of the new folder: %s", rel_dir, strerror(errno));
  const char *slash = strrchr(rel_dir, '/');
  int exchanged = 0;
  int rc = sd_publish_swap_in(parent_fd, tmp, slash ? slash + 1 : rel_dir, rel_dir, overwrite, &exchanged, err);
  if (rc) return rc;
  *renamed = 1;
  sd_crash_point("lead_rename"); /* tests: published, the parent not yet fsynced */
  if (fsync(parent_fd) < 0)
    sd_log_warn("save '%s': fsync of the folder holding %s: %s (published regardless)", tag, rel_dir, strerror(errno));
  sd_crash_point("lead_parentsync");
  if (exchanged) {
    /* The old checkpoint now sits under the temporary name. Failing to
     * remove it does not unpublish the new one; a restart cleans it up. */
    sd_error e;
    if (sd_path_remove_tree(parent_fd, tmp, &e) != 0)
      sd_log_warn("save '%s': removing the replaced checkpoint: %s", tag, e.msg);
  }
  return 0;
}
