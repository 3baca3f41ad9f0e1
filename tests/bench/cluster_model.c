/* bench_cluster's model: DeepSeek-V3's tensor table, scaled, and each rank's boxes in FSDP2, HSDP and Megatron EP x PP layouts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_model.h"

/* DeepSeek-V3's config.json */
#define HIDDEN 7168
#define VOCAB 129280
#define DENSE_FFN 18432
#define MOE_FFN 2048
#define EXPERTS 256
#define DENSE_LAYERS 3
#define LAYERS 61          /* plus one multi-token-prediction layer, numbered 61 */
#define HEADS 128
#define Q_LORA 1536
#define KV_LORA 512
#define ROPE_DIM 64
#define NOPE_DIM 128
#define V_DIM 128
#define BLOCK 128          /* fp8 weight_scale_inv blocks */

typedef struct {
  cm_model *m;
  unsigned factor;
  int fp8, oom;
  size_t cap;
} builder;

static uint64_t scaled(uint64_t d, unsigned f) {
  uint64_t v = (d + f - 1) / f;
  return v ? v : 1;
}

static void add(builder *b, int layer, int expert, const char *dtype, unsigned esize, int ndim, uint64_t d0,
                uint64_t d1, const char *fmt, ...) __attribute__((format(printf, 9, 10)));

static void add(builder *b, int layer, int expert, const char *dtype, unsigned esize, int ndim, uint64_t d0,
                uint64_t d1, const char *fmt, ...) {
  cm_model *m = b->m;
  if (b->oom) return;
  if (m->n == b->cap) {
    size_t nc = b->cap ? 2 * b->cap : 4096;
    cm_tensor *t = realloc(m->t, nc * sizeof *t);
    if (!t) {
      b->oom = 1;
      return;
    }
    m->t = t;
    b->cap = nc;
  }
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  cm_tensor *t = &m->t[m->n];
  t->name = strdup(name);
  if (!t->name) {
    b->oom = 1;
    return;
  }
  t->dtype = dtype;
  t->esize = esize;
  t->ndim = ndim;
  t->shape[0] = scaled(d0, b->factor);
  t->shape[1] = ndim > 1 ? scaled(d1, b->factor) : 1;
  t->layer = layer;
  t->expert = expert;
  m->bytes += t->shape[0] * t->shape[1] * esize;
  m->n++;
}

/* A linear layer's weight [out, in]: BF16, or F8_E4M3 with its F32 block scales. */
static void linear(builder *b, int layer, int expert, uint64_t out, uint64_t in, const char *prefix) {
  if (!b->fp8) {
    add(b, layer, expert, "BF16", 2, 2, out, in, "%s.weight", prefix);
    return;
  }
  add(b, layer, expert, "F8_E4M3", 1, 2, out, in, "%s.weight", prefix);
  add(b, layer, expert, "F32", 4, 2, (out + BLOCK - 1) / BLOCK, (in + BLOCK - 1) / BLOCK, "%s.weight_scale_inv",
      prefix);
}

static void norm(builder *b, int layer, uint64_t n, const char *name) {
  add(b, layer, -1, "BF16", 2, 1, n, 0, "%s", name);
}

static void mlp(builder *b, int layer, int expert, uint64_t ffn, const char *prefix) {
  char p[192]; /* prefix (under 128) and the longest suffix */
  snprintf(p, sizeof p, "%s.gate_proj", prefix);
  linear(b, layer, expert, ffn, HIDDEN, p);
  snprintf(p, sizeof p, "%s.up_proj", prefix);
  linear(b, layer, expert, ffn, HIDDEN, p);
  snprintf(p, sizeof p, "%s.down_proj", prefix);
  linear(b, layer, expert, HIDDEN, ffn, p);
}

static void decoder_layer(builder *b, int l) {
  char p[32], q[128]; /* "model.layers.N", and it with the longest suffix */
  snprintf(p, sizeof p, "model.layers.%d", l);
  snprintf(q, sizeof q, "%s.input_layernorm.weight", p);
  norm(b, l, HIDDEN, q);
  snprintf(q, sizeof q, "%s.post_attention_layernorm.weight", p);
  norm(b, l, HIDDEN, q);
  /* MLA */
  snprintf(q, sizeof q, "%s.self_attn.q_a_proj", p);
  linear(b, l, -1, Q_LORA, HIDDEN, q);
  snprintf(q, sizeof q, "%s.self_attn.q_a_layernorm.weight", p);
  norm(b, l, Q_LORA, q);
  snprintf(q, sizeof q, "%s.self_attn.q_b_proj", p);
  linear(b, l, -1, HEADS * (NOPE_DIM + ROPE_DIM), Q_LORA, q);
  snprintf(q, sizeof q, "%s.self_attn.kv_a_proj_with_mqa", p);
  linear(b, l, -1, KV_LORA + ROPE_DIM, HIDDEN, q);
  snprintf(q, sizeof q, "%s.self_attn.kv_a_layernorm.weight", p);
  norm(b, l, KV_LORA, q);
  snprintf(q, sizeof q, "%s.self_attn.kv_b_proj", p);
  linear(b, l, -1, HEADS * (NOPE_DIM + V_DIM), KV_LORA, q);
  snprintf(q, sizeof q, "%s.self_attn.o_proj", p);
  linear(b, l, -1, HIDDEN, HEADS * V_DIM, q);
  if (l < DENSE_LAYERS) {
    snprintf(q, sizeof q, "%s.mlp", p);
    mlp(b, l, -1, DENSE_FFN, q);
    return;
  }
  add(b, l, -1, "BF16", 2, 2, EXPERTS, HIDDEN, "%s.mlp.gate.weight", p);
  add(b, l, -1, "F32", 4, 1, EXPERTS, 0, "%s.mlp.gate.e_score_correction_bias", p);
  snprintf(q, sizeof q, "%s.mlp.shared_experts", p);
  mlp(b, l, -1, MOE_FFN, q);
  for (int e = 0; e < EXPERTS; e++) {
    snprintf(q, sizeof q, "%s.mlp.experts.%d", p, e);
    mlp(b, l, e, MOE_FFN, q);
  }
}

