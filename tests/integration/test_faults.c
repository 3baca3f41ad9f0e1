/* Faults with real processes: kill -9 at every step of a save, a client shrinking its shm, a full disk, fsync errors, 1,000 saves without growth. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "xclient.h"

TestSuite(faults, .init = x_init, .fini = x_fini, .timeout = 240);

/* ------------------------------------------------------------------------ *
 * One two-rank save driven from this process (two connections), with a
 * multi-shard layout: a row-split matrix larger than a shard, a replica,
 * small tensors sharing a shard, an inline tensor and a file artifact.
 * ------------------------------------------------------------------------ */
#define W_ROWS 128
#define W_COLS 256
#define E_ROWS 64
#define E_COLS 512
#define NSMALL 8

typedef struct {
  uint32_t scale;          /* matrix rows multiplied by this (bigger saves) */
  uint64_t max_shard;
} shape_opts;

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 31 + seed * 101 + (i >> 9)) & 0xff);
}

typedef struct {
  shardd_client *c[2];
  shardd_arena *a[2];
  char save[64], dir[128];
  uint64_t seed;
  uint32_t rows;
  uint8_t *w, *e, *small[NSMALL], norm[1024];
  int seal_rc;             /* the last seal: the write starts while it is answered */
} xsave;

static void xs_free(xsave *s) {
  for (int r = 0; r < 2; r++) {
    if (s->a[r]) shardd_arena_destroy(s->a[r]);
    if (s->c[r]) shardd_close(s->c[r]);
    s->a[r] = NULL;
    s->c[r] = NULL;
  }
  free(s->w);
  free(s->e);
  for (int i = 0; i < NSMALL; i++) free(s->small[i]);
  memset(s, 0, sizeof *s);
}

#define OK_(call, c, what) cr_assert_eq((call), 0, "%s: %s", what, shardd_last_error(c))

/* Connects, begins, puts everything and seals both ranks: the daemon starts
 * writing at once. */
static void xs_start(xsave *s, const char *save, const char *dir, int overwrite, uint64_t seed, shape_opts o) {
  memset(s, 0, sizeof *s);
  snprintf(s->save, sizeof s->save, "%s", save);
  snprintf(s->dir, sizeof s->dir, "%s", dir);
  s->seed = seed;
  s->rows = W_ROWS * (o.scale ? o.scale : 1);
  size_t wlen = (size_t)s->rows * W_COLS * 4, elen = (size_t)E_ROWS * E_COLS * 2;
  s->w = malloc(wlen);
  s->e = malloc(elen);
  fill(s->w, wlen, seed);
  fill(s->e, elen, seed + 1);
  fill(s->norm, sizeof s->norm, seed + 2);
  for (int i = 0; i < NSMALL; i++) {
    s->small[i] = malloc(4096);
    fill(s->small[i], 4096, seed + 10 + (uint64_t)i);
  }
  for (int r = 0; r < 2; r++) {
    OK_(shardd_connect(H.sock, &s->c[r]), NULL, "connect");
    OK_(shardd_arena_create(s->c[r], wlen / 2 + elen + NSMALL * 4096, &s->a[r]), s->c[r], "arena");
    shardd_save_opts so = {.save = save, .dir = dir, .rank = r, .world_size = 2,
                           .max_shard_size = o.max_shard ? o.max_shard : 65536, .overwrite = overwrite};
    OK_(shardd_begin(s->c[r], &so), s->c[r], "begin");
  }
  for (int r = 0; r < 2; r++) {
    shardd_client *c = s->c[r];
    uint64_t off = 0;
    uint64_t wshape[2] = {s->rows, W_COLS}, wstart[2] = {(uint64_t)r * s->rows / 2, 0},
             wcount[2] = {s->rows / 2, W_COLS};
    shardd_tensor_desc wd = {.name = "w", .dtype = "F32", .ndim = 2, .shape = wshape, .start = wstart,
                             .count = wcount, .index = 0};
    OK_(shardd_put_copy(c, save, &wd, s->a[r], off, s->w + (size_t)r * wlen / 2, wlen / 2), c, "put w");
    off += wlen / 2;
    uint64_t eshape[2] = {E_ROWS, E_COLS};
    shardd_tensor_desc ed = {.name = "emb", .dtype = "BF16", .ndim = 2, .shape = eshape, .index = 1};
    OK_(shardd_put_copy(c, save, &ed, s->a[r], off, s->e, elen), c, "put emb (replica)");
    off += elen;
    for (int i = r; i < NSMALL; i += 2) {
      char name[32];
      snprintf(name, sizeof name, "layers.%d.x", i);
      uint64_t sshape[2] = {32, 32};
      shardd_tensor_desc sd = {.name = name, .dtype = "F32", .ndim = 2, .shape = sshape, .index = 2 + i};
      OK_(shardd_put_copy(c, save, &sd, s->a[r], off, s->small[i], 4096), c, "put small");
      off += 4096;
    }
    if (r == 0) {
      uint64_t nshape[1] = {256};
      shardd_tensor_desc nd = {.name = "norm", .dtype = "F32", .ndim = 1, .shape = nshape, .index = 100};
      OK_(shardd_put_inline(c, save, &nd, s->norm, sizeof s->norm), c, "put norm");
    }
    OK_(shardd_file(c, save, "config.json", "{\"model_type\":\"fault\"}\n", 24), c, "file");
  }
  OK_(shardd_seal(s->c[0], save), s->c[0], "seal 0");
  /* A crash at the very start of the write can beat the reply to this seal. */
  s->seal_rc = shardd_seal(s->c[1], save);
}

