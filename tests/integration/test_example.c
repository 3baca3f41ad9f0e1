/* The example rank program (shardd-example-rank) as real processes: TP=2 x DP=2 Llama, every byte checked with synth.h. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ranks.h"

TestSuite(example, .init = h_setup, .fini = h_teardown, .timeout = 110);

typedef r_model model;

/* ------------------------------------------------------------------------ *
 * Running the binary
 * ------------------------------------------------------------------------ */
/* Runs every rank; returns each one's JSON line (parsed) and exit status. */
static void run_model(const model *m, json_t **lines, int *status) {
  pid_t pids[H_MAX_RANKS];
  char out[H_MAX_RANKS][PATH_MAX];
  for (int r = 0; r < m->world; r++) {
    snprintf(out[r], sizeof out[r], "%s/rank-%d.out", H.base, r);
    /* The dying rank starts last, once every other rank has begun: a rank
     * beginning after the save failed would start a new save of that id. */
    if (r == m->kill_rank) continue;
    pids[r] = r_spawn(m, r, out[r]);
  }
  if (m->kill_rank >= 0) {
    h_await_begun(m->save, m->world - 1);
    pids[m->kill_rank] = r_spawn(m, m->kill_rank, out[m->kill_rank]);
  }
  for (int r = 0; r < m->world; r++) {
    status[r] = h_reap(pids[r]);
    lines[r] = r_line(out[r]);
    if (r != m->kill_rank) cr_assert_not_null(lines[r], "rank %d printed no JSON line", r);
  }
}

static uint64_t tensor_bytes(const r_tensor *t, unsigned es) {
  return es * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
}

/* Checks the committed folder: every tensor's bytes from synth.h, config.json, and the shard
 * files huggingface_hub's split gives in state-dict order. */
static void check_model(const model *m) {
  r_check_model(m);
  static r_tensor t[512];
  size_t n = r_model_tensors(m, t);
  unsigned es = h_dtype_size(m->dtype);
  sd_ckpt c;
  h_ckpt_read(m->dir, &c);
  uint64_t sizes[512];
  uint32_t file_of[512];
  for (size_t i = 0; i < n; i++) sizes[i] = tensor_bytes(&t[i], es);
  size_t nshards = h_hf_split(sizes, n, m->max_shard_size, file_of);
  cr_assert_gt(nshards, 2, "pick a max_shard_size that gives several shards");
  cr_assert_eq(c.nfiles, nshards);
  for (size_t i = 0; i < n; i++) {
    char want[96];
    snprintf(want, sizeof want, "model-%05u-of-%05zu.safetensors", file_of[i] + 1, nshards);
    const sd_ckpt_file *f = NULL;
    h_ckpt_find(&c, t[i].name, &f);
    cr_assert_str_eq(f->name, want, "'%s' is in the wrong shard", t[i].name);
  }
  sd_ckpt_free(&c);
}

/* Runs every rank, each exiting 0 with its save committed, then checks the checkpoint. */
static void run_committed(const model *m) {
  json_t *lines[H_MAX_RANKS];
  int status[H_MAX_RANKS];
  run_model(m, lines, status);
  for (int r = 0; r < m->world; r++) {
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d exited 0x%x", r, status[r]);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "state")), "committed", "rank %d", r);
    json_decref(lines[r]);
  }
  check_model(m);
}

/* ------------------------------------------------------------------------ *
 * Tests
 * ------------------------------------------------------------------------ */
