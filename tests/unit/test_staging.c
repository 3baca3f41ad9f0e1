/* The staged direct-I/O writer: aligned stretches, odd sizes and tails, tiny and huge writes, bounded staging, buffered fallback, shrunken shared memory. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture_ckpt.h"
#include "fixture_root.h"
#include "pathsafe.h"
#include "publish.h"

/* ------------------------------------------------------------------------ *
 * Fixture: a root in a fresh folder, a loop (fixture_root.c), a writer made by each test,
 * checkpoints made by hand (fixture_ckpt.c)
 * ------------------------------------------------------------------------ */
static void setup(void) {
  fr_setup("/var/tmp/sd-staging-XXXXXX");
  fr_seed(0x2545f4914f6cdd1dULL);
}

static void make_writer(uint64_t staging, uint32_t chunk, int buffered) {
  sd_writer_opts o = {.queue_depth = 32, .staging_bytes = staging, .chunk_bytes = chunk,
                      .buffered = buffered};
  sd_error err;
  cr_assert_eq(sd_writer_init_opts(&FR.w, &FR.loop, &o, &err), 0, "%s", err.msg);
}

/* Publishes c into rel and expects it whole on disk. */
static void publish_ok(fc_ckpt *c, const char *rel) {
  fr_outcome o = {0};
  fc_publish(c, rel, &o, NULL);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(o.released, 1, "released once");
  cr_expect_eq(o.released_after_done, 0, "released before the end");
  cr_expect_eq(o.written, o.total, "bytes written %llu of %llu", (unsigned long long)o.written,
               (unsigned long long)o.total);
  fc_expect(rel, c);
}

/* ------------------------------------------------------------------------ *
 * The stretches (pure)
 * ------------------------------------------------------------------------ */
Test(staging, stretches_are_aligned_and_cover_every_file_once) {
  sd_fill_file files[] = {{NULL, 0, 10000}, {NULL, 0, 0}, {NULL, 0, 8192}, {NULL, 0, 1}};
  sd_write_op ops[] = {
      {0, 0, (const uint8_t *)"", 0, 0, 0},       {0, 100, (const uint8_t *)"", 9000, 0, 0},
      {0, 9100, (const uint8_t *)"", 900, 0, 0},  {2, 4000, (const uint8_t *)"", 4192, 0, 0},
      {3, 0, (const uint8_t *)"", 1, 0, 0},
  };
  sd_fill f = {.files = files, .nfiles = 4, .ops = ops, .nops = 5};
  sd_chunk c;
  struct { uint32_t file; uint64_t off; uint32_t len; size_t cursor; } want[] = {
      {0, 0, 4096, 1}, {0, 4096, 4096, 1}, {0, 8192, 1808, 1}, {2, 0, 4096, 3},
      {2, 4096, 4096, 3}, {3, 0, 1, 4}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    memset(&c, 0, sizeof c);
    cr_assert_eq(sd_fill_next(&f, 4096, &c), 1, "stretch %zu", i);
    cr_expect_eq(c.file, want[i].file, "stretch %zu: file %u", i, c.file);
    cr_expect_eq(c.off, want[i].off, "stretch %zu: off %llu", i, (unsigned long long)c.off);
    cr_expect_eq(c.len, want[i].len, "stretch %zu: len %u", i, c.len);
    cr_expect_eq(c.cursor, want[i].cursor, "stretch %zu: first write %zu", i, c.cursor);
  }
  cr_expect_eq(sd_fill_next(&f, 4096, &c), 0, "nothing more");
}

/* Streaming: a stretch is handed out only when every write in it is ready,
 * whole (never cut short at the first unready write), and resumes there. */
