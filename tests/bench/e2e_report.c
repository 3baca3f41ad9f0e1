/* The end-to-end benchmark's report: one table, ratios to the raw runs, per-rank and daemon details of each shardd phase. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "bench_e2e.h"

static double gbps(const phase *p) { return p->ok && p->seconds > 0 ? (double)p->bytes / p->seconds / 1e9 : 0; }

static void row(const char *label, const phase *p) {
  if (!p->ran) {
    printf("%-26s %14s %9s %7s %9s %11s\n", label, "-", "-", "-", "-", "skipped");
    return;
  }
  printf("%-26s %14" PRIu64 " %9.3f %7.3f %9.3f %5.2f-%5.2f\n", label, p->bytes, p->seconds, gbps(p),
         p->bytes ? p->cpu_s / ((double)p->bytes / GIB) : 0, p->load_before, p->load_after);
}

/* The device's speed drifts on a shared virtual disk: (a) runs before and
 * after the others, and the ratios use the mean of the two. */
static double raw_gbps(const phase *a, const phase *a2) {
  double x = gbps(a), y = gbps(a2);
  return x > 0 && y > 0 ? (x + y) / 2 : x > 0 ? x : y;
}

static void ratios(const char *label, const phase *c, const phase *a, const phase *a2, const phase *b) {
  double ra = raw_gbps(a, a2);
  if (gbps(c) <= 0) return;
  printf("ratios %s  /a = %s", label, ra > 0 ? "" : "n/a");
  if (ra > 0) printf("%.2f", gbps(c) / ra);
  if (gbps(a) > 0 && gbps(a2) > 0)
    printf(" (%.2f vs the first raw run, %.2f vs the last)", gbps(c) / gbps(a), gbps(c) / gbps(a2));
  printf("   %s/b = %s", label, gbps(b) > 0 ? "" : "n/a");
  if (gbps(b) > 0) printf("%.2f", gbps(c) / gbps(b));
  printf("\n");
}

