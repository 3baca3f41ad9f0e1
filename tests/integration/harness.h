/* Integration harness: a real shardd on a scratch root, real rank processes, checkpoints read back from disk. */
#ifndef SD_IT_HARNESS_H
#define SD_IT_HARNESS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fixture.h"
#include "sd_format.h"
#include "sd_reader.h"
#include "shardd/shardd.h"

/* Generous bounds that only stop a hung test; no test asserts a duration. */
#define H_WAIT_MS 60000
#define H_MAX_RANKS 16
#define H_MAX_SYNC 16
/* Counter every scripted rank bumps after its begin: a rank that kills
 * itself waits for all to have begun, or a late rank would get save_failed
 * instead of the failure the test is about. */
#define H_SYNC_BEGUN (H_MAX_SYNC - 1)
/* Counter of ranks ready to begin (h_script.begin_together). */
#define H_SYNC_READY (H_MAX_SYNC - 2)

/* ------------------------------------------------------------------------ *
 * The daemon under test
 *
 * Paths come from the environment meson sets: SHARDD (daemon binary),
 * SHARDD_EXAMPLE_RANK, SHARDCTL. Each test gets its own scratch folder
 * (f_scratch, fixture.h) holding the root, the socket, the daemon's log and
 * an `outside` folder that escape tests watch; fixture.c starts and stops it.
 * ------------------------------------------------------------------------ */
/* Criterion .init/.fini: start H; stop it (asserting a clean exit that
 * removed the socket) and remove the scratch folder. Set H_KEEP=1 in the
 * environment to keep the scratch folder (and the daemon's log) for a look. */
void h_setup(void);
void h_teardown(void);

/* Starts the daemon on d->root/d->sock (filled in by h_setup; reusable for a
 * restart) and returns once the socket accepts connections. */
void h_daemon_start(h_daemon *d);
/* SIGTERM; asserts exit status 0 and that the socket file is gone. */
void h_daemon_stop(h_daemon *d);

/* "ROOT/rel" into buf. */
const char *h_path(char *buf, size_t n, const char *rel);

/* ------------------------------------------------------------------------ *
 * Rank processes and what they report
 * ------------------------------------------------------------------------ */
typedef struct {
  int rc;                   /* first failing call's code, 0 when none failed */
  char step[16];            /* which call: connect, arena, begin, put, file, seal, wait, ... */
  char msg[1024];           /* shardd_last_error of that call */
  int wrc;                  /* how the save ended for this rank, as its wait said */
  char wmsg[1024];
  int waited;               /* a wait was answered */
  shardd_result res;        /* the committed result, when wrc == 0 */
  char shm[128];            /* arena name, so the parent can clean up after a kill */
  int done;                 /* reached the end of its script */
} h_result;

/* Lives in MAP_SHARED memory, so forked ranks write and the test reads. */
typedef struct {
  h_result r[H_MAX_RANKS];
  volatile int counters[H_MAX_SYNC];
} h_shared;

h_shared *h_shared_new(void);
void h_shared_free(h_shared *s);
/* Cross-process rendezvous: bump counter k; wait until it reaches n. */
void h_signal(h_shared *s, int k);
/* 0, or -1 after H_WAIT_MS (the caller reports it). */
int h_await(h_shared *s, int k, int n);

/* Remembers a child whose shared-memory segments (/dev/shm/shardd-PID-*)
 * teardown unlinks: a rank that crashes or is killed leaves them behind.
 * h_fork tracks its children itself. */
void h_track_pid(pid_t pid);

typedef void (*h_child_fn)(int idx, void *arg);
/* Forks a child that runs fn(idx, arg) and _exits 0; it dies with the test. */
pid_t h_fork(h_child_fn fn, int idx, void *arg);
/* Waits for pid (killing it after H_WAIT_MS); returns the raw wait status. */
int h_reap(pid_t pid);
/* Reaps and asserts a clean exit 0. */
void h_reap_ok(pid_t pid, const char *what);