Test(staging, stretches_wait_for_every_write_in_them) {
  sd_fill_file files[] = {{NULL, 0, 10000}, {NULL, 0, 4096}};
  sd_write_op ops[] = {
      {0, 100, (const uint8_t *)"", 3000, 0, 0}, {0, 3100, (const uint8_t *)"", 2000, 0, 1},
      {0, 5100, (const uint8_t *)"", 4900, 0, 2}, {1, 0, (const uint8_t *)"", 4096, 0, 3},
  };
  uint8_t ready[4] = {1, 0, 0, 0};
  sd_fill f = {.files = files, .nfiles = 2, .ops = ops, .nops = 4, .ready = ready};
  sd_chunk c;
  memset(&c, 0, sizeof c);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 0, "op 1 crosses into [0, 4096) and is not ready");
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 0, "asking again changes nothing");
  ready[1] = 1;
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  cr_expect(c.file == 0 && c.off == 0 && c.len == 4096 && c.cursor == 0);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 0, "[4096, 8192) needs op 2");
  ready[3] = 1; /* the next file is ready, but stretches go in order */
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 0);
  ready[2] = 1;
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  cr_expect(c.file == 0 && c.off == 4096 && c.len == 4096 && c.cursor == 1);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  cr_expect(c.file == 0 && c.off == 8192 && c.len == 1808 && c.cursor == 2);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  cr_expect(c.file == 1 && c.off == 0 && c.len == 4096 && c.cursor == 3);
  cr_expect_eq(sd_fill_next(&f, 4096, &c), 0, "nothing more");
}

Test(staging, a_stretch_gets_head_data_zeros_and_padding) {
  uint8_t head[10], d1[5], d2[3000];
  memset(head, 'h', sizeof head);
  memset(d1, '1', sizeof d1);
  memset(d2, '2', sizeof d2);
  sd_fill_file files[] = {{head, sizeof head, 6000}};
  /* a gap at [15, 20), d2 crossing the 4096 boundary, nothing after 3020 */
  sd_write_op ops[] = {{0, 10, d1, 5, 0, 0}, {0, 20, d2, 3000, 0, 0}};
  sd_fill f = {.files = files, .nfiles = 1, .ops = ops, .nops = 2};
  uint8_t *buf = aligned_alloc(4096, 4096);
  sd_chunk c = {.buf = buf, .cap = 4096};
  memset(buf, 0xab, 4096);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  sd_fill_copy(&f, &c);
  cr_expect_eq(c.fault, 0);
  cr_expect_eq(c.src_bytes, 5 + 3000);
  for (int i = 0; i < 4096; i++) {
    uint8_t want = i < 10 ? 'h' : i < 15 ? '1' : i < 20 ? 0 : i < 3020 ? '2' : 0;
    if (buf[i] != want) {
      cr_expect_fail("byte %d is %#x, want %#x", i, buf[i], want);
      break;
    }
  }
  /* the file's last stretch: 1904 bytes, zeros up to the block's end */
  memset(buf, 0xab, 4096);
  cr_assert_eq(sd_fill_next(&f, 4096, &c), 1);
  cr_expect_eq(c.off, 4096);
  cr_expect_eq(c.len, 6000 - 4096);
  sd_fill_copy(&f, &c);
  for (int i = 0; i < 4096; i++)
    if (buf[i] != 0) {
      cr_expect_fail("byte %d of the tail is %#x, want 0", i, buf[i]);
      break;
    }
  free(buf);
}

/* ------------------------------------------------------------------------ *
 * On disk
 * ------------------------------------------------------------------------ */
Test(staging, odd_sizes_and_unaligned_tails_direct, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(256 << 10, 64 << 10, 0);
  /* data sizes around the block and chunk edges */
  uint64_t sizes[] = {1, 4095, 4096, 4097, (64 << 10) - 4096, (64 << 10) - 4095, (64 << 10) + 1,
                      3 * (64 << 10) + 777, 12345};
  size_t n = sizeof sizes / sizeof *sizes;
  fc_ckpt c;
  fc_init(&c, n, sizes, 5000, NULL, 0);
  publish_ok(&c, "odd");
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  if (fc_takes_direct(FR.base)) {
    cr_expect_gt(st.writes_odirect, 0, "O_DIRECT was used");
    cr_expect_eq(st.writes_buffered, 0, "and nothing fell back: %llu",
                 (unsigned long long)st.writes_buffered);
  }
  cr_expect_leq(st.staging_peak, 256 << 10, "staging stayed within its size");
  fc_free(&c);
}