/* The save's end as rank 0's wait reports it; *msg (may be NULL) gets its message. */
static int xs_wait(xsave *s, char *msg, size_t n) {
  shardd_result res;
  int rc = s->seal_rc ? s->seal_rc : shardd_wait(s->c[0], s->save, H_WAIT_MS, &res);
  if (msg) snprintf(msg, n, "%s", rc ? shardd_last_error(s->c[s->seal_rc ? 1 : 0]) : "");
  return rc;
}

/* ROOT/dir holds exactly what a save with this seed and size sent. */
static void expect_complete(const char *dir, uint64_t seed, uint32_t scale) {
  h_verify_ok(dir);
  uint32_t rows = W_ROWS * (scale ? scale : 1);
  size_t wlen = (size_t)rows * W_COLS * 4, elen = (size_t)E_ROWS * E_COLS * 2;
  uint8_t *w = malloc(wlen), *e = malloc(elen), sm[4096], norm[1024];
  fill(w, wlen, seed);
  fill(e, elen, seed + 1);
  fill(norm, sizeof norm, seed + 2);
  h_check_bytes(dir, "w", w, wlen);
  h_check_bytes(dir, "emb", e, elen);
  h_check_bytes(dir, "norm", norm, sizeof norm);
  for (int i = 0; i < NSMALL; i++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d.x", i);
    fill(sm, sizeof sm, seed + 10 + (uint64_t)i);
    h_check_bytes(dir, name, sm, sizeof sm);
  }
  free(w);
  free(e);
}

static void commit_opts(const char *save, const char *dir, int overwrite, uint64_t seed, shape_opts o) {
  xsave s;
  xs_start(&s, save, dir, overwrite, seed, o);
  char msg[1024];
  int rc = xs_wait(&s, msg, sizeof msg);
  cr_assert_eq(rc, 0, "save %s does not commit: %s", save, msg);
  xs_free(&s);
  expect_complete(dir, seed, o.scale);
}

/* A daemon whose I/O answers one fault (SHARDD_TEST_FAULT=fault), for this test's saves. */
static void start_with_fault(const char *fault) {
  setenv("SHARDD_TEST_FAULT", fault, 1);
  x_start(NULL);
  unsetenv("SHARDD_TEST_FAULT");
}

static void commit(const char *save, const char *dir, int overwrite, uint64_t seed) {
  commit_opts(save, dir, overwrite, seed, (shape_opts){0});
}

static uint64_t tree(const char *rel) {
  char p[PATH_MAX];
  return x_tree_hash(h_path(p, sizeof p, rel));
}

/* ------------------------------------------------------------------------ *
 * kill -9 at each step of the write, fsync, index (late, with its checksums) and rename phases
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *at;          /* SHARDD_TEST_CRASH_AT */
  int overwrite;           /* onto base/b instead of a new folder */
  int published;           /* the rename had happened: ROOT/DIR holds the new checkpoint */
  int sanitized;           /* also run in the (slower) sanitizer build */
} crash_case;

