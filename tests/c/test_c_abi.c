/* The C ABI 2.x from C11: every function, the policy parity through the ABI,
 * graph lifetime after rt_model_destroy, decode independence of the policy,
 * and every documented error status (NULL handles, bad enums, wrong buffer
 * sizes, stale graphs, corrupt files), each leaving the handles usable.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "riftco_transformer/rt.h"

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (cond) {                                                                      \
      ++g_passed;                                                                    \
    } else {                                                                         \
      ++g_failed;                                                                    \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              rt_last_error_message());                                              \
    }                                                                                \
  } while (0)

/* A call that must succeed. */
#define OK(call) CHECK((call) == RT_OK)
/* A call that must fail with `status` and a message containing `needle`. */
#define FAILS(call, status, needle)                                                    \
  do {                                                                                 \
    rt_status s_ = (call);                                                             \
    CHECK(s_ == (status));                                                             \
    if (s_ != (status)) fprintf(stderr, "  got %s\n", rt_status_name(s_));             \
    CHECK(strstr(rt_last_error_message(), (needle)) != NULL);                          \
  } while (0)

static char g_dir[256];

static const char* path_in(const char* name) {
  static char buffer[4][512];
  static int next = 0;
  char* out = buffer[next++ % 4];
  snprintf(out, 512, "%s/%s", g_dir, name);
  return out;
}

static rt_transformer_config tiny_config(void) {
  rt_transformer_config c;
  rt_transformer_config_default(&c);
  c.vocab_size = 256;
  c.context_length = 16;
  c.model_width = 16;
  c.heads = 2;
  c.layers = 3;
  c.feed_forward_width = 24;
  return c;
}

/* The 2-layer model and short run the pipeline tests share (the corpus is
 * written by test_pipelines): `corpus` receives its path, since path_in's
 * rotating buffers are reused by later calls. */
static void tiny_c_pretraining(rt_pretraining_config* c, char corpus[512], int64_t steps) {
  c->model.context_length = 32;
  c->model.model_width = 16;
  c->model.heads = 2;
  c->model.layers = 2;
  c->model.feed_forward_width = 32;
  snprintf(corpus, 512, "%s", path_in("corpus.txt"));
  c->stage.data = corpus;
  c->stage.steps = steps;
  c->stage.batch = 2;
  c->stage.sequence_length = 16;
  c->stage.eval_batches = 1;
  c->stage.checkpoint_interval = 0;
}

enum { B = 2, T = 8 };
static int32_t g_tokens[B * T];
static int32_t g_targets[B * T];

static void make_batch(void) {
  for (int i = 0; i < B * T; ++i) {
    g_tokens[i] = (int32_t)((i * 37 + 11) % 256);
    g_targets[i] = (int32_t)((i * 53 + 7) % 256);
  }
}

/* Every parameter gradient (gradients 1) or value (0) of `model`, concatenated
 * (malloc'd; *total_out elements). */
static float* model_floats(const rt_model* model, int gradients, size_t* total_out) {
  size_t count = 0;
  OK(rt_model_parameter_count(model, &count));
  int64_t elements = 0;
  OK(rt_model_parameter_elements(model, &elements));
  float* all = malloc(sizeof(float) * (size_t)elements);
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    char name[128];
    OK(rt_model_parameter_name(model, i, name, sizeof name, NULL));
    rt_variable* p = NULL;
    OK(rt_model_parameter(model, name, &p));
    int64_t n = 0;
    OK(rt_variable_numel(p, &n));
    if (gradients) {
      int has = 0;
      OK(rt_variable_grad(p, all + offset, (size_t)n, &has));
      CHECK(has == 1);
    } else {
      OK(rt_variable_value(p, all + offset, (size_t)n));
    }
    offset += (size_t)n;
    rt_variable_destroy(p);
  }
  CHECK((int64_t)offset == elements);
  *total_out = offset;
  return all;
}

static float* model_gradients(const rt_model* model, size_t* total_out) { return model_floats(model, 1, total_out); }
static float* model_values(const rt_model* model, size_t* total_out) { return model_floats(model, 0, total_out); }

/* Loss and every parameter gradient, concatenated, for one policy.
 * retain_graph -1: rt_variable_backward; 0 or 1: rt_variable_backward_ex. */
static float* loss_and_gradients(rt_activation_checkpointing policy, rt_attention attention, int retain_graph,
                                 float* loss_out, size_t* total_out) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 42, attention, policy, &model));
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  OK(rt_variable_item(loss, loss_out));
  if (retain_graph < 0) {
    OK(rt_variable_backward(loss));
  } else {
    OK(rt_variable_backward_ex(loss, NULL, 0, retain_graph));
  }
  float* all = model_gradients(model, total_out);
  rt_variable_destroy(loss);
  rt_model_destroy(model);
  return all;
}

/* *_init with the caller's size: too small is refused; a larger (newer
 * caller's) struct gets the 2.0 fields and keeps its struct_size. */
static void test_struct_init(void) {
  struct {
    rt_transformer_config c;
    char newer[16];
  } big;
  memset(&big, 0x7F, sizeof big);
  OK(rt_transformer_config_init(&big.c, sizeof big));
  CHECK(big.c.struct_size == sizeof big && big.c.vocab_size == 256 && big.newer[0] == 0x7F);
  rt_transformer_config t;
  FAILS(rt_transformer_config_init(&t, 8), RT_ERROR_INVALID_ARGUMENT, "smaller than ABI 2.0");
  FAILS(rt_transformer_config_init(NULL, sizeof t), RT_ERROR_INVALID_ARGUMENT, "NULL");
  rt_lora_config l;
  OK(rt_lora_config_init(&l, sizeof l));
  CHECK(l.rank == 8 && l.targets == (RT_LORA_QUERY | RT_LORA_VALUE));
  FAILS(rt_lora_config_init(&l, 4), RT_ERROR_INVALID_ARGUMENT, "smaller");
  rt_adam_options a;
  OK(rt_adam_options_init(&a, sizeof a));
  CHECK(a.beta1 > 0.89f && a.beta1 < 0.91f);
  FAILS(rt_adam_options_init(&a, 0), RT_ERROR_INVALID_ARGUMENT, "smaller");
  rt_generation_options g;
  OK(rt_generation_options_init(&g, sizeof g));
  CHECK(g.max_new_tokens == 64);
  FAILS(rt_generation_options_init(&g, 1), RT_ERROR_INVALID_ARGUMENT, "smaller");
  rt_pretraining_config p;
  OK(rt_pretraining_config_init(&p, sizeof p));
  CHECK(p.model.struct_size == sizeof(rt_transformer_config) && p.stage.steps == 200);
  FAILS(rt_pretraining_config_init(&p, 16), RT_ERROR_INVALID_ARGUMENT, "smaller");
  rt_post_training_config q;
  OK(rt_post_training_config_init(&q, sizeof q));
  CHECK(q.lora.struct_size == sizeof(rt_lora_config) && q.fine_tuning_method == RT_FINE_TUNING_LORA);
  FAILS(rt_post_training_config_init(&q, 16), RT_ERROR_INVALID_ARGUMENT, "smaller");
  rt_memory_stats m;
  m.struct_size = sizeof m;
  FAILS(rt_memory_stats_get(RT_BACKEND_CUDA, &m), RT_ERROR_BACKEND, "cuda backend is not built");
}

static void test_version_and_names(void) {
  CHECK(rt_abi_version() == ((2u << 16) | 9u));
  CHECK(RT_ABI_VERSION_MAJOR == 2 && RT_ABI_VERSION_MINOR == 9);
  CHECK(strcmp(rt_status_name(RT_ERROR_STALE_GRAPH), "RT_ERROR_STALE_GRAPH") == 0);
  CHECK(strcmp(rt_status_name(RT_ERROR_PARTIAL_STEP), "RT_ERROR_PARTIAL_STEP") == 0 && RT_ERROR_PARTIAL_STEP == 13);
  CHECK(strcmp(rt_status_name((rt_status)99), "unknown") == 0);
}

/* ABI 2.7: what the setters set reads back. */
static void test_model_settings_read_back(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  int64_t blocks = -1;
  float probability = -1.0f;
  int training = -1;
  OK(rt_model_checkpoint_segment_blocks(model, &blocks));
  OK(rt_model_dropout(model, &probability));
  OK(rt_model_training(model, &training));
  CHECK(blocks == 2 && probability == 0.0f && training == 1); /* 3 layers: round(sqrt(3)) = 2 in use */
  OK(rt_model_set_checkpoint_segment_blocks(model, 1));
  OK(rt_model_set_dropout(model, 0.25f, 7));
  OK(rt_model_set_training(model, 0));
  OK(rt_model_checkpoint_segment_blocks(model, &blocks));
  OK(rt_model_dropout(model, &probability));
  OK(rt_model_training(model, &training));
  CHECK(blocks == 1 && probability == 0.25f && training == 0);
  OK(rt_model_set_checkpoint_segment_blocks(model, 100));
  OK(rt_model_checkpoint_segment_blocks(model, &blocks));
  CHECK(blocks == 3); /* at most the layers */
  FAILS(rt_model_dropout(model, NULL), RT_ERROR_INVALID_ARGUMENT, "probability");
  FAILS(rt_model_training(NULL, &training), RT_ERROR_INVALID_ARGUMENT, "model");
  FAILS(rt_model_checkpoint_segment_blocks(model, NULL), RT_ERROR_INVALID_ARGUMENT, "blocks");
  rt_model_destroy(model);
}

static void test_policy_and_parity(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_activation_checkpointing kind = RT_ACTIVATION_CHECKPOINTING_DISABLED;
  OK(rt_model_activation_checkpointing(model, &kind));
  CHECK(kind == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
  OK(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_DISABLED));
  OK(rt_model_activation_checkpointing(model, &kind));
  CHECK(kind == RT_ACTIVATION_CHECKPOINTING_DISABLED);
  OK(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS));
  OK(rt_model_set_checkpoint_segment_blocks(model, 2));
  rt_attention attention = RT_ATTENTION_MATERIALIZED;
  OK(rt_model_attention(model, &attention));
  CHECK(attention == RT_ATTENTION_FLASH);
  OK(rt_model_set_attention(model, RT_ATTENTION_MATERIALIZED));
  OK(rt_model_attention(model, &attention));
  CHECK(attention == RT_ATTENTION_MATERIALIZED);
  /* Bad enums: refused by name, the model unchanged and usable. */
  FAILS(rt_model_set_activation_checkpointing(model, (rt_activation_checkpointing)7), RT_ERROR_INVALID_ARGUMENT,
        "activation checkpointing 7");
  FAILS(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_PLANNED), RT_ERROR_INVALID_ARGUMENT,
        "RT_ACTIVATION_CHECKPOINTING_PLANNED");
  FAILS(rt_model_set_attention(model, (rt_attention)-1), RT_ERROR_INVALID_ARGUMENT, "attention -1");
  OK(rt_model_activation_checkpointing(model, &kind));
  CHECK(kind == RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS);
  rt_transformer_config back;
  back.struct_size = sizeof back;
  OK(rt_model_config(model, &back));
  CHECK(back.layers == 3 && back.model_width == 16 && back.norm_epsilon == c.norm_epsilon);
  OK(rt_model_set_dropout(model, 0.0f, 3));
  OK(rt_model_set_training(model, 1));
  FAILS(rt_model_set_dropout(model, 1.5f, 3), RT_ERROR_VALUE, "set_dropout");
  rt_model_destroy(model);

  /* Loss and every gradient bit-identical between the five policies, and
   * for each between rt_variable_backward and rt_variable_backward_ex that
   * keeps (1) or frees (0) the graph. */
  for (int a = 0; a < 2; ++a) {
    rt_attention att = a == 0 ? RT_ATTENTION_MATERIALIZED : RT_ATTENTION_FLASH;
    const rt_activation_checkpointing policies[5] = {
        RT_ACTIVATION_CHECKPOINTING_DISABLED, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK,
        RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS, RT_ACTIVATION_CHECKPOINTING_ATTENTION,
        RT_ACTIVATION_CHECKPOINTING_MLP};
    float loss[5][3];
    size_t n[5][3];
    float* grads[5][3];
    for (int k = 0; k < 5; ++k) {
      for (int r = 0; r < 3; ++r) grads[k][r] = loss_and_gradients(policies[k], att, r - 1, &loss[k][r], &n[k][r]);
    }
    for (int k = 0; k < 5; ++k) {
      for (int r = 0; r < 3; ++r) {
        if (k == 0 && r == 0) continue;
        CHECK(memcmp(&loss[0][0], &loss[k][r], sizeof(float)) == 0);
        CHECK(n[0][0] == n[k][r] && memcmp(grads[0][0], grads[k][r], n[0][0] * sizeof(float)) == 0);
      }
    }
    for (int k = 0; k < 5; ++k) {
      for (int r = 0; r < 3; ++r) free(grads[k][r]);
    }
  }
}

