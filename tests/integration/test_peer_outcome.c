/* The leader of a three-node save lost at each moment of it: what every rank hears, against what is on disk. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "peer_cluster.h"
#include "peer_util.h"

/* Three nodes, started by each test (the leader, and node 1, with a test hook in their environment). */
static void setup(void) {
  pu_scratch("outcome");
  snprintf(token_path, sizeof token_path, "%s/token", H.base);
  write_token(token_path, "the-cluster-secret-0123456789abcdef\n");
  for (int r = 0; r < H_MAX_RANKS; r++) rank_node[r] = r / PER_NODE;
}

TestSuite(outcome, .init = setup, .fini = pu_teardown, .timeout = 120);

static void start_cluster(const char *leader_env, const char *node1_env, const char *node2_env) {
  for (int i = 0; i < NODES; i++) {
    const char *env[] = {i == 0 ? leader_env : i == 1 ? node1_env : node2_env, NULL};
    start_node_env(i, token_path, NULL, env);
  }
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  snprintf(H.log, sizeof H.log, "%s", N[0].d.log);
}

/* Each node's two ranks hold the halves of one tensor of 4 KiB, and shards of 4 KiB make it that
 * node's own file, so every node (the leader too) writes a file set of its own. */
static const h_put layers[] = {
    BOX2(0, "layer.0", "F32", 4, 256, 0, 0, 2, 256), BOX2(1, "layer.0", "F32", 4, 256, 2, 0, 2, 256),
    BOX2(2, "layer.1", "F32", 4, 256, 0, 0, 2, 256), BOX2(3, "layer.1", "F32", 4, 256, 2, 0, 2, 256),
    BOX2(4, "layer.2", "F32", 4, 256, 0, 0, 2, 256), BOX2(5, "layer.2", "F32", 4, 256, 2, 0, 2, 256),
    {.rank = -1, .name = "norm", .dtype = "BF16", .ndim = 1, .shape = {8}},
};

/* What a rank heard: 0 committed, else the code its wait (or first failing call) ended with. */
static int heard(const h_script *s, int r, const char **msg) {
  const h_result *x = &s->sh->r[r];
  *msg = x->waited ? x->wmsg : x->msg;
  return x->waited ? x->wrc : x->rc;
}

/* Every rank of node k heard `code` (0: committed), its message naming `needle` (NULL: anything). */
static void expect_node(const h_script *s, int k, int code, const char *needle) {
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] != k) continue;
    const char *msg;
    int got = heard(s, r, &msg);
    cr_assert_eq(got, code, "rank %d (node %d): expected %s, heard %s: %s", r, k, code ? shardd_err_name(code) :
                 "committed", got ? shardd_err_name(got) : "committed", msg);
    if (needle) cr_assert(strstr(msg, needle), "rank %d (node %d): '%s' does not say '%s'", r, k, msg, needle);
  }
}

