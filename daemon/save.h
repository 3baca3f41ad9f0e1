/* The save core's one face: what a save is, what its owner asks of it, and what it tells its owner back (the two ops tables). */
/* Behind it the parts call one way, each only those after it: requests (save_request.c), deadlines (save_deadline.c),
 * failure, publish and the end (save_end.c), lookup, memory and results (save_store.c), then the plan (planner.c) and
 * the guards (save_guard.c). None calls its owner but through the tables. */
#ifndef SD_SAVE_H
#define SD_SAVE_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon.h"
#include "region.h"
#include "sd_format.h"
#include "sd_nameidx.h"
#include "sd_request.h"


/* ------------------------------------------------------------------------ *
 * What a save holds
 * ------------------------------------------------------------------------ */
typedef struct sd_slice {
  uint32_t rank;
  sd_region *region;       /* NULL: the bytes are inline in data */
  uint64_t offset;         /* in region */
  uint8_t *data;           /* owned */
  uint64_t len;
  uint32_t id;             /* position over all the save's slices, set by the planner */
  int deferred;            /* put with "deferred": the bytes are not in place yet */
  uint64_t dims[];         /* start[ndim], then count[ndim] */
} sd_slice;

typedef struct {
  char *name;
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  int64_t index;           /* -1: natural name order */
  const char *prefix;      /* a file series of its own: one of the save's series[]; NULL: the save's prefix */
  uint32_t first_rank;     /* who declared dtype/shape first, for messages */
  sd_slice **slices;
  size_t nslices, cap;
} sd_save_tensor;

typedef struct {
  char *name;
  uint8_t *data;
  size_t len;
  uint32_t rank;
  int part;                /* this rank's part of the file, joined with the others' in rank order */
} sd_save_artifact;

enum { SD_RANK_NONE, SD_RANK_BEGUN, SD_RANK_SEALED };

typedef struct {
  int state;
  int declared;            /* no more puts or files ("declared", or sealed) */
  void *owner;             /* the owner's handle of this rank (a connection); NULL once gone */
  sd_region **regions;     /* one reference each, held until the save ends */
  size_t nregions, cap;
  uint64_t bytes;
  sd_slice **pending;      /* deferred puts whose bytes are not ready yet */
  size_t npending, pcap;
} sd_rank;

typedef struct sd_waiter {
  void *owner;             /* the owner's handle of who waits */
  json_t *id;
  struct sd_waiter *next;
} sd_waiter;

typedef enum { SD_SAVE_OPEN, SD_SAVE_WRITING, SD_SAVE_FAILING } sd_save_state;

struct sd_planned;

typedef struct sd_save {
  struct sd_save *next;
  sd_daemon *d;
  char *id, *dir, *prefix;
  char *series[SD_MAX_SERIES - 1]; /* the other file prefixes its puts name, each kept once */
  size_t nseries;
  uint32_t world_size;
  uint64_t max_shard_size; /* 0: default */
  sd_kv *metadata;         /* owned strings */
  size_t nmetadata;
  int overwrite;
  uint32_t keep_last;      /* 0: none; else the owner's `committed` prunes older checkpoints */
  int64_t total_parameters; /* the index's, as begin gave it; -1: counted by the planner */
  sd_save_state state;
  sd_rank *ranks;
  uint32_t nbegun, nsealed, ndeclared;

  uid_t owner_uid;          /* who began it: only this uid may join or abort */
  int owner_trusted;        /* it began as a member of trusted_group: it may save beneath others' folders */
  uint64_t nslices;         /* every rank's puts, against max_slices */
  sd_save_tensor **tensors; /* in first-put order */
  size_t ntensors, tcap;
  sd_nameidx names;        /* tensor name -> index into tensors */
  sd_save_artifact *files;
  size_t nfiles, fcap;
  uint64_t bytes_put;
  uint64_t inline_bytes;   /* of bytes_put, held in memory (counted in d->inline_bytes) */

  sd_waiter *waiters;
  sd_error err;            /* the first failure */
  struct sd_planned *planned;
  sd_publish *pub;
  int in_start, done_early, released;
  sd_error early_err;
  char *early_path;
  uint64_t t_begin, t_write;
  /* Deadlines (save_deadline.c), from the first begin; seconds, 0: never. */
  uint32_t join_timeout, idle_timeout;
  uint64_t t_active_ms;    /* last begin, put, file, declared, ready or seal of any rank (monotonic ms) */
  uint64_t bytes_zero_copy;   /* once the publish ended: bytes written zero-copy from the segments, */
  uint64_t bytes_gathered; /* ... gathered from several segments in one writev, */
  uint64_t bytes_copied;   /* ... and through staging (sd_publish_bytes_zero_copy) */
  uint64_t bytes_sealed;   /* of the staged source bytes: from sealed memfds (sd_publish_bytes_sealed) */
  struct sd_csave *cl;     /* multi-node part (cluster.c); NULL for a one-node save */
} sd_save;

