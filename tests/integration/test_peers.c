/* Multi-node saves: 3 daemons on loopback sharing one root, 2 real rank processes each; layouts, failures, trust. */
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
#include "peer_util.h"

#define NODES 3
#define PER_NODE 2
#define WORLD (NODES * PER_NODE)
#define INTRUDER NODES /* a 4th daemon, started by the wrong-token test with another secret */

static char token_path[PATH_MAX], bad_token_path[PATH_MAX];

/* ------------------------------------------------------------------------ *
 * Daemons
 * ------------------------------------------------------------------------ */
static void setup(void) {
  pu_scratch("peers");
  snprintf(token_path, sizeof token_path, "%s/token", H.base);
  snprintf(bad_token_path, sizeof bad_token_path, "%s/bad-token", H.base);
  write_token(token_path, "the-cluster-secret-0123456789abcdef\n");
  write_token(bad_token_path, "not-the-cluster-secret-0123456789ab\n");
  for (int i = 0; i < NODES; i++) start_node(i, token_path);
  /* The harness's helpers (shardctl, status checks) talk to node 0. */
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  snprintf(H.log, sizeof H.log, "%s", N[0].d.log);
  for (int r = 0; r < H_MAX_RANKS; r++) rank_node[r] = r / PER_NODE;
  node_rank_of[INTRUDER] = 1; /* it claims node 1's place */
}

static void teardown(void) { pu_teardown(); }

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
  for (int i = 0; i < 1500 && h_tmp_count() > 0; i++) sleep_ms(10);
  h_expect_unpublished(rel);
}

TestSuite(peers, .init = setup, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------------ *
 * Ranks: the harness's scripted rank, pointed at its node's daemon
 * ------------------------------------------------------------------------ */
static shardd_save_opts cluster_opts(const char *save, const char *dir, uint64_t mss) {
  shardd_save_opts o = {.save = save, .dir = dir, .world_size = WORLD, .max_shard_size = mss, .nnodes = NODES,
                        .leader = N[0].addr};
  return o;
}

/* ------------------------------------------------------------------------ *
 * Bytes written where they are held versus forwarded, per daemon
 * ------------------------------------------------------------------------ */
typedef struct {
  uint64_t local, fwd, recv;
} totals;

static totals node_totals(int i) {
  json_t *st = node_status(i);
  json_t *p = json_object_get(st, "peers");
  totals t = {(uint64_t)json_integer_value(json_object_get(p, "bytes_local")),
              (uint64_t)json_integer_value(json_object_get(p, "bytes_forwarded")),
              (uint64_t)json_integer_value(json_object_get(p, "bytes_received"))};
  cr_assert_not_null(json_object_get(p, "bytes_forwarded"), "status lacks peers.bytes_forwarded");
  json_decref(st);
  return t;
}

static totals report(const char *layout, uint64_t data_bytes) {
  totals sum = {0, 0, 0};
  char per[256] = "";
  size_t k = 0;
  for (int i = 0; i < NODES; i++) {
    totals t = node_totals(i);
    sum.local += t.local;
    sum.fwd += t.fwd;
    sum.recv += t.recv;
    k += (size_t)snprintf(per + k, sizeof per - k, "%s node%d %llu/%llu", i ? "," : "", i,
                          (unsigned long long)t.local, (unsigned long long)t.fwd);
  }
  printf("peers layout %-10s data %9llu B: written where held %9llu B, forwarded %9llu B (received %llu);%s "
         "(local/forwarded)\n",
         layout, (unsigned long long)data_bytes, (unsigned long long)sum.local, (unsigned long long)sum.fwd,
         (unsigned long long)sum.recv, per);
  fflush(stdout);
  cr_assert_eq(sum.fwd, sum.recv, "every forwarded byte is received once");
  cr_assert_eq(sum.local + sum.fwd, data_bytes, "every tensor byte is written exactly once");
  return sum;
}

static uint64_t ckpt_data(const char *rel) {
  sd_ckpt c;
  h_ckpt_read(rel, &c);
  uint64_t n = c.total_size;
  sd_ckpt_free(&c);
  return n;
}

#define BOX2(r, nm, dt, s0, s1, a0, a1, c0, c1)                                                          \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}}
#define IBOX2(r, nm, dt, s0, s1, a0, a1, c0, c1, ix)                                                     \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}, .has_index = 1, .index = (ix)}

/* ------------------------------------------------------------------------ *
 * Layouts
 * ------------------------------------------------------------------------ */
/* Six small layers, node n holding layers 2n and 2n+1 (each split by rows between its two ranks). */
static void pipeline_puts(h_put puts[12]) {
  static char names[6][32];
  for (int L = 0; L < 6; L++) {
    snprintf(names[L], sizeof names[L], "layers.%d.w", L);
    int r = (L / 2) * 2;
    puts[2 * L] = (h_put)IBOX2(r, names[L], "F32", 8, 16, 0, 0, 4, 16, L);
    puts[2 * L + 1] = (h_put)IBOX2(r + 1, names[L], "F32", 8, 16, 4, 0, 4, 16, L);
  }
}

/* Pipeline parallel: node n holds layers 2n and 2n+1 (each split by rows
 * between its two ranks); a shard holds exactly two layers, so every file
 * is written by the node that holds it and nothing crosses the network. */
Test(peers, pipeline_layout_writes_every_file_locally) {
  static h_put puts[12];
  pipeline_puts(puts);
  h_script s = {.opts = cluster_opts("pipe", "ck/pipe", 1024), .puts = puts, .nputs = 12, .seed = 41};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[0].res.files, 4, "3 shards and the index");
  totals t = report("pipeline", ckpt_data("ck/pipe"));
  cr_assert_eq(t.fwd, 0, "a pipeline layout forwards nothing (%llu bytes were)", (unsigned long long)t.fwd);
  for (int i = 0; i < NODES; i++) cr_assert_eq(node_totals(i).local, 1024, "node %d writes its two layers", i);
  h_shared_free(s.sh);
}

