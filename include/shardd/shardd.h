/* libshardd: the client API trainers link to hand tensor slices to the node's shardd daemon. */
#ifndef SHARDD_SHARDD_H
#define SHARDD_SHARDD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHARDD_VERSION_MAJOR 0
#define SHARDD_VERSION_MINOR 1
#define SHARDD_VERSION_PATCH 0
#define SHARDD_VERSION_STRING "0.1.0"
#define SHARDD_PROTO_VERSION 1

#if defined(__GNUC__)
#define SHARDD_EXPORT __attribute__((visibility("default")))
#else
#define SHARDD_EXPORT
#endif

/* ------------------------------------------------------------------------ *
 * Errors
 *
 * Every call returns 0 on success or one of the negative codes below. The
 * second column is the stable snake_case name used on the wire as
 * error.code; never renumber or rename an entry, only append.
 * ------------------------------------------------------------------------ */
#define SHARDD_ERRNO_MAP(XX)                                                        \
  XX(BAD_REQUEST,       1, "bad_request",       "malformed request line")           \
  XX(UNKNOWN_OP,        2, "unknown_op",        "unknown operation")                \
  XX(INVALID_ARGUMENT,  3, "invalid_argument",  "invalid or missing field")         \
  XX(UNSUPPORTED_PROTO, 4, "unsupported_proto", "unsupported protocol version")     \
  XX(NO_SUCH_SAVE,      5, "no_such_save",      "no such save")                     \
  XX(NO_SUCH_REGION,    6, "no_such_region",    "no such region")                   \
  XX(CONFLICT,          7, "conflict",          "ranks disagree on the save")       \
  XX(MISMATCH,          8, "mismatch",          "ranks disagree on a tensor")       \
  XX(OVERLAP,           9, "overlap",           "slices overlap")                   \
  XX(GAP,              10, "gap",               "slices leave a gap")               \
  XX(EXISTS,           11, "exists",            "destination already exists")       \
  XX(BAD_PATH,         12, "bad_path",          "path escapes the root")            \
  XX(OUT_OF_RANGE,     13, "out_of_range",      "bytes lie outside the region")     \
  XX(PERMISSION,       14, "permission_denied", "permission denied")                \
  XX(BAD_STATE,        15, "bad_state",         "operation not allowed now")        \
  XX(LIMIT,            16, "limit_exceeded",    "a configured limit was exceeded")  \
  XX(IO,               17, "io_error",          "input/output error")               \
  XX(NO_SPACE,         18, "no_space",          "no space left on device")          \
  XX(ABORTED,          19, "aborted",           "save aborted")                     \
  XX(CLIENT_LOST,      20, "client_lost",       "a rank disconnected before seal")  \
  XX(SHUTTING_DOWN,    21, "shutting_down",     "daemon is shutting down")          \
  XX(INTERNAL,         22, "internal",          "internal error")                   \
  XX(NO_MEMORY,        23, "no_memory",         "out of memory")                    \
  XX(TIMEOUT,          24, "timeout",           "timed out")                        \
  XX(CONNECT,          25, "connect_failed",    "cannot reach the daemon")          \
  XX(PROTOCOL,         26, "protocol_error",    "unexpected reply from the daemon") \
  XX(PEER_LOST,        27, "peer_lost",         "a peer daemon was lost")           \
  XX(FORMAT,           28, "bad_format",        "invalid safetensors data")         \
  XX(NOT_FOUND,        29, "not_found",         "no such checkpoint")               \
  XX(NOT_CHECKPOINT,   30, "not_a_checkpoint",  "not a checkpoint shardd wrote")    \
  XX(SAVE_FAILED,      31, "save_failed",       "the save already failed")         \
  XX(FILE_SET,         32, "bad_file_set",      "shard files and index disagree")   \
  XX(CHECKSUM,         33, "bad_checksum",      "data does not match its checksum") \
  XX(OUTCOME_UNKNOWN,  34, "outcome_unknown",   "whether the save was published is not known")

typedef enum {
  SHARDD_OK = 0,
#define SHARDD_XX_(name, num, code, msg) SHARDD_E_##name = -(num),
  SHARDD_ERRNO_MAP(SHARDD_XX_)
#undef SHARDD_XX_
} shardd_errcode;

