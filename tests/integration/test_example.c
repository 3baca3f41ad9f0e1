/* The example rank program (shardd-example-rank) as real processes: TP=2 x DP=2 Llama, every byte checked with synth.h. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "synth.h"

TestSuite(example, .init = h_setup, .fini = h_teardown, .timeout = 110);

/* ------------------------------------------------------------------------ *
 * Running the binary
 * ------------------------------------------------------------------------ */
typedef struct {
  uint64_t hidden, layers, vocab, inter, max_shard_size, seed;
  int world, tp;
  const char *dtype, *save, *dir;
  int kill_rank; /* -1: none */
  int stream;    /* --stream: deferred puts, declared, ready */
  int repeat;    /* --repeat: saves over one connection and arena (0: the option is not given) */
} model;

static pid_t spawn_rank(const model *m, int rank, const char *out) {
  const char *bin = getenv("SHARDD_EXAMPLE_RANK");
  cr_assert(bin && *bin, "SHARDD_EXAMPLE_RANK is not set");
  char a[11][32];
  snprintf(a[0], 32, "%d", rank);
  snprintf(a[1], 32, "%d", m->world);
  snprintf(a[2], 32, "%d", m->tp);
  snprintf(a[3], 32, "%" PRIu64, m->hidden);
  snprintf(a[4], 32, "%" PRIu64, m->layers);
  snprintf(a[5], 32, "%" PRIu64, m->vocab);
  snprintf(a[6], 32, "%" PRIu64, m->inter);
  snprintf(a[7], 32, "%" PRIu64, m->max_shard_size);
  snprintf(a[8], 32, "%" PRIu64, m->seed);
  const char *argv[40] = {bin, "--socket", H.sock, "--save", m->save, "--dir", m->dir, "--rank", a[0],
                          "--world-size", a[1], "--tp", a[2], "--hidden", a[3], "--layers", a[4],
                          "--vocab", a[5], "--intermediate", a[6], "--max-shard-size", a[7], "--seed", a[8],
                          "--dtype", m->dtype, "--file", "config.json"};
  int k = 0;
  while (argv[k]) k++;
  if (rank == m->kill_rank) argv[k++] = "--kill-before-seal";
  if (m->stream) argv[k++] = "--stream";
  if (m->repeat) {
    snprintf(a[10], 32, "%d", m->repeat);
    argv[k++] = "--repeat";
    argv[k++] = a[10];
  }
  argv[k] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char err[PATH_MAX + 8];
    snprintf(err, sizeof err, "%s.err", out);
    int efd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(efd, 2);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  h_track_pid(pid);
  return pid;
}

/* Runs every rank; returns each one's JSON line (parsed) and exit status. */
static void run_model(const model *m, json_t **lines, int *status) {
  pid_t pids[H_MAX_RANKS];
  char out[H_MAX_RANKS][PATH_MAX];
  for (int r = 0; r < m->world; r++) {
    snprintf(out[r], sizeof out[r], "%s/rank-%d.out", H.base, r);
    /* The dying rank starts last, once every other rank has begun: a rank
     * beginning after the save failed would start a new save of that id. */
    if (r == m->kill_rank) continue;
    pids[r] = spawn_rank(m, r, out[r]);
  }
  if (m->kill_rank >= 0) {
    h_await_begun(m->save, m->world - 1);
    pids[m->kill_rank] = spawn_rank(m, m->kill_rank, out[m->kill_rank]);
  }
  for (int r = 0; r < m->world; r++) {
    status[r] = h_reap(pids[r]);
    char *txt = h_slurp(out[r], NULL);
    cr_assert_not_null(txt);
    json_error_t je;
    lines[r] = json_loads(txt, JSON_DISABLE_EOF_CHECK, &je);
    if (r != m->kill_rank) cr_assert_not_null(lines[r], "rank %d printed no JSON line: '%s'", r, txt);
    free(txt);
  }
}

/* ------------------------------------------------------------------------ *
 * The model as rank_writer.c builds it: names, shapes, state-dict order
 * ------------------------------------------------------------------------ */
