/* Gathered writes: inner-dimension splits written as one writev from several ranks' segments where the device's direct-I/O alignment allows, copied where not. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_facts.h"
#include "fixture_ckpt.h"
#include "fixture_root.h"
#include "publish.h"

/* The daemon stages fragments under SD_GATHER_MIN_PIECE; these small rows stand for large ones. */
__attribute__((constructor)) static void gather_small_rows(void) { setenv("SHARDD_TEST_GATHER_MIN_PIECE", "0", 1); }

static void setup(void) {
  fr_setup("/var/tmp/sd-gather-XXXXXX");
  fr_seed(0x9e3779b97f4a7c15ULL);
}

static void make_writer(void) {
  sd_writer_opts o = {.queue_depth = 32, .staging_bytes = 512 << 10, .chunk_bytes = 64 << 10};
  sd_error err;
  cr_assert_eq(sd_writer_init_opts(&FR.w, &FR.loop, &o, &err), 0, "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * The plan (pure)
 * ------------------------------------------------------------------------ */
static uint8_t gsrc[4u << 20] __attribute__((aligned(4096)));

/* Rows of a tensor split on its last dimension between two ranks: ops of
 * W bytes, rank k's rows one after another at src + seg[k]. */
static size_t rows_ops(sd_write_op *ops, uint64_t at, uint64_t rows, uint64_t w, const uint64_t seg[2]) {
  size_t n = 0;
  for (uint64_t r = 0; r < rows; r++)
    for (uint64_t k = 0; k < 2; k++)
      ops[n++] = (sd_write_op){0, at + (2 * r + k) * w, gsrc + seg[k] + r * w, w, SD_WOP_SHARED, (uint32_t)n};
  return n;
}

static sd_write_op pops[8192];

/* Every byte handed out once, staged or gathered, and each iovec pointing at its source byte. */
static void expect_cover(sd_fill *f, uint64_t size, uint64_t *gathered) {
  uint8_t *seen = calloc(size, 1);
  cr_assert_not_null(seen);
  sd_chunk c;
  memset(&c, 0, sizeof c);
  while (sd_fill_next(f, 64 << 10, &c)) {
    cr_expect_eq(c.off % SD_DIO_ALIGN, 0);
    for (uint64_t b = c.off; b < c.off + c.len; b++) seen[b]++;
  }
  static struct iovec iov[SD_GATHER_IOV];
  sd_fill_piece pc = {.iov = iov};
  *gathered = 0;
  while (sd_fill_next_zero_copy(f, SD_ZERO_COPY_PIECE, &pc)) {
    cr_expect_eq(pc.off % SD_DIO_ALIGN, 0);
    cr_expect_eq(pc.len % SD_DIO_ALIGN, 0);
    if (!pc.niov) {
      for (uint64_t b = pc.off; b < pc.off + pc.len; b++) seen[b]++;
      continue;
    }
    cr_assert_leq(pc.niov, SD_GATHER_IOV);
    cr_expect_leq(pc.len, SD_GATHER_BYTES);
    uint64_t off = pc.off;
    for (int i = 0; i < pc.niov; i++) {
      cr_expect_eq((uintptr_t)iov[i].iov_base % 512, 0, "iovec %d at an aligned address", i);
      cr_expect_eq(iov[i].iov_len % 512, 0, "iovec %d a multiple of 512 long", i);
      /* The source byte of each file byte: find the op holding it. */
      for (size_t k = 0; k < f->nops; k++) {
        const sd_write_op *op = &f->ops[k];
        if (op->file_offset <= off && off < op->file_offset + op->len) {
          cr_assert_eq(iov[i].iov_base, op->src + (off - op->file_offset), "iovec %d's source", i);
          break;
        }
      }
      for (uint64_t b = off; b < off + iov[i].iov_len; b++) seen[b]++;
      off += iov[i].iov_len;
    }
    cr_expect_eq(off, pc.off + pc.len, "the iovecs add up to the write");
    *gathered += pc.len;
  }
  for (uint64_t b = 0; b < size; b++) cr_assert_eq(seen[b], 1, "byte %llu handed out %u times", (unsigned long long)b, seen[b]);
  free(seen);
}

Test(gather, aligned_row_fragments_are_gathered) {
  const uint64_t seg[2] = {0, 1 << 20}, W = 1024, R = 256;
  size_t n = rows_ops(pops, 4096, R, W, seg);
  sd_fill_file files[] = {{NULL, 4096, 4096 + 2 * R * W}};
  sd_fill f = {.files = files, .nfiles = 1, .ops = pops, .nops = n};
  size_t nd = 0;
  sd_fill_zero_copy *d = sd_fill_plan_zero_copy(&f, SD_ZERO_COPY_MIN, &nd);
  cr_expect_eq(nd, 0, "rows are too small to go zero-copy alone");
  d = sd_fill_plan_gather(&f, d, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_assert_eq(nd, 1, "one gathered stretch");
  cr_expect(d[0].gather && d[0].off == 4096 && d[0].len == 2 * R * W);
  f.zc = d;
  f.nzc = nd;
  uint64_t g;
  expect_cover(&f, files[0].size, &g);
  cr_expect_eq(g, 2 * R * W, "all of it gathered");
  free(d);
}

Test(gather, unaligned_fragments_are_not) {
  const uint64_t seg[2] = {0, 1 << 20};
  size_t n = rows_ops(pops, 4096, 2000, 100, seg); /* 100 bytes a fragment */
  sd_fill_file files[] = {{NULL, 4096, 4096 + 2 * 2000 * 100}};
  sd_fill f = {.files = files, .nfiles = 1, .ops = pops, .nops = n};
  size_t nd = 0;
  sd_fill_zero_copy *d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_expect_eq(nd, 0, "100-byte fragments: copied");
  free(d);
  const uint64_t off[2] = {8, (1 << 20) + 8}; /* 512-byte fragments at misaligned addresses */
  n = rows_ops(pops, 4096, 400, 512, off);
  f.nops = n;
  files[0].size = 4096 + 2 * 400 * 512;
  d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_expect_eq(nd, 0, "misaligned sources: copied");
  d = sd_fill_plan_gather(&f, NULL, &nd, 8, 512, SD_ZERO_COPY_MIN, 0);
  cr_expect_eq(nd, 0, "lengths are fine but Linux wants every iovec aligned to the offset alignment too");
  free(d);
  d = sd_fill_plan_gather(&f, NULL, &nd, 8192, 512, SD_ZERO_COPY_MIN, 0);
  cr_expect_eq(nd, 0, "an alignment coarser than staging's: nothing");
  free(d);
}

/* Fragments under min_piece are staged (a 4 KiB-row gather cost 4x the CPU of copying, measured). */
Test(gather, fragments_under_min_piece_are_staged) {
  const uint64_t seg[2] = {0, 1 << 22};
  size_t n = rows_ops(pops, 4096, 512, 4096, seg); /* 4096 bytes a fragment, aligned */
  sd_fill_file files[] = {{NULL, 4096, 4096 + 2 * 512 * 4096}};
  sd_fill f = {.files = files, .nfiles = 1, .ops = pops, .nops = n};
  size_t nd = 0;
  sd_fill_zero_copy *d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, SD_GATHER_MIN_PIECE);
  cr_expect_eq(nd, 0, "4 KiB fragments under the default minimum: copied");
  free(d);
  d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, 4096);
  cr_expect_gt(nd, 0, "4 KiB fragments at a 4 KiB minimum: gathered");
  free(d);
}

/* 4096 fragments of 512 bytes: at most SD_GATHER_IOV iovecs a write. */
Test(gather, writes_are_capped_by_iovecs_and_bytes) {
  const uint64_t seg[2] = {0, 2 << 20};
  size_t n = rows_ops(pops, 4096, 2048, 512, seg);
  sd_fill_file files[] = {{NULL, 4096, 4096 + 2 * 2048 * 512}};
  sd_fill f = {.files = files, .nfiles = 1, .ops = pops, .nops = n};
  size_t nd = 0;
  sd_fill_zero_copy *d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_assert_eq(nd, 4, "4096 iovecs in writes of %d", SD_GATHER_IOV);
  f.zc = d;
  f.nzc = nd;
  uint64_t g;
  expect_cover(&f, files[0].size, &g);
  cr_expect_eq(g, 2 * 2048 * 512);
  free(d);
  /* One rank's rows back to back in the file and in memory: one iovec, cut at SD_GATHER_BYTES. */
  pops[0] = (sd_write_op){0, 4096, gsrc + 512, 3u << 20, SD_WOP_SHARED, 0}; /* not congruent mod 4096: not zero-copy */
  files[0].size = 4096 + (3u << 20);
  f = (sd_fill){.files = files, .nfiles = 1, .ops = pops, .nops = 1};
  d = sd_fill_plan_zero_copy(&f, SD_ZERO_COPY_MIN, &nd);
  cr_expect_eq(nd, 0);
  d = sd_fill_plan_gather(&f, d, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_assert_eq(nd, 1, "one run of one source: one iovec");
  f.zc = d;
  f.nzc = nd;
  expect_cover(&f, files[0].size, &g);
  cr_expect_eq(g, 3u << 20);
  free(d);
}

/* Streaming: a gathered write waits until every write in it is ready. */
Test(gather, a_gathered_write_waits_for_all_its_writes) {
  const uint64_t seg[2] = {0, 1 << 20};
  size_t n = rows_ops(pops, 0, 64, 1024, seg);
  sd_fill_file files[] = {{NULL, 0, 2 * 64 * 1024}};
  uint8_t ready[128];
  memset(ready, 1, sizeof ready);
  ready[77] = 0;
  sd_fill f = {.files = files, .nfiles = 1, .ops = pops, .nops = n, .ready = ready};
  size_t nd = 0;
  sd_fill_zero_copy *d = sd_fill_plan_gather(&f, NULL, &nd, 512, 512, SD_ZERO_COPY_MIN, 0);
  cr_assert_eq(nd, 1);
  f.zc = d;
  f.nzc = nd;
  static struct iovec iov[SD_GATHER_IOV];
  sd_fill_piece pc = {.iov = iov};
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0);
  ready[77] = 1;
  cr_assert_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 1);
  cr_expect_eq(pc.niov, 128);
  cr_expect_eq(sd_fill_next_zero_copy(&f, SD_ZERO_COPY_PIECE, &pc), 0, "nothing more");
  free(d);
}