/* A finished save, as a `wait` reports it. */
typedef struct sd_save_result {
  char *id;
  sd_error err;            /* code 0: committed */
  char *dir;               /* absolute, when committed */
  uint64_t files, tensors, bytes;
  uint64_t t_end_ms;       /* monotonic ms it ended, for late begins (history_window) */
  uint8_t *began;          /* one-node saves: a bit per rank that had begun (a retry, not a late rank) */
  uint32_t world_size;
} sd_save_result;

/* ------------------------------------------------------------------------ *
 * Requests (arguments already parsed and checked field by field)
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *save, *dir, *prefix;
  uint32_t rank, world_size;
  uint64_t max_shard_size;
  const sd_kv *metadata;
  size_t nmetadata;
  int overwrite;
  uint32_t keep_last;      /* 0: not given */
  int64_t total_parameters; /* -1: not given */
  /* Multi-node saves (cluster.c, proto/PEERS.md): nnodes 1 is the one-node path. */
  uint32_t nnodes, node_rank;
  const char *leader;      /* "host:port" of node 0's peer listener */
  int write_mode;          /* sd_write_mode */
  /* Deadlines in seconds (0: never) when has_*; else the daemon's defaults. The first begin sets them. */
  uint32_t join_timeout, idle_timeout;
  int has_join_timeout, has_idle_timeout;
} sd_begin_args;

typedef struct {
  const char *name;
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  uint64_t start[SD_MAX_DIMS], count[SD_MAX_DIMS];
  int64_t index;
  const char *prefix;      /* its file series' prefix (borrowed); NULL: the save's */
  sd_region *region;       /* borrowed; the save takes its own reference */
  uint64_t offset;
  uint8_t *data;           /* taken over by the save on success */
  uint64_t len;
  int deferred;            /* region bytes put in place later ("ready" or seal) */
} sd_put_args;

/* ------------------------------------------------------------------------ *
 * What the core tells those above it. The saves' owner (the protocol layer)
 * hears about its handles; a save spanning several nodes carries the hooks of
 * the multi-node layer. Both tables are set in sd_daemon by main.
 * ------------------------------------------------------------------------ */
typedef struct sd_save_owner_ops {
  /* The rank `owner` already plays in save, or -1. */
  int (*rank_of)(const void *owner, const struct sd_save *save);
  /* owner becomes rank `rank` of save; nonzero (out of memory) refuses the join. */
  int (*joined)(void *owner, struct sd_save *save, uint32_t rank);
  /* The save ended: owner is no longer one of its ranks. */
  void (*left)(void *owner, struct sd_save *save);
  /* owner's rank may let go of its shared memory: the save no longer reads it. */
  void (*released)(void *owner, const struct sd_save *save);
  /* A waiter's answer (reference stolen; NULL when out of memory): its wait is over. */
  void (*waited)(void *owner, json_t *reply);
  /* The save committed to final_path and every waiter has its answer; called
   * once per save, before it is freed (retention runs from here). May be NULL. */
  void (*committed)(struct sd_save *save, const char *final_path);
} sd_save_owner_ops;

typedef struct sd_save_ext_ops {
  /* A new save with nnodes > 1: joins the leader (or leads); *cl is the part the save then carries (save->cl). */
  int (*attach)(struct sd_save *save, const sd_begin_args *a, struct sd_csave **cl, sd_error *err);
  /* A joining rank must agree on nnodes, node_rank, leader and write_mode (any save). */
  int (*join_check)(const struct sd_save *save, const sd_begin_args *a, sd_error *err);
  /* A rank of this node began (the first one after attach): the leader counts them for join_timeout. */
  void (*began)(struct sd_save *save, uint32_t rank);
  /* Every rank declared or sealed: the slice descriptions go to the leader. */
  void (*sealed)(struct sd_save *save);
  /* The save failed (save->err is set): 1 while writes are still in flight,
   * the save is then finished (sd_save_finish) once they stop; 0 ends it now. */
  int (*fail)(struct sd_save *save);
  /* The save is being freed: let go of save->cl (the core forgets it after). */
  void (*detach)(struct sd_save *save);
  /* What `wait` reports for a committed save. */
  void (*result)(const struct sd_save *save, uint64_t *files, uint64_t *tensors, uint64_t *bytes);
  uint64_t (*bytes_written)(const struct sd_save *save);
  /* Of those, bytes written zero-copy from this node's ranks' segments. */
  uint64_t (*bytes_zero_copy)(const struct sd_save *save);
  /* Bytes of this node's slices streamed to other nodes, for the summary line. */
  uint64_t (*bytes_forwarded)(const struct sd_save *save);
} sd_save_ext_ops;