static const crash_case crashes[] = {
    {"start:1", 0, 0, 1},   {"write:1", 0, 0, 0},   {"write:3", 0, 0, 0},   {"write:5", 0, 0, 0},
    {"fsync:1", 0, 0, 0},   {"fsync:3", 0, 0, 1},   {"index:1", 0, 0, 0},   {"index:2", 0, 0, 0},
    {"dirsync:1", 0, 0, 0}, {"rename:1", 0, 1, 1},  {"parentsync:1", 0, 1, 0}, {"start:1", 1, 0, 0},
    {"write:2", 1, 0, 0},   {"fsync:2", 1, 0, 0},   {"index:2", 1, 0, 1},   {"dirsync:1", 1, 0, 0},
    {"rename:1", 1, 1, 1},  {"parentsync:1", 1, 1, 0},
    /* the index with its checksums written and fsynced, the folder not yet */
    {"late:1", 0, 0, 0},    {"late:1", 1, 0, 0},
};

Test(faults, kill_9_at_every_step_of_a_save_never_publishes_a_partial_checkpoint) {
  x_start(NULL);
  commit("base-a", "base/a", 0, 1);
  commit("base-b", "base/b", 0, 2);
  h_daemon_stop(&H);
  uint64_t ha = tree("base/a"), hb = tree("base/b");
  uint64_t b_seed = 2;
  size_t n = sizeof crashes / sizeof crashes[0];
  for (size_t i = 0; i < n; i++) {
    const crash_case *k = &crashes[i];
    if (X_SANITIZED && !k->sanitized) continue;
    char dir[64], save[64];
    snprintf(save, sizeof save, "crash-%zu", i);
    if (k->overwrite)
      snprintf(dir, sizeof dir, "base/b");
    else
      snprintf(dir, sizeof dir, "crash/%zu", i);
    uint64_t seed = 100 + i;

    setenv("SHARDD_TEST_CRASH_AT", k->at, 1);
    x_start(NULL);
    unsetenv("SHARDD_TEST_CRASH_AT");
    xsave s;
    xs_start(&s, save, dir, k->overwrite, seed, (shape_opts){0});
    int rc = xs_wait(&s, NULL, 0);
    cr_assert_neq(rc, 0, "%s: the save committed; the crash point was never reached", k->at);
    xs_free(&s);
    x_reap_killed();
    int tmp_left = h_tmp_count();

    /* what the crash left, before anything cleans up */
    cr_assert_eq(tree("base/a"), ha, "%s: a checkpoint committed before changed", k->at);
    if (!k->overwrite) cr_assert_eq(tree("base/b"), hb, "%s: a checkpoint committed before changed", k->at);
    char p[PATH_MAX];
    if (k->published) {
      expect_complete(dir, seed, 1);
      if (k->overwrite) b_seed = seed;
    } else if (k->overwrite) {
      cr_assert_eq(tree("base/b"), hb, "%s: the old checkpoint was damaged by a crashed overwrite", k->at);
    } else {
      cr_assert(!h_exists(h_path(p, sizeof p, dir)), "%s: a partial checkpoint is visible at %s", k->at, dir);
    }

    /* a restarted daemon removes the leftovers and works */
    x_start(NULL);
    cr_assert_eq(h_tmp_count(), 0, "%s: %d temporary folders survive a restart", k->at, tmp_left);
    if (k->overwrite) {
      expect_complete("base/b", b_seed, 1);
      hb = tree("base/b");
    }
    cr_assert_eq(tree("base/a"), ha, "%s: restart changed a committed checkpoint", k->at);
    x_serving();
    printf("faults: crash at %-13s %s: %d temporary folder(s) left, removed on restart; %s\n", k->at,
           k->overwrite ? "overwrite" : "new dir  ", tmp_left, k->published ? "published whole" : "nothing published");
    h_daemon_stop(&H);
  }
}