int cm_deepseek_v3(cm_model *m, unsigned factor, int fp8, int layers) {
  memset(m, 0, sizeof *m);
  builder b = {.m = m, .factor = factor ? factor : 1, .fp8 = fp8};
  if (layers <= 0 || layers > LAYERS + 1) layers = LAYERS + 1;
  m->layers = layers;
  add(&b, 0, -1, "BF16", 2, 2, VOCAB, HIDDEN, "model.embed_tokens.weight");
  for (int l = 0; l < layers && l < LAYERS; l++) decoder_layer(&b, l);
  if (layers == LAYERS + 1) {
    /* the multi-token-prediction module, stored as layer 61 */
    decoder_layer(&b, LAYERS);
    add(&b, LAYERS, -1, "BF16", 2, 2, VOCAB, HIDDEN, "model.layers.61.embed_tokens.weight");
    norm(&b, LAYERS, HIDDEN, "model.layers.61.enorm.weight");
    norm(&b, LAYERS, HIDDEN, "model.layers.61.hnorm.weight");
    add(&b, LAYERS, -1, "BF16", 2, 2, HIDDEN, 2 * HIDDEN, "model.layers.61.eh_proj.weight");
    norm(&b, LAYERS, HIDDEN, "model.layers.61.shared_head.norm.weight");
    add(&b, LAYERS, -1, "BF16", 2, 2, VOCAB, HIDDEN, "model.layers.61.shared_head.head.weight");
  }
  norm(&b, layers - 1, HIDDEN, "model.norm.weight");
  add(&b, layers - 1, -1, "BF16", 2, 2, VOCAB, HIDDEN, "lm_head.weight");
  if (b.oom) {
    cm_free(m);
    return -1;
  }
  return 0;
}

void cm_free(cm_model *m) {
  for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
  free(m->t);
  memset(m, 0, sizeof *m);
}

const char *cm_layout_name(int layout) {
  return layout == CM_FSDP ? "fsdp2" : layout == CM_HSDP ? "hsdp" : "ep-pp";
}

/* torch.chunk over n parts of d rows: part i's [start, start + count). */
static void chunk(uint64_t d, uint64_t n, uint64_t i, uint64_t *start, uint64_t *count) {
  uint64_t c = (d + n - 1) / n;
  uint64_t s = c * i;
  *start = s < d ? s : d;
  *count = s < d ? (d - s < c ? d - s : c) : 0;
}

int cm_box(int layout, const cm_model *m, size_t ti, int rank, int nodes, int per_node, uint64_t *start,
           uint64_t *count) {
  const cm_tensor *t = &m->t[ti];
  uint64_t world = (uint64_t)nodes * (uint64_t)per_node;
  start[1] = 0;
  count[1] = t->shape[1];
  if (layout == CM_FSDP) {
    chunk(t->shape[0], world, (uint64_t)rank, &start[0], &count[0]);
    return 1;
  }
  if (layout == CM_HSDP) {
    chunk(t->shape[0], (uint64_t)per_node, (uint64_t)(rank % per_node), &start[0], &count[0]);
    return 1;
  }
  /* Megatron, tp-ep-dp-pp order with TP 1: PP = 8 stages of whole layers (fewer when the world is
   * smaller), the ranks of a stage its expert-parallel group; routed experts dealt round-robin over
   * them, everything else of the stage replicated on each (its data-parallel copies). */
  uint64_t pp = world < 8 ? world : 8, ep = world / pp;
  uint64_t stage = (uint64_t)rank / ep, ep_rank = (uint64_t)rank % ep;
  if (stage >= pp) return 0;
  uint64_t first = stage * (uint64_t)m->layers / pp, last = (stage + 1) * (uint64_t)m->layers / pp;
  if ((uint64_t)t->layer < first || (uint64_t)t->layer >= last) return 0;
  if (t->expert >= 0 && (uint64_t)t->expert % ep != ep_rank) return 0;
  start[0] = 0;
  count[0] = t->shape[0];
  return 1;
}
