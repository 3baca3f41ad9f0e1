/* A rank writing into its arena after seal: a zero-copy save fails naming the rank, a staged one commits only bytes its checksums describe, and a rank that waits for released may write at once. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xclient.h"

TestSuite(torn, .init = x_init, .fini = x_fini, .timeout = 240);

#define OK_(call, c, what) cr_assert_eq((call), 0, "%s: %s", what, shardd_last_error(c))

/* 'w', F32 [ROWS, COLS], split by rows over two ranks: 16 MiB each, two
 * zero-copy pieces (SD_ZERO_COPY_PIECE, 8 MiB) per rank when placed. */
#define ROWS 2048
#define COLS 4096
#define HALF ((size_t)ROWS / 2 * COLS * 4)

typedef struct {
  shardd_client *c[2];
  shardd_arena *a[2];
  uint8_t *slice[2];       /* each rank's slice in its arena */
  char save[32], dir[32];
} torn_save;

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 29 + seed * 83 + (i >> 12)) & 0xff);
}

/* Both ranks begin, put their slice and seal: the daemon starts writing.
 * placed: at the offset shardd_place gives (zero-copy), else one byte past
 * it (no source address congruent to its file offset: all staged). */
static void begin_and_seal(torn_save *t, const char *save, const char *dir, int placed) {
  memset(t, 0, sizeof *t);
  snprintf(t->save, sizeof t->save, "%s", save);
  snprintf(t->dir, sizeof t->dir, "%s", dir);
  uint64_t shape[2] = {ROWS, COLS};
  for (int r = 0; r < 2; r++) {
    uint64_t start[2] = {(uint64_t)r * ROWS / 2, 0}, count[2] = {ROWS / 2, COLS}, off = 0, end = 0;
    shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 2, .shape = shape, .start = start, .count = count,
                            .index = -1};
    OK_(shardd_place(&d, 1, 0, 0, &off, &end), NULL, "place");
    if (!placed) off += 1;
    OK_(shardd_connect(H.sock, &t->c[r]), NULL, "connect");
    OK_(shardd_arena_create(t->c[r], off + HALF, &t->a[r]), t->c[r], "arena");
    shardd_save_opts so = {.save = save, .dir = dir, .rank = r, .world_size = 2};
    OK_(shardd_begin(t->c[r], &so), t->c[r], "begin");
    t->slice[r] = (uint8_t *)shardd_arena_data(t->a[r]) + off;
    fill(t->slice[r], HALF, 7 + (uint64_t)r);
    OK_(shardd_put(t->c[r], save, &d, t->a[r], off), t->c[r], "put");
  }
  for (int r = 0; r < 2; r++) OK_(shardd_seal(t->c[r], save), t->c[r], "seal");
}

static void torn_free(torn_save *t) {
  for (int r = 0; r < 2; r++) {
    if (t->a[r]) shardd_arena_destroy(t->a[r]);
    if (t->c[r]) shardd_close(t->c[r]);
  }
}

/* The training step that does not wait: it keeps writing into one rank's
 * slice, a new value in every page each pass, until told to stop. */
typedef struct {
  uint8_t *p;
  size_t len;
  atomic_int stop;
  unsigned long passes;
} scribbler;

static void *scribble(void *arg) {
  scribbler *s = arg;
  uint64_t v = 1;
  while (!atomic_load(&s->stop)) {
    for (size_t o = 0; o + sizeof v <= s->len; o += 4096, v++) memcpy(s->p + o, &v, sizeof v);
    s->passes++;
    nanosleep(&(struct timespec){0, 1000000L}, NULL);
  }
  return NULL;
}

static uint64_t zero_copy_total(shardd_client *c) {
  char *js = NULL;
  OK_(shardd_status(c, &js), c, "status");
  json_t *st = json_loads(js, 0, NULL);
  cr_assert_not_null(st, "status is not JSON: %s", js);
  uint64_t n = (uint64_t)json_integer_value(json_object_get(json_object_get(st, "totals"), "bytes_zero_copy"));
  json_decref(st);
  shardd_free(js);
  return n;
}