/* The ranks of every node, the save run to its end; the leader's daemon dies at its crash point. */
static void run_save(h_script *s, const char *save, char *dir, size_t n) {
  snprintf(dir, n, "ck/%s", save);
  *s = (h_script){.opts = cluster_opts(save, dir, 4096), .puts = layers, .nputs = sizeof layers / sizeof *layers,
                  .wait_after_fail = 1, .seed = 33};
  pid_t pids[H_MAX_RANKS];
  start_ranks(s, pids);
  for (int r = 0; r < WORLD; r++) {
    int st = h_reap(pids[r]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
}

/* The leader died (SIGKILL from its crash point); it comes back on the same root and sweeps its
 * own temporary folders, as a restarted leader does. */
static void restart_leader(void) {
  f_reap_killed(&N[0].d);
  start_node(0, token_path);
  h_await_no_tmp();
}

static void print_moment(const char *moment, const h_script *s, const char *dir) {
  char p[PATH_MAX];
  printf("outcome: leader lost %s: on disk %s; ranks heard:", moment,
         h_exists(h_path(p, sizeof p, dir)) ? "published" : "nothing");
  for (int r = 0; r < WORLD; r++) {
    const char *msg;
    int got = heard(s, r, &msg);
    printf(" %d:%s", r, got ? shardd_err_name(got) : "committed");
  }
  printf("\n");
  fflush(stdout);
}

/* The leader's daemon dies at its crash point; its own ranks cannot know the outcome. Lost before
 * the last node's done (code peer_lost): no node can have been told committed, nothing is
 * published, the nodes' ranks hear peer_lost naming `needle`. Lost after the rename (code 0):
 * published, every node's ranks hear committed and the checkpoint reads back whole. */
static void lose_leader(const char *save, const char *crash, const char *moment, int code, const char *needle) {
  start_cluster(crash, NULL, NULL);
  h_script s;
  char dir[64];
  run_save(&s, save, dir, sizeof dir);
  print_moment(moment, &s, dir);
  expect_node(&s, 0, SHARDD_E_OUTCOME_UNKNOWN, "the daemon was lost");
  expect_node(&s, 1, code, needle);
  expect_node(&s, 2, code, needle);
  if (code) {
    restart_leader();
    h_expect_unpublished(dir);
    h_shared_free(s.sh);
    return;
  }
  for (int r = PER_NODE; r < WORLD; r++)
    cr_assert_eq(s.sh->r[r].res.tensors, 4, "rank %d: committed with %llu tensors", r,
                 (unsigned long long)s.sh->r[r].res.tensors);
  h_check_script(&s);
  restart_leader();
  h_check_script(&s);
  cr_assert_eq(h_tmp_count(), 0);
  h_shared_free(s.sh);
}

Test(outcome, before_assign) {
  lose_leader("pre", "SHARDD_TEST_CRASH_AT=lead_prepare:1", "before assign", SHARDD_E_PEER_LOST, "node 0 (the leader");
}

Test(outcome, while_writing) {
  /* node 0's own file set starts: the others may be writing, or done and waiting */
  lose_leader("wr", "SHARDD_TEST_CRASH_AT=filejob:1", "while writing", SHARDD_E_PEER_LOST, "node 0 (the leader");
}

Test(outcome, after_every_done) {
  /* every node had reported: each looked at the root, one withdrew the folder */
  lose_leader("done", "SHARDD_TEST_CRASH_AT=lead_index:1", "after every done", SHARDD_E_PEER_LOST,
              "nothing was published");
  cr_assert(log_has(1, "looking at the root") && log_has(2, "looking at the root"));
}

Test(outcome, after_the_rename) {
  lose_leader("ren", "SHARDD_TEST_CRASH_AT=lead_rename:1", "after the rename", 0, NULL);
}

Test(outcome, after_the_parents_fsync) {
  lose_leader("psync", "SHARDD_TEST_CRASH_AT=lead_parentsync:1", "after the parent's fsync", 0, NULL);
}

/* With overwrite the leader's exchange leaves the old checkpoint under the temporary name; lost
 * right then, the nodes find their folder published, say committed, and remove the old one. */
Test(outcome, after_the_rename_over_an_old_checkpoint) {
  start_cluster("SHARDD_TEST_CRASH_AT=lead_rename:2", NULL, NULL);
  h_script old, s;
  char dir[64];
  run_save(&old, "ow", dir, sizeof dir);
  for (int r = 0; r < WORLD; r++) cr_assert_eq(heard(&old, r, &(const char *){0}), 0, "rank %d: the first save failed", r);
  s = (h_script){.opts = cluster_opts("ow2", dir, 4096), .puts = layers, .nputs = sizeof layers / sizeof *layers,
                 .wait_after_fail = 1, .seed = 35};
  s.opts.overwrite = 1;
  pid_t pids[H_MAX_RANKS];
  start_ranks(&s, pids);
  for (int r = 0; r < WORLD; r++) h_reap(pids[r]);
  print_moment("after the rename over an old checkpoint", &s, dir);
  expect_node(&s, 0, SHARDD_E_OUTCOME_UNKNOWN, "the daemon was lost");
  expect_node(&s, 1, 0, NULL);
  expect_node(&s, 2, 0, NULL);
  h_check_script(&s);
  /* before the leader's restart could sweep it: the node that moved the old one away removed it */
  cr_assert_eq(h_tmp_count(), 0, "the old checkpoint is left under a temporary name");
  restart_leader();
  h_check_script(&s);
  h_shared_free(old.sh);
  h_shared_free(s.sh);
}

/* Removes every temporary folder under the root, depth first, as a node that withdrew one does. */
static int remove_tmp_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  if (strstr(p, "/.shardd-tmp")) remove(p);
  return 0;
}

static void remove_tmp_folders(void) { nftw(H.root, remove_tmp_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* A save whose leader the test stops (SIGSTOP) once node `node`'s log says `line`; `meanwhile`, if
 * given, runs right after. The nodes hear nothing from it for the peer timeout (2 s) and answer
 * their ranks; then it runs again and its own ranks end. */
static void save_cut_off(h_script *s, const char *save, char *dir, size_t n, unsigned seed, int node, const char *line,
                         void (*meanwhile)(void)) {
  snprintf(dir, n, "ck/%s", save);
  *s = (h_script){.opts = cluster_opts(save, dir, 4096), .puts = layers, .nputs = sizeof layers / sizeof *layers,
                  .wait_after_fail = 1, .seed = seed};
  pid_t pids[H_MAX_RANKS];
  start_ranks(s, pids);
  free(f_log_wait(&N[node].d, line));
  kill(N[0].d.pid, SIGSTOP);
  if (meanwhile) meanwhile();
  for (int r = PER_NODE; r < WORLD; r++) {
    int st = h_reap(pids[r]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
  kill(N[0].d.pid, SIGCONT);
  for (int r = 0; r < PER_NODE; r++) h_reap(pids[r]);
}

/* The leader is not dead but cut off (stopped) after every node's done: the nodes withdraw the folder
 * and say failed; once it runs again its rename finds nothing, and its own ranks hear failed too. */
Test(outcome, leader_cut_off_after_every_done_publishes_nothing) {
  /* The stall only holds the leader where the test stops it: it must outlast the test's noticing
   * the log line, seconds on a busy machine (its rest runs out after SIGCONT). */
  start_cluster("SHARDD_TEST_STALL_AT=lead_index:1:6000", NULL, NULL);
  h_script s;
  char dir[64];
  save_cut_off(&s, "cut", dir, sizeof dir, 34, 0, "stall point lead_index", NULL);
  print_moment("(cut off, not dead) after every done", &s, dir);
  expect_node(&s, 1, SHARDD_E_PEER_LOST, "nothing was published");
  expect_node(&s, 2, SHARDD_E_PEER_LOST, "nothing was published");
  expect_node(&s, 0, SHARDD_E_PEER_LOST, "withdrew the temporary folder");
  h_await_no_tmp();
  h_expect_unpublished(dir);
  h_shared_free(s.sh);
}


/* The folder goes from under a node that has not opened its files yet, while the leader is silent
 * (stopped): what a node that lost the leader after its done does when it withdraws the folder.
 * The node's open then fails with ENOENT, a consequence whose cause only the leader knows: the node
 * waits for its word, and its silence says peer_lost naming the leader. (It used to answer
 * io_error, "open: No such file or directory", whenever the open came before the leader's loss.) */
Test(outcome, a_node_whose_folder_went_hears_the_leader_lost) {
  /* node 1 holds still before its files are opened: shorter than the peer timeout (2 s), so its
   * open comes before it could call the leader lost */
  start_cluster(NULL, "SHARDD_TEST_STALL_AT=filejob:1:1500", NULL);
  h_script s;
  char dir[64];
  save_cut_off(&s, "gone", dir, sizeof dir, 36, 1, "stall point filejob", remove_tmp_folders);
  print_moment("(cut off) while node 1's folder went", &s, dir);
  expect_node(&s, 1, SHARDD_E_PEER_LOST, "node 0 (the leader");
  cr_assert(log_has(1, "the temporary folder is gone; waiting for the leader's word"));
  /* node 2 heard the same, whether its files were written already (then it looked at the root) or not */
  expect_node(&s, 2, SHARDD_E_PEER_LOST, NULL);
  for (int r = 0; r < PER_NODE; r++) cr_assert_neq(heard(&s, r, &(const char *){0}), 0, "rank %d committed", r);
  h_expect_unpublished(dir);
  h_shared_free(s.sh);
}

/* The attempt a rank's outcome_unknown names, and the path. */
static void unknown_names(const h_script *s, int r, char *path, size_t pn, char *attempt) {
  const char *msg;
  cr_assert_eq(heard(s, r, &msg), SHARDD_E_OUTCOME_UNKNOWN);
  const char *at = strstr(msg, "`shardctl outcome ");
  cr_assert_not_null(at, "'%s' names no shardctl outcome", msg);
  cr_assert_eq(sscanf(at, "`shardctl outcome %1023s %16[0-9a-f]`", path, attempt), 2, "%s", msg);
  (void)pn;
}

static int outcome_of(const char *path, const char *attempt, char *out, size_t n) {
  const char *argv[] = {getenv("SHARDCTL"), "outcome", path, attempt, NULL};
  int st = f_run(out, n, NULL, argv);
  cr_assert(WIFEXITED(st), "shardctl outcome: 0x%x", st);
  return WEXITSTATUS(st);
}

/* Node 1 cannot look (its rename fails with EIO): it says outcome_unknown naming the folder and
 * the attempt; shardctl outcome tells what happened once asked. */
Test(outcome, unknown_after_the_rename_resolves_to_committed) {
  start_cluster("SHARDD_TEST_CRASH_AT=lead_rename:1", "SHARDD_TEST_FAULT=fence:1:EIO", NULL);
  h_script s;
  char dir[64], path[1024], attempt[17], out[4096];
  run_save(&s, "unk", dir, sizeof dir);
  print_moment("after the rename, node 1 unable to look", &s, dir);
  expect_node(&s, 1, SHARDD_E_OUTCOME_UNKNOWN, "cannot move its temporary folder");
  expect_node(&s, 2, 0, NULL);
  unknown_names(&s, PER_NODE, path, sizeof path, attempt);
  cr_assert_eq(outcome_of(path, attempt, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "committed"), "%s", out);
  cr_assert_eq(outcome_of(path, "0123456789abcdef", out, sizeof out), 4, "another attempt: %s", out);
  h_check_script(&s);
  restart_leader();
  h_shared_free(s.sh);
}

Test(outcome, unknown_before_the_rename_resolves_to_pending_then_unpublished) {
  /* both nodes unable to look: nobody withdraws, the temporary folder stays until the leader's restart */
  start_cluster("SHARDD_TEST_CRASH_AT=lead_index:1", "SHARDD_TEST_FAULT=fence:1:EIO", "SHARDD_TEST_FAULT=fence:1:EIO");
  h_script s;
  char dir[64], path[1024], attempt[17], out[4096];
  run_save(&s, "unk2", dir, sizeof dir);
  print_moment("after every done, no node able to look", &s, dir);
  expect_node(&s, 1, SHARDD_E_OUTCOME_UNKNOWN, "shardctl outcome");
  expect_node(&s, 2, SHARDD_E_OUTCOME_UNKNOWN, "shardctl outcome");
  unknown_names(&s, PER_NODE, path, sizeof path, attempt);
  cr_assert_eq(outcome_of(path, attempt, out, sizeof out), 3, "%s", out);
  cr_assert(strstr(out, "pending"), "%s", out);
  restart_leader();
  cr_assert_eq(outcome_of(path, attempt, out, sizeof out), 4, "%s", out);
  cr_assert(strstr(out, "not published"), "%s", out);
  h_expect_unpublished(dir);
  h_shared_free(s.sh);
}
