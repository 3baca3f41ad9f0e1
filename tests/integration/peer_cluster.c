/* The three-daemon cluster test_peers.c and test_peer_faults.c share: its start, its stop, a save over it. */
#include <stdio.h>

#include "harness.h"
#include "peer_cluster.h"
#include "peer_util.h"

char token_path[PATH_MAX], bad_token_path[PATH_MAX];

void pc_setup(void) {
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

void pc_teardown(void) { pu_teardown(); }

shardd_save_opts cluster_opts(const char *save, const char *dir, uint64_t mss) {
  shardd_save_opts o = {.save = save, .dir = dir, .world_size = WORLD, .max_shard_size = mss, .nnodes = NODES,
                        .leader = N[0].addr};
  return o;
}
