/* End-to-end benchmark internals shared by its parts: the model, the raw writer, /proc probes, checkpoint checks. */
#ifndef SD_BENCH_E2E_H
#define SD_BENCH_E2E_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "sd_format.h"

/* ------------------------------------------------------------------------ *
 * The model: the same Llama-shaped BF16 tensors shardd-example-rank builds
 * (same names, order, state-dict positions and synthetic bytes, seed 0), so
 * the serial baseline writes the very checkpoint the ranks hand to shardd.
 * ------------------------------------------------------------------------ */
typedef struct {
  char name[96];
  uint64_t nbytes;
  uint64_t key;             /* sd_synth_key(name, 0) */
} sd_e2e_tensor;

typedef struct {
  uint64_t hidden, intermediate, layers, vocab, max_shard_size;
  size_t n;
  sd_e2e_tensor *t;
  sd_tensor *st;            /* the same tensors for the planner and the sync writer */
  uint64_t tensor_bytes;    /* sum of tensor bytes */
  uint64_t rank_bytes;      /* bytes one TP=2 rank puts (its half plus the norms) */
  uint64_t file_bytes;      /* headers + data + index, as planned */
  size_t nfiles;
} sd_e2e_model;

/* The model for about gib GiB (max_shard 0: a quarter of it per file), and
 * its plan's files and bytes (e2e_model.c). */
int sd_e2e_build_model(sd_e2e_model *m, double gib, uint64_t max_shard);
int sd_e2e_plan_model(sd_e2e_model *m);
/* The metadata the example rank sends, so every phase writes identical files. */
extern const sd_kv sd_e2e_example_md[3];

/* ------------------------------------------------------------------------ *
 * (a) raw: one io_uring sequential writer of `bytes` into path, fsynced.
 * ------------------------------------------------------------------------ */
typedef struct {
  int ok;
  int direct;               /* 1 when O_DIRECT was used throughout */
  int fixed_bufs;           /* 1 when the buffers were registered with the ring */
  int preallocated;         /* 1 when fallocate reserved the whole file first */
  uint64_t bytes;
  double seconds;           /* open to fsync returned */
  double cpu_s;             /* this process (io-wq workers included) */
  char note[256];           /* fallbacks, or the error when !ok */
} sd_e2e_raw;

void sd_e2e_raw_write(const char *path, uint64_t bytes, unsigned qd, size_t bufsize,
                      sd_e2e_raw *out);

/* ------------------------------------------------------------------------ *
 * Machine and process probes (/proc, statfs)
 * ------------------------------------------------------------------------ */
int sd_e2e_fmt(char *dst, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
double sd_e2e_now(void);
double sd_e2e_self_cpu(void);                    /* user + system of this process */
double sd_e2e_load1(void);
void sd_e2e_machine(const char *dir, char *out, size_t len); /* multi-line description */
uint64_t sd_e2e_mem_available(void);
/* utime + stime of pid in seconds (all its threads), or -1. */
double sd_e2e_proc_cpu(pid_t pid);
/* A "Key:   N kB" line of /proc/PID/status, in bytes; 0 when absent. */
uint64_t sd_e2e_proc_status(pid_t pid, const char *key);
/* rm -rf of a folder we created; errors ignored (reported by the caller's checks). */
void sd_e2e_rmtree(const char *path);

/* ------------------------------------------------------------------------ *
 * Checkpoint check: the strict reader accepts dir, it holds exactly the
 * model's tensors with the right dtype and shape, and every byte equals the
 * synthetic content. msg says what was checked or the first problem.
 * ------------------------------------------------------------------------ */
int sd_e2e_verify(const char *dir, const sd_e2e_model *m, char *msg, size_t len);

/* ------------------------------------------------------------------------ *
 * Options bench_e2e and bench_multi share (e2e_opts.c); each has its own usage text
 * ------------------------------------------------------------------------ */
typedef struct {
  double gib;
  const char *parent, *shardd, *rank_bin, *phases;
  uint64_t max_shard_size;  /* 0: about a quarter of the model, so several files */
  double timeout_s;         /* ranks still running after this are killed: a hang guard */
  int keep;
  unsigned raw_buf_mib;     /* bench_e2e's (a) write size; bench_multi takes it and ignores it */
  char shardd_buf[PATH_MAX], rank_bin_buf[PATH_MAX]; /* the binaries found beside this one */
} sd_e2e_opts;

/* Parses argv into o, whose defaults the caller set: --gib, --quick, --dir, --shardd, --rank-bin,
 * --phases, --max-shard-size, --timeout, --keep, --raw-buf-mib, --help. Then --shardd and --rank-bin
 * default to $SHARDD_BIN and $SHARDD_EXAMPLE_RANK, else to the binaries of this build tree (NULL when
 * none). Messages start with prog. Returns -1 to go on, or the exit status: 0 after --help (usage to
 * stdout), 2 on a bad option (usage or the reason to stderr). */
int sd_e2e_parse_opts(sd_e2e_opts *o, int argc, char **argv, const char *prog, void (*usage)(FILE *f));

/* ------------------------------------------------------------------------ *
 * Phases and what they measured (bench_e2e.c runs them, e2e_report.c prints)
 * ------------------------------------------------------------------------ */
#define GIB 1073741824.0
#define NRANKS 4

typedef struct {
  int ran, ok;              /* ok: the phase wrote (and, for b and c, verified) its output */
  uint64_t bytes;
  double seconds, cpu_s, load_before, load_after;
  char note[512];
} phase;

typedef struct {
  int rank, exit_ok, signal;
  uint64_t bytes;
  double blocked, memcpy_s, setup, begin, puts, seal, wait, cpu;
  char state[32], error[256];
} rank_out;

typedef struct {
  double wall_s, window_s, spread_s;
  double ready_s;           /* spawn -> every rank generated its tensors and connected */
  double go_s;              /* start signal -> every rank committed, timed here */
  double daemon_cpu_s;
  double tail_s;            /* last seal -> commit: the daemon's write, fsync and publish */
  uint64_t hwm, peak_anon, peak_shmem, anon_end, shmem_end;
  int daemon_exit;          /* wait status, -1 when it had to be killed */
  int same_layout;
  rank_out r[NRANKS];
  char daemon_line[512];
  char sealed_line[160];
} shardd_stats;

/* The table, the ratios to the raw runs, and each shardd phase's details:
 * (c) classic ranks, (s) streamed, (z) placed by the placement rule. */
void sd_e2e_report(const sd_e2e_model *m, const phase *a, const phase *a2, const phase *b, const phase *c,
                   const shardd_stats *cs, const phase *st, const shardd_stats *ss, const phase *z,
                   const shardd_stats *zs);

#endif
