/* Streamed saves: deferred puts, "declared" and "ready", so the daemon writes while ranks still copy. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host_facts.h"
#include "harness.h"

TestSuite(stream, .init = h_setup, .fini = h_teardown, .timeout = 110);

#define WHOLE(r, n, dt, d0, d1, hw) \
  {.rank = (r), .name = (n), .dtype = (dt), .ndim = 2, .shape = {(d0), (d1)}, .how = (hw)}
#define ROWS(r, n, dt, d0, d1, s0, c0, hw)                                                  \
  {.rank = (r), .name = (n), .dtype = (dt), .ndim = 2, .shape = {(d0), (d1)}, .boxed = 1, \
   .start = {(s0), 0}, .count = {(c0), (d1)}, .how = (hw)}
#define COLS(r, n, dt, d0, d1, s1, c1, hw)                                                  \
  {.rank = (r), .name = (n), .dtype = (dt), .ndim = 2, .shape = {(d0), (d1)}, .boxed = 1, \
   .start = {0, (s1)}, .count = {(d0), (c1)}, .how = (hw)}

/* ------------------------------------------------------------------------ *
 * The save as the status op shows it (child side: no asserts, -1 if absent)
 * ------------------------------------------------------------------------ */
static int64_t status_field(shardd_client *c, const char *save, const char *field, char *state, size_t n) {
  char *js = NULL;
  if (shardd_status(c, &js) != 0) return -1;
  json_t *j = json_loads(js, 0, NULL), *v;
  shardd_free(js);
  int64_t out = -1;
  size_t i;
  json_array_foreach(json_object_get(j, "saves"), i, v) {
    if (strcmp(json_string_value(json_object_get(v, "save")), save) != 0) continue;
    out = json_integer_value(json_object_get(v, field));
    if (state) snprintf(state, n, "%s", json_string_value(json_object_get(v, "state")));
  }
  json_decref(j);
  return out;
}

static void nap_ms(long ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }

/* ------------------------------------------------------------------------ *
 * Bytes on disk: TP row and column splits, DP replicas, odd sizes, tiny
 * tensors, several shard files, every put deferred
 * ------------------------------------------------------------------------ */
#define NTINY 300

static void tp_dp_script(h_put *puts, size_t *n, char (*names)[32], int how) {
  size_t k = 0;
  /* 4 ranks: tp = rank % 2, dp = rank / 2; each TP half put by both DP replicas. */
  for (int r = 0; r < 4; r++) {
    uint64_t tp = (uint64_t)(r % 2);
    puts[k++] = (h_put)ROWS(r, "embed.weight", "BF16", 1001, 37, tp * 500, tp ? 501 : 500, how);
    puts[k++] = (h_put)COLS(r, "o_proj.weight", "F32", 129, 67, tp * 33, tp ? 34 : 33, how);
    puts[k++] = (h_put)ROWS(r, "big.weight", "F32", 1536, 1024, tp * 768, 768, how); /* 3 MiB a half */
    puts[k++] = (h_put){.rank = r, .name = "norm.weight", .dtype = "F16", .ndim = 1, .shape = {4097}, .how = how};
    /* first in its file (largest element, first name): rows of 2048-byte fragments, gathered where the device allows */
    puts[k++] = (h_put)COLS(r, "a.wide.weight", "F64", 256, 512, tp * 256, 256, how);
  }
  /* Tiny tensors of varied dtypes, each from one rank, whole. */
  static const char *const dts[] = {"U8", "I16", "F32", "BF16", "F64", "I8"};
  for (int i = 0; i < NTINY; i++) {
    snprintf(names[i], sizeof names[i], "tiny.%d", i);
    puts[k++] = (h_put){.rank = i % 4, .name = names[i], .dtype = dts[i % 6], .ndim = 1,
                        .shape = {(uint64_t)(1 + i % 5)}, .how = how};
  }
  *n = k;
}

