/* Saves over time: two in flight at once, the released event and arena reuse, ranks that leave right after seal. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_facts.h"
#include "harness.h"
#include "synth.h"

TestSuite(saves, .init = h_setup, .fini = h_teardown, .timeout = 110);

/* ------------------------------------------------------------------------ *
 * Child-side helpers: record the first failure and stop
 * ------------------------------------------------------------------------ */
#define TRY(r, step, call)                \
  do {                                    \
    int rc_ = (call);                     \
    if (rc_) {                            \
      h_result_fail((r), (step), rc_, c); \
      return;                             \
    }                                     \
  } while (0)

/* Rank `rank` of 2 holds rows [rank*rows/2, (rank+1)*rows/2) of a [rows, cols] F32
 * tensor; its bytes are synthetic for seed, written at offset in the arena. */
static int put_half(shardd_client *c, const char *save, shardd_arena *a, uint64_t off, const char *name,
                    uint64_t rows, uint64_t cols, int rank, uint64_t seed) {
  uint64_t shape[2] = {rows, cols};
  uint64_t start[2] = {rows * (uint64_t)rank / 2, 0};
  uint64_t count[2] = {rows * (uint64_t)(rank + 1) / 2 - start[0], cols};
  sd_synth_fill_box(sd_synth_key(name, seed), 2, shape, start, count, 4, (uint8_t *)shardd_arena_data(a) + off);
  shardd_tensor_desc d = {.name = name, .dtype = "F32", .ndim = 2, .shape = shape, .start = start,
                          .count = count, .index = -1};
  return shardd_put(c, save, &d, a, off);
}

static void wait_into(h_result *r, shardd_client *c, const char *save, int slot) {
  shardd_result res;
  int rc = shardd_wait(c, save, H_WAIT_MS, &res);
  if (rc && !r->rc) h_result_fail(r, slot ? "wait2" : "wait1", rc, c);
  if (!rc && slot == 0) r->res = res;
  r->waited++;
}

static void check_f32_synth(const char *rel, const char *name, uint64_t rows, uint64_t cols, uint64_t seed) {
  uint64_t shape[2] = {rows, cols};
  size_t len;
  uint8_t *want = h_synth_tensor(name, seed, "F32", 2, shape, &len);
  h_check_bytes(rel, name, want, len);
  free(want);
}

static json_t *status_json(void) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  char *js;
  cr_assert_eq(shardd_status(c, &js), 0, "%s", shardd_last_error(c));
  json_t *j = json_loads(js, 0, NULL);
  cr_assert_not_null(j, "status is not JSON: %s", js);
  shardd_free(js);
  shardd_close(c);
  return j;
}