/* ------------------------------------------------------------------------ *
 * Publishing (real io_uring, O_DIRECT, shared memory)
 * ------------------------------------------------------------------------ */
/* One file: a whole tensor congruent to its file offset (zero-copy), a
 * split of W-byte fragments (gathered when W is a multiple of the
 * alignment), a split of 100-byte fragments (copied). */
typedef struct {
  fc_ckpt c;
  uint64_t zero_copy, gathered; /* what should go which way */
} gckpt;

static void put(gckpt *g, uint64_t at, uint8_t *src, uint64_t len) {
  memcpy(src, g->c.want[0] + at, len);
  fc_add_op(&g->c, 0, at, len, src, SD_WOP_SHARED);
}

static uint64_t split(gckpt *g, uint64_t at, uint8_t *m, uint64_t *seg, uint64_t rows, uint64_t w) {
  for (uint64_t r = 0; r < rows; r++)
    for (uint64_t k = 0; k < 2; k++) put(g, at + (2 * r + k) * w, m + seg[k] + r * w, w);
  return at + 2 * rows * w;
}

static void gckpt_init(gckpt *g, uint8_t *m, uint64_t w) {
  enum { A = 600064, R = 301, SR = 1000 }; /* A ends 512- not 4096-aligned; the first split ends 4096-aligned */
  memset(g, 0, sizeof *g);
  uint64_t data = A + 2 * R * w + 2 * SR * 100;
  fc_init(&g->c, 1, &data, 0, NULL, 0); /* the file's bytes; the ops are replaced below */
  g->c.nops = 0;
  uint64_t at = 4096;
  put(g, at, m + 4096, A); /* congruent */
  g->zero_copy = ((at + A) & ~4095ull) - at;
  at += A;
  /* A's unaligned tail (2048 bytes) and the split gather as one stretch from A's last block */
  uint64_t seg[2] = {1 << 20, 2 << 20};
  uint64_t split_at = at;
  at = split(g, at, m, seg, R, w);
  if (w % 512 == 0) g->gathered = (at & ~4095ull) - (split_at & ~4095ull);
  uint64_t seg2[2] = {640 << 10, 832 << 10}; /* below the first split's rows: a shrink leaves them */
  at = split(g, at, m, seg2, SR, 100);
  fr_shuffle_ops(g->c.ops, g->c.nops);
}