/* rt_variable_backward_ex (ABI 2.5): retain_graph 0 frees the graph (a
 * second pass or a leaf listing through it is RT_ERROR_BACKWARD, naming the
 * release); a retain_graph other than 0/1 or a seed that does not fit is
 * refused with the gradients and the graph untouched; a seed scales;
 * training with either gives the same weights. */
static void test_backward_release(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 9, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  OK(rt_variable_backward_ex(loss, NULL, 0, 1));
  size_t n = 0;
  float* kept = model_gradients(model, &n);

  const int bad_flags[3] = {2, -1, 256};
  for (int i = 0; i < 3; ++i) {
    FAILS(rt_variable_backward_ex(loss, NULL, 0, bad_flags[i]), RT_ERROR_INVALID_ARGUMENT, "retain_graph is");
  }
  FAILS(rt_variable_backward_ex(loss, NULL, 0, 2), RT_ERROR_INVALID_ARGUMENT, "not 0 (free the graph");
  const float seed2[2] = {1.0f, 1.0f};
  FAILS(rt_variable_backward_ex(loss, seed2, 2, 1), RT_ERROR_INVALID_ARGUMENT, "count is 2");
  FAILS(rt_variable_backward_ex(loss, NULL, 1, 1), RT_ERROR_INVALID_ARGUMENT, "seed is NULL but seed_count is 1");
  FAILS(rt_variable_backward_ex(NULL, NULL, 0, 1), RT_ERROR_INVALID_ARGUMENT, "variable is NULL");
  size_t m = 0;
  float* after_refusals = model_gradients(model, &m);
  CHECK(m == n && memcmp(kept, after_refusals, n * sizeof(float)) == 0);
  free(after_refusals);

  /* The refusals left the graph whole: a seed of 2 doubles every gradient
   * exactly (a power of two), a seed of 1 is the default seed. */
  const float two = 2.0f;
  OK(rt_variable_backward_ex(loss, &two, 1, 1));
  float* doubled = model_gradients(model, &m);
  int exact = m == n;
  for (size_t i = 0; exact && i < n; ++i) exact = doubled[i] == 2.0f * kept[i];
  CHECK(exact);
  free(doubled);

  const float one = 1.0f;
  size_t leaves = 0;
  OK(rt_variable_leaf_count(loss, &leaves)); /* listed before the release */
  rt_variable* head = NULL;
  OK(rt_variable_leaf(loss, 0, &head));
  /* What the caller holds (the loss, a parameter) is never written by the
   * release pass (buffers it donates to gradients are the graph's own). */
  float loss_held = 0.0f;
  OK(rt_variable_item(loss, &loss_held));
  int64_t head_elements = 0;
  OK(rt_variable_numel(head, &head_elements));
  float* head_held = malloc(sizeof(float) * (size_t)head_elements);
  float* head_now = malloc(sizeof(float) * (size_t)head_elements);
  OK(rt_variable_value(head, head_held, (size_t)head_elements));
  OK(rt_variable_backward_ex(loss, &one, 1, 0));
  OK(rt_variable_value(head, head_now, (size_t)head_elements));
  CHECK(memcmp(head_held, head_now, sizeof(float) * (size_t)head_elements) == 0);
  free(head_held);
  free(head_now);
  float* released = model_gradients(model, &m);
  CHECK(m == n && memcmp(kept, released, n * sizeof(float)) == 0);
  free(released);
  int64_t head_numel = 0;
  OK(rt_variable_numel(head, &head_numel));
  float* head_grad = malloc(sizeof(float) * (size_t)head_numel);
  int has = 0;
  OK(rt_variable_grad(head, head_grad, (size_t)head_numel, &has));
  CHECK(has == 1);

  /* The graph is gone: every later pass through it fails up front, the
   * gradients stay those of the release pass. */
  FAILS(rt_variable_backward_ex(loss, NULL, 0, 0), RT_ERROR_BACKWARD, "was released by an earlier backward");
  FAILS(rt_variable_backward_ex(loss, NULL, 0, 1), RT_ERROR_BACKWARD, "was released by an earlier backward");
  FAILS(rt_variable_backward(loss), RT_ERROR_BACKWARD, "was released by an earlier backward");
  FAILS(rt_variable_leaf_count(loss, &leaves), RT_ERROR_BACKWARD, "was released by an earlier backward");
  float* after = model_gradients(model, &m);
  CHECK(m == n && memcmp(kept, after, n * sizeof(float)) == 0);
  free(after);
  float loss_value = 0.0f;
  OK(rt_variable_item(loss, &loss_value)); /* the handle's own value stays */
  CHECK(isfinite(loss_value) && loss_value == loss_held);
  free(head_grad);
  rt_variable_destroy(head);
  free(kept);

  rt_variable_destroy(loss);
  rt_model_destroy(model);

  /* Training through the ABI with the released graph (as the pipelines'
   * stage loop trains) gives the same weights, bit for bit, as with the kept
   * one: three Adam steps each, from the same seed. */
  char fingerprints[2][17];
  for (int keep = 0; keep < 2; ++keep) {
    rt_model* m = NULL;
    OK(rt_model_create(&c, 11, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS, &m));
    rt_adam_options options;
    OK(rt_adam_options_default(&options));
    rt_adam* adam = NULL;
    OK(rt_adam_create(m, &options, &adam));
    for (int step = 0; step < 3; ++step) {
      rt_variable* l = NULL;
      OK(rt_model_loss(m, g_tokens, g_targets, B, T, &l));
      OK(rt_variable_backward_ex(l, NULL, 0, keep));
      rt_variable_destroy(l);
      OK(rt_adam_step(adam, NULL));
      OK(rt_adam_zero_grad(adam));
    }
    OK(rt_model_fingerprint(m, fingerprints[keep], sizeof fingerprints[keep]));
    rt_adam_destroy(adam);
    rt_model_destroy(m);
  }
  CHECK(strcmp(fingerprints[0], fingerprints[1]) == 0);
}

static void test_graph_lifetime(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 5, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  rt_decode_session* session = NULL;
  OK(rt_decode_session_create(model, &session));
  OK(rt_model_destroy(model)); /* the loss and the session keep what they need */
  OK(rt_variable_backward(loss));
  size_t leaves = 0;
  OK(rt_variable_leaf_count(loss, &leaves));
  CHECK(leaves == 3 + 9 * 3); /* embedding, final norm, head + nine per block */
  for (size_t i = 0; i < leaves; ++i) {
    rt_variable* leaf = NULL;
    OK(rt_variable_leaf(loss, i, &leaf));
    int64_t numel = 0;
    OK(rt_variable_numel(leaf, &numel));
    float* g = malloc(sizeof(float) * (size_t)numel);
    int has = 0;
    OK(rt_variable_grad(leaf, g, (size_t)numel, &has));
    CHECK(has == 1);
    if (i == 0) {
      char name[128];
      size_t needed = 0;
      OK(rt_variable_name(leaf, name, sizeof name, &needed));
      CHECK(needed == strlen(name) + 1 && strlen(name) > 0);
    }
    free(g);
    rt_variable_destroy(leaf);
  }
  rt_variable* out_of_range = NULL;
  FAILS(rt_variable_leaf(loss, leaves, &out_of_range), RT_ERROR_INVALID_ARGUMENT, "out of range");
  float logits[256];
  OK(rt_decode_session_decode(session, 1, logits, 256));
  rt_decode_session_destroy(session);
  rt_variable_destroy(loss);
}

static void test_decode_ignores_the_policy(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 9, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  rt_decode_session* a = NULL;
  rt_decode_session* b = NULL;
  OK(rt_decode_session_create(model, &a));
  OK(rt_decode_session_create(model, &b));
  float la[256], lb[256];
  OK(rt_decode_session_decode(a, 3, la, 256));
  OK(rt_decode_session_decode(b, 3, lb, 256));
  OK(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK));
  OK(rt_decode_session_decode(b, 4, lb, 256));
  OK(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_DISABLED));
  OK(rt_decode_session_decode(a, 4, la, 256));
  CHECK(memcmp(la, lb, sizeof la) == 0);
  int64_t position = 0;
  OK(rt_decode_session_position(a, &position));
  CHECK(position == 2);
  FAILS(rt_decode_session_decode(a, 5, la, 255), RT_ERROR_INVALID_ARGUMENT, "vocabulary is 256");
  FAILS(rt_decode_session_decode(a, 300, la, 256), RT_ERROR_VALUE, "outside the vocabulary");
  OK(rt_decode_session_reset(a));
  OK(rt_decode_session_position(a, &position));
  CHECK(position == 0);
  /* A changed weight makes the cache stale; reset accepts it. */
  rt_variable* w = NULL;
  OK(rt_model_parameter(model, "lm_head.weight", &w));
  int64_t n = 0;
  OK(rt_variable_numel(w, &n));
  float* values = malloc(sizeof(float) * (size_t)n);
  OK(rt_variable_value(w, values, (size_t)n));
  values[0] += 1.0f;
  OK(rt_variable_set_value(w, values, (size_t)n));
  FAILS(rt_decode_session_decode(b, 1, lb, 256), RT_ERROR_STALE_GRAPH, "reset()");
  OK(rt_decode_session_reset(b));
  OK(rt_decode_session_decode(b, 1, lb, 256));
  free(values);
  rt_variable_destroy(w);
  rt_decode_session_destroy(a);
  rt_decode_session_destroy(b);
  rt_model_destroy(model);
}