/* Who asks to begin: the owner's handle and what decides its rights. */
typedef struct {
  void *owner;
  uid_t uid;
  int trusted;             /* a member of trusted_group: may overwrite any checkpoint */
} sd_joiner;

/* Upper bounds (seconds) of the save duration histogram in sd_counters. */
extern const double sd_save_duration_buckets[SD_DURATION_NBUCKETS];

sd_save *sd_save_find(sd_daemon *d, const char *id);
const sd_save_result *sd_save_history_find(sd_daemon *d, const char *id);
int sd_save_begin(sd_daemon *d, const sd_joiner *j, const sd_begin_args *a, sd_error *err);
/* A disagreement on dtype/shape/index fails the whole save with `mismatch`. */
int sd_save_put(sd_save *save, uint32_t rank, sd_put_args *a, sd_error *err);
/* Takes over data (freed on failure too). part: this rank's part of the file (PROTOCOL.md, "file"). */
int sd_save_file(sd_save *save, uint32_t rank, const char *name, uint8_t *data, size_t len, int part,
                 sd_error *err);
int sd_save_seal(sd_save *save, uint32_t rank, sd_error *err);
/* Streaming: a rank says it will put nothing more, though bytes of its
 * deferred puts may still be on their way; once every rank has declared (or
 * sealed), a one-node save plans and starts writing what is ready. */
int sd_save_declared(sd_save *save, uint32_t rank, sd_error *err);
/* The bytes of this rank's deferred puts in region r below `upto` are in place. */
int sd_save_ready(sd_save *save, uint32_t rank, const sd_region *r, uint64_t upto, sd_error *err);
/* Plans and starts the publish once every rank has declared or sealed, and
 * lets it publish once every rank has sealed (call after the reply went out,
 * so replies keep request order). */
void sd_save_maybe_start(sd_save *save);
/* Fails the save for every rank; the first error wins. */
void sd_save_fail(sd_save *save, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* err's message gets the save's dir beside its id first (sd_save_err_dir), for the caller too. */
void sd_save_fail_err(sd_save *save, sd_error *err);
/* Names the save's dir after the first "save 'ID'" of err's message that does not name it yet. */
void sd_save_err_dir(const sd_save *save, sd_error *err);
/* Whether save is still in flight (a call may have ended and freed it). */
int sd_save_alive(sd_daemon *d, const sd_save *save);
/* Registers a waiter for the end of the save (id is borrowed); it hears
 * through the owner's `waited`. */
int sd_save_add_waiter(sd_save *save, void *owner, json_t *id, sd_error *err);

/* The owner's handle is going away: its waiters are dropped (how many is
 * returned), then each of its ranks is forgotten (sd_save_rank_forget) and,
 * when the save still lives, lost (sd_save_rank_lost). */
size_t sd_save_drop_waiters(sd_daemon *d, const void *owner);
void sd_save_rank_forget(sd_save *save, uint32_t rank);
/* An unsealed rank of a live save fails it with client_lost. */
void sd_save_rank_lost(sd_daemon *d, sd_save *save, uint32_t rank);
/* Checks every save's deadlines now (also run by a timer while saves are in flight). */
void sd_save_deadlines_check(sd_daemon *d);
/* Shutdown: every save in flight fails with shutting_down. */
void sd_save_fail_all(sd_daemon *d, int code, const char *why);
/* Multi-node saves end through these (cluster.c): err NULL and final_path
 * set commits, otherwise the save's error stands. */
void sd_save_finish(sd_save *save, const sd_error *err, const char *final_path);
/* Tells the ranks "released" once (the owner's `released`): their shared memory is no longer read. */
void sd_save_released(sd_save *save);
/* The save's bytes start going to disk (its publish, or a multi-node save's assignment): no more
 * puts, and the write seconds of its summary count from here. */
void sd_save_writing(sd_save *save);

uint64_t sd_save_bytes_planned(const sd_save *save);
/* Saves writing now and the bytes they have still to write. */
void sd_save_writing_totals(const sd_daemon *d, uint64_t *writing, uint64_t *pending);
uint64_t sd_save_bytes_written(const sd_save *save);
/* Of those, written zero-copy straight from the ranks' segments (the rest were copied through staging). */
uint64_t sd_save_bytes_zero_copy(const sd_save *save);
/* ... and gathered from several ranks' segments in one writev. */
uint64_t sd_save_bytes_gathered(const sd_save *save);
const char *sd_save_state_name(const sd_save *save);

/* The reply a `wait` gets for a finished save. */
json_t *sd_save_result_reply(const sd_save_result *r, json_t *id);
void sd_save_history_free(sd_daemon *d);

#endif