static json_t *status_save(json_t *st, const char *id) {
  json_t *v;
  size_t i;
  json_array_foreach(json_object_get(st, "saves"), i, v) {
    if (!strcmp(json_string_value(json_object_get(v, "save")), id)) return v;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ *
 * Two saves in flight: ranks begin save 2 right after sealing save 1 (the
 * moderately sized test: 16 MiB per save), double-buffering two arenas.
 * ------------------------------------------------------------------------ */
#define BIG_ROWS 2048
#define BIG_COLS 2048
#define SMALL_ROWS 33
#define SMALL_COLS 7

static void back_to_back(int rank, void *arg) {
  h_shared *sh = arg;
  h_result *r = &sh->r[rank];
  shardd_client *c = NULL;
  TRY(r, "connect", shardd_connect(H.sock, &c));
  const size_t half = (size_t)BIG_ROWS / 2 * BIG_COLS * 4;
  shardd_arena *ab[2];
  TRY(r, "arena", shardd_arena_create(c, half + 4096, &ab[0]));
  TRY(r, "arena", shardd_arena_create(c, half + 4096, &ab[1]));
  const char *ids[2] = {"step-1", "step-2"}, *dirs[2] = {"run/step-1", "run/step-2"};
  for (int k = 0; k < 2; k++) {
    shardd_save_opts o = {.save = ids[k], .dir = dirs[k], .rank = rank, .world_size = 2,
                          .max_shard_size = 6 << 20};
    TRY(r, "begin", shardd_begin(c, &o));
    TRY(r, "put", put_half(c, ids[k], ab[k], 0, "big.w", BIG_ROWS, BIG_COLS, rank, 100 + (uint64_t)k));
    TRY(r, "put", put_half(c, ids[k], ab[k], half, "small.w", SMALL_ROWS, SMALL_COLS, rank, 100 + (uint64_t)k));
    TRY(r, "seal", shardd_seal(c, ids[k]));
  }
  wait_into(r, c, ids[0], 0);
  wait_into(r, c, ids[1], 1);
  shardd_arena_destroy(ab[0]);
  shardd_arena_destroy(ab[1]);
  shardd_close(c);
  r->done = 1;
}

Test(saves, two_saves_in_flight_back_to_back) {
  h_shared *sh = h_shared_new();
  pid_t p0 = h_fork(back_to_back, 0, sh), p1 = h_fork(back_to_back, 1, sh);
  h_reap_ok(p0, "rank 0");
  h_reap_ok(p1, "rank 1");
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(sh->r[r].rc, 0, "rank %d: %s: %s", r, sh->r[r].step, sh->r[r].msg);
    cr_assert(sh->r[r].done && sh->r[r].waited == 2);
  }
  for (int k = 0; k < 2; k++) {
    const char *rel = k ? "run/step-2" : "run/step-1";
    check_f32_synth(rel, "big.w", BIG_ROWS, BIG_COLS, 100 + (uint64_t)k);
    check_f32_synth(rel, "small.w", SMALL_ROWS, SMALL_COLS, 100 + (uint64_t)k);
    h_verify_ok(rel);
  }
  /* 16 MiB over a 6 MiB limit: big.w alone, then small.w. */
  char p[PATH_MAX];
  cr_assert(h_exists(h_path(p, sizeof p, "run/step-1/model-00001-of-00002.safetensors")));
  cr_assert_eq(h_tmp_count(), 0);
  h_shared_free(sh);
}

/* ------------------------------------------------------------------------ *
 * Two saves open at once on every connection, sealed in the other order
 * ------------------------------------------------------------------------ */
static void interleaved(int rank, void *arg) {
  h_shared *sh = arg;
  h_result *r = &sh->r[rank];
  shardd_client *c = NULL;
  shardd_arena *a;
  TRY(r, "connect", shardd_connect(H.sock, &c));
  TRY(r, "arena", shardd_arena_create(c, 8192, &a));
  shardd_save_opts oa = {.save = "il-a", .dir = "il/a", .rank = rank, .world_size = 2};
  shardd_save_opts ob = {.save = "il-b", .dir = "il/b", .rank = rank, .world_size = 2};
  TRY(r, "begin", shardd_begin(c, &oa));
  TRY(r, "begin", shardd_begin(c, &ob));
  /* Both saves read one arena, at different offsets. */
  TRY(r, "put", put_half(c, "il-b", a, 0, "w", 20, 10, rank, 7));
  TRY(r, "put", put_half(c, "il-a", a, 4096, "w", 20, 10, rank, 8));
  h_signal(sh, 0);
  if (h_await(sh, 1, 1)) {
    h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
    return;
  }
  TRY(r, "seal", shardd_seal(c, "il-b"));
  TRY(r, "seal", shardd_seal(c, "il-a"));
  wait_into(r, c, "il-a", 0);
  wait_into(r, c, "il-b", 1);
  shardd_arena_destroy(a);
  shardd_close(c);
  r->done = 1;
}

Test(saves, two_saves_open_on_the_same_connections) {
  h_shared *sh = h_shared_new();
  pid_t p0 = h_fork(interleaved, 0, sh), p1 = h_fork(interleaved, 1, sh);
  cr_assert_eq(h_await(sh, 0, 2), 0, "ranks did not reach their puts");
  json_t *st = status_json();
  json_t *saves = json_object_get(st, "saves");
  cr_assert_eq(json_array_size(saves), 2, "both saves should be in flight");
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(saves, 0), "save")), "il-a",
                   "saves are listed in the order they began");
  for (int k = 0; k < 2; k++) {
    json_t *v = json_array_get(saves, (size_t)k);
    cr_assert_str_eq(json_string_value(json_object_get(v, "state")), "open");
    cr_assert_eq(json_integer_value(json_object_get(v, "ranks_begun")), 2);
    cr_assert_eq(json_integer_value(json_object_get(v, "ranks_sealed")), 0);
    cr_assert_eq(json_integer_value(json_object_get(v, "bytes_planned")), 20 * 10 * 4);
  }
  json_decref(st);
  h_signal(sh, 1);
  h_reap_ok(p0, "rank 0");
  h_reap_ok(p1, "rank 1");
  for (int r = 0; r < 2; r++) cr_assert_eq(sh->r[r].rc, 0, "rank %d: %s: %s", r, sh->r[r].step, sh->r[r].msg);
  check_f32_synth("il/a", "w", 20, 10, 8);
  check_f32_synth("il/b", "w", 20, 10, 7);
  h_verify_ok("il/a");
  h_verify_ok("il/b");
  h_shared_free(sh);
}