static void test_errors_leave_handles_usable(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  /* NULL pointers and bad struct sizes. */
  FAILS(rt_model_create(NULL, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
        RT_ERROR_INVALID_ARGUMENT, "config is NULL");
  FAILS(rt_model_create(&c, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, NULL),
        RT_ERROR_INVALID_ARGUMENT, "out is NULL");
  rt_transformer_config small = c;
  small.struct_size = 8;
  FAILS(rt_model_create(&small, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
        RT_ERROR_INVALID_ARGUMENT, "struct_size");
  FAILS(rt_model_create(&c, 1, (rt_attention)9, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
        RT_ERROR_INVALID_ARGUMENT, "attention 9");
  rt_transformer_config odd = c;
  odd.heads = 3;
  FAILS(rt_model_create(&odd, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model), RT_ERROR_VALUE,
        "divisible by heads");
  CHECK(model == NULL);
  FAILS(rt_model_set_activation_checkpointing(NULL, RT_ACTIVATION_CHECKPOINTING_DISABLED), RT_ERROR_INVALID_ARGUMENT,
        "model is NULL");
  FAILS(rt_variable_backward(NULL), RT_ERROR_INVALID_ARGUMENT, "variable is NULL");
  FAILS(rt_adam_step(NULL, NULL), RT_ERROR_INVALID_ARGUMENT, "adam is NULL");
  FAILS(rt_decode_session_reset(NULL), RT_ERROR_INVALID_ARGUMENT, "session is NULL");
  CHECK(rt_model_destroy(NULL) == RT_OK && rt_variable_destroy(NULL) == RT_OK && rt_adam_destroy(NULL) == RT_OK &&
        rt_decode_session_destroy(NULL) == RT_OK);

  OK(rt_model_create(&c, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  /* Buffers of the wrong size. */
  char tiny_name[4];
  size_t needed = 0;
  FAILS(rt_model_parameter_name(model, 0, tiny_name, sizeof tiny_name, &needed), RT_ERROR_INVALID_ARGUMENT,
        "too small");
  CHECK(needed == strlen("token_embedding.weight") + 1);
  FAILS(rt_model_parameter_name(model, 999, tiny_name, sizeof tiny_name, NULL), RT_ERROR_INVALID_ARGUMENT,
        "out of range");
  /* NULL with size 0 is a size query (2.6.1): RT_OK, the last error stays;
   * NULL with a size, or without `needed`, is still an error. */
  needed = 0;
  OK(rt_model_parameter_name(model, 0, NULL, 0, &needed));
  CHECK(needed == strlen("token_embedding.weight") + 1);
  CHECK(strstr(rt_last_error_message(), "out of range") != NULL);
  FAILS(rt_model_parameter_name(model, 0, NULL, 8, &needed), RT_ERROR_INVALID_ARGUMENT, "buffer is NULL");
  FAILS(rt_model_parameter_name(model, 0, NULL, 0, NULL), RT_ERROR_INVALID_ARGUMENT, "buffer is NULL");
  FAILS(rt_model_parameter_name(model, 999, NULL, 0, &needed), RT_ERROR_INVALID_ARGUMENT, "out of range");
  rt_variable* loss = NULL;
  FAILS(rt_model_loss(model, g_tokens, NULL, B, T, &loss), RT_ERROR_INVALID_ARGUMENT, "targets is NULL");
  FAILS(rt_model_loss(model, g_tokens, g_targets, 0, T, &loss), RT_ERROR_INVALID_ARGUMENT, "must be > 0");
  FAILS(rt_model_loss(model, g_tokens, g_targets, 1, 17, &loss), RT_ERROR_SHAPE, "context length");
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  float value[4];
  FAILS(rt_variable_value(loss, value, 4), RT_ERROR_INVALID_ARGUMENT, "has 1 elements");
  int64_t dims[1];
  size_t ndim = 9;
  OK(rt_variable_ndim(loss, &ndim));
  CHECK(ndim == 0);
  OK(rt_variable_shape(loss, dims, 0));
  FAILS(rt_variable_set_value(loss, value, 1), RT_ERROR_VALUE, "not a leaf");
  rt_variable* logits = NULL;
  OK(rt_model_forward(model, g_tokens, B, T, &logits));
  OK(rt_variable_ndim(logits, &ndim));
  CHECK(ndim == 3);
  FAILS(rt_variable_shape(logits, dims, 1), RT_ERROR_INVALID_ARGUMENT, "max_dims is 1");
  int64_t shape3[3];
  OK(rt_variable_shape(logits, shape3, 3));
  CHECK(shape3[0] == B && shape3[1] == T && shape3[2] == 256);
  int64_t nodes = 0, elements = 0;
  OK(rt_variable_graph_statistics(logits, &nodes, &elements));
  CHECK(nodes > 0 && elements > 0);
  rt_variable_destroy(logits);

  /* A stale graph: a weight changed after the forward. */
  rt_variable* w = NULL;
  OK(rt_model_parameter(model, "blocks.1.mlp.up.weight", &w));
  int64_t n = 0;
  OK(rt_variable_numel(w, &n));
  float* values = malloc(sizeof(float) * (size_t)n);
  OK(rt_variable_value(w, values, (size_t)n));
  OK(rt_variable_set_value(w, values, (size_t)n));
  FAILS(rt_variable_backward(loss), RT_ERROR_STALE_GRAPH, "stale graph");
  int has = 1;
  OK(rt_variable_grad(w, values, (size_t)n, &has));
  CHECK(has == 0); /* nothing was committed */
  rt_variable* fresh = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &fresh));
  OK(rt_variable_backward(fresh));
  OK(rt_variable_grad(w, values, (size_t)n, &has));
  CHECK(has == 1);
  rt_variable* missing = NULL;
  FAILS(rt_model_parameter(model, "no.such.weight", &missing), RT_ERROR_VALUE, "no.such.weight");
  free(values);
  rt_variable_destroy(w);
  rt_variable_destroy(fresh);
  rt_variable_destroy(loss);

  /* Corrupt and missing files. */
  FILE* f = fopen(path_in("corrupt.safetensors"), "wb");
  fputs("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": [[[[[[[[", f);
  fclose(f);
  rt_model* loaded = NULL;
  FAILS(rt_model_load_new(path_in("corrupt.safetensors"), RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                          0, &loaded),
        RT_ERROR_MODEL_STATE, "corrupt.safetensors");
  FAILS(rt_model_load(model, path_in("missing.safetensors"), 0), RT_ERROR_MODEL_STATE, "cannot open");
  FAILS(rt_model_load(model, path_in("corrupt.safetensors"), 0x80), RT_ERROR_INVALID_ARGUMENT, "RT_LOAD_");
  FAILS(rt_model_load(model, NULL, 0), RT_ERROR_INVALID_ARGUMENT, "path is NULL");
  rt_activation_checkpointing kind;
  OK(rt_model_activation_checkpointing(model, &kind));
  CHECK(kind == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
  rt_model_destroy(model);
}

static void test_training_lora_and_files(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 11, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_adam_options options;
  OK(rt_adam_options_default(&options));
  options.learning_rate = 1e-2f;
  rt_adam* adam = NULL;
  OK(rt_adam_create(model, &options, &adam));
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 5; ++step) {
    rt_variable* loss = NULL;
    OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
    OK(rt_variable_item(loss, step == 0 ? &first : &last));
    OK(rt_variable_backward(loss));
    float norm = 0.0f;
    OK(rt_adam_step(adam, &norm));
    CHECK(norm > 0.0f);
    OK(rt_adam_zero_grad(adam));
    rt_variable_destroy(loss);
  }
  CHECK(last < first);
  OK(rt_adam_set_learning_rate(adam, 5e-3f));
  FAILS(rt_adam_set_learning_rate(adam, -1.0f), RT_ERROR_VALUE, "learning_rate");
  rt_adam_destroy(adam);

  OK(rt_model_save(model, path_in("model.safetensors")));
  rt_model* copy = NULL;
  OK(rt_model_load_new(path_in("model.safetensors"), RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                       0, &copy));
  char fa[17], fb[17];
  OK(rt_model_fingerprint(model, fa, sizeof fa));
  OK(rt_model_fingerprint(copy, fb, sizeof fb));
  CHECK(strlen(fa) == 16 && strcmp(fa, fb) == 0);
  FAILS(rt_model_fingerprint(model, fa, 16), RT_ERROR_INVALID_ARGUMENT, "too small");
  OK(rt_model_load(copy, path_in("model.safetensors"), RT_LOAD_ALLOW_NON_FINITE));
  /* Since 2.8.1: the adapters' flag is refused by the model-state loaders, as by rt_convert_*. */
  FAILS(rt_model_load(copy, path_in("model.safetensors"), RT_LOAD_ALLOW_BASE_MISMATCH), RT_ERROR_INVALID_ARGUMENT,
        "RT_LOAD_ALLOW_NON_FINITE (the only flag it takes)");
  {
    rt_model* none = NULL;
    FAILS(rt_model_load_new(path_in("model.safetensors"), RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                            RT_LOAD_ALLOW_BASE_MISMATCH, &none),
          RT_ERROR_INVALID_ARGUMENT, "RT_LOAD_ALLOW_NON_FINITE");
    CHECK(none == NULL);
  }

  /* LoRA: add, train the adapters only, save, load into the copy, deactivate, merge. */
  rt_lora_config lora;
  OK(rt_lora_config_default(&lora));
  lora.rank = 2;
  lora.targets = RT_LORA_QUERY | RT_LORA_DOWN;
  int has_lora = 1;
  OK(rt_model_has_lora(model, &has_lora));
  CHECK(has_lora == 0);
  lora.targets = 0x100;
  FAILS(rt_model_add_lora(model, &lora, 3), RT_ERROR_INVALID_ARGUMENT, "LoRA targets 0x100");
  lora.targets = RT_LORA_QUERY | RT_LORA_DOWN;
  OK(rt_model_add_lora(model, &lora, 3));
  OK(rt_model_set_base_trainable(model, 0));
  OK(rt_adam_create(model, &options, &adam));
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  OK(rt_variable_backward(loss));
  OK(rt_adam_step(adam, NULL));
  rt_variable_destroy(loss);
  rt_adam_destroy(adam);
  OK(rt_model_save_adapter(model, path_in("adapter.safetensors")));
  OK(rt_model_load_adapter(copy, path_in("adapter.safetensors"), 0));
  OK(rt_model_has_lora(copy, &has_lora));
  CHECK(has_lora == 1);
  rt_variable *la = NULL, *lb = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &la));
  OK(rt_model_loss(copy, g_tokens, g_targets, B, T, &lb));
  float va = 0.0f, vb = 0.0f;
  OK(rt_variable_item(la, &va));
  OK(rt_variable_item(lb, &vb));
  CHECK(fabsf(va - vb) < 1e-5f);
  rt_variable_destroy(la);
  rt_variable_destroy(lb);
  OK(rt_model_set_lora_active(copy, 0));
  FAILS(rt_model_merge_lora(copy), RT_ERROR_VALUE, "inactive");
  OK(rt_model_set_lora_active(copy, 1));
  OK(rt_model_merge_lora(copy));
  OK(rt_model_has_lora(copy, &has_lora));
  CHECK(has_lora == 0);
  OK(rt_model_loss(copy, g_tokens, g_targets, B, T, &lb));
  OK(rt_variable_item(lb, &vb));
  CHECK(fabsf(va - vb) < 1e-4f);
  rt_variable_destroy(lb);
  /* The adapter knows its base: refused on another, accepted with the flag. */
  rt_model* other = NULL;
  OK(rt_model_create(&c, 12, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &other));
  FAILS(rt_model_load_adapter(other, path_in("adapter.safetensors"), 0), RT_ERROR_MODEL_STATE, "fingerprint");
  OK(rt_model_load_adapter(other, path_in("adapter.safetensors"), RT_LOAD_ALLOW_BASE_MISMATCH));
  OK(rt_model_remove_lora(other));
  rt_model_destroy(other);

  /* generate */
  rt_generation_options g;
  OK(rt_generation_options_default(&g));
  g.max_new_tokens = 5;
  g.seed = 4;
  int32_t prompt[2] = {72, 105};
  int32_t out[5];
  size_t count = 0;
  int reached = 7;
  OK(rt_generate(model, prompt, 2, &g, out, 5, &count, &reached));
  CHECK(count == 5 && reached == 0);
  int32_t again[5];
  OK(rt_generate(model, prompt, 2, &g, again, 5, &count, NULL));
  CHECK(memcmp(out, again, sizeof out) == 0);
  FAILS(rt_generate(model, prompt, 2, &g, out, 4, &count, NULL), RT_ERROR_INVALID_ARGUMENT, "capacity 4");
  g.max_new_tokens = -1;
  FAILS(rt_generate(model, prompt, 2, &g, out, 4, &count, NULL), RT_ERROR_VALUE, "max_new_tokens must be >= 0");
  g.max_new_tokens = 0;
  OK(rt_generate(model, prompt, 2, &g, NULL, 0, &count, NULL));
  CHECK(count == 0);
  /* A wrapped length (n - 1 with n = 0) is refused before the buffer is read
   * (it read past the 2-token prompt). */
  FAILS(rt_generate(model, prompt, SIZE_MAX, &g, NULL, 0, &count, NULL), RT_ERROR_VALUE, "more than the context length");
  rt_generation* many = NULL;
  FAILS(rt_generate_samples(model, prompt, (size_t)1 << 63, &g, &many), RT_ERROR_VALUE, "more than the context length");
  CHECK(many == NULL);
  FAILS(rt_generate_samples(model, prompt, SIZE_MAX, &g, &many), RT_ERROR_VALUE, "more than the context length");
  FAILS(rt_generate_samples(model, prompt, 65, &g, &many), RT_ERROR_VALUE, "65 tokens");
  CHECK(many == NULL);
  rt_model_destroy(copy);
  rt_model_destroy(model);

  /* memory */
  rt_memory_stats m;
  m.struct_size = sizeof m;
  OK(rt_reset_peak_memory());
  OK(rt_memory_stats_get(RT_BACKEND_CPU, &m));
  CHECK(m.peak_bytes == m.live_bytes && m.allocation_count >= m.free_count);
  FAILS(rt_memory_stats_get((rt_backend)5, &m), RT_ERROR_INVALID_ARGUMENT, "rt_backend");
  {
    /* A struct_size that ends inside a field (9 wrote one byte of live_bytes
     * before 2.8.1): refused, nothing written. */
    rt_memory_stats partial;
    memset(&partial, 0x5A, sizeof partial);
    partial.struct_size = 9;
    FAILS(rt_memory_stats_get(RT_BACKEND_CPU, &partial), RT_ERROR_INVALID_ARGUMENT, "first version");
    CHECK(partial.struct_size == 9 && partial.live_bytes == (int64_t)0x5A5A5A5A5A5A5A5ALL);
  }
}

static int stop_after_two(const rt_step_report* report, void* user_data) {
  int* calls = (int*)user_data;
  ++*calls;
  return report->step >= 2;
}

static void test_pipelines(void) {
  FILE* f = fopen(path_in("corpus.txt"), "w");
  for (int i = 0; i < 300; ++i) fprintf(f, "the quick brown fox %d jumps over the lazy dog.\n", i % 7);
  fclose(f);
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  char corpus[512];
  tiny_c_pretraining(&c, corpus, 4);
  c.stage.output_dir = path_in("pretrain");
  c.stage.checkpoint_interval = 1;
  c.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK;
  rt_run_result r;
  r.struct_size = sizeof r;
  int calls = 0;
  OK(rt_run_pretraining(&c, stop_after_two, &calls, &r));
  CHECK(r.completed == 0 && r.steps == 2 && calls == 2);
  c.stage.resume = 1;
  OK(rt_run_pretraining(&c, NULL, NULL, &r));
  CHECK(r.completed == 1 && r.steps == 4 && r.resumed_from_step == 2);
  CHECK(strstr(r.weights, "model.safetensors") != NULL && access(r.weights, R_OK) == 0);
  {
    rt_pretraining_config fresh_dir = c;
    fresh_dir.stage.output_dir = path_in("never");
    fresh_dir.stage.resume = 0;
    rt_run_result small;
    small.struct_size = 0;
    FAILS(rt_run_pretraining(&fresh_dir, NULL, NULL, &small), RT_ERROR_INVALID_ARGUMENT, "result->struct_size");
    CHECK(access(path_in("never"), F_OK) != 0); /* refused before anything was trained or written */
  }
  c.stage.activation_checkpointing = (rt_activation_checkpointing)6;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_INVALID_ARGUMENT, "activation checkpointing 6");
  c.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_PLANNED; /* reported, never set */
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_INVALID_ARGUMENT, "activation memory budget");
  c.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_DISABLED;
  c.stage.learning_rate = -1.0f;
  c.stage.resume = 0;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_VALUE, "learning_rate");

  rt_post_training_config p;
  OK(rt_post_training_config_default(&p));
  char base[RT_PATH_CAPACITY];
  snprintf(base, sizeof base, "%s", r.weights);
  p.base_model = base;
  p.stage.data = RIFTCO_SOURCE_DIR "/data/chat_example.jsonl";
  p.stage.output_dir = path_in("post");
  p.stage.steps = 2;
  p.stage.batch = 2;
  p.stage.sequence_length = 32;
  p.stage.eval_batches = 1;
  p.lora.rank = 2;
  p.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK;
  OK(rt_run_post_training(&p, NULL, NULL, &r));
  CHECK(r.completed == 1 && strstr(r.weights, "adapter.safetensors") != NULL);
  p.fine_tuning_method = (rt_fine_tuning_method)4;
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_INVALID_ARGUMENT, "rt_fine_tuning_method");
  p.fine_tuning_method = RT_FINE_TUNING_LORA;
  p.stage.data = path_in("missing.jsonl");
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_DATA, "missing.jsonl");
}

/* Subword tokenizer, a pretraining run with it (a 2.0-sized config struct
 * still accepted), evaluation in bits per byte, wrong-tokenizer refusal. */
static void test_tokenizer_and_evaluate(void) {
  FILE* f = fopen(path_in("words.txt"), "w");
  for (int i = 0; i < 400; ++i) fprintf(f, "the quick brown fox %d jumps over the lazy dog; caf\xc3\xa9 %d.\n", i % 7, i % 5);
  fclose(f);
  OK(rt_train_tokenizer(path_in("words.txt"), 300, "bpe", path_in("tok.model")));
  OK(rt_train_tokenizer(path_in("words.txt"), 310, "bpe", path_in("other.model")));
  FAILS(rt_train_tokenizer(path_in("words.txt"), 300, "wordpiece", path_in("x.model")), RT_ERROR_VALUE, "wordpiece");
  FAILS(rt_train_tokenizer(path_in("words.txt"), 10, "bpe", path_in("x.model")), RT_ERROR_VALUE, "vocab_size");
  FAILS(rt_train_tokenizer(path_in("words.txt"), 300, NULL, path_in("x.model")), RT_ERROR_INVALID_ARGUMENT, "NULL");
  FAILS(rt_train_tokenizer(path_in("nothing.txt"), 300, "bpe", path_in("x.model")), RT_ERROR_DATA, "nothing.txt");

  /* A caller compiled before the tokenizer field passes the smaller struct:
   * init leaves the bytes past it alone, and its runs stay byte-level. */
  const size_t old_size = offsetof(rt_pretraining_config, tokenizer);
  {
    rt_pretraining_config old;
    memset(&old, 0x7F, sizeof old);
    OK(rt_pretraining_config_init(&old, old_size));
    CHECK(old.struct_size == old_size);
    unsigned char untouched[sizeof(const char*)];
    memset(untouched, 0x7F, sizeof untouched);
    CHECK(memcmp(&old.tokenizer, untouched, sizeof untouched) == 0);
  }

  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.tokenizer == NULL && c.model.vocab_size == 256);
  c.model.context_length = 32;
  c.model.model_width = 16;
  c.model.heads = 2;
  c.model.layers = 1;
  c.model.feed_forward_width = 32;
  c.stage.data = path_in("words.txt");
  c.stage.output_dir = path_in("subword");
  c.stage.steps = 2;
  c.stage.batch = 2;
  c.stage.sequence_length = 16;
  c.stage.eval_batches = 1;
  c.tokenizer = path_in("tok.model");
  rt_run_result r;
  r.struct_size = sizeof r;
  OK(rt_run_pretraining(&c, NULL, NULL, &r));
  rt_model* model = NULL;
  OK(rt_model_load_new(r.weights, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, 0, &model));
  rt_transformer_config mc;
  mc.struct_size = sizeof mc;
  OK(rt_model_config(model, &mc));
  CHECK(mc.vocab_size == 300); /* taken from the tokenizer */
  {
    rt_pretraining_config old = c;
    old.struct_size = old_size;
    old.tokenizer = (const char*)1; /* past its struct_size: never read */
    old.stage.output_dir = path_in("old_caller");
    rt_run_result r_old;
    r_old.struct_size = sizeof r_old;
    OK(rt_run_pretraining(&old, NULL, NULL, &r_old));
    rt_model* bytes_model = NULL;
    OK(rt_model_load_new(r_old.weights, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, 0, &bytes_model));
    rt_transformer_config bc;
    bc.struct_size = sizeof bc;
    OK(rt_model_config(bytes_model, &bc));
    CHECK(bc.vocab_size == 256);
    OK(rt_model_destroy(bytes_model));
  }

  const char* text = "the quick brown fox 3 jumps over the lazy dog; caf\xc3\xa9 2.\n";
  rt_evaluation_result e;
  e.struct_size = sizeof e;
  OK(rt_evaluate(model, text, strlen(text), path_in("tok.model"), 2, 0, &e));
  CHECK(e.tokens > 0 && e.tokens < e.bytes && e.bytes <= (int64_t)strlen(text));
  CHECK(fabs(e.bits_per_byte - e.loss * (double)e.tokens / ((double)e.bytes * log(2.0))) < 1e-9);
  CHECK(fabs(e.perplexity - exp(e.loss)) < 1e-9 * e.perplexity);
  FAILS(rt_evaluate(model, text, strlen(text), NULL, 2, 0, &e), RT_ERROR_VALUE, "vocabulary");
  FAILS(rt_evaluate(model, text, strlen(text), path_in("other.model"), 2, 0, &e), RT_ERROR_VALUE, "vocabulary");
  FAILS(rt_evaluate(model, text, strlen(text), path_in("tok.model"), 0, 0, &e), RT_ERROR_VALUE, "batch");
  FAILS(rt_evaluate(model, NULL, 5, path_in("tok.model"), 2, 0, &e), RT_ERROR_INVALID_ARGUMENT, "text");
  e.struct_size = 8;
  FAILS(rt_evaluate(model, text, strlen(text), path_in("tok.model"), 2, 0, &e), RT_ERROR_INVALID_ARGUMENT,
        "struct_size");
  f = fopen(path_in("corrupt.model"), "w");
  fputs("\x0a\x05not a model at all", f);
  fclose(f);
  e.struct_size = sizeof e;
  FAILS(rt_evaluate(model, text, strlen(text), path_in("corrupt.model"), 2, 0, &e), RT_ERROR_DATA, "corrupt.model");
  OK(rt_model_destroy(model));

  /* Byte level: bits per byte is loss / ln 2. */
  rt_transformer_config bc = tiny_config();
  OK(rt_model_create(&bc, 5, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  OK(rt_evaluate(model, text, strlen(text), "", 4, 8, &e));
  CHECK(e.tokens == (int64_t)strlen(text) - 1 && e.bytes == e.tokens);
  CHECK(e.bits_per_byte == e.loss / log(2.0));
  OK(rt_model_destroy(model));

  /* Post-training the subword model without its tokenizer, or with another, is refused. */
  rt_post_training_config p;
  OK(rt_post_training_config_default(&p));
  char base[RT_PATH_CAPACITY];
  snprintf(base, sizeof base, "%s", r.weights);
  p.base_model = base;
  p.stage.data = RIFTCO_SOURCE_DIR "/data/chat_example.jsonl";
  p.stage.output_dir = path_in("subword_post");
  p.stage.steps = 1;
  p.stage.batch = 1;
  p.stage.sequence_length = 32;
  p.stage.eval_batches = 1;
  p.lora.rank = 2;
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_VALUE, "was trained with tokenizer");
  p.tokenizer = path_in("other.model");
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_VALUE, "checksum");
  p.tokenizer = path_in("tok.model");
  OK(rt_run_post_training(&p, NULL, NULL, &r));
  CHECK(r.completed == 1);
}

/* Grouped-query attention, RoPE base and tied embeddings through
 * rt_transformer_config; a 2.0-sized config and a 2.0-layout pretraining
 * config; Hugging Face conversion both ways. */
static void test_gqa_tied_and_hf_conversion(void) {
  rt_transformer_config c = tiny_config();
  CHECK(c.key_value_heads == 0 && c.rope_base == 10000.0f && c.tie_embeddings == 0);
  c.model_width = 32;
  c.heads = 4;
  c.key_value_heads = 2;
  c.rope_base = 500000.0f;
  c.tie_embeddings = 1;
  rt_model* model = NULL;
  OK(rt_model_create(&c, 3, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  rt_transformer_config back;
  back.struct_size = sizeof back;
  OK(rt_model_config(model, &back));
  CHECK(back.key_value_heads == 2 && back.rope_base == 500000.0f && back.tie_embeddings == 1);
  rt_variable* key = NULL;
  OK(rt_model_parameter(model, "blocks.0.attention.key.weight", &key));
  int64_t elements = 0;
  OK(rt_model_parameter_elements(model, &elements));
  CHECK(elements == 256 * 32 + 32 + 3 * (2 * 32 + 2 * 32 * 32 + 2 * 16 * 32 + 3 * 32 * 24));
  rt_variable_destroy(key);
  FAILS(rt_model_parameter(model, "lm_head.weight", &key), RT_ERROR_VALUE, "lm_head");

  /* A caller compiled before the appended fields: they take their defaults. */
  rt_transformer_config old = c;
  old.struct_size = offsetof(rt_transformer_config, key_value_heads);
  old.model_width = 16;
  old.heads = 2;
  rt_model* plain = NULL;
  OK(rt_model_create(&old, 3, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED, &plain));
  back.struct_size = offsetof(rt_transformer_config, key_value_heads);
  back.key_value_heads = 77;
  OK(rt_model_config(plain, &back));
  CHECK(back.key_value_heads == 77); /* not written past the caller's struct_size */
  back.struct_size = sizeof back;
  OK(rt_model_config(plain, &back));
  CHECK(back.key_value_heads == 0 && back.rope_base == 10000.0f && back.tie_embeddings == 0);
  rt_model_destroy(plain);
  c.key_value_heads = 3;
  FAILS(rt_model_create(&c, 3, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED, &plain),
        RT_ERROR_VALUE, "key_value_heads");

  /* A 2.0-layout rt_pretraining_config: init fills the 2.0 layout. */
  struct {
    size_t struct_size;
    rt_stage_settings stage;
    struct {
      size_t struct_size;
      int64_t sizes[6];
      float norm_epsilon;
    } model;
    double validation_fraction;
  } p20;
  memset(&p20, 0x7F, sizeof p20);
  OK(rt_pretraining_config_init((rt_pretraining_config*)&p20, sizeof p20));
  CHECK(p20.struct_size == sizeof p20 && p20.model.struct_size == sizeof p20.model);
  CHECK(p20.model.sizes[0] == 256 && p20.validation_fraction > 0.0 && p20.validation_fraction < 1.0);
  /* ... and rt_run_pretraining reads it as such (a GQA-free 2.0 model). */
  p20.model.sizes[1] = 32; /* context_length, model_width, heads, layers, feed_forward_width */
  p20.model.sizes[2] = 16;
  p20.model.sizes[3] = 2;
  p20.model.sizes[4] = 1;
  p20.model.sizes[5] = 32;
  p20.stage.data = path_in("corpus.txt"); /* written by test_pipelines */
  p20.stage.output_dir = path_in("pretrain20");
  p20.stage.steps = 1;
  p20.stage.batch = 2;
  p20.stage.sequence_length = 16;
  p20.stage.eval_batches = 1;
  p20.stage.checkpoint_interval = 0;
  rt_run_result r20;
  r20.struct_size = sizeof r20;
  OK(rt_run_pretraining((const rt_pretraining_config*)&p20, NULL, NULL, &r20));
  CHECK(r20.completed == 1 && r20.steps == 1);
  rt_model* m20 = NULL;
  OK(rt_model_load_new(r20.weights, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED, 0, &m20));
  back.struct_size = sizeof back;
  OK(rt_model_config(m20, &back));
  CHECK(back.layers == 1 && back.model_width == 16 && back.key_value_heads == 0 && back.rope_base == 10000.0f);
  rt_model_destroy(m20);
  FAILS(rt_pretraining_config_init((rt_pretraining_config*)&p20, sizeof p20 - 8), RT_ERROR_INVALID_ARGUMENT,
        "smaller than ABI 2.0");

  /* Hugging Face conversion: to_hf then from_hf gives the same weights. */
  OK(rt_model_save(model, path_in("gqa.safetensors")));
  OK(rt_convert_to_hf(path_in("gqa.safetensors"), path_in("hf"), 0));
  OK(rt_convert_from_hf(path_in("hf"), path_in("gqa2.safetensors"), 0));
  rt_model* again = NULL;
  OK(rt_model_load_new(path_in("gqa2.safetensors"), RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, 0, &again));
  char a[17], b[17];
  OK(rt_model_fingerprint(model, a, sizeof a));
  OK(rt_model_fingerprint(again, b, sizeof b));
  CHECK(strcmp(a, b) == 0);
  FAILS(rt_convert_from_hf(path_in("no-such-dir"), path_in("x.safetensors"), 0), RT_ERROR_MODEL_STATE,
        "not a directory");
  FAILS(rt_convert_from_hf(NULL, path_in("x.safetensors"), 0), RT_ERROR_INVALID_ARGUMENT, "NULL");
  FAILS(rt_convert_to_hf(path_in("gqa.safetensors"), path_in("hf"), 0x80u), RT_ERROR_INVALID_ARGUMENT, "flags");
  /* The adapter-only flag means nothing to a conversion: refused, not ignored. */
  FAILS(rt_convert_to_hf(path_in("gqa.safetensors"), path_in("hf"), RT_LOAD_ALLOW_BASE_MISMATCH),
        RT_ERROR_INVALID_ARGUMENT, "RT_LOAD_ALLOW_NON_FINITE (the only flag it takes)");
  FAILS(rt_convert_from_hf(path_in("hf"), path_in("x.safetensors"), RT_LOAD_ALLOW_BASE_MISMATCH),
        RT_ERROR_INVALID_ARGUMENT, "RT_LOAD_ALLOW_NON_FINITE (the only flag it takes)");
  rt_model_destroy(again);
  rt_model_destroy(model);
}

/* Appended after ABI 2.0: parameter groups, gradient accumulation, sampling options. */
static void test_groups_accumulation_and_sampling(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 5, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  rt_adam_options options;
  OK(rt_adam_options_default(&options));
  options.weight_decay = 0.1f;
  rt_adam* adam = NULL;
  float wd = -1.0f;
  OK(rt_adam_create_grouped(model, &options, 1, &adam));
  OK(rt_adam_weight_decay(adam, "blocks.0.attention_norm.weight", &wd));
  CHECK(wd == 0.0f);
  OK(rt_adam_weight_decay(adam, "blocks.1.attention.query.weight", &wd));
  CHECK(wd == 0.1f);
  OK(rt_adam_weight_decay(adam, "token_embedding.weight", &wd));
  CHECK(wd == 0.1f);
  FAILS(rt_adam_weight_decay(adam, "no.such.weight", &wd), RT_ERROR_VALUE, "no parameter named 'no.such.weight'");
  FAILS(rt_adam_weight_decay(adam, NULL, &wd), RT_ERROR_INVALID_ARGUMENT, "parameter_name is NULL");
  rt_adam_destroy(adam);
  OK(rt_adam_create_grouped(model, &options, 0, &adam));
  OK(rt_adam_weight_decay(adam, "lm_head.weight", &wd));
  CHECK(wd == 0.0f);
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  OK(rt_variable_backward(loss));
  OK(rt_adam_step(adam, NULL));
  rt_variable_destroy(loss);
  rt_adam_destroy(adam);
  /* The plain Adam keeps decaying everything. */
  OK(rt_adam_create(model, &options, &adam));
  OK(rt_adam_weight_decay(adam, "final_norm.weight", &wd));
  CHECK(wd == 0.1f);
  rt_adam_destroy(adam);
  options.weight_decay = -1.0f;
  FAILS(rt_adam_create_grouped(model, &options, 1, &adam), RT_ERROR_VALUE, "weight_decay");

  /* Sampling options. */
  rt_generation_options g;
  OK(rt_generation_options_default(&g));
  CHECK(g.top_p == 1.0f && g.repetition_penalty == 1.0f && g.stop == NULL && g.stop_count == 0 && g.num_samples == 1);
  g.max_new_tokens = 6;
  g.seed = 3;
  int32_t prompt[2] = {72, 105};
  int32_t plain[6], old_layout[6];
  size_t count = 0;
  OK(rt_generate(model, prompt, 2, &g, plain, 6, &count, NULL));
  rt_generation_options old = g; /* an ABI 2.0 caller: the appended fields are not read */
  old.struct_size = offsetof(rt_generation_options, top_p);
  old.top_p = 0.0f; /* invalid, but beyond its struct_size */
  OK(rt_generate(model, prompt, 2, &old, old_layout, 6, &count, NULL));
  CHECK(memcmp(plain, old_layout, sizeof plain) == 0);
  rt_generation_options init_old;
  memset(&init_old, 0x55, sizeof init_old);
  OK(rt_generation_options_init(&init_old, offsetof(rt_generation_options, top_p)));
  CHECK(init_old.max_new_tokens == 64 && init_old.num_samples == 0x5555555555555555LL); /* untouched */

  char stop_text[2] = {(char)plain[2], 0};
  const char* stops[1] = {stop_text};
  g.stop = stops;
  g.stop_count = 1;
  g.num_samples = 3;
  g.top_p = 0.9f;
  g.repetition_penalty = 1.2f;
  rt_generation* samples = NULL;
  OK(rt_generate_samples(model, prompt, 2, &g, &samples));
  size_t n = 0;
  OK(rt_generation_sample_count(samples, &n));
  CHECK(n == 3);
  for (size_t i = 0; i < n; ++i) {
    const int32_t* tokens = NULL;
    const char* text = NULL;
    size_t token_count = 0, text_length = 0;
    int64_t stop_index = 7;
    OK(rt_generation_sample(samples, i, &tokens, &token_count, &text, &text_length, &stop_index, NULL));
    CHECK(token_count <= 6 && text_length <= token_count);
    CHECK(stop_index == -1 || (stop_index == 0 && memchr(text, stop_text[0], text_length) == NULL));
  }
  const int32_t* tokens = NULL;
  const char* text = NULL;
  size_t token_count = 0, text_length = 0;
  FAILS(rt_generation_sample(samples, 3, &tokens, &token_count, &text, &text_length, NULL, NULL),
        RT_ERROR_INVALID_ARGUMENT, "index 3 is out of range");
  rt_generation_destroy(samples);
  /* Greedy with a stop string at the third token: two tokens of text. */
  g.temperature = 0.0f;
  g.num_samples = 1;
  g.top_p = 1.0f;
  g.repetition_penalty = 1.0f;
  g.stop_count = 0;
  OK(rt_generate(model, prompt, 2, &g, plain, 6, &count, NULL));
  stop_text[0] = (char)plain[2];
  size_t first = 0;
  while (plain[first] != plain[2]) ++first;
  g.stop_count = 1;
  OK(rt_generate(model, prompt, 2, &g, plain, 6, &count, NULL));
  CHECK(count == first + 1);
  OK(rt_generate_samples(model, prompt, 2, &g, &samples));
  int64_t which = -1;
  OK(rt_generation_sample(samples, 0, &tokens, &token_count, &text, &text_length, &which, NULL));
  CHECK(token_count == count && text_length == first && which == 0);
  rt_generation_destroy(samples);
  g.num_samples = 2;
  FAILS(rt_generate(model, prompt, 2, &g, plain, 6, &count, NULL), RT_ERROR_VALUE, "generate_samples");
  g.num_samples = 1;
  g.top_p = 0.0f;
  FAILS(rt_generate_samples(model, prompt, 2, &g, &samples), RT_ERROR_VALUE, "top_p must be in (0, 1]");
  g.top_p = 1.0f;
  g.repetition_penalty = -2.0f;
  FAILS(rt_generate_samples(model, prompt, 2, &g, &samples), RT_ERROR_VALUE, "repetition_penalty");
  g.repetition_penalty = 1.0f;
  g.stop = NULL;
  FAILS(rt_generate_samples(model, prompt, 2, &g, &samples), RT_ERROR_INVALID_ARGUMENT, "stop is NULL");
  const char* empty[1] = {""};
  g.stop = empty;
  FAILS(rt_generate_samples(model, prompt, 2, &g, &samples), RT_ERROR_VALUE, "stop string 0 is empty");
  rt_model_destroy(model);

  /* Gradient accumulation in a pipeline: recorded in metadata.json. */
  rt_pretraining_config p;
  OK(rt_pretraining_config_default(&p));
  CHECK(p.gradient_accumulation_steps == 1 && p.decay_embeddings == 1);
  char corpus[512];
  tiny_c_pretraining(&p, corpus, 2);
  p.stage.output_dir = path_in("accumulate");
  p.gradient_accumulation_steps = 2;
  p.decay_embeddings = 0;
  rt_run_result r;
  r.struct_size = sizeof r;
  OK(rt_run_pretraining(&p, NULL, NULL, &r));
  CHECK(r.completed == 1);
  FILE* f = fopen(path_in("accumulate/metadata.json"), "r");
  char metadata[16384] = {0};
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fread(metadata, 1, sizeof metadata - 1, f) > 0);
    fclose(f);
  }
  CHECK(strstr(metadata, "\"gradient_accumulation_steps\": 2") != NULL);
  CHECK(strstr(metadata, "\"decay_embeddings\": false") != NULL);
  CHECK(strstr(metadata, "\"token_embedding.weight\"") != NULL); /* listed in no_decay */
  p.gradient_accumulation_steps = 0;
  FAILS(rt_run_pretraining(&p, NULL, NULL, &r), RT_ERROR_VALUE, "gradient_accumulation_steps");
}

#define ALIGN8(x) (((x) + 7u) & ~(size_t)7u)

/* `size` bytes at the very end of a readable page, the next page inaccessible:
 * a library that reads past a caller's struct_size crashes here. */
static void* at_page_end(size_t size) {
  const long page = sysconf(_SC_PAGESIZE);
  const int zero = open("/dev/zero", O_RDWR);
  if (zero < 0) return NULL;
  char* base = mmap(NULL, (size_t)(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE, zero, 0);
  close(zero);
  if (base == MAP_FAILED || mprotect(base + page, (size_t)page, PROT_NONE) != 0) return NULL;
  return base + page - size;
}

/* Every struct_size from ABI 2.0's to this header's (the in-between sizes of
 * callers compiled against earlier 2.x headers): each consumer reads only the
 * caller's bytes (was: rt_run_pretraining copied the whole current struct and
 * crashed on a struct ending before `tokenizer`). */
static void test_struct_sizes_read_no_further(void) {
  rt_run_result r;
  size_t size;
  /* ABI 2.0's size: its `model` ended before key_value_heads. */
  const size_t pretraining20 =
      offsetof(rt_pretraining_config, model) + offsetof(rt_transformer_config, key_value_heads) + sizeof(double);
  /* Sizes step by 8: a caller's struct_size is its sizeof, a multiple of the
   * struct's 8-byte alignment (and the struct must stay aligned for UBSan). */
  for (size = ALIGN8(pretraining20); size <= sizeof(rt_pretraining_config); size += 8) {
    rt_pretraining_config* c = at_page_end(size);
    CHECK(c != NULL);
    if (c == NULL) return;
    OK(rt_pretraining_config_init(c, size));
    c->stage.steps = 0; /* refused before any training */
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    FAILS(rt_run_pretraining(c, NULL, NULL, &r), RT_ERROR_VALUE, "steps must be > 0");
  }
  for (size = ALIGN8(offsetof(rt_post_training_config, gradient_accumulation_steps));
       size <= sizeof(rt_post_training_config); size += 8) {
    rt_post_training_config* c = at_page_end(size);
    CHECK(c != NULL);
    if (c == NULL) return;
    OK(rt_post_training_config_init(c, size));
    c->stage.steps = 0;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    CHECK(rt_run_post_training(c, NULL, NULL, &r) == RT_ERROR_VALUE);
  }
  {
    rt_transformer_config tiny = tiny_config();
    rt_model* model = NULL;
    int32_t prompt[2] = {1, 2};
    int32_t tokens[4];
    size_t count = 0;
    tiny.layers = 1;
    for (size = ALIGN8(offsetof(rt_transformer_config, key_value_heads)); size <= sizeof(rt_transformer_config);
         size += 8) {
      rt_transformer_config* c = at_page_end(size);
      CHECK(c != NULL);
      if (c == NULL) return;
      memcpy(c, &tiny, size);
      c->struct_size = size;
      rt_model_destroy(model);
      model = NULL;
      OK(rt_model_create(c, 1, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    }
    for (size = ALIGN8(offsetof(rt_generation_options, top_p)); size <= sizeof(rt_generation_options); size += 8) {
      rt_generation_options* g = at_page_end(size);
      rt_generation* samples = NULL;
      CHECK(g != NULL);
      if (g == NULL) break;
      OK(rt_generation_options_init(g, size));
      g->max_new_tokens = 4;
      OK(rt_generate(model, prompt, 2, g, tokens, 4, &count, NULL));
      OK(rt_generate_samples(model, prompt, 2, g, &samples));
      rt_generation_destroy(samples);
    }
    rt_model_destroy(model);
  }
}

/* A budget: every step's activation peak (the progress report's appended
 * field) stays under it, and a budget no plan fits is refused, naming the
 * smallest, before anything is written. */
static int max_activation_peak(const rt_step_report* report, void* user_data) {
  int64_t* peak = (int64_t*)user_data;
  CHECK(report->struct_size >= sizeof(rt_step_report));
  if (report->activation_peak_bytes > *peak) *peak = report->activation_peak_bytes;
  return 0;
}

static void test_activation_memory_budget(void) {
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.activation_memory_budget == 0);
  c.model.context_length = 32;
  c.model.model_width = 32;
  c.model.heads = 2;
  c.model.layers = 4;
  c.model.feed_forward_width = 64;
  c.stage.data = path_in("corpus.txt");
  c.stage.output_dir = path_in("budget_free");
  c.stage.steps = 2;
  c.stage.batch = 2;
  c.stage.sequence_length = 32;
  c.stage.eval_batches = 1;
  c.stage.checkpoint_interval = 0;
  rt_run_result r;
  r.struct_size = sizeof r;
  int64_t free_peak = 0;
  OK(rt_run_pretraining(&c, max_activation_peak, &free_peak, &r));
  CHECK(free_peak > 0);
  c.stage.output_dir = path_in("budget");
  c.activation_memory_budget = free_peak * 7 / 8;
  int64_t planned_peak = 0;
  OK(rt_run_pretraining(&c, max_activation_peak, &planned_peak, &r));
  CHECK(r.completed == 1 && planned_peak > 0 && planned_peak <= c.activation_memory_budget);
  c.stage.output_dir = path_in("budget_too_small");
  c.activation_memory_budget = 1024;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_VALUE, "the smallest plan");
  CHECK(access(path_in("budget_too_small"), F_OK) != 0);
  c.activation_memory_budget = free_peak;
  c.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_VALUE, "activation_memory_budget");
}

/* Activation offload (ABI 2.2, appended): 0 by default; a CPU run with it
 * moves nothing, gives the same losses and records it in metadata.json. */
static void test_activation_offload(void) {
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.activation_offload == 0);
  char corpus[512];
  tiny_c_pretraining(&c, corpus, 2);
  c.stage.activation_checkpointing = RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK;
  rt_run_result off;
  off.struct_size = sizeof off;
  c.stage.output_dir = path_in("offload_off");
  OK(rt_run_pretraining(&c, NULL, NULL, &off));
  rt_run_result on;
  on.struct_size = sizeof on;
  c.stage.output_dir = path_in("offload_on");
  c.activation_offload = 1;
  OK(rt_run_pretraining(&c, NULL, NULL, &on));
  CHECK(off.completed == 1 && on.completed == 1);
  CHECK(memcmp(&off.final_train_loss, &on.final_train_loss, sizeof(float)) == 0);
  CHECK(memcmp(&off.final_validation_loss, &on.final_validation_loss, sizeof(float)) == 0);
  FILE* f = fopen(path_in("offload_on/metadata.json"), "r");
  char metadata[16384] = {0};
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fread(metadata, 1, sizeof metadata - 1, f) > 0);
    fclose(f);
  }
  CHECK(strstr(metadata, "\"activation_offload\": true") != NULL);
}

/* ZeRO stage and bucket size (ABI 2.3, appended): 0 and 25 by default; one
 * process with zero_stage 1 is plain Adam (the same losses) and records it;
 * bad values are RT_ERROR_VALUE naming the field, before anything is
 * written; a 2.2-sized struct never reads them. */
static void test_zero_stage_and_buckets(void) {
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.zero_stage == 0 && c.gradient_bucket_mib == 25);
  rt_post_training_config p;
  OK(rt_post_training_config_default(&p));
  CHECK(p.zero_stage == 0 && p.gradient_bucket_mib == 25);
  char corpus[512], base[512]; /* path_in's buffers are reused */
  tiny_c_pretraining(&c, corpus, 2);
  snprintf(base, sizeof base, "%s", path_in("zero_off/model.safetensors"));
  rt_run_result plain;
  plain.struct_size = sizeof plain;
  c.stage.output_dir = path_in("zero_off");
  OK(rt_run_pretraining(&c, NULL, NULL, &plain));
  rt_run_result zero;
  zero.struct_size = sizeof zero;
  c.stage.output_dir = path_in("zero_on");
  c.zero_stage = 1;
  c.gradient_bucket_mib = 1;
  OK(rt_run_pretraining(&c, NULL, NULL, &zero));
  CHECK(plain.completed == 1 && zero.completed == 1);
  CHECK(memcmp(&plain.final_train_loss, &zero.final_train_loss, sizeof(float)) == 0);
  CHECK(memcmp(&plain.final_validation_loss, &zero.final_validation_loss, sizeof(float)) == 0);
  FILE* f = fopen(path_in("zero_on/metadata.json"), "r");
  char metadata[16384] = {0};
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fread(metadata, 1, sizeof metadata - 1, f) > 0);
    fclose(f);
  }
  CHECK(strstr(metadata, "\"zero_stage\": 1") != NULL);
  CHECK(strstr(metadata, "\"gradient_bucket_mib\": 1") != NULL);
  c.stage.output_dir = path_in("zero_bad");
  c.zero_stage = 2;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &zero), RT_ERROR_VALUE, "zero_stage");
  c.zero_stage = 0;
  c.gradient_bucket_mib = 0;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &zero), RT_ERROR_VALUE, "gradient_bucket_mib");
  CHECK(access(path_in("zero_bad"), F_OK) != 0);
  /* A caller built against 2.2 passes the smaller size: the fields are not read. */
  c.zero_stage = 7;
  c.struct_size = offsetof(rt_pretraining_config, zero_stage);
  c.stage.output_dir = path_in("zero_22");
  OK(rt_run_pretraining(&c, NULL, NULL, &zero));
  CHECK(zero.completed == 1);
  p.base_model = base;
  p.stage.sequence_length = 16;
  p.stage.data = RIFTCO_SOURCE_DIR "/data/chat_example.jsonl";
  p.stage.output_dir = path_in("zero_post_bad");
  p.zero_stage = -1;
  FAILS(rt_run_post_training(&p, NULL, NULL, &zero), RT_ERROR_VALUE, "zero_stage");
}

