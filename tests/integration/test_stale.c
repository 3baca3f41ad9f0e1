/* Stale and foreign files through a real daemon: verify and load refuse shard-named files the index does not name and named ones that are missing; an overwrite leaves no file of the old checkpoint. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

TestSuite(stale, .init = h_setup, .fini = h_teardown, .timeout = 100);

#define NLAYERS 6

/* layer.N.w, F32 [100] (400 bytes) for N = 1..6, rows split between two ranks, and rank 0's
 * files: max_shard_size 1000 holds two tensors a file (three files), 0 one file. */
typedef struct {
  char names[NLAYERS][32];
  h_put puts[2 * NLAYERS];
  h_file files[2];
  h_script s;
} layers;

static void save_layers(layers *l, const char *save, const char *dir, uint64_t max_shard, int overwrite,
                        uint64_t seed, const h_file *files, size_t nfiles) {
  memset(l, 0, sizeof *l);
  for (int i = 0; i < NLAYERS; i++) {
    snprintf(l->names[i], sizeof l->names[i], "layer.%d.w", i + 1);
    for (int r = 0; r < 2; r++)
      l->puts[2 * i + r] = (h_put){.rank = r, .name = l->names[i], .dtype = "F32", .ndim = 1, .shape = {100},
                                   .boxed = 1, .start = {(uint64_t)r * 50}, .count = {50}, .how = H_COPY};
  }
  memcpy(l->files, files, nfiles * sizeof *files);
  l->s = (h_script){.opts = {.save = save, .dir = dir, .world_size = 2, .max_shard_size = max_shard,
                             .overwrite = overwrite},
                    .puts = l->puts, .nputs = 2 * NLAYERS, .files = l->files, .nfiles = nfiles, .seed = seed};
  h_run(&l->s);
  h_expect_committed(&l->s);
  h_check_script(&l->s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The folder's entries, sorted and joined by spaces. */
static void listing(const char *rel, char *out, size_t n) {
  char p[PATH_MAX];
  DIR *d = opendir(h_path(p, sizeof p, rel));
  cr_assert_not_null(d, "%s", p);
  char *names[64];
  size_t k = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && k < 64) names[k++] = strdup(de->d_name);
  closedir(d);
  qsort(names, k, sizeof *names, cmp_str);
  out[0] = '\0';
  for (size_t i = 0; i < k; i++) {
    snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? " " : "", names[i]);
    free(names[i]);
  }
}

static void write_rel(const char *rel, const void *data, size_t len) {
  char p[PATH_MAX];
  int fd = open(h_path(p, sizeof p, rel), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0, "%s", p);
  cr_assert_eq(write(fd, data, len), (ssize_t)len);
  close(fd);
}

static void copy_rel(const char *from, const char *to) {
  char p[PATH_MAX];
  size_t len;
  char *b = h_slurp(h_path(p, sizeof p, from), &len);
  cr_assert_not_null(b, "%s", p);
  write_rel(to, b, len);
  free(b);
}

static void remove_rel(const char *rel) {
  char p[PATH_MAX];
  cr_assert_eq(unlink(h_path(p, sizeof p, rel)), 0, "%s", p);
}