/* ------------------------------------------------------------------------ *
 * released: once it arrives the daemon never reads the arena again, so the
 * rank overwrites it for the next save (and scribbles over it afterwards).
 * ------------------------------------------------------------------------ */
static void reuse(int rank, void *arg) {
  h_shared *sh = arg;
  h_result *r = &sh->r[rank];
  shardd_client *c = NULL;
  shardd_arena *a;
  TRY(r, "connect", shardd_connect(H.sock, &c));
  const size_t size = 64 * 32 * 4;
  TRY(r, "arena", shardd_arena_create(c, size, &a));
  const char *ids[3] = {"reuse-1", "reuse-2", "reuse-3"}, *dirs[3] = {"reuse/1", "reuse/2", "reuse/3"};
  for (int k = 0; k < 3; k++) {
    shardd_save_opts o = {.save = ids[k], .dir = dirs[k], .rank = rank, .world_size = 2};
    TRY(r, "begin", shardd_begin(c, &o));
    TRY(r, "put", put_half(c, ids[k], a, 0, "w", 128, 32, rank, 200 + (uint64_t)k));
    TRY(r, "seal", shardd_seal(c, ids[k]));
    TRY(r, "released", shardd_wait_released(c, ids[k], H_WAIT_MS));
    /* The daemon is done with these bytes; clobber them before the commit is known. */
    memset(shardd_arena_data(a), 0xEE, size);
  }
  for (int k = 0; k < 3; k++) wait_into(r, c, ids[k], k);
  shardd_arena_destroy(a);
  shardd_close(c);
  r->done = 1;
}

Test(saves, released_event_then_arena_reuse) {
  h_shared *sh = h_shared_new();
  pid_t p0 = h_fork(reuse, 0, sh), p1 = h_fork(reuse, 1, sh);
  h_reap_ok(p0, "rank 0");
  h_reap_ok(p1, "rank 1");
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(sh->r[r].rc, 0, "rank %d: %s: %s", r, sh->r[r].step, sh->r[r].msg);
    cr_assert(sh->r[r].done && sh->r[r].waited == 3);
  }
  check_f32_synth("reuse/1", "w", 128, 32, 200);
  check_f32_synth("reuse/2", "w", 128, 32, 201);
  check_f32_synth("reuse/3", "w", 128, 32, 202);
  h_verify_ok("reuse/1");
  h_verify_ok("reuse/2");
  h_verify_ok("reuse/3");
  h_shared_free(sh);
}

/* ------------------------------------------------------------------------ *
 * Ranks that seal and leave at once still get their bytes committed
 * ------------------------------------------------------------------------ */
static void hold_rank0(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank != 0 || point != H_AT_PUTS) return;
  h_signal(s->sh, 1); /* begun and put, not sealed */
  if (h_await(s->sh, 0, 1)) h_result_fail(&s->sh->r[0], "sync", SHARDD_E_TIMEOUT, NULL);
}

