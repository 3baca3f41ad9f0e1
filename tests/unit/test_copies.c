/* Parallel staging copies (writer_copy.c, copy_threads): the same bytes on disk with 1, 2 and 4 copy trips in flight, shared and private sources, sealed memfds staged unguarded, a tiny staging, a shrunken segment; and fileset.c, whole files a caller opened written the same way. */
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

#include "fileset.h"
#include "fixture_ckpt.h"
#include "fixture_root.h"
#include "pathsafe.h"
#include "publish.h"
#include "region.h"

static void setup(void) {
  fr_setup("/var/tmp/sd-copies-XXXXXX");
  fr_seed(0x9e3779b97f4a7c15ULL);
}

static void make_writer(unsigned threads, uint64_t staging, uint32_t chunk) {
  sd_writer_opts o = {.queue_depth = 32, .staging_bytes = staging, .chunk_bytes = chunk, .copy_threads = threads};
  sd_error err;
  cr_assert_eq(sd_writer_init_opts(&FR.w, &FR.loop, &o, &err), 0, "%s", err.msg);
}

/* Publishes c into rel and expects it whole on disk (checkpoints made by hand: fixture_ckpt.c). */
static fr_outcome publish_ok(fc_ckpt *c, const char *rel, const sd_shm_span *span) {
  fr_outcome o = {0};
  fc_publish(c, rel, &o, span);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(o.released, 1, "released once");
  cr_expect_eq(o.written, o.total, "bytes written %llu of %llu", (unsigned long long)o.written,
               (unsigned long long)o.total);
  fc_expect(rel, c);
  return o;
}

/* The trips in flight never pass copy_threads, and with more than one
 * allowed, more than one went at once: the first staging round of a save
 * larger than the staging hands out every trip before any comes back. */
static void expect_trips(unsigned threads) {
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_eq(st.copy_threads, threads);
  cr_expect_leq(st.copy_trips_peak, threads, "%llu trips at once", (unsigned long long)st.copy_trips_peak);
  cr_expect_geq(st.copy_trips_peak, threads > 1 ? 2 : 1, "%llu trips at once with %u allowed",
                (unsigned long long)st.copy_trips_peak, threads);
  cr_expect_leq(st.staging_peak, st.staging_max, "staging %llu over its bound %llu",
                (unsigned long long)st.staging_peak, (unsigned long long)st.staging_max);
}

/* ------------------------------------------------------------------------ *
 * Private sources, 1, 2 and 4 trips: the same bytes
 * ------------------------------------------------------------------------ */
static void private_sources(unsigned threads) {
  make_writer(threads, 2 << 20, 64 << 10); /* 32 chunks of 64 KiB: a 6 MiB save takes ~100 */
  enum { F = 3, SIZE = (2 << 20) + 777 };
  uint8_t *src = malloc((size_t)F * SIZE);
  cr_assert_not_null(src);
  fc_ckpt c;
  fc_init_even(&c, F, SIZE, 50000, src, 0);
  publish_ok(&c, "private", NULL);
  expect_trips(threads);
  fc_free(&c);
  free(src);
}

Test(copies, private_sources_one_trip, .init = setup, .fini = fr_teardown, .timeout = 60) { private_sources(1); }
Test(copies, private_sources_two_trips, .init = setup, .fini = fr_teardown, .timeout = 60) { private_sources(2); }
Test(copies, private_sources_four_trips, .init = setup, .fini = fr_teardown, .timeout = 60) { private_sources(4); }

/* ------------------------------------------------------------------------ *
 * Shared memory: an inner-dimension split (rows of two ranks interleaved)
 * read through the segment's descriptor, and a segment with no span copied
 * through the mapping, with several trips filling at once
 * ------------------------------------------------------------------------ */
static void interleaved_rows(unsigned threads, int with_span) {
  make_writer(threads, 1 << 20, 32 << 10);
  enum { R = 8000, W = 96 };
  size_t seg = 2 * (size_t)R * W;
  int fd;
  uint8_t *m = fc_shared_segment(seg, &fd);
  fc_ckpt c;
  fc_init_even(&c, 1, seg, seg, m, 0); /* the file's bytes; the ops are replaced below */
  uint8_t *bytes = malloc(seg);
  cr_assert_not_null(bytes);
  for (size_t i = 0; i < seg; i++) m[i] = bytes[i] = (uint8_t)(fr_rnd() | 1);
  fc_split_rows(&c, R, W, m, bytes);
  sd_shm_span span = {m, seg, fd, 0, 0, 0};
  publish_ok(&c, "rows", with_span ? &span : NULL);
  expect_trips(threads);
  cr_expect(!memcmp(m, bytes, seg), "the segment's bytes changed");
  fc_free(&c);
  free(bytes);
  munmap(m, seg);
  close(fd);
}