/* The leader's own files (the artifacts, the index) go through its writer
 * as a publish's do: every byte, an unaligned tail cut back, an empty one. */
Test(peers, the_leaders_own_files_are_whole) {
  static h_put puts[12];
  pipeline_puts(puts);
  static char cfg[5001];
  for (size_t i = 0; i < sizeof cfg; i++) cfg[i] = (char)('a' + i % 26);
  const h_file files[] = {
      {.rank = -1, .path = "config.json", .data = cfg, .len = sizeof cfg},
      {.rank = 3, .path = "empty.txt", .data = "", .len = 0},
  };
  h_script s = {.opts = cluster_opts("own", "ck/own", 1024), .puts = puts, .nputs = 12, .files = files,
                .nfiles = 2, .seed = 43};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  char p[PATH_MAX];
  struct stat st;
  cr_assert_eq(stat(h_path(p, sizeof p, "ck/own/empty.txt"), &st), 0, "%s: %s", p, strerror(errno));
  cr_assert_eq(st.st_size, 0);
  int fd = open(h_path(p, sizeof p, "ck/own/config.json"), O_RDONLY);
  cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
  static char got[sizeof cfg + 1];
  ssize_t n = read(fd, got, sizeof got);
  close(fd);
  cr_assert_eq(n, (ssize_t)sizeof cfg, "config.json holds %zd bytes", n);
  cr_assert_eq(memcmp(got, cfg, sizeof cfg), 0, "config.json's bytes differ");
  cr_assert(h_exists(h_path(p, sizeof p, "ck/own/model.safetensors.index.json")), "no index");
  h_shared_free(s.sh);
}

/* The same layout, larger: each node's file is wholly its own bytes, so it
 * goes the single-node way, staged by the copy workers and written with
 * O_DIRECT (where the file system takes it), in the writer's counters. */
static uint64_t metric(int i, const char *name) {
  json_t *st = node_status(i);
  json_t *v = json_object_get(json_object_get(st, "metrics"), name);
  cr_assert(json_is_integer(v), "node %d: metrics lack %s", i, name);
  uint64_t n = (uint64_t)json_integer_value(v);
  json_decref(st);
  return n;
}