static void run_tp_dp(int no_ready) {
  static h_put puts[20 + NTINY];
  static char names[NTINY][32];
  size_t n;
  tp_dp_script(puts, &n, names, H_DEFERRED);
  h_script s = {.opts = {.save = "tpdp", .dir = "ck/tpdp", .world_size = 4, .max_shard_size = 2000000},
                .puts = puts, .nputs = n, .seed = 21, .no_ready = no_ready};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[0].res.tensors, 5 + NTINY);
  cr_assert_geq(s.sh->r[0].res.files, 3, "expected several shards and an index, got %llu files",
               (unsigned long long)s.sh->r[0].res.files);
  h_shared_free(s.sh);
}

Test(stream, tp_dp_odd_and_tiny_tensors_byte_exact) { run_tp_dp(0); }

Test(stream, seal_alone_makes_deferred_bytes_ready) { run_tp_dp(1); }

/* A daemon-wide total from status (the test's own connection). */
static int64_t total(const char *key) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  char *js = NULL;
  cr_assert_eq(shardd_status(c, &js), 0, "%s", shardd_last_error(c));
  json_t *j = json_loads(js, 0, NULL);
  int64_t v = json_integer_value(json_object_get(json_object_get(j, "totals"), key));
  json_decref(j);
  shardd_free(js);
  shardd_close(c);
  return v;
}

/* Streamed with the placement rule: big.weight (a file of its own) goes
 * zero-copy from the ranks' segments as its bytes become ready, and
 * a.wide.weight's rows in gathered writes once both halves are; the rest,
 * whose files each rank predicts only from its own tensors, may be staged.
 * Every byte is right either way. */
Test(stream, placed_slices_stream_zero_copy) {
  static h_put puts[20 + NTINY];
  static char names[NTINY][32];
  size_t n;
  tp_dp_script(puts, &n, names, H_DEFERRED);
  h_script s = {.opts = {.save = "tpdp", .dir = "ck/placed", .world_size = 4, .max_shard_size = 2000000},
                .puts = puts, .nputs = n, .seed = 22, .place = 1};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  int64_t direct = total("bytes_zero_copy"), copied = total("bytes_copied"), gathered = total("bytes_gathered");
  unsigned align = th_dio_align(H.root);
  printf("stream: placed: %lld bytes direct, %lld gathered, %lld copied (dio alignment %u)\n", (long long)direct,
         (long long)gathered, (long long)copied, align);
  cr_assert_geq(direct, 2 * (3 << 20) - 2 * 8192, "big.weight's halves go zero-copy: %lld bytes direct",
                (long long)direct);
  if (align && align <= 2048)
    cr_assert_geq(gathered, (1 << 20) - 8192, "a.wide.weight's rows go gathered: %lld bytes", (long long)gathered);
  else
    cr_assert_eq(gathered, 0);
  cr_assert_eq(direct + gathered + copied, total("bytes_written"));
  h_shared_free(s.sh);
}

/* One rank streams, the other puts the classic way; both orders of arrival work. */
Test(stream, mixed_with_classic_ranks) {
  static const h_put puts[] = {
      ROWS(0, "w", "F32", 300, 11, 0, 150, H_DEFERRED),
      ROWS(1, "w", "F32", 300, 11, 150, 150, H_COPY),
      WHOLE(0, "a", "BF16", 3, 5, H_DEFERRED),
      WHOLE(1, "b", "U8", 7, 9, H_ARENA),
      WHOLE(1, "c", "I32", 2, 2, H_INLINE),
  };
  static const h_file files[] = {{.rank = 0, .path = "config.json", .data = "{}\n", .len = 3}};
  h_script s = {.opts = {.save = "mixed", .dir = "mixed", .world_size = 2}, .puts = puts,
                .nputs = sizeof puts / sizeof puts[0], .files = files, .nfiles = 1, .seed = 22};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[0].res.files, 2, "shard + config.json");
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Writing starts before the last rank's bytes are ready, and publishing
 * waits for the last seal even when every byte is written
 * ------------------------------------------------------------------------ */
