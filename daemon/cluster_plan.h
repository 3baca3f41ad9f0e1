/* The leader's view of a multi-node save: every node's slice descriptions (never bytes), checked, planned, assigned. Pure. */
#ifndef SD_CLUSTER_PLAN_H
#define SD_CLUSTER_PLAN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sd_artifact.h"
#include "sd_error.h"
#include "sd_format.h"
#include "sd_nameidx.h"

#define SD_NNODES_MAX 4096

typedef enum {
  SD_WRITE_OWNER = 0,      /* each file written by one node; other nodes' bytes are forwarded to it */
  SD_WRITE_SHARED = 1,     /* every node writes its own slices in place into the shared files */
} sd_write_mode;

/* ------------------------------------------------------------------------ *
 * The manifest: tensors and slices as nodes describe them
 * ------------------------------------------------------------------------ */
typedef struct {
  uint32_t node;           /* node_rank holding the bytes */
  uint32_t rank;           /* global rank that put it */
  uint64_t id;             /* the holder's own slice id */
  uint64_t len;            /* bytes */
  uint32_t nparts;         /* a node's boxes merged along dim 0: the counts kept (0: a box as put; 1: an even split) */
  uint32_t part;           /* 0: the whole box; p + 1: part p of box id alone */
  uint64_t dims[];         /* start[ndim], then count[ndim], then each part's count along dim 0 */
} sd_cslice;

typedef struct {
  char *name;
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  int64_t index;           /* -1: natural order */
  char *prefix;            /* its own file series' prefix; NULL: the save's */
  int prefix_given;        /* a node described its prefix (or its absence) already */
  uint32_t first_rank, first_node;
  sd_cslice **slices;
  size_t nslices, cap;
} sd_ctensor;

typedef struct {
  char *name;
  uint8_t *data;
  size_t len;
  uint32_t rank;
  int part;                /* that rank's part of the file (PROTOCOL.md, "file") */
} sd_cartifact;

typedef struct {
  sd_ctensor **tensors;    /* in order of first description */
  size_t ntensors, tcap;
  sd_nameidx names;        /* tensor name -> index into tensors */
  sd_cartifact *files;
  size_t nfiles, fcap;
  uint64_t nslices, bytes;
  /* the slices, carved from blocks freed together: a per-slice malloc would cost its own header
   * and scatter millions of them over the heap */
  uint8_t **blocks;
  size_t nblocks, bcap, bused;
} sd_cmanifest;

/* Finds or adds the tensor `name` (its place in m->tensors into *ti). Every description of a
 * tensor must agree on dtype and shape (and index, where given): SHARDD_E_MISMATCH names the
 * tensor, both ranks and their nodes. */
int sd_cmanifest_tensor(sd_cmanifest *m, const char *name, sd_dtype dtype, uint32_t ndim, const uint64_t *shape,
                        int64_t index, uint32_t node, uint32_t rank, uint32_t *ti, sd_error *err);
/* A merged box has at most this many parts. */
#define SD_CPARTS_MAX 64
/* Adds one box of tensor ti, held by node (rank: a rank of it that holds the box), checked against
 * the tensor's shape. parts (nparts of them): the node merged boxes that meet along dim 0 into this
 * one, each part's count along dim 0 in order (at least 2, at most SD_CPARTS_MAX), or one count c
 * for parts of c each but a last of at most c (an even split, kept so); none: a box as put. Should
 * the box overlap another node's partly, the plan checks and writes it part by part (a part may be
 * another's replica). */
int sd_cmanifest_box(sd_cmanifest *m, uint32_t ti, uint32_t node, uint32_t rank, uint64_t id, const uint64_t *start,
                     const uint64_t *count, const uint64_t *parts, uint32_t nparts, sd_error *err);
/* Both at once: one slice. */
int sd_cmanifest_slice(sd_cmanifest *m, const char *name, sd_dtype dtype, uint32_t ndim,
                       const uint64_t *shape, int64_t index, uint32_t node, uint32_t rank, uint64_t id,
                       const uint64_t *start, const uint64_t *count, sd_error *err);
/* A node's tensor table (the name, dtype, shape and index of each tensor its ranks declared, in
 * its order) is sent to the leader once per distinct table, known by this digest (SHA-256 over
 * the entries, each name NUL-terminated, then dtype, ndim, the shape and the index as
 * little-endian integers, then a file prefix NUL-terminated where the tensor has one): node and
 * leader compute it the same way. */
