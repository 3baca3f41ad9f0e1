/* Integration harness: starts and stops a real shardd, forks rank processes, reads checkpoints back strictly. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "synth.h"

/* ------------------------------------------------------------------------ *
 * The daemon
 * ------------------------------------------------------------------------ */
void h_daemon_start(h_daemon *d) { f_start(d, NULL); }

void h_daemon_stop(h_daemon *d) { f_stop(d, 1); }

void h_setup(void) {
  f_scratch(&H, "it");
  char why[512];
  if (f_try_start(&H, NULL, why, sizeof why) == 0) return;
  /* A failed setup skips .fini: leave nothing behind. */
  f_scratch_remove(H.base);
  cr_assert_fail("%s", why);
}

/* ------------------------------------------------------------------------ *
 * Segments left by ranks that died
 * ------------------------------------------------------------------------ */
static pid_t tracked[512];
static size_t ntracked;

void h_track_pid(pid_t pid) {
  if (ntracked < sizeof tracked / sizeof tracked[0]) tracked[ntracked++] = pid;
}

/* libshardd names arenas "/shardd-PID-N-RANDOM": only ours go. */
static void unlink_tracked_segments(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  h_track_pid(getpid());
  for (struct dirent *de; (de = readdir(d));) {
    long pid;
    char dash;
    if (sscanf(de->d_name, "shardd-%ld%c", &pid, &dash) != 2 || dash != '-') continue;
    for (size_t i = 0; i < ntracked; i++) {
      if ((long)tracked[i] != pid) continue;
      char name[300];
      snprintf(name, sizeof name, "/%s", de->d_name);
      shm_unlink(name);
      break;
    }
  }
  closedir(d);
  ntracked = 0;
}

void h_teardown(void) {
  unlink_tracked_segments();
  h_daemon_stop(&H);
  f_scratch_remove(H.base);
}

/* ------------------------------------------------------------------------ *
 * Processes and rendezvous
 * ------------------------------------------------------------------------ */
