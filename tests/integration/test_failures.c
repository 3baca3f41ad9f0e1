/* Failed saves: lost ranks, overlap, gap, mismatch, conflict, abort; every rank learns it, nothing is published, the daemon serves on. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

TestSuite(failures, .init = h_setup, .fini = h_teardown, .timeout = 100);

#define ROWS(r, nm, dt, s0, s1, a0, c0)                                                                  \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), 0}, .count = {(c0), (s1)}}

/* A healthy tensor beside the faulty one in every save, so failures are
 * not about an empty save. */
#define GOOD(r) ROWS((r), "good.w", "F32", 4, 4, (uint64_t)(r) * 2, 2)

/* ------------------------------------------------------------------------ *
 * A rank killed before seal
 * ------------------------------------------------------------------------ */
Test(failures, rank_killed_before_seal_fails_the_save_with_client_lost) {
  static const h_put puts[] = {
      ROWS(0, "w", "F32", 6, 8, 0, 2), ROWS(1, "w", "F32", 6, 8, 2, 2), ROWS(2, "w", "F32", 6, 8, 4, 2),
  };
  h_script s = {.opts = {.save = "killed", .dir = "killed/step-1", .world_size = 3}, .puts = puts, .nputs = 3,
                .seed = 41, .wait_after_fail = 1};
  s.end[2] = H_END_KILL_BEFORE_SEAL;
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_CLIENT_LOST, "client_lost", "rank 2", "killed", (char *)NULL);
  h_expect_unpublished("killed/step-1");
  char p[PATH_MAX];
  cr_assert(!h_exists(h_path(p, sizeof p, "killed")), "no folder is made for a save that never started writing");
  h_expect_serving();
}

/* A rank in two saves dies having sealed one: that one still commits, the
 * other fails with client_lost. */
static void two_saves_then_die(int rank, void *arg) {
  h_shared *sh = arg;
  h_result *r = &sh->r[rank];
  shardd_client *c = NULL;
  int rc = shardd_connect(H.sock, &c);
  if (rc) {
    h_result_fail(r, "connect", rc, NULL);
    return;
  }
  const float v[2] = {(float)rank, (float)rank + 0.5f};
  uint64_t shape[1] = {4}, start[1] = {(uint64_t)rank * 2}, count[1] = {2};
  shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 1, .shape = shape, .start = start,
                          .count = count, .index = -1};
  const char *ids[2] = {"kept", "lost"};
  for (int k = 0; k < 2; k++) {
    shardd_save_opts o = {.save = ids[k], .dir = ids[k], .rank = rank, .world_size = 2};
    if ((rc = shardd_begin(c, &o)) || (rc = shardd_put_inline(c, ids[k], &d, v, sizeof v))) {
      h_result_fail(r, "begin/put", rc, c);
      return;
    }
  }
  if ((rc = shardd_seal(c, "kept"))) {
    h_result_fail(r, "seal", rc, c);
    return;
  }
  h_signal(sh, 0);
  if (rank == 1) {
    /* both ranks have begun both saves and sealed "kept" */
    if (h_await(sh, 0, 2)) h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
    raise(SIGKILL);
  }
  shardd_result res;
  r->wrc = shardd_wait(c, "kept", H_WAIT_MS, &res);
  snprintf(r->wmsg, sizeof r->wmsg, "%s", shardd_last_error(c));
  rc = shardd_wait(c, "lost", H_WAIT_MS, &res);
  r->rc = rc;
  snprintf(r->msg, sizeof r->msg, "%s", shardd_last_error(c));
  shardd_close(c);
  r->done = 1;
}