Test(staging, many_tiny_writes_are_coalesced, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(1 << 20, 256 << 10, 0);
  uint64_t sizes[] = {100000, 7, 50001};
  fc_ckpt c;
  fc_init(&c, 3, sizes, 16, NULL, 0); /* ~17,000 writes of 1..16 bytes */
  cr_assert_gt(c.nops, 10000);
  publish_ok(&c, "tiny");
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  /* one write per file (each fits a chunk) plus the index */
  cr_expect_eq(st.writes_odirect + st.writes_buffered, 4, "%llu data writes",
               (unsigned long long)(st.writes_odirect + st.writes_buffered));
  fc_free(&c);
}

Test(staging, a_tensor_larger_than_the_staging, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(128 << 10, 32 << 10, 0); /* 4 chunks of 32 KiB */
  uint64_t sizes[] = {(3u << 20) + 13};
  fc_ckpt c;
  fc_init(&c, 1, sizes, 0, NULL, 0); /* one write of 3 MiB */
  cr_assert_eq(c.nops, 1);
  publish_ok(&c, "big");
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_leq(st.staging_peak, 128 << 10, "peak staging %llu", (unsigned long long)st.staging_peak);
  cr_expect_geq(st.writes_odirect + st.writes_buffered, (3u << 20) / (32 << 10));
  fc_free(&c);
}

Test(staging, several_saves_share_a_tiny_staging, .init = setup, .fini = fr_teardown, .timeout = 120) {
  make_writer(32 << 10, 16 << 10, 0); /* two chunks of 16 KiB for everyone */
  enum { N = 5 };
  fc_ckpt c[N];
  fr_outcome o[N];
  char rel[N][16];
  sd_publish *p[N];
  for (int i = 0; i < N; i++) {
    uint64_t sizes[] = {200000 + 1000 * (uint64_t)i, 77777};
    fc_init(&c[i], 2, sizes, 3000, NULL, 0);
    memset(&o[i], 0, sizeof o[i]);
    snprintf(rel[i], sizeof rel[i], "s%d", i);
    sd_publish_req r = fc_req(&c[i], rel[i], &o[i], NULL);
    sd_error err;
    cr_assert_eq(sd_publish_start(FR.w, &r, &p[i], &err), 0, "%s", err.msg);
  }
  /* Round-robin: by the time the first save ends, every other has progressed. */
  int first = -1;
  for (;;) {
    int left = 0;
    for (int i = 0; i < N; i++) left += !o[i].done;
    if (!left) break;
    for (int i = 0; i < N && first < 0; i++)
      if (o[i].done) {
        first = i;
        for (int k = 0; k < N; k++)
          if (!o[k].done) cr_expect_gt(sd_publish_bytes_written(p[k]), 0, "save %d waited for save %d", k, i);
      }
    if (!uv_run(&FR.loop, UV_RUN_ONCE)) {
      for (int i = 0; i < N; i++) cr_assert(o[i].done, "save %d never ended", i);
    }
  }
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_leq(st.staging_peak, 32 << 10, "peak staging %llu", (unsigned long long)st.staging_peak);
  for (int i = 0; i < N; i++) {
    cr_expect_eq(o[i].code, 0, "%s", o[i].msg);
    fc_expect(rel[i], &c[i]);
    fc_free(&c[i]);
  }
}

Test(staging, buffered_when_the_file_system_refuses_direct_io, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  fr_open_ramfs_root();
  cr_assert_eq(fc_takes_direct(FR.root), 0, "ramfs refuses O_DIRECT");
  make_writer(256 << 10, 64 << 10, 0);
  uint64_t sizes[] = {4097, 200001};
  fc_ckpt c;
  fc_init(&c, 2, sizes, 999, NULL, 0);
  publish_ok(&c, "ram");
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_eq(st.writes_odirect, 0);
  cr_expect_gt(st.writes_buffered, 0);
  fc_free(&c);
}