h_shared *h_shared_new(void) {
  void *p = mmap(NULL, sizeof(h_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
  memset(p, 0, sizeof(h_shared));
  return p;
}

void h_shared_free(h_shared *s) {
  if (s) munmap(s, sizeof *s);
}

void h_signal(h_shared *s, int k) { __atomic_add_fetch(&s->counters[k], 1, __ATOMIC_SEQ_CST); }

int h_await(h_shared *s, int k, int n) {
  int64_t deadline = f_now_ms() + H_WAIT_MS;
  while (__atomic_load_n(&s->counters[k], __ATOMIC_SEQ_CST) < n) {
    if (f_now_ms() > deadline) return -1;
    f_sleep_ms(1);
  }
  return 0;
}

pid_t h_fork(h_child_fn fn, int idx, void *arg) {
  fflush(NULL);
  pid_t p = fork();
  cr_assert(p >= 0, "fork: %s", strerror(errno));
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ntracked = 0;
    fn(idx, arg);
    fflush(NULL);
    _exit(0);
  }
  h_track_pid(p);
  return p;
}

int h_reap(pid_t pid) { return f_reap(pid, H_WAIT_MS + 30000); }

void h_reap_ok(pid_t pid, const char *what) {
  int st = h_reap(pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (pid %d) ended with status 0x%x", what, (int)pid, st);
}

/* Polls status until save `id` is in flight with field (ranks_begun, ranks_sealed) at least n. */
static void await_ranks(const char *id, const char *field, int n) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  int64_t deadline = f_now_ms() + H_WAIT_MS;
  for (;;) {
    char *js = NULL;
    cr_assert_eq(shardd_status(c, &js), 0, "status: %s", shardd_last_error(c));
    json_t *st = json_loads(js, 0, NULL);
    shardd_free(js);
    json_t *v;
    size_t i;
    json_int_t got = -1;
    json_array_foreach(json_object_get(st, "saves"), i, v) {
      const char *sid = json_string_value(json_object_get(v, "save"));
      if (sid && !strcmp(sid, id)) got = json_integer_value(json_object_get(v, field));
    }
    json_decref(st);
    if (got >= n) break;
    cr_assert(f_now_ms() < deadline, "save '%s' never had %s %d", id, field, n);
    f_sleep_ms(2);
  }
  shardd_close(c);
}

void h_await_begun(const char *id, int n) { await_ranks(id, "ranks_begun", n); }

void h_await_sealed(const char *id, int n) { await_ranks(id, "ranks_sealed", n); }

int h_wait_registered(shardd_client *c, const char *save) {
  int rc = shardd_wait(c, save, 0, NULL);
  if (rc != SHARDD_E_TIMEOUT) return rc ? rc : SHARDD_E_PROTOCOL; /* the save cannot have ended yet */
  char *js = NULL;
  rc = shardd_status(c, &js);
  shardd_free(js);
  return rc;
}

void h_result_fail(h_result *r, const char *step, int rc, const shardd_client *c) {
  r->rc = rc;
  snprintf(r->step, sizeof r->step, "%s", step);
  const char *m = shardd_last_error(c);
  snprintf(r->msg, sizeof r->msg, "%s", m && *m ? m : shardd_strerror(rc));
}

/* ------------------------------------------------------------------------ *
 * Scripted ranks (child side: no criterion asserts here, only reports)
 * ------------------------------------------------------------------------ */
unsigned h_dtype_size(const char *dtype) {
  sd_dtype dt;
  sd_error e;
  return sd_dtype_parse(dtype, &dt, &e) == 0 ? sd_dtype_size(dt) : 0;
}

static uint64_t numel(int ndim, const uint64_t *dims) {
  uint64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= dims[d];
  return n;
}

static uint64_t put_nbytes(const h_put *p) {
  return numel(p->ndim, p->boxed ? p->count : p->shape) * h_dtype_size(p->dtype);
}

static int rank_puts(const h_put *p, int rank) { return p->rank < 0 || p->rank == rank; }

/* The slice's bytes into out (put_nbytes long). */
static void put_bytes(const h_put *p, uint64_t seed, uint8_t *out) {
  uint64_t n = put_nbytes(p);
  if (p->bytes) {
    memcpy(out, p->bytes, n < p->len ? n : p->len);
    return;
  }
  uint64_t zero[SD_MAX_DIMS] = {0};
  sd_synth_fill_box(sd_synth_key(p->name, seed), p->ndim, p->shape, p->boxed ? p->start : zero,
                    p->boxed ? p->count : p->shape, h_dtype_size(p->dtype), out);
}

/* Wait for the save's end and record it. */
static void rank_wait(const h_script *s, h_result *r, shardd_client *c) {
  shardd_result res;
  memset(&res, 0, sizeof res);
  int rc = shardd_wait(c, s->opts.save, H_WAIT_MS, &res);
  r->waited = 1;
  r->wrc = rc;
  if (rc) {
    const char *m = shardd_last_error(c);
    snprintf(r->wmsg, sizeof r->wmsg, "%s", m);
  } else {
    r->res = res;
  }
}

void h_rank_main(int rank, void *arg) {
  const h_script *s = arg;
  h_result *r = &s->sh->r[rank];
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  int rc = shardd_connect(H.sock, &c), asked = 0, streamed = 0;
  uint64_t *off = NULL;
  if (rc) {
    h_result_fail(r, "connect", rc, NULL);
    goto failed;
  }
  /* Arena layout: every arena or copy put of this rank, 64-byte aligned. */
  uint64_t size = 0;
  off = calloc(s->nputs ? s->nputs : 1, sizeof *off);
  for (size_t i = 0; i < s->nputs; i++) {
    if (!rank_puts(&s->puts[i], rank) || s->puts[i].how == H_INLINE) continue;
    off[i] = size;
    size += (put_nbytes(&s->puts[i]) + 63) & ~(uint64_t)63;
  }
  if (s->place) {
    /* The placement rule: this rank's arena slices where the daemon can write them with no copy. */
    shardd_tensor_desc *d = calloc(s->nputs ? s->nputs : 1, sizeof *d);
    uint64_t *po = calloc(s->nputs ? s->nputs : 1, sizeof *po);
    size_t *which = calloc(s->nputs ? s->nputs : 1, sizeof *which), n = 0;
    for (size_t i = 0; i < s->nputs; i++) {
      const h_put *p = &s->puts[i];
      if (!rank_puts(p, rank) || p->how == H_INLINE) continue;
      d[n] = (shardd_tensor_desc){.name = p->name, .dtype = p->dtype, .ndim = p->ndim, .shape = p->shape,
                                  .start = p->boxed ? p->start : NULL, .count = p->boxed ? p->count : NULL,
                                  .index = p->has_index ? p->index : -1};
      which[n++] = i;
    }
    rc = shardd_place(d, n, s->opts.max_shard_size, 0, po, &size);
    for (size_t k = 0; k < n && !rc; k++) off[which[k]] = po[k];
    free(d);
    free(po);
    free(which);
    if (rc) {
      h_result_fail(r, "place", rc, NULL);
      goto failed;
    }
  }
  rc = size == 0 && s->arena_if_bytes ? 0 : shardd_arena_create(c, size ? size : 64, &a);
  if (rc) {
    h_result_fail(r, "arena", rc, c);
    goto failed;
  }
  snprintf(r->shm, sizeof r->shm, "%s", shardd_arena_name(a));

  shardd_save_opts o = s->opts;
  o.rank = rank;
  if (s->begin_together) {
    h_signal(s->sh, H_SYNC_READY);
    if (h_await(s->sh, H_SYNC_READY, s->begin_together)) {
      h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
      goto failed;
    }
  }
  asked = 1;
  rc = shardd_begin(c, &o);
  if (rc) {
    h_result_fail(r, "begin", rc, c);
    goto failed;
  }
  h_signal(s->sh, H_SYNC_BEGUN);
  if (s->hook) s->hook(s, rank, H_AT_BEGIN, c);
  for (size_t i = 0; i < s->nputs; i++) {
    const h_put *p = &s->puts[i];
    if (!rank_puts(p, rank)) continue;
    shardd_tensor_desc d = {.name = p->name, .dtype = p->dtype, .ndim = p->ndim, .shape = p->shape,
                            .start = p->boxed ? p->start : NULL, .count = p->boxed ? p->count : NULL,
                            .index = p->has_index ? p->index : -1};
    uint64_t n = put_nbytes(p);
    if (p->how == H_DEFERRED) {
      rc = shardd_put_deferred(c, o.save, &d, a, off[i]);
      streamed = 1;
    } else if (p->how == H_ARENA) {
      if (a) put_bytes(p, s->seed, (uint8_t *)shardd_arena_data(a) + off[i]);
      rc = shardd_put(c, o.save, &d, a, off[i]);
    } else {
      uint8_t *buf = malloc(n ? n : 1);
      put_bytes(p, s->seed, buf);
      rc = p->how == H_COPY ? shardd_put_copy(c, o.save, &d, a, off[i], buf, n)
                            : shardd_put_inline(c, o.save, &d, buf, n);
      free(buf);
    }
    if (rc) {
      h_result_fail(r, "put", rc, c);
      goto failed;
    }
  }
  for (size_t i = 0; i < s->nfiles; i++) {
    const h_file *f = &s->files[i];
    if (f->rank >= 0 && f->rank != rank) continue;
    rc = shardd_file(c, o.save, f->path, f->data, f->len);
    if (rc) {
      h_result_fail(r, "file", rc, c);
      goto failed;
    }
  }
  if (streamed) {
    rc = shardd_declared(c, o.save);
    if (rc) {
      h_result_fail(r, "declared", rc, c);
      goto failed;
    }
    if (s->hook) s->hook(s, rank, H_AT_DECLARED, c);
    for (size_t i = 0; i < s->nputs; i++) {
      const h_put *p = &s->puts[i];
      if (!rank_puts(p, rank) || p->how != H_DEFERRED || !a) continue;
      put_bytes(p, s->seed, (uint8_t *)shardd_arena_data(a) + off[i]);
      rc = s->no_ready ? 0 : shardd_ready(c, o.save, a, off[i] + put_nbytes(p));
      if (rc) {
        h_result_fail(r, "ready", rc, c);
        goto failed;
      }
    }
  }
  if (s->hook) s->hook(s, rank, H_AT_PUTS, c);
  int end = s->end[rank];
  if (end == H_END_KILL_BEFORE_SEAL) {
    if (h_await(s->sh, H_SYNC_BEGUN, o.world_size)) h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
    /* Leave the segment for the parent to unlink (its name is in r->shm),
     * as a crashed trainer would leave it. */
    raise(SIGKILL);
  }
  rc = shardd_seal(c, o.save);
  if (rc) {
    h_result_fail(r, "seal", rc, c);
    goto failed;
  }
  if (s->hook) s->hook(s, rank, H_AT_SEAL, c);
  if (end == H_END_DESTROY_EXIT) {
    rc = shardd_arena_destroy(a);
    a = NULL;
    if (rc) h_result_fail(r, "destroy", rc, c);
    shardd_close(c);
    r->done = 1;
    free(off);
    return;
  }
  if (end == H_END_UNLINK_EXIT) {
    if (a) shm_unlink(shardd_arena_name(a));
    r->done = 1;
    fflush(NULL);
    _exit(0); /* no detach, no close: the kernel closes the socket */
  }
  rank_wait(s, r, c);
  goto out;

failed:
  /* Even a refused begin may wait: the save's outcome is what tests check. */
  if (s->wait_after_fail && asked) rank_wait(s, r, c);
out:
  r->done = 1;
  free(off);
  shardd_arena_destroy(a);
  shardd_close(c);
}

void h_start(h_script *s, pid_t *pids) {
  if (!s->sh) s->sh = h_shared_new();
  cr_assert(s->opts.world_size >= 1 && s->opts.world_size <= H_MAX_RANKS);
  for (int r = 0; r < s->opts.world_size; r++) pids[r] = h_fork(h_rank_main, r, s);
}

void h_reap_all(h_script *s, const pid_t *pids) {
  for (int r = 0; r < s->opts.world_size; r++) {
    int st = h_reap(pids[r]);
    if (s->end[r] == H_END_KILL_BEFORE_SEAL) {
      cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank %d should have died of SIGKILL (0x%x)", r,
                st);
      if (s->sh->r[r].shm[0]) shm_unlink(s->sh->r[r].shm);
      continue;
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d ended with status 0x%x", r, st);
    cr_assert(s->sh->r[r].done, "rank %d did not reach the end of its script", r);
  }
}

void h_run(h_script *s) {
  pid_t pids[H_MAX_RANKS];
  h_start(s, pids);
  h_reap_all(s, pids);
}

void h_expect_committed(const h_script *s) {
  char want[PATH_MAX];
  h_path(want, sizeof want, s->opts.dir);
  for (int r = 0; r < s->opts.world_size; r++) {
    const h_result *x = &s->sh->r[r];
    cr_assert_eq(x->rc, 0, "rank %d: %s failed: %s", r, x->step, x->msg);
    if (s->end[r] != H_END_WAIT) continue;
    cr_assert(x->waited, "rank %d never waited", r);
    cr_assert_eq(x->wrc, 0, "rank %d: save '%s' did not commit: %s", r, s->opts.save, x->wmsg);
    cr_assert_str_eq(x->res.dir, want, "rank %d: committed dir", r);
    cr_assert_gt(x->res.files, 0);
  }
}

void h_expect_failed(const h_script *s, int code, ...) {
  for (int r = 0; r < s->opts.world_size; r++) {
    if (s->end[r] == H_END_KILL_BEFORE_SEAL) continue;
    const h_result *x = &s->sh->r[r];
    int got = x->waited ? x->wrc : x->rc;
    const char *msg = x->waited ? x->wmsg : x->msg;
    cr_assert_eq(got, code, "rank %d: expected %s, got %s (%s; first failure: %s %s)", r, shardd_err_name(code),
                 shardd_err_name(got), msg, x->step, x->msg);
    va_list ap;
    va_start(ap, code);
    for (const char *frag; (frag = va_arg(ap, const char *));)
      cr_assert(strstr(msg, frag), "rank %d: message '%s' lacks '%s'", r, msg, frag);
    va_end(ap);
  }
}

/* ------------------------------------------------------------------------ *
 * Reading back
 * ------------------------------------------------------------------------ */
int h_sums_expected = 1;

void h_ckpt_read_headers(const char *rel, sd_ckpt *c) {
  char p[PATH_MAX];
  sd_error e = {0};
  memset(c, 0, sizeof *c);
  int rc = sd_ckpt_read(h_path(p, sizeof p, rel), c, &e);
  cr_assert_eq(rc, 0, "strict reader refuses %s: %s", p, e.msg);
}

void h_ckpt_read(const char *rel, sd_ckpt *c) {
  char p[PATH_MAX];
  h_ckpt_read_headers(rel, c);
  h_ckpt_deep(h_path(p, sizeof p, rel), c);
}

/* Every checkpoint a test reads back records a checksum for every file and passes the deep check: the
 * CRC-32C the daemon recorded (from pieces written in any order, on any path) is the CRC of the bytes on disk. */
size_t h_ckpt_deep(const char *path, const sd_ckpt *c) {
  size_t checked = 0;
  for (size_t i = 0; i < c->nfiles; i++) {
    /* the harness's daemons record checksums (the default): a file without one is a path that lost them */
    cr_assert(c->files[i].has_crc || !h_sums_expected, "%s/%s: no checksum recorded", path, c->files[i].name);
    if (!c->files[i].has_crc) continue;
    char fp[PATH_MAX + 256];
    snprintf(fp, sizeof fp, "%s/%s", path, c->files[i].name);
    int fd = open(fp, O_RDONLY | O_CLOEXEC);
    cr_assert(fd >= 0, "open %s: %s", fp, strerror(errno));
    uint32_t got;
    sd_error e = {0};
    int rc = sd_ckpt_file_verify(c, i, fd, &got, &e);
    close(fd);
    cr_assert_eq(rc, 0, "deep check refuses %s: %s", path, e.msg);
    checked++;
  }
  return checked;
}

const sd_st_tensor *h_ckpt_find(const sd_ckpt *c, const char *name, const sd_ckpt_file **file) {
  for (size_t f = 0; f < c->nfiles; f++) {
    const sd_st_tensor *t = sd_st_find(&c->files[f].h, name);
    if (t) {
      if (file) *file = &c->files[f];
      return t;
    }
  }
  return NULL;
}

/* Reads [off, off+len) of ROOT/rel/file. */
static uint8_t *read_range(const char *rel, const char *file, uint64_t off, size_t len) {
  char dir[PATH_MAX], p[PATH_MAX + 256];
  snprintf(p, sizeof p, "%s/%s", h_path(dir, sizeof dir, rel), file);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
  uint8_t *buf = malloc(len ? len : 1);
  size_t got = 0;
  while (got < len) {
    ssize_t r = pread(fd, buf + got, len - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    cr_assert(r > 0, "short read of %s at %llu", p, (unsigned long long)(off + got));
    got += (size_t)r;
  }
  close(fd);
  return buf;
}

uint8_t *h_read_tensor(const char *rel, const char *name, size_t *len) {
  sd_ckpt c;
  h_ckpt_read(rel, &c);
  const sd_ckpt_file *f = NULL;
  const sd_st_tensor *t = h_ckpt_find(&c, name, &f);
  cr_assert_not_null(t, "tensor '%s' is not in %s", name, rel);
  *len = (size_t)(t->end - t->begin);
  uint8_t *b = read_range(rel, f->name, f->h.data_start + t->begin, *len);
  sd_ckpt_free(&c);
  return b;
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) return i;
  return n;
}

void h_check_bytes(const char *rel, const char *name, const void *want, size_t len) {
  size_t got_len = 0;
  uint8_t *got = h_read_tensor(rel, name, &got_len);
  cr_assert_eq(got_len, len, "tensor '%s': %zu bytes on disk, expected %zu", name, got_len, len);
  size_t d = first_diff(got, want, len);
  cr_assert_eq(d, len, "tensor '%s': byte %zu on disk is 0x%02x, ranks sent 0x%02x", name, d, got[d],
               ((const uint8_t *)want)[d]);
  free(got);
}

size_t h_hf_split(const uint64_t *sizes, size_t n, uint64_t max, uint32_t *file_of) {
  /* Shards are numbered as they are appended to the list: an oversized
   * tensor's own shard goes in at once, the one being filled when it closes. */
  size_t nshards = 0, open_from = SIZE_MAX;
  uint64_t open_size = 0;
  size_t *pending = malloc((n ? n : 1) * sizeof *pending), npending = 0;
  for (size_t i = 0; i < n; i++) {
    if (sizes[i] > max) {
      file_of[i] = (uint32_t)nshards++;
      continue;
    }
    if (open_from != SIZE_MAX && open_size + sizes[i] > max) {
      for (size_t k = 0; k < npending; k++) file_of[pending[k]] = (uint32_t)nshards;
      nshards++;
      npending = 0;
      open_from = SIZE_MAX;
      open_size = 0;
    }
    if (open_from == SIZE_MAX) open_from = i;
    pending[npending++] = i;
    open_size += sizes[i];
  }
  if (npending) {
    for (size_t k = 0; k < npending; k++) file_of[pending[k]] = (uint32_t)nshards;
    nshards++;
  }
  free(pending);
  return nshards;
}

uint8_t *h_synth_tensor(const char *name, uint64_t seed, const char *dtype, int ndim, const uint64_t *shape,
                        size_t *len) {
  *len = (size_t)(numel(ndim, shape) * h_dtype_size(dtype));
  uint8_t *b = malloc(*len ? *len : 1);
  sd_synth_fill(sd_synth_key(name, seed), 0, *len, b);
  return b;
}

/* Places a packed box into a row-major global tensor (independent of the daemon's run planner). */
static void scatter(uint8_t *dst, int ndim, const uint64_t *shape, const uint64_t *start, const uint64_t *count,
                    unsigned esize, const uint8_t *src) {
  if (ndim == 0) {
    memcpy(dst, src, esize);
    return;
  }
  if (numel(ndim, count) == 0) return;
  uint64_t pos[SD_MAX_DIMS] = {0};
  uint64_t run = count[ndim - 1] * esize;
  for (;;) {
    uint64_t e = 0;
    for (int d = 0; d < ndim; d++) e = e * shape[d] + start[d] + pos[d];
    memcpy(dst + e * esize, src, run);
    src += run;
    int d = ndim - 2;
    for (; d >= 0; d--) {
      if (++pos[d] < count[d]) break;
      pos[d] = 0;
    }
    if (d < 0) return;
  }
}

void h_check_script(const h_script *s) {
  sd_ckpt c;
  h_ckpt_read(s->opts.dir, &c);
  size_t distinct = 0;
  static char out[1 << 20];
  char dir[PATH_MAX];
  h_path(dir, sizeof dir, s->opts.dir);
  h_verify_ok(s->opts.dir);
  int st = h_shardctl(out, sizeof out, "inspect", dir, (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shardctl inspect %s failed: %s", dir, out);

  for (size_t i = 0; i < s->nputs; i++) {
    const h_put *p = &s->puts[i];
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = strcmp(s->puts[j].name, p->name) == 0;
    if (seen) continue;
    distinct++;
    const sd_ckpt_file *f = NULL;
    const sd_st_tensor *t = h_ckpt_find(&c, p->name, &f);
    cr_assert_not_null(t, "tensor '%s' is missing from %s", p->name, dir);
    cr_assert_str_eq(sd_dtype_name(t->dtype), p->dtype, "tensor '%s' dtype", p->name);
    cr_assert_eq((int)t->ndim, p->ndim, "tensor '%s' ndim", p->name);
    for (int d = 0; d < p->ndim; d++)
      cr_assert_eq(t->shape[d], p->shape[d], "tensor '%s' shape[%d]", p->name, d);
    unsigned es = h_dtype_size(p->dtype);
    cr_assert_eq((f->h.data_start + t->begin) % es, 0, "tensor '%s' is not aligned to %u bytes", p->name, es);
    cr_assert(strstr(out, p->name), "shardctl inspect does not list '%s':\n%s", p->name, out);

    /* What the ranks sent, assembled box by box. */
    size_t len = (size_t)(numel(p->ndim, p->shape) * es);
    uint8_t *want = calloc(1, len ? len : 1);
    for (size_t j = i; j < s->nputs; j++) {
      const h_put *q = &s->puts[j];
      if (strcmp(q->name, p->name) != 0) continue;
      uint64_t n = put_nbytes(q);
      uint8_t *b = malloc(n ? n : 1);
      put_bytes(q, s->seed, b);
      uint64_t zero[SD_MAX_DIMS] = {0};
      scatter(want, q->ndim, q->shape, q->boxed ? q->start : zero, q->boxed ? q->count : q->shape, es, b);
      free(b);
    }
    cr_assert_eq(t->end - t->begin, len, "tensor '%s': %llu bytes on disk, expected %zu", p->name,
                 (unsigned long long)(t->end - t->begin), len);
    uint8_t *got = read_range(s->opts.dir, f->name, f->h.data_start + t->begin, len);
    size_t d = first_diff(got, want, len);
    cr_assert_eq(d, len, "tensor '%s': byte %zu on disk is 0x%02x, ranks sent 0x%02x", p->name, d, got[d],
                 want[d]);
    free(got);
    free(want);
  }
  cr_assert_eq(c.ntensors, distinct, "%s holds %llu tensors, ranks put %zu", dir, (unsigned long long)c.ntensors,
               distinct);
  sd_ckpt_free(&c);
}
