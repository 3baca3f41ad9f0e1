/* The io_uring publish: bytes on disk, atomic rename and overwrite, refusals, no space, short writes, cancel. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture_root.h"
#include "pathsafe.h"
#include "publish.h"
#include "sd_reader.h"

/* ------------------------------------------------------------------------ *
 * Fixture: a root under a fresh temporary folder, a loop and a writer (fixture_root.c)
 * ------------------------------------------------------------------------ */
static void setup(void) {
  fr_setup("/tmp/sd-publish-XXXXXX");
  sd_error err;
  cr_assert_eq(sd_writer_init(&FR.w, &FR.loop, 64, &err), 0, "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * Helpers
 * ------------------------------------------------------------------------ */
/* A hand-made plan: what the writer needs (names, headers, sizes) and
 * nothing the planner would compute, so these tests stand on their own. */
typedef struct {
  sd_plan plan;
  uint8_t **want;            /* the bytes each file must end up with */
  uint8_t **src;             /* the "shared memory" the data ops read */
  sd_write_op *ops;
  size_t nops, cap;
} hplan;

static void add_op(hplan *h, uint32_t f, uint64_t off, uint64_t len) {
  if (h->nops == h->cap) {
    h->cap = h->cap ? 2 * h->cap : 64;
    h->ops = realloc(h->ops, h->cap * sizeof *h->ops);
    cr_assert_not_null(h->ops);
  }
  h->ops[h->nops++] = (sd_write_op){f, off, h->src[f] + off, len, 0, 0};
}

/* data of file i split into pieces of 1..max_piece bytes (the whole data
 * section when max_piece is 0); ops shuffled so they arrive out of order. */
static void hplan_init(hplan *h, size_t nfiles, const uint64_t *data_sizes, uint64_t max_piece,
                       const char *prefix) {
  memset(h, 0, sizeof *h);
  sd_plan *p = &h->plan;
  p->nfiles = nfiles;
  p->files = calloc(nfiles, sizeof *p->files);
  h->want = calloc(nfiles, sizeof *h->want);
  h->src = calloc(nfiles, sizeof *h->src);
  for (size_t i = 0; i < nfiles; i++) {
    sd_plan_file *pf = &p->files[i];
    char name[128];
    if (nfiles == 1)
      snprintf(name, sizeof name, "%s.safetensors", prefix);
    else
      snprintf(name, sizeof name, "%s-%05zu-of-%05zu.safetensors", prefix, i + 1, nfiles);
    pf->name = strdup(name);
    pf->header_size = 4096;
    pf->data_size = data_sizes[i];
    pf->file_size = pf->header_size + pf->data_size;
    pf->header = malloc(pf->header_size);
    for (uint64_t b = 0; b < pf->header_size; b++) pf->header[b] = (char)('a' + (b + i) % 26);
    h->want[i] = malloc(pf->file_size + 1);
    h->src[i] = malloc(pf->file_size + 1);
    memcpy(h->want[i], pf->header, pf->header_size);
    for (uint64_t b = pf->header_size; b < pf->file_size; b++) h->want[i][b] = (uint8_t)fr_rnd();
    memcpy(h->src[i], h->want[i], pf->file_size);
    memset(h->src[i], 0xee, pf->header_size); /* headers come from the plan, never from sources */
    for (uint64_t off = pf->header_size; off < pf->file_size; ) {
      uint64_t len = max_piece ? 1 + fr_rnd() % max_piece : pf->data_size;
      if (len > pf->file_size - off) len = pf->file_size - off;
      add_op(h, (uint32_t)i, off, len);
      off += len;
    }
  }
  fr_shuffle_ops(h->ops, h->nops);
  p->needs_index = nfiles > 1;
  char iname[128];
  snprintf(iname, sizeof iname, "%s.safetensors.index.json", prefix);
  p->index_name = strdup(iname);
}

static void hplan_free(hplan *h) {
  for (size_t i = 0; i < h->plan.nfiles; i++) {
    free(h->plan.files[i].name);
    free(h->plan.files[i].header);
    free(h->want[i]);
    free(h->src[i]);
  }
  free(h->plan.files);
  free(h->plan.index_name);
  free(h->want);
  free(h->src);
  free(h->ops);
}

static const char index_json[] = "{\n  \"metadata\": {\n    \"total_size\": 1\n  }\n}\n";

static sd_publish_req hreq(hplan *h, const char *rel, fr_outcome *o) {
  return (sd_publish_req){
    .root_fd = FR.root_fd,
    .root_path = FR.root,
    .rel_dir = rel,
    .plan = &h->plan,
    .ops = h->ops,
    .nops = h->nops,
    .index_json = h->plan.needs_index ? index_json : NULL,
    .index_len = h->plan.needs_index ? strlen(index_json) : 0,
    .tag = "save/1",
    .on_released = fr_on_released,
    .on_done = fr_on_done,
    .ud = o,
  };
}

static void expect_file(const char *dir, const char *name, const uint8_t *want, size_t len) {
  char p[2 * PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  fr_expect_file(p, name, want, len);
}

static void expect_hplan_files(const char *dir, const hplan *h) {
  for (size_t i = 0; i < h->plan.nfiles; i++)
    expect_file(dir, h->plan.files[i].name, h->want[i], h->plan.files[i].file_size);
}

/* The number a shell pipeline prints. */
static int shell_count(const char *cmd) {
  FILE *f = popen(cmd, "r");
  int n = -1;
  if (f) {
    if (fscanf(f, "%d", &n) != 1) n = -1;
    pclose(f);
  }
  return n;
}

static int count_entries(const char *dir) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
  return shell_count(cmd);
}

/* Descriptors this process holds: a publish must give back all it opened. */
static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  while (d && readdir(d)) n++;
  if (d) closedir(d);
  return n;
}

/* Folders named with the temporary prefix anywhere below dir. */
static int temp_folders_below(const char *dir) {
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "find '%s' -name '%s*' | wc -l", dir, SD_TMP_PREFIX);
  return shell_count(cmd);
}

