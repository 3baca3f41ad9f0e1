/* Private to the cluster's files (cluster.c, cluster_base.c, cluster_node.c, cluster_xfer*.c, and the leader's through cluster_lead_int.h): daemon-wide state, a node's part of a save, a leader's. */
#ifndef SD_CLUSTER_INT_H
#define SD_CLUSTER_INT_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "cluster_plan.h"
#include "daemon.h"
#include "peer.h"
#include "save.h"
#include "writer.h"

/* Forwarding: at most WINDOW unacknowledged bytes per (save, destination),
 * in frames of at most FRAME payload bytes and RUNS runs each. */
#define SD_FWD_WINDOW (8u << 20)
#define SD_FWD_FRAME (1u << 20)
#define SD_FWD_RUNS 512
/* A node's file is cut in blocks of this: those made only of its own bytes
 * are written with O_DIRECT (cluster_xfer.c), the others buffered. */
#define SD_XFER_BLOCK (1u << 20)
/* Local ring requests a save keeps in flight. */
#define SD_NODE_INFLIGHT 64
/* How often the leader checks its saves' join deadlines. */
#define SD_LEAD_TICK_MS 500
/* How long a failed save's id keeps answering late joins. */
#define SD_LEAD_FORGET_FACTOR 2

struct sd_lead;

/* Named here as cluster.h names it: this header leaves the cluster's public face to those above. */
typedef struct sd_cluster sd_cluster;

/* A multi-node save that failed here: its id answers late ranks for a while. */
typedef struct sd_cfailed {
  struct sd_cfailed *next;
  char *id;
  uint8_t *began;          /* per rank: it was part of the failed attempt */
  uint32_t world_size;
  sd_error err;
  uint64_t until;          /* loop time in ms */
} sd_cfailed;

typedef struct sd_lmsg {
  json_t *hdr;
  uint8_t *payload;
  size_t plen;
  int to_lead;             /* 1: node 0's participant to this daemon's leader; 0: the reverse */
  struct sd_lmsg *next;
} sd_lmsg;

struct sd_cluster {
  sd_daemon *d;
  sd_peer_net *net;
  char node[SD_PEER_NAME_MAX + 1];
  char tmp_tag[SD_PEER_NAME_MAX + 32]; /* ".shardd-tmp-@NODE@": what this node's temporary folders start with */
  struct sd_lead *leads;   /* saves this daemon leads, and recently failed ones */
  sd_cfailed *failed;         /* multi-node saves that failed on this node, recently */
  sd_lmsg *lq, **lqtail;      /* messages between this daemon's participant and leader */
  uv_idle_t lq_idle;
  uv_idle_cb lq_drain;     /* delivers the queue (cluster.c) */
  int lq_active;
  uv_timer_t lead_timer;   /* the leader's join deadlines (sd_lead_tick) */
  int shutting, idle_closed; /* idle_closed: of lq_idle and lead_timer, how many are closed */
  uint64_t tmp_counter;
  /* totals since start */
  uint64_t bytes_local, bytes_fwd, bytes_recv, saves_led;
};

/* ------------------------------------------------------------------------ *
 * A node's part of a multi-node save (save->cl)
 * ------------------------------------------------------------------------ */
typedef struct {
  sd_save_tensor *t;
  sd_slice *sl;
} sd_cslice_ref;

/* A box this node described to the leader (its id is its place in cs->boxes): the boxes of its
 * ranks that meet end to end along dim 0 merged into one, replicas among them left out. Its
 * members (cs->slices[first .. first + n)) each map their own bytes when the assignment comes. */
typedef struct {
  uint32_t first, n;
  uint64_t len;
} sd_cbox;

/* A tensor table this node described (one per manifest): the leader asks for it by digest only
 * when it has no table of that digest yet. */
typedef struct {
  uint8_t digest[SD_CTABLE_DIGEST];
  sd_save_tensor **t;
  size_t n;
} sd_ctable;

/* Manifest frames hold at most this many boxes, table frames this many tensors (PEERS.md, "Frame
 * sizes"): a leader parses and drops each before the next, whatever the model. */
#define SD_MANIFEST_BOXES 8192
/* A merged box is made of at most this many of its ranks' boxes (its parts). */
#define SD_MERGE_MAX SD_CPARTS_MAX
#define SD_TABLE_TENSORS 1024

