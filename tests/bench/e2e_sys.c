/* End-to-end benchmark helpers: clocks, /proc probes, machine description, cleanup and checkpoint checks. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench_e2e.h"
#include "sd_reader.h"
#include "synth.h"

/* vsnprintf behind a plain function: truncating a long path in a message is
 * fine here, and gcc's -Wformat-truncation cannot see that. */
int sd_e2e_fmt(char *dst, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(dst, len, fmt, ap);
  va_end(ap);
  return n;
}

/* ------------------------------------------------------------------------ *
 * Clocks and load
 * ------------------------------------------------------------------------ */
double sd_e2e_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double sd_e2e_self_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double sd_e2e_load1(void) {
  double l[1];
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

/* ------------------------------------------------------------------------ *
 * /proc
 * ------------------------------------------------------------------------ */
double sd_e2e_proc_cpu(pid_t pid) {
  char path[64], buf[2048];
  sd_e2e_fmt(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* The command name may hold spaces and parentheses: fields restart after
   * the last ')'. There, field 3 (state) comes first; utime and stime are
   * fields 14 and 15. */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  unsigned long long ut = 0, st = 0;
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

uint64_t sd_e2e_proc_status(pid_t pid, const char *key) {
  char path[64], line[256];
  sd_e2e_fmt(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t kl = strlen(key);
  uint64_t v = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtoull(line + kl + 1, NULL, 10) * 1024;
      break;
    }
  }
  fclose(f);
  return v;
}

uint64_t sd_e2e_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  uint64_t v = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %" SCNu64, &v) == 1) break;
  fclose(f);
  return v * 1024;
}

/* The mount holding path: longest mount point that prefixes it. */
static void mount_of(const char *path, char *fstype, char *source, size_t len) {
  sd_e2e_fmt(fstype, len, "?");
  sd_e2e_fmt(source, len, "?");
  char real[PATH_MAX];
  if (!realpath(path, real)) return;
  FILE *f = fopen("/proc/self/mountinfo", "r");
  if (!f) return;
  char *line = NULL;
  size_t cap = 0, best = 0;
  while (getline(&line, &cap, f) > 0) {
    char mp[PATH_MAX], ft[128], src[PATH_MAX];
    char *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
        sscanf(dash + 3, "%127s %4095s", ft, src) != 2)
      continue;
    size_t ml = strlen(mp);
    int under = strncmp(real, mp, ml) == 0 &&
                (real[ml] == '/' || real[ml] == '\0' || (ml == 1 && mp[0] == '/'));
    if (under && ml >= best) {
      best = ml;
      sd_e2e_fmt(fstype, len, "%s", ft);
      sd_e2e_fmt(source, len, "%s", src);
    }
  }
  free(line);
  fclose(f);
}

/* What moves the daemon's per-page costs here: transparent huge pages (the staging asks for them; shmem
 * arenas get them only as shmem_enabled allows) and a DAMON daemon ageing idle pages, which makes a
 * save after a pause pay each page's first touch again. */
static void mm_line(char *out, size_t len) {
  char thp[64] = "?", shm[64] = "?", damon[64] = "off";
  const char *files[] = {"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/shmem_enabled"};
  char *dst[] = {thp, shm};
  for (int i = 0; i < 2; i++) {
    char line[256];
    FILE *f = fopen(files[i], "r");
    if (f && fgets(line, sizeof line, f)) {
      char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
      if (a && b) sd_e2e_fmt(dst[i], 64, "%.*s", (int)(b - a - 1), a + 1);
    }
    if (f) fclose(f);
  }
  for (int k = 0; k < 8; k++) {
    char p[128], st[32] = "", act[32] = "";
    sd_e2e_fmt(p, sizeof p, "/sys/kernel/mm/damon/admin/kdamonds/%d/state", k);
    FILE *f = fopen(p, "r");
    if (!f) break;
    if (!fgets(st, sizeof st, f)) st[0] = '\0';
    fclose(f);
    st[strcspn(st, "\n")] = '\0';
    sd_e2e_fmt(p, sizeof p, "/sys/kernel/mm/damon/admin/kdamonds/%d/contexts/0/schemes/0/action", k);
    if ((f = fopen(p, "r"))) {
      if (!fgets(act, sizeof act, f)) act[0] = '\0';
      fclose(f);
      act[strcspn(act, "\n")] = '\0';
    }
    if (strcmp(st, "on") == 0) sd_e2e_fmt(damon, sizeof damon, "on (kdamond %d%s%s)", k, act[0] ? ", " : "", act);
  }
  sd_e2e_fmt(out, len, "mm       THP %s, shmem THP %s, DAMON %s\n", thp, shm, damon);
}