static void mixed(uint64_t w, const char *rel) {
  make_writer();
  uint32_t a = th_dio_align(FR.root);
  if (!a || a > 4096) cr_skip_test("the file system under /var/tmp tells no direct-I/O alignment of 4096 or less");
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  gckpt g;
  gckpt_init(&g, m, w);
  fr_outcome o = {0};
  fc_publish(&g.c, rel, &o, NULL);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(o.written, o.total);
  fc_expect(rel, &g.c);
  cr_expect_eq(o.zero_copy, g.zero_copy, "zero-copy %llu, want %llu", (unsigned long long)o.zero_copy,
               (unsigned long long)g.zero_copy);
  uint64_t want = w % a == 0 ? g.gathered : 0;
  cr_expect_eq(o.gathered, want, "gathered %llu, want %llu", (unsigned long long)o.gathered,
               (unsigned long long)want);
  cr_expect_lt(o.zero_copy + o.gathered, o.written, "the 100-byte split and the unaligned edges were copied");
  fc_free(&g.c);
  munmap(m, len);
  close(fd);
}

Test(gather, mixed_zero_copy_gathered_and_copied_in_one_file, .init = setup, .fini = fr_teardown, .timeout = 60) {
  mixed(1024, "mixed");
}

Test(gather, fragments_not_a_multiple_of_512_are_copied, .init = setup, .fini = fr_teardown, .timeout = 60) {
  mixed(1100, "odd"); /* and the 100-byte split, as in every one of these */
}