typedef struct {
  uint32_t f;              /* the plan's file index */
  char *name;
  uint64_t size, hdr_len, data;  /* header bytes and data bytes this node writes into it */
  uint64_t done;           /* of hdr_len + data */
  int sync;                /* 0 not yet, 1 queued, 2 durable */
  uint8_t *own;            /* per block of SD_XFER_BLOCK, 1: only this node's bytes, staged and written
                            * with O_DIRECT (cluster_xfer.c); NULL when none is */
} sd_cfile;

typedef struct {
  uint32_t lf;             /* into files[] */
  uint64_t off;
  const uint8_t *src;
  uint64_t len;
  uint32_t before;         /* checksums on: the CRC-32C register of its bytes read before its write */
} sd_lop;

typedef struct {
  uint32_t f;              /* the plan's file index, as the receiver knows it */
  uint64_t off;
  const uint8_t *src;
  uint64_t len;
} sd_fop;

typedef struct {
  uint32_t node;
  char addr[SD_PEER_ADDR_MAX];
  char name[SD_PEER_NAME_MAX + 1];
  sd_peer *peer;
  sd_fop *runs;
  size_t nruns, cap, next;
  uint64_t next_off;       /* progress inside runs[next] */
  uint64_t total, sent, acked;
} sd_cdest;

typedef struct sd_rbuf {
  struct sd_csave *cs;
  uint64_t peer_id;        /* acks go back on the connection it came from */
  uint32_t from;
  json_t *hdr;
  uint8_t *data;
  size_t len;
  unsigned refs;
  size_t run_next;         /* its first run not yet handed to the ring (every file descriptor was busy) */
  uint64_t run_pos;        /* ... where that run's bytes start in data */
  struct sd_rbuf *next;
} sd_rbuf;

typedef enum { SD_CP_OPEN, SD_CP_WRITING, SD_CP_DONE_SENT } sd_cphase;

typedef struct sd_csave {
  sd_save *save;
  sd_cluster *cl;
  uint32_t nnodes, node_rank;
  char leader[SD_PEER_ADDR_MAX];
  sd_write_mode mode;
  int is_leader;
  char tok[17];            /* ours, random: the leader echoes it so stale messages are dropped */
  char cid[17];            /* the leader's id for this attempt, from assign */
  sd_peer *link;           /* to the leader; NULL when this daemon leads */
  uint8_t *reported;       /* per rank: its slices went to the leader */
  sd_cslice_ref *slices;      /* the members of the boxes reported, box after box */
  size_t nslices, scap;
  sd_cbox *boxes;             /* box ids, in the order they were reported */
  size_t nboxes, bcap;
  sd_ctable *tables;
  size_t ntables;
  sd_cphase phase;

  /* the assignment */
  char *tmp;
  int parent_fd, tmp_fd;
  uint32_t plan_files;
  int32_t *fmap;           /* plan file -> files[] or -1 */
  sd_cfile *files;
  size_t nfiles;
  /* files[]' descriptors for the ring, opened by name when a request needs
   * one, under the writer's max_open_files (fdpool.h); a request that finds
   * every descriptor busy waits (fdwait) and goes on in sd_xfer_progress */
  sd_fdset *fds;
  const char **fnames;     /* files[i].name, for fds */
  sd_fdwaiter fdwait;
  size_t hdr_next;         /* headers: the file whose header blocks go next, and where in it, and in hdrs */
  uint64_t hdr_at, hdr_off;
  sd_rbuf *recv_wait, **recv_wait_tail; /* received frames with runs not yet on the ring */
  uint32_t *sync_q;        /* files[] whole and not yet fsynced, in the order they became whole */
  size_t sync_head, sync_tail, nsynced;
  uint8_t *hdrs;
  sd_lop *ops;
  size_t nops, op_next, ops_done;
  sd_cdest *dests;
  size_t ndests;
  sd_rbuf *pending;           /* data that came before our assignment */
  unsigned io;             /* ring requests and frame copies in flight */
  unsigned copies;         /* frames being filled from shared memory in the thread pool */
  uint64_t recv_expect;    /* bytes other nodes will send us */
  struct sd_xstaged *staged; /* its own blocks, on their way through staging (cluster_xfer_staged.c) */
  /* per files[] (NULL: the leader asked for no checksums): the XOR of the
   * CRC-32C shares (sd_checksum.h) of every data byte this node writes
   * into the file, against the file's end; headers never count. Reported
   * with done, for the leader to combine over the nodes. */
  uint32_t *sums;

  uint64_t bytes_local, bytes_fwd, bytes_recv, bytes_written;
  uint64_t bytes_zero_copy;   /* of bytes_written: zero-copy from this node's ranks' segments (fileset.c) */
  uint64_t r_files, r_tensors, r_bytes;
  int failing, from_leader, leader_lost, released, done_sent;
  int stalled;             /* the assignment could not be taken up: waiting for the leader's verdict */
} sd_csave;

