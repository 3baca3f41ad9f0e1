/* Benchmark: planning a 1,000,000-tensor checkpoint (8 slices each): coverage, shard plan, headers, index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "sd_format.h"

#define NTENSORS 1000000
#define NSLICES 8
#define NTEMPL 4096

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

/* Minor page faults so far: on a VM each first touch of a page can cost
 * more than the work done on it, so the count explains much of the time. */
static long faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A Llama-like layer: 7 matrices (TP=8 on dim 0 or dim 1) and 2 norms
 * (replicated on all 8 ranks). */
static const struct {
  const char *fmt;
  uint64_t d0, d1;
  int split; /* 0: dim 0, 1: dim 1, 2: replicated 1-d */
} kinds[] = {
    {"model.layers.%u.self_attn.q_proj.weight", 1024, 1024, 0},
    {"model.layers.%u.self_attn.k_proj.weight", 256, 1024, 0},
    {"model.layers.%u.self_attn.v_proj.weight", 256, 1024, 0},
    {"model.layers.%u.self_attn.o_proj.weight", 1024, 1024, 1},
    {"model.layers.%u.mlp.gate_proj.weight", 2816, 1024, 0},
    {"model.layers.%u.mlp.up_proj.weight", 2816, 1024, 0},
    {"model.layers.%u.mlp.down_proj.weight", 1024, 2816, 1},
    {"model.layers.%u.input_layernorm.weight", 1024, 0, 2},
    {"model.layers.%u.post_attention_layernorm.weight", 1024, 0, 2},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

/* One full planning pass over tensors given in perm order; returns 0 when
 * everything succeeded. */
static int run(const char *label, sd_tensor *t, char *names, sd_box (*tb)[NSLICES],
               const uint32_t *perm) {
  for (uint32_t i = 0; i < NTENSORS; i++) {
    uint32_t id = perm[i], k = id % NKINDS;
    char *nm = names + (size_t)i * 64;
    snprintf(nm, 64, kinds[k].fmt, id / (unsigned)NKINDS);
    t[i] = (sd_tensor){.name = nm, .dtype = SD_DT_BF16, .ndim = kinds[k].split == 2 ? 1 : 2,
                       .index = -1};
    t[i].shape[0] = kinds[k].d0;
    t[i].shape[1] = kinds[k].d1;
  }

  printf("%s\n", label);
  long f0 = faults();
  double t0 = now(), c0 = cpu();
  uint8_t keep[NSLICES];
  sd_error err;
  long bad = 0;
  for (uint32_t i = 0; i < NTENSORS; i++) {
    uint32_t k = perm[i] % NKINDS;
    if (sd_coverage_check(t[i].name, t[i].ndim, t[i].shape, tb[k], NSLICES, keep, &err)) bad++;
  }
  double t1 = now(), c1 = cpu();
  long f1 = faults();
  sd_plan p;
  int rc = sd_plan_build(&p, t, NTENSORS, NULL, &err);
  double t2 = now(), c2 = cpu();
  long f2 = faults();
  if (rc) {
    printf("plan failed: %s\n", err.msg);
    return 1;
  }
  size_t ilen = 0;
  char *ix = sd_index_encode(&p, t, &ilen, &err);
  double t3 = now(), c3 = cpu();
  long f3 = faults();
  uint64_t hdr = 0;
  for (size_t f = 0; f < p.nfiles; f++) hdr += p.files[f].header_size;
  printf("                 wall s   cpu s  page faults\n");
  printf("  coverage     : %7.3f %7.3f %8ld\n", t1 - t0, c1 - c0, f1 - f0);
  printf("  plan+headers : %7.3f %7.3f %8ld  (%zu files, %.1f MB of headers, %.1f GB of data)\n",
         t2 - t1, c2 - c1, f2 - f1, p.nfiles, (double)hdr / 1e6, (double)p.total_size / 1e9);
  printf("  coverage+plan: %7.3f %7.3f %8ld\n", t2 - t0, c2 - c0, f2 - f0);
  printf("  index        : %7.3f %7.3f %8ld  (%.1f MB)\n", t3 - t2, c3 - c2, f3 - f2,
         (double)ilen / 1e6);
  printf("  total        : %7.3f %7.3f %8ld\n", t3 - t0, c3 - c0, f3 - f0);
  if (bad) printf("  UNEXPECTED: %ld coverage checks failed\n", bad);
  int ok = !bad && ix;
  free(ix);
  sd_plan_free(&p);
  return !ok;
}

int main(void) {
  sd_tensor *t = calloc(NTENSORS, sizeof *t);
  char *names = malloc((size_t)NTENSORS * 64);
  sd_box(*tb)[NSLICES] = calloc(NKINDS, sizeof *tb);
  uint32_t *perm = malloc(NTENSORS * sizeof *perm);
  if (!t || !names || !tb || !perm) return 1;
  uint64_t seed = 88172645463325252ULL;

  for (uint32_t k = 0; k < NKINDS; k++) {
    for (uint32_t r = 0; r < NSLICES; r++) {
      sd_box *b = &tb[k][r];
      if (kinds[k].split == 2) {
        b->count[0] = kinds[k].d0;
        continue;
      }
      int d = kinds[k].split;
      uint64_t dim = d ? kinds[k].d1 : kinds[k].d0;
      b->count[0] = kinds[k].d0;
      b->count[1] = kinds[k].d1;
      b->start[d] = dim / NSLICES * r;
      b->count[d] = dim / NSLICES;
    }
  }
  int rc = 0;
  /* State-dict order (layer by layer), as ranks usually put them. */
  for (uint32_t i = 0; i < NTENSORS; i++) perm[i] = i;
  rc |= run("plan: 1,000,000 tensors x 8 slices, Llama-like layers, TP=8, state-dict order", t,
            names, tb, perm);
  /* Worst case for memory locality: every tensor in random order. */
  for (uint32_t i = NTENSORS; i > 1; i--) {
    uint32_t j = (uint32_t)(rnd(&seed) % i), x = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = x;
  }
  rc |= run("plan: same tensors in random order", t, names, tb, perm);
  free(t);
  free(names);
  free(tb);
  free(perm);
  return rc;
}