Test(failures, killed_rank_loses_only_its_unsealed_save) {
  h_shared *sh = h_shared_new();
  pid_t p0 = h_fork(two_saves_then_die, 0, sh), p1 = h_fork(two_saves_then_die, 1, sh);
  h_reap_ok(p0, "rank 0");
  int st = h_reap(p1);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  cr_assert(sh->r[0].done);
  cr_assert_eq(sh->r[0].wrc, 0, "the sealed save should commit: %s", sh->r[0].wmsg);
  cr_assert_eq(sh->r[0].rc, SHARDD_E_CLIENT_LOST, "the other save: %s", sh->r[0].msg);
  cr_assert(strstr(sh->r[0].msg, "rank 1 of save 'lost'"), "%s", sh->r[0].msg);
  const float want[4] = {0.0f, 0.5f, 1.0f, 1.5f};
  h_check_bytes("kept", "w", want, sizeof want);
  h_verify_ok("kept");
  h_expect_unpublished("lost");
  h_shared_free(sh);
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Coverage: overlap and gap
 * ------------------------------------------------------------------------ */
Test(failures, partial_overlap_fails_naming_the_tensor) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      ROWS(0, "w.overlap", "BF16", 6, 4, 0, 4), /* rows 0..3 */
      ROWS(1, "w.overlap", "BF16", 6, 4, 3, 3), /* rows 3..5: row 3 twice */
  };
  h_script s = {.opts = {.save = "ov", .dir = "ov", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 42};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_OVERLAP, "overlap: ", "'w.overlap'", "start=[0,0] count=[4,4]",
                  "start=[3,0] count=[3,4]", (char *)NULL);
  h_expect_unpublished("ov");
  h_expect_serving();
}

Test(failures, gap_fails_naming_the_tensor_and_element) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      ROWS(0, "w.gap", "I32", 6, 3, 0, 2), /* rows 0..1 */
      ROWS(1, "w.gap", "I32", 6, 3, 3, 3), /* rows 3..5: row 2 missing */
  };
  h_script s = {.opts = {.save = "gap", .dir = "gap", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 43};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "gap: ", "'w.gap'", "element [2,0]", (char *)NULL);
  h_expect_unpublished("gap");
  h_expect_serving();
}

Test(failures, tensor_missing_a_whole_rank_share_is_a_gap) {
  /* rank 1 forgets its half of an inner-dimension split */
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      {.rank = 0, .name = "w.half", .dtype = "F16", .ndim = 2, .shape = {3, 8}, .boxed = 1, .start = {0, 0},
       .count = {3, 4}},
  };
  h_script s = {.opts = {.save = "half", .dir = "half", .world_size = 2}, .puts = puts, .nputs = 3, .seed = 44};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "'w.half'", "element [0,4]", (char *)NULL);
  h_expect_unpublished("half");
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Mismatch: ranks disagree on a tensor's dtype or shape. Rank 1 puts after
 * rank 0, so its put is the one refused, and rank 0 learns it from wait.
 * ------------------------------------------------------------------------ */
static void rank1_after_rank0(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (point != H_AT_BEGIN) return;
  if (rank == 0) return;
  if (h_await(s->sh, 0, 1)) h_result_fail(&s->sh->r[rank], "sync", SHARDD_E_TIMEOUT, NULL);
}

static void rank0_signals(const h_script *s, int rank, int point, shardd_client *c) {
  if (rank == 0 && point == H_AT_PUTS) h_signal(s->sh, 0);
  rank1_after_rank0(s, rank, point, c);
}

Test(failures, dtype_mismatch_fails_the_save) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      ROWS(0, "w.dtype", "F32", 4, 4, 0, 2),
      ROWS(1, "w.dtype", "F16", 4, 4, 2, 2),
  };
  h_script s = {.opts = {.save = "mmd", .dir = "mmd", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 45,
                .hook = rank0_signals, .wait_after_fail = 1};
  h_run(&s);
  cr_assert_str_eq(s.sh->r[1].step, "put", "rank 1's put is refused at once");
  cr_assert_eq(s.sh->r[1].rc, SHARDD_E_MISMATCH, "%s", s.sh->r[1].msg);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "mismatch: ", "'w.dtype'", "F16", "F32", "rank 1", "rank 0",
                  (char *)NULL);
  h_expect_unpublished("mmd");
  h_expect_serving();
}

