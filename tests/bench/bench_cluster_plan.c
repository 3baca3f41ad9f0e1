/* Benchmark: the leader's planning alone at real shapes (no dims divided): DeepSeek-V3's table in FSDP2 over N nodes x 8 ranks, each node's eight dim-0 shards merged into one box as nodes send them; prints the boxes, the time and CPU to record and plan them, and the peak RSS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cluster_model.h"
#include "cluster_plan.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double peak_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0;
}


int main(int argc, char **argv) {
  int nodes = argc > 1 ? atoi(argv[1]) : 64, per_node = 8, fp8 = argc > 2 && !strcmp(argv[2], "fp8");
  if (nodes < 1 || nodes > SD_NNODES_MAX) {
    fprintf(stderr, "usage: bench_cluster_plan [NODES] [fp8]\n");
    return 2;
  }
  cm_model m;
  if (cm_deepseek_v3(&m, 1, fp8, 0) != 0) return 1;
  sd_cmanifest man = {0};
  sd_error err = {0};
  double t0 = now(), c0 = cpu();
  size_t boxes = 0;
  uint64_t parts[64];
  for (int k = 0; k < nodes; k++) {
    for (size_t i = 0; i < m.n; i++) {
      const cm_tensor *t = &m.t[i];
      sd_dtype dt;
      if (sd_dtype_parse(t->dtype, &dt, &err) != 0) return 1;
      uint32_t ti;
      if (sd_cmanifest_tensor(&man, t->name, dt, (uint32_t)t->ndim, t->shape, (int64_t)i, (uint32_t)k,
                              (uint32_t)(k * per_node), &ti, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
      }
      /* The node's ranks' boxes, merged where they meet along dim 0. */
      uint64_t start[2] = {0, 0}, count[2] = {0, t->ndim > 1 ? t->shape[1] : 0};
      uint32_t np = 0;
      for (int j = 0; j < per_node; j++) {
        uint64_t s[2], c[2];
        cm_box(CM_FSDP, &m, i, k * per_node + j, nodes, per_node, s, c);
        if (!c[0]) continue;
        if (!np) start[0] = s[0];
        count[0] += c[0];
        parts[np++] = c[0];
      }
      if (!np) continue;
      if (t->ndim < 2) start[1] = 0;
      /* as a node sends it: an even split's parts as one count */
      int even = np > 1;
      for (uint32_t j = 1; even && j < np; j++) even = j + 1 < np ? parts[j] == parts[0] : parts[j] <= parts[0];
      if (sd_cmanifest_box(&man, ti, (uint32_t)k, (uint32_t)(k * per_node), boxes, start, count, np > 1 ? parts : NULL,
                           even ? 1 : np > 1 ? np : 0, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
      }
      boxes++;
    }
  }
  double t1 = now(), c1 = cpu(), rss1 = peak_mib();
  sd_plan_opts o = {.max_shard_size = 5000000000ULL, .prefix = "model", .checksums = 1};
  sd_cplan p;
  if (sd_cplan_build(&man, (uint32_t)nodes, SD_WRITE_OWNER, &o, &p, &err) != 0) {
    fprintf(stderr, "plan: %s\n", err.msg);
    return 1;
  }
  double t2 = now(), c2 = cpu();
  printf("bench_cluster_plan: DeepSeek-V3 %s (%zu tensors, real shapes), FSDP2 over %d x %d ranks: %zu boxes "
         "(merged per node), %zu files, %zu writes; recorded in %.2f s (%.2f s CPU), peak RSS %.1f MiB; planned in "
         "%.2f s (%.2f s CPU), peak RSS %.1f MiB\n",
         fp8 ? "fp8" : "bf16", m.n, nodes, per_node, boxes, p.plan.nfiles, p.nwrites, t1 - t0, c1 - c0, rss1, t2 - t1,
         c2 - c1, peak_mib());
  sd_cplan_free(&p);
  sd_cmanifest_free(&man);
  cm_free(&m);
  return 0;
}