/* Polls status until save `id` is in flight with at least n ranks begun
 * (asserts it happens within H_WAIT_MS); h_await_sealed: n ranks sealed. */
void h_await_begun(const char *id, int n);
void h_await_sealed(const char *id, int n);

/* Child side: sends a wait for save and makes sure the daemon has taken it
 * (a status round trip behind it), without blocking on the save's end. A
 * later shardd_wait on c picks up that same wait. 0 or the failing code. */
int h_wait_registered(shardd_client *c, const char *save);

/* Records a failure of `step` from client c into r (c may be NULL). */
void h_result_fail(h_result *r, const char *step, int rc, const shardd_client *c);

/* ------------------------------------------------------------------------ *
 * Scripted saves: one table of puts for every rank of a save
 * ------------------------------------------------------------------------ */
/* shardd_put, shardd_put_copy, shardd_put_inline; H_DEFERRED: shardd_put_deferred, then after
 * the files shardd_declared, the bytes copied in put order with a shardd_ready after each
 * (unless the script says no_ready: then the seal alone says they are in place). */
enum { H_ARENA = 0, H_COPY, H_INLINE, H_DEFERRED };
enum {
  H_END_WAIT = 0,          /* seal, then wait for the end */
  H_END_DESTROY_EXIT,      /* seal, destroy the arena (detach, unlink), close, exit */
  H_END_UNLINK_EXIT,       /* seal, shm_unlink, _exit without a goodbye */
  H_END_KILL_BEFORE_SEAL,  /* put everything, then SIGKILL itself */
};
/* Hook points: after begin, after declared (streamed ranks), after puts (and their
 * ready calls), after seal. */
enum { H_AT_BEGIN, H_AT_PUTS, H_AT_SEAL, H_AT_DECLARED };

typedef struct {
  int rank;                /* which rank puts it; -1: every rank (a replica) */
  const char *name, *dtype;
  int ndim;
  uint64_t shape[SD_MAX_DIMS];
  int boxed;               /* 0: the whole tensor */
  uint64_t start[SD_MAX_DIMS], count[SD_MAX_DIMS];
  int has_index;
  int64_t index;
  int how;                 /* H_ARENA, H_COPY or H_INLINE */
  const void *bytes;       /* the slice's packed bytes; NULL: synthetic (synth.h, seed) */
  size_t len;
} h_put;

typedef struct {
  int rank;                /* -1: every rank sends it */
  const char *path;
  const void *data;
  size_t len;
} h_file;

typedef struct h_script h_script;
typedef void (*h_hook_fn)(const h_script *s, int rank, int point, shardd_client *c);

struct h_script {
  shardd_save_opts opts;   /* rank is filled in per process */
  const h_put *puts;
  size_t nputs;
  const h_file *files;
  size_t nfiles;
  uint64_t seed;
  int end[H_MAX_RANKS];    /* H_END_* per rank */
  int wait_after_fail;     /* after a failed call, still wait to learn how the save ended */
  int no_ready;            /* H_DEFERRED puts: no shardd_ready calls, only the seal */
  int arena_if_bytes;      /* a rank whose puts hold no byte creates no arena: its puts name none */
  int place;               /* arena offsets from shardd_place (zero-copy placement), not packed */
  int begin_together;      /* n > 0: a rank connected, its arena made, waits for n ranks to be so before
                            * its begin, so a deadline from the first begin does not count the others'
                            * start on a busy machine */
  h_hook_fn hook;
  void *ud;
  h_shared *sh;            /* results; set by h_run */
};

/* One rank's whole life (connect, arena, begin, puts, files, seal, end). */
void h_rank_main(int rank, void *script);
/* Forks world_size ranks running s, reaps them all (a rank killing itself
 * on purpose is expected to die of SIGKILL; every other exits 0) and leaves
 * their reports in s->sh (allocated here if NULL). */
void h_run(h_script *s);
/* Forks only; the caller reaps with h_reap_all. */
void h_start(h_script *s, pid_t *pids);
void h_reap_all(h_script *s, const pid_t *pids);

