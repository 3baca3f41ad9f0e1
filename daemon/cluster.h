/* Multi-node saves: the begin fields, the hooks a multi-node save carries, status; see proto/PEERS.md. */
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
/* Start-up: takes the root (sd_root_lock: the whole root without peers, the
 * node name with them; refused with conflict naming the holder's pid), then
 * removes stale temporary folders, each logged. Without peers: every one
 * under the root. With peers the root is shared, so only folders this node
 * created (their name carries the node name) are removed. A failed sweep is
 * logged, not fatal. *lock_fd stays open for the daemon's life. */
int sd_cluster_claim_root(const sd_config *cfg, int root_fd, int *lock_fd, sd_error *err);

/* ------------------------------------------------------------------------ *
 * For main and ops.c. A save with nnodes > 1 carries save->cl.
 * ------------------------------------------------------------------------ */
/* begin's optional nnodes, node_rank, leader, write_mode into the args. */
int sd_cluster_parse_begin(const json_t *req, sd_begin_args *a, sd_error *err);
/* What a save with nnodes > 1 is extended with (main puts it in sd_daemon). */
extern const sd_save_ext_ops sd_cluster_save_ext;
/* 1 when this daemon leads save (or the save spans one node): the leader
 * alone publishes, so it alone runs what follows a commit (keep_last). */
int sd_cluster_save_leads(const struct sd_save *save);
/* Extra fields of a save's status entry, and the daemon's "peers" object. */
void sd_cluster_status_save(const struct sd_save *save, json_t *entry);
void sd_cluster_status(struct sd_daemon *d, json_t *reply);

#endif