/* The pipelines' device (ABI 2.5, appended): RT_BACKEND_CPU by default and
 * recorded in metadata.json; a value that is not an rt_backend is
 * RT_ERROR_INVALID_ARGUMENT; cuda on a library without CUDA (or a machine
 * without a device) is RT_ERROR_BACKEND before the output directory exists,
 * for both stages; a 2.4-sized struct never reads the field. */
static void test_pipeline_device(void) {
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.device == RT_BACKEND_CPU);
  rt_post_training_config p;
  OK(rt_post_training_config_default(&p));
  CHECK(p.device == RT_BACKEND_CPU);
  char corpus[512];
  tiny_c_pretraining(&c, corpus, 2);
  rt_run_result r;
  r.struct_size = sizeof r;
  c.stage.output_dir = path_in("device_cpu");
  OK(rt_run_pretraining(&c, NULL, NULL, &r));
  FILE* f = fopen(path_in("device_cpu/metadata.json"), "r");
  char metadata[16384] = {0};
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fread(metadata, 1, sizeof metadata - 1, f) > 0);
    fclose(f);
  }
  CHECK(strstr(metadata, "\"device\": \"cpu\"") != NULL);
  c.stage.output_dir = path_in("device_bad");
  c.device = (rt_backend)7;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_INVALID_ARGUMENT, "not an rt_backend value");
  p.stage.data = RIFTCO_SOURCE_DIR "/data/chat_example.jsonl";
  p.base_model = path_in("device_cpu/model.safetensors");
  p.stage.output_dir = path_in("device_bad");
  p.device = (rt_backend)-1;
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_INVALID_ARGUMENT, "not an rt_backend value");
  CHECK(access(path_in("device_bad"), F_OK) != 0);
  c.device = RT_BACKEND_CUDA;
  c.stage.output_dir = path_in("device_cuda");
  const rt_status cuda = rt_run_pretraining(&c, NULL, NULL, &r);
  if (cuda == RT_ERROR_BACKEND) { /* no CUDA here: refused before any file */
    CHECK(strstr(rt_last_error_message(), "[pretraining] device cuda: ") != NULL);
    CHECK(access(path_in("device_cuda"), F_OK) != 0);
    p.device = RT_BACKEND_CUDA;
    p.stage.output_dir = path_in("device_cuda_post");
    FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_BACKEND, "[post_training] device cuda: ");
    CHECK(access(path_in("device_cuda_post"), F_OK) != 0);
  } else {
    CHECK(cuda == RT_OK && r.completed == 1);
  }
  /* A caller built against 2.4 passes the smaller size: the field is not read. */
  c.device = (rt_backend)7;
  c.struct_size = offsetof(rt_pretraining_config, device);
  c.stage.output_dir = path_in("device_24");
  OK(rt_run_pretraining(&c, NULL, NULL, &r));
  CHECK(r.completed == 1);
}

