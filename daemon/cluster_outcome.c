/* A node that lost the leader after reporting its files durable learns the save's outcome from the shared root before it answers its ranks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_int.h"
#include "crashpoint.h"
#include "log.h"
#include "pathsafe.h"

/* ------------------------------------------------------------------------ *
 * Once this node sent `done`, the leader may have published the folder, may
 * still be about to (cut off, not dead), or never will. Only the leader
 * renames, and only the temporary folder this node wrote into, so the
 * folder itself tells: the node holds it open and compares identities.
 *
 *   1. It moves the temporary folder to TMP-withdrawn (RENAME_NOREPLACE).
 *      Done: the leader had not renamed it, and now never can (its rename
 *      finds nothing and fails the save): `failed`. The withdrawn folder
 *      is removed.
 *   2. No temporary folder any more: ROOT/DIR is the folder this node
 *      wrote into: `committed`. TMP-withdrawn is (another node withdrew
 *      it), or the folder is deleted (the leader's clean-up): `failed`.
 *   3. Anything else (the root does not answer, the folder moved elsewhere):
 *      `outcome_unknown`, naming the folder and the attempt for
 *      `shardctl outcome`.
 * With overwrite, the leader's exchange leaves the old checkpoint under
 * the temporary name for a moment: a node that moves that away finds its
 * own folder at ROOT/DIR, says `committed`, and removes the old one as the
 * leader would have.
 * ------------------------------------------------------------------------ */
enum { OUT_COMMITTED, OUT_FAILED, OUT_UNKNOWN };

typedef struct {
  uv_work_t req;
  sd_csave *cs;            /* touched on the loop only */
  int parent_fd, tmp_fd;   /* dups, for the worker */
  char *tmp, *fence;
  const char *base;        /* DIR's last part, inside cs->save->dir */
  int outcome;
  char why[256];
} outjob;