/* shardctl verify and shardd_ckpt_open both refuse ROOT/rel with bad_file_set, naming the file. */
static void expect_refused(const char *rel, const char *file, const char *frag) {
  char dir[PATH_MAX], out[8192];
  h_path(dir, sizeof dir, rel);
  int st = h_shardctl(out, sizeof out, "verify", dir, (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "shardctl verify accepts %s: %s", dir, out);
  cr_assert(strstr(out, "bad_file_set"), "shardctl verify does not give the code: %s", out);
  cr_assert(strstr(out, file), "shardctl verify does not name %s: %s", file, out);
  cr_assert(strstr(out, frag), "shardctl verify does not say '%s': %s", frag, out);
  shardd_ckpt *c = NULL;
  int rc = shardd_ckpt_open(dir, &c);
  cr_assert_eq(rc, SHARDD_E_FILE_SET, "load of %s: %s: %s", dir, shardd_err_name(rc), shardd_last_error(NULL));
  cr_assert_null(c);
  cr_assert(strstr(shardd_last_error(NULL), file), "load does not name %s: %s", file, shardd_last_error(NULL));
  printf("stale: %s\n", out);
}

static void expect_loads(const char *rel) {
  h_verify_ok(rel);
  char dir[PATH_MAX];
  shardd_ckpt *c = NULL;
  cr_assert_eq(shardd_ckpt_open(h_path(dir, sizeof dir, rel), &c), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_ckpt_count(c), NLAYERS);
  shardd_ckpt_close(c);
}

#define SHARD3(k) "model-0000" #k "-of-00003.safetensors"
#define INDEX "model.safetensors.index.json"

static const char old_config[] = "{\"model_type\":\"old\"}";
static const char new_config[] = "{\"model_type\":\"new\"}";

/* ------------------------------------------------------------------------ *
 * Overwrite: the new checkpoint's files and nothing else
 * ------------------------------------------------------------------------ */
Test(stale, overwriting_three_files_with_one_leaves_only_the_new_files) {
  const h_file old_files[] = {{0, "config.json", old_config, sizeof old_config - 1},
                              {0, "tokenizer.json", "{}", 2}};
  const h_file new_files[] = {{0, "config.json", new_config, sizeof new_config - 1}};
  layers l;
  char got[1024];
  save_layers(&l, "three", "runs/a", 1000, 0, 1, old_files, 2);
  listing("runs/a", got, sizeof got);
  cr_assert_str_eq(got, "config.json " SHARD3(1) " " SHARD3(2) " " SHARD3(3) " " INDEX " tokenizer.json");

  save_layers(&l, "one", "runs/a", 0, 1, 2, new_files, 1);
  listing("runs/a", got, sizeof got);
  cr_assert_str_eq(got, "config.json model.safetensors", "the overwritten folder holds old files: %s", got);
  char p[PATH_MAX];
  char *cfg = h_slurp(h_path(p, sizeof p, "runs/a/config.json"), NULL);
  cr_assert_str_eq(cfg, new_config);
  free(cfg);
  expect_loads("runs/a");
  cr_assert_eq(h_tmp_count(), 0, "the replaced checkpoint is left under a temporary name");

  /* and back: one file to three, no model.safetensors left beside the index */
  save_layers(&l, "three-again", "runs/a", 1000, 1, 3, old_files, 1);
  listing("runs/a", got, sizeof got);
  cr_assert_str_eq(got, "config.json " SHARD3(1) " " SHARD3(2) " " SHARD3(3) " " INDEX,
                   "the overwritten folder holds old files: %s", got);
  expect_loads("runs/a");
  cr_assert_eq(h_tmp_count(), 0);
}

/* ------------------------------------------------------------------------ *
 * Files planted beside or taken from a committed checkpoint
 * ------------------------------------------------------------------------ */
Test(stale, verify_and_load_refuse_a_stray_or_missing_shard_and_accept_other_files) {
  const h_file files[] = {{0, "config.json", old_config, sizeof old_config - 1}};
  layers l;
  save_layers(&l, "sharded", "runs/a", 1000, 0, 1, files, 1);

  /* what save_pretrained and tokenizers write beside the shards is normal */
  write_rel("runs/a/generation_config.json", "{}", 2);
  write_rel("runs/a/tokenizer_config.json", "{}", 2);
  copy_rel("runs/a/" SHARD3(1), "runs/a/optimizer.safetensors");
  expect_loads("runs/a");

  /* an older save's shard, and a single-file checkpoint's */
  copy_rel("runs/a/" SHARD3(1), "runs/a/model-00004-of-00004.safetensors");
  expect_refused("runs/a", "model-00004-of-00004.safetensors", "not in the weight_map of " INDEX);
  remove_rel("runs/a/model-00004-of-00004.safetensors");
  copy_rel("runs/a/" SHARD3(2), "runs/a/model.safetensors");
  expect_refused("runs/a", "model.safetensors", "stale or foreign");
  remove_rel("runs/a/model.safetensors");
  expect_loads("runs/a");

  /* a shard the index names, gone */
  remove_rel("runs/a/" SHARD3(2));
  expect_refused("runs/a", SHARD3(2), "which does not exist");
  /* the index gone too */
  remove_rel("runs/a/" INDEX);
  expect_refused("runs/a", INDEX, "is missing");

  /* a single-file checkpoint with a shard from an older sharded save beside it */
  save_layers(&l, "single", "runs/b", 0, 0, 2, files, 1);
  copy_rel("runs/b/model.safetensors", "runs/b/" SHARD3(3));
  expect_refused("runs/b", SHARD3(3), "beside the single-file checkpoint model.safetensors");
}