static void early_hook(const h_script *s, int rank, int point, shardd_client *c) {
  h_result *r = &s->sh->r[rank];
  if (rank != 1) return;
  if (point == H_AT_DECLARED) {
    /* Rank 0 owns every byte of the first shard and readies them: the
     * daemon writes them while this rank has not copied a byte. */
    int64_t w = 0;
    for (int i = 0; i < H_WAIT_MS / 10 && w <= 0; i++) {
      w = status_field(c, s->opts.save, "bytes_written", NULL, 0);
      if (w <= 0) nap_ms(10);
    }
    if (w <= 0) h_result_fail(r, "early-write", SHARDD_E_TIMEOUT, NULL);
  } else if (point == H_AT_PUTS) {
    /* Every byte is ready now, yet the save must not publish before this seal. */
    char state[32] = "";
    int64_t w = 0, p = 1;
    for (int i = 0; i < H_WAIT_MS / 10 && w < p; i++) {
      w = status_field(c, s->opts.save, "bytes_written", state, sizeof state);
      p = status_field(c, s->opts.save, "bytes_planned", NULL, 0);
      if (w < p) nap_ms(10);
    }
    char dir[PATH_MAX];
    if (w < p || w <= 0) h_result_fail(r, "all-written", SHARDD_E_TIMEOUT, NULL);
    else if (strcmp(state, "writing") != 0 || h_exists(h_path(dir, sizeof dir, s->opts.dir)))
      h_result_fail(r, "held", SHARDD_E_INTERNAL, NULL);
  }
}

Test(stream, writes_before_the_last_ready_and_publishes_after_the_last_seal) {
  static const h_put puts[] = {
      /* index order puts rank 0's tensors in shard 1 (max 1 MB), rank 1's after */
      {.rank = 0, .name = "first.a", .dtype = "F32", .ndim = 2, .shape = {512, 512}, .has_index = 1,
       .index = 0, .how = H_DEFERRED},
      {.rank = 0, .name = "first.b", .dtype = "U8", .ndim = 1, .shape = {4093}, .has_index = 1, .index = 1,
       .how = H_DEFERRED},
      {.rank = 1, .name = "second", .dtype = "F32", .ndim = 2, .shape = {512, 512}, .has_index = 1,
       .index = 2, .how = H_DEFERRED},
  };
  h_script s = {.opts = {.save = "early", .dir = "early", .world_size = 2, .max_shard_size = 1100000},
                .puts = puts, .nputs = 3, .seed = 23, .hook = early_hook};
  h_run(&s);
  cr_assert_eq(s.sh->r[1].rc, 0, "rank 1 %s: %s", s.sh->r[1].step, s.sh->r[1].msg);
  h_expect_committed(&s);
  h_check_script(&s);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Errors
 * ------------------------------------------------------------------------ */
/* Coverage is checked when the last rank declares: the save fails before
 * any byte is copied, and every rank hears it at its next call. */
Test(stream, gap_fails_the_save_at_declared) {
  static const h_put puts[] = {
      ROWS(0, "holey", "F32", 10, 4, 0, 4, H_DEFERRED),
      ROWS(1, "holey", "F32", 10, 4, 5, 5, H_DEFERRED),
  };
  h_script s = {.opts = {.save = "gap", .dir = "gap", .world_size = 2}, .puts = puts, .nputs = 2,
                .seed = 24, .wait_after_fail = 1};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "holey", NULL);
  h_expect_unpublished("gap");
  h_expect_serving();
  h_shared_free(s.sh);
}