/* ------------------------------------------------------------------------ *
 * cluster_base.c: what both roles share; the dispatch in cluster.c calls
 * down into the roles, which call these, never cluster.c
 * ------------------------------------------------------------------------ */
/* ".shardd-tmp-@NODE@" for a node name: the prefix of its temporary folders. */
void sd_cl_tmp_tag(const char *node, char *out, size_t n);
void sd_cl_failed_free(sd_cfailed *f);
/* The entry of a recently failed save id (expired ones are dropped), or NULL. */
sd_cfailed **sd_cl_failed_find(sd_cluster *cl, const char *id);
/* Node k's participant on this daemon, or the leader on this daemon: queued
 * and delivered from the loop, never re-entering the sender. */
void sd_cl_local_send(sd_cluster *cl, int to_lead, json_t *hdr, const void *payload, size_t plen);
/* Random 64-bit id as 16 hex digits. */
void sd_cl_random_id(char out[17]);
/* The name of a new temporary folder for dir, carrying this node's tag. */
char *sd_cl_tmp_name(sd_cluster *cl, const char *dir, const char *save_id);
/* 1 when tmp is a name sd_cl_tmp_name gives on the node named leader for this dir and save:
 * ".shardd-tmp-@LEADER@-BASE-SAVE-PID-N", a name no checkpoint may have (pathsafe.c reserves it). */
int sd_cl_tmp_is_for(const char *leader, const char *dir, const char *save_id, const char *tmp);
sd_csave *sd_cl_find_csave(sd_cluster *cl, const char *save_id);
/* A multi-node save failed here: late ranks of it will get its error. */
void sd_cl_remember_failure(sd_cluster *cl, const sd_save *save);
/* After shutdown: frees cl once its handle is closed and no leader job remains. */
void sd_cl_maybe_free(sd_cluster *cl);
/* ROOT/dir as an absolute path (malloc'd). */
char *sd_cl_final_path(sd_cluster *cl, const char *dir);

/* ------------------------------------------------------------------------ *
 * cluster_node.c: the participant
 * ------------------------------------------------------------------------ */
/* Joins the leader for save (or leads it); *out: the node's part, for the core to keep in save->cl. */
int sd_node_begin(sd_save *save, const sd_begin_args *a, sd_csave **out, sd_error *err);
int sd_node_fail(sd_csave *cs);
void sd_node_free(sd_csave *cs);
/* Messages from the leader (p NULL: this daemon's own leader). */
void sd_node_on_leader_msg(sd_cluster *cl, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen);
void sd_node_on_data(sd_cluster *cl, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen);
void sd_node_on_ack(sd_cluster *cl, sd_peer *p, json_t *hdr);
/* A connection went away: fail every save that needed it. */
void sd_node_peer_lost(sd_cluster *cl, sd_peer *p, int code, const char *why);
/* The largest assignment (header JSON; its payload into *payload_max) the leader on p may send now:
 * a function of what this node's saves waiting for one hold; 0 when none waits. */
size_t sd_node_assign_cap(sd_cluster *cl, const sd_peer *p, size_t *payload_max);

/* cluster_base.c, shared with cluster_xfer.c: a node save's way out. */
/* Fails the save from inside (an I/O reference is held around the call);
 * returns 1 when that freed cs: the caller must not touch it again. */