Test(saves, ranks_exiting_right_after_seal_still_commit) {
  static const h_put puts[] = {
      {.rank = 0, .name = "w", .dtype = "BF16", .ndim = 2, .shape = {30, 40}, .boxed = 1, .start = {0, 0},
       .count = {10, 40}},
      {.rank = 1, .name = "w", .dtype = "BF16", .ndim = 2, .shape = {30, 40}, .boxed = 1, .start = {10, 0},
       .count = {10, 40}},
      {.rank = 2, .name = "w", .dtype = "BF16", .ndim = 2, .shape = {30, 40}, .boxed = 1, .start = {20, 0},
       .count = {10, 40}},
      {.rank = 1, .name = "only.rank1", .dtype = "U64", .ndim = 1, .shape = {100}},
      {.rank = 2, .name = "only.rank2", .dtype = "I8", .ndim = 2, .shape = {3, 1000}},
  };
  h_script s = {.opts = {.save = "leavers", .dir = "leavers", .world_size = 3}, .puts = puts, .nputs = 5,
                .seed = 31, .hook = hold_rank0};
  /* rank 1 detaches, unlinks and closes politely; rank 2 unlinks and vanishes */
  s.end[1] = H_END_DESTROY_EXIT;
  s.end[2] = H_END_UNLINK_EXIT;
  pid_t pids[3];
  h_start(&s, pids);
  h_reap_ok(pids[1], "rank 1");
  h_reap_ok(pids[2], "rank 2");
  for (int r = 1; r <= 2; r++) {
    cr_assert(s.sh->r[r].done && s.sh->r[r].rc == 0, "rank %d: %s: %s", r, s.sh->r[r].step, s.sh->r[r].msg);
    int fd = shm_open(s.sh->r[r].shm, O_RDONLY, 0);
    cr_assert(fd < 0 && errno == ENOENT, "rank %d's segment %s should be unlinked", r, s.sh->r[r].shm);
  }
  /* Both gone and unlinked, rank 0 not yet sealed: the daemon holds their mappings. */
  cr_assert_eq(h_await(s.sh, 1, 1), 0, "rank 0 did not get to its puts");
  json_t *st = status_json();
  json_t *v = status_save(st, "leavers");
  cr_assert_not_null(v);
  cr_assert_str_eq(json_string_value(json_object_get(v, "state")), "open");
  cr_assert_eq(json_integer_value(json_object_get(v, "ranks_begun")), 3);
  cr_assert_eq(json_integer_value(json_object_get(v, "ranks_sealed")), 2);
  cr_assert_eq(json_integer_value(json_object_get(st, "regions")), 3, "rank 0's arena plus the two kept");
  json_decref(st);

  h_signal(s.sh, 0);
  /* Any connection may wait for any save. */
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "leavers", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c));
  cr_assert_eq(res.tensors, 3);
  shardd_close(c);
  h_reap_ok(pids[0], "rank 0");
  h_expect_committed(&s);
  h_check_script(&s);
  /* Once the save is over the daemon lets go of the kept mappings. */
  st = status_json();
  cr_assert_eq(json_integer_value(json_object_get(st, "regions")), 0);
  json_decref(st);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * The arena destroyed (detached, unmapped, unlinked) before seal: puts
 * already made keep the daemon's own mapping alive
 * ------------------------------------------------------------------------ */
static void destroy_before_seal(int rank, void *arg) {
  h_shared *sh = arg;
  h_result *r = &sh->r[rank];
  shardd_client *c = NULL;
  shardd_arena *a;
  TRY(r, "connect", shardd_connect(H.sock, &c));
  TRY(r, "arena", shardd_arena_create(c, 40 * 16 * 4, &a));
  shardd_save_opts o = {.save = "gone", .dir = "gone", .rank = rank, .world_size = 2};
  TRY(r, "begin", shardd_begin(c, &o));
  TRY(r, "put", put_half(c, "gone", a, 0, "w", 80, 16, rank, 300));
  snprintf(r->shm, sizeof r->shm, "%s", shardd_arena_name(a));
  TRY(r, "destroy", shardd_arena_destroy(a));
  TRY(r, "seal", shardd_seal(c, "gone"));
  wait_into(r, c, "gone", 0);
  shardd_close(c);
  r->done = 1;
}

