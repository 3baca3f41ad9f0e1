/* Multi-node saves gone wrong: disagreements between nodes, lost and silent daemons, trust between peers, keep_last across nodes. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "peer_cluster.h"
#include "peer_util.h"

TestSuite(peers, .init = pc_setup, .fini = pc_teardown, .timeout = 120);

static void kill_node(int i, int sig) {
  cr_assert(N[i].d.pid > 0);
  cr_assert_eq(kill(N[i].d.pid, sig), 0);
  if (sig == SIGKILL) {
    int st;
    waitpid(N[i].d.pid, &st, 0);
    N[i].d.pid = 0;
  }
}

/* ROOT/rel is absent and, once the leader's clean-up ran, no temporary folder is left. */
static void expect_clean(const char *rel) {
  h_await_no_tmp();
  h_expect_unpublished(rel);
}

/* ------------------------------------------------------------------------ *
 * Disagreements across nodes
 * ------------------------------------------------------------------------ */
Test(peers, ranks_on_different_nodes_disagreeing_is_a_conflict_everywhere) {
  static const h_put puts[] = {{.rank = -1, .name = "n", .dtype = "F32", .ndim = 1, .shape = {4}}};
  h_script s = {.opts = cluster_opts("cfl", "ck/cfl", 0), .puts = puts, .nputs = 1, .wait_after_fail = 1};
  /* Node 2's ranks ask for another shard size: the leader sees two answers. */
  pid_t pids[H_MAX_RANKS];
  if (!s.sh) s.sh = h_shared_new();
  for (int r = 0; r < WORLD; r++) {
    s.opts.max_shard_size = rank_node[r] == 2 ? 5000 : 0;
    pids[r] = h_fork(peer_rank, r, &s);
  }
  h_reap_all(&s, pids);
  h_expect_failed(&s, SHARDD_E_CONFLICT, "max_shard_size", (char *)NULL);
  h_expect_unpublished("ck/cfl");
  h_shared_free(s.sh);
}

Test(peers, a_dtype_mismatch_between_nodes_fails_every_rank) {
  static const h_put puts[] = {
      BOX2(0, "m", "F32", 6, 2, 0, 0, 2, 2), BOX2(2, "m", "F32", 6, 2, 2, 0, 2, 2),
      BOX2(4, "m", "BF16", 6, 2, 4, 0, 2, 2),
      {.rank = -1, .name = "other", .dtype = "U8", .ndim = 1, .shape = {3}},
  };
  h_script s = {.opts = cluster_opts("mm", "ck/mm", 0), .puts = puts, .nputs = 4, .wait_after_fail = 1};
  run_ranks(&s);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "tensor 'm'", "node", (char *)NULL);
  h_expect_unpublished("ck/mm");
  h_shared_free(s.sh);
  /* an empty box still declares the shape: node 2's rank 5 holds nothing, and says [6,3] */
  static const h_put empty_puts[] = {
      BOX2(0, "m", "F32", 6, 2, 0, 0, 6, 2), BOX2(5, "m", "F32", 6, 3, 6, 0, 0, 3),
      {.rank = -1, .name = "other", .dtype = "U8", .ndim = 1, .shape = {3}},
  };
  h_script e = {.opts = cluster_opts("mm2", "ck/mm2", 0), .puts = empty_puts, .nputs = 3, .wait_after_fail = 1};
  run_ranks(&e);
  h_expect_failed(&e, SHARDD_E_MISMATCH, "tensor 'm'", "[6,3]", "node 2", (char *)NULL);
  h_expect_unpublished("ck/mm2");
  h_shared_free(e.sh);
}

Test(peers, a_gap_across_nodes_fails_every_rank) {
  static const h_put puts[] = {BOX2(1, "g", "F32", 6, 2, 0, 0, 2, 2), BOX2(5, "g", "F32", 6, 2, 4, 0, 2, 2),
                               {.rank = -1, .name = "o", .dtype = "U8", .ndim = 1, .shape = {3}}};
  h_script s = {.opts = cluster_opts("gap", "ck/gap", 0), .puts = puts, .nputs = 3, .wait_after_fail = 1};
  run_ranks(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "'g'", (char *)NULL);
  h_expect_unpublished("ck/gap");
  h_shared_free(s.sh);
}