static void own_files_staged(const char *mode, const char *save, const char *dir, uint64_t seed) {
  static h_put puts[12];
  static char names[6][32];
  for (int L = 0; L < 6; L++) {
    snprintf(names[L], sizeof names[L], "layers.%d.w", L);
    int r = (L / 2) * 2;
    puts[2 * L] = (h_put)IBOX2(r, names[L], "F32", 512, 512, 0, 0, 256, 512, L);
    puts[2 * L + 1] = (h_put)IBOX2(r + 1, names[L], "F32", 512, 512, 256, 0, 256, 512, L);
  }
  uint64_t before[NODES], direct0[NODES];
  for (int i = 0; i < NODES; i++) {
    before[i] = metric(i, "copy_trips");
    direct0[i] = metric(i, "write_bytes_odirect") + metric(i, "write_bytes_buffered");
  }
  h_script s = {.opts = cluster_opts(save, dir, 2u << 20), .puts = puts, .nputs = 12, .seed = seed};
  s.opts.write_mode = mode;
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  totals t = report(save, ckpt_data(dir));
  cr_assert_eq(t.fwd, 0);
  char probe[4096];
  h_path(probe, sizeof probe, ".direct-probe");
  int fd = open(probe, O_CREAT | O_WRONLY | O_DIRECT, 0600);
  int direct = fd >= 0;
  if (fd >= 0) close(fd);
  unlink(probe);
  for (int i = 0; i < NODES; i++) {
    uint64_t trips = metric(i, "copy_trips") - before[i];
    cr_assert_geq(trips, 1, "node %d staged nothing", i);
    uint64_t bytes = metric(i, "write_bytes_odirect") + metric(i, "write_bytes_buffered") - direct0[i];
    cr_assert_geq(bytes, 2u << 20, "node %d's writer took %llu bytes for its 2 MiB file", i, (unsigned long long)bytes);
    if (direct)
      cr_assert_geq(metric(i, "write_bytes_odirect"), 2u << 20, "node %d wrote its file without O_DIRECT", i);
  }
  h_shared_free(s.sh);
}

Test(peers, a_nodes_own_files_go_through_the_staged_writer) { own_files_staged("owner", "pipe-big", "ck/pipe-big", 44); }
Test(peers, a_nodes_own_files_go_through_the_staged_writer_shared_mode) {
  own_files_staged("shared", "pipe-shared", "ck/pipe-shared", 45);
}

/* One file, mostly node 0's: its own blocks go direct through staging on
 * that node, the last block (node 0's tail beside the small tensors the
 * other nodes forward) through the page cache; the bytes are whole. */
Test(peers, a_file_mixing_own_and_forwarded_bytes_goes_direct_where_it_can) {
  static const h_put puts[] = {
      BOX2(0, "big.w", "F32", 1024, 1024, 0, 0, 512, 1024), BOX2(1, "big.w", "F32", 1024, 1024, 512, 0, 512, 1024),
      BOX2(2, "small.w", "F32", 4, 16, 0, 0, 2, 16),        BOX2(4, "small.w", "F32", 4, 16, 2, 0, 2, 16),
      BOX2(3, "tiny.w", "F32", 2, 16, 0, 0, 1, 16),         BOX2(5, "tiny.w", "F32", 2, 16, 1, 0, 1, 16),
  };
  uint64_t direct0 = metric(0, "write_bytes_odirect"), buffered0 = metric(0, "write_bytes_buffered");
  h_script s = {.opts = cluster_opts("mixed", "ck/mixed", 64u << 20), .puts = puts,
                .nputs = sizeof puts / sizeof puts[0], .seed = 46};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  totals t = report("mixed", ckpt_data("ck/mixed"));
  cr_assert_gt(t.fwd, 0, "the small tensors are forwarded to node 0");
  uint64_t direct = metric(0, "write_bytes_odirect") - direct0, buffered = metric(0, "write_bytes_buffered") - buffered0;
  cr_assert_gt(buffered, 0, "node 0 wrote the shared last block through the page cache");
  char probe[4096];
  h_path(probe, sizeof probe, ".direct-probe");
  int fd = open(probe, O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd >= 0) {
    close(fd);
    cr_assert_geq(direct, 4u << 20, "node 0 wrote %llu bytes direct of its 4 MiB of own blocks",
                  (unsigned long long)direct);
  }
  unlink(probe);
  h_shared_free(s.sh);
}

/* Tensor parallel across nodes: every tensor is split over all six ranks
 * (rows, columns, an inner dimension of a 3-d tensor, uneven rows), so each
 * file gathers bytes from three nodes and two thirds of it is forwarded. */