/* kill -9 at random moments of bigger saves */
Test(faults, kill_9_at_random_times) {
  unsigned seed = (unsigned)time(NULL);
  const char *env = getenv("SHARDD_FAULT_SEED");
  if (env) seed = (unsigned)strtoul(env, NULL, 10);
  printf("faults: random kills with seed %u (SHARDD_FAULT_SEED to repeat)\n", seed);
  srand(seed);
  x_start(NULL);
  commit("base-a", "base/a", 0, 1);
  uint64_t ha = tree("base/a");
  /* how long such a save takes here, so the kills land all over it */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  commit_opts("rand-ref", "rand/ref", 0, 499, (shape_opts){.scale = 16, .max_shard = 1 << 20});
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long span_ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  if (span_ms < 5) span_ms = 5;
  int committed = 0, absent = 0;
  for (int i = 0; i < (X_SANITIZED ? 2 : 6); i++) {
    char dir[64], save[64];
    snprintf(dir, sizeof dir, "rand/%d", i);
    snprintf(save, sizeof save, "rand-%d", i);
    xsave s;
    xs_start(&s, save, dir, 0, 500 + (uint64_t)i, (shape_opts){.scale = 16, .max_shard = 1 << 20});
    long ms = rand() % (span_ms + span_ms / 4);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(H.pid, SIGKILL);
    x_reap_killed();
    xs_free(&s);
    char p[PATH_MAX];
    if (h_exists(h_path(p, sizeof p, dir))) {
      expect_complete(dir, 500 + (uint64_t)i, 16);
      committed++;
    } else {
      absent++;
    }
    cr_assert_eq(tree("base/a"), ha, "a committed checkpoint changed");
    x_start(NULL);
    cr_assert_eq(h_tmp_count(), 0, "temporary folders survive a restart");
  }
  printf("faults: random kills over a %ld ms save: %d saves were whole on disk, %d absent, none partial\n", span_ms,
         committed, absent);
  x_serving();
}

/* ------------------------------------------------------------------------ *
 * A client shrinking its shared memory
 * ------------------------------------------------------------------------ */
static void shrink(shardd_arena *a, off_t to) {
  int fd = shm_open(shardd_arena_name(a), O_RDWR, 0);
  cr_assert(fd >= 0, "shm_open %s: %s", shardd_arena_name(a), strerror(errno));
  cr_assert_eq(ftruncate(fd, to), 0);
  close(fd);
}

static void expect_shrunk_error(shardd_client *c, const char *save, const char *shm) {
  shardd_result res;
  int rc = shardd_wait(c, save, H_WAIT_MS, &res);
  const char *msg = shardd_last_error(c);
  cr_assert_eq(rc, SHARDD_E_OUT_OF_RANGE, "a shrunk segment gave %d: %s", rc, msg);
  cr_assert(strstr(msg, shm), "the error does not name the segment %s: %s", shm, msg);
  cr_assert(strstr(msg, "shrank"), "the error does not say what happened: %s", msg);
}

/* Before the write starts (checked when the last rank seals) and during
 * it (the kernel's EFAULT from the truncated mapping, named as the segment's:
 * 'big' lies at arena offset 0, congruent to its file offset, so it is
 * written zero-copy and the O_DIRECT write itself gets the EFAULT).
 * Only named shm can shrink (a memfd arena is sealed), so these arenas are. */
