/* A publish begun: the request checked and laid out, the temporary folder beside the checkpoint and its files made, their file set and the job handed to the writer. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crashpoint.h"
#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "publish_int.h"

#define FILES_MAX 0x80000000u

static unsigned long tmp_counter;

/* ------------------------------------------------------------------------ *
 * Start
 * ------------------------------------------------------------------------ */
static char *dupstr(const char *s) {
  return s ? strdup(s) : NULL;
}

/* Checksums on: the bytes that record them are written last, from a copy
 * they are filled into: the index (empty until then), or the single file's
 * header (written now with its placeholder, and again once filled). */
static int late_file(sd_publish *p, const sd_plan *plan, const sd_publish_req *req, sd_error *err) {
  p->plan = plan;
  p->sums = calloc(p->nfiles ? p->nfiles : 1, sizeof *p->sums); /* the set keeps one for every file it writes */
  if (!p->sums) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish checksums");
  const uint8_t *src = NULL;
  if (plan->needs_index) {
    p->late_file = p->index_file;
    src = (const uint8_t *)req->index_json;
    p->late_len = req->index_len;
    p->fill_files[p->index_file] = (sd_fill_file){NULL, 0, 0};
  } else if (plan->nfiles == 1 && plan->files[0].sum_at) {
    p->late_file = 0;
    src = (const uint8_t *)plan->files[0].header;
    p->late_len = plan->files[0].header_size;
  } else {
    return 0;
  }
  size_t room = sd_align_up(p->late_len ? p->late_len : 1);
  void *buf = NULL;
  if (posix_memalign(&buf, SD_DIO_ALIGN, room)) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish checksums");
  p->late = buf;
  memcpy(p->late, src, p->late_len);
  memset(p->late + p->late_len, 0, room - p->late_len);
  return 0;
}

/* Files, sizes and writes, checked and laid out before anything touches the disk. */
static int prepare(sd_publish *p, const sd_publish_req *req, sd_error *err) {
  const sd_plan *plan = req->plan;
  int rc_late;
  size_t nf = plan->nfiles + req->nartifacts + (plan->needs_index ? 1 : 0);
  if (nf >= FILES_MAX) return sd_fail(err, SHARDD_E_LIMIT, "too many files in one checkpoint");
  p->names = calloc(nf ? nf : 1, sizeof *p->names);
  p->fds = malloc((nf ? nf : 1) * sizeof *p->fds);
  p->fill_files = calloc(nf ? nf : 1, sizeof *p->fill_files);
  if (!p->names || !p->fds || !p->fill_files) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish files");
  p->nfiles = nf;
  p->index_file = DIR_TAG;
  for (size_t i = 0; i < nf; i++) p->fds[i] = -1;

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
  p->artifact_names = malloc(name_bytes ? name_bytes : 1);
  if (!p->artifact_bytes || !p->artifact_names) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish files");

  sd_fill_file *ff = p->fill_files;
  uint32_t f = 0;
  for (; f < plan->nfiles; f++) {
    const sd_plan_file *pf = &plan->files[f];
    int rc = sd_path_check_name(pf->name, err);
    if (rc) return rc;
    if (pf->header_size > pf->file_size)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: header is larger than the file", pf->name);
    p->names[f] = pf->name;
    ff[f] = (sd_fill_file){(const uint8_t *)pf->header, pf->header_size, pf->file_size};
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
  }
  uint8_t *ab = p->artifact_bytes;
  char *nb = p->artifact_names;
  for (size_t i = 0; i < req->nartifacts; i++, f++) {
    const sd_artifact *a = &req->artifacts[i];
    size_t nl = strlen(a->name) + 1;
    memcpy(nb, a->name, nl);
    p->names[f] = nb;
    nb += nl;
    if (a->len) memcpy(ab, a->data, a->len);
    ff[f] = (sd_fill_file){ab, a->len, a->len};
    ab += a->len;
  }
  if (plan->needs_index) {
    int rc = sd_path_check_name(plan->index_name, err);
    if (rc) return rc;
    if (!req->index_json)
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: the plan needs an index but none was given",
                     plan->index_name);
    p->names[f] = plan->index_name;
    p->index_file = f;
    ff[f] = (sd_fill_file){(const uint8_t *)req->index_json, req->index_len, req->index_len};
    f++;
  }
  if (plan->checksums && (rc_late = late_file(p, plan, req, err)) != 0) return rc_late;
  sd_fill fill = {.files = ff, .nfiles = nf};
  if (req->nspans && !(p->spans = sd_fill_set_spans(&fill, req->spans, req->nspans)))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish sources");
  p->nspans = fill.nspans;
  if (req->op_ready && !sd_fill_ops_sorted(req->ops, req->nops))
    return sd_fail(err, SHARDD_E_INTERNAL, "publish: streamed writes must come sorted");
  if (sd_fill_set_ops(&fill, req->ops, req->nops, &p->own_ops) != 0)
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish writes");
  p->ops = fill.ops;
  p->nops = fill.nops;
  p->op_ready = req->op_ready;
  /* Each file's writes in order: none may overlap another or the header. */
  const sd_write_op *prev = NULL;
  for (size_t i = 0; i < p->nops; i++) {
    const sd_write_op *c = &p->ops[i];
    if (c->len == 0) continue;
    uint64_t floor = prev && prev->file == c->file ? prev->file_offset + prev->len : ff[c->file].head_len;
    if (c->file_offset < floor)
      return sd_fail(err, SHARDD_E_INTERNAL, "writes overlap in %s at offset %llu",
                     p->names[c->file], (unsigned long long)c->file_offset);
    prev = c;
  }
  /* Every byte of every file is written (bytes no write covers as zeros). */
  for (size_t i = 0; i < nf; i++) p->bytes_total += ff[i].size;
  if (p->late && p->late_file == p->index_file) p->bytes_total += p->late_len;
  return 0;
}

