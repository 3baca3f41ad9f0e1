/* The example rank program as real processes for the integration suites: spawning, its JSON line, its checkpoint checked. */
#include "ranks.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

pid_t r_spawn(const r_model *m, int rank, const char *out) {
  const char *bin = getenv("SHARDD_EXAMPLE_RANK");
  cr_assert(bin && *bin, "SHARDD_EXAMPLE_RANK is not set");
  char a[12][32];
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
  if (m->overwrite) argv[k++] = "--overwrite";
  if (m->repeat) {
    snprintf(a[10], 32, "%d", m->repeat);
    argv[k++] = "--repeat";
    argv[k++] = a[10];
  }
  if (m->keep_last) {
    snprintf(a[11], 32, "%d", m->keep_last);
    argv[k++] = "--keep-last";
    argv[k++] = a[11];
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

json_t *r_line(const char *out) {
  char *txt = h_slurp(out, NULL);
  if (!txt) return NULL;
  json_error_t je;
  json_t *j = json_loads(txt, JSON_DISABLE_EOF_CHECK, &je);
  free(txt);
  return j;
}

size_t r_model_tensors(const r_model *m, r_tensor *t) {
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

void r_check_model(const r_model *m) {
  static r_tensor t[512];
  size_t n = r_model_tensors(m, t);
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

int r_holds_seed(const r_model *m, const char *dir) {
  uint64_t shape[1] = {m->hidden};
  size_t want_len, got_len;
  uint8_t *want = h_synth_tensor("model.norm.weight", m->seed, m->dtype, 1, shape, &want_len);
  uint8_t *got = h_read_tensor(dir, "model.norm.weight", &got_len);
  int same = want_len == got_len && memcmp(want, got, want_len) == 0;
  free(want);
  free(got);
  return same;
}