static void misuse_hook(const h_script *s, int rank, int point, shardd_client *c) {
  if (point != H_AT_DECLARED || rank != 0) return;
  h_result *r = &s->sh->r[rank];
  uint64_t shape[1] = {4};
  shardd_tensor_desc d = {.name = "late", .dtype = "U8", .ndim = 1, .shape = shape, .index = -1};
  int rc1 = shardd_put_inline(c, s->opts.save, &d, "abcd", 4);
  char why[512];
  snprintf(why, sizeof why, "%.500s", shardd_last_error(c));
  int rc2 = shardd_file(c, s->opts.save, "late.json", "{}", 2);
  int rc3 = shardd_declared(c, s->opts.save);
  if (rc1 != SHARDD_E_BAD_STATE || !strstr(why, "declared") || rc2 != SHARDD_E_BAD_STATE ||
      rc3 != SHARDD_E_BAD_STATE) {
    snprintf(r->msg, sizeof r->msg, "put %d (%s), file %d, declared %d", rc1, why, rc2, rc3);
    r->rc = SHARDD_E_INTERNAL;
    snprintf(r->step, sizeof r->step, "misuse");
  }
}

/* After declared, a put, a file or a second declared is refused; the save carries on. */
Test(stream, nothing_added_after_declared) {
  static const h_put puts[] = {ROWS(0, "t", "I16", 6, 3, 0, 3, H_DEFERRED),
                               ROWS(1, "t", "I16", 6, 3, 3, 3, H_DEFERRED)};
  h_script s = {.opts = {.save = "misuse", .dir = "misuse", .world_size = 2}, .puts = puts, .nputs = 2,
                .seed = 25, .hook = misuse_hook};
  h_run(&s);
  cr_assert_eq(s.sh->r[0].rc, 0, "rank 0 %s: %s", s.sh->r[0].step, s.sh->r[0].msg);
  h_expect_committed(&s);
  h_check_script(&s);
  h_shared_free(s.sh);
}

/* A rank lost while the save is already writing fails it: nothing is published. */
static void die_hook(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank == 1 && point == H_AT_DECLARED) {
    h_await(s->sh, 0, 1); /* rank 0 has readied and sealed */
    s->sh->r[rank].done = 1;
    _exit(0);
  }
  if (rank == 0 && point == H_AT_SEAL) h_signal(s->sh, 0);
}

Test(stream, rank_lost_after_declared_fails_the_save) {
  static const h_put puts[] = {ROWS(0, "m", "F32", 256, 256, 0, 128, H_DEFERRED),
                               ROWS(1, "m", "F32", 256, 256, 128, 128, H_DEFERRED)};
  h_script s = {.opts = {.save = "lost", .dir = "lost", .world_size = 2}, .puts = puts, .nputs = 2,
                .seed = 26, .hook = die_hook};
  h_run(&s);
  cr_assert_eq(s.sh->r[0].wrc, SHARDD_E_CLIENT_LOST, "rank 0's wait: %d %s", s.sh->r[0].wrc, s.sh->r[0].wmsg);
  cr_assert(strstr(s.sh->r[0].wmsg, "rank 1"), "%s", s.sh->r[0].wmsg);
  h_expect_unpublished("lost");
  h_expect_serving();
  h_shared_free(s.sh);
}

/* The client library refuses a ready past its arena, and a deferred put
 * needs an arena, before anything is sent. */
Test(stream, client_checks) {
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  cr_assert_eq(shardd_arena_create(c, 4096, &a), 0, "%s", shardd_last_error(c));
  shardd_save_opts o = {.save = "cl", .dir = "cl", .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_ready(c, "cl", a, 4097), SHARDD_E_OUT_OF_RANGE);
  uint64_t shape[1] = {8};
  shardd_tensor_desc d = {.name = "x", .dtype = "U8", .ndim = 1, .shape = shape, .index = -1};
  cr_assert_eq(shardd_put_deferred(c, "cl", &d, NULL, 0), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_eq(shardd_put_deferred(c, "cl", &d, a, 4090), SHARDD_E_OUT_OF_RANGE);
  /* ready before anything is deferred, and a ready for nothing, are harmless */
  cr_assert_eq(shardd_ready(c, "cl", a, 0), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_put_deferred(c, "cl", &d, a, 16), 0, "%s", shardd_last_error(c));
  memcpy((char *)shardd_arena_data(a) + 16, "01234567", 8);
  cr_assert_eq(shardd_declared(c, "cl"), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_ready(c, "cl", a, 24), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, "cl"), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "cl", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c));
  h_check_bytes("cl", "x", "01234567", 8);
  shardd_arena_destroy(a);
  shardd_close(c);
}