Test(failures, shape_mismatch_fails_the_save) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      ROWS(0, "w.shape", "F32", 4, 4, 0, 2),
      ROWS(1, "w.shape", "F32", 4, 5, 2, 2),
  };
  h_script s = {.opts = {.save = "mms", .dir = "mms", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 46,
                .hook = rank0_signals, .wait_after_fail = 1};
  h_run(&s);
  cr_assert_eq(s.sh->r[1].rc, SHARDD_E_MISMATCH, "%s", s.sh->r[1].msg);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "'w.shape'", "[4,5]", "[4,4]", (char *)NULL);
  h_expect_unpublished("mms");
  h_expect_serving();
}

Test(failures, rank_count_mismatch_in_ndim_fails_the_save) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      {.rank = 0, .name = "w.ndim", .dtype = "U8", .ndim = 1, .shape = {16}},
      {.rank = 1, .name = "w.ndim", .dtype = "U8", .ndim = 2, .shape = {4, 4}},
  };
  h_script s = {.opts = {.save = "mmn", .dir = "mmn", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 47,
                .hook = rank0_signals, .wait_after_fail = 1};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "'w.ndim'", (char *)NULL);
  h_expect_unpublished("mmn");
  h_expect_serving();
}

Test(failures, index_mismatch_fails_the_save) {
  static const h_put puts[] = {
      GOOD(0), GOOD(1),
      {.rank = 0, .name = "w.idx", .dtype = "F32", .ndim = 1, .shape = {4}, .has_index = 1, .index = 3},
      {.rank = 1, .name = "w.idx", .dtype = "F32", .ndim = 1, .shape = {4}, .has_index = 1, .index = 4},
  };
  h_script s = {.opts = {.save = "mmi", .dir = "mmi", .world_size = 2}, .puts = puts, .nputs = 4, .seed = 54,
                .hook = rank0_signals, .wait_after_fail = 1};
  h_run(&s);
  cr_assert_eq(s.sh->r[1].rc, SHARDD_E_MISMATCH, "%s", s.sh->r[1].msg);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "'w.idx'", "index", (char *)NULL);
  h_expect_unpublished("mmi");
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Conflict: ranks disagree in begin, or send different bytes for a file
 * ------------------------------------------------------------------------ */
static void rank1_disagrees(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank == 0 && point == H_AT_BEGIN) h_signal(s->sh, 0);
}

/* rank 1 begins only after rank 0 did, with its own (different) options */
static void conflict_rank(int rank, void *arg) {
  h_script *s = arg;
  if (rank == 1 && h_await(s->sh, 0, 1)) {
    h_result_fail(&s->sh->r[1], "sync", SHARDD_E_TIMEOUT, NULL);
    return;
  }
  h_script mine = *s;
  if (rank == 1) mine.opts = *(const shardd_save_opts *)s->ud;
  h_rank_main(rank, &mine);
}

static void run_conflict(h_script *s, const shardd_save_opts *rank1) {
  s->ud = (void *)rank1;
  s->hook = rank1_disagrees;
  s->wait_after_fail = 1;
  s->sh = h_shared_new();
  pid_t p0 = h_fork(conflict_rank, 0, s), p1 = h_fork(conflict_rank, 1, s);
  h_reap_ok(p0, "rank 0");
  h_reap_ok(p1, "rank 1");
  cr_assert_str_eq(s->sh->r[1].step, "begin", "rank 1's begin is refused");
  cr_assert_eq(s->sh->r[1].rc, SHARDD_E_CONFLICT, "%s", s->sh->r[1].msg);
}

static const h_put conflict_puts[] = {GOOD(0), GOOD(1)};

Test(failures, begin_disagreement_on_max_shard_size_is_a_conflict) {
  h_script s = {.opts = {.save = "cf1", .dir = "cf1", .world_size = 2, .max_shard_size = 1000},
                .puts = conflict_puts, .nputs = 2, .seed = 48};
  shardd_save_opts other = s.opts;
  other.max_shard_size = 2000;
  run_conflict(&s, &other);
  h_expect_failed(&s, SHARDD_E_CONFLICT, "conflict: ", "'cf1'", "max_shard_size", "2000", "1000", (char *)NULL);
  h_expect_unpublished("cf1");
  h_shared_free(s.sh);
  h_expect_serving();
}