/* rt_adam_backward_and_step (ABI 2.6): N fused steps give the parameters and
 * norms of N backward + rt_adam_step rounds to the bit and leave no gradient; NULL
 * handles are RT_ERROR_INVALID_ARGUMENT, clipping options and a non-finite
 * gradient RT_ERROR_VALUE, each changing nothing. */
static void test_adam_backward_and_step(void) {
  rt_transformer_config c = tiny_config();
  rt_adam_options options;
  OK(rt_adam_options_default(&options));
  options.learning_rate = 1e-2f;
  options.max_grad_norm = 0.0f;
  rt_model* models[2] = {NULL, NULL};
  rt_adam* adams[2] = {NULL, NULL};
  float norms[2][3];
  for (int fused = 0; fused < 2; ++fused) {
    OK(rt_model_create(&c, 5, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &models[fused]));
    OK(rt_adam_create(models[fused], &options, &adams[fused]));
    for (int step = 0; step < 3; ++step) {
      rt_variable* loss = NULL;
      OK(rt_model_loss(models[fused], g_tokens, g_targets, B, T, &loss));
      if (fused) {
        OK(rt_adam_backward_and_step(adams[fused], loss, &norms[fused][step]));
      } else {
        OK(rt_variable_backward_ex(loss, NULL, 0, 0));
        OK(rt_adam_step(adams[fused], &norms[fused][step]));
        OK(rt_adam_zero_grad(adams[fused]));
      }
      rt_variable_destroy(loss);
    }
  }
  size_t na = 0, nb = 0;
  float* plain = model_values(models[0], &na);
  float* fused = model_values(models[1], &nb);
  CHECK(na == nb && na > 0 && memcmp(plain, fused, na * sizeof(float)) == 0);
  for (int step = 0; step < 3; ++step) {
    CHECK(norms[1][step] > 0.0f && memcmp(&norms[0][step], &norms[1][step], sizeof(float)) == 0);
  }
  rt_variable* p = NULL;
  OK(rt_model_parameter(models[1], "lm_head.weight", &p));
  int64_t numel = 0;
  OK(rt_variable_numel(p, &numel));
  float* head = malloc(sizeof(float) * (size_t)numel);
  int has = 1;
  OK(rt_variable_grad(p, head, (size_t)numel, &has));
  CHECK(has == 0); /* the fused step freed it */
  rt_variable* loss = NULL;
  OK(rt_model_loss(models[1], g_tokens, g_targets, B, T, &loss));
  FAILS(rt_adam_backward_and_step(NULL, loss, NULL), RT_ERROR_INVALID_ARGUMENT, "adam is NULL");
  FAILS(rt_adam_backward_and_step(adams[1], NULL, NULL), RT_ERROR_INVALID_ARGUMENT, "loss is NULL");
  /* Clipping needs every gradient first: refused before the pass. */
  rt_adam* clipping = NULL;
  options.max_grad_norm = 1.0f;
  OK(rt_adam_create(models[1], &options, &clipping));
  FAILS(rt_adam_backward_and_step(clipping, loss, NULL), RT_ERROR_VALUE, "max_grad_norm");
  rt_adam_destroy(clipping);
  /* Another model's loss reaches none of this Adam's parameters (2.6.1):
   * refused before the pass, so that loss can still run its backward. */
  FAILS(rt_adam_backward_and_step(adams[0], loss, NULL), RT_ERROR_VALUE, "reaches none of this Adam's");
  OK(rt_variable_backward_ex(loss, NULL, 0, 1));
  /* A NaN weight makes the first gradient non-finite: nothing moves. */
  size_t n = 0;
  OK(rt_variable_value(p, head, (size_t)numel));
  head[0] = NAN;
  OK(rt_variable_set_value(p, head, (size_t)numel));
  rt_variable_destroy(loss);
  OK(rt_model_loss(models[1], g_tokens, g_targets, B, T, &loss));
  float* poisoned = model_values(models[1], &n);
  FAILS(rt_adam_backward_and_step(adams[1], loss, NULL), RT_ERROR_VALUE, "not finite");
  float* after = model_values(models[1], &n);
  CHECK(memcmp(poisoned, after, n * sizeof(float)) == 0);
  rt_variable_destroy(loss);
  rt_variable_destroy(p);
  free(head);
  free(poisoned);
  free(after);
  free(plain);
  free(fused);
  for (int i = 0; i < 2; ++i) {
    rt_adam_destroy(adams[i]);
    rt_model_destroy(models[i]);
  }
}