/* A batch longer than one puts line commits whole; a refused slice is
 * reported with its index and message, the slices before it are kept and
 * no line is sent after its refusal came. */
Test(stream, put_many_batches_and_names_the_refused_slice) {
  enum { N = 5000, BAD = 3000 }; /* puts lines hold up to 2048 slices: BAD is in the second */
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  cr_assert_eq(shardd_arena_create(c, N * 8, &a), 0, "%s", shardd_last_error(c));
  shardd_save_opts o = {.save = "many", .dir = "many", .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  static char names[N][32];
  static shardd_tensor_desc d[N];
  static uint64_t offs[N];
  static const uint64_t shape[1] = {8};
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], i == BAD ? "__metadata__" : "t.%d", i);
    d[i] = (shardd_tensor_desc){.name = names[i], .dtype = "U8", .ndim = 1, .shape = shape, .index = -1};
    offs[i] = (uint64_t)i * 8;
    memset((char *)shardd_arena_data(a) + offs[i], i & 0xff, 8);
  }
  size_t at = 0;
  /* refused here: nothing is sent */
  offs[7] = N * 8;
  cr_assert_eq(shardd_put_many(c, "many", d, offs, N, a, 0, &at), SHARDD_E_OUT_OF_RANGE);
  cr_assert_eq(at, 7);
  offs[7] = 7 * 8;
  /* refused by the daemon: the slices before it are kept */
  cr_assert_eq(shardd_put_many(c, "many", d, offs, N, a, 0, &at), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_eq(at, BAD);
  cr_assert(strstr(shardd_last_error(c), "__metadata__"), "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, "many"), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "many", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c));
  /* every slice before BAD; of those after it, only the lines already sent */
  cr_assert(res.tensors >= BAD && res.tensors < N, "%llu tensors", (unsigned long long)res.tensors);
  uint8_t want[8];
  memset(want, (BAD - 1) & 0xff, 8);
  h_check_bytes("many", "t.2999", want, 8);
  shardd_arena_destroy(a);
  shardd_close(c);
}

/* Ready marks only its own region's puts, and only those wholly below
 * `upto`, whatever the order the calls come in: a put marked too early
 * would be written before its bytes are, and read back wrong here. */
Test(stream, ready_flags_only_its_region_below_upto) {
  enum { N = 256 * 1024 };
  shardd_client *c = NULL;
  shardd_arena *a1 = NULL, *a2 = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  cr_assert_eq(shardd_arena_create(c, 2 * N, &a1), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_arena_create(c, 2 * N, &a2), 0, "%s", shardd_last_error(c));
  shardd_save_opts o = {.save = "regions", .dir = "regions", .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  static const uint64_t shape[1] = {N};
  const char *names[4] = {"a1.lo", "a1.hi", "a2.lo", "a2.hi"};
  shardd_arena *in[4] = {a1, a1, a2, a2};
  for (int i = 0; i < 4; i++) {
    shardd_tensor_desc d = {.name = names[i], .dtype = "U8", .ndim = 1, .shape = shape, .index = i};
    cr_assert_eq(shardd_put_deferred(c, "regions", &d, in[i], (uint64_t)(i % 2) * N), 0, "%s", shardd_last_error(c));
  }
  cr_assert_eq(shardd_declared(c, "regions"), 0, "%s", shardd_last_error(c)); /* one rank: planned now */
  /* a2 whole, then a1's low half; a1's high half stays unready */
  memset(shardd_arena_data(a2), 'c', 2 * N);
  cr_assert_eq(shardd_ready(c, "regions", a2, 2 * N), 0, "%s", shardd_last_error(c));
  memset(shardd_arena_data(a1), 'a', N);
  cr_assert_eq(shardd_ready(c, "regions", a1, N + N / 2), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_ready(c, "regions", a1, 10), 0, "%s", shardd_last_error(c)); /* lower: no-op */
  /* give a wrong flag time to be written before a1.hi's bytes exist */
  char state[32] = "";
  for (int i = 0; i < 30; i++) {
    status_field(c, "regions", "bytes_written", state, sizeof state);
    nap_ms(10);
  }
  memset((char *)shardd_arena_data(a1) + N, 'b', N);
  cr_assert_eq(shardd_seal(c, "regions"), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "regions", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c));
  uint8_t *want = malloc(N);
  const char fill[4] = {'a', 'b', 'c', 'c'};
  for (int i = 0; i < 4; i++) {
    memset(want, fill[i], N);
    h_check_bytes("regions", names[i], want, N);
  }
  free(want);
  shardd_arena_destroy(a1);
  shardd_arena_destroy(a2);
  shardd_close(c);
}

/* ------------------------------------------------------------------------ *
 * Empty slices streamed: uneven splits leave ranks empty deferred puts
 * ------------------------------------------------------------------------ */
static void run_uneven(int no_ready) {
  static const h_put puts[] = {
      /* tensor_split of 3 over 4 ranks: rank 3 gets [3, 3) */
      {.rank = 0, .name = "router.bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {0},
       .count = {1}, .how = H_DEFERRED},
      {.rank = 1, .name = "router.bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {1},
       .count = {1}, .how = H_DEFERRED},
      {.rank = 2, .name = "router.bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {2},
       .count = {1}, .how = H_DEFERRED},
      {.rank = 3, .name = "router.bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {3},
       .count = {0}, .how = H_DEFERRED},
      /* Shard(0) of 2 experts over 4 ranks; 2 columns over 3 ranks */
      ROWS(0, "experts", "BF16", 2, 5, 0, 1, H_DEFERRED), ROWS(1, "experts", "BF16", 2, 5, 1, 1, H_DEFERRED),
      ROWS(2, "experts", "BF16", 2, 5, 2, 0, H_DEFERRED), ROWS(3, "experts", "BF16", 2, 5, 2, 0, H_DEFERRED),
      COLS(0, "cols", "F32", 6, 2, 0, 1, H_DEFERRED), COLS(1, "cols", "F32", 6, 2, 1, 1, H_DEFERRED),
      COLS(2, "cols", "F32", 6, 2, 2, 0, H_DEFERRED),
      /* several MiB over three ranks, so the writer stages chunk by chunk */
      ROWS(0, "big", "F32", 3000, 1024, 0, 1000, H_DEFERRED), ROWS(1, "big", "F32", 3000, 1024, 1000, 1000, H_DEFERRED),
      ROWS(2, "big", "F32", 3000, 1024, 2000, 1000, H_DEFERRED), ROWS(3, "big", "F32", 3000, 1024, 3000, 0, H_DEFERRED),
      /* a classic put of an empty slice beside the streamed ones */
      ROWS(3, "big", "F32", 3000, 1024, 0, 0, H_ARENA),
  };
  h_script s = {.opts = {.save = "uneven", .dir = "ck/uneven", .world_size = 4, .max_shard_size = 5000000},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 25, .no_ready = no_ready,
                .arena_if_bytes = 1};
  h_run(&s);
  for (int r = 0; r < 4; r++) cr_assert_eq(s.sh->r[r].rc, 0, "rank %d %s: %s", r, s.sh->r[r].step, s.sh->r[r].msg);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[3].shm[0], 0, "rank 3 holds nothing and needs no arena");
  h_shared_free(s.sh);
}

