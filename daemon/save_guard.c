/* What a save may hold and replace: inline bytes against their limits, overwrite against the folder's recorded owner. */
#include <string.h>
#include <unistd.h>

#include "owner.h"
#include "save_guard.h"

/* Inline bytes live in the daemon's memory until the save ends: capped per
 * save and daemon-wide, so one client cannot grow the daemon without bound. */
int sd_save_inline_check(const sd_save *save, const char *what, const char *name, uint64_t len, sd_error *err) {
  const sd_config *cfg = save->d->cfg;
  if (!cfg) return 0;
  if (len > cfg->max_inline_bytes_per_save || save->inline_bytes > cfg->max_inline_bytes_per_save - len)
    return sd_fail(err, SHARDD_E_LIMIT,
                   "%s '%s': %llu inline bytes would bring save '%s' to %llu (max_inline_bytes_per_save=%llu)", what,
                   name, (unsigned long long)len, save->id, (unsigned long long)(save->inline_bytes + len),
                   (unsigned long long)cfg->max_inline_bytes_per_save);
  uint64_t all = save->d->inline_bytes;
  if (len > cfg->max_inline_bytes || all > cfg->max_inline_bytes - len)
    return sd_fail(err, SHARDD_E_LIMIT,
                   "%s '%s': %llu inline bytes would bring the daemon's saves to %llu (max_inline_bytes=%llu)", what,
                   name, (unsigned long long)len, (unsigned long long)(all + len),
                   (unsigned long long)cfg->max_inline_bytes);
  return 0;
}

void sd_save_inline_add(sd_save *save, uint64_t len) {
  save->inline_bytes += len;
  save->d->inline_bytes += len;
}

void sd_save_inline_release(sd_save *save) {
  save->d->inline_bytes -= save->inline_bytes;
  save->inline_bytes = 0;
}

/* overwrite replaces only what the caller's uid committed: the daemon
 * writes every checkpoint, so the file system cannot tell users apart. */
int sd_save_may_overwrite(sd_daemon *d, uid_t uid, int trusted_member, const char *dir, sd_error *err) {
  int found = 0;
  uid_t owner = 0;
  int rc = sd_owner_of(d->root_fd, dir, &found, &owner, err);
  if (rc) return rc;
  long trusted = d->cfg ? d->cfg->trusted_gid : -1;
  if (trusted_member) return 0;
  if (found && owner == uid) return 0;
  if (found)
    return sd_fail(err, SHARDD_E_PERMISSION,
                   "'%s' was committed by uid %u; uid %u may not overwrite it (only its owner%s may)", dir,
                   (unsigned)owner, (unsigned)uid, trusted >= 0 ? " or members of trusted_group" : "");
  /* Made before owners were recorded, or not by shardd: only who could replace it by hand anyway. */
  if (uid == 0 || uid == geteuid()) return 0;
  return sd_fail(err, SHARDD_E_PERMISSION,
                 "'%s' has no recorded owner; uid %u may not overwrite it (only root, the daemon's uid %u%s may)",
                 dir, (unsigned)uid, (unsigned)geteuid(), trusted >= 0 ? " or members of trusted_group" : "");
}

/* 1 when `outer` is a folder above `inner` ("a" holds "a/b", not "ab"). */
static int holds(const char *outer, const char *inner) {
  size_t n = strlen(outer);
  return strncmp(outer, inner, n) == 0 && inner[n] == '/';
}

int sd_save_may_place(sd_daemon *d, uid_t uid, int trusted_member, const char *dir, sd_error *err) {
  /* Publishing one inside the other would put a folder into a checkpoint, or a checkpoint around one. */
  for (sd_save *s = d->saves; s; s = s->next) {
    if (holds(s->dir, dir))
      return sd_fail(err, SHARDD_E_CONFLICT, "'%s' lies inside '%s', the destination of save '%s' (uid %u) in flight",
                     dir, s->dir, s->id, (unsigned)s->owner_uid);
    if (holds(dir, s->dir))
      return sd_fail(err, SHARDD_E_CONFLICT, "'%s' holds '%s', the destination of save '%s' (uid %u) in flight", dir,
                     s->dir, s->id, (unsigned)s->owner_uid);
  }
  return sd_owner_check_place(d->root_fd, dir, uid, trusted_member, err);
}