/* Human-readable description of a code. Thread-safe. */
SHARDD_EXPORT const char *shardd_strerror(int err);
/* Stable wire name ("gap", "io_error"); "unknown" for an unknown code. Thread-safe. */
SHARDD_EXPORT const char *shardd_err_name(int err);
/* Inverse of shardd_err_name; SHARDD_E_PROTOCOL for an unknown name. Thread-safe. */
SHARDD_EXPORT int shardd_err_from_name(const char *name);

/* ------------------------------------------------------------------------ *
 * Connection
 *
 * Thread-safety: a shardd_client and the arenas created through it belong to
 * one thread at a time; use one client per thread (they are cheap). Calls on
 * different clients never interfere. The error helpers above, shardd_connect
 * and shardd_last_error(NULL) (kept per thread) are thread-safe.
 * ------------------------------------------------------------------------ */
typedef struct shardd_client shardd_client;
typedef struct shardd_arena shardd_arena;

/* Default socket when path is NULL, the same rule the daemon follows:
 * $SHARDD_SOCKET; else, when not running as root and $XDG_RUNTIME_DIR is
 * set, $XDG_RUNTIME_DIR/shardd.sock; else /run/shardd/shardd.sock. */
#define SHARDD_DEFAULT_SOCKET "/run/shardd/shardd.sock"

/* Connects and performs the hello handshake. On failure *out is NULL and
 * shardd_last_error(NULL) holds the reason.
 * Every request but wait gives up after $SHARDD_TIMEOUT_MS milliseconds
 * (default 120000; negative waits forever) with SHARDD_E_TIMEOUT. */
SHARDD_EXPORT int shardd_connect(const char *socket_path, shardd_client **out);
/* Arenas still alive stay usable for their memory; destroying them later
 * only unmaps and unlinks. */
SHARDD_EXPORT void shardd_close(shardd_client *c);
/* Message of the last failed call on this client, or "" after a success.
 * Valid until the next call on c. Format: "<wire code>: <message>", e.g.
 * "gap: tensor 'lm_head.weight': element [100, 0] is not covered", where the
 * code is the daemon's error.code (or the local one, for errors found in the
 * library) and the message names the field, tensor or file.
 * With c == NULL: this thread's last failed shardd_connect. */
SHARDD_EXPORT const char *shardd_last_error(const shardd_client *c);
/* Host name the daemon reported in hello. */
SHARDD_EXPORT const char *shardd_node_name(const shardd_client *c);

/* ------------------------------------------------------------------------ *
 * Shared-memory arenas: memory the trainer fills and the daemon maps read-only.
 * By default a memfd sealed against shrinking (F_SEAL_SHRINK), passed to the
 * daemon over the socket (SCM_RIGHTS): no file name, no file permission. With
 * SHARDD_ARENA=shm in the environment, a POSIX shm segment (0600) attached
 * by name instead (for daemons before descriptor attach).
 * ------------------------------------------------------------------------ */
/* Creates, sizes, maps and attaches a segment, and pre-faults every page for
 * writing (a one-time cost), so copies during a save run at memory speed.
 * Create arenas once and reuse them across saves (see shardd_wait_released). */
SHARDD_EXPORT int shardd_arena_create(shardd_client *c, size_t size, shardd_arena **out);
SHARDD_EXPORT void *shardd_arena_data(shardd_arena *a);
SHARDD_EXPORT size_t shardd_arena_size(const shardd_arena *a);
/* "memfd:shardd-<pid>-<n>" for a memfd arena (the default); with SHARDD_ARENA=shm in
 * the environment, the POSIX shm name ("/shardd-<pid>-<n>-<random>"). For logs and tests. */
SHARDD_EXPORT const char *shardd_arena_name(const shardd_arena *a);
/* Detaches, unmaps and (shm) unlinks. The daemon keeps its own mapping for as long as
 * a save still needs the bytes, so this is safe right after seal. */
SHARDD_EXPORT int shardd_arena_destroy(shardd_arena *a);