int sd_node_fail_held(sd_csave *cs, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same for a failed open, write or fsync of this node's share; but when its temporary folder is
 * gone from under it (withdrawn by a node that lost the leader, or removed by the leader failing the
 * save), it tells the leader and waits for its word instead (stalled; returns 0). */
int sd_node_fail_io(sd_csave *cs, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The node's folder is gone, a consequence whose cause the leader knows: tells it `fail` (code,
 * why) and waits for its word (stalled), logging why and context. */
void sd_node_await_leader(sd_csave *cs, int code, const char *why, const char *context);
/* Every write of a failed save has stopped: close, clean up, finish it (frees cs). */
void sd_node_finish_failed(sd_csave *cs);
void sd_node_to_leader(sd_csave *cs, json_t *m);
sd_cdest *sd_node_dest(sd_csave *cs, uint32_t node);
void sd_node_close_files(sd_csave *cs);
/* After the leader was lost before hearing we finished: removes our temporary folder. */
void sd_node_remove_orphan_tmp(sd_csave *cs);

/* ------------------------------------------------------------------------ *
 * cluster_manifest.c: what a node tells the leader its ranks hold
 * ------------------------------------------------------------------------ */
/* Once no rank that began here is unsealed: the newly sealed ranks' boxes, merged, in manifest
 * frames, and their tensor table's digest. */
void sd_node_sealed(sd_csave *cs);
/* The leader asks for the table of that digest (hex): its tensors, in table frames. */
void sd_node_send_table(sd_csave *cs, json_t *h);
void sd_node_tables_free(sd_csave *cs);

/* ------------------------------------------------------------------------ *
 * cluster_outcome.c: the leader lost after this node's done
 * ------------------------------------------------------------------------ */
/* Learns from the shared root whether the leader published the save (and
 * makes sure it never will if it has not), then ends the save: committed,
 * peer_lost, or outcome_unknown naming what `shardctl outcome` checks. The
 * save stays in flight (an I/O reference) meanwhile. */
void sd_node_learn_outcome(sd_csave *cs);

/* ------------------------------------------------------------------------ *
 * cluster_xfer_staged.c: the participant's own blocks, above cluster_xfer.c
 * ------------------------------------------------------------------------ */
/* Once the assignment is taken: files made only of this node's own bytes
 * (header and local slices) go through the writer's staging with O_DIRECT,
 * as a single-node save's do; the headers of the rest are queued. 0 or a
 * SHARDD_E_* code. */
int sd_xfer_begin(sd_csave *cs, sd_error *err);

/* ------------------------------------------------------------------------ *
 * cluster_xfer.c: the participant's bytes through the ring
 * ------------------------------------------------------------------------ */
/* Once the files are known (open_files): their descriptors to be opened on
 * demand (cs->fds), the fsync queue. 0 or an error code. */
int sd_xfer_open(sd_csave *cs);
/* Issues what the window, the ring and the descriptors allow (the header
 * bytes that fall outside own blocks first, f->own known), fsyncs finished
 * files, reports done. */
void sd_xfer_progress(sd_csave *cs);
/* len more bytes of files[lf] are written; a file whole goes to the fsync queue. */
void sd_xfer_wrote(sd_csave *cs, uint32_t lf, uint64_t len);
/* Queues the header bytes that fall outside own blocks (f->own known), in
 * the order of the files, as far as descriptors allow (sd_xfer_progress
 * queues the rest). 0, or -errno of the request for files[*bad] that could
 * not be made. */
int sd_xfer_queue_headers(sd_csave *cs, uint32_t *bad);
/* A data frame for this save: checked, then written in place (or queued
 * until descriptors are free, unacknowledged meanwhile). */
void sd_xfer_recv_apply(sd_csave *cs, sd_rbuf *rb);
/* A failed save lets go of the frames still queued. */
void sd_xfer_drop_waiting(sd_csave *cs);
/* A rank of this node whose segment is now shorter than when it was
 * attached (a write from it faulted, or a read came up short): that rank's
 * doing, out_of_range naming its region, rather than a disk error. 1 when
 * the save failed so (cs may be gone). */
int sd_xfer_fail_if_shrunk(sd_csave *cs);

/* ------------------------------------------------------------------------ *
 * cluster_lead.c: the leader
 * ------------------------------------------------------------------------ */
/* p NULL: from this daemon's own participant (node 0). Takes hdr and payload. */
void sd_lead_on_msg(sd_cluster *cl, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen);
void sd_lead_peer_lost(sd_cluster *cl, sd_peer *p, int code, const char *why);
void sd_lead_shutdown(sd_cluster *cl);
/* Join deadlines: a save whose nodes (or their ranks) have not all begun within its join_timeout fails. */
void sd_lead_tick(sd_cluster *cl);
unsigned sd_lead_active(const sd_cluster *cl);
/* The largest done node p may send: a function of the files its assignments gave it (4 KiB when
 * none is expected). */
size_t sd_lead_done_cap(const sd_cluster *cl, const sd_peer *p);
/* The largest manifest frame (table 0) or table frame (table 1) p may send: SD_MANIFEST_BOXES
 * boxes, or SD_TABLE_TENSORS tensors, under this daemon's limits (max_name_len, max_dims; the last
 * manifest frame carries the artifacts, max_inline_bytes_per_save), while a save led here collects
 * from it (a table only while one is asked of it); else SD_PEER_CONTROL_MAX. */
size_t sd_lead_manifest_cap(const sd_cluster *cl, const sd_peer *p, int table);
/* One entry per leader state (status): save, state, nnodes, joined, world_size, memory_bytes. */
void sd_lead_status(const sd_cluster *cl, json_t *arr);

#endif