/* ------------------------------------------------------------------------ *
 * Round trips
 * ------------------------------------------------------------------------ */
Test(publish, multi_file_round_trip, .init = setup, .fini = fr_teardown, .timeout = 60) {
  /* file 2 takes one 40 MiB op: the writer splits it into 16 MiB chunks */
  uint64_t sizes[] = {(1 << 20) + 13, (40u << 20) + 7, 4096, 1};
  hplan h;
  hplan_init(&h, 4, sizes, 0, "model");
  /* the other files as many small pieces, all shuffled together */
  h.nops = 0;
  for (uint32_t f = 0; f < 4; f++) {
    uint64_t piece = f == 1 ? (40u << 20) + 7 : f == 2 ? 1 + fr_rnd() % 300 : 1 + fr_rnd() % 50000;
    for (uint64_t off = 4096; off < h.plan.files[f].file_size; off += piece) {
      uint64_t len = h.plan.files[f].file_size - off < piece ? h.plan.files[f].file_size - off
                                                               : piece;
      add_op(&h, f, off, len);
    }
  }
  for (size_t i = h.nops; i > 1; i--) {
    size_t j = fr_rnd() % i;
    sd_write_op t = h.ops[i - 1];
    h.ops[i - 1] = h.ops[j];
    h.ops[j] = t;
  }
  cr_assert_gt(h.nops, 20);

  static const char cfg[] = "{\"model_type\": \"llama\"}\n";
  sd_artifact arts[] = {{"config.json", (const uint8_t *)cfg, strlen(cfg)},
                        {"empty.txt", NULL, 0}};
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "runs/exp/step1", &o);
  char cfg_copy[sizeof cfg];
  memcpy(cfg_copy, cfg, sizeof cfg);
  arts[0].data = (const uint8_t *)cfg_copy;
  req.artifacts = arts;
  req.nartifacts = 2;
  sd_publish *p;
  sd_error err;
  int fds = count_fds();
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  memset(cfg_copy, 'Z', sizeof cfg_copy); /* artifacts are copied at start */
  uint64_t total = 0;
  for (size_t i = 0; i < 4; i++) total += h.plan.files[i].file_size;
  total += strlen(index_json) + strlen(cfg);
  cr_expect_eq(sd_publish_bytes_total(p), total);
  fr_run_until(&o);

  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(count_fds(), fds, "every descriptor is closed");
  char want_path[1024];
  snprintf(want_path, sizeof want_path, "%s/runs/exp/step1", FR.root);
  cr_expect_str_eq(o.path, want_path);
  cr_expect_eq(o.released, 1, "released once, before done");
  cr_expect_eq(o.released_after_done, 0);
  cr_expect_eq(o.written, total);
  expect_hplan_files(want_path, &h);
  expect_file(want_path, "model.safetensors.index.json", (const uint8_t *)index_json,
              strlen(index_json));
  expect_file(want_path, "config.json", (const uint8_t *)cfg, strlen(cfg));
  expect_file(want_path, "empty.txt", (const uint8_t *)"", 0);
  cr_expect_eq(count_entries(want_path), 7);
  cr_expect_eq(temp_folders_below(FR.root), 0);
  struct stat st;
  char f0[PATH_MAX];
  snprintf(f0, sizeof f0, "%s/%s", want_path, h.plan.files[0].name);
  cr_assert_eq(stat(f0, &st), 0);
  mode_t mask = umask(022);
  umask(mask);
  cr_expect_eq(st.st_mode & 0777, 0644 & ~mask);
  hplan_free(&h);
}