static const h_put split_puts[] = {
    BOX2(0, "embed.weight", "F32", 12, 8, 0, 0, 2, 8),  BOX2(1, "embed.weight", "F32", 12, 8, 2, 0, 2, 8),
    BOX2(2, "embed.weight", "F32", 12, 8, 4, 0, 2, 8),  BOX2(3, "embed.weight", "F32", 12, 8, 6, 0, 2, 8),
    BOX2(4, "embed.weight", "F32", 12, 8, 8, 0, 2, 8),  BOX2(5, "embed.weight", "F32", 12, 8, 10, 0, 2, 8),
    BOX2(0, "proj.weight", "BF16", 6, 12, 0, 0, 6, 2),  BOX2(1, "proj.weight", "BF16", 6, 12, 0, 2, 6, 2),
    BOX2(2, "proj.weight", "BF16", 6, 12, 0, 4, 6, 2),  BOX2(3, "proj.weight", "BF16", 6, 12, 0, 6, 6, 2),
    BOX2(4, "proj.weight", "BF16", 6, 12, 0, 8, 6, 2),  BOX2(5, "proj.weight", "BF16", 6, 12, 0, 10, 6, 2),
    {.rank = 0, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {2, 6, 4}, .boxed = 1, .start = {0, 0, 0},
     .count = {2, 2, 4}},
    {.rank = 2, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {2, 6, 4}, .boxed = 1, .start = {0, 2, 0},
     .count = {2, 3, 4}},
    {.rank = 5, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {2, 6, 4}, .boxed = 1, .start = {0, 5, 0},
     .count = {2, 1, 4}},
    BOX2(0, "lm_head.weight", "F32", 6, 10, 0, 0, 3, 10), BOX2(3, "lm_head.weight", "F32", 6, 10, 3, 0, 2, 10),
    BOX2(5, "lm_head.weight", "F32", 6, 10, 5, 0, 1, 10),
};

Test(peers, split_tensors_are_forwarded_to_the_file_owner) {
  h_script s = {.opts = cluster_opts("split", "ck/split", 400), .puts = split_puts,
                .nputs = sizeof split_puts / sizeof split_puts[0], .seed = 42};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  uint64_t data = ckpt_data("ck/split");
  totals t = report("split", data);
  cr_assert_gt(t.fwd, 0, "slices of other nodes' files must be forwarded");
  /* Files that take other nodes' bytes go through the page cache, in the same writer counters. */
  uint64_t counted = 0;
  for (int i = 0; i < NODES; i++) counted += metric(i, "write_bytes_buffered") + metric(i, "write_bytes_odirect");
  cr_assert_geq(counted, data, "the writers counted %llu of %llu bytes", (unsigned long long)counted,
                (unsigned long long)data);
  /* The leader records who began the save, as a one-node save does (test_perms.c). */
  char p[PATH_MAX], v[32] = "";
  ssize_t n = getxattr(h_path(p, sizeof p, "ck/split"), "user.shardd.owner", v, sizeof v - 1);
  cr_assert(n > 0, "ck/split has no user.shardd.owner: %s", strerror(errno));
  v[n] = 0;
  cr_assert_eq(strtoul(v, NULL, 10), (unsigned long)getuid(), "owner %s, ranks run as uid %u", v, (unsigned)getuid());
  h_shared_free(s.sh);
}

/* The same layout in shared mode: every node writes its slices in place. */
Test(peers, shared_write_mode_forwards_nothing) {
  h_script s = {.opts = cluster_opts("shared", "ck/shared", 400), .puts = split_puts,
                .nputs = sizeof split_puts / sizeof split_puts[0], .seed = 43};
  s.opts.write_mode = "shared";
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  totals t = report("shared", ckpt_data("ck/shared"));
  cr_assert_eq(t.fwd, 0);
  h_shared_free(s.sh);
}

/* Uneven splits across two of the daemons (4 ranks): node 1 holds nothing
 * of the router but declares it, rank 3 puts only empty boxes and has no
 * arena; small shards so that files land on both nodes. */