/* ------------------------------------------------------------------------ *
 * Saves
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *save;          /* save id, shared by every rank of the save */
  const char *dir;           /* destination, relative to the daemon's root */
  int rank;
  int world_size;
  uint64_t max_shard_size;   /* 0: the default, 5,000,000,000 bytes */
  const char *prefix;        /* NULL: "model" */
  const char *const *metadata; /* nmetadata key/value pairs: k0, v0, k1, v1, ... */
  size_t nmetadata;
  int overwrite;
  /* Multi-node saves (one shardd per node, peers over TCP): nnodes 0 or 1
   * is a one-node save and the fields below are ignored. Every rank of the
   * save gives the same nnodes, leader and write_mode; ranks on one node the
   * same node_rank. See shardd_save_opts_from_env. */
  int nnodes;
  int node_rank;
  const char *leader;        /* "host:port" of node 0's shardd peer listener */
  const char *write_mode;    /* NULL or "owner": each file written by one node; "shared": in place by all */
  /* After the save commits, the caller's older checkpoints in the same parent
   * folder beyond the newest keep_last are deleted (as shardd_delete does);
   * 0 keeps them all. The same on every rank of the save. */
  int keep_last;
  /* Deadlines in seconds (the first rank's begin sets them for the save): 0
   * leaves the daemon's default (join_timeout 300, idle_timeout 600), < 0
   * turns one off. join_timeout: every rank (every node) must have begun
   * this long after the first; idle_timeout: the unsealed ranks may not all
   * stay silent longer. Either fails the save with SHARDD_E_TIMEOUT. */
  int join_timeout;
  int idle_timeout;
  /* The index's metadata.total_parameters, the same on every rank: > 0 this number (transformers
   * writes model.num_parameters(), which leaves out the buffers it saves), at most the elements
   * saved; 0 (or less): the elements of every tensor saved, counted. */
  int64_t total_parameters;
} shardd_save_opts;

/* Fills rank, world_size, nnodes, node_rank and leader from a torchrun-style
 * environment: RANK, WORLD_SIZE (required), NNODES (else GROUP_WORLD_SIZE,
 * else WORLD_SIZE / LOCAL_WORLD_SIZE, else 1), NODE_RANK (else GROUP_RANK),
 * LOCAL_RANK (checked when set), and the leader as $SHARDD_LEADER, else
 * MASTER_ADDR:$SHARDD_PEER_PORT (default port 7077). The leader string is
 * written into leader_buf (leader_len bytes), which opts->leader then points
 * to. Other fields are left alone. Returns 0 or SHARDD_E_INVALID_ARGUMENT
 * (missing or malformed variable; the message is in shardd_last_error(NULL)).
 * Thread-safe. */
SHARDD_EXPORT int shardd_save_opts_from_env(shardd_save_opts *opts, char *leader_buf, size_t leader_len);
#define SHARDD_DEFAULT_PEER_PORT 7077

typedef struct {
  const char *name;
  const char *dtype;          /* safetensors name: "F32", "BF16", ... */
  int ndim;
  const uint64_t *shape;      /* global shape, ndim entries */
  const uint64_t *start;      /* slice box; NULL for the whole tensor */
  const uint64_t *count;
  int64_t index;              /* state-dict position, or -1 for name order */
} shardd_tensor_desc;

typedef struct {
  char dir[4096];             /* absolute path of the committed checkpoint */
  uint64_t files;
  uint64_t tensors;
  uint64_t bytes;
} shardd_result;

SHARDD_EXPORT int shardd_begin(shardd_client *c, const shardd_save_opts *opts);
/* The slice's bytes (row-major, box-shaped) are already at offset in the arena.
 * A slice may be empty (a zero count: an uneven split leaving this rank
 * nothing of the tensor); it still declares the tensor's dtype and shape. Its
 * arena may then be NULL, here and in every put variant below, and no bytes
 * are named. */
SHARDD_EXPORT int shardd_put(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                             shardd_arena *a, uint64_t offset);
/* Copies len bytes from src to offset in the arena, then puts them. */
SHARDD_EXPORT int shardd_put_copy(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                  shardd_arena *a, uint64_t offset, const void *src, size_t len);
/* n slices whose bytes are (deferred: will be) at offsets[i] in the arena,
 * sent many to a line (the protocol's puts, up to a few thousand slices or
 * 256 KiB a line; one put line each to a daemon without puts), a few lines
 * unanswered at a time. Every slice is checked here first (nothing is sent
 * if one is refused). The daemon records a line's slices in order and stops
 * at the first it refuses; no line is sent once a refusal came, though the
 * lines already sent are recorded. Returns the first failure, the refused
 * slice's index in *failed (every slice before it was recorded). */
SHARDD_EXPORT int shardd_put_many(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                  const uint64_t *offsets, size_t n, shardd_arena *a, int deferred,
                                  size_t *failed);
/* The same, the slices' tensors written into a file series of their own: files named
 * PREFIX.safetensors or PREFIX-NNNNN-of-NNNNN.safetensors beside the save's own (an
 * optimizer's beside a model's), under the one index. NULL: the save's prefix. Every put of a
 * tensor, from every rank, must give it the same prefix. */
