/* The save state machine: ranks begin, put, file and seal; the last seal plans and publishes; waits get the end. */
#ifndef SD_SAVE_H
#define SD_SAVE_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "ops.h"
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
  uint32_t first_rank;     /* who declared dtype/shape first, for messages */
  sd_slice **slices;
  size_t nslices, cap;
} sd_save_tensor;

typedef struct {
  char *name;
  uint8_t *data;
  size_t len;
  uint32_t rank;
} sd_save_artifact;

enum { SD_RANK_NONE, SD_RANK_BEGUN, SD_RANK_SEALED };

typedef struct {
  int state;
  int declared;            /* no more puts or files ("declared", or sealed) */
  struct sd_session *sess; /* NULL once disconnected */
  sd_region **regions;     /* one reference each, held until the save ends */
  size_t nregions, cap;
  uint64_t bytes;
  sd_slice **pending;      /* deferred puts whose bytes are not ready yet */
  size_t npending, pcap;
} sd_rank;

typedef struct sd_waiter {
  struct sd_session *sess;
  json_t *id;
  struct sd_waiter *next;
} sd_waiter;

typedef enum { SD_SAVE_OPEN, SD_SAVE_WRITING, SD_SAVE_FAILING } sd_save_state;

struct sd_planned;

typedef struct sd_save {
  struct sd_save *next;
  sd_daemon *d;
  char *id, *dir, *prefix;
  uint32_t world_size;
  uint64_t max_shard_size; /* 0: default */
  sd_kv *metadata;         /* owned strings */
  size_t nmetadata;
  int overwrite;
  sd_save_state state;
  sd_rank *ranks;
  uint32_t nbegun, nsealed, ndeclared;

  uid_t owner_uid;          /* who began it: only this uid may join or abort */
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
  struct sd_csave *cl;     /* multi-node part (cluster.c); NULL for a one-node save */
} sd_save;

/* A finished save, as a `wait` reports it. */
typedef struct sd_save_result {
  char *id;
  sd_error err;            /* code 0: committed */
  char *dir;               /* absolute, when committed */
  uint64_t files, tensors, bytes;
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
  /* Multi-node saves (cluster.c, proto/PEERS.md): nnodes 1 is the one-node path. */
  uint32_t nnodes, node_rank;
  const char *leader;      /* "host:port" of node 0's peer listener */
  int write_mode;          /* sd_write_mode */
} sd_begin_args;

typedef struct {
  const char *name;
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  uint64_t start[SD_MAX_DIMS], count[SD_MAX_DIMS];
  int64_t index;
  sd_region *region;       /* borrowed; the save takes its own reference */
  uint64_t offset;
  uint8_t *data;           /* taken over by the save on success */
  uint64_t len;
  int deferred;            /* region bytes put in place later ("ready" or seal) */
} sd_put_args;

sd_save *sd_save_find(sd_daemon *d, const char *id);
const sd_save_result *sd_save_history_find(sd_daemon *d, const char *id);
/* The rank s plays in save, or -1. */
int sd_save_rank_of(const sd_save *save, const struct sd_session *s);

int sd_save_begin(sd_daemon *d, struct sd_session *s, const sd_begin_args *a, sd_error *err);
/* A disagreement on dtype/shape/index fails the whole save with `mismatch`. */
int sd_save_put(sd_save *save, uint32_t rank, sd_put_args *a, sd_error *err);
/* Takes over data (freed on failure too). */
int sd_save_file(sd_save *save, uint32_t rank, const char *name, uint8_t *data, size_t len,
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
void sd_save_fail_err(sd_save *save, const sd_error *err);
/* Registers a waiter for the end of the save (id is borrowed). */
int sd_save_add_waiter(sd_save *save, struct sd_session *s, json_t *id, sd_error *err);

/* Connection s is going away: unsealed ranks fail with client_lost, sealed
 * ones lose their session, its waiters are dropped. */
void sd_save_session_gone(sd_daemon *d, struct sd_session *s);
/* Shutdown: every save in flight fails with shutting_down. */
void sd_save_fail_all(sd_daemon *d, int code, const char *why);
/* Multi-node saves end through these (cluster.c): err NULL and final_path
 * set commits, otherwise the save's error stands. */
void sd_save_finish(sd_save *save, const sd_error *err, const char *final_path);
/* Sends "released" to the ranks once: their shared memory is no longer read. */
void sd_save_released(sd_save *save);

uint64_t sd_save_bytes_planned(const sd_save *save);
uint64_t sd_save_bytes_written(const sd_save *save);
const char *sd_save_state_name(const sd_save *save);

/* The reply a `wait` gets for a finished save. */
json_t *sd_save_result_reply(const sd_save_result *r, json_t *id);
void sd_save_history_free(sd_daemon *d);

#endif
