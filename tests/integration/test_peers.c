/* Multi-node saves: 3 daemons on loopback sharing one root, 2 real rank processes each; the layouts and where their bytes go. */
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
  cr_assert_eq(h_check_sums("ck/pipe", 1), 3);
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
  s.opts.total_parameters = 700; /* the ranks' own count (of 768 elements), carried in the joins */
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
  json_error_t je;
  json_t *ix = json_load_file(h_path(p, sizeof p, "ck/own/model.safetensors.index.json"), 0, &je);
  cr_assert_not_null(ix, "no index: %s", je.text);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_parameters")), 700);
  json_decref(ix);
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
  cr_assert_geq(h_check_sums(dir, 1), 3, "every node's own file, hashed by its file set");
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
  /* one file: own regions, a mixed block and forwarded bytes, its checksum in its header */
  cr_assert_eq(h_check_sums("ck/mixed", 1), 1);
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
  cr_assert_gt(h_check_sums("ck/split", 1), 1);
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
  cr_assert_gt(h_check_sums("ck/shared", 1), 1);
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
  h_check_sums(save, 1);
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
  h_check_sums("ck/dp", 1);
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
  h_check_sums("ck/big", 1);
  h_check_sums("ck/side", 1);
  printf("peers large save: %.1f MiB in %.2f s end to end (ranks included)\n", (double)data / 1048576.0, secs);
  cr_assert_gt(t.fwd, 16u << 20);
  h_shared_free(a.sh);
  h_shared_free(b.sh);
}

/* ------------------------------------------------------------------------ *
 * Checksums: each node hashes the bytes it writes (its own blocks in its
 * file set, mixed blocks' pieces from its ranks' memory, forwarded bytes
 * from the frame they came in), the leader combines the shares
 * ------------------------------------------------------------------------ */
/* Columns and an inner dimension split over all six ranks, so every block
 * of those files mixes bytes of all three nodes; rows too, so owners also
 * have blocks of their own; an odd-sized tail. */
static const h_put inner_puts[] = {
    BOX2(0, "cols.w", "F32", 512, 768, 0, 0, 512, 128),   BOX2(1, "cols.w", "F32", 512, 768, 0, 128, 512, 128),
    BOX2(2, "cols.w", "F32", 512, 768, 0, 256, 512, 128), BOX2(3, "cols.w", "F32", 512, 768, 0, 384, 512, 128),
    BOX2(4, "cols.w", "F32", 512, 768, 0, 512, 512, 128), BOX2(5, "cols.w", "F32", 512, 768, 0, 640, 512, 128),
    BOX2(0, "rows.w", "BF16", 1536, 512, 0, 0, 256, 512),    BOX2(1, "rows.w", "BF16", 1536, 512, 256, 0, 256, 512),
    BOX2(2, "rows.w", "BF16", 1536, 512, 512, 0, 256, 512),  BOX2(3, "rows.w", "BF16", 1536, 512, 768, 0, 256, 512),
    BOX2(4, "rows.w", "BF16", 1536, 512, 1024, 0, 256, 512), BOX2(5, "rows.w", "BF16", 1536, 512, 1280, 0, 256, 512),
    {.rank = 0, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {4, 96, 64}, .boxed = 1, .start = {0, 0, 0},
     .count = {4, 40, 64}},
    {.rank = 3, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {4, 96, 64}, .boxed = 1, .start = {0, 40, 0},
     .count = {4, 33, 64}},
    {.rank = 4, .name = "mlp.w", .dtype = "F16", .ndim = 3, .shape = {4, 96, 64}, .boxed = 1, .start = {0, 73, 0},
     .count = {4, 23, 64}},
    BOX2(1, "tail", "U8", 3, 7, 0, 0, 1, 7),
    BOX2(2, "tail", "U8", 3, 7, 1, 0, 1, 7),
    BOX2(5, "tail", "U8", 3, 7, 2, 0, 1, 7),
};

static void inner_sums(const char *mode, const char *save, uint64_t mss, uint64_t seed) {
  h_script s = {.opts = cluster_opts(save, save, mss), .puts = inner_puts,
                .nputs = sizeof inner_puts / sizeof inner_puts[0], .seed = seed};
  s.opts.write_mode = mode;
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  totals t = report(save, ckpt_data(save));
  if (!strcmp(mode, "shared")) cr_assert_eq(t.fwd, 0);
  else cr_assert_gt(t.fwd, 0);
  size_t n = h_check_sums(save, 1);
  if (mss) cr_assert_geq(n, 3, "%zu shard files", n);
  else cr_assert_eq(n, 1, "one file: its checksum is in its header");
  h_shared_free(s.sh);
}