Test(stream, empty_deferred_puts_of_uneven_splits_byte_exact) { run_uneven(0); }

Test(stream, empty_deferred_puts_with_the_seal_alone) { run_uneven(1); }

/* Empty deferred puts leave nothing to wait for: once the rank with the
 * bytes has readied them, every byte is written although the rank that put
 * only empty slices (in one batch, without an arena) has not sealed. */
Test(stream, empty_deferred_puts_hold_no_write_back) {
  enum { N = 64 * 1024 };
  shardd_client *c0 = NULL, *c1 = NULL;
  shardd_arena *a = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c0), 0);
  cr_assert_eq(shardd_connect(H.sock, &c1), 0);
  cr_assert_eq(shardd_arena_create(c0, 2 * N, &a), 0, "%s", shardd_last_error(c0));
  shardd_save_opts o = {.save = "hold", .dir = "hold", .rank = 0, .world_size = 2};
  cr_assert_eq(shardd_begin(c0, &o), 0, "%s", shardd_last_error(c0));
  o.rank = 1;
  cr_assert_eq(shardd_begin(c1, &o), 0, "%s", shardd_last_error(c1));
  static const uint64_t shape[2] = {2, N};
  static const uint64_t st[4][2] = {{0, 0}, {1, 0}, {2, 0}, {0, N}}, ct[4][2] = {{1, N}, {1, N}, {0, N}, {2, 0}};
  shardd_tensor_desc d[4];
  for (int i = 0; i < 4; i++)
    d[i] = (shardd_tensor_desc){.name = "w", .dtype = "U8", .ndim = 2, .shape = shape, .start = st[i],
                                .count = ct[i], .index = -1};
  /* rank 0: both rows, and an empty box at the arena's very end */
  const uint64_t off0[3] = {0, N, 2 * N};
  const shardd_tensor_desc d0[3] = {d[0], d[1], d[2]};
  size_t at = 0;
  cr_assert_eq(shardd_put_many(c0, "hold", d0, off0, 3, a, 1, &at), 0, "%s", shardd_last_error(c0));
  /* rank 1: only empty boxes, no arena */
  const uint64_t off1[2] = {0, 0};
  const shardd_tensor_desc d1[2] = {d[2], d[3]};
  cr_assert_eq(shardd_put_many(c1, "hold", d1, off1, 2, NULL, 1, &at), 0, "%s", shardd_last_error(c1));
  cr_assert_eq(shardd_declared(c1, "hold"), 0, "%s", shardd_last_error(c1));
  cr_assert_eq(shardd_declared(c0, "hold"), 0, "%s", shardd_last_error(c0));
  memset(shardd_arena_data(a), 'x', N);
  memset((char *)shardd_arena_data(a) + N, 'y', N);
  cr_assert_eq(shardd_ready(c0, "hold", a, 2 * N), 0, "%s", shardd_last_error(c0));
  cr_assert_eq(shardd_seal(c0, "hold"), 0, "%s", shardd_last_error(c0));
  char state[32] = "";
  int64_t w = 0, p = 1;
  for (int i = 0; i < H_WAIT_MS / 10 && w < p; i++) {
    w = status_field(c0, "hold", "bytes_written", state, sizeof state);
    p = status_field(c0, "hold", "bytes_planned", NULL, 0);
    if (w < p) nap_ms(10);
  }
  cr_assert(w > 0 && w == p, "written %lld of %lld before the last seal", (long long)w, (long long)p);
  cr_assert_str_eq(state, "writing", "published before the last seal");
  cr_assert_eq(shardd_seal(c1, "hold"), 0, "%s", shardd_last_error(c1));
  shardd_result res;
  cr_assert_eq(shardd_wait(c1, "hold", H_WAIT_MS, &res), 0, "%s", shardd_last_error(c1));
  uint8_t *want = malloc(2 * N);
  memset(want, 'x', N);
  memset(want + N, 'y', N);
  h_check_bytes("hold", "w", want, 2 * N);
  free(want);
  shardd_arena_destroy(a);
  shardd_close(c0);
  shardd_close(c1);
}