Test(publish, zero_byte_ops_skipped_and_holes_sized, .init = setup, .fini = fr_teardown) {
  uint64_t sizes[] = {100};
  hplan h;
  hplan_init(&h, 1, sizes, 0, "model");
  /* only the first 40 data bytes are written: the rest must read back as zeros */
  h.nops = 0;
  add_op(&h, 0, 4096, 40);
  h.ops[h.nops++] = (sd_write_op){0, 4096 + 40, NULL, 0, 0, 0};
  h.ops[h.nops++] = (sd_write_op){0, 4096 + 100, NULL, 0, 0, 0}; /* at the very end: still fine */
  memset(h.want[0] + 4096 + 40, 0, 60);
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "ckpt", &o);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/ckpt", FR.root);
  expect_hplan_files(dir, &h);
  cr_expect_eq(count_entries(dir), 1, "single file: no index");
  hplan_free(&h);
}

Test(publish, two_saves_in_flight_share_the_ring, .init = setup, .fini = fr_teardown, .timeout = 60) {
  uint64_t sizes[] = {24u << 20, 8u << 20};
  hplan a, b;
  hplan_init(&a, 2, sizes, 1 << 20, "model");
  hplan_init(&b, 2, sizes, 1 << 20, "model");
  fr_outcome oa = {0}, ob = {0};
  sd_publish_req ra = hreq(&a, "a", &oa), rb = hreq(&b, "b", &ob);
  sd_publish *pa, *pb;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &ra, &pa, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_publish_start(FR.w, &rb, &pb, &err), 0, "%s", err.msg);
  while (!(oa.done && ob.done) && uv_run(&FR.loop, UV_RUN_ONCE)) {
    if (oa.done && !ob.done) cr_expect_gt(sd_publish_bytes_written(pb), 0,
                                          "b progressed while a was writing");
  }
  cr_assert_eq(oa.code, 0, "%s", oa.msg);
  cr_assert_eq(ob.code, 0, "%s", ob.msg);
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/a", FR.root);
  expect_hplan_files(dir, &a);
  snprintf(dir, sizeof dir, "%s/b", FR.root);
  expect_hplan_files(dir, &b);
  cr_expect_eq(count_entries(FR.root), 2);
  hplan_free(&a);
  hplan_free(&b);
}

/* ------------------------------------------------------------------------ *
 * Existing destinations
 * ------------------------------------------------------------------------ */