/* The temporary folder and every file in it. */
static int make_files(sd_publish *p, sd_error *err) {
  char name[NAME_MAX + 1];
  sd_publish_tmp_name(name, p->base, p->tag, ++tmp_counter);
  if (!(p->tmp_name = strdup(name))) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");

  if (mkdirat(p->parent_fd, p->tmp_name, 0700) < 0) {
    int e = errno;
    free(p->tmp_name);
    p->tmp_name = NULL; /* not ours: never remove it */
    return sd_fail(err, sd_err_from_errno(e),
                   "cannot create a temporary folder beside '%s': %s", p->rel_dir, strerror(e));
  }
  p->tmp_fd = sd_openat_beneath(p->parent_fd, p->tmp_name, O_RDONLY | O_DIRECTORY, 0);
  if (p->tmp_fd < 0)
    return sd_fail(err, SHARDD_E_IO, "cannot open the temporary folder for '%s': %s", p->rel_dir,
                   strerror(-p->tmp_fd));

  int rc = 0;
  for (size_t i = 0; i < p->nfiles && !rc; i++) {
    const char *name = p->names[i];
    /* The folder is fresh and the name plain, so nothing here can be a symlink. */
    int fd = p->fds[i] = openat(p->tmp_fd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, p->file_mode);
    if (fd < 0) {
      int e = errno;
      if (e == EEXIST)
        rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "'%s' is given twice in %s", name, p->rel_dir);
      else
        rc = sd_fail(err, sd_err_from_errno(e), "cannot create %s/%s: %s", p->rel_dir, name, strerror(e));
    } else if (fchmod(fd, p->file_mode) < 0) {
      rc = sd_fail(err, SHARDD_E_IO, "cannot set the mode of %s/%s: %s", p->rel_dir, name, strerror(errno));
    }
    /* Closed at once: the set opens each by name when it writes it, so a
     * save holds a few descriptors, not one per file. */
    if (fd >= 0) close(fd);
    p->fds[i] = -1;
  }
  /* Exactly the configured modes, whatever the daemon's umask; the folder's
   * last, so a mode without owner write cannot stop the files being made. */
  /* Set before the rename, so the folder is never visible without its owner. */
  int orc = !rc && p->record_owner ? sd_owner_record(p->tmp_fd, p->owner_uid) : 0;
  if (orc < 0)
    sd_log_warn("cannot record the owner (uid %u) of '%s': %s; only root, the daemon's uid and trusted_group"
                " members may overwrite it",
                (unsigned)p->owner_uid, p->rel_dir, strerror(-orc));
  if (!rc && fchmod(p->tmp_fd, p->dir_mode) < 0)
    rc = sd_fail(err, SHARDD_E_IO, "cannot set the mode of the folder for '%s': %s", p->rel_dir, strerror(errno));
  return rc;
}