Test(staging, tmpfs_and_forced_buffered, .init = setup, .fini = fr_teardown, .timeout = 60) {
  fr_open_mounted_root("tmpfs", "size=16m");
  uint64_t sizes[] = {1, 300000 + 5};
  fc_ckpt c;
  fc_init(&c, 2, sizes, 40000, NULL, 0);
  make_writer(256 << 10, 64 << 10, 0);
  publish_ok(&c, "tmp"); /* direct or not, whatever this kernel's tmpfs says */
  int closed = 0;
  sd_writer_close(FR.w, fr_closed_cb, &closed);
  while (!closed && uv_run(&FR.loop, UV_RUN_ONCE)) {}
  make_writer(256 << 10, 64 << 10, 1);
  publish_ok(&c, "forced");
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_eq(st.writes_odirect, 0, "told never to use O_DIRECT");
  fc_free(&c);
}

/* ------------------------------------------------------------------------ *
 * Shared memory
 * ------------------------------------------------------------------------ */
/* Resident kB of the mapping that starts at addr (/proc/self/smaps). */
static long mapping_rss_kb(const void *addr) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  int in = 0;
  long kb = -1;
  unsigned long want = (unsigned long)addr;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = a == want;
      continue;
    }
    if (in && sscanf(line, "Rss: %ld kB", &kb) == 1) break;
  }
  if (f) fclose(f);
  return kb;
}