Test(publish, overwrite_swaps_atomically_and_exists_is_refused, .init = setup, .fini = fr_teardown) {
  uint64_t sa[] = {5000, 6000, 7000}, sb[] = {1234};
  hplan a, b;
  hplan_init(&a, 3, sa, 777, "model");
  hplan_init(&b, 1, sb, 100, "model");
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/ckpt", FR.root);

  fr_outcome o = {0};
  sd_publish_req req = hreq(&a, "ckpt", &o);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_assert_eq(o.code, 0, "%s", o.msg);
  cr_expect_eq(count_entries(dir), 4);

  /* not asked to overwrite: refused at once, nothing touched */
  fr_outcome o2 = {0};
  req = hreq(&b, "ckpt", &o2);
  p = (sd_publish *)1;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_EXISTS);
  cr_expect_null(p);
  cr_expect_not_null(strstr(err.msg, "ckpt"), "%s", err.msg);
  uv_run(&FR.loop, UV_RUN_NOWAIT);
  cr_expect_eq(o2.done, 0, "a refused start calls nothing back");
  cr_expect_eq(count_entries(FR.root), 1);
  expect_hplan_files(dir, &a);

  /* overwrite: the new checkpoint replaces the old one whole */
  fr_outcome o3 = {0};
  req = hreq(&b, "ckpt", &o3);
  req.overwrite = 1;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o3);
  cr_assert_eq(o3.code, 0, "%s", o3.msg);
  expect_hplan_files(dir, &b);
  cr_expect_eq(count_entries(dir), 1, "none of the old files remain");
  cr_expect_eq(count_entries(FR.root), 1, "the old tree is removed");

  /* overwrite onto a file is refused: only a checkpoint folder is replaced */
  char f[PATH_MAX];
  snprintf(f, sizeof f, "%s/plain", FR.root);
  close(open(f, O_CREAT | O_WRONLY, 0644));
  fr_outcome o4 = {0};
  req = hreq(&b, "plain", &o4);
  req.overwrite = 1;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_EXISTS);
  cr_expect_not_null(strstr(err.msg, "not a folder"), "%s", err.msg);
  hplan_free(&a);
  hplan_free(&b);
}

/* ------------------------------------------------------------------------ *
 * Refusals at start
 * ------------------------------------------------------------------------ */
Test(publish, escaping_paths_are_refused, .init = setup, .fini = fr_teardown) {
  uint64_t s[] = {100};
  hplan h;
  hplan_init(&h, 1, s, 0, "model");
  const char *bad[] = {"..", "../x", "/abs", "a//b", "a/../b", "a/.", "", "a/"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fr_outcome o = {0};
    sd_publish_req req = hreq(&h, bad[i], &o);
    sd_publish *p = (sd_publish *)1;
    sd_error err;
    cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_BAD_PATH, "'%s'", bad[i]);
    cr_expect_null(p);
  }
  cr_expect_eq(count_entries(FR.root), 0);
  cr_expect_eq(count_entries(FR.base), 2, "nothing beside the root either");
  hplan_free(&h);
}

Test(publish, symlink_planted_in_root_is_not_followed, .init = setup, .fini = fr_teardown) {
  char link[PATH_MAX];
  snprintf(link, sizeof link, "%s/link", FR.root);
  cr_assert_eq(symlink(FR.outside, link), 0);
  uint64_t s[] = {100};
  hplan h;
  hplan_init(&h, 1, s, 0, "model");
  const char *rels[] = {"link/ckpt", "link/deeper/ckpt", "link"};
  for (size_t i = 0; i < 3; i++) {
    fr_outcome o = {0};
    sd_publish_req req = hreq(&h, rels[i], &o);
    req.overwrite = 1;
    sd_publish *p;
    sd_error err;
    cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_BAD_PATH, "'%s': %s", rels[i],
                 err.msg);
    cr_expect_not_null(strstr(err.msg, rels[i]), "the message names the path: %s", err.msg);
  }
  cr_expect_eq(count_entries(FR.outside), 0, "nothing was created outside the root");
  cr_expect_eq(count_entries(FR.root), 1, "only the planted link");
  struct stat st;
  cr_expect_eq(lstat(link, &st), 0);
  cr_expect(S_ISLNK(st.st_mode));
  hplan_free(&h);
}

