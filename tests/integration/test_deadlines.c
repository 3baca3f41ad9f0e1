/* No save waits forever: join and idle deadlines, late begins, a client wait that gives up; one node and three. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "peer_util.h"

/* One suite (criterion leaks when two run side by side); each test says which daemons it starts.
 * The timeout bounds only a hung test. */
TestSuite(deadlines, .timeout = 120);
#define ONE_NODE .init = h_setup, .fini = h_teardown

static const h_put one_put[] = {
    {.rank = -1, .name = "w", .dtype = "F32", .ndim = 1, .shape = {64}, .how = H_ARENA},
};

/* Rank r's two rows of a [2 * world, 16] tensor. */
#define ROWS(r) {.rank = (r), .name = "t", .dtype = "F32", .ndim = 2, .shape = {0, 16}, .boxed = 1, \
                 .start = {2 * (r), 0}, .count = {2, 16}, .how = H_ARENA}

static int save_count(void) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  char *js = NULL;
  cr_assert_eq(shardd_status(c, &js), 0, "%s", shardd_last_error(c));
  json_t *st = json_loads(js, 0, NULL);
  int n = (int)json_array_size(json_object_get(st, "saves"));
  json_decref(st);
  shardd_free(js);
  shardd_close(c);
  return n;
}

static void expect_rank(const h_script *s, int r, int code, const char *needle) {
  const h_result *x = &s->sh->r[r];
  int got = x->waited ? x->wrc : x->rc;
  const char *msg = x->waited ? x->wmsg : x->msg;
  cr_assert_eq(got, code, "rank %d: expected %s, got %s (%s): %s", r, shardd_err_name(code), shardd_err_name(got),
               x->step, msg);
  cr_assert(strstr(msg, needle), "rank %d: '%s' does not name '%s'", r, msg, needle);
}

/* Rank 0 of a save of two, alone: it puts, seals and waits; rank 1 never comes.
 * Returns the seconds from rank 0's begin to its wait's answer. */
static double lone_rank(h_script *s, const char *id, const char *dir) {
  *s = (h_script){.opts = {.save = id, .dir = dir, .world_size = 2, .join_timeout = 2}, .puts = one_put, .nputs = 1,
                  .seed = 3, .wait_after_fail = 1};
  s->sh = h_shared_new();
  double t0 = now_s();
  pid_t p = h_fork(h_rank_main, 0, s);
  h_reap_ok(p, "rank 0");
  double secs = now_s() - t0;
  expect_rank(s, 0, SHARDD_E_TIMEOUT, "rank 1 of 2 never began within join_timeout 2 s");
  /* The id may be one the library derived from the dir: the message names the dir too. */
  char named[300];
  snprintf(named, sizeof named, "save '%s' (dir '%s'): rank 1 of 2 never began", id, dir);
  expect_rank(s, 0, SHARDD_E_TIMEOUT, named);
  h_expect_unpublished(dir);
  cr_assert_eq(save_count(), 0, "the failed save is still in flight");
  return secs;
}

Test(deadlines, a_lone_rank_fails_with_timeout_naming_the_missing_rank, ONE_NODE) {
  h_script s;
  double secs = lone_rank(&s, "lone", "lone/1");
  printf("deadlines: join_timeout 2 s, lone rank 0 heard timeout %.2f s after it began\n", secs);
  fflush(stdout);
  h_shared_free(s.sh);
}

/* The late rank 1 arrives after the save gave up: it learns why, and starts nothing. */
Test(deadlines, a_late_begin_after_a_failure_gets_save_failed_with_the_cause, ONE_NODE) {
  h_script s;
  lone_rank(&s, "late", "late/1");
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  shardd_save_opts o = {.save = "late", .dir = "late/1", .rank = 1, .world_size = 2};
  int rc = shardd_begin(c, &o);
  cr_assert_eq(rc, SHARDD_E_SAVE_FAILED, "late begin: %s: %s", shardd_err_name(rc), shardd_last_error(c));
  cr_assert(strstr(shardd_last_error(c), "timeout") && strstr(shardd_last_error(c), "rank 1 of 2 never began") &&
                strstr(shardd_last_error(c), "save 'late' (dir 'late/1') failed"),
            "the original cause, or the save's dir, is not named: %s", shardd_last_error(c));
  cr_assert_eq(save_count(), 0, "the late begin started a save");
  /* Rank 0 had begun the failed attempt: it is retrying, and a new save starts. */
  o.rank = 0;
  o.world_size = 1;
  cr_assert_eq(shardd_begin(c, &o), 0, "a retry is refused: %s", shardd_last_error(c));
  cr_assert_eq(save_count(), 1);
  cr_assert_eq(shardd_abort(c, "late"), 0);
  shardd_close(c);
  h_expect_unpublished("late/1");
  h_shared_free(s.sh);
}