#define SD_CTABLE_DIGEST 32
typedef struct sd_ctable_hash sd_ctable_hash;
sd_ctable_hash *sd_ctable_hash_new(void);
void sd_ctable_hash_add(sd_ctable_hash *h, const char *name, sd_dtype dtype, uint32_t ndim, const uint64_t *shape,
                        int64_t index, const char *prefix);
/* The digest into out, and h freed; h NULL (out of memory): -1. */
int sd_ctable_hash_end(sd_ctable_hash *h, uint8_t out[SD_CTABLE_DIGEST]);
/* A digest in hex, as the messages carry it (out: 2 * SD_CTABLE_DIGEST + 1 bytes), and back (-1: not one). */
void sd_ctable_hex(const uint8_t digest[SD_CTABLE_DIGEST], char *out);
int sd_ctable_unhex(const char *hex, uint8_t digest[SD_CTABLE_DIGEST]);

/* The file prefix a node gives tensor `name` (described already; NULL: the save's own). Every
 * node must give the same: SHARDD_E_MISMATCH names the tensor, the node and the prefixes. */
int sd_cmanifest_prefix(sd_cmanifest *m, const char *name, const char *prefix, uint32_t node, sd_error *err);
/* A `file` artifact (data copied); the same name with other bytes: SHARDD_E_CONFLICT. part:
 * rank's part of it, joined with the other ranks' in rank order when planned (two parts of one
 * rank, or a part and a whole file of one name: SHARDD_E_CONFLICT). */
int sd_cmanifest_file(sd_cmanifest *m, const char *name, const uint8_t *data, size_t len, uint32_t rank, int part,
                      sd_error *err);
void sd_cmanifest_free(sd_cmanifest *m);

/* ------------------------------------------------------------------------ *
 * The plan
 * ------------------------------------------------------------------------ */
typedef struct {
  uint64_t id;             /* the holder's slice id */
  uint32_t part;           /* 0: all of it; p + 1: its part p alone */
  uint32_t node;           /* holder */
  uint32_t dest;           /* node that writes these bytes into the file */
  uint32_t file;
  uint64_t base;           /* absolute file offset of the tensor's first byte */
  uint64_t len;
} sd_cwrite;

typedef struct {
  uint32_t nnodes;
  sd_write_mode mode;
  sd_tensor *tensors;      /* names borrowed from the manifest */
  size_t ntensors;
  sd_plan plan;
  int have_plan;
  uint32_t *owner;         /* per file: the node that writes its header (and, owner mode, all of it) */
  sd_cwrite *writes;       /* one per kept slice, sorted by holder, file, offset */
  size_t nwrites;
  uint64_t *expect;        /* [node * nfiles + file]: data bytes that node writes into that file */
  uint64_t *local_bytes;   /* per node: its own bytes it writes itself */
  uint64_t *fwd_bytes;     /* per node: its own bytes it sends to another node */
  uint64_t *file_bytes;    /* per node: header + data bytes of the files it owns */
  char *index_json;
  size_t index_len;
  sd_file_out *artifacts;  /* the leader's files: each once, parts joined */
  size_t nartifacts;
  uint64_t total_bytes;    /* every file: shards, index, artifacts */
  uint64_t nfiles_total;
} sd_cplan;

/* Checks coverage of every tensor over all nodes' boxes (overlap, gap;
 * identical boxes are replicas written once), plans the shards like a single
 * node does, gives each file to the node holding most of its bytes (ties go
 * to the node with fewer bytes so far, then the lowest node), keeps for each
 * replica group the copy on the writing node when there is one, and lists
 * who writes what. Artifact names must not collide with shard or index names. */
int sd_cplan_build(sd_cmanifest *m, uint32_t nnodes, sd_write_mode mode, const sd_plan_opts *opts,
                   sd_cplan *out, sd_error *err);
void sd_cplan_free(sd_cplan *p);
/* The bytes the plan gives node k in file f: its header (when it owns it) and its data bytes; 0:
 * the file is not node k's to write. */
uint64_t sd_cplan_assigned(const sd_cplan *P, uint32_t k, size_t f);
/* Node k's done (its "files" [[f, bytes], ...] and, with shares not NULL, its "sums" [[f, "8 hex"],
 * ...] parsed into shares) against exactly its assignment: every file of it once, with the bytes
 * the plan gives it, nothing else; one share per file in the same order, and none but zero for a
 * file it writes no data into (headers never count). NULL when it matches, else what it reported
 * wrong (in buf, naming dir/file, or a constant). Nothing a node reports is believed beyond the plan. */
const char *sd_cplan_done_mismatch(const sd_cplan *P, uint32_t k, const char *dir, json_t *files, json_t *sums,
                                   uint32_t *shares, char *buf, size_t n);

#endif