/* Reads metadata.json of a run in g_dir into `out` (NUL-terminated). */
static void read_metadata(const char* run, char* out, size_t size) {
  char name[256];
  snprintf(name, sizeof name, "%s/metadata.json", run);
  memset(out, 0, size);
  FILE* f = fopen(path_in(name), "r");
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fread(out, 1, size - 1, f) > 0);
    fclose(f);
  }
}

/* The pipelines' optimizer_in_backward (ABI 2.6, appended): 0 by default;
 * on (with max_grad_norm 0) the same weights as off, recorded in
 * metadata.json; clipping, accumulation refused with RT_ERROR_VALUE before
 * the output directory exists, for both stages; a 2.5-sized struct never
 * reads the field. */
static void test_optimizer_in_backward(void) {
  rt_pretraining_config c;
  OK(rt_pretraining_config_default(&c));
  CHECK(c.optimizer_in_backward == 0 && c.stage.max_grad_norm > 0.0f);
  rt_post_training_config p;
  OK(rt_post_training_config_default(&p));
  CHECK(p.optimizer_in_backward == 0);
  char corpus[512];
  tiny_c_pretraining(&c, corpus, 3);
  c.stage.max_grad_norm = 0.0f;
  rt_run_result off, on;
  off.struct_size = sizeof off;
  on.struct_size = sizeof on;
  c.stage.output_dir = path_in("fused_off");
  OK(rt_run_pretraining(&c, NULL, NULL, &off));
  c.optimizer_in_backward = 1;
  c.stage.output_dir = path_in("fused_on");
  OK(rt_run_pretraining(&c, NULL, NULL, &on));
  CHECK(off.completed == 1 && on.completed == 1);
  CHECK(memcmp(&off.final_train_loss, &on.final_train_loss, sizeof(float)) == 0);
  CHECK(memcmp(&off.final_validation_loss, &on.final_validation_loss, sizeof(float)) == 0);
  char fa[17], fb[17];
  rt_model *a = NULL, *b = NULL;
  OK(rt_model_load_new(off.weights, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, 0, &a));
  OK(rt_model_load_new(on.weights, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, 0, &b));
  OK(rt_model_fingerprint(a, fa, sizeof fa));
  OK(rt_model_fingerprint(b, fb, sizeof fb));
  CHECK(strcmp(fa, fb) == 0);
  rt_model_destroy(a);
  rt_model_destroy(b);
  char metadata[16384];
  read_metadata("fused_on", metadata, sizeof metadata);
  CHECK(strstr(metadata, "\"optimizer_in_backward\": true") != NULL);
  read_metadata("fused_off", metadata, sizeof metadata);
  CHECK(strstr(metadata, "\"optimizer_in_backward\": false") != NULL);
  rt_run_result r;
  r.struct_size = sizeof r;
  c.stage.output_dir = path_in("fused_bad");
  c.stage.max_grad_norm = 1.0f;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_VALUE, "set max_grad_norm to 0");
  c.stage.max_grad_norm = 0.0f;
  c.gradient_accumulation_steps = 2;
  FAILS(rt_run_pretraining(&c, NULL, NULL, &r), RT_ERROR_VALUE, "set gradient_accumulation_steps to 1");
  p.optimizer_in_backward = 1;
  p.base_model = path_in("fused_on/model.safetensors");
  p.stage.data = RIFTCO_SOURCE_DIR "/data/chat_example.jsonl";
  p.stage.sequence_length = 16;
  p.stage.output_dir = path_in("fused_bad");
  FAILS(rt_run_post_training(&p, NULL, NULL, &r), RT_ERROR_VALUE, "set max_grad_norm to 0");
  CHECK(access(path_in("fused_bad"), F_OK) != 0);
  /* A caller built against 2.5 passes 2.5's sizeof (its last field `device`
   * rounded up to the struct's 8-byte alignment): the new field starts at or
   * after it (it must not sit in 2.5's tail padding, bytes a 2.5 caller never
   * set), so it is not read (clipping and accumulation are then fine). */
  const size_t pretraining25 = ALIGN8(offsetof(rt_pretraining_config, device) + sizeof(rt_backend));
  const size_t post_training25 = ALIGN8(offsetof(rt_post_training_config, device) + sizeof(rt_backend));
  CHECK(offsetof(rt_pretraining_config, optimizer_in_backward) >= pretraining25);
  CHECK(offsetof(rt_post_training_config, optimizer_in_backward) >= post_training25);
  CHECK(sizeof(rt_pretraining_config) > pretraining25 && sizeof(rt_post_training_config) > post_training25);
  c.stage.max_grad_norm = 1.0f;
  c.struct_size = pretraining25;
  c.stage.output_dir = path_in("fused_25");
  OK(rt_run_pretraining(&c, NULL, NULL, &r));
  CHECK(r.completed == 1);
  read_metadata("fused_25", metadata, sizeof metadata);
  CHECK(strstr(metadata, "\"optimizer_in_backward\": false") != NULL);
}

