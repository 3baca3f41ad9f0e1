/* The benchmark's model: the example rank's Llama-shaped BF16 tensors, and their plan (what every phase writes). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_e2e.h"
#include "sd_writer_sync.h"
#include "synth.h"

#define GIB 1073741824.0

/* ------------------------------------------------------------------------ *
 * The model (same shapes, names and order as client/examples/rank_writer.c)
 * ------------------------------------------------------------------------ */
static void add(sd_e2e_model *m, const char *name, uint64_t d0, uint64_t d1, int ndim, int split) {
  sd_e2e_tensor *t = &m->t[m->n];
  sd_tensor *st = &m->st[m->n];
  sd_e2e_fmt(t->name, sizeof t->name, "%s", name);
  t->nbytes = 2 * d0 * (ndim == 2 ? d1 : 1);
  t->key = sd_synth_key(t->name, 0);
  memset(st, 0, sizeof *st);
  st->name = t->name;
  st->dtype = SD_DT_BF16;
  st->ndim = (uint32_t)ndim;
  st->shape[0] = d0;
  st->shape[1] = d1;
  st->index = (int64_t)m->n;
  m->tensor_bytes += t->nbytes;
  /* Rank 0's slice: [0, n/2) of the split dimension, the whole of a norm. */
  m->rank_bytes += split < 0 ? t->nbytes : t->nbytes / (split == 0 ? d0 : d1) * ((split == 0 ? d0 : d1) / 2);
  m->n++;
}

int sd_e2e_build_model(sd_e2e_model *m, double gib, uint64_t max_shard) {
  uint64_t target = (uint64_t)(gib * GIB);
  /* Llama widths: 7B-like above 2 GiB, smaller below, vocabulary 32000;
   * the number of layers brings the total near the target. */
  m->hidden = target >= (2ull << 30) ? 4096 : target >= (512ull << 20) ? 2048 : 1024;
  m->intermediate = (m->hidden * 43 / 16 + 63) / 64 * 64;
  m->vocab = 32000;
  uint64_t H = m->hidden, I = m->intermediate;
  uint64_t layer = 2 * (4 * H * H + 3 * H * I + 2 * H), outer = 2 * (2 * m->vocab * H + H);
  m->layers = target > outer ? (target - outer + layer / 2) / layer : 1;
  if (m->layers == 0) m->layers = 1;
  size_t n = 3 + 9 * (size_t)m->layers;
  m->t = calloc(n, sizeof *m->t);
  m->st = calloc(n, sizeof *m->st);
  if (!m->t || !m->st) return -1;
  char name[96];
  add(m, "model.embed_tokens.weight", m->vocab, H, 2, 0);
  for (uint64_t l = 0; l < m->layers; l++) {
    static const char *const qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; k++) {
      sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".self_attn.%s.weight", l, qkv[k]);
      add(m, name, H, H, 2, 0);
    }
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".self_attn.o_proj.weight", l);
    add(m, name, H, H, 2, 1);
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".mlp.gate_proj.weight", l);
    add(m, name, I, H, 2, 0);
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".mlp.up_proj.weight", l);
    add(m, name, I, H, 2, 0);
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".mlp.down_proj.weight", l);
    add(m, name, H, I, 2, 1);
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".input_layernorm.weight", l);
    add(m, name, H, 0, 1, -1);
    sd_e2e_fmt(name, sizeof name, "model.layers.%" PRIu64 ".post_attention_layernorm.weight", l);
    add(m, name, H, 0, 1, -1);
  }
  add(m, "model.norm.weight", H, 0, 1, -1);
  add(m, "lm_head.weight", m->vocab, H, 2, 0);
  m->max_shard_size = max_shard ? max_shard : ((m->tensor_bytes + 3) / 4 + 999999) / 1000000 * 1000000;
  return 0;
}

/* The metadata the example rank sends, so (b) and (c) write identical files. */
const sd_kv sd_e2e_example_md[3] = {{"shardd_example", "rank_writer"}, {"tp", "2"}, {"world_size", "4"}};

int sd_e2e_plan_model(sd_e2e_model *m) {
  sd_plan p;
  sd_error err;
  sd_plan_opts po = {.max_shard_size = m->max_shard_size, .metadata = sd_e2e_example_md, .nmetadata = 3};
  if (sd_plan_build(&p, m->st, m->n, &po, &err) != 0) {
    fprintf(stderr, "bench_e2e: planning the model failed: %s\n", err.msg);
    return -1;
  }
  m->nfiles = p.nfiles;
  m->file_bytes = 0;
  for (size_t f = 0; f < p.nfiles; f++) m->file_bytes += p.files[f].file_size;
  size_t ilen = 0;
  char *ix = p.needs_index ? sd_index_encode(&p, m->st, &ilen, &err) : NULL;
  m->file_bytes += ilen;
  free(ix);
  sd_plan_free(&p);
  return 0;
}