Test(staging, shared_pages_are_dropped_once_copied, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(1 << 20, 256 << 10, 0);
  size_t len = 16u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  uint64_t sizes[] = {len / 2, len / 2};
  fc_ckpt c;
  fc_init(&c, 2, sizes, 100000, m, SD_WOP_SHARED);
  cr_assert_gt(mapping_rss_kb(m), 8000, "the test filled the segment through the mapping");
  publish_ok(&c, "shm");
  long kb = mapping_rss_kb(m);
  cr_expect_geq(kb, 0);
  cr_expect_lt(kb, 1024, "%ld kB of the 16 MiB segment still mapped", kb);
  /* dropping the mapping's pages never loses the data */
  for (size_t i = 0; i < c.plan.nfiles; i++)
    cr_expect(!memcmp(m + i * (len / 2), c.want[i] + 4096, len / 2));
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

Test(staging, a_shrunken_segment_fails_the_save_not_the_process, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  make_writer(512 << 10, 128 << 10, 0);
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  uint64_t sizes[] = {len};
  fc_ckpt c;
  /* pieces too small for a zero-copy middle: every one is copied under the guard */
  fc_init(&c, 1, sizes, 60000, m, SD_WOP_SHARED);
  /* the client shrinks its segment after attach: the tail is gone */
  cr_assert_eq(ftruncate(fd, (off_t)(len / 2)), 0);
  fr_outcome o = {0};
  fc_publish(&c, "shrunk", &o, NULL);
  cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "shrunk/model-00001-of-00001.safetensors"), "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "SIGBUS"), "%s", o.msg);
  struct stat st;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/shrunk", FR.root);
  cr_expect_neq(stat(dir, &st), 0, "nothing published");

  /* the guard is disarmed again: the same writer carries on */
  uint64_t small[] = {5000};
  fc_ckpt ok;
  fc_init(&ok, 1, small, 100, NULL, 0);
  publish_ok(&ok, "after");
  fc_free(&ok);

  /* and a fault outside a guarded copy still kills, as it should */
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    volatile uint8_t x = m[len - 1];
    (void)x;
    _exit(0);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  /* killed by SIGBUS, or (under a sanitizer, whose handler comes first) made to fail */
  cr_expect(WIFSIGNALED(status) ? WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT
                                : WIFEXITED(status) && WEXITSTATUS(status) != 0,
            "status %#x", status);
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* An inner-dimension split: each row of the file is rank 0's part then
 * rank 1's, each rank's rows packed in its own segment. Read through the
 * segment's descriptor, so the daemon never maps a page of it. */
Test(staging, interleaved_rows_read_through_the_segment, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  make_writer(256 << 10, 64 << 10, 0);
  enum { R = 3000, W = 100 }; /* ~650 pieces per chunk: more than one preadv batch per source */
  size_t seg = 2 * (size_t)R * W;
  int fd = memfd_create("sd-rows", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  uint8_t *bytes = malloc(seg);
  for (size_t i = 0; i < seg; i++) bytes[i] = (uint8_t)(fr_rnd() | 1);
  cr_assert_eq(pwrite(fd, bytes, seg, 0), (ssize_t)seg);
  const uint8_t *m = mmap(NULL, seg, PROT_READ, MAP_SHARED, fd, 0);
  cr_assert_neq(m, MAP_FAILED);

  fc_ckpt c;
  uint64_t sizes[] = {seg};
  fc_init(&c, 1, sizes, 0, NULL, 0);
  fc_split_rows(&c, R, W, m, bytes);
  sd_shm_span span = {m, seg, fd, 0, 0, 0};
  fr_outcome o = {0};
  fc_publish(&c, "rows", &o, &span);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(o.released, 1);
  fc_expect("rows", &c);
  cr_expect_eq(mapping_rss_kb(m), 0, "no page of the segment was mapped by the writer");
  fc_free(&c);
  free(bytes);
  munmap((void *)m, seg);
  close(fd);
}

Test(staging, a_shrunken_segment_reads_short, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(512 << 10, 128 << 10, 0);
  size_t len = 2u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  uint64_t sizes[] = {len};
  fc_ckpt c;
  fc_init(&c, 1, sizes, 50000, m, SD_WOP_SHARED);
  cr_assert_eq(ftruncate(fd, (off_t)(len / 4)), 0);
  sd_shm_span span = {m, len, fd, 0, 0, 0};
  fr_outcome o = {0};
  fc_publish(&c, "short", &o, &span);
  cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "short/model-00001-of-00001.safetensors"), "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "came up short"), "%s", o.msg);
  struct stat st;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/short", FR.root);
  cr_expect_neq(stat(dir, &st), 0, "nothing published");
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* ------------------------------------------------------------------------ *
 * Zero-copy: aligned middles of shared writes go straight from the segment
 * ------------------------------------------------------------------------ */
static uint8_t zsrc[1 << 20] __attribute__((aligned(4096)));

/* Stretches and zero-copy pieces together cover each file once, in order. */
Test(staging, zero_copy_stretches_and_staged_ones_cover_each_byte_once) {
  sd_fill_file files[] = {{NULL, 4096, 4096 + 300000 + 70000 + 9000}};
  sd_write_op ops[] = {
      {0, 4096, zsrc + 100, 100, SD_WOP_SHARED, 0},               /* too small */
      {0, 4196, zsrc + 100, 300000, SD_WOP_SHARED, 1},            /* congruent: middle [8192, 303104) */
      {0, 304196, zsrc + 1, 70000, SD_WOP_SHARED, 2},             /* misaligned source */
      {0, 374196, zsrc, 9000, 0, 3},                              /* private memory */
  };
  sd_fill f = {.files = files, .nfiles = 1, .ops = ops, .nops = 4};
  size_t n = 0;
  sd_fill_zero_copy *d = sd_fill_plan_zero_copy(&f, SD_ZERO_COPY_MIN, &n);
  cr_assert_eq(n, 1);
  cr_expect(d[0].file == 0 && d[0].off == 8192 && d[0].len == 303104 - 8192 && d[0].op == 1);
  f.zc = d;
  f.nzc = n;
  static uint8_t seen[4096 + 300000 + 70000 + 9000];
  memset(seen, 0, sizeof seen);
  sd_chunk c;
  memset(&c, 0, sizeof c);
  while (sd_fill_next(&f, 64 << 10, &c)) {
    cr_expect_eq(c.off % SD_DIO_ALIGN, 0);
    for (uint64_t b = c.off; b < c.off + c.len; b++) seen[b]++;
  }
  sd_fill_piece pc;
  unsigned pieces = 0;
  while (sd_fill_next_zero_copy(&f, 128 << 10, &pc)) {
    pieces++;
    cr_expect_eq(pc.src, zsrc + 100 + (pc.off - 4196), "the source byte of the file offset");
    cr_expect_leq(pc.len, 128u << 10);
    for (uint64_t b = pc.off; b < pc.off + pc.len; b++) seen[b]++;
  }
  cr_expect_eq(pieces, 3, "294912 bytes in pieces of at most 128 KiB");
  for (size_t b = 0; b < sizeof seen; b++) cr_assert_eq(seen[b], 1, "byte %zu handed out %u times", b, seen[b]);
  free(d);
}

/* Streaming: a zero-copy piece waits for its write to be ready. */
Test(staging, zero_copy_pieces_wait_for_their_write) {
  sd_fill_file files[] = {{NULL, 0, 1 << 20}};
  sd_write_op ops[] = {{0, 0, zsrc, 1 << 20, SD_WOP_SHARED, 0}};
  uint8_t ready[1] = {0};
  sd_fill f = {.files = files, .nfiles = 1, .ops = ops, .nops = 1, .ready = ready};
  size_t n = 0;
  sd_fill_zero_copy *d = sd_fill_plan_zero_copy(&f, SD_ZERO_COPY_MIN, &n);
  cr_assert_eq(n, 1);
  f.zc = d;
  f.nzc = n;
  sd_fill_piece pc;
  sd_chunk c;
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0);
  cr_expect_eq(sd_fill_next(&f, 4096, &c), 0, "the whole file is zero-copy: nothing to stage");
  ready[0] = 1;
  cr_assert_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 1);
  cr_expect(pc.off == 0 && pc.len == 1 << 20 && pc.src == zsrc);
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0, "nothing more");
  free(d);
}