/* Model transfer and the model's activation offload (ABI 2.4, appended).
 * Without a usable CUDA device a move to cuda is RT_ERROR_BACKEND and leaves
 * the model untouched (its earlier graph still differentiates); with one,
 * the move makes earlier graphs and decode sessions stale and the losses
 * agree with the CPU's. Offload: 0 by default, the same loss bits on. */
static void test_model_transfer_and_offload(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 42, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_backend where = RT_BACKEND_CUDA;
  OK(rt_model_backend(model, &where));
  CHECK(where == RT_BACKEND_CPU);
  rt_variable* loss = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
  float cpu_loss = 0;
  OK(rt_variable_item(loss, &cpu_loss));
  OK(rt_model_to(model, RT_BACKEND_CPU)); /* already there: nothing moves, nothing is stale */
  OK(rt_variable_backward(loss));
  rt_decode_session* session = NULL;
  OK(rt_decode_session_create(model, &session));
  float logits[256];
  OK(rt_decode_session_decode(session, 5, logits, 256));

  rt_memory_stats stats;
  stats.struct_size = sizeof stats;
  const int have_cuda = rt_memory_stats_get(RT_BACKEND_CUDA, &stats) == RT_OK;
  if (!have_cuda) {
    FAILS(rt_model_to(model, RT_BACKEND_CUDA), RT_ERROR_BACKEND, "cuda");
    OK(rt_model_backend(model, &where));
    CHECK(where == RT_BACKEND_CPU);
    OK(rt_variable_backward(loss)); /* untouched: the graph is not stale */
    OK(rt_decode_session_decode(session, 6, logits, 256));
  } else {
    OK(rt_model_to(model, RT_BACKEND_CUDA));
    OK(rt_model_backend(model, &where));
    CHECK(where == RT_BACKEND_CUDA);
    FAILS(rt_variable_backward(loss), RT_ERROR_STALE_GRAPH, "stale graph");
    FAILS(rt_decode_session_decode(session, 6, logits, 256), RT_ERROR_STALE_GRAPH, "reset()");
    rt_variable* device_loss = NULL;
    OK(rt_model_loss(model, g_tokens, g_targets, B, T, &device_loss));
    float cuda_loss = 0;
    OK(rt_variable_item(device_loss, &cuda_loss));
    CHECK(fabsf(cuda_loss - cpu_loss) <= 1e-4f * fabsf(cpu_loss));
    OK(rt_variable_backward(device_loss));
    /* A host seed for a device output: copied to the output's backend (ABI
     * 2.5), the same gradients as the scalar seed of 1. */
    const float one = 1.0f;
    OK(rt_variable_backward_ex(device_loss, &one, 1, 0));
    rt_variable_destroy(device_loss);
    OK(rt_model_to(model, RT_BACKEND_CPU));
    OK(rt_model_backend(model, &where));
    CHECK(where == RT_BACKEND_CPU);
  }
  FAILS(rt_model_to(model, (rt_backend)7), RT_ERROR_INVALID_ARGUMENT, "not an rt_backend value");
  FAILS(rt_model_to(NULL, RT_BACKEND_CPU), RT_ERROR_INVALID_ARGUMENT, "model is NULL");
  FAILS(rt_model_backend(model, NULL), RT_ERROR_INVALID_ARGUMENT, "backend is NULL");

  int offload = -1;
  OK(rt_model_activation_offload(model, &offload));
  CHECK(offload == 0);
  OK(rt_model_set_activation_offload(model, 1));
  OK(rt_model_activation_offload(model, &offload));
  CHECK(offload == 1);
  rt_variable* offloaded = NULL;
  OK(rt_model_loss(model, g_tokens, g_targets, B, T, &offloaded));
  float offloaded_loss = 0;
  OK(rt_variable_item(offloaded, &offloaded_loss));
  CHECK(memcmp(&offloaded_loss, &cpu_loss, sizeof(float)) == 0);
  OK(rt_variable_backward(offloaded));
  OK(rt_model_set_activation_offload(model, 0));
  OK(rt_model_activation_offload(model, &offload));
  CHECK(offload == 0);
  FAILS(rt_model_activation_offload(model, NULL), RT_ERROR_INVALID_ARGUMENT, "offload is NULL");
  FAILS(rt_model_set_activation_offload(NULL, 1), RT_ERROR_INVALID_ARGUMENT, "model is NULL");

  rt_variable_destroy(offloaded);
  rt_decode_session_destroy(session);
  rt_variable_destroy(loss);
  rt_model_destroy(model);
}

