/* The leader's folder work on worker threads: temporary folder and sized shard files; then a single file's checksum over its header's placeholder, its own files (artifacts, index) written by the writer as a publish's, the owner and the publish. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cluster_lead_int.h"
#include "crashpoint.h"
#include "fileset.h"
#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "publish.h"

/* ------------------------------------------------------------------------ *
 * The file system, in the thread pool so heartbeats never wait on a disk
 * ------------------------------------------------------------------------ */
/* The temporary folder, and every shard file in it at its final size:
 * nodes only open and write, so no node can race another's create. */
static int job_prepare(fsjob *j) {
  sd_lead *L = j->L;
  sd_error *err = &j->err;
  const char *base = NULL;
  /* The plan first: checks every tensor's coverage (gap, overlap), shards, owners, who writes what.
   * Nothing on the loop touches the manifest or the plan while the job runs. */
  sd_plan_opts o = {.max_shard_size = L->mss, .prefix = L->prefix, .metadata = L->md, .nmetadata = L->nmd,
                    .checksums = L->plan_sums,
                    .total_parameters = (uint64_t)(L->total_parameters >= 0 ? L->total_parameters : 0),
                    .has_total_parameters = L->total_parameters >= 0};
  if (sd_cplan_build(&L->man, L->nnodes, L->mode, &o, &L->plan, err) != 0) return err->code;
  L->planned = 1;
  /* The nodes checked who may save there at their begin; that no checkpoint has appeared above it since is
   * checked here, where the folders are made (and recorded as the owner's). */
  int rc = sd_owner_check_place(j->root_fd, L->dir, L->owner_uid, 1, err);
  if (!rc) rc = sd_path_open_parent(j->root_fd, L->dir, 1, &L->parent_fd, &L->created, &base, err);
  if (rc) return rc;
  sd_owner_mark_made(j->root_fd, L->dir, L->created, L->owner_uid);
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
  if (fsetxattr(tfd, SD_ATTEMPT_XATTR, L->cid, SD_ATTEMPT_LEN, 0) != 0 &&
      (geteuid() != 0 || fsetxattr(tfd, SD_ATTEMPT_XATTR_TRUSTED, L->cid, SD_ATTEMPT_LEN, 0) != 0))
    sd_log_warn("save '%s': cannot record the attempt %s on the folder of '%s': %s; nodes still learn the outcome "
                "if the leader is lost, shardctl outcome cannot", L->id, L->cid, L->dir, strerror(errno));
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
  if (!rc) sd_crash_point("lead_prepare"); /* tests: the folder made, no node assigned yet */
  return rc;
}

/* A single-file checkpoint's checksum, over the placeholder its owner wrote
 * in the header, durable before the folder is published. */
static int put_header_sum(fsjob *j) {
  sd_lead *L = j->L;
  const sd_plan_file *pf = &L->plan.plan.files[0];
  int fd = sd_openat_beneath(j->tfd, pf->name, O_WRONLY, 0);
  if (fd < 0)
    return sd_fail(&j->err, sd_err_from_errno(-fd), "cannot open %s/%s to record its checksum: %s", L->dir, pf->name,
                   strerror(-fd));
  ssize_t w = pwrite(fd, L->sum_hex, SD_CHECKSUM_HEX, (off_t)pf->sum_at);
  int e = w < 0 ? errno : w != SD_CHECKSUM_HEX ? EIO : fsync(fd) != 0 ? errno : 0;
  close(fd);
  if (e)
    return sd_fail(&j->err, sd_err_from_errno(e), "%s/%s: recording its checksum failed: %s", L->dir, pf->name,
                   strerror(e));
  return 0;
}

/* Every node's files are durable: the leader's own (artifacts and index)
 * are made here, empty, for the writer to write and fsync as a publish's. */
static int finish_open(fsjob *j) {
  sd_lead *L = j->L;
  sd_error *err = &j->err;
  sd_crash_point("lead_index"); /* tests: every node is durable, the index not yet written */
  j->tfd = sd_openat_beneath(L->parent_fd, L->tmp, O_RDONLY | O_DIRECTORY, 0);
  if (j->tfd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", L->dir, strerror(-j->tfd));
  if (L->sum_hex[0] && put_header_sum(j) != 0) return err->code;
  size_t n = L->plan.nartifacts + (L->plan.plan.needs_index ? 1 : 0);
  j->fds = malloc((n ? n : 1) * sizeof *j->fds);
  j->names = malloc((n ? n : 1) * sizeof *j->names);
  j->files = malloc((n ? n : 1) * sizeof *j->files);
  if (!j->fds || !j->names || !j->files) return sd_fail(err, SHARDD_E_NO_MEMORY, "save '%s': out of memory on the leader", L->id);
  for (size_t i = 0; i < n; i++) j->fds[i] = -1;
  j->nown = n;
  for (size_t i = 0; i < L->plan.nartifacts; i++) {
    const sd_file_out *f = &L->plan.artifacts[i];
    j->names[i] = f->name;
    j->files[i] = (sd_fill_file){f->data, f->len, f->len};
  }
  if (L->plan.plan.needs_index) {
    j->names[n - 1] = L->plan.plan.index_name;
    j->files[n - 1] = (sd_fill_file){(const uint8_t *)L->plan.index_json, L->plan.index_len, L->plan.index_len};
  }
  for (size_t i = 0; i < n; i++) {
    int fd = j->fds[i] = openat(j->tfd, j->names[i], O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, L->file_mode);
    if (fd < 0) {
      if (errno == EEXIST) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "'%s' is given twice in %s", j->names[i], L->dir);
      return sd_fail(err, sd_err_from_errno(errno), "cannot create %s/%s: %s", L->dir, j->names[i], strerror(errno));
    }
    fchmod(fd, L->file_mode);
  }
  return 0;
}