SHARDD_EXPORT int shardd_put_many_prefix(shardd_client *c, const char *save, const char *prefix,
                                         const shardd_tensor_desc *t, const uint64_t *offsets, size_t n,
                                         shardd_arena *a, int deferred, size_t *failed);
/* Where to put this rank's slices in its arena so the daemon writes them
 * straight from it, with no copy (the placement rule, PROTOCOL.md): the
 * slices t[0..n) are planned as the daemon will plan the files (names,
 * dtypes, global shapes, index, max_shard_size; 0: the default), and each
 * slice that lands in its file as one stretch (a whole tensor or a dim-0
 * piece) of at least 64 KiB gets an offset congruent to its file offset
 * modulo 4096; an inner-dimension piece of at least 64 KiB gets a multiple
 * of 512 (the daemon gathers row fragments a multiple of 512 long from
 * several ranks into one direct write, where the device allows); the
 * others are packed at 64-byte boundaries. offsets[i] is
 * t[i]'s, from base on; *end is one past the last byte (the arena size
 * needed). Pure and local: when other ranks put tensors this rank does not
 * name, the files differ and those slices are copied through staging, as
 * they would be anywhere. A slice the daemon would refuse is packed (its put
 * says why). SHARDD_E_INVALID_ARGUMENT only for NULL arrays. */
SHARDD_EXPORT int shardd_place(const shardd_tensor_desc *t, size_t n, uint64_t max_shard_size, uint64_t base,
                               uint64_t *offsets, uint64_t *end);
/* Sends the bytes inline (base64); for small tensors. */
SHARDD_EXPORT int shardd_put_inline(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                    const void *data, size_t len);
/* A plain file (config.json, ...) written beside the shards. */
SHARDD_EXPORT int shardd_file(shardd_client *c, const char *save, const char *path,
                              const void *data, size_t len);
/* This rank's part of a file every rank may add to: the file written is the parts joined in
 * rank order (a rank that sends none adds nothing), in the same atomic save. */
SHARDD_EXPORT int shardd_file_part(shardd_client *c, const char *save, const char *path,
                                   const void *data, size_t len);
/* From seal until the save is released (shardd_wait_released) the daemon
 * reads this rank's arena as it writes: writing into the slices put meanwhile
 * changes what is saved. A change the daemon sees under a zero-copy write
 * fails the save with SHARDD_E_BAD_STATE naming the rank; one in bytes it
 * copies is not seen (proto/PROTOCOL.md, "seal"). */
SHARDD_EXPORT int shardd_seal(shardd_client *c, const char *save);

/* Streaming, so the daemon writes while the rank is still copying:
 * put every slice deferred (its place in the arena, bytes to come), say
 * shardd_declared, then copy and call shardd_ready(upto) as the arena fills
 * from the front; shardd_seal says every byte is in place. Once every rank
 * has declared, the daemon checks coverage and plans (a gap or overlap
 * fails the save before any byte is copied) and writes each stretch of a
 * file as soon as its bytes are ready; it publishes after the last seal. */
SHARDD_EXPORT int shardd_put_deferred(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                      shardd_arena *a, uint64_t offset);
/* This rank puts nothing more (and sends no file) in this save. */
SHARDD_EXPORT int shardd_declared(shardd_client *c, const char *save);
/* The bytes of this rank's deferred puts in arena a below offset upto are in place. */
SHARDD_EXPORT int shardd_ready(shardd_client *c, const char *save, shardd_arena *a, uint64_t upto);
/* Blocks until the save ends; timeout_ms < 0 waits forever. A wait that
 * times out (SHARDD_E_TIMEOUT) leaves the save running and stays pending:
 * calling again polls the same wait. */
SHARDD_EXPORT int shardd_wait(shardd_client *c, const char *save, int timeout_ms, shardd_result *out);
/* shardd_wait, but a save that has not ended within timeout_ms is aborted
 * (for every rank: nothing is published) and SHARDD_E_TIMEOUT returned once
 * the daemon has ended it. If it committed in the meantime, that result is
 * returned (0) instead. */
SHARDD_EXPORT int shardd_wait_or_abort(shardd_client *c, const char *save, int timeout_ms, shardd_result *out);
/* Blocks until the daemon says it will never read this rank's shared memory
 * for the save again (the "released" event): only then may the arena be
 * written again (the next step's weights, the next save). */