/* A save that committed answers a repeated begin of its id with exists, whatever its dir, unless it overwrites. */
Test(deadlines, a_begin_for_a_just_committed_id_gets_exists, ONE_NODE) {
  h_script s = {.opts = {.save = "done", .dir = "done/1", .world_size = 1}, .puts = one_put, .nputs = 1, .seed = 5};
  h_run(&s);
  h_expect_committed(&s);
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  shardd_save_opts o = {.save = "done", .dir = "done/2", .world_size = 1};
  int rc = shardd_begin(c, &o);
  cr_assert_eq(rc, SHARDD_E_EXISTS, "repeated begin: %s: %s", shardd_err_name(rc), shardd_last_error(c));
  cr_assert(strstr(shardd_last_error(c), "save 'done' (dir 'done/2') has just committed to"), "%s", shardd_last_error(c));
  cr_assert_eq(save_count(), 0);
  /* Asking to overwrite is a new save (the same id to the same dir every step). */
  o.overwrite = 1;
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  cr_assert_eq(save_count(), 1);
  cr_assert_eq(shardd_abort(c, "done"), 0);
  shardd_close(c);
  h_expect_unpublished("done/2");
  h_check_script(&s);
  h_shared_free(s.sh);
}

/* Rank 1 begins, then says nothing; rank 0 seals and waits. */
enum { C_GO = 0 };
static void rank1_silent(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank == 1 && point == H_AT_BEGIN) h_await(s->sh, C_GO, 1);
}

Test(deadlines, silent_ranks_past_idle_timeout_fail_the_save_naming_them, ONE_NODE) {
  static const h_put puts[] = {ROWS(0), ROWS(1)};
  h_put p[2];
  memcpy(p, puts, sizeof p);
  p[0].shape[0] = p[1].shape[0] = 4;
  h_script s = {.opts = {.save = "idle", .dir = "idle/1", .world_size = 2, .idle_timeout = 2}, .puts = p, .nputs = 2,
                .seed = 9, .hook = rank1_silent, .wait_after_fail = 1};
  s.sh = h_shared_new();
  pid_t pids[2];
  double t0 = now_s();
  pids[0] = h_fork(h_rank_main, 0, &s);
  /* Rank 1 begins once rank 0 has sealed: the idle clock then runs from rank 1's begin alone, not
   * from whichever of rank 0's calls a busy machine held back for seconds. */
  h_await_sealed("idle", 1);
  pids[1] = h_fork(h_rank_main, 1, &s);
  h_reap_ok(pids[0], "rank 0");
  double secs = now_s() - t0;
  expect_rank(&s, 0, SHARDD_E_TIMEOUT, "save 'idle' (dir 'idle/1'): rank 1 of 2 sent nothing");
  cr_assert(strstr(s.sh->r[0].wmsg, "idle_timeout 2 s") && strstr(s.sh->r[0].wmsg, "rank 0 sealed"), "%s",
            s.sh->r[0].wmsg);
  h_signal(s.sh, C_GO); /* the silent rank wakes to a save that is over */
  h_reap_ok(pids[1], "rank 1");
  expect_rank(&s, 1, SHARDD_E_TIMEOUT, "save 'idle' (dir 'idle/1'): rank 1 of 2 sent nothing");
  h_expect_unpublished("idle/1");
  cr_assert_eq(save_count(), 0);
  printf("deadlines: idle_timeout 2 s, sealed rank 0 heard timeout %.2f s after the ranks started\n", secs);
  fflush(stdout);
  h_shared_free(s.sh);
}