/* The leader's own files are durable: the owner, the folder, the rename, the parent. */
static int finish_publish(fsjob *j) {
  sd_lead *L = j->L;
  if (L->has_owner) {
    /* Before the folder's fsync and rename: it is never visible without its owner. */
    int orc = sd_owner_record(j->tfd, L->owner_uid);
    if (orc < 0)
      sd_log_warn("cannot record the owner (uid %u) of '%s': %s; only root, the daemon's uid and trusted_group"
                  " members may overwrite it", (unsigned)L->owner_uid, L->dir, strerror(-orc));
  }
  return sd_publish_dir(L->parent_fd, j->tfd, L->tmp, L->dir, L->overwrite, L->id, &L->renamed, &j->err);
}

/* The folder is gone before the rename: only a node that lost this leader after its files were
 * durable moves it away (cluster_outcome.c), and it told its ranks the save failed: so must every node. */
static void if_withdrawn(fsjob *j) {
  sd_lead *L = j->L;
  struct stat st;
  if (!j->err.code || L->renamed || fstatat(L->parent_fd, L->tmp, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
    return;
  sd_fail(&j->err, SHARDD_E_PEER_LOST, "save '%s': a node that lost touch with this leader withdrew the temporary "
          "folder of '%s' before the rename; nothing was published", L->id, L->dir);
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

static void fs_work(uv_work_t *req) {
  fsjob *j = req->data;
  if (j->kind == JOB_PREPARE) job_prepare(j);
  else if (j->kind == JOB_FINISH && j->step == 0) finish_open(j), if_withdrawn(j);
  else if (j->kind == JOB_FINISH) finish_publish(j), if_withdrawn(j);
  else sd_lead_fs_cleanup(j);
}

/* ------------------------------------------------------------------------ *
 * Between the threads: the leader's own files on the writer
 * ------------------------------------------------------------------------ */
static void fs_after(uv_work_t *req, int status);

static void fs_end(fsjob *j, int status) {
  for (size_t i = 0; j->fds && i < j->nown; i++)
    if (j->fds[i] >= 0) close(j->fds[i]);
  if (j->tfd >= 0) close(j->tfd);
  free(j->fds);
  free(j->names);
  free(j->files);
  j->done(&j->req, status); /* frees j */
}

static void own_written(void *ud, const sd_error *err) {
  fsjob *j = ud;
  if (err) {
    j->err = *err;
    fs_end(j, 0);
    return;
  }
  j->step = 2;
  if (uv_queue_work(j->L->cl->d->loop, &j->req, fs_work, fs_after) != 0) {
    sd_fail(&j->err, SHARDD_E_INTERNAL, "save '%s': cannot queue file-system work", j->L->id);
    fs_end(j, 0);
  }
}

/* The artifacts and the index written and fsynced by the ring, as a publish's are. */
static void write_own(fsjob *j) {
  sd_lead *L = j->L;
  sd_writer *w = L->cl->d->writer;
  j->step = 1;
  if (!j->nown) {
    own_written(j, NULL);
    return;
  }
  if (!w) {
    sd_fail(&j->err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
    fs_end(j, 0);
    return;
  }
  sd_fileset_req r = {.fds = j->fds, .names = j->names, .files = j->files, .nfiles = j->nown, .durable = 1,
                      .dir = L->dir, .tag = L->id, .point = "lead", .cb = own_written, .ud = j};
  if (sd_fileset_start(w, &r, &j->err) != 0) {
    fs_end(j, 0);
    return;
  }
  for (size_t i = 0; i < j->nown; i++) j->fds[i] = -1; /* the set's now */
}

static void fs_after(uv_work_t *req, int status) {
  fsjob *j = req->data;
  if (j->kind == JOB_FINISH && j->step == 0 && status == 0 && !j->err.code) write_own(j);
  else fs_end(j, status);
}

int sd_lead_fs_queue(uv_loop_t *loop, fsjob *j, uv_after_work_cb done) {
  j->req.data = j;
  j->tfd = -1;
  j->done = done;
  return uv_queue_work(loop, &j->req, fs_work, fs_after) != 0 ? -1 : 0;
}