Test(faults, client_shrinking_its_shm_fails_only_its_own_save) {
  setenv("SHARDD_ARENA", "shm", 1);
  setenv("SHARDD_TEST_STALL_AT", "start:2:1500", 1);
  x_start(NULL);
  unsetenv("SHARDD_TEST_STALL_AT");
  for (int during = 0; during < 2; during++) {
    shardd_client *c = NULL, *o = NULL;
    OK_(shardd_connect(H.sock, &c), NULL, "connect");
    OK_(shardd_connect(H.sock, &o), NULL, "connect other");
    shardd_arena *a = NULL;
    size_t len = 1 << 20;
    OK_(shardd_arena_create(c, len, &a), c, "arena");
    char save[32], dir[32];
    snprintf(save, sizeof save, "shrink-%d", during);
    snprintf(dir, sizeof dir, "shrink/%d", during);
    shardd_save_opts so = {.save = save, .dir = dir, .rank = 0, .world_size = 1};
    OK_(shardd_begin(c, &so), c, "begin");
    /* A new id each round: an ended id answers late begins for history_window. */
    shardd_save_opts oo = {.save = during ? "other-1" : "other-0", .dir = during ? "other/1" : "other/0",
                           .rank = 0, .world_size = 1};
    OK_(shardd_begin(o, &oo), o, "begin other");
    uint8_t *src = malloc(len);
    fill(src, len, 77);
    uint64_t shape[1] = {len / 4};
    shardd_tensor_desc d = {.name = "big", .dtype = "F32", .ndim = 1, .shape = shape, .index = -1};
    OK_(shardd_put_copy(c, save, &d, a, 0, src, len), c, "put");
    if (!during) {
      shrink(a, 16384 + 100); /* after put, before seal */
      OK_(shardd_seal(c, save), c, "seal");
    } else {
      /* the daemon stalls 1.5 s at the start of this write (start:2), after
       * its check, so the segment shrinks under the writes that follow (on a
       * machine slow enough to miss that, the check catches it instead) */
      fflush(NULL);
      pid_t k = fork();
      cr_assert(k >= 0);
      if (k == 0) {
        struct timespec ts = {0, 300000000L};
        nanosleep(&ts, NULL);
        int fd = shm_open(shardd_arena_name(a), O_RDWR, 0);
        _exit(fd >= 0 && ftruncate(fd, 0) == 0 ? 0 : 1);
      }
      OK_(shardd_seal(c, save), c, "seal");
      h_reap_ok(k, "the shrinking process");
    }
    expect_shrunk_error(c, save, shardd_arena_name(a));
    h_expect_unpublished(dir);
    /* the other client's save commits */
    float v[2] = {1.0f, 2.0f};
    uint64_t vs[1] = {2};
    shardd_tensor_desc vd = {.name = "v", .dtype = "F32", .ndim = 1, .shape = vs, .index = -1};
    OK_(shardd_put_inline(o, oo.save, &vd, v, sizeof v), o, "put other");
    OK_(shardd_seal(o, oo.save), o, "seal other");
    shardd_result res;
    OK_(shardd_wait(o, oo.save, H_WAIT_MS, &res), o, "the other save");
    h_check_bytes(oo.dir, "v", v, sizeof v);
    free(src);
    shardd_arena_destroy(a);
    shardd_close(c);
    shardd_close(o);
  }
  printf("faults: shrunk segments: %d log lines say 'shrank from', %d say the read faulted\n",
         x_log_count("shrank from"), x_log_count("faulted (SIGBUS)") + x_log_count("Bad address"));
  x_serving();
}

/* One rank puts both halves of 'g' (F32 [256, 512] split on dimension 1:
 * rows of 1024-byte fragments at 512-aligned arena offsets), so on a device
 * taking 512-aligned direct I/O its rows go in one gathered writev from the
 * segment. want gets the tensor's bytes in file order. */
#define G_HALF (256 * 256 * 4)
static void put_gathered(shardd_client *c, shardd_arena **a, const char *save, const char *dir, uint8_t *want) {
  OK_(shardd_arena_create(c, 1 << 20, a), c, "arena");
  shardd_save_opts so = {.save = save, .dir = dir, .rank = 0, .world_size = 1};
  OK_(shardd_begin(c, &so), c, "begin");
  uint8_t *src = malloc(G_HALF);
  uint64_t shape[2] = {256, 512}, count[2] = {256, 256};
  for (int k = 0; k < 2; k++) {
    uint64_t start[2] = {0, (uint64_t)k * 256};
    fill(src, G_HALF, 90 + (uint64_t)k);
    for (size_t r = 0; r < 256; r++) memcpy(want + r * 2048 + (size_t)k * 1024, src + r * 1024, 1024);
    shardd_tensor_desc d = {.name = "g", .dtype = "F32", .ndim = 2, .shape = shape, .start = start, .count = count,
                            .index = -1};
    OK_(shardd_put_copy(c, save, &d, *a, (uint64_t)k * G_HALF, src, G_HALF), c, "put half");
  }
  free(src);
}

/* A gathered write whose segment shrinks under it: EFAULT, named as the
 * segment's out_of_range, as for a zero-copy write. */