/* ABI 2.8: the optimizer's step count and each parameter's (PyTorch's
 * per-parameter state['step']): an adapter active at one step of three has
 * had one update, the base weights three. */
static void test_adam_step_counts(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 5, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  rt_lora_config lora;
  OK(rt_lora_config_default(&lora));
  lora.rank = 2;
  lora.targets = RT_LORA_QUERY;
  OK(rt_model_add_lora(model, &lora, 3));
  rt_adam_options options;
  OK(rt_adam_options_default(&options));
  rt_adam* adam = NULL;
  OK(rt_adam_create(model, &options, &adam));
  int64_t steps = -1;
  OK(rt_adam_step_count(adam, &steps));
  CHECK(steps == 0);
  for (int step = 0; step < 3; ++step) {
    OK(rt_model_set_lora_active(model, step == 0));
    rt_variable* loss = NULL;
    OK(rt_model_loss(model, g_tokens, g_targets, B, T, &loss));
    OK(rt_variable_backward(loss));
    OK(rt_adam_step(adam, NULL));
    OK(rt_adam_zero_grad(adam));
    rt_variable_destroy(loss);
  }
  OK(rt_adam_step_count(adam, &steps));
  CHECK(steps == 3);
  OK(rt_adam_parameter_step_count(adam, "token_embedding.weight", &steps));
  CHECK(steps == 3);
  OK(rt_adam_parameter_step_count(adam, "blocks.0.attention.query.lora_a", &steps));
  CHECK(steps == 1);
  FAILS(rt_adam_parameter_step_count(adam, "no.such.weight", &steps), RT_ERROR_VALUE, "no.such.weight");
  FAILS(rt_adam_parameter_step_count(adam, NULL, &steps), RT_ERROR_INVALID_ARGUMENT, "parameter_name");
  FAILS(rt_adam_step_count(adam, NULL), RT_ERROR_INVALID_ARGUMENT, "steps");
  FAILS(rt_adam_step_count(NULL, &steps), RT_ERROR_INVALID_ARGUMENT, "adam");
  rt_adam_destroy(adam);
  rt_model_destroy(model);
}

/* ABI 2.8: rt_split_text locates the part rt-eval --split and Python's
 * riftco.split_text give: the last floor(f * bytes) bytes, the cut moved to a
 * UTF-8 character boundary. */
static void test_split_text(void) {
  const char* text = "abcdefgh\xc3\xa9ij"; /* 12 bytes: "abcdefgh", é (2 bytes), "ij" */
  size_t offset = 99, length = 99;
  OK(rt_split_text(text, 12, RT_SPLIT_VALIDATION, 0.25, &offset, &length));
  CHECK(offset == 10 && length == 2); /* the last 3 bytes start inside é (bytes 8-9): moved past it */
  OK(rt_split_text(text, 12, RT_SPLIT_TRAIN, 0.25, &offset, &length));
  CHECK(offset == 0 && length == 10);
  OK(rt_split_text(text, 12, RT_SPLIT_VALIDATION, 0.0, &offset, &length));
  CHECK(length == 0);
  OK(rt_split_text(NULL, 0, RT_SPLIT_TRAIN, 0.5, &offset, &length));
  CHECK(offset == 0 && length == 0);
  FAILS(rt_split_text(text, 12, RT_SPLIT_TRAIN, 1.0, &offset, &length), RT_ERROR_VALUE, "validation_fraction");
  FAILS(rt_split_text(text, 12, (rt_split)7, 0.1, &offset, &length), RT_ERROR_INVALID_ARGUMENT, "split 7");
  FAILS(rt_split_text(NULL, 3, RT_SPLIT_TRAIN, 0.1, &offset, &length), RT_ERROR_INVALID_ARGUMENT, "text is NULL");
  FAILS(rt_split_text(text, 12, RT_SPLIT_TRAIN, 0.1, NULL, &length), RT_ERROR_INVALID_ARGUMENT, "offset");
}

/* ABI 2.9: stop tokens (an end-of-sequence id) end generation, the id
 * written last; a 2.8-sized options struct reads none. */
static void test_stop_tokens(void) {
  rt_transformer_config c = tiny_config();
  rt_model* model = NULL;
  OK(rt_model_create(&c, 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
  rt_generation_options g;
  OK(rt_generation_options_default(&g));
  CHECK(g.stop_tokens == NULL && g.stop_token_count == 0);
  g.max_new_tokens = 8;
  g.temperature = 0.0f;
  int32_t prompt[2] = {72, 105};
  int32_t free_run[8];
  size_t count = 0;
  OK(rt_generate(model, prompt, 2, &g, free_run, 8, &count, NULL));
  CHECK(count == 8);
  const int32_t eos = free_run[3];
  size_t first = 0;
  while (free_run[first] != eos) ++first;
  g.stop_tokens = &eos;
  g.stop_token_count = 1;
  int32_t stopped[8];
  OK(rt_generate(model, prompt, 2, &g, stopped, 8, &count, NULL));
  CHECK(count == first + 1 && stopped[first] == eos && memcmp(stopped, free_run, count * sizeof(int32_t)) == 0);
  /* A caller built against 2.8 passes the smaller struct: no stop tokens. */
  g.struct_size = offsetof(rt_generation_options, stop_tokens);
  OK(rt_generate(model, prompt, 2, &g, stopped, 8, &count, NULL));
  CHECK(count == 8);
  g.struct_size = sizeof g;
  g.stop_tokens = NULL;
  FAILS(rt_generate(model, prompt, 2, &g, stopped, 8, &count, NULL), RT_ERROR_INVALID_ARGUMENT, "stop_tokens is NULL");
  const int32_t outside = (int32_t)c.vocab_size;
  g.stop_tokens = &outside;
  FAILS(rt_generate(model, prompt, 2, &g, stopped, 8, &count, NULL), RT_ERROR_VALUE, "outside the vocabulary");
  int32_t id = 7;
  OK(rt_tokenizer_eos_id(NULL, &id));
  CHECK(id == -1);
  OK(rt_tokenizer_eos_id(path_in("tok.model"), &id)); /* rt_train_tokenizer's models have none */
  CHECK(id == -1);
  FAILS(rt_tokenizer_eos_id(path_in("missing.model"), &id), RT_ERROR_DATA, "missing.model");
  FAILS(rt_tokenizer_eos_id(NULL, NULL), RT_ERROR_INVALID_ARGUMENT, "eos_id");
  OK(rt_model_destroy(model));
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/rt_c_abi_XXXXXX");
  if (mkdtemp(g_dir) == NULL) return 2;
  make_batch();
  test_version_and_names();
  test_model_settings_read_back();
  test_struct_init();
  test_policy_and_parity();
  test_backward_release();
  test_graph_lifetime();
  test_decode_ignores_the_policy();
  test_errors_leave_handles_usable();
  test_training_lora_and_files();
  test_pipelines();
  test_tokenizer_and_evaluate();
  test_gqa_tied_and_hf_conversion();
  test_groups_accumulation_and_sampling();
  test_struct_sizes_read_no_further();
  test_activation_memory_budget();
  test_activation_offload();
  test_zero_stage_and_buckets();
  test_pipeline_device();
  test_adam_backward_and_step();
  test_optimizer_in_backward();
  test_model_transfer_and_offload();
  test_adam_step_counts();
  test_split_text();
  test_stop_tokens();
  char command[600];
  snprintf(command, sizeof command, "rm -rf '%s'", g_dir);
  if (system(command) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