Test(failures, begin_disagreement_on_dir_metadata_world_size_prefix_overwrite_total_parameters) {
  static const char *const md0[] = {"step", "1"};
  static const char *const md1[] = {"step", "2"};
  struct {
    const char *what;
    shardd_save_opts o;
  } cases[] = {
      {"dir", {.dir = "elsewhere"}},
      {"metadata", {.metadata = md1, .nmetadata = 1}},
      {"world_size", {.world_size = 3}},
      {"prefix", {.prefix = "other"}},
      {"overwrite", {.overwrite = 1}},
      {"total_parameters", {.total_parameters = 5}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char save[32], dir[32];
    snprintf(save, sizeof save, "cf-%s", cases[i].what);
    snprintf(dir, sizeof dir, "cf/%s", cases[i].what);
    h_script s = {.opts = {.save = save, .dir = dir, .world_size = 2, .metadata = md0, .nmetadata = 1},
                  .puts = conflict_puts, .nputs = 2, .seed = 49};
    shardd_save_opts other = s.opts;
    if (cases[i].o.dir) other.dir = cases[i].o.dir;
    if (cases[i].o.metadata) other.metadata = cases[i].o.metadata;
    if (cases[i].o.world_size) other.world_size = cases[i].o.world_size;
    if (cases[i].o.prefix) other.prefix = cases[i].o.prefix;
    if (cases[i].o.overwrite) other.overwrite = 1;
    if (cases[i].o.total_parameters) other.total_parameters = cases[i].o.total_parameters;
    run_conflict(&s, &other);
    h_expect_failed(&s, SHARDD_E_CONFLICT, save, cases[i].what, (char *)NULL);
    h_expect_unpublished(dir);
    char p[PATH_MAX];
    cr_assert(!h_exists(h_path(p, sizeof p, "elsewhere")));
    h_shared_free(s.sh);
  }
  h_expect_serving();
}

Test(failures, different_bytes_for_one_file_is_a_conflict) {
  const h_file files[] = {
      {.rank = 0, .path = "config.json", .data = "{\"a\":1}", .len = 7},
      {.rank = 1, .path = "config.json", .data = "{\"a\":2}", .len = 7},
  };
  h_script s = {.opts = {.save = "cff", .dir = "cff", .world_size = 2}, .puts = conflict_puts, .nputs = 2,
                .files = files, .nfiles = 2, .seed = 50, .hook = rank0_signals, .wait_after_fail = 1};
  h_run(&s);
  cr_assert_eq(s.sh->r[1].rc, SHARDD_E_CONFLICT, "rank 1's file is refused: %s", s.sh->r[1].msg);
  cr_assert_str_eq(s.sh->r[1].step, "file");
  h_expect_failed(&s, SHARDD_E_CONFLICT, "'config.json'", (char *)NULL);
  h_expect_unpublished("cff");
  h_expect_serving();
}

/* Rank 0 sends its file only once every rank has begun: otherwise its
 * disconnect could end the save before rank 1 begins a fresh one. */
static void all_begun_hook(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank == 0 && point == H_AT_BEGIN && h_await(s->sh, H_SYNC_BEGUN, s->opts.world_size))
    h_result_fail(&s->sh->r[rank], "sync", SHARDD_E_TIMEOUT, NULL);
}

/* Refused at the request now (test_hostile.c has every reserved name): the
 * rank that sent it gives up, and its disconnect fails the save for the other. */