Test(publish, bad_files_and_writes_are_refused, .init = setup, .fini = fr_teardown) {
  uint64_t s[] = {100};
  hplan h;
  hplan_init(&h, 1, s, 0, "model");
  sd_error err;
  sd_publish *p;

  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "a/b/ckpt", &o);
  sd_artifact clash = {"model.safetensors", (const uint8_t *)"x", 1};
  req.artifacts = &clash;
  req.nartifacts = 1;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_expect_not_null(strstr(err.msg, "model.safetensors"), "%s", err.msg);
  cr_expect_eq(count_entries(FR.root), 0, "temporary folder and new parents removed");

  sd_artifact sneaky = {"../escape", (const uint8_t *)"x", 1};
  req.artifacts = &sneaky;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_BAD_PATH);
  req.artifacts = NULL;
  req.nartifacts = 0;

  sd_write_op past = {0, 4096 + 90, h.src[0], 20, 0, 0}; /* runs past the end of the file */
  req.ops = &past;
  req.nops = 1;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_INTERNAL);
  cr_expect_not_null(strstr(err.msg, "outside"), "%s", err.msg);
  sd_write_op nofile = {3, 4096, h.src[0], 20, 0, 0};
  req.ops = &nofile;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_INTERNAL);
  sd_write_op two[] = {{0, 4096, h.src[0], 50, 0, 0}, {0, 4096 + 49, h.src[0], 10, 0, 0}};
  req.ops = two;
  req.nops = 2;
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_INTERNAL);
  cr_expect_not_null(strstr(err.msg, "overlap"), "%s", err.msg);

  /* a plan whose prefix smuggles a slash */
  free(h.plan.files[0].name);
  h.plan.files[0].name = strdup("../model.safetensors");
  req = hreq(&h, "ckpt", &o);
  cr_expect_eq(sd_publish_start(FR.w, &req, &p, &err), SHARDD_E_BAD_PATH);
  cr_expect_eq(count_entries(FR.root), 0);
  cr_expect_eq(o.done, 0);
  hplan_free(&h);
}

/* ------------------------------------------------------------------------ *
 * Failures in flight
 * ------------------------------------------------------------------------ */
Test(publish, no_space_names_the_file_and_leaves_nothing, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  snprintf(FR.mnt, sizeof FR.mnt, "%s/small", FR.base);
  cr_assert_eq(mkdir(FR.mnt, 0755), 0);
  if (mount("tmpfs", FR.mnt, "tmpfs", 0, "size=1m") < 0) {
    int e = errno;
    FR.mnt[0] = '\0';
    cr_skip_test("cannot mount a 1 MiB tmpfs (%s): needs root", strerror(e));
  }
  char r[PATH_MAX];
  snprintf(r, sizeof r, "%s/root", FR.mnt);
  fr_open_root(r);

  uint64_t s[] = {100000, 2u << 20};
  hplan h;
  hplan_init(&h, 2, s, 65536, "model");
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "runs/ckpt", &o);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_expect_eq(o.code, SHARDD_E_NO_SPACE, "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "runs/ckpt/model-00002-of-00002.safetensors"), "%s", o.msg);
  /* Released means every source byte was copied into staging: that may
   * come before the disk fills up, never after the end. */
  cr_expect_leq(o.released, 1);
  cr_expect_eq(o.released_after_done, 0);
  cr_expect_eq(count_entries(FR.root), 0, "temporary folder and new parents removed");

  /* space is back: the same writer carries on */
  uint64_t s2[] = {50000};
  hplan h2;
  hplan_init(&h2, 1, s2, 4096, "model");
  fr_outcome o2 = {0};
  req = hreq(&h2, "runs/ckpt", &o2);
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o2);
  cr_assert_eq(o2.code, 0, "%s", o2.msg);
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/runs/ckpt", FR.root);
  expect_hplan_files(dir, &h2);
  hplan_free(&h);
  hplan_free(&h2);
}

/* RLIMIT_FSIZE makes the kernel write only up to the limit: the writer must
 * resubmit the remainder, which then fails exactly at the limit. */
Test(publish, short_write_remainder_is_resubmitted, .init = setup, .fini = fr_teardown) {
  signal(SIGXFSZ, SIG_IGN);
  uint64_t s[] = {60000};
  hplan h;
  hplan_init(&h, 1, s, 0, "model");
  struct rlimit rl = {10000, 10000};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "ckpt", &o);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_expect_eq(o.code, SHARDD_E_IO, "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "ckpt/model.safetensors"), "%s", o.msg);
  cr_expect_not_null(strstr(o.msg, "offset 10000"), "the remainder went out at the limit: %s",
                     o.msg);
  cr_expect_eq(o.written, 10000, "header and the short write's 5904 bytes");
  cr_expect_eq(count_entries(FR.root), 0);
  hplan_free(&h);
}

/* Cancels p once some but not all of its bytes are on disk. */
typedef struct {
  uv_check_t check;
  sd_publish *p;
  const fr_outcome *o;
  uint64_t at;
} canceller;