/* Nodes leave empty boxes and their own replicas out of what they tell the leader (issue 33): a
 * gap or an overlap beside them is still found and named. */
Test(peers, a_gap_or_overlap_beside_empty_boxes_is_still_found) {
  static const h_put gap_puts[] = {
      BOX2(0, "e", "F32", 4, 2, 0, 0, 2, 2), BOX2(1, "e", "F32", 4, 2, 2, 0, 1, 2),
      BOX2(2, "e", "F32", 4, 2, 4, 0, 0, 2), BOX2(3, "e", "F32", 4, 2, 4, 0, 0, 2),
      BOX2(4, "e", "F32", 4, 2, 4, 0, 0, 2), BOX2(5, "e", "F32", 4, 2, 4, 0, 0, 2),
  };
  h_script s = {.opts = cluster_opts("egap", "ck/egap", 0), .puts = gap_puts, .nputs = 6, .wait_after_fail = 1};
  run_ranks(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "'e'", (char *)NULL);
  h_expect_unpublished("ck/egap");
  h_shared_free(s.sh);
  static const h_put overlap_puts[] = {
      BOX2(0, "o", "F32", 4, 2, 0, 0, 2, 2), BOX2(1, "o", "F32", 4, 2, 0, 0, 2, 2), /* a replica on node 0 */
      BOX2(2, "o", "F32", 4, 2, 1, 0, 3, 2), BOX2(3, "o", "F32", 4, 2, 4, 0, 0, 2),
      BOX2(4, "o", "F32", 4, 2, 4, 0, 0, 2), BOX2(5, "o", "F32", 4, 2, 4, 0, 0, 2),
  };
  h_script o = {.opts = cluster_opts("eovl", "ck/eovl", 0), .puts = overlap_puts, .nputs = 6, .wait_after_fail = 1};
  run_ranks(&o);
  h_expect_failed(&o, SHARDD_E_OVERLAP, "'o'", (char *)NULL);
  h_expect_unpublished("ck/eovl");
  h_shared_free(o.sh);
}

/* ------------------------------------------------------------------------ *
 * Lost daemons. Ranks of the "late" node wait (at H_AT_PUTS) until the test
 * has done its damage; every other rank seals first.
 * ------------------------------------------------------------------------ */
enum { C_SEALED = 0, C_GO = 1 };
static int late_node = -1;
static int hold_others; /* 1: hold every node's ranks but late_node's instead */

static void hold_late(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (point == H_AT_SEAL) h_signal(s->sh, C_SEALED);
  if (point == H_AT_PUTS && (rank_node[rank] == late_node) != hold_others) h_await(s->sh, C_GO, 1);
}

static const h_put fail_puts[] = {
    BOX2(0, "f", "F32", 12, 64, 0, 0, 2, 64), BOX2(1, "f", "F32", 12, 64, 2, 0, 2, 64),
    BOX2(2, "f", "F32", 12, 64, 4, 0, 2, 64), BOX2(3, "f", "F32", 12, 64, 6, 0, 2, 64),
    BOX2(4, "f", "F32", 12, 64, 8, 0, 2, 64), BOX2(5, "f", "F32", 12, 64, 10, 0, 2, 64),
};

/* The state of save `id` on node i ("open", "writing", ...), or "" when it is not in flight. */
static void save_state(int i, const char *id, char *out, size_t n) {
  json_t *st = node_status(i);
  json_t *saves = json_object_get(st, "saves"), *v;
  size_t k;
  out[0] = 0;
  json_array_foreach(saves, k, v) {
    if (strcmp(json_string_value(json_object_get(v, "save")), id) == 0)
      snprintf(out, n, "%s", json_string_value(json_object_get(v, "state")));
  }
  json_decref(st);
}

