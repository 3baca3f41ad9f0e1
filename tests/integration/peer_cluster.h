/* The three-daemon cluster test_peers.c and test_peer_faults.c share: one root, one token, two ranks a node. */
#ifndef SD_IT_PEER_CLUSTER_H
#define SD_IT_PEER_CLUSTER_H

#include <limits.h>

#include "shardd/shardd.h"

#define NODES 3
#define PER_NODE 2
#define WORLD (NODES * PER_NODE)
#define INTRUDER NODES /* a 4th daemon, started by the wrong-token test with another secret */

/* The secret the nodes share, and one they do not (PATH_MAX: under H.base). */
extern char token_path[PATH_MAX], bad_token_path[PATH_MAX];

/* Criterion .init: NODES daemons on loopback with token_path, the harness pointed at node 0, ranks
 * PER_NODE a node, INTRUDER claiming node 1's place. */
void pc_setup(void);
void pc_teardown(void);
/* A save over every node, led by node 0. */
shardd_save_opts cluster_opts(const char *save, const char *dir, uint64_t mss);

/* A 2-d slice of a tensor (s0 x s1) at (a0, a1), (c0 x c1) big; IBOX2 with its index in the plan. */
#define BOX2(r, nm, dt, s0, s1, a0, a1, c0, c1)                                                          \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}}
#define IBOX2(r, nm, dt, s0, s1, a0, a1, c0, c1, ix)                                                     \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}, .has_index = 1, .index = (ix)}

#endif