static void detail(const char *label, const sd_e2e_model *m, const phase *b, const phase *c,
                   const shardd_stats *s) {
  if (!c->ran) return;
  printf("\n%s shardd, save window %.3f s (first begin -> all committed; ranks began %.3f s apart)\n", label,
         s->window_s, s->spread_s);
  printf("          last seal -> all committed %.3f s = %.3f GB/s (what the daemon had left to write, fsync, publish)\n",
         s->tail_s, s->tail_s > 0 ? (double)c->bytes / s->tail_s / 1e9 : 0);
  printf("          start signal -> all ranks exited %.3f s (timed here; ranks got ready in %.1f s:\n"
         "          each generated its %.2f GiB of tensors and pre-faulted its arena)\n"
         "          memcpy_s: the faster of two plain memcpys of each rank's bytes into its arena,\n"
         "          each pass started on all four ranks at once\n",
         s->go_s, s->ready_s, (double)m->rank_bytes / GIB);
  printf("\n%-6s %13s %10s %10s %8s %9s %9s %9s %8s  %s\n", "rank", "bytes", "blocked_s", "memcpy_s",
         "blk/cpy", "puts_s", "seal_s", "wait_s", "cpu_s", "state");
  double bmax = 0, cmax = 0;
  for (int r = 0; r < NRANKS; r++) {
    const rank_out *x = &s->r[r];
    printf("%-6d %13" PRIu64 " %10.3f %10.3f %8.2f %9.3f %9.3f %9.3f %8.2f  %s\n", r, x->bytes,
           x->blocked, x->memcpy_s, x->memcpy_s > 0 ? x->blocked / x->memcpy_s : 0, x->puts, x->seal,
           x->wait, x->cpu, x->state);
    if (x->blocked > bmax) bmax = x->blocked;
    if (x->memcpy_s > cmax) cmax = x->memcpy_s;
  }
  printf("max    %13s %10.3f %10.3f %8.2f\n", "", bmax, cmax, cmax > 0 ? bmax / cmax : 0);
  printf("\ndaemon    peak RSS (VmHWM) %.1f MiB = private + ranks' shared memory it touched;\n"
         "          sampled every 20 ms: peak RssAnon %.1f MiB, peak RssShmem %.1f MiB;\n"
         "          at stop: RssAnon %.1f MiB, RssShmem %.1f MiB\n",
         (double)s->hwm / 1048576.0, (double)s->peak_anon / 1048576.0,
         (double)s->peak_shmem / 1048576.0, (double)s->anon_end / 1048576.0,
         (double)s->shmem_end / 1048576.0);
  printf("          CPU (utime+stime, all threads) %.2f s = %.3f s/GiB; exit on SIGTERM: %s\n",
         s->daemon_cpu_s, c->bytes ? s->daemon_cpu_s / ((double)c->bytes / GIB) : 0,
         s->daemon_exit == -1               ? "did not stop within 30 s, killed"
         : WIFEXITED(s->daemon_exit) && !WEXITSTATUS(s->daemon_exit) ? "clean (0)"
                                                                     : "NOT clean");
  unsigned long long direct = 0, gathered = 0, copied = 0;
  const char *dc = strstr(s->daemon_line, " bytes forwarded, ");
  if (dc && sscanf(dc, " bytes forwarded, %llu bytes direct, %llu gathered, %llu copied", &direct, &gathered, &copied) == 3 &&
      direct + gathered + copied) {
    double all = (double)(direct + gathered + copied);
    printf("          bytes direct (zero-copy from one rank's memory) %llu, gathered (one writev from several ranks')\n"
           "          %llu, copied through staging %llu: %.1f%% direct, %.1f%% gathered, %.1f%% copied\n"
           "          private memory: peak RssAnon %.1f MiB (shared pages of the ranks' segments are RssShmem)\n",
           direct, gathered, copied, 100.0 * (double)direct / all, 100.0 * (double)gathered / all,
           100.0 * (double)copied / all, (double)s->peak_anon / 1048576.0);
  }
  if (s->daemon_line[0]) printf("          log: %s\n", s->daemon_line);
  if (s->sealed_line[0]) printf("          log: %s\n", s->sealed_line);
  if (b->ran && b->ok)
    printf("layout    %s files %s (b)'s (names and sizes)\n", label, s->same_layout ? "identical to" : "DIFFER from");
}

void sd_e2e_report(const sd_e2e_model *m, const phase *a, const phase *a2, const phase *b, const phase *c,
                   const shardd_stats *cs, const phase *st, const shardd_stats *ss, const phase *z,
                   const shardd_stats *zs) {
  printf("\n%-26s %14s %9s %7s %9s %11s\n", "phase", "bytes", "seconds", "GB/s", "CPU s/GiB",
         "load 1m");
  row("(a) raw io_uring writer", a);
  row("(b) serial sync writer", b);
  row("(c) shardd, 4 ranks", c);
  row("(s) shardd, 4 streamed", st);
  row("(z) shardd, 4 placed", z);
  if (a2->ran) row("(a) raw again, last", a2);
  printf("  GB/s = 1e9 bytes/s; CPU = the writing process ((c), (s): the daemon, io_uring workers included)\n");
  if (a->ran) printf("  (a) %s\n", a->note);
  if (b->ran) printf("  (b) %s\n", b->note);
  if (c->ran) printf("  (c) ranks copy and put each slice, then seal: %s\n", c->note);
  if (st->ran) printf("  (s) ranks put deferred, declare, copy with ready every 64 MiB, seal: %s\n", st->note);
  if (z->ran) printf("  (z) (c) with arena offsets from shardd_place (zero-copy placement): %s\n", z->note);
  printf("\n");
  ratios("c", c, a, a2, b);
  ratios("s", st, a, a2, b);
  ratios("z", z, a, a2, b);
  if (gbps(c) > 0 || gbps(st) > 0)
    printf("          (timed from the first rank's begin to every rank's commit; a = mean of the\n"
           "          raw runs before and after, as the virtual disk's speed drifts)\n");
  detail("(c)", m, b, c, cs);
  detail("(s)", m, b, st, ss);
  detail("(z)", m, b, z, zs);
}