/* A daemon stalling stall_ms at its first write's answer; both ranks seal
 * (placed or not), then rank 1 scribbles until the save ends. Returns how
 * it ended (rank 0's wait), its message in msg. */
static int save_while_scribbling(torn_save *t, const char *save, const char *dir, int placed, const char *stall,
                                 char *msg, size_t n) {
  setenv("SHARDD_TEST_STALL_AT", stall, 1);
  x_start(NULL);
  unsetenv("SHARDD_TEST_STALL_AT");
  begin_and_seal(t, save, dir, placed);
  scribbler s = {.p = t->slice[1], .len = HALF};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, scribble, &s), 0);
  shardd_result res;
  int rc = shardd_wait(t->c[0], t->save, H_WAIT_MS, &res);
  snprintf(msg, n, "%s", rc ? shardd_last_error(t->c[0]) : "committed");
  atomic_store(&s.stop, 1);
  pthread_join(th, NULL);
  printf("torn: %s, rank 1 rewrote its slice %lu times during the save: %s\n", placed ? "zero-copy" : "staged",
         s.passes, msg);
  return rc;
}

/* The ranks' slices go zero-copy; the daemon stalls 1.5 s at its first write's
 * answer, so rank 1's scribbling lands between its pieces' writes and their
 * checksums. Before: committed, and `verify --deep` said bad_checksum. */
Test(torn, a_rank_writing_under_a_zero_copy_write_fails_the_save_naming_it) {
  torn_save t;
  char msg[1024];
  int rc = save_while_scribbling(&t, "torn", "torn/zc", 1, "write:1:1500", msg, sizeof msg);
  if (rc == 0) {
    char out[8192], path[4096];
    h_shardctl(out, sizeof out, "verify", "--deep", h_path(path, sizeof path, t.dir), (char *)NULL);
    cr_assert_fail("the save committed although rank 1 wrote under its writes; verify --deep says: %s", out);
  }
  cr_assert_eq(rc, SHARDD_E_BAD_STATE, "the save ended with %d: %s", rc, msg);
  cr_assert(strstr(msg, "rank 1 changed its memory"), "the error does not name rank 1: %s", msg);
  cr_assert(strstr(msg, "released"), "the error does not say when the arena is free: %s", msg);
  h_expect_unpublished(t.dir);
  torn_free(&t);
  h_expect_serving();
}

/* Staged copies are hashed as copied, so what is committed is what its
 * checksums describe; a rank scribbling meanwhile may leave a mixture of its
 * old and new bytes, which no check can tell from data (docs/formats.md, PROTOCOL.md "seal"). */
Test(torn, a_staged_save_under_a_scribbling_rank_commits_only_what_its_checksums_say) {
  torn_save t;
  char msg[1024];
  int rc = save_while_scribbling(&t, "staged", "torn/staged", 0, "write:1:500", msg, sizeof msg);
  cr_assert_eq(rc, 0, "a staged save failed: %s", msg);
  cr_assert_eq(zero_copy_total(t.c[0]), 0, "a slice one byte off its placement went zero-copy");
  h_check_sums(t.dir, 1);
  torn_free(&t);
}

/* The contract: once `released` comes, the daemon never reads the arena
 * again; a rank writing at once gets a checkpoint of the bytes it sealed. */
Test(torn, a_rank_writing_after_released_gets_the_bytes_it_sealed) {
  x_start(NULL);
  torn_save t;
  begin_and_seal(&t, "after", "torn/after", 1);
  uint8_t *want = malloc(2 * HALF);
  for (int r = 0; r < 2; r++) memcpy(want + (size_t)r * HALF, t.slice[r], HALF);
  for (int r = 0; r < 2; r++) {
    OK_(shardd_wait_released(t.c[r], t.save, H_WAIT_MS), t.c[r], "wait_released");
    memset(t.slice[r], 0xa5, HALF);
  }
  shardd_result res;
  OK_(shardd_wait(t.c[0], t.save, H_WAIT_MS, &res), t.c[0], "wait");
  cr_assert_gt(zero_copy_total(t.c[0]), 0, "nothing went zero-copy");
  h_check_bytes(t.dir, "w", want, 2 * HALF);
  h_check_sums(t.dir, 1);
  free(want);
  torn_free(&t);
}
