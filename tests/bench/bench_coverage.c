/* Benchmark: slice coverage for 100,000 tensors x 64 slices (TP/grid/inner splits, replicas), in given and shuffled order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sd_format.h"

#define NTENSORS 100000
#define NSLICES 64
#define NTEMPL 4096 /* distinct slice layouts, cycled: 64 MiB of boxes, more than the caches */

typedef struct {
  uint32_t ndim;
  uint64_t shape[3];
  sd_box b[NSLICES];
} templ;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of this process: steadier than wall time on a shared machine. */
static double cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Splits dimension d of shape into `parts` near-equal pieces, each box
 * spanning the other dimensions whole. */
static void split_dim(templ *t, uint32_t d, uint32_t parts, uint32_t copies) {
  uint32_t k = 0;
  for (uint32_t c = 0; c < copies; c++) {
    uint64_t at = 0;
    for (uint32_t p = 0; p < parts; p++, k++) {
      memset(&t->b[k], 0, sizeof t->b[k]);
      for (uint32_t i = 0; i < t->ndim; i++) t->b[k].count[i] = t->shape[i];
      uint64_t len = t->shape[d] / parts + (p < t->shape[d] % parts);
      t->b[k].start[d] = at;
      t->b[k].count[d] = len;
      at += len;
    }
  }
}

static void make(templ *t, int kind, uint64_t *seed) {
  memset(t, 0, sizeof *t);
  uint64_t m = 64 * (1 + rnd(seed) % 64);
  switch (kind) {
    case 0: /* row-parallel weight: dim-0 split over 64 ranks */
      t->ndim = 2, t->shape[0] = m * 4, t->shape[1] = 1024;
      split_dim(t, 0, 64, 1);
      break;
    case 1: /* column-parallel weight: dim-1 split */
      t->ndim = 2, t->shape[0] = 1024, t->shape[1] = m * 4;
      split_dim(t, 1, 64, 1);
      break;
    case 2: /* 8 x 8 grid */
      t->ndim = 2, t->shape[0] = m, t->shape[1] = 512;
      for (uint32_t r = 0, k = 0; r < 8; r++)
        for (uint32_t c = 0; c < 8; c++, k++) {
          t->b[k].start[0] = r * (m / 8), t->b[k].count[0] = m / 8;
          t->b[k].start[1] = c * 64, t->b[k].count[1] = 64;
        }
      break;
    case 3: /* 3-d, split on the inner dimension */
      t->ndim = 3, t->shape[0] = 16, t->shape[1] = m, t->shape[2] = 128;
      split_dim(t, 1, 64, 1);
      break;
    default: /* norm: TP=8 split, DP=8 replicas */
      t->ndim = 1, t->shape[0] = m * 8;
      split_dim(t, 0, 8, 8);
      break;
  }
}

static void shuffle(sd_box *b, size_t n, uint64_t *seed) {
  for (size_t i = n; i > 1; i--) {
    size_t j = rnd(seed) % i;
    sd_box x = b[i - 1];
    b[i - 1] = b[j];
    b[j] = x;
  }
}

/* Returns wall seconds; *cpu_s gets CPU seconds. */
static double run(const templ *tp, uint8_t *keep, long *failures, double *cpu_s) {
  sd_error err;
  double t0 = now(), c0 = cpu();
  for (long i = 0; i < NTENSORS; i++) {
    const templ *t = &tp[i % NTEMPL];
    if (sd_coverage_check("bench", t->ndim, t->shape, t->b, NSLICES, keep, &err)) (*failures)++;
  }
  *cpu_s = cpu() - c0;
  return now() - t0;
}

static void report(const char *what, const templ *tp, uint8_t *keep, long *failures) {
  double best = 1e9, best_cpu = 1e9;
  for (int r = 0; r < 3; r++) {
    double c, s = run(tp, keep, failures, &c);
    if (s < best) best = s;
    if (c < best_cpu) best_cpu = c;
  }
  printf("  %-20s: %.3f s wall, %.3f s cpu  (%.1f ns/slice cpu)\n", what, best, best_cpu,
         best_cpu * 1e9 / ((double)NTENSORS * NSLICES));
}

int main(void) {
  templ *tp = malloc(NTEMPL * sizeof *tp);
  if (!tp) return 1;
  uint64_t seed = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < NTEMPL; i++) make(&tp[i], i % 5, &seed);
  uint8_t keep[NSLICES];
  long failures = 0;

  printf("coverage: %d tensors x %d slices (row/column/grid/3-d inner splits, TP8xDP8 replicas)\n",
         NTENSORS, NSLICES);
  double warm;
  run(tp, keep, &failures, &warm);
  report("slices in rank order", tp, keep, &failures);
  for (int i = 0; i < NTEMPL; i++) shuffle(tp[i].b, NSLICES, &seed);
  report("slices shuffled", tp, keep, &failures);

  /* Error path: one slice missing from each tensor, so every check also
   * locates the first uncovered element. */
  double t0 = now(), c0 = cpu();
  long gaps = 0;
  sd_error err;
  for (long i = 0; i < NTENSORS; i++) {
    const templ *t = &tp[i % NTEMPL];
    if (sd_coverage_check("bench", t->ndim, t->shape, t->b + 1, NSLICES - 1, keep, &err) ==
        SHARDD_E_GAP)
      gaps++;
  }
  printf("  %-20s: %.3f s wall, %.3f s cpu  (%ld gaps located; replicated norms stay covered)\n",
         "one slice missing", now() - t0, cpu() - c0, gaps);
  if (failures) printf("  UNEXPECTED: %ld checks failed\n", failures);
  free(tp);
  return failures != 0;
}
