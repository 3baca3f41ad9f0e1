/* Microbenchmark: writer CPU per GiB for the ways of moving a memfd's bytes (never touched by the writer) to an O_DIRECT file. */
/* Measured 2026-12-03 ~21:00 UTC, kernel 6.18.44 (VM, 2 cores shared with other helpers: load average
 * 2.9 -> 3.9 over the 1 GiB runs, 3.9 -> 4.5 over the 2 GiB run), file on /work (ext4, virtio), writer
 * CPU = getrusage user+sys of this process per GiB; all methods read back right.
 *   method                    1 GiB run 1     1 GiB run 2     2 GiB
 *                             cpu s/GiB GB/s  cpu s/GiB GB/s  cpu s/GiB GB/s
 *   1 mmap+pwrite+DONTNEED    0.132  0.92     0.109  1.28     0.143  1.64   (16385 minflt per GiB)
 *   2a MAP_POPULATE+pwrite    0.122  0.84     0.129  1.36     0.139  1.77
 *   2b POPULATE_READ+pwrite   0.101  0.81     0.148  1.42     0.112  2.47
 *   3 copy_file_range         refused: EXDEV (memfd on tmpfs -> ext4)
 *   3b sendfile               0.548  0.50     0.765  0.40     0.713  0.47   (kernel's 64 KiB internal pipe)
 *   4 splice, 1 MiB pipe      0.144  1.63     0.128  1.29     0.137  1.39   (3 minflt)
 *   4b io_uring SPLICE 1 MiB  0.158  1.57     0.222  1.46     0.188  1.34
 *   4c splice, 8 MiB pipe     refused: EPERM (over fs/pipe-max-size 1 MiB, no CAP_SYS_RESOURCE)
 *   5 preadv+pwrite (staged)  0.204  1.20     0.280  1.72     0.325  0.63
 * Result: nothing beats (1) by half; splice costs about what the mapping path costs (the pinning of
 * the mapping's pages is not where the daemon's ~0.5 s/GiB goes: this path alone is ~0.11-0.14).
 * Added 2026-12-03 ~22:25 UTC, machine quiet (load 0.8-1.1), 1 GiB, /var/tmp (ext4, virtio):
 *   6 kept map, uring write   0.076-0.112 (16385 minflt)   6b same mapping, 2nd pass  0.022-0.062 (0 minflt)
 *   7 fixed bufs (registered) 0.142-0.195 (262147 minflt: io_uring pins for writing, so the mapping must be
 *     writable and every page takes a write fault)            7b registered, 2nd pass    0.036-0.043
 *   (1) again 0.096-0.101, (4) 0.088-0.099, (5) 0.141-0.220.
 * A second pass over pages still mapped is cheap here, but in the daemon keeping the zero-copy pages
 * mapped between saves did not pay (bench_multi (F) 0.067-0.082 kept vs 0.054-0.062 dropped), and after
 * a pause of 11 s a second save costs what the first does ((F) 0.106 against (f) 0.108): this VM's kernel
 * ages idle pages (DAMON runs here), and the first read of a page pays its LRU activation again. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PIECE (8u << 20)
#define ALIGN 4096u

static size_t total = 1ull << 30;
static unsigned pause_s; /* --pause: between the passes of (6b)/(7b), as between a trainer's saves */
static const char *dir = ".";
static char path[4096];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double tv(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec * 1e-6; }

static void die(const char *what) {
  perror(what);
  exit(1);
}

static uint64_t pat(uint64_t off, uint64_t seed) { return (off * 0x9E3779B97F4A7C15ull) ^ seed; }

/* A fresh memfd filled by a child: the writer has never mapped or touched its pages, as in the daemon. */
static int make_memfd(uint64_t seed) {
  int fd = memfd_create("bench_zc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) die("memfd_create");
  if (ftruncate(fd, (off_t)total) != 0) die("ftruncate");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    uint64_t *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) _exit(1);
    for (size_t i = 0; i < total / 8; i++) p[i] = pat(i * 8, seed);
    _exit(0);
  }
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) die("filler child");
  return fd;
}