/* One file holding a whole tensor placed congruently (zero-copy middle),
 * one placed off by 8 bytes, an inner-dimension split (rows) and a tiny
 * tensor: mixed zero-copy and staged writes, every byte compared. */
static void mixed_ckpt(fc_ckpt *c, uint8_t *m, uint64_t *zero_copy_want) {
  enum { A = 1000000, B = 300000, R = 200, W = 300, T = 7 };
  uint64_t data = A + B + 2 * R * W + T;
  fc_init(c, 1, &data, 0, NULL, 0);
  c->nops = 0;
  uint64_t at = 4096, seg = 0;
  /* A at file 4096: placed at segment offset 4096 + 4096*k, congruent */
  seg = 8192;
  fc_add_op(c, 0, at, A, m + seg, SD_WOP_SHARED);
  memcpy(m + seg, c->want[0] + at, A);
  *zero_copy_want = ((at + A) & ~4095ull) - at;
  at += A;
  seg += A + 4096 + 8; /* off by 8: staged */
  fc_add_op(c, 0, at, B, m + seg, SD_WOP_SHARED);
  memcpy(m + seg, c->want[0] + at, B);
  at += B;
  seg += B;
  for (uint64_t r = 0; r < R; r++)
    for (uint64_t k = 0; k < 2; k++) {
      const uint8_t *src = m + seg + k * R * W + r * W;
      fc_add_op(c, 0, at + r * 2 * W + k * W, W, src, SD_WOP_SHARED);
      memcpy((uint8_t *)src, c->want[0] + at + r * 2 * W + k * W, W);
    }
  at += 2 * R * W;
  fc_add_op(c, 0, at, T, c->want[0] + at, 0);
  fr_shuffle_ops(c->ops, c->nops);
}