static void cancel_when_started(uv_check_t *c) {
  canceller *k = (canceller *)c;
  if (!k->o->done && k->p && sd_publish_bytes_written(k->p) > 0) {
    k->at = sd_publish_bytes_written(k->p);
    sd_publish_cancel(k->p, SHARDD_E_ABORTED, "abort requested by rank 1");
    k->p = NULL;
  }
}

Test(publish, cancel_mid_flight_leaves_nothing, .init = setup, .fini = fr_teardown, .timeout = 60) {
  uint64_t s[] = {32u << 20, 32u << 20, 32u << 20};
  hplan h;
  hplan_init(&h, 3, s, 1 << 20, "model");
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "deep/er/ckpt", &o);
  sd_publish *p;
  sd_error err;
  int fds = count_fds();
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  canceller k = {.p = p, .o = &o};
  uv_check_init(&FR.loop, &k.check);
  uv_check_start(&k.check, cancel_when_started);
  uv_unref((uv_handle_t *)&k.check);
  fr_run_until(&o);
  uv_close((uv_handle_t *)&k.check, NULL);
  uint64_t total = 3 * (4096 + (32u << 20)) + strlen(index_json);
  cr_expect_gt(k.at, 0);
  cr_expect_lt(o.written, total, "cancelled before the end");
  cr_expect_eq(o.code, SHARDD_E_ABORTED, "%s", o.msg);
  cr_expect_str_eq(o.msg, "abort requested by rank 1");
  cr_expect_str_eq(o.path, "");
  cr_expect_eq(count_entries(FR.root), 0, "no temporary folder, no parents");
  cr_expect_eq(count_fds(), fds, "every descriptor is closed");

  /* cancelled before a single completion came back */
  fr_outcome o2 = {0};
  req = hreq(&h, "ckpt", &o2);
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  sd_publish_cancel(p, SHARDD_E_CLIENT_LOST, "rank 3 disconnected before seal");
  sd_publish_cancel(p, SHARDD_E_ABORTED, "second cancel is ignored");
  cr_expect_eq(o2.done, 0, "on_done comes later, from the loop");
  fr_run_until(&o2);
  cr_expect_eq(o2.code, SHARDD_E_CLIENT_LOST, "%s", o2.msg);
  cr_expect_str_eq(o2.msg, "rank 3 disconnected before seal");
  cr_expect_eq(count_entries(FR.root), 0);
  hplan_free(&h);
}

static void cancel_on_release(sd_publish *p, void *ud) {
  fr_on_released(p, ud);
  sd_publish_cancel(p, SHARDD_E_ABORTED, "changed my mind");
}

Test(publish, cancel_from_released_callback, .init = setup, .fini = fr_teardown) {
  uint64_t s[] = {300000, 200000};
  hplan h;
  hplan_init(&h, 2, s, 30000, "model");
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "ckpt", &o);
  req.on_released = cancel_on_release;
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_expect_eq(o.released, 1);
  cr_expect_eq(o.code, SHARDD_E_ABORTED, "%s", o.msg);
  cr_expect_eq(count_entries(FR.root), 0);
  hplan_free(&h);
}

Test(publish, closing_the_writer_fails_what_is_in_flight, .init = setup, .fini = fr_teardown,
     .timeout = 60) {
  uint64_t s[] = {48u << 20};
  hplan h;
  hplan_init(&h, 1, s, 1 << 20, "model");
  fr_outcome o = {0};
  sd_publish_req req = hreq(&h, "ckpt", &o);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  int closed = 0;
  sd_writer_close(FR.w, fr_closed_cb, &closed);
  FR.w = NULL;
  while (!closed && uv_run(&FR.loop, UV_RUN_ONCE)) {}
  cr_expect_eq(closed, 1);
  cr_expect_eq(o.done, 1);
  cr_expect_eq(o.code, SHARDD_E_SHUTTING_DOWN, "%s", o.msg);
  cr_expect_eq(count_entries(FR.root), 0);
  hplan_free(&h);
}

/* ------------------------------------------------------------------------ *
 * With the real planner and the strict reader
 * ------------------------------------------------------------------------ */