Test(failures, file_named_like_a_shard_is_refused_at_the_request) {
  const h_file files[] = {{.rank = 0, .path = "model.safetensors", .data = "x", .len = 1}};
  h_script s = {.opts = {.save = "clash", .dir = "clash", .world_size = 2}, .puts = conflict_puts, .nputs = 2,
                .files = files, .nfiles = 1, .seed = 51, .hook = all_begun_hook};
  h_run(&s);
  const h_result *r0 = &s.sh->r[0], *r1 = &s.sh->r[1];
  cr_assert_eq(r0->rc, SHARDD_E_INVALID_ARGUMENT, "rank 0: %s %s", r0->step, r0->msg);
  cr_assert_str_eq(r0->step, "file");
  cr_assert(strstr(r0->msg, "'model.safetensors'"), "the message does not name the file: %s", r0->msg);
  int got1 = r1->waited ? r1->wrc : r1->rc;
  cr_assert_eq(got1, SHARDD_E_CLIENT_LOST, "rank 1: %s", r1->waited ? r1->wmsg : r1->msg);
  h_expect_unpublished("clash");
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * abort: every rank gets `aborted`, whether it had sealed and waits, or
 * seals afterwards; each also gets `released`.
 * ------------------------------------------------------------------------ */
static void abort_hook(const h_script *s, int rank, int point, shardd_client *c) {
  h_result *r = &s->sh->r[rank];
  if (rank == 0 && point == H_AT_SEAL) {
    h_signal(s->sh, 0); /* rank 0 sealed and is about to wait */
    return;
  }
  if (rank == 0 || point != H_AT_PUTS) return;
  h_signal(s->sh, 0);
  if (h_await(s->sh, 1, 1)) {
    h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
    return;
  }
  /* The save ended: the daemon lets go of this rank's memory. */
  int rc = shardd_wait_released(c, s->opts.save, H_WAIT_MS);
  if (rc) h_result_fail(r, "released", rc, c);
}

Test(failures, abort_reaches_every_rank) {
  static const h_put puts[] = {
      ROWS(0, "w", "F32", 6, 8, 0, 2), ROWS(1, "w", "F32", 6, 8, 2, 2), ROWS(2, "w", "F32", 6, 8, 4, 2),
  };
  h_script s = {.opts = {.save = "doomed", .dir = "doomed", .world_size = 3}, .puts = puts, .nputs = 3,
                .seed = 52, .hook = abort_hook, .wait_after_fail = 1};
  s.sh = h_shared_new();
  pid_t pids[3];
  h_start(&s, pids);
  cr_assert_eq(h_await(s.sh, 0, 3), 0, "ranks did not get ready");
  char out[4096];
  int st = h_shardctl(out, sizeof out, "abort", "doomed", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shardctl abort failed: %s", out);
  h_signal(s.sh, 1);
  h_reap_all(&s, pids);
  h_expect_failed(&s, SHARDD_E_ABORTED, "aborted: ", "'doomed'", (char *)NULL);
  for (int r = 1; r < 3; r++) {
    cr_assert_str_eq(s.sh->r[r].step, "seal", "rank %d: seal after the abort fails (%s)", r, s.sh->r[r].msg);
    cr_assert_eq(s.sh->r[r].rc, SHARDD_E_ABORTED, "rank %d: %s", r, s.sh->r[r].msg);
  }
  h_expect_unpublished("doomed");
  /* Aborting again is a no-op; an unknown save is no_such_save. */
  st = h_shardctl(out, sizeof out, "abort", "doomed", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "second abort: %s", out);
  st = h_shardctl(out, sizeof out, "abort", "never-was", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "abort of an unknown save succeeded");
  cr_assert(strstr(out, "no_such_save"), "%s", out);
  h_shared_free(s.sh);
  h_expect_serving();
}

/* rank 1 aborts once rank 0 has sealed, then still tries to seal */
static void rank1_aborts(const h_script *s, int rank, int point, shardd_client *c) {
  h_result *r = &s->sh->r[rank];
  if (rank == 0 && point == H_AT_SEAL) h_signal(s->sh, 0);
  if (rank != 1 || point != H_AT_PUTS) return;
  if (h_await(s->sh, 0, 1)) {
    h_result_fail(r, "sync", SHARDD_E_TIMEOUT, NULL);
    return;
  }
  int rc = shardd_abort(c, s->opts.save);
  if (rc) h_result_fail(r, "abort", rc, c);
}

Test(failures, abort_by_a_rank_reaches_the_others) {
  static const h_put puts[] = {ROWS(0, "w", "F32", 4, 2, 0, 2), ROWS(1, "w", "F32", 4, 2, 2, 2)};
  h_script s = {.opts = {.save = "self", .dir = "self", .world_size = 2}, .puts = puts, .nputs = 2, .seed = 53,
                .hook = rank1_aborts, .wait_after_fail = 1};
  h_run(&s);
  cr_assert_str_eq(s.sh->r[1].step, "seal", "rank 1 aborted, then its seal fails: %s", s.sh->r[1].msg);
  h_expect_failed(&s, SHARDD_E_ABORTED, "save 'self' (dir 'self') aborted by rank 1", (char *)NULL);
  h_expect_unpublished("self");
  /* A late wait from another connection learns the same; aborting again is a no-op. */
  shardd_client *c;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "self", H_WAIT_MS, &res), SHARDD_E_ABORTED, "%s", shardd_last_error(c));
  cr_assert(strstr(shardd_last_error(c), "aborted by rank 1"), "%s", shardd_last_error(c));
  cr_assert_eq(shardd_abort(c, "self"), 0, "%s", shardd_last_error(c));
  h_shared_free(s.sh);
  h_expect_serving();
  /* A committed save cannot be aborted. */
  cr_assert_eq(shardd_abort(c, "serving-1"), SHARDD_E_BAD_STATE, "%s", shardd_last_error(c));
  shardd_close(c);
}