Test(saves, arena_destroyed_before_seal_still_commits) {
  h_shared *sh = h_shared_new();
  pid_t p0 = h_fork(destroy_before_seal, 0, sh), p1 = h_fork(destroy_before_seal, 1, sh);
  h_reap_ok(p0, "rank 0");
  h_reap_ok(p1, "rank 1");
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(sh->r[r].rc, 0, "rank %d: %s: %s", r, sh->r[r].step, sh->r[r].msg);
    cr_assert(sh->r[r].waited);
    int fd = shm_open(sh->r[r].shm, O_RDONLY, 0);
    cr_assert(fd < 0, "segment %s should be unlinked", sh->r[r].shm);
  }
  check_f32_synth("gone", "w", 80, 16, 300);
  h_verify_ok("gone");
  h_shared_free(sh);
}

/* ------------------------------------------------------------------------ *
 * Zero-copy: slices placed by shardd_place are written straight from the
 * ranks' segments; slices placed anywhere go through staging. Either way
 * every byte on disk is right, and status counts which way they went.
 * ------------------------------------------------------------------------ */
static json_int_t total_of(const char *key) {
  json_t *st = status_json();
  json_int_t v = json_integer_value(json_object_get(json_object_get(st, "totals"), key));
  json_decref(st);
  return v;
}

/* Whole tensors, dim-0 pieces, inner-dimension splits (b.w: fragments of
 * 1024 bytes, gathered; f.w: of 100 bytes, copied) and a tiny replica;
 * every rank names every tensor (an empty box where it holds none), as a
 * sharded state dict does. */
static const h_put placed_puts[] = {
    {.rank = 0, .name = "a.w", .dtype = "F32", .ndim = 2, .shape = {512, 1024}, .boxed = 1, .start = {0, 0},
     .count = {300, 1024}},
    {.rank = 1, .name = "a.w", .dtype = "F32", .ndim = 2, .shape = {512, 1024}, .boxed = 1, .start = {300, 0},
     .count = {212, 1024}},
    {.rank = 0, .name = "b.w", .dtype = "F32", .ndim = 2, .shape = {256, 512}, .boxed = 1, .start = {0, 0},
     .count = {256, 256}},
    {.rank = 1, .name = "b.w", .dtype = "F32", .ndim = 2, .shape = {256, 512}, .boxed = 1, .start = {0, 256},
     .count = {256, 256}},
    {.rank = -1, .name = "c.bias", .dtype = "BF16", .ndim = 1, .shape = {77}},
    {.rank = 0, .name = "d.emb", .dtype = "U8", .ndim = 1, .shape = {300001}},
    {.rank = 1, .name = "d.emb", .dtype = "U8", .ndim = 1, .shape = {300001}, .boxed = 1, .start = {0}, .count = {0}},
    {.rank = 1, .name = "e.w", .dtype = "F16", .ndim = 2, .shape = {1000, 333}},
    {.rank = 0, .name = "e.w", .dtype = "F16", .ndim = 2, .shape = {1000, 333}, .boxed = 1, .start = {0, 0},
     .count = {0, 333}},
    {.rank = 0, .name = "f.w", .dtype = "U8", .ndim = 2, .shape = {800, 200}, .boxed = 1, .start = {0, 0},
     .count = {800, 100}},
    {.rank = 1, .name = "f.w", .dtype = "U8", .ndim = 2, .shape = {800, 200}, .boxed = 1, .start = {0, 100},
     .count = {800, 100}},
};
/* header, c.bias, f.w, 4 heads+tails; b.w too where the device cannot gather */
#define PLACED_STAGED_MAX (4096 + 77 * 2 + 800 * 200 + 4 * 8192)
#define B_W (256 * 512 * 4)