static int open_out(void) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) die("open O_DIRECT");
  if (fallocate(fd, 0, 0, (off_t)total) != 0) die("fallocate");
  return fd;
}

static void wr_all(int out, const char *p, size_t len, off_t off) {
  while (len) {
    ssize_t n = pwrite(out, p, len, off);
    if (n <= 0) die("pwrite O_DIRECT");
    p += n, len -= (size_t)n, off += n;
  }
}

/* (1)/(2): O_DIRECT writes from a fresh shared mapping, each piece dropped after (sd_shared_drop). */
static int m_map(int mfd, int out, int how) {
  int flags = MAP_SHARED | (how == 1 ? MAP_POPULATE : 0);
  char *m = mmap(NULL, total, PROT_READ, flags, mfd, 0);
  if (m == MAP_FAILED) die("mmap");
  for (size_t off = 0; off < total; off += PIECE) {
#ifdef MADV_POPULATE_READ
    if (how == 2 && madvise(m + off, PIECE, MADV_POPULATE_READ) != 0) die("MADV_POPULATE_READ");
#endif
    wr_all(out, m + off, PIECE, (off_t)off);
    madvise(m + off, PIECE, MADV_DONTNEED);
  }
  munmap(m, total);
  return 0;
}

/* (6)/(7): a kept mapping; `fixed` registers it with io_uring once (pinned once, WRITE_FIXED after).
 * `warm` times a second save of the same arena: what a trainer saving every N steps pays. */
static int m_kept(int mfd, int out, int fixed, int warm, struct rusage *a, double *t0) {
  /* io_uring pins registered buffers for writing too: the mapping must be writable. */
  char *m = mmap(NULL, total, PROT_READ | (fixed ? PROT_WRITE : 0), MAP_SHARED, mfd, 0);
  if (m == MAP_FAILED) die("mmap");
  struct io_uring ring;
  if (io_uring_queue_init(32, &ring, 0) != 0) die("io_uring_queue_init");
  size_t nb = total / PIECE;
  for (int pass = 0; pass <= warm; pass++) {
    if (pass == warm && warm && pause_s) sleep(pause_s);
    if (pass == warm) getrusage(RUSAGE_SELF, a), *t0 = now();
    if (fixed && pass == 0) {
      struct iovec *iov = calloc(nb, sizeof *iov);
      for (size_t i = 0; i < nb; i++) iov[i].iov_base = m + i * PIECE, iov[i].iov_len = PIECE;
      int rc = io_uring_register_buffers(&ring, iov, (unsigned)nb);
      free(iov);
      if (rc != 0) return rc;
    }
    size_t inflight = 0;
    for (size_t i = 0; i < nb || inflight; ) {
      while (i < nb && inflight < 16) {
        struct io_uring_sqe *q = io_uring_get_sqe(&ring);
        if (fixed) io_uring_prep_write_fixed(q, out, m + i * PIECE, PIECE, (uint64_t)(i * PIECE), (int)i);
        else io_uring_prep_write(q, out, m + i * PIECE, PIECE, (uint64_t)(i * PIECE));
        i++, inflight++;
      }
      io_uring_submit_and_wait(&ring, 1);
      struct io_uring_cqe *c;
      while (io_uring_peek_cqe(&ring, &c) == 0) {
        if (c->res != (int)PIECE) {
          fprintf(stderr, "kept write: res %d\n", c->res);
          exit(1);
        }
        io_uring_cqe_seen(&ring, c);
        inflight--;
      }
    }
  }
  io_uring_queue_exit(&ring);
  munmap(m, total);
  return 0;
}

