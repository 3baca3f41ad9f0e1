/* A publish as the writer's job: its file set's writes and fsyncs (fileset.c), the folder's fsync, the swap-in, the parent's fsync, and its end either way. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crashpoint.h"
#include "log.h"
#include "pathsafe.h"
#include "publish_int.h"
#include "sd_checksum.h"

/* ------------------------------------------------------------------------ *
 * Errors
 * ------------------------------------------------------------------------ */
void sd_publish_log(const sd_publish *p, const char *msg) {
  sd_log_warn("save '%s': publish: %s", p->tag ? p->tag : "?", msg);
}

static int failed(const sd_publish *p) {
  return sd_fileset_error(p->fs) != NULL;
}

/* ------------------------------------------------------------------------ *
 * Tear-down
 * ------------------------------------------------------------------------ */
static void close_all(sd_publish *p) {
  if (p->late_fd >= 0) close(p->late_fd);
  p->late_fd = -1;
  for (size_t i = 0; p->fds && i < p->nfiles; i++)
    if (p->fds[i] >= 0) close(p->fds[i]), p->fds[i] = -1;
  if (p->fs) sd_fileset_close(p->fs);
  if (p->tmp_fd >= 0) close(p->tmp_fd);
  p->tmp_fd = -1;
}

void sd_publish_free(sd_publish *p) {
  close_all(p);
  if (p->parent_fd >= 0) close(p->parent_fd);
  free(p->root_path);
  free(p->rel_dir);
  free(p->tag);
  free(p->tmp_name);
  sd_fileset_free(p->fs);
  free(p->names);
  free(p->fds);
  free(p->artifact_bytes);
  free(p->artifact_names);
  free(p->fill_files);
  free(p->own_ops);
  free(p->spans);
  free(p->sums);
  free(p->late);
  free(p);
}

void sd_publish_discard(sd_publish *p) {
  close_all(p);
  if (p->parent_fd < 0) return; /* sd_path_open_parent took back its own folders */
  if (p->renamed) {
    int rc = p->exchanged
                 ? renameat2(p->parent_fd, p->tmp_name, p->parent_fd, p->base, RENAME_EXCHANGE)
                 : renameat2(p->parent_fd, p->base, p->parent_fd, p->tmp_name, RENAME_NOREPLACE);
    if (rc < 0) {
      char msg[600];
      snprintf(msg, sizeof msg, "cannot undo the rename of %s: %s", p->rel_dir, strerror(errno));
      sd_publish_log(p, msg);
    }
    p->renamed = 0;
  }
  if (p->tmp_name) {
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) sd_publish_log(p, e.msg);
  }
  sd_path_unmake_parents(p->root_fd, p->rel_dir, p->created_parents);
}

static void finish_failed(sd_publish *p) {
  sd_error err = *sd_fileset_error(p->fs);
  sd_publish_discard(p);
  sd_publish_log(p, err.msg);
  sd_writer_detach(p->job.w, &p->job);
  p->on_done(p, p->ud, &err, NULL);
  sd_publish_free(p);
}