/* A gathered write from a segment the client shrank fails the save with EFAULT; the process lives. */
Test(gather, a_gathered_write_from_a_shrunken_segment_fails_the_save, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  make_writer();
  uint32_t a = th_dio_align(FR.root);
  if (!a || a > 1024) cr_skip_test("no direct-I/O alignment of 1024 or less under /var/tmp");
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  gckpt g;
  gckpt_init(&g, m, 1024);
  cr_assert_eq(ftruncate(fd, (off_t)(3u << 19)), 0); /* rank 1's rows of the first split are gone */
  fr_outcome o = {0};
  fc_publish(&g.c, "shrunk", &o, NULL);
  cr_expect_neq(o.code, 0, "the save fails");
  cr_expect_not_null(strstr(o.msg, strerror(EFAULT)), "%s", o.msg);
  char dir[PATH_MAX];
  struct stat st;
  snprintf(dir, sizeof dir, "%s/shrunk", FR.root);
  cr_expect_neq(stat(dir, &st), 0, "nothing published");
  fc_free(&g.c);
  munmap(m, len);
  close(fd);
}

/* Where O_DIRECT is refused (ramfs) nothing is gathered and every byte is still right. */
Test(gather, nothing_gathered_where_direct_io_is_refused, .init = setup, .fini = fr_teardown, .timeout = 60) {
  fr_open_ramfs_root();
  make_writer();
  size_t len = 4u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  gckpt g;
  gckpt_init(&g, m, 1024);
  fr_outcome o = {0};
  fc_publish(&g.c, "ram", &o, NULL);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  fc_expect("ram", &g.c);
  cr_expect_eq(o.gathered, 0);
  fc_free(&g.c);
  munmap(m, len);
  close(fd);
}
