/* Multi-node tests: daemons listening for peers on loopback, their ranks, and a raw peer-protocol client. */
#ifndef SD_IT_PEER_UTIL_H
#define SD_IT_PEER_UTIL_H

#include <jansson.h>

#include "harness.h"

#define PU_MAX_NODES 4

typedef struct {
  h_daemon d;
  char addr[64];           /* its peer listener, "127.0.0.1:PORT" */
} pu_node;

extern pu_node N[PU_MAX_NODES];
/* The node (index into N) each rank's daemon is. */
extern int rank_node[H_MAX_RANKS];
/* The node_rank the ranks on node i claim (i unless a test makes one an impostor). */
extern int node_rank_of[PU_MAX_NODES];

/* Empties N and resets node_rank_of. */
void pu_reset(void);
/* Criterion .init: pu_reset, and a scratch folder /tmp/shardd-TAG-XXXXXX in H (root, outside). */
void pu_scratch(const char *tag);
/* Criterion .fini: stops every node still running (asserting a clean exit), removes the scratch
 * folder unless H_KEEP is set. */
void pu_teardown(void);
void sleep_ms(int ms);
double now_s(void);
/* A token file, mode 0600. */
void write_token(const char *path, const char *secret);
json_t *node_status(int i);
/* Starts N[i] on H's root (socket and log in H.base) with peer timeout 2 s and debug logs; extra
 * (NULL-terminated, may be NULL) are more flags. Returns once it accepts; N[i].addr is set. */
void start_node(int i, const char *token);
void start_node_with(int i, const char *token, const char *const *extra);
/* The same with "K=V" entries (NULL-terminated, may be NULL) added to its environment. */
void start_node_env(int i, const char *token, const char *const *extra, const char *const *env);
int log_has(int i, const char *needle);
/* Waits (up to H_WAIT_MS, asserting) until node i has handed the leader's connection what n of its
 * ranks hold for save `save`: its debug log's "described K ranks to the leader" lines add up to n.
 * The frame is written at once if the connection is up, else when it comes up. */
void await_described(int i, const char *save, int n);

/* Ranks scripted by the harness, each pointed at its node's daemon (rank_node). */
void peer_rank(int idx, void *arg);
void start_ranks(h_script *s, pid_t *pids);
void run_ranks(h_script *s);

/* A raw TCP client of the peer port: connect (10 s receive timeout), frames out and in. */
int tcp_connect(const char *addr);
void send_frame(int fd, const char *json);
/* The next frame's header, or NULL once the daemon closed the connection. */
json_t *read_frame(int fd);
/* A stand-in node's tensor table (tensors: the JSON text of its entries, [name, dtype, shape,
 * index, rank] each, PEERS.md "manifest"): its digest in hex (65 bytes) as a manifest names it. */
void table_digest(const char *tensors, char *hex);
/* The table frame that answers the leader's send_table for it. */
void send_table(int fd, const char *save, const char *tok, const char *tensors);
/* Frames read until one of kind `kind` for save (returned), answering a send_table on the way with
 * the table `tensors`; NULL if the connection closed first. */
json_t *read_until(int fd, const char *kind, const char *save, const char *tok, const char *tensors);
/* The whole handshake as a connecting node named `name` that holds the secret in token_path. */
void peer_login(int fd, const char *token_path, const char *name);
/* The same as the side that was dialled (a stand-in leader): the daemon's hello, ours, its proof
 * (not checked), ours. */
void peer_accept_login(int fd, const char *token_path, const char *name);

#endif