/* ------------------------------------------------------------------------ *
 * abort right after the last seal: whether it lands while the files are
 * being written or after the commit, the outcome is whole
 * ------------------------------------------------------------------------ */
static void abort_after_seal(const h_script *s, int rank, int point, shardd_client *c) {
  if (rank != 0 || point != H_AT_SEAL) return;
  /* rank 0 seals last (rank 1 sealed before rank 0 put anything) */
  int rc = shardd_abort(c, s->opts.save);
  s->sh->counters[2] = rc == 0 ? 1 : rc;
}

static void rank1_first(const h_script *s, int rank, int point, shardd_client *c) {
  if (rank == 1 && point == H_AT_SEAL) h_signal(s->sh, 0);
  if (rank == 0 && point == H_AT_BEGIN && h_await(s->sh, 0, 1))
    h_result_fail(&s->sh->r[0], "sync", SHARDD_E_TIMEOUT, NULL);
  abort_after_seal(s, rank, point, c);
}

Test(failures, abort_racing_the_write_leaves_a_whole_outcome) {
  /* 16 MiB, so the write is likely still running when the abort lands */
  static const h_put puts[] = {
      ROWS(0, "big", "F32", 2048, 1024, 0, 1024), ROWS(1, "big", "F32", 2048, 1024, 1024, 1024),
      {.rank = 0, .name = "small", .dtype = "U8", .ndim = 1, .shape = {100}},
  };
  h_script s = {.opts = {.save = "race", .dir = "race", .world_size = 2, .max_shard_size = 4 << 20},
                .puts = puts, .nputs = 3, .seed = 55, .hook = rank1_first, .wait_after_fail = 1};
  h_run(&s);
  int abort_rc = s.sh->counters[2];
  if (abort_rc == 1) {
    h_expect_failed(&s, SHARDD_E_ABORTED, "aborted by rank 0", (char *)NULL);
    h_expect_unpublished("race");
  } else {
    /* too late: it had committed */
    cr_assert_eq(abort_rc, SHARDD_E_BAD_STATE, "abort: %s", shardd_err_name(abort_rc));
    h_expect_committed(&s);
    h_check_script(&s);
  }
  cr_assert_eq(h_tmp_count(), 0);
  h_shared_free(s.sh);
  h_expect_serving();
}