/* How many nodes the leader (node 0) has heard begin save `id`; -1 while it leads no such save. */
static int leader_joined(const char *id) {
  json_t *st = node_status(0);
  json_t *saves = json_object_get(json_object_get(st, "peers"), "leader_saves"), *v;
  size_t k;
  int n = -1;
  json_array_foreach(saves, k, v) {
    if (strcmp(json_string_value(json_object_get(v, "save")), id) == 0)
      n = (int)json_integer_value(json_object_get(v, "joined"));
  }
  json_decref(st);
  return n;
}

/* The leader has heard every node join `save`, and node i's sealed ranks are described to it, before
 * a node is stopped or killed: otherwise the leader waits for what the lost node never sent instead.
 * A busy machine can take longer than any fixed pause to bring a connection up; once it is, a node
 * writes its queued frames in order, so the join's arrival means the manifest left with it. */
static void await_told(const char *save, int i) {
  for (int64_t until = f_now_ms() + H_WAIT_MS; leader_joined(save) < NODES && f_now_ms() < until;) sleep_ms(10);
  cr_assert_eq(leader_joined(save), NODES, "the leader never heard every node begin '%s'", save);
  await_described(i, save, PER_NODE);
}

/* Every rank not on `victim` ends by itself and exits 0 (its outcome is in the script's results). */
static void reap_survivors(const pid_t *pids, int victim) {
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    int st = h_reap(pids[r]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
}

/* Every rank not on `victim` got peer_lost, its message naming `needle`. */
static void expect_survivors_lost(const h_script *s, int victim, const char *needle) {
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    const h_result *x = &s->sh->r[r];
    int got = x->waited ? x->wrc : x->rc;
    const char *msg = x->waited ? x->wmsg : x->msg;
    cr_assert_eq(got, SHARDD_E_PEER_LOST, "rank %d (node %d): expected peer_lost, got %s: %s", r, rank_node[r],
                 shardd_err_name(got), msg);
    cr_assert(strstr(msg, needle), "rank %d: '%s' does not name '%s'", r, msg, needle);
  }
}

/* Runs the save with `victim`'s daemon killed (SIGKILL) or frozen (SIGSTOP)
 * once every rank not on `late` has sealed, and returns how long the
 * survivors took to hear; asserts each surviving rank got peer_lost naming
 * `victim` and that nothing was published. */
static double lose_node(const char *save, int victim, int late, int sig, const char *needle) {
  char dir[64];
  snprintf(dir, sizeof dir, "ck/%s", save);
  h_script s = {.opts = cluster_opts(save, dir, 0), .puts = fail_puts, .nputs = 6, .hook = hold_late,
                .wait_after_fail = 1, .seed = 47};
  s.opts.dir = strdup(dir);
  late_node = late;
  s.sh = h_shared_new();
  pid_t pids[H_MAX_RANKS];
  start_ranks(&s, pids);
  cr_assert_eq(h_await(s.sh, C_SEALED, WORLD - PER_NODE), 0, "the early ranks did not seal");
  for (int i = 0; i < NODES; i++)
    if (i != late) await_told(save, i);
  double t0 = now_s();
  kill_node(victim, sig);
  /* With SIGSTOP the late ranks seal now: the leader plans, and the frozen node never answers. */
  h_signal(s.sh, C_GO);
  /* Survivors' waits must end on their own; the late ranks of a dead daemon fail too. */
  reap_survivors(pids, victim);
  double secs = now_s() - t0;
  if (sig == SIGSTOP) kill_node(victim, SIGKILL);
  for (int r = 0; r < WORLD; r++)
    if (rank_node[r] == victim) h_reap(pids[r]);
  expect_survivors_lost(&s, victim, needle);
  /* Nothing published, and no temporary folder left by a survivor. */
  char p[PATH_MAX];
  cr_assert_not(h_exists(h_path(p, sizeof p, dir)), "%s was published", dir);
  printf("peers %s: survivors heard of the lost node after %.2f s (peer timeout 2 s): %s\n", save, secs,
         s.sh->r[rank_node[0] == victim ? 2 : 0].wmsg);
  fflush(stdout);
  free((char *)s.opts.dir);
  h_shared_free(s.sh);
  return secs;
}