static void finish_ok(sd_publish *p) {
  if (p->exchanged) {
    /* The old checkpoint now sits under the temporary name. Failing to
     * remove it does not unpublish the new one; a restart cleans it up. */
    sd_error e;
    if (sd_path_remove_tree(p->parent_fd, p->tmp_name, &e)) sd_publish_log(p, e.msg);
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
  sd_publish_free(p);
}

/* ------------------------------------------------------------------------ *
 * The job as the writer sees it
 * ------------------------------------------------------------------------ */
/* ------------------------------------------------------------------------ *
 * The late file: every data byte has passed, so the checksums are known
 * ------------------------------------------------------------------------ */
static int late_begin(sd_publish *p) {
  const sd_plan *plan = p->plan;
  for (size_t f = 0; f < plan->nfiles; f++)
    p->sums[f] = sd_crc32c_final(p->sums[f], plan->files[f].file_size - plan->files[f].header_size);
  if (plan->needs_index) {
    sd_error err;
    if (sd_index_put_sums((char *)p->late, p->late_len, plan, p->sums, &err) != 0) {
      sd_fileset_failf(p->fs, err.code, "%s", err.msg);
      return -1;
    }
  } else {
    sd_header_put_sum(&plan->files[0], (char *)p->late, p->sums[0]);
  }
  /* The set closed its descriptor with the file's fsync. Direct I/O like
   * the rest, from the block-aligned copy (zeros past its end, cut back once
   * written); buffered where the file system refuses it. */
  /* a header that ended mid-block would have its padding land on data: never so (SD_HEADER_ALIGN), but buffered if it did */
  p->late_odirect = !sd_writer_buffered(p->job.w) && (p->late_file == p->index_file || p->late_len % SD_DIO_ALIGN == 0);
  p->late_fd = sd_openat_beneath(p->tmp_fd, p->names[p->late_file], O_WRONLY | (p->late_odirect ? O_DIRECT : 0), 0);
  if (p->late_fd < 0 && p->late_odirect) {
    p->late_odirect = 0;
    p->late_fd = sd_openat_beneath(p->tmp_fd, p->names[p->late_file], O_WRONLY, 0);
  }
  if (p->late_fd < 0) {
    sd_fileset_fail_errno(p->fs, -p->late_fd, p->late_file, "open to record its checksums", 0);
    p->late_fd = -1;
    return -1;
  }
  p->phase = PH_LATE;
  sd_writer_kick(p->job.w);
  return 0;
}

static int late_next(sd_publish *p, sd_io *io) {
  if (p->late_busy || p->late_synced) return 0;
  p->late_busy = 1;
  io->fd = p->late_fd;
  io->tag = LATE_TAG;
  if (p->late_sent == p->late_len) {
    io->kind = SD_IO_FSYNC;
    return 1;
  }
  size_t n = (p->late_odirect ? sd_align_up(p->late_len) : p->late_len) - p->late_sent;
  io->kind = SD_IO_WRITE;
  io->off = p->late_sent;
  io->src = p->late + p->late_sent;
  io->len = n > SD_IO_CHUNK ? SD_IO_CHUNK : (uint32_t)n;
  io->count = sd_io_count_of(p->late_odirect);
  return 1;
}

static void late_complete(sd_publish *p, const sd_io *io, int res) {
  p->late_busy = 0;
  /* tests: the index's points, as when the set writes it */
  if (p->late_file == p->index_file) sd_crash_point("index");
  if (res == -EINVAL && io->kind == SD_IO_WRITE && p->late_odirect) {
    /* refused after all: all of it again, through the page cache */
    int fl = fcntl(p->late_fd, F_GETFL);
    if (fl >= 0) fcntl(p->late_fd, F_SETFL, fl & ~O_DIRECT);
    p->late_odirect = 0;
    p->late_padded = p->late_file == p->index_file; /* padding may have gone out: truncate at the end */
    p->late_sent = 0;
    return;
  }
  if (res < 0) {
    sd_fileset_fail_errno(p->fs, -res, p->late_file, io->kind == SD_IO_FSYNC ? "fsync" : "write", io->off + io->done);
    return;
  }
  if (io->kind == SD_IO_FSYNC) {
    p->late_synced = 1;
    close(p->late_fd);
    p->late_fd = -1;
    return;
  }
  p->late_sent += io->len;
  if (p->late_sent < p->late_len) return;
  /* a padded last block (or one that went out before a refusal sent the rest buffered) is cut back */
  if (p->late_sent > p->late_len || p->late_padded) {
    if (ftruncate(p->late_fd, (off_t)p->late_len) < 0) {
      sd_fileset_fail_errno(p->fs, errno, p->late_file, "truncate to its size", 0);
      return;
    }
    p->late_sent = p->late_len;
  }
}

static int job_next(sd_wjob *job, sd_io *io) {
  sd_publish *p = (sd_publish *)job;
  if (failed(p)) return 0;
  if (p->phase == PH_WRITE) return sd_fileset_next(p->fs, io);
  if (p->phase == PH_LATE) return late_next(p, io);
  if (p->dir_queued) return 0;
  p->dir_queued = 1;
  io->kind = SD_IO_FSYNC;
  io->fd = p->phase == PH_DIRSYNC ? p->tmp_fd : p->parent_fd;
  io->tag = DIR_TAG;
  return 1;
}

static void job_progress(sd_wjob *job, const sd_io *io, uint32_t bytes) {
  if (io->tag != LATE_TAG) sd_fileset_progress(((sd_publish *)job)->fs, io, bytes);
}

static void job_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_publish *p = (sd_publish *)job;
  if (io->tag == LATE_TAG) {
    late_complete(p, io, res);
    return;
  }
  if (io->tag != DIR_TAG) {
    sd_fileset_complete(p->fs, io, res);
    return;
  }
  if (res < 0)
    sd_fileset_fail_errno(p->fs, -res, DIR_TAG,
                          p->phase == PH_DIRSYNC ? "fsync of the new folder" : "fsync of its parent", 0);
  else
    p->dir_done = 1;
}

