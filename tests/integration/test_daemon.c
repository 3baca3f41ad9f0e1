/* The daemon's own life: SIGTERM with saves in flight, restart over stale temporary folders, status and totals. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

TestSuite(daemon, .init = h_setup, .fini = h_teardown, .timeout = 100);

static const h_put tputs[] = {
    {.rank = 0, .name = "w", .dtype = "F32", .ndim = 2, .shape = {6, 5}, .boxed = 1, .start = {0, 0},
     .count = {3, 5}},
    {.rank = 1, .name = "w", .dtype = "F32", .ndim = 2, .shape = {6, 5}, .boxed = 1, .start = {3, 0},
     .count = {3, 5}},
    {.rank = -1, .name = "b", .dtype = "BF16", .ndim = 1, .shape = {9}},
};

/* rank 0 seals and waits; rank 1 stops after its puts until told to go on */
static void hold_rank1(const h_script *s, int rank, int point, shardd_client *c) {
  if (point == H_AT_SEAL && rank == 0) {
    int rc = h_wait_registered(c, s->opts.save);
    if (rc) h_result_fail(&s->sh->r[0], "prewait", rc, c);
    h_signal(s->sh, 0);
  }
  if (point != H_AT_PUTS || rank != 1) return;
  h_signal(s->sh, 0);
  if (h_await(s->sh, 1, 1)) h_result_fail(&s->sh->r[1], "sync", SHARDD_E_TIMEOUT, NULL);
}

static void plant_dir(const char *path, const char *file) {
  cr_assert(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", path, file);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "%s", p);
  fputs("partial", f);
  fclose(f);
}

/* ------------------------------------------------------------------------ *
 * SIGTERM fails saves in flight, answers waits, exits 0 and removes the socket
 * ------------------------------------------------------------------------ */
Test(daemon, sigterm_with_a_save_in_flight) {
  h_script s = {.opts = {.save = "term", .dir = "term", .world_size = 2}, .puts = tputs, .nputs = 3,
                .seed = 81, .hook = hold_rank1};
  s.sh = h_shared_new();
  pid_t pids[2];
  h_start(&s, pids);
  cr_assert_eq(h_await(s.sh, 0, 2), 0, "ranks did not get ready");
  h_daemon_stop(&H); /* asserts exit 0 and the socket gone */
  h_signal(s.sh, 1);
  h_reap_all(&s, pids);
  /* the waiting rank hears why */
  cr_assert(s.sh->r[0].waited);
  cr_assert_eq(s.sh->r[0].wrc, SHARDD_E_SHUTTING_DOWN, "%s", s.sh->r[0].wmsg);
  cr_assert(strstr(s.sh->r[0].wmsg, "'term'"), "%s", s.sh->r[0].wmsg);
  /* the other finds the daemon gone */
  cr_assert_str_eq(s.sh->r[1].step, "seal");
  cr_assert_neq(s.sh->r[1].rc, 0);
  h_expect_unpublished("term");
  h_shared_free(s.sh);

  /* a new daemon on the same root and socket works */
  h_daemon_start(&H);
  h_expect_serving();
}

/* SIGTERM while a 16 MiB save is being written: it commits whole or fails
 * whole, and every waiter hears which. */
static void signal_after_seal(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank == 1 && point == H_AT_SEAL) h_signal(s->sh, 0);
  if (rank == 0 && point == H_AT_BEGIN && h_await(s->sh, 0, 1))
    h_result_fail(&s->sh->r[0], "sync", SHARDD_E_TIMEOUT, NULL);
  if (rank == 0 && point == H_AT_SEAL) {
    int rc = h_wait_registered(c, s->opts.save);
    if (rc && rc != SHARDD_E_TIMEOUT) h_result_fail(&s->sh->r[0], "prewait", rc, c);
    h_signal(s->sh, 1);
  }
}

Test(daemon, sigterm_while_writing) {
  static const h_put big[] = {
      {.rank = 0, .name = "big", .dtype = "F32", .ndim = 2, .shape = {2048, 1024}, .boxed = 1,
       .start = {0, 0}, .count = {1024, 1024}},
      {.rank = 1, .name = "big", .dtype = "F32", .ndim = 2, .shape = {2048, 1024}, .boxed = 1,
       .start = {1024, 0}, .count = {1024, 1024}},
  };
  h_script s = {.opts = {.save = "termw", .dir = "termw", .world_size = 2}, .puts = big, .nputs = 2,
                .seed = 85, .hook = signal_after_seal};
  s.sh = h_shared_new();
  pid_t pids[2];
  h_start(&s, pids);
  cr_assert_eq(h_await(s.sh, 1, 1), 0, "rank 0 did not seal");
  h_daemon_stop(&H);
  h_reap_all(&s, pids);
  const h_result *r0 = &s.sh->r[0];
  cr_assert(r0->waited, "rank 0 got no answer");
  if (r0->wrc == 0) {
    h_check_script(&s);
  } else {
    cr_assert_eq(r0->wrc, SHARDD_E_SHUTTING_DOWN, "%s", r0->wmsg);
    h_expect_unpublished("termw");
  }
  cr_assert_eq(h_tmp_count(), 0, "shutdown left a temporary folder");
  h_shared_free(s.sh);
  h_daemon_start(&H);
  h_expect_serving();
}