Test(example, four_ranks_tp2_dp2_small_llama) {
  /* vocab and intermediate odd, so TP halves are uneven */
  model m = {.hidden = 64, .layers = 2, .vocab = 101, .inter = 173, .max_shard_size = 40000, .seed = 5,
             .world = 4, .tp = 2, .dtype = "BF16", .save = "llama", .dir = "llama/step-100", .kill_rank = -1};
  json_t *lines[H_MAX_RANKS];
  int status[H_MAX_RANKS];
  run_model(&m, lines, status);
  char p[PATH_MAX];
  for (int r = 0; r < m.world; r++) {
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d exited 0x%x", r, status[r]);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "state")), "committed", "rank %d", r);
    cr_assert_eq(json_integer_value(json_object_get(lines[r], "tp_rank")), r % 2);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "dir")), h_path(p, sizeof p, m.dir));
    cr_assert_eq(json_integer_value(json_object_get(lines[r], "files")),
                 h_dir_count(h_path(p, sizeof p, m.dir)), "rank %d: files", r);
    json_decref(lines[r]);
  }
  check_model(&m);
  char out[1 << 14];
  int st = h_shardctl(out, sizeof out, "inspect", h_path(p, sizeof p, m.dir), (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", out);
  cr_assert(strstr(out, "model.layers.1.mlp.down_proj.weight"), "%s", out);
  cr_assert_eq(h_tmp_count(), 0);
}

Test(example, three_way_tp_with_uneven_splits_in_f32) {
  model m = {.hidden = 50, .layers = 1, .vocab = 97, .inter = 130, .max_shard_size = 30000, .seed = 6,
             .world = 3, .tp = 3, .dtype = "F32", .save = "tp3", .dir = "tp3", .kill_rank = -1};
  run_committed(&m);
}

/* TP finer than the model's dimensions (hidden 3, intermediate 2 over
 * tp 4): some ranks' slices are empty and they put them all the same, in
 * one batch, plain and streamed, with DP replicas of the empty ones. */
static void run_tiny_tp4(int world, int stream, const char *save) {
  model m = {.hidden = 3, .layers = 1, .vocab = 5, .inter = 2, .max_shard_size = 40, .seed = 8,
             .world = world, .tp = 4, .dtype = "F32", .save = save, .dir = save, .kill_rank = -1, .stream = stream};
  json_t *lines[H_MAX_RANKS];
  int status[H_MAX_RANKS];
  run_model(&m, lines, status);
  for (int r = 0; r < m.world; r++) {
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d exited 0x%x", r, status[r]);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "state")), "committed", "rank %d: %s", r,
                     json_string_value(json_object_get(lines[r], "message")));
    json_decref(lines[r]);
  }
  check_model(&m);
}

Test(example, tp_finer_than_the_dimensions_puts_empty_slices) { run_tiny_tp4(4, 0, "tp4"); }

Test(example, tp_finer_than_the_dimensions_streamed_with_replicas) { run_tiny_tp4(8, 1, "tp4s"); }

Test(example, a_rank_dying_before_seal_fails_the_others_with_client_lost) {
  model m = {.hidden = 32, .layers = 1, .vocab = 50, .inter = 80, .max_shard_size = 0, .seed = 7,
             .world = 4, .tp = 2, .dtype = "BF16", .save = "dies", .dir = "dies", .kill_rank = 3};
  m.max_shard_size = 1000000;
  json_t *lines[H_MAX_RANKS];
  int status[H_MAX_RANKS];
  run_model(&m, lines, status);
  cr_assert(WIFEXITED(status[3]) && WEXITSTATUS(status[3]) == 3, "the dying rank exits 3 (0x%x)", status[3]);
  for (int r = 0; r < 3; r++) {
    cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 1, "rank %d exited 0x%x", r, status[r]);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "state")), "failed", "rank %d", r);
    cr_assert_str_eq(json_string_value(json_object_get(lines[r], "error")), "client_lost", "rank %d: %s", r,
                     json_string_value(json_object_get(lines[r], "message")));
    cr_assert(strstr(json_string_value(json_object_get(lines[r], "message")), "rank 3"));
    json_decref(lines[r]);
  }
  json_decref(lines[3]);
  h_expect_unpublished("dies");
  h_expect_serving();
}

/* A trainer saving every N steps keeps its connection and arena: three saves over the same ones,
 * each checkpoint whole and byte-exact (the arena is written again between saves), the earlier
 * ones under DIR.wK as the example rank names them. */
Test(example, three_saves_over_one_connection_and_arena) {
  model m = {.hidden = 64, .layers = 2, .vocab = 101, .inter = 173, .max_shard_size = 40000, .seed = 9,
             .world = 4, .tp = 2, .dtype = "BF16", .save = "every", .dir = "every", .kill_rank = -1, .repeat = 3};
  run_committed(&m);
  const char *earlier[] = {"every.w1", "every.w2"};
  for (int k = 0; k < 2; k++) {
    model e = m;
    e.dir = earlier[k];
    check_model(&e);
  }
  cr_assert_eq(h_tmp_count(), 0);
  h_expect_serving();
}