void sd_e2e_machine(const char *dir, char *out, size_t len) {
  char cpu[256] = "?", line[512];
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    while (fgets(line, sizeof line, f)) {
      char *c = strchr(line, ':');
      if (strncmp(line, "model name", 10) == 0 && c) {
        sd_e2e_fmt(cpu, sizeof cpu, "%s", c + 2);
        cpu[strcspn(cpu, "\n")] = '\0';
        break;
      }
    }
    fclose(f);
  }
  struct utsname u;
  if (uname(&u) != 0) sd_e2e_fmt(u.release, sizeof u.release, "?");
  char fstype[256], source[256];
  mount_of(dir, fstype, source, sizeof fstype);
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  sd_e2e_fmt(out, len,
           "machine  %ld cores (%s), %.1f GiB RAM (%.1f GiB available), kernel %s\n"
           "dir      %s (%s on %s)\n",
           sysconf(_SC_NPROCESSORS_ONLN), cpu, (double)pages * (double)psz / 1073741824.0,
           (double)sd_e2e_mem_available() / 1073741824.0, u.release, dir, fstype, source);
  size_t used = strlen(out);
  if (used < len) mm_line(out + used, len - used);
}

/* ------------------------------------------------------------------------ *
 * Cleanup
 * ------------------------------------------------------------------------ */
static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(p);
  return 0;
}

void sd_e2e_rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* ------------------------------------------------------------------------ *
 * Checkpoint content check
 * ------------------------------------------------------------------------ */
#define CHUNK (8u << 20)

static const sd_e2e_tensor *find(const sd_e2e_model *m, const char *name, size_t *at) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->t[i].name, name) == 0) {
      *at = i;
      return &m->t[i];
    }
  return NULL;
}

/* Compares one tensor's bytes on disk with its synthetic content. */
static int check_bytes(int fd, uint64_t file_off, const sd_e2e_tensor *t, uint8_t *got,
                       uint8_t *want, const char *file, char *msg, size_t len) {
  for (uint64_t done = 0; done < t->nbytes;) {
    size_t n = t->nbytes - done < CHUNK ? (size_t)(t->nbytes - done) : CHUNK;
    ssize_t r = pread(fd, got, n, (off_t)(file_off + done));
    if (r != (ssize_t)n) {
      sd_e2e_fmt(msg, len, "%s: tensor '%s': short read at byte %" PRIu64 ": %s", file, t->name,
               done, r < 0 ? strerror(errno) : "end of file");
      return -1;
    }
    sd_synth_fill(t->key, done, n, want);
    if (memcmp(got, want, n) != 0) {
      size_t k = 0;
      while (got[k] == want[k]) k++;
      sd_e2e_fmt(msg, len, "%s: tensor '%s': byte %" PRIu64 " is 0x%02x, expected 0x%02x", file,
               t->name, done + k, got[k], want[k]);
      return -1;
    }
    done += n;
  }
  return 0;
}

int sd_e2e_verify(const char *dir, const sd_e2e_model *m, char *msg, size_t len) {
  sd_ckpt c;
  sd_error err;
  if (sd_ckpt_read(dir, &c, &err) != 0) {
    sd_e2e_fmt(msg, len, "strict reader: %s", err.msg);
    return -1;
  }
  int rc = -1;
  uint8_t *got = malloc(CHUNK), *want = malloc(CHUNK), *seen = calloc(m->n ? m->n : 1, 1);
  if (!got || !want || !seen) {
    sd_e2e_fmt(msg, len, "out of memory");
    goto out;
  }
  if (c.ntensors != m->n || c.total_size != m->tensor_bytes) {
    sd_e2e_fmt(msg, len, "%" PRIu64 " tensors, %" PRIu64 " bytes; expected %zu, %" PRIu64, c.ntensors,
             c.total_size, m->n, m->tensor_bytes);
    goto out;
  }
  uint64_t on_disk = 0;
  for (size_t f = 0; f < c.nfiles; f++) {
    const sd_st_header *h = &c.files[f].h;
    char path[PATH_MAX];
    sd_e2e_fmt(path, sizeof path, "%s/%s", dir, c.files[f].name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      sd_e2e_fmt(msg, len, "%s: %s", c.files[f].name, strerror(errno));
      goto out;
    }
    on_disk += h->file_size;
    for (size_t i = 0; i < h->ntensors; i++) {
      const sd_st_tensor *st = &h->tensors[i];
      size_t at;
      const sd_e2e_tensor *t = find(m, st->name, &at);
      int shape_ok = t && st->dtype == m->st[at].dtype && st->ndim == m->st[at].ndim;
      for (uint32_t d = 0; shape_ok && d < st->ndim; d++) shape_ok = st->shape[d] == m->st[at].shape[d];
      if (!shape_ok || seen[at]) {
        sd_e2e_fmt(msg, len, "%s: tensor '%s' is %s", c.files[f].name, st->name,
                 !t ? "not in the model" : seen[at] ? "there twice" : "of the wrong dtype or shape");
        close(fd);
        goto out;
      }
      seen[at] = 1;
      if (check_bytes(fd, h->data_start + st->begin, t, got, want, c.files[f].name, msg, len)) {
        close(fd);
        goto out;
      }
    }
    /* The bytes were read once; keep them from crowding the next phase. */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  sd_e2e_fmt(msg, len, "strict reader ok, %zu files, %" PRIu64 " tensors, %" PRIu64
           " bytes in shards, every byte as generated",
           c.nfiles, c.ntensors, on_disk);
  rc = 0;
out:
  free(got);
  free(want);
  free(seen);
  sd_ckpt_free(&c);
  return rc;
}
