/* Checkpoints made by hand for the writer tests (test_staging.c, test_copies.c, test_gather.c): files, ops, publish requests, bytes compared on disk. */
#include "fixture_ckpt.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char index_json[] = "{\"metadata\": {}}\n";

void fc_add_op(fc_ckpt *c, uint32_t f, uint64_t off, uint64_t len, const uint8_t *src, uint32_t flags) {
  if (c->nops == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 256;
    c->ops = realloc(c->ops, c->cap * sizeof *c->ops);
    cr_assert_not_null(c->ops);
  }
  c->ops[c->nops++] = (sd_write_op){f, off, src, len, flags, 0};
}

void fc_init(fc_ckpt *c, size_t nfiles, const uint64_t *data_sizes, uint64_t max_piece, uint8_t *src,
             uint32_t flags) {
  memset(c, 0, sizeof *c);
  uint64_t total = 0;
  for (size_t i = 0; i < nfiles; i++) total += data_sizes[i];
  c->own_src = !src;
  c->src = src ? src : malloc(total + 1);
  cr_assert_not_null(c->src);
  sd_plan *p = &c->plan;
  p->nfiles = nfiles;
  p->files = calloc(nfiles, sizeof *p->files);
  c->want = calloc(nfiles, sizeof *c->want);
  cr_assert(p->files && c->want);
  uint64_t at = 0;
  for (size_t i = 0; i < nfiles; i++) {
    sd_plan_file *pf = &p->files[i];
    char name[64];
    snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, nfiles);
    pf->name = strdup(name);
    pf->header_size = 4096;
    pf->data_size = data_sizes[i];
    pf->file_size = pf->header_size + pf->data_size;
    pf->header = malloc(pf->header_size);
    c->want[i] = malloc(pf->file_size + 1);
    cr_assert(pf->name && pf->header && c->want[i]);
    for (uint64_t b = 0; b < pf->header_size; b++) pf->header[b] = (char)('A' + (b * 7 + i) % 26);
    memcpy(c->want[i], pf->header, pf->header_size);
    for (uint64_t b = 0; b < pf->data_size; b++) {
      uint8_t v = (uint8_t)(fr_rnd() | 1); /* never 0: a byte left unwritten shows */
      c->want[i][pf->header_size + b] = v;
      c->src[at + b] = v;
    }
    for (uint64_t off = 0; off < pf->data_size;) {
      uint64_t len = max_piece ? 1 + fr_rnd() % max_piece : pf->data_size;
      if (len > pf->data_size - off) len = pf->data_size - off;
      fc_add_op(c, (uint32_t)i, pf->header_size + off, len, c->src + at + off, flags);
      off += len;
    }
    at += pf->data_size;
  }
  fr_shuffle_ops(c->ops, c->nops);
  p->needs_index = nfiles > 1;
  p->index_name = strdup("model.safetensors.index.json");
}

void fc_init_even(fc_ckpt *c, size_t nfiles, uint64_t size, uint64_t max_piece, uint8_t *src, uint32_t flags) {
  uint64_t *sizes = malloc(nfiles * sizeof *sizes);
  cr_assert_not_null(sizes);
  for (size_t i = 0; i < nfiles; i++) sizes[i] = size;
  fc_init(c, nfiles, sizes, max_piece, src, flags);
  free(sizes);
}

void fc_free(fc_ckpt *c) {
  for (size_t i = 0; i < c->plan.nfiles; i++) {
    free(c->plan.files[i].name);
    free(c->plan.files[i].header);
    free(c->want[i]);
  }
  free(c->plan.files);
  free(c->plan.index_name);
  free(c->want);
  free(c->ops);
  if (c->own_src) free(c->src);
}

void fc_split_rows(fc_ckpt *c, uint64_t rows, uint64_t w, const uint8_t *seg, const uint8_t *bytes) {
  c->nops = 0;
  for (uint64_t r = 0; r < rows; r++)
    for (uint64_t k = 0; k < 2; k++) {
      uint64_t at = 4096 + r * 2 * w + k * w;
      fc_add_op(c, 0, at, w, seg + k * rows * w + r * w, SD_WOP_SHARED);
      memcpy(c->want[0] + at, bytes + k * rows * w + r * w, w);
    }
}

sd_publish_req fc_req(fc_ckpt *c, const char *rel, fr_outcome *o, const sd_shm_span *span) {
  return (sd_publish_req){
      .root_fd = FR.root_fd,
      .root_path = FR.root,
      .rel_dir = rel,
      .plan = &c->plan,
      .ops = c->ops,
      .nops = c->nops,
      .spans = span,
      .nspans = span ? 1 : 0,
      .index_json = c->plan.needs_index ? index_json : NULL,
      .index_len = c->plan.needs_index ? strlen(index_json) : 0,
      .tag = rel,
      .on_released = fr_on_released,
      .on_done = fr_on_done,
      .ud = o,
  };
}

void fc_publish(fc_ckpt *c, const char *rel, fr_outcome *o, const sd_shm_span *span) {
  sd_publish_req r = fc_req(c, rel, o, span);
  sd_publish *p;
  sd_error err;
  cr_assert_eq(sd_publish_start(FR.w, &r, &p, &err), 0, "%s", err.msg);
  fr_run_until(o);
}

static void expect_bytes(const char *rel, const char *name, const uint8_t *want, uint64_t len) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s/%s", FR.root, rel, name);
  fr_expect_file(path, name, want, len);
}

void fc_expect(const char *rel, const fc_ckpt *c) {
  for (size_t i = 0; i < c->plan.nfiles; i++)
    expect_bytes(rel, c->plan.files[i].name, c->want[i], c->plan.files[i].file_size);
  if (c->plan.needs_index)
    expect_bytes(rel, c->plan.index_name, (const uint8_t *)index_json, strlen(index_json));
}

uint8_t *fc_shared_segment(size_t len, int *fd) {
  *fd = memfd_create("sd-unit-segment", MFD_CLOEXEC);
  cr_assert_geq(*fd, 0);
  cr_assert_eq(ftruncate(*fd, (off_t)len), 0);
  uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  cr_assert_neq(m, MAP_FAILED);
  return m;
}

int fc_takes_direct(const char *dir) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/.probe", dir);
  int fd = open(p, O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd >= 0) close(fd);
  unlink(p);
  return fd >= 0;
}
