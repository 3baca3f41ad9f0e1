/* Multi-node saves: the begin fields, hooks the save state machine calls, status; see proto/PEERS.md. */
#ifndef SD_CLUSTER_H
#define SD_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

#include "config.h"
#include "save.h"
#include "sd_error.h"

/* Daemon-wide: the peer network, the writer ring, the saves this daemon leads. */
typedef struct sd_cluster sd_cluster;

/* Starts peer networking when --peer-listen is set (otherwise a no-op that
 * leaves d->cluster NULL, and multi-node begins are refused). */
int sd_cluster_init(struct sd_daemon *d, sd_error *err);
/* Closes listener and connections; saves were failed before. */
void sd_cluster_shutdown(struct sd_daemon *d);
/* Startup cleanup of temporary folders. Without peers: every stale one under
 * the root. With peers the root is shared, so only folders this node created
 * (their name carries the node name) are removed. */
int sd_cluster_cleanup_stale(const sd_config *cfg, int root_fd, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Hooks for save.c and ops.c. A save with nnodes > 1 carries save->cl.
 * ------------------------------------------------------------------------ */
/* begin's optional nnodes, node_rank, leader, write_mode into the args. */
int sd_cluster_parse_begin(const json_t *req, sd_begin_args *a, sd_error *err);
/* A new save with nnodes > 1: joins the leader (or leads). */
int sd_cluster_begin_new(struct sd_save *save, const sd_begin_args *a, sd_error *err);
/* A joining rank must agree on nnodes, node_rank, leader and write_mode. */
int sd_cluster_begin_check(const struct sd_save *save, const sd_begin_args *a, sd_error *err);
/* A rank sealed: its slice descriptions go to the leader. */
void sd_cluster_sealed(struct sd_save *save);
/* The save failed (save->err is set): tells the leader, stops the writes.
 * Returns 1 when writes are still in flight; the save is then finished
 * (sd_save_finish) once they stop. */
int sd_cluster_fail(struct sd_save *save);
void sd_cluster_save_free(struct sd_save *save);
/* What `wait` reports for a committed multi-node save. */
void sd_cluster_result(const struct sd_save *save, uint64_t *files, uint64_t *tensors, uint64_t *bytes);
uint64_t sd_cluster_bytes_written(const struct sd_save *save);
/* Bytes of this node's slices streamed to other nodes, for the summary line. */
uint64_t sd_cluster_bytes_forwarded(const struct sd_save *save);
/* Extra fields of a save's status entry, and the daemon's "peers" object. */
void sd_cluster_status_save(const struct sd_save *save, json_t *entry);
void sd_cluster_status(struct sd_daemon *d, json_t *reply);

#endif