Test(publish, planned_checkpoint_reads_back, .init = setup, .fini = fr_teardown) {
  enum { N = 9 };
  /* name, dtype, ndim, shape: a 0-d scalar and a zero-size tensor included */
  static const struct { const char *name; sd_dtype dt; uint32_t ndim; uint64_t d0, d1; } spec[N] = {
    {"embed.weight", SD_DT_BF16, 2, 300, 64}, {"layers.0.w", SD_DT_BF16, 2, 100, 64},
    {"layers.1.w", SD_DT_BF16, 2, 100, 64},   {"layers.2.w", SD_DT_BF16, 2, 100, 64},
    {"layers.10.w", SD_DT_BF16, 2, 100, 64},  {"norm.weight", SD_DT_F32, 1, 64, 0},
    {"scalar", SD_DT_BF16, 0, 0, 0},          {"empty", SD_DT_BF16, 2, 0, 64},
    {"lm_head.weight", SD_DT_BF16, 2, 250, 64}};
  sd_tensor t[N];
  memset(t, 0, sizeof t);
  for (int i = 0; i < N; i++) {
    t[i] = (sd_tensor){.name = spec[i].name, .dtype = spec[i].dt, .ndim = spec[i].ndim,
                       .index = -1};
    t[i].shape[0] = spec[i].d0;
    t[i].shape[1] = spec[i].d1;
  }
  sd_kv meta[] = {{"step", "100"}};
  sd_plan_opts opts = {.max_shard_size = 40000, .prefix = "model", .metadata = meta,
                       .nmetadata = 1};
  sd_plan plan;
  sd_error err;
  cr_assert_eq(sd_plan_build(&plan, t, N, &opts, &err), 0, "%s", err.msg);
  cr_assert_gt(plan.nfiles, 1);
  size_t ilen;
  char *ix = sd_index_encode(&plan, t, &ilen, &err);
  cr_assert_not_null(ix, "%s", err.msg);

  /* each tensor's bytes, written in two halves (a dim-0 split across two "ranks") */
  uint8_t *data[N];
  sd_write_op ops[2 * N];
  size_t nops = 0;
  for (int i = 0; i < N; i++) {
    uint64_t nb;
    cr_assert_eq(sd_tensor_nbytes(&t[i], &nb, &err), 0);
    data[i] = malloc(nb + 1);
    for (uint64_t b = 0; b < nb; b++) data[i][b] = (uint8_t)fr_rnd();
    const sd_plan_loc *l = &plan.loc[i];
    cr_assert_eq(l->nbytes, nb);
    uint64_t half = nb / 2;
    ops[nops++] = (sd_write_op){l->file, l->file_offset + half, data[i] + half, nb - half, 0, 0};
    ops[nops++] = (sd_write_op){l->file, l->file_offset, data[i], half, 0, 0};
  }
  fr_outcome o = {0};
  sd_publish_req req = {
    .root_fd = FR.root_fd, .root_path = FR.root, .rel_dir = "ckpt", .plan = &plan,
    .ops = ops, .nops = nops, .index_json = ix, .index_len = ilen, .tag = "s",
    .on_released = fr_on_released, .on_done = fr_on_done, .ud = &o,
  };
  sd_publish *p;
  cr_assert_eq(sd_publish_start(FR.w, &req, &p, &err), 0, "%s", err.msg);
  fr_run_until(&o);
  cr_assert_eq(o.code, 0, "%s", o.msg);

  sd_ckpt c;
  cr_assert_eq(sd_ckpt_read(o.path, &c, &err), 0, "the strict reader refuses it: %s", err.msg);
  cr_expect_eq(c.nfiles, plan.nfiles);
  cr_expect_eq(c.ntensors, N);
  cr_expect_eq(c.total_size, plan.total_size);
  sd_ckpt_free(&c);
  for (int i = 0; i < N; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", o.path, plan.files[plan.loc[i].file].name);
    size_t len;
    uint8_t *b = fr_slurp(path, &len);
    cr_assert_not_null(b);
    cr_assert_leq(plan.loc[i].file_offset + plan.loc[i].nbytes, len);
    cr_expect(!memcmp(b + plan.loc[i].file_offset, data[i], plan.loc[i].nbytes),
              "%s reads back", spec[i].name);
    cr_expect(!memcmp(b, plan.files[plan.loc[i].file].header,
                      plan.files[plan.loc[i].file].header_size), "header of %s", path);
    free(b);
    free(data[i]);
  }
  expect_file(o.path, plan.index_name, (const uint8_t *)ix, ilen);
  free(ix);
  sd_plan_free(&plan);
}
