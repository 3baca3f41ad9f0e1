/* shardctl's tables and progress bars: how a daemon's status reply reads on a terminal. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "shardctl_status.h"

/* A number field (integer or real) of o, 0 when absent. */
static uint64_t u64(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

static const char *str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "?";
}

/* 1536 -> "1.5 KiB": tables are for people; --json has the exact numbers. */
static void human(uint64_t b, char *buf, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  if (u == 0) snprintf(buf, n, "%llu B", (unsigned long long)b);
  else snprintf(buf, n, "%.1f %s", v, units[u]);
}

static double percent(const json_t *s) {
  uint64_t planned = u64(s, "bytes_planned"), written = u64(s, "bytes_written");
  if (!planned) return 0;
  double p = 100.0 * (double)written / (double)planned;
  return p > 100 ? 100 : p;
}

/* Save ids are tame (the daemon checks them) but the daemon is not trusted
 * with the terminal: control characters are not printed. */
static void put_clean(FILE *out, const char *s, int width) {
  int w = 0;
  for (; *s; s++, w++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
  for (; w < width; w++) fputc(' ', out);
}

/* Multi-node state, when the daemon listens for peers: connections, and the leader states it
 * holds (each costs memory for every node of its save, so a limit applies). */
static void print_peers(FILE *out, const json_t *p) {
  if (!json_is_object(p)) return;
  const json_t *leading = json_object_get(p, "leader_saves");
  fprintf(out, "peers: %llu connections (%llu not logged in); leader states: %zu of max %llu\n",
          (unsigned long long)u64(p, "connections"), (unsigned long long)u64(p, "connections_unauthenticated"),
          json_array_size(leading), (unsigned long long)u64(p, "max_leader_saves"));
  size_t i;
  const json_t *l;
  json_array_foreach(leading, i, l) {
    char mem[32];
    human(u64(l, "memory_bytes"), mem, sizeof mem);
    fprintf(out, "  leading ");
    put_clean(out, str(l, "save"), 0);
    fprintf(out, ": %s, %llu of %llu nodes joined, %s\n", str(l, "state"), (unsigned long long)u64(l, "joined"),
            (unsigned long long)u64(l, "nnodes"), mem);
  }
}

/* Until every rank has declared its tensors the planned bytes still grow, so a percentage would
 * mean nothing: "declaring (k of N ranks)" instead. 0 once all have (or from a daemon that does
 * not say). */
static int declaring(const json_t *s, char *buf, size_t n) {
  const json_t *k = json_object_get(s, "ranks_declared");
  if (!json_is_integer(k) || u64(s, "ranks_declared") >= u64(s, "world_size")) return 0;
  snprintf(buf, n, "declaring (%llu of %llu ranks)", (unsigned long long)u64(s, "ranks_declared"),
           (unsigned long long)u64(s, "world_size"));
  return 1;
}

void shardctl_print_status_table(FILE *out, const json_t *st) {
  const json_t *saves = json_object_get(st, "saves");
  size_t n = json_array_size(saves), i;
  int wid = 4;
  for (i = 0; i < n; i++) {
    int l = (int)strlen(str(json_array_get(saves, i), "save"));
    if (l > wid) wid = l;
  }
  if (n == 0) {
    fprintf(out, "no saves in flight\n");
  } else {
    fprintf(out, "%-*s  %-8s  %6s  %6s  %11s  %11s  %6s\n", wid, "SAVE", "STATE", "BEGUN", "SEALED", "WRITTEN",
            "PLANNED", "DONE");
    for (i = 0; i < n; i++) {
      const json_t *s = json_array_get(saves, i);
      char begun[32], sealed[32], w[32], p[32];
      snprintf(begun, sizeof begun, "%llu/%llu", (unsigned long long)u64(s, "ranks_begun"),
               (unsigned long long)u64(s, "world_size"));
      snprintf(sealed, sizeof sealed, "%llu/%llu", (unsigned long long)u64(s, "ranks_sealed"),
               (unsigned long long)u64(s, "world_size"));
      human(u64(s, "bytes_written"), w, sizeof w);
      human(u64(s, "bytes_planned"), p, sizeof p);
      put_clean(out, str(s, "save"), wid);
      char decl[64];
      if (declaring(s, decl, sizeof decl))
        fprintf(out, "  %-8s  %6s  %6s  %11s  %11s  %s\n", str(s, "state"), begun, sealed, w, p, decl);
      else
        fprintf(out, "  %-8s  %6s  %6s  %11s  %11s  %5.1f%%\n", str(s, "state"), begun, sealed, w, p, percent(s));
    }
  }
  const json_t *t = json_object_get(st, "totals");
  char total[32];
  human(u64(t, "bytes_written"), total, sizeof total);
  fprintf(out, "clients: %llu, regions: %llu\n", (unsigned long long)u64(st, "clients"),
          (unsigned long long)u64(st, "regions"));
  fprintf(out, "totals: %llu saves committed, %llu failed, %llu bytes written (%s)\n",
          (unsigned long long)u64(t, "saves_committed"), (unsigned long long)u64(t, "saves_failed"),
          (unsigned long long)u64(t, "bytes_written"), total);
  print_peers(out, json_object_get(st, "peers"));
}

#define BAR_WIDTH 30

void shardctl_print_watch_frame(FILE *out, const json_t *st, const char *node) {
  time_t now = time(NULL);
  struct tm tm;
  char stamp[32];
  localtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  const json_t *saves = json_object_get(st, "saves");
  size_t n = json_array_size(saves);
  const json_t *t = json_object_get(st, "totals");
  fprintf(out, "shardd on %s  %s  %zu save%s in flight, %llu clients, %llu committed, %llu failed\n", node, stamp,
          n, n == 1 ? "" : "s", (unsigned long long)u64(st, "clients"),
          (unsigned long long)u64(t, "saves_committed"), (unsigned long long)u64(t, "saves_failed"));
  for (size_t i = 0; i < n; i++) {
    const json_t *s = json_array_get(saves, i);
    double p = percent(s);
    int fill = (int)(p / 100.0 * BAR_WIDTH + 0.5);
    char bar[BAR_WIDTH + 1], w[32], pl[32];
    for (int k = 0; k < BAR_WIDTH; k++) bar[k] = k < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    human(u64(s, "bytes_written"), w, sizeof w);
    human(u64(s, "bytes_planned"), pl, sizeof pl);
    put_clean(out, str(s, "save"), 0);
    char decl[64];
    if (declaring(s, decl, sizeof decl)) {
      fprintf(out, "  %-8s %s  %s put so far\n", str(s, "state"), decl, pl);
      continue;
    }
    fprintf(out, "  %-8s [%s] %5.1f%%  %s / %s  sealed %llu/%llu\n", str(s, "state"), bar, p, w, pl,
            (unsigned long long)u64(s, "ranks_sealed"), (unsigned long long)u64(s, "world_size"));
  }
}