/* (3): copy_file_range; across file systems the kernel refuses (EXDEV), then sendfile. */
static int m_cfr(int mfd, int out, int use_sendfile) {
  for (size_t off = 0; off < total;) {
    size_t len = total - off < PIECE ? total - off : PIECE;
    ssize_t n;
    if (!use_sendfile) {
      loff_t in = (loff_t)off, o = (loff_t)off;
      n = copy_file_range(mfd, &in, out, &o, len, 0);
      if (n < 0 && off == 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP)) return -errno;
    } else {
      off_t in = (off_t)off;
      if (lseek(out, (off_t)off, SEEK_SET) < 0) die("lseek");
      n = sendfile(out, mfd, &in, len);
    }
    if (n <= 0) die(use_sendfile ? "sendfile" : "copy_file_range");
    off += (size_t)n;
  }
  return 0;
}

/* (4): splice memfd -> pipe -> O_DIRECT file; the pipe's pages are the memfd's own. */
static int m_splice(int mfd, int out, int pipesz) {
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0) die("pipe2");
  if (fcntl(pp[1], F_SETPIPE_SZ, pipesz) < 0) { /* beyond fs/pipe-max-size needs CAP_SYS_RESOURCE */
    int e = errno;
    close(pp[0]);
    close(pp[1]);
    return -e;
  }
  for (size_t off = 0; off < total;) {
    loff_t in = (loff_t)off;
    ssize_t n = splice(mfd, &in, pp[1], NULL, (size_t)pipesz, SPLICE_F_MOVE);
    if (n <= 0) die("splice in");
    loff_t o = (loff_t)off;
    for (ssize_t left = n; left > 0;) {
      ssize_t w = splice(pp[0], NULL, out, &o, (size_t)left, SPLICE_F_MOVE);
      if (w <= 0) die("splice out");
      left -= w;
    }
    off += (size_t)n;
  }
  close(pp[0]);
  close(pp[1]);
  return 0;
}

/* (4b): the same as linked IORING_OP_SPLICE pairs on a ring (io-wq threads belong to this process). */
static int m_uring_splice(int mfd, int out, int pipesz) {
  struct io_uring ring;
  if (io_uring_queue_init(8, &ring, 0) != 0) die("io_uring_queue_init");
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0) die("pipe2");
  if (fcntl(pp[1], F_SETPIPE_SZ, pipesz) < 0) die("F_SETPIPE_SZ");
  for (size_t off = 0; off < total; off += (size_t)pipesz) {
    struct io_uring_sqe *a = io_uring_get_sqe(&ring), *b;
    io_uring_prep_splice(a, mfd, (int64_t)off, pp[1], -1, (unsigned)pipesz, 0);
    a->flags |= IOSQE_IO_LINK;
    b = io_uring_get_sqe(&ring);
    io_uring_prep_splice(b, pp[0], -1, out, (int64_t)off, (unsigned)pipesz, 0);
    if (io_uring_submit_and_wait(&ring, 2) < 0) die("io_uring_submit");
    for (int k = 0; k < 2; k++) {
      struct io_uring_cqe *c;
      if (io_uring_wait_cqe(&ring, &c) != 0) die("wait_cqe");
      if (c->res != pipesz) {
        fprintf(stderr, "uring splice: res %d\n", c->res);
        exit(1);
      }
      io_uring_cqe_seen(&ring, c);
    }
  }
  close(pp[0]);
  close(pp[1]);
  io_uring_queue_exit(&ring);
  return 0;
}

/* (5): preadv into an aligned private buffer, then an O_DIRECT write (the staged path). */
static int m_staged(int mfd, int out) {
  char *buf = aligned_alloc(ALIGN, PIECE);
  if (!buf) die("aligned_alloc");
  for (size_t off = 0; off < total; off += PIECE) {
    struct iovec iov = {buf, PIECE};
    for (size_t got = 0; got < PIECE;) {
      iov.iov_base = buf + got, iov.iov_len = PIECE - got;
      ssize_t n = preadv(mfd, &iov, 1, (off_t)(off + got));
      if (n <= 0) die("preadv");
      got += (size_t)n;
    }
    wr_all(out, buf, PIECE, (off_t)off);
  }
  free(buf);
  return 0;
}

