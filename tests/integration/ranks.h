/* The example rank program (shardd-example-rank) as real processes: spawned with a model's options, its JSON line read back, its checkpoint checked against synth.h. */
#ifndef SD_IT_RANKS_H
#define SD_IT_RANKS_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

/* shardd-example-rank's options for every rank of one save. */
typedef struct {
  uint64_t hidden, layers, vocab, inter, max_shard_size, seed;
  int world, tp;
  const char *dtype, *save, *dir;
  int kill_rank; /* this rank gets --kill-before-seal; -1: none */
  int stream;    /* --stream: deferred puts, declared, ready */
  int repeat;    /* --repeat: saves over one connection and arena (0: the option is not given) */
  int overwrite; /* --overwrite */
  int keep_last; /* --keep-last (0: the option is not given) */
} r_model;

/* Forks and execs $SHARDD_EXAMPLE_RANK as `rank` of m on H's socket, stdout into out and stderr
 * into out.err; the child dies with the test (PR_SET_PDEATHSIG), its segments are tracked. */
pid_t r_spawn(const r_model *m, int rank, const char *out);
/* The JSON line a rank printed into out, parsed; NULL when it printed none (killed early). */
json_t *r_line(const char *out);

typedef struct {
  char name[96];
  int ndim;
  uint64_t shape[2];
} r_tensor;

/* The model as rank_writer.c builds it, in state-dict order; t holds 4 + 9 * layers entries. */
size_t r_model_tensors(const r_model *m, r_tensor *t);
/* ROOT/m->dir holds exactly m's tensors with synth.h's bytes for m->seed, its config.json, and
 * shardctl verify accepts it. */
void r_check_model(const r_model *m);
/* Whether the tensor model.norm.weight of ROOT/dir holds m->seed's bytes (no assertion): which
 * of two saves an overwritten folder holds. */
int r_holds_seed(const r_model *m, const char *dir);

#endif