/* Asserts every rank saw the save commit. */
void h_expect_committed(const h_script *s);
/* Asserts every rank's save ended with `code` and a message holding each
 * of the NULL-terminated fragments. */
void h_expect_failed(const h_script *s, int code, ...) __attribute__((sentinel));

/* ------------------------------------------------------------------------ *
 * Reading back
 * ------------------------------------------------------------------------ */
/* Strictly reads ROOT/rel (asserting it is valid, and that every file records a checksum that
 * its bytes match); free with sd_ckpt_free. */
void h_ckpt_read(const char *rel, sd_ckpt *c);
/* 0 while a test's daemons run with checksums = off (h_ckpt_read then accepts files without one). */
extern int h_sums_expected;
/* The strict reader's checks only (a checkpoint that may record no checksums). */
void h_ckpt_read_headers(const char *rel, sd_ckpt *c);
/* The deep check of a folder read into c (path absolute): every file has a recorded CRC-32C, read
 * and compared (asserted); returns how many files were. */
size_t h_ckpt_deep(const char *path, const sd_ckpt *c);
/* The file and header entry holding a tensor, or NULL. */
const sd_st_tensor *h_ckpt_find(const sd_ckpt *c, const char *name, const sd_ckpt_file **file);
/* The tensor's bytes as stored on disk (malloc'd; *len set). Asserts presence. */
uint8_t *h_read_tensor(const char *rel, const char *name, size_t *len);
/* Compares every tensor the script put against what ranks sent (or the
 * synthetic bytes): dtype, shape and every byte; also that the checkpoint
 * holds no other tensor, that each tensor is aligned to its element size,
 * and that shardctl verify accepts it and shardctl inspect lists each tensor. */
void h_check_script(const h_script *s);
/* Asserts tensor `name` in ROOT/rel holds exactly len bytes equal to want. */
void h_check_bytes(const char *rel, const char *name, const void *want, size_t len);
/* The data checksums recorded in ROOT/rel (sd_checksum.h: the index's
 * metadata, or a single file's __metadata__): with want, every shard file
 * has one and it is the CRC-32C of the file's data section as read back
 * from disk; without, none is recorded. Returns the shard files checked. */
size_t h_check_sums(const char *rel, int want);

/* ------------------------------------------------------------------------ *
 * Tools and the file system
 * ------------------------------------------------------------------------ */
/* Runs $SHARDCTL with the given NULL-terminated arguments (--socket is
 * added first), output (stdout and stderr) into out; returns the wait status. */
int h_shardctl(char *out, size_t n, ...) __attribute__((sentinel));
void h_verify_ok(const char *rel);
/* lstat succeeds: the path exists (a dangling symlink counts). */
int h_exists(const char *path);
/* Entries in a folder but the root's lock file; -1 when it is not a folder (symlinks not followed). */
int h_dir_count(const char *path);
/* Number of `.shardd-tmp-*` entries anywhere under the root. */
int h_tmp_count(void);
/* Polls until h_tmp_count() is 0 (F_POLL's bound): a multi-node save's folders go once every node
 * has stopped its writes, after the ranks heard the failure. The caller asserts. */
void h_await_no_tmp(void);
/* The save failed cleanly: ROOT/rel is absent and no temporary folder is left. */
void h_expect_unpublished(const char *rel);
/* The daemon still serves: status answers with no save in flight and a
 * fresh one-rank save commits with the bytes it was given. */
void h_expect_serving(void);

/* huggingface_hub's split_state_dict_into_shards_factory over tensor sizes in
 * walk order, written here apart from the daemon's planner: file_of[i] gets
 * tensor i's 0-based shard; returns the number of shards. */
size_t h_hf_split(const uint64_t *sizes, size_t n, uint64_t max, uint32_t *file_of);

/* Synthetic bytes of a whole tensor (malloc'd). */
uint8_t *h_synth_tensor(const char *name, uint64_t seed, const char *dtype, int ndim,
                        const uint64_t *shape, size_t *len);
unsigned h_dtype_size(const char *dtype);

#endif