Test(faults, a_gathered_write_from_a_shrunk_segment_fails_with_out_of_range) {
  setenv("SHARDD_ARENA", "shm", 1);
  setenv("SHARDD_TEST_STALL_AT", "start:1:1500", 1);
  x_start(NULL);
  unsetenv("SHARDD_TEST_STALL_AT");
  shardd_client *c = NULL;
  OK_(shardd_connect(H.sock, &c), NULL, "connect");
  shardd_arena *a = NULL;
  uint8_t *want = malloc(2 * G_HALF);
  put_gathered(c, &a, "gshrink", "gshrink", want);
  fflush(NULL);
  pid_t k = fork();
  cr_assert(k >= 0);
  if (k == 0) {
    struct timespec ts = {0, 300000000L};
    nanosleep(&ts, NULL);
    int fd = shm_open(shardd_arena_name(a), O_RDWR, 0);
    _exit(fd >= 0 && ftruncate(fd, 0) == 0 ? 0 : 1);
  }
  OK_(shardd_seal(c, "gshrink"), c, "seal");
  h_reap_ok(k, "the shrinking process");
  expect_shrunk_error(c, "gshrink", shardd_arena_name(a));
  h_expect_unpublished("gshrink");
  printf("faults: gathered write on a shrunk segment: %d log lines say 'Bad address'\n", x_log_count("Bad address"));
  free(want);
  shardd_arena_destroy(a);
  shardd_close(c);
  x_serving();
}

/* A gathered write refused with EINVAL goes again through the page cache
 * (still one writev from the segment), or follows its file there when the
 * header's write was the one refused: the bytes are right either way. */
Test(faults, a_refused_gathered_write_goes_buffered_and_commits) {
  for (int at = 1; at <= 2; at++) {
    char fault[32], dir[32], save[32];
    snprintf(fault, sizeof fault, "write:%d:EINVAL", at);
    start_with_fault(fault);
    shardd_client *c = NULL;
    OK_(shardd_connect(H.sock, &c), NULL, "connect");
    shardd_arena *a = NULL;
    uint8_t *want = malloc(2 * G_HALF);
    snprintf(dir, sizeof dir, "geinval/%d", at);
    snprintf(save, sizeof save, "geinval-%d", at);
    put_gathered(c, &a, save, dir, want);
    OK_(shardd_seal(c, save), c, "seal");
    shardd_result res;
    OK_(shardd_wait(c, save, H_WAIT_MS, &res), c, "wait");
    h_check_bytes(dir, "g", want, 2 * G_HALF);
    free(want);
    shardd_arena_destroy(a);
    shardd_close(c);
    h_daemon_stop(&H);
    /* (the log carries on across the daemons of this test) */
    cr_assert_eq(x_log_count("refused a direct write"), at, "%s: one fallback warning per save", fault);
    cr_assert_eq(x_log_count(" 524288 gathered"), at, "%s: g's rows were still gathered", fault);
  }
}

/* ------------------------------------------------------------------------ *
 * A full disk
 * ------------------------------------------------------------------------ */
static int mounted;

static void unmount_fini(void) {
  if (H.pid) h_daemon_stop(&H);
  if (mounted) umount2(H.root, MNT_DETACH);
  mounted = 0;
  x_fini();
}

static void write_filler(const char *path, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
  char *buf = calloc(1, len);
  memset(buf, 0x5a, len);
  cr_assert_eq(write(fd, buf, len), (ssize_t)len, "filler: %s", strerror(errno));
  free(buf);
  close(fd);
}

Test(faults, full_disk_fails_with_no_space_then_commits_once_freed, .fini = unmount_fini) {
  if (geteuid() != 0) cr_skip_test("mounting a small tmpfs needs root");
  cr_assert_eq(mkdir(H.root, 0755), 0);
  if (mount("tmpfs", H.root, "tmpfs", 0, "size=4m,mode=0755") != 0)
    cr_skip_test("cannot mount a tmpfs (%s)", strerror(errno));
  mounted = 1;
  char filler[PATH_MAX];
  h_path(filler, sizeof filler, "filler");
  write_filler(filler, 3u << 20);
  x_start(NULL);
  /* ~2.3 MiB of checkpoint into ~1 MiB of space */
  xsave s;
  xs_start(&s, "full", "big/a", 0, 9, (shape_opts){.scale = 8, .max_shard = 1 << 20});
  char msg[1024];
  int rc = xs_wait(&s, msg, sizeof msg);
  cr_assert_eq(rc, SHARDD_E_NO_SPACE, "a full disk gave %d: %s", rc, msg);
  cr_assert(strstr(msg, "big/a/"), "no_space does not name the file: %s", msg);
  cr_assert(strstr(msg, ".safetensors") || strstr(msg, ".json"), "no_space does not name the file: %s", msg);
  xs_free(&s);
  h_expect_unpublished("big/a");
  x_serving(); /* small saves still fit */
  /* space freed: the same save commits */
  cr_assert_eq(unlink(filler), 0);
  commit_opts("full-2", "big/a", 0, 10, (shape_opts){.scale = 8, .max_shard = 1 << 20});
}