Test(peers, checksums_of_inner_splits_owner_mode) { inner_sums("owner", "sum-owner", 1u << 20, 51); }
Test(peers, checksums_of_inner_splits_shared_mode) { inner_sums("shared", "sum-shared", 1u << 20, 52); }
Test(peers, checksum_of_a_single_file_owner_mode) { inner_sums("owner", "sum-one", 0, 53); }
Test(peers, checksum_of_a_single_file_shared_mode) { inner_sums("shared", "sum-one-shared", 0, 54); }

/* The leader's setting decides: with its checksums off nothing is recorded,
 * though the other nodes have theirs on. */
Test(peers, the_leaders_checksums_off_records_none) {
  h_daemon_stop(&N[0].d);
  static const char *const off[] = {"--checksums=off", NULL};
  start_node_with(0, token_path, off);
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  h_sums_expected = 0;
  for (int k = 0; k < 2; k++) {
    const char *save = k ? "off-one" : "off-many";
    h_script s = {.opts = cluster_opts(save, save, k ? 0 : 1u << 20), .puts = inner_puts,
                  .nputs = sizeof inner_puts / sizeof inner_puts[0], .seed = 55 + (uint64_t)k};
    run_ranks(&s);
    h_expect_committed(&s);
    h_check_script(&s);
    h_check_sums(save, 0);
    h_shared_free(s.sh);
  }
  h_sums_expected = 1;
}

/* A raw peer client standing in for node 1 of two (shared mode, so it need
 * not forward): it joins save `save` into dir, begins its rank 1, describes
 * its row of w (its manifest saying "sums" when sums is set) and returns the
 * leader's assignment; rank 0 runs in a real process on node 0 (*pid). */
static json_t *fake_second_node(h_script *s, const char *save, const char *dir, int sums, int *fd, pid_t *pid) {
  static const h_put puts[] = {BOX2(0, "w", "F32", 2, 4, 0, 0, 1, 4)};
  *s = (h_script){.opts = cluster_opts(save, dir, 1u << 20), .puts = puts, .nputs = 1, .seed = 60};
  s->opts.nnodes = 2;
  s->opts.world_size = 2;
  s->opts.write_mode = "shared";
  s->sh = h_shared_new();
  *pid = h_fork(peer_rank, 0, s);
  h_await_begun(save, 1);
  *fd = tcp_connect(N[0].addr);
  peer_login(*fd, token_path, "fake1");
  const char *tok = "0123456789abcdef";
  char m[1024];
  snprintf(m, sizeof m,
           "{\"t\":\"join\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"nnodes\":2,\"world_size\":2,\"dir\":"
           "\"%s\",\"prefix\":\"model\",\"max_shard_size\":1048576,\"overwrite\":false,\"write_mode\":\"shared\","
           "\"metadata\":{},\"leader\":\"%s\",\"join_timeout\":30}",
           save, tok, dir, N[0].addr);
  send_frame(*fd, m);
  snprintf(m, sizeof m, "{\"t\":\"began\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"rank\":1}", save, tok);
  send_frame(*fd, m);
  /* Its table (w, F32 [2,4], declared by rank 1) and its box of it, row 1 (PEERS.md, manifest). */
  static const char table[] = "[[\"w\",\"F32\",[2,4],-1,1]]";
  char hex[65];
  table_digest(table, hex);
  snprintf(m, sizeof m,
           "{\"t\":\"manifest\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"ranks\":[1],\"table\":{\"n\":1,"
           "\"digest\":\"%s\"},\"boxes\":[[0,0,1,1,0,1,4]],\"files\":[]%s}",
           save, tok, hex, sums ? ",\"sums\":true" : "");
  send_frame(*fd, m);
  json_t *a = read_until(*fd, "assign", save, tok, table);
  cr_assert_not_null(a, "no assignment for the fake node");
  json_t *files = json_object_get(a, "files");
  cr_assert_eq(json_array_size(files), 1);
  json_int_t data = json_integer_value(json_object_get(json_array_get(files, 0), "data"));
  cr_assert_eq(data, 16, "its row of w");
  return a;
}

