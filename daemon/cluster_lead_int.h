/* The leader's state, shared by its protocol (cluster_lead.c), its states' life (cluster_lead_state.c) and its folder work (cluster_lead_fs.c: worker threads, and the writer for its own files). */
#ifndef SD_CLUSTER_LEAD_INT_H
#define SD_CLUSTER_LEAD_INT_H

#include "cluster_int.h"
#include "pubfill.h"
#include "sd_checksum.h"

typedef enum { L_COLLECT, L_PREPARE, L_WRITE, L_FINISH, L_FAILED } lstate;
enum { JOB_PREPARE, JOB_FINISH, JOB_CLEANUP };

/* A node's tensor table, known by digest, shared by every node whose table is the same: asked
 * once, of this daemon's own node when it names it (in process, and never the node that is
 * stopped), else, once every manifest is in, of the first node that named it. */
typedef struct {
  uint8_t digest[SD_CTABLE_DIGEST];
  uint32_t n, filled;
  uint32_t *map;           /* table entry -> tensor of the manifest, as the entries arrive */
  uint32_t from;           /* the node to ask (asked) for it */
  sd_ctable_hash *hash;    /* over the entries received, against the digest once all are in */
  int complete, asked;
} ltable;

typedef struct {
  int joined, local, done;
  int collecting;          /* between the first and the last frame of one of its manifests */
  int32_t table;           /* the table of its manifest in progress (into L->tables) */
  uint64_t *held;          /* boxes waiting for their table: [length, table, entry, id, rank, dims...] each */
  size_t nheld, hcap;
  size_t nfiles;           /* files its assignment gave it */
  int sums;                /* its manifest says it can hash what it writes */
  sd_peer *link;
  char tok[17];
  char addr[SD_PEER_ADDR_MAX];
  char name[SD_PEER_NAME_MAX + 1];
  uint64_t b_local, b_fwd, b_recv;
  uint64_t b_written, b_zero_copy; /* of its files: all it wrote, and zero-copy */
} lnode;

typedef struct sd_lead {
  struct sd_lead *next;
  sd_cluster *cl;
  char *id;
  char cid[17];
  char *dir, *prefix;
  uint64_t mss;
  sd_kv *md;
  size_t nmd;
  int overwrite;
  json_int_t keep_last;    /* checked to agree; the leader's own save runs it (session.c) */
  json_int_t total_parameters; /* the index's, as the joins give it; -1: counted by the planner */
  int has_owner;           /* node 0's join named the uid that began the save */
  uid_t owner_uid;         /* recorded on the folder, as a one-node save does */
  uint32_t ws, nnodes;
  sd_write_mode mode;
  lnode *nodes;
  int32_t *rank_node;
  uint32_t nsealed, njoined, ndone;
  sd_cmanifest man;
  ltable *tables;
  size_t ntables;
  uint32_t ncollecting;    /* nodes in the middle of a manifest */
  uint64_t meta_bytes;     /* manifest and table frames from other nodes, as they came on the wire */
  sd_cplan plan;
  int planned;
  int plan_sums;           /* checksums asked of every node (all their manifests said they can) */
  /* plan.plan.checksums: per plan file, the XOR of the shares every node
   * reported with done; once all are in, the CRCs fill the index's
   * placeholders, or sum_hex those of a single file's header (written over
   * it in the temporary folder by JOB_FINISH) */
  uint32_t *sums;
  uint64_t *acct;          /* per plan file: the bytes the nodes reported done, to add up to its size */
  char sum_hex[SD_CHECKSUM_HEX + 1];
  char *tmp;
  char begun_by[SD_PEER_NAME_MAX + 1]; /* the peer whose join made this state; "" when this daemon's own */
  lstate state;
  int busy;                /* a file-system job is running in the thread pool */
  int parent_fd, tmp_made, renamed;
  unsigned created;
  unsigned file_mode, dir_mode;
  sd_error err;
  uint64_t forget_at, t0, t_done; /* t_done: the last node's done (the summary line) */
  /* join_timeout (seconds, 0: never) from the first join, counted from it; ranks the nodes said began */
  uint32_t join_timeout, nbegan;
  uint64_t t_join;
  uint8_t *began;
} sd_lead;

typedef struct {
  uv_work_t req;
  sd_lead *L;
  int kind;
  int root_fd;
  sd_error err;
  /* JOB_FINISH, in three steps: the leader's own files made (a worker
   * thread), written and fsynced by the writer (the loop), then the owner
   * and the publish (a worker thread) */
  int step;
  int tfd;                 /* the temporary folder, -1 none */
  size_t nown;             /* artifacts, then the index */
  int *fds;
  const char **names;
  sd_fill_file *files;
  uv_after_work_cb done;
} fsjob;

/* A new leader state from the first join of any node (h), at the head of cl->leads; NULL with err set. */
sd_lead *sd_lead_new(sd_cluster *cl, const char *id, json_t *h, sd_error *err);
/* conflict naming the first field in which a later join differs from the save as the first described it. */
int sd_lead_join_differs(const sd_lead *L, json_t *h, uint32_t k, sd_error *err);
/* The save led here by that id; failed ones past their forget time go first. */
sd_lead *sd_lead_find(sd_cluster *cl, const char *id);
/* Room for one more leader state under max_leader_saves, begun by the peer named by (NULL: this
 * daemon's own ranks): a failed save kept only to tell late nodes why gives way first (the oldest
 * such); a peer holds at most half of it in saves this daemon's ranks have not joined. 0, or
 * SHARDD_E_LIMIT with the reason in err. */
int sd_lead_room(sd_cluster *cl, const char *id, const char *by, sd_error *err);
/* The manifest and plan go: a failed save keeps only what answers late nodes. */
void sd_lead_release_plan(sd_lead *L);
/* cluster_lead_man.c: a manifest frame from node k, then a table frame. 0 or a SHARDD_E_* code
 * (err set). *ready: every rank's boxes are in, all checked against their tables: time to plan. */
int sd_lead_manifest(sd_lead *L, uint32_t k, json_t *h, int *ready, sd_error *err);
int sd_lead_table(sd_lead *L, uint32_t k, json_t *h, int *ready, sd_error *err);
/* A table to ask for now (marked asked; the node into *node), or -1. */
int sd_lead_next_ask(sd_lead *L, uint32_t *node);
void sd_lead_man_free(sd_lead *L);

/* Out of cl->leads and freed. */
void sd_lead_free(sd_lead *L);

/* Runs one fsjob (j->req.data = j) in the thread pool, its file writes on
 * the writer: only the job's own fields and its leader's folder are touched
 * off the loop. done gets the job back on the loop with the result in
 * j->err (status as uv_queue_work's), once; 0, or -1 when nothing could be
 * queued (no callback then). */
int sd_lead_fs_queue(uv_loop_t *loop, fsjob *j, uv_after_work_cb done);
/* A JOB_CLEANUP's work: the unpublished temporary folder and the parents the
 * leader made go (also run on the loop thread at shutdown). */
int sd_lead_fs_cleanup(fsjob *j);

#endif