/* ------------------------------------------------------------------------ *
 * fsync and write errors: the save fails naming the file, and an fsync is
 * never retried (its failure may have dropped the dirty pages, so a second
 * fsync "succeeding" would prove nothing). The errors are injected where
 * the daemon reads the kernel's answer (SHARDD_TEST_FAULT), since a real
 * failing device (dm-error, dm-flakey) needs device-mapper on the host.
 * ------------------------------------------------------------------------ */
Test(faults, fsync_and_write_errors_fail_the_save_and_are_not_retried) {
  static const struct {
    const char *fault, *code_name, *frag;
    int code;
  } cases[] = {
      {"fsync:2:EIO", "io_error", "fsync", SHARDD_E_IO},
      {"write:3:EIO", "io_error", "write at offset", SHARDD_E_IO},
      {"write:2:ENOSPC", "no_space", "no space", SHARDD_E_NO_SPACE},
  };
  for (size_t i = 0; i < (X_SANITIZED ? 1 : sizeof cases / sizeof cases[0]); i++) {
    start_with_fault(cases[i].fault);
    char dir[32], save[32];
    snprintf(dir, sizeof dir, "fault/%zu", i);
    snprintf(save, sizeof save, "fault-%zu", i);
    xsave s;
    xs_start(&s, save, dir, 0, 40 + i, (shape_opts){0});
    char msg[1024];
    int rc = xs_wait(&s, msg, sizeof msg);
    cr_assert_eq(rc, cases[i].code, "%s: the save ended with %d: %s", cases[i].fault, rc, msg);
    cr_assert(strstr(msg, cases[i].frag), "%s: '%s' lacks '%s'", cases[i].fault, msg, cases[i].frag);
    cr_assert(strstr(msg, dir), "%s: the error does not name the file: %s", cases[i].fault, msg);
    xs_free(&s);
    h_expect_unpublished(dir);
    /* the fault fired once; the next save commits */
    commit("after", dir, 0, 50 + i);
    h_daemon_stop(&H);
    printf("faults: injected %-15s -> %s: %s\n", cases[i].fault, cases[i].code_name, msg);
  }
}

/* A direct write refused with EINVAL (as a file system without O_DIRECT
 * support answers) is written again through the page cache, whichever
 * write it hits: a whole stretch or a file's padded last block. */
Test(faults, a_refused_direct_write_goes_buffered_and_commits) {
  for (int at = 1; at <= (X_SANITIZED ? 1 : 4); at++) {
    char fault[32], dir[32], save[32];
    snprintf(fault, sizeof fault, "write:%d:EINVAL", at);
    start_with_fault(fault);
    snprintf(dir, sizeof dir, "einval/%d", at);
    snprintf(save, sizeof save, "einval-%d", at);
    commit(save, dir, 0, 60 + (uint64_t)at);
    h_daemon_stop(&H);
    cr_assert_eq(x_log_count("refused a direct write"), at, "%s: one fallback warning per save", fault);
  }
}

/* The same with half of the refused write gone out first (as a write the
 * kernel cut short answers): only the rest goes again, and every byte is
 * hashed once, so the recorded checksums hold (h_ckpt_read's deep check). */