Test(saves, placed_slices_are_written_zero_copy_and_others_staged) {
  json_int_t d0 = total_of("bytes_zero_copy"), c0 = total_of("bytes_copied"), w0 = total_of("bytes_written");
  json_int_t g0 = total_of("bytes_gathered");
  unsigned align = th_dio_align(H.root);
  h_script s = {.opts = {.save = "placed", .dir = "zc/placed", .world_size = 2}, .puts = placed_puts,
                .nputs = sizeof placed_puts / sizeof *placed_puts, .seed = 41, .place = 1};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  json_int_t direct = total_of("bytes_zero_copy") - d0, copied = total_of("bytes_copied") - c0;
  json_int_t written = total_of("bytes_written") - w0, gathered = total_of("bytes_gathered") - g0;
  printf("saves: placed: %lld bytes direct, %lld gathered, %lld copied of %lld (dio alignment %u)\n",
         (long long)direct, (long long)gathered, (long long)copied, (long long)written, align);
  cr_assert_eq(direct + gathered + copied, written, "%lld direct + %lld gathered + %lld copied, %lld written",
               (long long)direct, (long long)gathered, (long long)copied, (long long)written);
  if (align && align <= 1024) {
    /* b.w's 1024-byte row fragments, placed 512-aligned, go in gathered writes; f.w's 100-byte ones cannot */
    cr_assert_geq(gathered, B_W - 8192, "gathered %lld bytes: b.w's rows should be", (long long)gathered);
    cr_assert_leq(gathered, B_W + 8192, "gathered %lld bytes: only b.w's rows (and a neighbour's edge) should be",
                  (long long)gathered);
    cr_assert_leq(copied, PLACED_STAGED_MAX, "copied %lld bytes: only the header, c.bias, f.w and tails should be",
                  (long long)copied);
  } else {
    cr_assert_eq(gathered, 0, "the device tells no alignment to gather at");
    cr_assert_leq(copied, PLACED_STAGED_MAX + B_W, "copied %lld bytes", (long long)copied);
  }

  /* The same slices packed as an old client packs them: staged where they do not line up. */
  json_int_t d1 = total_of("bytes_zero_copy"), c1 = total_of("bytes_copied");
  h_script o = s;
  o.opts.save = "packed";
  o.opts.dir = "zc/packed";
  o.place = 0;
  o.sh = NULL;
  h_run(&o);
  h_expect_committed(&o);
  h_check_script(&o);
  direct = total_of("bytes_zero_copy") - d1;
  copied = total_of("bytes_copied") - c1;
  printf("saves: packed: %lld bytes direct, %lld copied\n", (long long)direct, (long long)copied);
  cr_assert_gt(copied, PLACED_STAGED_MAX + B_W, "packed anywhere, more goes through staging");
  h_shared_free(s.sh);
  h_shared_free(o.sh);
}

/* A slice at an odd offset (any old client may put one there): all of it is
 * copied through staging, and the file is right. */
Test(saves, a_slice_at_an_odd_offset_is_staged) {
  json_int_t d0 = total_of("bytes_zero_copy");
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_arena_create(c, (1 << 20) + 4096, &a), 0, "%s", shardd_last_error(c));
  uint64_t shape[1] = {1 << 20};
  uint8_t *want = h_synth_tensor("odd", 5, "U8", 1, shape, &(size_t){0});
  memcpy((uint8_t *)shardd_arena_data(a) + 7, want, 1 << 20);
  shardd_save_opts o = {.save = "odd", .dir = "zc/odd", .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  shardd_tensor_desc d = {.name = "odd", .dtype = "U8", .ndim = 1, .shape = shape, .index = -1};
  cr_assert_eq(shardd_put(c, "odd", &d, a, 7), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, "odd"), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "odd", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c));
  h_check_bytes("zc/odd", "odd", want, 1 << 20);
  h_verify_ok("zc/odd");
  cr_assert_eq(total_of("bytes_zero_copy") - d0, 0, "nothing lines up: nothing goes zero-copy");
  free(want);
  shardd_arena_destroy(a);
  shardd_close(c);
}