Test(copies, interleaved_rows_through_the_descriptor_four_trips, .init = setup, .fini = fr_teardown, .timeout = 60) {
  interleaved_rows(4, 1);
}
Test(copies, interleaved_rows_through_the_mapping_two_trips, .init = setup, .fini = fr_teardown, .timeout = 60) {
  interleaved_rows(2, 0);
}

/* ------------------------------------------------------------------------ *
 * A sealed memfd, adopted as a passed arena is: the same rows staged with
 * no shrink check or guard (counted as sealed), an unsealed segment's not
 * ------------------------------------------------------------------------ */
static void sealed_rows(unsigned threads, int seal) {
  make_writer(threads, 1 << 20, 32 << 10);
  enum { R = 8000, W = 96 };
  size_t seg = 2 * (size_t)R * W;
  int fd = memfd_create("sd-sealed-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)seg), 0);
  uint8_t *m = mmap(NULL, seg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_neq(m, MAP_FAILED);
  fc_ckpt c;
  fc_init_even(&c, 1, seg, seg, m, 0); /* the file's bytes; the ops are replaced below */
  sd_region *reg = NULL;
  sd_shm_span span = {m, seg, fd, 0, 0, 0};
  if (seal) {
    cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
    sd_error err;
    cr_assert_eq(sd_region_adopt(dup(fd), &reg, &err), 0, "%s", err.msg);
    cr_assert(reg->sealed, "a tmpfs memfd with F_SEAL_SHRINK is sealed");
    cr_expect_eq(sd_region_check(reg, &err), 0);
    span = (sd_shm_span){reg->base, reg->size, reg->fd, reg->sealed, reg->pin, 0};
    cr_expect_neq(ftruncate(fd, (off_t)seg / 2), 0, "the seal refuses a shrink");
  }
  fc_split_rows(&c, R, W, span.base, m);
  fr_outcome o = publish_ok(&c, seal ? "sealed" : "unsealed", &span);
  cr_expect_eq(o.zero_copy, 0, "an inner-dimension split is staged");
  cr_expect_eq(o.sealed, seal ? seg : 0, "%llu bytes copied from sealed spans, of %zu",
               (unsigned long long)o.sealed, seg);
  expect_trips(threads);
  sd_region_unref(reg);
  fc_free(&c);
  munmap(m, seg);
  close(fd);
}

Test(copies, sealed_memfd_rows_staged_unguarded_four_trips, .init = setup, .fini = fr_teardown, .timeout = 60) {
  sealed_rows(4, 1);
}
Test(copies, sealed_memfd_rows_staged_unguarded_one_trip, .init = setup, .fini = fr_teardown, .timeout = 60) {
  sealed_rows(1, 1);
}
Test(copies, unsealed_rows_still_read_through_the_descriptor, .init = setup, .fini = fr_teardown, .timeout = 60) {
  sealed_rows(2, 0);
}

/* ------------------------------------------------------------------------ *
 * Bounds and failures
 * ------------------------------------------------------------------------ */
/* Two chunks for five saves and four trips: a trip takes one chunk, the
 * staging bound holds, every save ends whole. */
Test(copies, several_saves_share_a_tiny_staging, .init = setup, .fini = fr_teardown, .timeout = 120) {
  make_writer(4, 32 << 10, 16 << 10);
  enum { N = 5, SIZE = 150001 };
  fc_ckpt c[N];
  fr_outcome o[N];
  char rel[N][16];
  uint8_t *src[N];
  for (int i = 0; i < N; i++) {
    src[i] = malloc(2 * (size_t)SIZE);
    cr_assert_not_null(src[i]);
    fc_init_even(&c[i], 2, SIZE, 3000, src[i], 0);
    memset(&o[i], 0, sizeof o[i]);
    snprintf(rel[i], sizeof rel[i], "s%d", i);
    sd_publish_req r = fc_req(&c[i], rel[i], &o[i], NULL);
    sd_publish *p;
    sd_error err;
    cr_assert_eq(sd_publish_start(FR.w, &r, &p, &err), 0, "%s", err.msg);
  }
  for (;;) {
    int left = 0;
    for (int i = 0; i < N; i++) left += !o[i].done;
    if (!left) break;
    if (!uv_run(&FR.loop, UV_RUN_ONCE))
      for (int i = 0; i < N; i++) cr_assert(o[i].done, "save %d never ended", i);
  }
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_leq(st.staging_peak, 32 << 10, "peak staging %llu", (unsigned long long)st.staging_peak);
  cr_expect_eq(st.copy_trips_peak, 2, "one chunk per trip, two chunks: %llu trips at once",
               (unsigned long long)st.copy_trips_peak);
  for (int i = 0; i < N; i++) {
    cr_expect_eq(o[i].code, 0, "%s", o[i].msg);
    fc_expect(rel[i], &c[i]);
    fc_free(&c[i]);
    free(src[i]);
  }
}

/* A segment cut short under several trips at once: the faulting fills (on
 * different threads, through the mapping) fail the save, not the process,
 * and the next save on the same writer is whole. */
Test(copies, a_shrunken_segment_under_parallel_trips, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(4, 1 << 20, 64 << 10);
  size_t len = 8u << 20;
  int fd;
  uint8_t *m = fc_shared_segment(len, &fd);
  fc_ckpt c;
  fc_init_even(&c, 2, len / 2, 200000, m, SD_WOP_SHARED);
  cr_assert_eq(ftruncate(fd, (off_t)(len / 8)), 0);
  fr_outcome o = {0};
  fc_publish(&c, "shrunk", &o, NULL);
  cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
  /* a staged copy faults, or a zero-copy write in flight beside it gets EFAULT first */
  cr_expect(strstr(o.msg, "SIGBUS") || strstr(o.msg, "Bad address"), "%s", o.msg);
  struct stat st;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/shrunk", FR.root);
  cr_expect_neq(stat(dir, &st), 0, "nothing published");

  enum { SIZE = 3 << 20 };
  uint8_t *src = malloc(2 * (size_t)SIZE);
  cr_assert_not_null(src);
  fc_ckpt ok;
  fc_init_even(&ok, 2, SIZE, 100000, src, 0);
  publish_ok(&ok, "after", NULL);
  expect_trips(4);
  fc_free(&ok);
  free(src);
  fc_free(&c);
  munmap(m, len);
  close(fd);
}

/* ------------------------------------------------------------------------ *
 * fileset.c: whole files into descriptors the caller opened (a node's share
 * of a multi-node save), through the same staging and the same counters
 * ------------------------------------------------------------------------ */
typedef struct {
  int done, code;
  char msg[SD_ERRMSG_MAX];
} fj_outcome;

static void fj_done(void *ud, const sd_error *err) {
  fj_outcome *o = ud;
  o->done++;
  o->code = err ? err->code : 0;
  if (err) snprintf(o->msg, sizeof o->msg, "%s", err->msg);
}

/* Starts a file set writing c's files (created in FR.root) and runs the loop until it reports. */
static void run_fileset(fc_ckpt *c, const sd_shm_span *span, const int *stop, int stop_now, fj_outcome *o, int *fds) {
  size_t n = c->plan.nfiles;
  sd_fill_file *ff = calloc(n, sizeof *ff);
  const char **names = calloc(n, sizeof *names);
  cr_assert(ff && names);
  for (size_t i = 0; i < n; i++) {
    const sd_plan_file *pf = &c->plan.files[i];
    fds[i] = openat(FR.root_fd, pf->name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fds[i], 0, "%s: %s", pf->name, strerror(errno));
    ff[i] = (sd_fill_file){(const uint8_t *)pf->header, pf->header_size, pf->file_size};
    names[i] = pf->name;
  }
  /* the ops as the caller hands them: sorted by file, then offset */
  for (size_t i = 1; i < c->nops; i++)
    for (size_t k = i; k > 0; k--) {
      sd_write_op *a = &c->ops[k - 1], *b = &c->ops[k];
      if (a->file < b->file || (a->file == b->file && a->file_offset < b->file_offset)) break;
      sd_write_op t = *a;
      *a = *b;
      *b = t;
    }
  sd_fileset_req r = {.fds = fds, .names = names, .files = ff, .nfiles = n, .ops = c->ops, .nops = c->nops,
                      .spans = span, .nspans = span ? 1 : 0, .stop = stop, .tag = "node", .cb = fj_done, .ud = o};
  sd_error err;
  cr_assert_eq(sd_fileset_start(FR.w, &r, &err), 0, "%s", err.msg);
  if (stop_now) *(int *)stop = 1;
  while (!o->done) cr_assert(uv_run(&FR.loop, UV_RUN_ONCE) || o->done, "the loop ran dry before the job reported");
  cr_assert_eq(o->done, 1, "reported %d times", o->done);
  for (size_t i = 0; i < n; i++) close(fds[i]);
  free(ff);
  free(names);
}

static void expect_files(const fc_ckpt *c) {
  char path[PATH_MAX];
  for (size_t i = 0; i < c->plan.nfiles; i++) {
    snprintf(path, sizeof path, "%s/%s", FR.root, c->plan.files[i].name);
    fr_expect_file(path, c->plan.files[i].name, c->want[i], c->plan.files[i].file_size);
  }
}

Test(copies, fileset_writes_whole_files_through_staging, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(2, 1 << 20, 64 << 10);
  enum { F = 2, SIZE = (3 << 20) + 4093 }; /* an unaligned tail: padded, then cut back */
  uint8_t *src = malloc((size_t)F * SIZE);
  cr_assert_not_null(src);
  fc_ckpt c;
  fc_init_even(&c, F, SIZE, 70000, src, 0);
  fj_outcome o = {0};
  int fds[F];
  run_fileset(&c, NULL, NULL, 0, &o, fds);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  expect_files(&c);
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_geq(st.copy_trips, 1);
  cr_expect_geq(st.bytes_odirect + st.bytes_buffered, (uint64_t)F * SIZE, "the writer's counters took the bytes");
  if (fc_takes_direct(FR.root)) {
    cr_expect_eq(st.writes_buffered, 0, "this file system takes O_DIRECT: %llu buffered writes",
                 (unsigned long long)st.writes_buffered);
  }
  fc_free(&c);
  free(src);
}

/* The caller's stop flag (a failed multi-node save) ends the job early and
 * says so; nothing is left in flight and the writer carries on. */
Test(copies, fileset_stops_when_told, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(2, 256 << 10, 64 << 10);
  enum { SIZE = 8 << 20 };
  uint8_t *src = malloc(SIZE);
  cr_assert_not_null(src);
  fc_ckpt c;
  fc_init_even(&c, 1, SIZE, 100000, src, 0);
  fj_outcome o = {0};
  int stop = 0, fds[1];
  run_fileset(&c, NULL, &stop, 1, &o, fds);
  cr_expect_eq(o.code, SHARDD_E_ABORTED, "%d: %s", o.code, o.msg);
  stop = 0;
  fj_outcome again = {0};
  run_fileset(&c, NULL, &stop, 0, &again, fds);
  cr_assert_eq(again.code, 0, "%s", again.msg);
  expect_files(&c);
  fc_free(&c);
  free(src);
}

/* A rank's segment cut short under the job: the job fails naming the file,
 * through the descriptor (short read) or the mapping (SIGBUS), or by a
 * zero-copy write from the mapping that gets EFAULT first. */
Test(copies, fileset_a_shrunken_segment_fails_the_job, .init = setup, .fini = fr_teardown, .timeout = 60) {
  make_writer(2, 1 << 20, 64 << 10);
  size_t len = 4u << 20;
  for (int with_span = 0; with_span < 2; with_span++) {
    int fd;
    uint8_t *m = fc_shared_segment(len, &fd);
    fc_ckpt c;
    fc_init_even(&c, 1, len, 150000, m, SD_WOP_SHARED);
    cr_assert_eq(ftruncate(fd, (off_t)(len / 4)), 0);
    sd_shm_span span = {m, len, fd, 0, 0, 0};
    fj_outcome o = {0};
    int fds[1];
    run_fileset(&c, with_span ? &span : NULL, NULL, 0, &o, fds);
    cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
    cr_expect_not_null(strstr(o.msg, c.plan.files[0].name), "%s", o.msg);
    cr_expect(strstr(o.msg, with_span ? "came up short" : "SIGBUS") || strstr(o.msg, "Bad address"), "%s", o.msg);
    fc_free(&c);
    munmap(m, len);
    close(fd);
  }
}

/* O_DIRECT refused (ramfs): the same job goes through the page cache. */
Test(copies, fileset_buffered_where_direct_io_is_refused, .init = setup, .fini = fr_teardown, .timeout = 60) {
  fr_open_ramfs_root();
  make_writer(2, 256 << 10, 64 << 10);
  enum { SIZE = 300001 };
  uint8_t *src = malloc(2 * (size_t)SIZE);
  cr_assert_not_null(src);
  fc_ckpt c;
  fc_init_even(&c, 2, SIZE, 999, src, 0);
  fj_outcome o = {0};
  int fds[2];
  run_fileset(&c, NULL, NULL, 0, &o, fds);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  expect_files(&c);
  sd_writer_stats st;
  sd_writer_get_stats(FR.w, &st);
  cr_expect_eq(st.writes_odirect, 0);
  cr_expect_gt(st.writes_buffered, 0);
  fc_free(&c);
  free(src);
}