Test(faults, a_direct_write_refused_halfway_resumes_buffered_with_its_checksums_right) {
  int zero_copy = 0, staged = 0;
  for (int at = 1; at <= 6; at++) {
    char fault[40], dir[32], save[32];
    snprintf(fault, sizeof fault, "write:%d:EINVAL:half", at);
    start_with_fault(fault);
    snprintf(dir, sizeof dir, "einval-half/%d", at);
    snprintf(save, sizeof save, "einval-half-%d", at);
    commit_opts(save, dir, 0, 80 + (uint64_t)at, (shape_opts){.scale = 4}); /* its read-back deep-checks it */
    h_daemon_stop(&H);
    zero_copy = x_log_count("half of a zero-copy write went out");
    staged = x_log_count("half of a staged write went out");
  }
  printf("faults: writes refused halfway: %d zero-copy and %d staged resumed, checksums right\n", zero_copy, staged);
  cr_assert_gt(zero_copy + staged, 0, "no write was refused halfway");
}

/* ------------------------------------------------------------------------ *
 * 1,000 saves: descriptors and memory stay flat
 * ------------------------------------------------------------------------ */
static void one_small_save(int i) {
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  OK_(shardd_connect(H.sock, &c), NULL, "connect");
  OK_(shardd_arena_create(c, 16384, &a), c, "arena");
  char save[32], dir[32];
  snprintf(save, sizeof save, "soak-%d", i);
  snprintf(dir, sizeof dir, "soak/%d", i);
  shardd_save_opts so = {.save = save, .dir = dir, .rank = 0, .world_size = 1};
  OK_(shardd_begin(c, &so), c, "begin");
  uint8_t w[16384];
  fill(w, sizeof w, (uint64_t)i);
  uint64_t shape[2] = {64, 64}, bs[1] = {4};
  shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 2, .shape = shape, .index = -1};
  OK_(shardd_put_copy(c, save, &d, a, 0, w, sizeof w), c, "put");
  float b[4] = {1, 2, 3, (float)i};
  shardd_tensor_desc bd = {.name = "b", .dtype = "F32", .ndim = 1, .shape = bs, .index = -1};
  OK_(shardd_put_inline(c, save, &bd, b, sizeof b), c, "put inline");
  OK_(shardd_file(c, save, "config.json", "{}", 2), c, "file");
  OK_(shardd_seal(c, save), c, "seal");
  shardd_result res;
  OK_(shardd_wait(c, save, H_WAIT_MS, &res), c, "wait");
  OK_(shardd_arena_destroy(a), c, "arena destroy");
  shardd_close(c);
  if (i % 250 == 0) h_check_bytes(dir, "w", w, sizeof w);
}

/* Waits until the daemon has seen every client but the probe go. */
static void settle(x_conn *probe) {
  for (int tries = 0; tries < 4000; tries++) {
    json_t *r = x_call(probe, "{\"op\":\"status\"}");
    int idle = json_integer_value(json_object_get(r, "clients")) == 1 &&
               json_integer_value(json_object_get(r, "regions")) == 0;
    json_decref(r);
    if (idle) return;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  cr_assert_fail("clients or regions linger after their saves");
}

Test(faults, a_thousand_saves_keep_descriptors_and_memory_flat) {
  x_start(NULL);
  x_conn *probe = x_connect();
  int fd100 = 0;
  long rss100 = 0;
  const int nsaves = X_SANITIZED ? 200 : 1000;
  for (int i = 0; i < nsaves; i++) {
    one_small_save(i);
    if (i == 99) {
      settle(probe);
      fd100 = x_fd_count(H.pid);
      rss100 = x_rss_kib(H.pid);
    }
  }
  settle(probe);
  int fd1000 = x_fd_count(H.pid);
  long rss1000 = x_rss_kib(H.pid);
  printf("faults: %d saves: daemon fds %d after 100 saves, %d after %d; VmRSS %ld KiB after 100, %ld KiB after %d\n",
         nsaves, fd100, fd1000, nsaves, rss100, rss1000, nsaves);
  cr_assert_eq(fd1000, fd100, "descriptors grow with saves: %d -> %d", fd100, fd1000);
#if defined(__SANITIZE_ADDRESS__)
  /* ASan keeps freed memory in quarantine: RSS says nothing there. */
#else
  long slack = rss100 / 4 > 4096 ? rss100 / 4 : 4096;
  cr_assert(rss1000 <= rss100 + slack, "RSS grows with saves: %ld KiB -> %ld KiB", rss100, rss1000);
#endif
  json_t *r = x_call(probe, "{\"op\":\"status\"}");
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(r, "totals"), "saves_committed")), nsaves);
  json_decref(r);
  x_close(probe);
}