static int verify(uint64_t seed) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("open verify");
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != total) return 0;
  uint64_t *b = malloc(PIECE);
  int ok = 1;
  for (size_t off = 0; off < total && ok; off += PIECE) {
    if (pread(fd, b, PIECE, (off_t)off) != (ssize_t)PIECE) ok = 0;
    for (size_t i = 0; i < PIECE / 8 && ok; i++) ok = b[i] == pat(off + i * 8, seed);
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  free(b);
  close(fd);
  return ok;
}

static const char *names[] = {
    "1 mmap+pwrite+DONTNEED",  "2a MAP_POPULATE+pwrite", "2b POPULATE_READ+pwrite", "3 copy_file_range",
    "3b sendfile",             "4 splice pipe 1MiB",     "4b uring SPLICE 1MiB",    "4c splice pipe 8MiB",
    "5 preadv+pwrite (staged)", "6 kept map, uring write", "6b same, 2nd save",        "7 fixed bufs, uring",
    "7b fixed bufs, 2nd save",
};
#define NM (int)(sizeof names / sizeof *names)

static int run(int m, int mfd, int out, struct rusage *a, double *t0) {
  switch (m) {
  case 9: return m_kept(mfd, out, 0, 0, a, t0);
  case 10: return m_kept(mfd, out, 0, 1, a, t0);
  case 11: return m_kept(mfd, out, 1, 0, a, t0);
  case 12: return m_kept(mfd, out, 1, 1, a, t0);
  case 8: return m_staged(mfd, out);
  case 0: return m_map(mfd, out, 0);
  case 1: return m_map(mfd, out, 1);
  case 2: return m_map(mfd, out, 2);
  case 3: return m_cfr(mfd, out, 0);
  case 4: return m_cfr(mfd, out, 1);
  case 5: return m_splice(mfd, out, 1 << 20);
  case 6: return m_uring_splice(mfd, out, 1 << 20);
  case 7: return m_splice(mfd, out, 8 << 20);
  default: return -EINVAL;
  }
}

int main(int argc, char **argv) {
  int reps = 2, only = -1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--gib") && i + 1 < argc) total = (size_t)(atof(argv[++i]) * (double)(1ull << 30)) & ~(size_t)(PIECE - 1);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--from") && i + 1 < argc) only = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--pause") && i + 1 < argc) pause_s = (unsigned)atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_zc [--gib N] [--dir D] [--reps R] [--from METHOD-INDEX] [--pause S]\n");
      return 2;
    }
  }
  snprintf(path, sizeof path, "%s/bench_zc.%d.out", dir, (int)getpid());
  double gib = (double)total / (double)(1ull << 30);
  printf("%-26s %8s %8s %8s %8s %9s %s\n", "method", "usr s/GiB", "sys s/GiB", "cpu/GiB", "GB/s", "minflt", "ok");
  for (int r = 0; r < reps; r++)
    for (int m = only < 0 ? 0 : only; m < NM; m++) {
      uint64_t seed = ((uint64_t)r << 32) | (uint64_t)m;
      int mfd = make_memfd(seed);
      int out = open_out();
      struct rusage a, b;
      getrusage(RUSAGE_SELF, &a);
      double t0 = now();
      int rc = run(m, mfd, out, &a, &t0);
      double t1 = now();
      getrusage(RUSAGE_SELF, &b);
      close(out);
      close(mfd);
      if (rc < 0) {
        printf("%-26s refused: %s\n", names[m], strerror(-rc));
        unlink(path);
        continue;
      }
      double u = (tv(b.ru_utime) - tv(a.ru_utime)) / gib, s = (tv(b.ru_stime) - tv(a.ru_stime)) / gib;
      int ok = verify(seed);
      printf("%-26s %8.3f %8.3f %8.3f %8.2f %9ld %s\n", names[m], u, s, u + s, (double)total / (t1 - t0) / 1e9,
             b.ru_minflt - a.ru_minflt, ok ? "ok" : "MISMATCH");
      fflush(stdout);
      unlink(path);
    }
  double la[3];
  if (getloadavg(la, 3) == 3) printf("load average %.2f %.2f %.2f\n", la[0], la[1], la[2]);
  return 0;
}