static int same_dir(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* 1 when name in the parent is the folder `mine`, 0 when it is not (or absent), -errno when it cannot be told. */
static int holds(int parent_fd, const char *name, const struct stat *mine) {
  struct stat st;
  if (fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) return same_dir(&st, mine);
  return errno == ENOENT ? 0 : -errno;
}

static void remove_away(outjob *j, const char *what) {
  sd_error e = {0};
  if (sd_path_remove_tree(j->parent_fd, j->fence, &e) != 0)
    sd_log_warn("removing %s (%s): %s", j->fence, what, e.msg);
}

static void learn(outjob *j) {
  struct stat mine;
  if (fstat(j->tmp_fd, &mine) != 0) {
    if (errno == ESTALE) {
      j->outcome = OUT_FAILED; /* gone from the server: deleted, never published */
      snprintf(j->why, sizeof j->why, "its temporary folder was removed");
    } else {
      snprintf(j->why, sizeof j->why, "cannot read the temporary folder it wrote into: %s", strerror(errno));
    }
    return;
  }
  int rc = sd_fault_point("fence", 0); /* tests: a root that does not answer */
  if (rc == 0) rc = renameat2(j->parent_fd, j->tmp, j->parent_fd, j->fence, RENAME_NOREPLACE) == 0 ? 0 : -errno;
  if (rc == 0) {
    int ours = holds(j->parent_fd, j->fence, &mine);
    int published = ours == 1 ? 0 : holds(j->parent_fd, j->base, &mine);
    if (ours == 1) {
      j->outcome = OUT_FAILED;
      snprintf(j->why, sizeof j->why, "it had not renamed the folder in; this node withdrew it, so it never will");
      remove_away(j, "the withdrawn attempt");
    } else if (published == 1) {
      j->outcome = OUT_COMMITTED; /* what moved was the checkpoint the new one replaced */
      remove_away(j, "the replaced checkpoint");
    } else {
      snprintf(j->why, sizeof j->why, "the folder under its temporary name is not the one this node wrote into");
    }
    return;
  }
  if (rc != -ENOENT) {
    snprintf(j->why, sizeof j->why, "cannot move its temporary folder %s aside: %s", j->tmp, strerror(-rc));
    return;
  }
  int published = holds(j->parent_fd, j->base, &mine);
  int away = published == 1 ? 0 : holds(j->parent_fd, j->fence, &mine);
  if (published == 1) {
    j->outcome = OUT_COMMITTED;
  } else if (away == 1) {
    j->outcome = OUT_FAILED;
    snprintf(j->why, sizeof j->why, "it had not renamed the folder in; another node withdrew it, so it never will");
  } else if (published < 0 || away < 0) {
    snprintf(j->why, sizeof j->why, "cannot look at the folder: %s", strerror(published < 0 ? -published : -away));
  } else if (fstat(j->tmp_fd, &mine) == 0 ? mine.st_nlink == 0 : errno == ESTALE) {
    j->outcome = OUT_FAILED;
    snprintf(j->why, sizeof j->why, "its temporary folder was removed unpublished");
  } else {
    snprintf(j->why, sizeof j->why, "the folder this node wrote into is neither published nor withdrawn");
  }
}

static void learn_work(uv_work_t *req) { learn(req->data); }

static void outjob_free(outjob *j) {
  if (j->parent_fd >= 0) close(j->parent_fd);
  if (j->tmp_fd >= 0) close(j->tmp_fd);
  free(j->tmp);
  free(j->fence);
  free(j);
}

static void answer(sd_csave *cs, int outcome, const char *why) {
  sd_save *save = cs->save;
  char *path = sd_cl_final_path(cs->cl, save->dir);
  if (outcome == OUT_COMMITTED) {
    sd_log_info("save '%s': the leader (%s) was lost after this node's files were durable; it had published %s, so "
                "the save committed", save->id, cs->leader, save->dir);
    sd_node_close_files(cs);
    sd_save_finish(save, NULL, path ? path : save->dir);
  } else if (outcome == OUT_FAILED) {
    sd_save_fail(save, SHARDD_E_PEER_LOST, "node 0 (the leader, %s) was lost during save '%s' after this node's "
                 "files were durable; %s: nothing was published", cs->leader, save->id, why);
  } else {
    sd_save_fail(save, SHARDD_E_OUTCOME_UNKNOWN, "node 0 (the leader, %s) was lost during save '%s' after this "
                 "node's files were durable, and whether it published %s cannot be told (%s); "
                 "`shardctl outcome %s %s` tells once the root answers", cs->leader, save->id,
                 path ? path : save->dir, why, path ? path : save->dir, cs->cid);
  }
  free(path);
}

static void learn_done(uv_work_t *req, int status) {
  outjob *j = req->data;
  sd_csave *cs = j->cs;
  if (status != 0 && j->outcome == OUT_UNKNOWN && !j->why[0]) snprintf(j->why, sizeof j->why, "not looked at");
  int outcome = j->outcome;
  char why[sizeof j->why];
  snprintf(why, sizeof why, "%s", j->why);
  outjob_free(j);
  cs->io--;
  if (cs->failing) {
    /* Failed meanwhile (the daemon is stopping): that answer stands. */
    if (cs->io == 0) sd_node_finish_failed(cs);
    return;
  }
  answer(cs, outcome, why);
}

void sd_node_learn_outcome(sd_csave *cs) {
  outjob *j = calloc(1, sizeof *j);
  const char *slash = strrchr(cs->save->dir, '/');
  if (j) {
    j->cs = cs;
    j->outcome = OUT_UNKNOWN;
    j->base = slash ? slash + 1 : cs->save->dir;
    j->parent_fd = cs->parent_fd >= 0 ? dup(cs->parent_fd) : -1;
    j->tmp_fd = cs->tmp_fd >= 0 ? dup(cs->tmp_fd) : -1;
    j->tmp = cs->tmp ? strdup(cs->tmp) : NULL;
    size_t n = j->tmp ? strlen(j->tmp) + sizeof SD_WITHDRAWN_SUFFIX : 0;
    j->fence = n ? malloc(n) : NULL;
    if (j->fence) snprintf(j->fence, n, "%s%s", j->tmp, SD_WITHDRAWN_SUFFIX);
    j->req.data = j;
  }
  if (!j || j->parent_fd < 0 || j->tmp_fd < 0 || !j->fence ||
      uv_queue_work(cs->cl->d->loop, &j->req, learn_work, learn_done) != 0) {
    if (j) outjob_free(j);
    answer(cs, OUT_UNKNOWN, "out of resources to look");
    return;
  }
  cs->io++; /* the save stays in flight until the answer is known */
  sd_log_info("save '%s': the leader (%s) was lost after this node's files were durable; looking at the root for "
              "the outcome", cs->save->id, cs->leader);
}