Test(peers, kill_9_of_a_non_leader_fails_the_save_on_every_survivor) {
  lose_node("kill1", 1, 0, SIGKILL, "node 1");
  expect_clean("ck/kill1");
  /* The survivors go on: a fresh two-node... three-node save needs node 1, so
   * check each survivor still answers and the leader leads nothing. */
  json_t *st = node_status(0);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(st, "peers"), "saves_leading")), 0);
  cr_assert_eq(json_array_size(json_object_get(st, "saves")), 0);
  json_decref(st);
}

Test(peers, kill_9_of_the_leader_fails_the_save_on_every_survivor) {
  lose_node("kill0", 0, 0, SIGKILL, "node 0");
  expect_clean("ck/kill0");
  for (int i = 1; i < NODES; i++) {
    json_t *st = node_status(i);
    cr_assert_eq(json_array_size(json_object_get(st, "saves")), 0, "node %d still holds the save", i);
    json_decref(st);
  }
}

/* A node that goes silent while files are being written (SIGSTOP after the
 * plan went out): heartbeats stop, the leader gives up after the timeout. */
Test(peers, a_silent_node_during_writing_fails_the_save) {
  lose_node("stop2", 2, 0, SIGSTOP, "node 2");
  expect_clean("ck/stop2");
  cr_assert(log_has(0, "went silent") || log_has(0, "nothing heard"), "the leader did not log the silence");
}

/* Kill -9 while files are being written: node `frozen`'s ranks seal first
 * and its daemon is stopped (SIGSTOP), so the save cannot finish; once
 * `observer` reports its part "writing", `victim` gets SIGKILL and the frozen
 * node resumes. Every surviving rank must get peer_lost naming `needle`. */
static void lose_during_writing(const char *save, int frozen, int victim, int observer, const char *needle) {
  /* Every node restarted with a peer timeout no busy machine reaches: the frozen node must stay in
   * the save, not be dropped as silent, until the others have planned and started writing. The
   * kill is heard as a closed connection, at once. */
  static const char *const patient[] = {"--peer-timeout", "120", NULL};
  for (int i = 0; i < NODES; i++) f_stop(&N[i].d, 1);
  for (int i = 0; i < NODES; i++) start_node_with(i, token_path, patient);
  char dir[64], state[32] = "";
  snprintf(dir, sizeof dir, "ck/%s", save);
  h_script s = {.opts = cluster_opts(save, dir, 0), .puts = fail_puts, .nputs = 6, .hook = hold_late,
                .wait_after_fail = 1, .seed = 49};
  late_node = frozen;
  hold_others = 1;
  s.sh = h_shared_new();
  pid_t pids[H_MAX_RANKS];
  start_ranks(&s, pids);
  cr_assert_eq(h_await(s.sh, C_SEALED, PER_NODE), 0, "node %d's ranks did not seal", frozen);
  await_told(save, frozen);
  kill_node(frozen, SIGSTOP);
  h_signal(s.sh, C_GO);
  /* The leader plans and assigns; the observer starts writing and waits for the frozen node. */
  /* Its ranks may not have begun yet on a busy machine: only a save seen in flight that then
   * leaves is one that failed. */
  for (int64_t until = f_now_ms() + H_WAIT_MS, seen = 0; f_now_ms() < until;) {
    save_state(observer, save, state, sizeof state);
    if (!strcmp(state, "writing") || (seen && !state[0])) break;
    seen = seen || state[0];
    sleep_ms(10);
  }
  cr_assert_str_eq(state, "writing", "node %d never started writing save '%s'", observer, save);
  double t0 = now_s();
  kill_node(victim, SIGKILL);
  if (frozen != victim) kill(N[frozen].d.pid, SIGCONT);
  reap_survivors(pids, victim);
  double secs = now_s() - t0;
  for (int r = 0; r < WORLD; r++)
    if (rank_node[r] == victim) h_reap(pids[r]);
  expect_survivors_lost(&s, victim, needle);
  printf("peers %s: killed node %d while node %d was writing; survivors heard after %.2f s\n", save, victim,
         observer, secs);
  fflush(stdout);
  hold_others = 0;
  expect_clean(dir);
  h_shared_free(s.sh);
}