/* The set that writes and fsyncs every file, opening each by name in the temporary folder. */
static int make_set(sd_publish *p, sd_error *err) {
  size_t rl = strlen(p->root_path);
  char *where = malloc(rl + strlen(p->rel_dir) + 2);
  if (!where) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  sprintf(where, "%s%s%s", p->root_path, rl && p->root_path[rl - 1] == '/' ? "" : "/", p->rel_dir);
  sd_fileset_req r = {.fds = p->fds, .names = p->names, .files = p->fill_files, .nfiles = p->nfiles,
                      .ops = p->ops, .nops = p->nops, .op_ready = p->op_ready, .spans = p->spans,
                      .nspans = p->nspans, .durable = 1, .by_name = 1, .dir_fd = p->tmp_fd, .gather = 1, .dir = p->rel_dir, .where = where,
                      .tag = p->tag, .index_file = p->index_file, .sums = p->sums};
  int rc = sd_fileset_new(p->job.w, &r, &p->fs, err);
  free(where);
  if (rc) return rc;
  for (size_t i = 0; i < p->nfiles; i++) p->fds[i] = -1;
  return 0;
}

int sd_publish_start(sd_writer *w, const sd_publish_req *req, sd_publish **out, sd_error *err) {
  *out = NULL;
  if (!w || !req || !req->plan || !req->on_done || !req->root_path)
    return sd_fail(err, SHARDD_E_INTERNAL, "publish: incomplete request");
  int rc = sd_path_check_rel(req->rel_dir, err);
  if (rc) return rc;
  sd_publish *p = calloc(1, sizeof *p);
  if (!p) return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  p->job.ops = &sd_publish_ops;
  p->root_fd = req->root_fd;
  p->parent_fd = p->tmp_fd = p->late_fd = -1;
  p->overwrite = req->overwrite;
  p->file_mode = req->file_mode ? req->file_mode & 07777 : 0644;
  p->dir_mode = req->dir_mode ? req->dir_mode & 07777 : 0755;
  p->record_owner = req->record_owner;
  p->owner_uid = req->owner_uid;
  p->owner_trusted = req->owner_trusted;
  p->on_released = req->on_released;
  p->on_done = req->on_done;
  p->ud = req->ud;
  p->hold = req->hold;
  p->root_path = dupstr(req->root_path);
  p->rel_dir = dupstr(req->rel_dir);
  p->tag = dupstr(req->tag ? req->tag : "save");
  if (!p->root_path || !p->rel_dir || !p->tag) {
    sd_publish_free(p);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "publish");
  }

  p->job.w = w; /* for the file set; attach sets it again */
  rc = prepare(p, req, err);
  /* Again at the publish: other saves may have committed or made folders since the begin. */
  if (!rc && p->record_owner) rc = sd_owner_check_place(p->root_fd, p->rel_dir, p->owner_uid, p->owner_trusted, err);
  if (!rc) rc = sd_path_open_parent(p->root_fd, p->rel_dir, 1, &p->parent_fd,
                                    &p->created_parents, &p->base, err);
  if (!rc && p->record_owner) sd_owner_mark_made(p->root_fd, p->rel_dir, p->created_parents, p->owner_uid);
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
  if (!rc) rc = make_files(p, err);
  if (!rc) rc = make_set(p, err);
  if (!rc) rc = sd_writer_attach(w, &p->job, err);
  if (rc) {
    sd_publish_discard(p);
    sd_publish_log(p, err->msg);
    sd_publish_free(p);
    return rc;
  }
  *out = p;
  sd_crash_point("start");
  sd_writer_pump(w);
  sd_writer_kick(w); /* a poll soon, whatever completes: release, empty files, failures */
  return 0;
}