SHARDD_EXPORT int shardd_wait_released(shardd_client *c, const char *save, int timeout_ms);
SHARDD_EXPORT int shardd_abort(shardd_client *c, const char *save);
/* Deletes the checkpoint dir (relative to the daemon's root, or absolute
 * beneath it) that this connection's uid committed: renamed away atomically,
 * then removed by the daemon. Refused with bad_path (outside the root),
 * not_found, not_a_checkpoint (not written by shardd), permission_denied
 * (another uid committed it) or conflict (a save is writing to it). */
SHARDD_EXPORT int shardd_delete(shardd_client *c, const char *dir);
/* The daemon's status reply as a JSON string; free it with shardd_free. */
SHARDD_EXPORT int shardd_status(shardd_client *c, char **json_out);
SHARDD_EXPORT void shardd_free(void *p);

/* ------------------------------------------------------------------------ *
 * Reading checkpoints back
 *
 * A checkpoint is a folder (PREFIX.safetensors.index.json and the shards it
 * names, or one *.safetensors file) or the path of a single .safetensors
 * file. shardd_ckpt_open checks all of it with the strict reader first:
 * every header, the index, and that they agree (a hostile or damaged file
 * fails with SHARDD_E_FORMAT naming the file, tensor and field; a folder
 * holding a shard-named file its index does not name, or missing one it
 * names, with SHARDD_E_FILE_SET naming the file; a file that cannot be read
 * with SHARDD_E_IO). Reads then fetch only the bytes of the
 * box asked for, with pread, one call per contiguous run. Those checks read
 * headers only; shardd_ckpt_verify reads every data byte once and compares
 * each file's CRC-32C with the one shardd recorded when it wrote it.
 * No shard stays open between calls (one folder descriptor is held), so a
 * checkpoint of any number of files opens within the descriptor limit: each
 * read and each file's deep check opens the file again and refuses, with
 * SHARDD_E_FORMAT naming it, a file that is no longer the one (device and
 * inode) whose header was checked.
 * Failures leave their message in shardd_last_error(NULL) (per thread); an
 * open checkpoint may be read from several threads at once.
 * ------------------------------------------------------------------------ */
typedef struct shardd_ckpt shardd_ckpt;

typedef struct {
  const char *name;           /* valid until shardd_ckpt_close */
  const char *dtype;          /* safetensors name: "F32", "BF16", ... */
  int ndim;
  const uint64_t *shape;      /* ndim entries */
  uint64_t nbytes;            /* the whole tensor's bytes */
  const char *file;           /* the shard holding it, inside the folder */
} shardd_tensor_info;

SHARDD_EXPORT int shardd_ckpt_open(const char *path, shardd_ckpt **out);
SHARDD_EXPORT void shardd_ckpt_close(shardd_ckpt *c);
/* Tensors are numbered 0..count-1 in name order (strcmp). */
SHARDD_EXPORT size_t shardd_ckpt_count(const shardd_ckpt *c);
SHARDD_EXPORT int shardd_ckpt_tensor(const shardd_ckpt *c, size_t i, shardd_tensor_info *out);
/* SHARDD_E_INVALID_ARGUMENT when the checkpoint has no tensor of that name. */
SHARDD_EXPORT int shardd_ckpt_find(const shardd_ckpt *c, const char *name, size_t *i);
/* Copies the box start/count (ndim entries each; both NULL: the whole
 * tensor) of tensor name, row-major, into buf, which must be exactly the
 * box's bytes long (len). A box outside the shape, or a wrong len, is
 * SHARDD_E_INVALID_ARGUMENT naming the tensor. */
SHARDD_EXPORT int shardd_ckpt_read(const shardd_ckpt *c, const char *name, const uint64_t *start,
                                   const uint64_t *count, void *buf, size_t len);
/* The deep check: reads every byte of every file's data section once, in
 * order, of the files checked at shardd_ckpt_open (a file swapped in since
 * is refused, not read), and compares its CRC-32C with the one the
 * index records (a single file: its __metadata__). A difference is
 * SHARDD_E_CHECKSUM naming the file and both values; a file that shrank or
 * grew since it was checked, SHARDD_E_FORMAT naming it; a checkpoint that
 * records no checksums (written with checksums = off, or not by shardd),
 * SHARDD_E_CHECKSUM saying so, before reading anything. Costs one
 * sequential read of the whole checkpoint; may run beside reads. */
SHARDD_EXPORT int shardd_ckpt_verify(const shardd_ckpt *c);

#ifdef __cplusplus
}
#endif
#endif /* SHARDD_SHARDD_H */