Test(peers, kill_9_of_a_non_leader_while_writing) {
  lose_during_writing("kill2w", 2, 2, 0, "node 2");
}

Test(peers, kill_9_of_the_leader_while_writing) {
  lose_during_writing("kill0w", 2, 0, 1, "node 0 (the leader");
}

/* ------------------------------------------------------------------------ *
 * Trust
 * ------------------------------------------------------------------------ */
Test(peers, a_daemon_with_the_wrong_token_is_refused) {
  start_node(INTRUDER, bad_token_path);
  static const h_put puts[] = {{.rank = -1, .name = "t", .dtype = "U8", .ndim = 1, .shape = {4}}};
  /* One rank of a two-node save, on the intruder: it never gets in. */
  h_script s = {.opts = {.save = "intr", .dir = "ck/intr", .world_size = 2, .nnodes = 2, .leader = N[0].addr},
                .puts = puts, .nputs = 1, .wait_after_fail = 1};
  rank_node[0] = INTRUDER;
  rank_node[1] = INTRUDER;
  s.sh = h_shared_new();
  pid_t pid = h_fork(peer_rank, 1, &s);
  h_reap_ok(pid, "intruder rank");
  const h_result *x = &s.sh->r[1];
  int got = x->waited ? x->wrc : x->rc;
  const char *msg = x->waited ? x->wmsg : x->msg;
  cr_assert_eq(got, SHARDD_E_PERMISSION, "expected permission_denied, got %s: %s", shardd_err_name(got), msg);
  cr_assert(strstr(msg, "authentication failed"), "%s", msg);
  cr_assert(log_has(0, "refused: peer authentication failed"), "the leader did not log the refusal");
  cr_assert(log_has(INTRUDER, "refused us"), "the intruder did not log why");
  json_t *st = node_status(0);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(st, "peers"), "saves_led")), 0,
               "the leader must not have started a save for the intruder");
  json_decref(st);
  h_expect_unpublished("ck/intr");
  h_shared_free(s.sh);
}

Test(peers, a_peer_speaking_another_version_is_refused_with_a_reason) {
  int fd = tcp_connect(N[0].addr);
  /* version 1, whose proofs could be reflected (PEERS.md), is refused like any other */
  send_frame(fd, "{\"t\":\"hello\",\"v\":1,\"node\":\"past\",\"nonce\":"
                 "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}");
  json_t *e = read_frame(fd);
  cr_assert_not_null(e, "no reply before the close");
  cr_assert_str_eq(json_string_value(json_object_get(e, "t")), "error");
  cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unsupported_proto");
  cr_assert(strstr(json_string_value(json_object_get(e, "message")), "version 1 is not supported (this daemon speaks 3)"), "%s",
            json_string_value(json_object_get(e, "message")));
  json_decref(e);
  cr_assert_null(read_frame(fd), "the connection must be closed");
  close(fd);
  cr_assert(log_has(0, "peer protocol version 1 is not supported"));

  /* Skipping the handshake: a save message first is refused, nothing reaches the leader. */
  fd = tcp_connect(N[0].addr);
  send_frame(fd, "{\"t\":\"join\",\"save\":\"x\",\"tok\":\"0011223344556677\",\"node\":1}");
  e = read_frame(fd);
  cr_assert_not_null(e);
  cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "protocol_error");
  json_decref(e);
  cr_assert_null(read_frame(fd));
  close(fd);
  json_t *st = node_status(0);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(st, "peers"), "saves_led")), 0);
  json_decref(st);
}