/* The client stops waiting: the save does not stay open in the daemon. */
Test(deadlines, a_client_wait_that_times_out_aborts_the_save, ONE_NODE) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  shardd_save_opts o = {.save = "gaveup", .dir = "gaveup/1", .world_size = 2};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  uint64_t shape[1] = {4};
  float v[4] = {1, 2, 3, 4};
  shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 1, .shape = shape, .index = -1};
  cr_assert_eq(shardd_put_inline(c, "gaveup", &d, v, sizeof v), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, "gaveup"), 0, "%s", shardd_last_error(c));
  /* A plain wait that times out polls: the save goes on. */
  cr_assert_eq(shardd_wait(c, "gaveup", 100, NULL), SHARDD_E_TIMEOUT);
  cr_assert_eq(save_count(), 1);
  double t0 = now_s();
  int rc = shardd_wait_or_abort(c, "gaveup", 1000, NULL);
  double secs = now_s() - t0;
  cr_assert_eq(rc, SHARDD_E_TIMEOUT, "%s: %s", shardd_err_name(rc), shardd_last_error(c));
  cr_assert(strstr(shardd_last_error(c), "aborted it"), "%s", shardd_last_error(c));
  cr_assert_eq(save_count(), 0, "the save is still open after the client gave up");
  /* The other ranks learn it was aborted. */
  shardd_client *c1 = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c1), 0);
  cr_assert_eq(shardd_wait(c1, "gaveup", H_WAIT_MS, NULL), SHARDD_E_ABORTED, "%s", shardd_last_error(c1));
  shardd_close(c1);
  shardd_close(c);
  h_expect_unpublished("gaveup/1");
  printf("deadlines: wait_or_abort(1000 ms) returned after %.2f s with the save ended\n", secs);
  fflush(stdout);
}

/* ------------------------------------------------------------------------ *
 * Three daemons on loopback sharing a root, two ranks each.
 * ------------------------------------------------------------------------ */
#define NODES 3
#define PER_NODE 2
static char token_path[PATH_MAX];

static void peers_setup(void) {
  pu_scratch("deadlines");
  snprintf(token_path, sizeof token_path, "%s/token", H.base);
  write_token(token_path, "the-cluster-secret-0123456789abcdef\n");
  for (int i = 0; i < NODES; i++) start_node(i, token_path);
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  snprintf(H.log, sizeof H.log, "%s", N[0].d.log);
  for (int r = 0; r < H_MAX_RANKS; r++) rank_node[r] = r / PER_NODE;
}

#define THREE_NODES .init = peers_setup, .fini = pu_teardown

/* Ranks 0 .. present-1 run the save (the others never come); asserts each gets timeout naming `needle`,
 * prints when each heard, and that nothing is published and no node holds the save. */
static void run_missing(const char *id, int present, const char *needle) {
  h_put p[NODES * PER_NODE];
  for (int r = 0; r < NODES * PER_NODE; r++) {
    p[r] = (h_put)ROWS(r);
    p[r].shape[0] = 2 * NODES * PER_NODE;
  }
  char dir[64];
  snprintf(dir, sizeof dir, "ck/%s", id);
  h_script s = {.opts = {.save = id, .dir = dir, .world_size = NODES * PER_NODE, .nnodes = NODES,
                         .leader = N[0].addr, .join_timeout = 3},
                .puts = p, .nputs = NODES * PER_NODE, .seed = 11, .wait_after_fail = 1,
                .begin_together = present};
  s.sh = h_shared_new();
  pid_t pids[H_MAX_RANKS];
  double t0 = now_s(), ended[H_MAX_RANKS];
  for (int r = 0; r < present; r++) pids[r] = h_fork(peer_rank, r, &s);
  for (int r = 0; r < present; r++) {
    int st = h_reap(pids[r]);
    ended[r] = now_s() - t0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
  char line[512];
  size_t k = (size_t)snprintf(line, sizeof line, "deadlines: 3 nodes, %d of 6 ranks, join_timeout 3 s; ranks ended at",
                              present);
  for (int r = 0; r < present; r++) {
    expect_rank(&s, r, SHARDD_E_TIMEOUT, needle);
    k += (size_t)snprintf(line + k, sizeof line - k, " r%d %.2f s", r, ended[r]);
  }
  printf("%s (from the ranks' start)\n", line);
  fflush(stdout);
  h_await_no_tmp();
  h_expect_unpublished(dir);
  for (int i = 0; i < NODES; i++) {
    json_t *st = node_status(i);
    cr_assert_eq(json_array_size(json_object_get(st, "saves")), 0, "node %d still holds the save", i);
    json_decref(st);
  }
  cr_assert(log_has(0, needle), "the leader did not log the cause");
  h_shared_free(s.sh);
}

/* Node 2's trainer never comes; its daemon is up, so peer_timeout never fires. */
Test(deadlines, a_node_that_never_begins_fails_the_save_on_every_rank, THREE_NODES) {
  run_missing("nonode", (NODES - 1) * PER_NODE, "node 2 of 3 never began within join_timeout 3 s");
}

/* Every node began, but rank 5 (node 2's second) never did. */
Test(deadlines, a_rank_missing_on_a_node_that_began_fails_the_save_on_every_rank, THREE_NODES) {
  run_missing("norank", NODES * PER_NODE - 1, "rank 5 of 6 never began within join_timeout 3 s (every node did)");
}