typedef struct {
  char name[96];
  int ndim;
  uint64_t shape[2];
} tensor;

static size_t model_tensors(const model *m, tensor *t) {
  size_t n = 0;
#define ADD(nd, d0, d1, ...)                                                  \
  do {                                                                        \
    snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                       \
    t[n].ndim = (nd);                                                         \
    t[n].shape[0] = (d0);                                                     \
    t[n].shape[1] = (d1);                                                     \
    n++;                                                                      \
  } while (0)
  const uint64_t H_ = m->hidden, I = m->inter, V = m->vocab;
  ADD(2, V, H_, "model.embed_tokens.weight");
  for (uint64_t l = 0; l < m->layers; l++) {
    ADD(2, H_, H_, "model.layers.%" PRIu64 ".self_attn.q_proj.weight", l);
    ADD(2, H_, H_, "model.layers.%" PRIu64 ".self_attn.k_proj.weight", l);
    ADD(2, H_, H_, "model.layers.%" PRIu64 ".self_attn.v_proj.weight", l);
    ADD(2, H_, H_, "model.layers.%" PRIu64 ".self_attn.o_proj.weight", l);
    ADD(2, I, H_, "model.layers.%" PRIu64 ".mlp.gate_proj.weight", l);
    ADD(2, I, H_, "model.layers.%" PRIu64 ".mlp.up_proj.weight", l);
    ADD(2, H_, I, "model.layers.%" PRIu64 ".mlp.down_proj.weight", l);
    ADD(1, H_, 0, "model.layers.%" PRIu64 ".input_layernorm.weight", l);
    ADD(1, H_, 0, "model.layers.%" PRIu64 ".post_attention_layernorm.weight", l);
  }
  ADD(1, H_, 0, "model.norm.weight");
  ADD(2, V, H_, "lm_head.weight");
#undef ADD
  return n;
}

static uint64_t tensor_bytes(const tensor *t, unsigned es) {
  return es * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
}

/* Checks the committed folder: every tensor's bytes from synth.h, the shard
 * files huggingface_hub's split gives in state-dict order, config.json. */
static void check_model(const model *m) {
  static tensor t[512];
  size_t n = model_tensors(m, t);
  unsigned es = h_dtype_size(m->dtype);
  sd_ckpt c;
  h_ckpt_read(m->dir, &c);
  cr_assert_eq(c.ntensors, n, "the checkpoint holds %llu tensors, the model has %zu",
               (unsigned long long)c.ntensors, n);
  for (size_t i = 0; i < n; i++) {
    const sd_st_tensor *st = h_ckpt_find(&c, t[i].name, NULL);
    cr_assert_not_null(st, "'%s' is missing", t[i].name);
    cr_assert_str_eq(sd_dtype_name(st->dtype), m->dtype);
    cr_assert_eq((int)st->ndim, t[i].ndim, "'%s'", t[i].name);
    for (int d = 0; d < t[i].ndim; d++) cr_assert_eq(st->shape[d], t[i].shape[d], "'%s' dim %d", t[i].name, d);
    size_t len;
    uint8_t *want = h_synth_tensor(t[i].name, m->seed, m->dtype, t[i].ndim, t[i].shape, &len);
    h_check_bytes(m->dir, t[i].name, want, len);
    free(want);
  }

  /* huggingface_hub's split over the state-dict order. */
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

  char rel[256], p[PATH_MAX];
  snprintf(rel, sizeof rel, "%s/config.json", m->dir);
  char *cfg = h_slurp(h_path(p, sizeof p, rel), NULL);
  cr_assert_not_null(cfg, "config.json is missing");
  json_t *j = json_loads(cfg, 0, NULL);
  cr_assert_not_null(j, "config.json is not JSON: %s", cfg);
  cr_assert_str_eq(json_string_value(json_object_get(j, "model_type")), "llama");
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(j, "vocab_size")), m->vocab);
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(j, "hidden_size")), m->hidden);
  json_decref(j);
  free(cfg);
  h_verify_ok(m->dir);
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