Test(staging, mixed_zero_copy_and_staged_writes_in_one_file, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(256 << 10, 64 << 10, 0);
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  fc_ckpt c;
  uint64_t zero_copy_want;
  mixed_ckpt(&c, m, &zero_copy_want);
  fr_outcome o = {0};
  fc_publish(&c, "mixed", &o, NULL);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(o.released, 1);
  cr_expect_eq(o.written, o.total);
  fc_expect("mixed", &c);
  cr_expect_eq(o.zero_copy, zero_copy_want, "zero-copy bytes %llu, want %llu", (unsigned long long)o.zero_copy,
               (unsigned long long)zero_copy_want);
  cr_expect_lt(mapping_rss_kb(m), 1024, "pages written zero-copy are dropped too");
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* A zero-copy write from a segment the client shrank gets EFAULT: the
 * save fails (save_end.c names the region, out_of_range), the process lives. */
Test(staging, a_zero_copy_write_from_a_shrunken_segment_fails_the_save, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  make_writer(512 << 10, 128 << 10, 0);
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  uint64_t sizes[] = {len - 4096};
  fc_ckpt c;
  fc_init(&c, 1, sizes, 0, m + 4096, SD_WOP_SHARED); /* one write, congruent: all but nothing zero-copy */
  cr_assert_eq(ftruncate(fd, (off_t)(len / 2)), 0);
  fr_outcome o = {0};
  fc_publish(&c, "zshrunk", &o, NULL);
  cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, strerror(EFAULT)), "%s", o.msg);
  struct stat st;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/zshrunk", FR.root);
  cr_expect_neq(stat(dir, &st), 0, "nothing published");
  uint64_t small[] = {5000};
  fc_ckpt ok;
  fc_init(&ok, 1, small, 100, NULL, 0);
  publish_ok(&ok, "after");
  fc_free(&ok);
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* Where O_DIRECT is refused (ramfs), zero-copy writes go through the page
 * cache from the segment, and the bytes are still right. */
Test(staging, zero_copy_where_direct_io_is_refused, .init = setup, .fini = fr_teardown, .timeout = 60) {
  fr_open_ramfs_root();
  cr_assert_eq(fc_takes_direct(FR.root), 0, "ramfs refuses O_DIRECT");
  make_writer(256 << 10, 64 << 10, 0);
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  fc_ckpt c;
  uint64_t zero_copy_want;
  mixed_ckpt(&c, m, &zero_copy_want);
  fr_outcome o = {0};
  fc_publish(&c, "ram", &o, NULL);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  fc_expect("ram", &c);
  cr_expect_eq(o.zero_copy, zero_copy_want);
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_eq(st.writes_odirect, 0);
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* Streaming: a ready zero-copy stretch goes out before an earlier one that is not ready yet. */
Test(staging, a_ready_zero_copy_stretch_need_not_wait_for_an_earlier_one) {
  sd_fill_file files[] = {{NULL, 0, 1 << 20}};
  sd_write_op ops[] = {{0, 0, zsrc, 512 << 10, SD_WOP_SHARED, 0}, {0, 512 << 10, zsrc + (512 << 10), 512 << 10,
                                                                   SD_WOP_SHARED, 1}};
  uint8_t ready[2] = {0, 1};
  sd_fill f = {.files = files, .nfiles = 1, .ops = ops, .nops = 2, .ready = ready};
  size_t n = 0;
  sd_fill_zero_copy *d = sd_fill_plan_zero_copy(&f, SD_ZERO_COPY_MIN, &n);
  cr_assert_eq(n, 2);
  f.zc = d;
  f.nzc = n;
  sd_fill_piece pc;
  cr_assert_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 1);
  cr_expect(pc.off == 512 << 10 && pc.op == 1, "the second, ready one first");
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0);
  ready[0] = 1;
  cr_assert_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 1);
  cr_expect(pc.off == 0 && pc.len == 512 << 10 && pc.op == 0);
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0, "nothing more");
  free(d);
}