Test(daemon, sigterm_when_idle_and_restart) {
  h_daemon_stop(&H);
  h_daemon_start(&H);
  h_daemon_stop(&H);
  h_daemon_start(&H);
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Restart: committed checkpoints intact, stale temporary folders removed,
 * and symlinks still not followed while cleaning.
 * ------------------------------------------------------------------------ */
Test(daemon, restart_removes_stale_temporary_folders_only_under_the_root) {
  h_script s = {.opts = {.save = "kept", .dir = "ck/kept", .world_size = 2}, .puts = tputs, .nputs = 3,
                .seed = 82};
  h_run(&s);
  h_expect_committed(&s);
  h_daemon_stop(&H);

  char p[PATH_MAX], q[PATH_MAX + 64];
  plant_dir(h_path(p, sizeof p, ".shardd-tmp-ck-crashed-1-1"), "model.safetensors");
  plant_dir(h_path(p, sizeof p, "ck/.shardd-tmp-kept-crashed-1-2"), "model-00001-of-00002.safetensors");
  /* a look-alike outside, reachable only through a symlink in the root */
  snprintf(q, sizeof q, "%s/.shardd-tmp-victim", H.outside);
  plant_dir(q, "precious");
  cr_assert_eq(symlink(H.outside, h_path(p, sizeof p, "ck/link")), 0);
  cr_assert_eq(h_tmp_count(), 2);

  h_daemon_start(&H);
  cr_assert_eq(h_tmp_count(), 0, "stale temporary folders survive a restart");
  snprintf(q, sizeof q, "%s/.shardd-tmp-victim/precious", H.outside);
  cr_assert(h_exists(q), "cleanup followed a symlink out of the root");
  h_check_script(&s); /* the committed checkpoint, byte for byte */
  cr_assert_eq(unlink(h_path(p, sizeof p, "ck/link")), 0);
  h_shared_free(s.sh);
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * One daemon per root, one per node name (ROOT/.shardd-lock)
 * ------------------------------------------------------------------------ */
/* A second daemon (its own socket and log) on H's root, as o says: it must refuse to start, saying `want`. */
static void refused_start(const char *tag, const f_opts *o, const char *want) {
  h_daemon d2;
  f_scratch(&d2, tag);
  snprintf(d2.root, sizeof d2.root, "%s", H.root);
  char why[512];
  if (f_try_start(&d2, o, why, sizeof why) == 0) {
    f_stop(&d2, 1);
    cr_assert_fail("a second daemon started on root %s", H.root);
  }
  cr_assert(strstr(why, "exited before accepting"), "%s", why);
  cr_assert_eq(f_log_count(d2.log, want), 1, "the refusal does not say '%s'", want);
  f_scratch_remove(d2.base);
}

static void token_file(char *path, size_t n) {
  snprintf(path, n, "%s/token", H.base);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s", path);
  fputs("6f0c2b1e9d8a7f6e5d4c3b2a19080706f5e4d3c2b1a09f8e7d6c5b4a39281706\n", f);
  fclose(f);
  cr_assert_eq(chmod(path, 0600), 0);
}

Test(daemon, a_second_daemon_on_the_root_refuses_to_start_and_removes_nothing) {
  /* what the live daemon's save in flight would hold */
  char p[PATH_MAX], want[PATH_MAX + 128];
  plant_dir(h_path(p, sizeof p, ".shardd-tmp-live-save-1-1"), "model.safetensors");
  snprintf(want, sizeof want, "root '%s' is held by another shardd (pid %d): one daemon per root", H.root, (int)H.pid);
  refused_start("second", NULL, want);
  cr_assert(h_exists(p), "the refused daemon removed the live daemon's temporary folder");
  /* one with peers may not share a single-node daemon's root either */
  char token[PATH_MAX];
  token_file(token, sizeof token);
  f_opts peers = {.peer_token = token, .node_name = "n1"};
  snprintf(want, sizeof want, "root '%s' is held by a single-node shardd (pid %d)", H.root, (int)H.pid);
  refused_start("second-peers", &peers, want);
  cr_assert(h_exists(p));
  h_expect_serving();
  /* once it has stopped, the next one takes the root and logs what it removes */
  h_daemon_stop(&H);
  h_daemon_start(&H);
  cr_assert_not(h_exists(p), "the stale folder survived the restart");
  cr_assert_eq(f_log_count(H.log, "start-up: removed the stale folder '.shardd-tmp-live-save-1-1'"), 1,
               "the sweep did not log the folder it removed");
  h_expect_serving();
}

Test(daemon, daemons_with_peers_share_a_root_but_not_a_node_name) {
  h_daemon_stop(&H);
  char token[PATH_MAX], want[PATH_MAX + 128];
  token_file(token, sizeof token);
  f_opts n1 = {.peer_token = token, .node_name = "n1"};
  f_start(&H, &n1);
  char p[PATH_MAX];
  plant_dir(h_path(p, sizeof p, ".shardd-tmp-@n1@-ck-s-1-1"), "model.safetensors");
  snprintf(want, sizeof want, "node name 'n1' is held on root '%s' by another shardd (pid %d)", H.root, (int)H.pid);
  refused_start("same-node", &n1, want);
  cr_assert(h_exists(p), "the refused daemon removed node n1's temporary folder");
  /* another node name shares the root, and its sweep leaves n1's folder alone */
  h_daemon d2;
  f_scratch(&d2, "other-node");
  snprintf(d2.root, sizeof d2.root, "%s", H.root);
  f_opts n2 = {.peer_token = token, .node_name = "n2"};
  f_start(&d2, &n2);
  cr_assert(h_exists(p), "node n2's sweep removed node n1's temporary folder");
  /* and no single-node daemon joins them */
  snprintf(want, sizeof want, "root '%s' is held by another shardd (pid ", H.root);
  refused_start("single", NULL, want);
  f_stop(&d2, 1);
  f_scratch_remove(d2.base);
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * status (library and shardctl) and the totals
 * ------------------------------------------------------------------------ */
Test(daemon, status_shows_saves_in_flight_and_totals) {
  /* one failed save first */
  h_script bad = {.opts = {.save = "bad", .dir = "bad", .world_size = 2}, .puts = tputs, .nputs = 1, .seed = 83,
                  .wait_after_fail = 1};
  h_run(&bad);
  h_expect_failed(&bad, SHARDD_E_GAP, "'w'", (char *)NULL);
  h_shared_free(bad.sh);

  h_script s = {.opts = {.save = "shown", .dir = "shown", .world_size = 2}, .puts = tputs, .nputs = 3,
                .seed = 84, .hook = hold_rank1};
  s.sh = h_shared_new();
  pid_t pids[2];
  h_start(&s, pids);
  cr_assert_eq(h_await(s.sh, 0, 2), 0);

  char out[8192];
  int st = h_shardctl(out, sizeof out, "status", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shardctl status: %s", out);
  cr_assert(strstr(out, "shown"), "shardctl status does not show the save: %s", out);

  shardd_client *c;
  cr_assert_eq(shardd_connect(H.sock, &c), 0);
  char *js;
  cr_assert_eq(shardd_status(c, &js), 0);
  json_t *j = json_loads(js, 0, NULL);
  cr_assert_not_null(j);
  json_t *v = json_array_get(json_object_get(j, "saves"), 0);
  cr_assert_str_eq(json_string_value(json_object_get(v, "save")), "shown", "%s", js);
  cr_assert_str_eq(json_string_value(json_object_get(v, "dir")), "shown");
  cr_assert_str_eq(json_string_value(json_object_get(v, "state")), "open");
  cr_assert_eq(json_integer_value(json_object_get(v, "world_size")), 2);
  cr_assert_eq(json_integer_value(json_object_get(v, "ranks_begun")), 2);
  cr_assert_eq(json_integer_value(json_object_get(v, "ranks_sealed")), 1);
  cr_assert_eq(json_integer_value(json_object_get(v, "tensors")), 2);
  cr_assert_eq(json_integer_value(json_object_get(v, "bytes_planned")), 6 * 5 * 4 + 2 * 9 * 2,
               "bytes put so far, replicas counted per rank: %s", js);
  cr_assert_geq(json_integer_value(json_object_get(j, "clients")), 3);
  json_t *tot = json_object_get(j, "totals");
  cr_assert_eq(json_integer_value(json_object_get(tot, "saves_committed")), 0);
  cr_assert_eq(json_integer_value(json_object_get(tot, "saves_failed")), 1);
  json_decref(j);
  shardd_free(js);

  h_signal(s.sh, 1);
  h_reap_all(&s, pids);
  h_expect_committed(&s);
  h_check_script(&s);

  cr_assert_eq(shardd_status(c, &js), 0);
  j = json_loads(js, 0, NULL);
  cr_assert_eq(json_array_size(json_object_get(j, "saves")), 0);
  tot = json_object_get(j, "totals");
  cr_assert_eq(json_integer_value(json_object_get(tot, "saves_committed")), 1);
  cr_assert_eq(json_integer_value(json_object_get(tot, "saves_failed")), 1);
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(tot, "bytes_written")), s.sh->r[0].res.bytes, "%s",
               js);
  json_decref(j);
  shardd_free(js);
  shardd_close(c);
  h_shared_free(s.sh);
}