static const h_put empty_puts[] = {
    BOX2(0, "router.weight", "BF16", 2, 6, 0, 0, 1, 6), BOX2(1, "router.weight", "BF16", 2, 6, 1, 0, 1, 6),
    BOX2(2, "router.weight", "BF16", 2, 6, 2, 0, 0, 6), BOX2(3, "router.weight", "BF16", 2, 6, 2, 0, 0, 6),
    {.rank = 0, .name = "bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {0}, .count = {1}},
    {.rank = 1, .name = "bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {1}, .count = {1}},
    {.rank = 2, .name = "bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {2}, .count = {1},
     .how = H_INLINE},
    {.rank = 3, .name = "bias", .dtype = "F32", .ndim = 1, .shape = {3}, .boxed = 1, .start = {3}, .count = {0}},
    BOX2(1, "cols", "F32", 5, 2, 0, 0, 5, 1), BOX2(2, "cols", "F32", 5, 2, 0, 1, 5, 1),
    BOX2(3, "cols", "F32", 5, 2, 0, 2, 5, 0),
    BOX2(2, "big", "F32", 16, 8, 0, 0, 16, 8), BOX2(0, "big", "F32", 16, 8, 16, 0, 0, 8),
    BOX2(1, "big", "F32", 16, 8, 0, 3, 9, 0), BOX2(3, "big", "F32", 16, 8, 7, 0, 0, 8),
};

static void run_empty(const char *save, const char *mode) {
  h_script s = {.opts = cluster_opts(save, save, 128), .puts = empty_puts,
                .nputs = sizeof empty_puts / sizeof empty_puts[0], .seed = 47, .arena_if_bytes = 1};
  s.opts.nnodes = 2;
  s.opts.world_size = 2 * PER_NODE;
  s.opts.write_mode = mode;
  run_ranks(&s);
  for (int r = 0; r < 4; r++) cr_assert_eq(s.sh->r[r].rc, 0, "rank %d %s: %s", r, s.sh->r[r].step, s.sh->r[r].msg);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[3].shm[0], 0, "rank 3 created no arena");
  totals t = report(mode, ckpt_data(save));
  if (!strcmp(mode, "shared")) cr_assert_eq(t.fwd, 0);
  h_shared_free(s.sh);
}

Test(peers, empty_slices_across_two_nodes_owner_mode) { run_empty("empty-owner", "owner"); }

Test(peers, empty_slices_across_two_nodes_shared_mode) { run_empty("empty-shared", "shared"); }

/* Data parallel across nodes: every node holds a whole replica (split by
 * rows between its ranks), a norm sits on every rank, one tensor only on
 * nodes 0 and 1, one only on node 2. Replicas are written once, by a node
 * holding them whenever there is one. */
Test(peers, replicas_across_nodes_are_written_once_where_held) {
  static h_put puts[32];
  size_t n = 0;
  for (int node = 0; node < NODES; node++) {
    puts[n++] = (h_put)BOX2(2 * node, "w", "F32", 8, 8, 0, 0, 4, 8);
    puts[n++] = (h_put)BOX2(2 * node + 1, "w", "F32", 8, 8, 4, 0, 4, 8);
  }
  puts[n++] = (h_put){.rank = -1, .name = "norm", .dtype = "F32", .ndim = 1, .shape = {16}};
  puts[n++] = (h_put){.rank = 0, .name = "x", .dtype = "F32", .ndim = 2, .shape = {4, 4}};
  puts[n++] = (h_put){.rank = 2, .name = "x", .dtype = "F32", .ndim = 2, .shape = {4, 4}, .how = H_INLINE};
  puts[n++] = (h_put){.rank = 4, .name = "y", .dtype = "F32", .ndim = 2, .shape = {4, 4}, .how = H_COPY};
  h_script s = {.opts = cluster_opts("dp", "ck/dp", 300), .puts = puts, .nputs = n, .seed = 44};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  uint64_t data = ckpt_data("ck/dp");
  cr_assert_eq(data, 256 + 64 + 64 + 64, "every replica is written once (%llu bytes)", (unsigned long long)data);
  totals t = report("replicas", data);
  /* Only the file holding x (nodes 0, 1) and y (node 2) has bytes no single node holds. */
  cr_assert_leq(t.fwd, 64, "%llu bytes forwarded", (unsigned long long)t.fwd);
  h_shared_free(s.sh);
}

/* A larger save: 48 MiB split by rows over six ranks' shared memory,
 * streamed in windows; two saves in flight across the cluster at once. */
Test(peers, large_forwarded_save_and_two_in_flight) {
  static const h_put big[] = {
      BOX2(0, "big", "BF16", 3072, 4096, 0, 0, 512, 4096),    BOX2(1, "big", "BF16", 3072, 4096, 512, 0, 512, 4096),
      BOX2(2, "big", "BF16", 3072, 4096, 1024, 0, 512, 4096), BOX2(3, "big", "BF16", 3072, 4096, 1536, 0, 512, 4096),
      BOX2(4, "big", "BF16", 3072, 4096, 2048, 0, 512, 4096), BOX2(5, "big", "BF16", 3072, 4096, 2560, 0, 512, 4096),
  };
  h_script a = {.opts = cluster_opts("big", "ck/big", 0), .puts = big, .nputs = 6, .seed = 45};
  h_script b = {.opts = cluster_opts("side", "ck/side", 400), .puts = split_puts,
                .nputs = sizeof split_puts / sizeof split_puts[0], .seed = 46};
  pid_t pa[H_MAX_RANKS], pb[H_MAX_RANKS];
  double t0 = now_s();
  start_ranks(&a, pa);
  start_ranks(&b, pb);
  h_reap_all(&a, pa);
  h_reap_all(&b, pb);
  double secs = now_s() - t0;
  h_expect_committed(&a);
  h_expect_committed(&b);
  h_check_script(&a);
  h_check_script(&b);
  uint64_t data = ckpt_data("ck/big") + ckpt_data("ck/side");
  totals t = report("large+side", data);
  printf("peers large save: %.1f MiB in %.2f s end to end (ranks included)\n", (double)data / 1048576.0, secs);
  cr_assert_gt(t.fwd, 16u << 20);
  h_shared_free(a.sh);
  h_shared_free(b.sh);
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
  sleep_ms(200); /* let their manifests reach the leader */
  double t0 = now_s();
  kill_node(victim, sig);
  if (late != victim && sig == SIGSTOP) {
    /* The late ranks seal now: the leader plans, and the frozen node never answers. */
  }
  h_signal(s.sh, C_GO);
  /* Survivors' waits must end on their own; the late ranks of a dead daemon fail too. */
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    int st = h_reap(pids[r]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
  double secs = now_s() - t0;
  if (sig == SIGSTOP) kill_node(victim, SIGKILL);
  for (int r = 0; r < WORLD; r++)
    if (rank_node[r] == victim) h_reap(pids[r]);
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    const h_result *x = &s.sh->r[r];
    int got = x->waited ? x->wrc : x->rc;
    const char *msg = x->waited ? x->wmsg : x->msg;
    cr_assert_eq(got, SHARDD_E_PEER_LOST, "rank %d (node %d): expected peer_lost, got %s: %s", r, rank_node[r],
                 shardd_err_name(got), msg);
    cr_assert(strstr(msg, needle), "rank %d: '%s' does not name '%s'", r, msg, needle);
  }
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

/* Kill -9 while files are being written: node `frozen`'s ranks seal first
 * and its daemon is stopped (SIGSTOP), so the save cannot finish; once
 * `observer` reports its part "writing", `victim` gets SIGKILL and the frozen
 * node resumes. Every surviving rank must get peer_lost naming `needle`. */
static void lose_during_writing(const char *save, int frozen, int victim, int observer, const char *needle) {
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
  sleep_ms(200); /* their manifest reaches the leader */
  kill_node(frozen, SIGSTOP);
  h_signal(s.sh, C_GO);
  /* The leader plans and assigns; the observer starts writing and waits for the frozen node. */
  for (int i = 0; i < 3000; i++) {
    save_state(observer, save, state, sizeof state);
    if (!strcmp(state, "writing") || !state[0]) break;
    sleep_ms(10);
  }
  cr_assert_str_eq(state, "writing", "node %d never started writing save '%s'", observer, save);
  double t0 = now_s();
  kill_node(victim, SIGKILL);
  if (frozen != victim) kill(N[frozen].d.pid, SIGCONT);
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    int st = h_reap(pids[r]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: 0x%x", r, st);
  }
  double secs = now_s() - t0;
  for (int r = 0; r < WORLD; r++)
    if (rank_node[r] == victim) h_reap(pids[r]);
  for (int r = 0; r < WORLD; r++) {
    if (rank_node[r] == victim) continue;
    const h_result *x = &s.sh->r[r];
    int got = x->waited ? x->wrc : x->rc;
    const char *msg = x->waited ? x->wmsg : x->msg;
    cr_assert_eq(got, SHARDD_E_PEER_LOST, "rank %d (node %d): expected peer_lost, got %s: %s", r, rank_node[r],
                 shardd_err_name(got), msg);
    cr_assert(strstr(msg, needle), "rank %d: '%s' does not name '%s'", r, msg, needle);
  }
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
  send_frame(fd, "{\"t\":\"hello\",\"v\":2,\"node\":\"future\",\"nonce\":"
                 "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}");
  json_t *e = read_frame(fd);
  cr_assert_not_null(e, "no reply before the close");
  cr_assert_str_eq(json_string_value(json_object_get(e, "t")), "error");
  cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unsupported_proto");
  cr_assert(strstr(json_string_value(json_object_get(e, "message")), "version 2"), "%s",
            json_string_value(json_object_get(e, "message")));
  json_decref(e);
  cr_assert_null(read_frame(fd), "the connection must be closed");
  close(fd);
  cr_assert(log_has(0, "peer protocol version 2 is not supported"));

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