static int job_stage(sd_wjob *job, sd_chunk *c) {
  sd_publish *p = (sd_publish *)job;
  return p->phase == PH_WRITE && sd_fileset_stage(p->fs, c);
}

static void job_fill(sd_wjob *job, sd_chunk *c) {
  sd_fileset_fill(((sd_publish *)job)->fs, c);
}

static void job_filled(sd_wjob *job, sd_chunk *c) {
  sd_fileset_filled(((sd_publish *)job)->fs, c);
}

static int do_rename(sd_publish *p) {
  sd_error err;
  if (sd_publish_swap_in(p->parent_fd, p->tmp_name, p->base, p->rel_dir, p->overwrite, &p->exchanged, &err) != 0) {
    sd_fileset_failf(p->fs, err.code, "%s", err.msg);
    return -1;
  }
  p->renamed = 1;
  return 0;
}

static void job_poll(sd_wjob *job) {
  sd_publish *p = (sd_publish *)job;
  if (!failed(p) && !p->released && sd_fileset_released(p->fs)) {
    p->released = 1;
    if (p->on_released) p->on_released(p, p->ud); /* may cancel p */
  }
  if (failed(p)) {
    sd_fileset_drop(p->fs);
    if (p->job.inflight == 0 && p->job.filling == 0) finish_failed(p);
    return;
  }
  /* The late file is part of the writing, so a held publish (its sources
   * all final, a rank's seal awaited) writes it too. */
  if (p->phase == PH_WRITE && p->late && sd_fileset_done(p->fs) && p->job.inflight == 0) {
    if (late_begin(p) < 0 && p->job.inflight == 0) finish_failed(p);
    return;
  }
  if (p->phase == PH_WRITE && !p->late && sd_fileset_done(p->fs) && p->job.inflight == 0 && !p->hold) {
    p->phase = PH_DIRSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_LATE && p->late_synced && !p->hold) {
    sd_crash_point("late");
    p->phase = PH_DIRSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_DIRSYNC && p->dir_done) {
    sd_crash_point("dirsync");
    if (do_rename(p) < 0) {
      finish_failed(p); /* nothing is in flight after the folder's fsync */
      return;
    }
    sd_crash_point("rename");
    p->phase = PH_PARENTSYNC;
    p->dir_queued = p->dir_done = 0;
  } else if (p->phase == PH_PARENTSYNC && p->dir_done) {
    sd_crash_point("parentsync");
    finish_ok(p);
  }
}

static void job_fail(sd_wjob *job, int code, const char *why) {
  sd_publish_cancel((sd_publish *)job, code, why);
}

const sd_wjob_ops sd_publish_ops = {
  .next = job_next,
  .complete = job_complete,
  .progress = job_progress,
  .stage = job_stage,
  .fill = job_fill,
  .filled = job_filled,
  .poll = job_poll,
  .fail = job_fail,
};

void sd_publish_cancel(sd_publish *p, int code, const char *why) {
  /* Past the rename the checkpoint is in place; only the parent's fsync
   * remains, and finishing it beats unpublishing a whole checkpoint. */
  if (failed(p) || p->renamed) return;
  sd_fileset_failf(p->fs, code, "%s", why ? why : sd_err_message(code));
}

void sd_publish_poke(sd_publish *p) {
  if (!failed(p)) sd_writer_kick(p->job.w);
}

void sd_publish_unhold(sd_publish *p) {
  p->hold = 0;
  sd_writer_kick(p->job.w);
}

uint64_t sd_publish_bytes_written(const sd_publish *p) {
  /* a late index is written once; a single file's header again over itself, so only once counted */
  uint64_t late = p->late && p->late_file == p->index_file ? p->late_sent : 0;
  return sd_fileset_counts_of(p->fs)->written + late;
}

uint64_t sd_publish_bytes_zero_copy(const sd_publish *p) {
  return sd_fileset_counts_of(p->fs)->zero_copy;
}

uint64_t sd_publish_bytes_gathered(const sd_publish *p) {
  return sd_fileset_counts_of(p->fs)->gathered;
}

uint64_t sd_publish_bytes_sealed(const sd_publish *p) {
  return sd_fileset_counts_of(p->fs)->sealed;
}

uint64_t sd_publish_bytes_total(const sd_publish *p) {
  return p->bytes_total;
}