/* A node whose done carries a malformed checksum share: the leader fails
 * the save as a protocol error naming it, and nothing is published. */
Test(peers, a_malformed_checksum_share_fails_the_save_naming_the_node) {
  h_script s;
  int fd;
  pid_t pid;
  json_t *a = fake_second_node(&s, "badsum", "ck/badsum", 1, &fd, &pid);
  cr_assert(json_is_true(json_object_get(a, "checksums")), "the leader asks for checksums");
  char m[512];
  snprintf(m, sizeof m,
           "{\"t\":\"done\",\"save\":\"badsum\",\"node\":1,\"tok\":\"0123456789abcdef\",\"cid\":\"%s\","
           "\"files\":[[0,16]],\"sums\":[[0,\"not-hex!\"]]}",
           json_string_value(json_object_get(a, "cid")));
  json_decref(a);
  send_frame(fd, m);
  h_reap(pid);
  h_result *r = &s.sh->r[0];
  cr_assert(r->waited && r->wrc != 0, "rank 0's save must fail (%s %s)", r->step, r->msg);
  cr_assert(strstr(r->wmsg, "node 1 ('fake1'") && strstr(r->wmsg, "malformed checksum share"), "rank 0: %s", r->wmsg);
  cr_assert(log_has(0, "failed (protocol_error)"), "the leader fails it as a protocol error");
  /* the leader removes its folder once the rank has heard */
  h_await_no_tmp();
  h_expect_unpublished("ck/badsum");
  close(fd);
  h_shared_free(s.sh);
}

/* A node too old to hash what it writes (its manifest does not say "sums"):
 * the leader asks nobody for checksums, says which node it was, and the
 * save commits with its bytes, no checksum recorded. */
Test(peers, an_older_node_costs_the_checksums_not_the_save) {
  h_script s;
  int fd;
  pid_t pid;
  json_t *a = fake_second_node(&s, "oldnode", "ck/oldnode", 0, &fd, &pid);
  cr_assert_null(json_object_get(a, "checksums"), "the leader asks a node that cannot for checksums");
  /* shared mode: the node writes its own row, the file's last 16 bytes, into the leader's temporary file */
  json_t *f = json_array_get(json_object_get(a, "files"), 0);
  char path[PATH_MAX + 512];
  snprintf(path, sizeof path, "%s/ck/%s/%s", H.root, json_string_value(json_object_get(a, "tmp")),
           json_string_value(json_object_get(f, "name")));
  const float row[4] = {1.5f, -2.0f, 3.25f, 42.0f};
  int wfd = open(path, O_WRONLY);
  cr_assert(wfd >= 0, "open %s: %s", path, strerror(errno));
  cr_assert_eq(pwrite(wfd, row, sizeof row, json_integer_value(json_object_get(f, "size")) - (off_t)sizeof row),
               (ssize_t)sizeof row);
  cr_assert_eq(fsync(wfd), 0);
  close(wfd);
  char m[512];
  snprintf(m, sizeof m,
           "{\"t\":\"done\",\"save\":\"oldnode\",\"node\":1,\"tok\":\"0123456789abcdef\",\"cid\":\"%s\","
           "\"files\":[[0,16]]}",
           json_string_value(json_object_get(a, "cid")));
  json_decref(a);
  send_frame(fd, m);
  h_reap(pid);
  h_result *r = &s.sh->r[0];
  cr_assert(r->waited && r->wrc == 0, "rank 0's save must commit (%s %s %s)", r->step, r->msg, r->wmsg);
  cr_assert(log_has(0, "node 1 ('fake1') cannot hash what it writes"), "the leader says which node");
  h_check_sums("ck/oldnode", 0);
  /* its row is the one published, at the end of w, the file's last tensor */
  char got_path[PATH_MAX];
  float got[4] = {0};
  int rfd = open(h_path(got_path, sizeof got_path, "ck/oldnode/model.safetensors"), O_RDONLY);
  cr_assert(rfd >= 0, "open %s: %s", got_path, strerror(errno));
  off_t end = lseek(rfd, 0, SEEK_END);
  cr_assert_eq(pread(rfd, got, sizeof got, end - (off_t)sizeof got), (ssize_t)sizeof got);
  close(rfd);
  cr_assert_eq(memcmp(got, row, sizeof row), 0, "node 1's row in the published file");
  close(fd);
  h_shared_free(s.sh);
}