/* One-node saves on a daemon that also listens for peers are unchanged. */
Test(peers, one_node_saves_still_work_beside_peers) {
  static const h_put puts[] = {BOX2(0, "a", "F32", 4, 4, 0, 0, 2, 4), BOX2(1, "a", "F32", 4, 4, 2, 0, 2, 4)};
  h_script s = {.opts = {.save = "solo", .dir = "ck/solo", .world_size = 2}, .puts = puts, .nputs = 2, .seed = 48};
  rank_node[0] = rank_node[1] = 1;
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  h_shared_free(s.sh);
}

/* On a shared root a restarting daemon removes only its own temporary
 * folders: the others may belong to saves other nodes have in flight. */
Test(peers, restart_cleans_only_this_nodes_temporary_folders) {
  h_daemon_stop(&N[0].d);
  const char *names[] = {".shardd-tmp-@node0@-a-s-1-1", ".shardd-tmp-@node1@-a-s-2-1", "sub/.shardd-tmp-@node0@-b-s-1-2",
                         ".shardd-tmp-plain-1-1"};
  char p[PATH_MAX], f[PATH_MAX + 16];
  mkdir(h_path(p, sizeof p, ""), 0755);
  mkdir(h_path(p, sizeof p, "sub"), 0755);
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(mkdir(h_path(p, sizeof p, names[i]), 0755), 0, "%s: %s", p, strerror(errno));
    snprintf(f, sizeof f, "%s/x", p);
    close(open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  }
  start_node(0, token_path);
  cr_assert_not(h_exists(h_path(p, sizeof p, names[0])), "node0's own stale folder survived");
  cr_assert_not(h_exists(h_path(p, sizeof p, names[2])), "node0's own stale folder below the root survived");
  cr_assert(h_exists(h_path(p, sizeof p, names[1])), "node1's folder (maybe in flight) was removed");
  cr_assert(h_exists(h_path(p, sizeof p, names[3])), "a folder of unknown owner was removed");
}

/* ------------------------------------------------------------------------ *
 * keep_last across nodes: the leader prunes after it published
 * ------------------------------------------------------------------------ */
Test(peers, keep_last_runs_on_the_leader_after_publishing) {
  static const h_put puts[] = {{.rank = -1, .name = "n", .dtype = "F32", .ndim = 1, .shape = {4}}};
  const char *dirs[] = {"ck/kl/s1", "ck/kl/s2", "ck/kl/s3"};
  char p[PATH_MAX];
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "kl%d", i);
    h_script s = {.opts = cluster_opts(id, dirs[i], 0), .puts = puts, .nputs = 1, .seed = 50 + (unsigned)i};
    s.opts.keep_last = 2;
    run_ranks(&s);
    h_expect_committed(&s);
    h_shared_free(s.sh);
  }
  /* The leader's ranks had their answers, so its keep_last pass has run by the time it answers status. */
  json_decref(node_status(0));
  cr_assert(!h_exists(h_path(p, sizeof p, "ck/kl/s1")), "ck/kl/s1 is left after 3 saves with keep_last=2");
  h_verify_ok("ck/kl/s2");
  h_verify_ok("ck/kl/s3");
  cr_assert(log_has(0, "keep_last=2: deleted 'ck/kl/s1'"), "the leader did not prune");
  for (int i = 1; i < NODES; i++) cr_assert(!log_has(i, "keep_last=2: deleted"), "node %d pruned too", i);
}

Test(peers, nodes_disagreeing_on_keep_last_is_a_conflict) {
  static const h_put puts[] = {{.rank = -1, .name = "n", .dtype = "F32", .ndim = 1, .shape = {4}}};
  h_script s = {.opts = cluster_opts("klc", "ck/klc", 0), .puts = puts, .nputs = 1, .wait_after_fail = 1};
  pid_t pids[H_MAX_RANKS];
  s.sh = h_shared_new();
  for (int r = 0; r < WORLD; r++) {
    s.opts.keep_last = rank_node[r] == 1 ? 3 : 2;
    pids[r] = h_fork(peer_rank, r, &s);
  }
  h_reap_all(&s, pids);
  h_expect_failed(&s, SHARDD_E_CONFLICT, "keep_last", (char *)NULL);
  h_expect_unpublished("ck/klc");
  h_shared_free(s.sh);
}
