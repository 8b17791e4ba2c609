/* The C ABI's threading promise (docs/c-abi.md, "Threading"): different
 * handles on different threads are fine, including graphs that share a
 * model's parameters. One thread replaces a parameter's value (or reloads
 * the whole model) while another builds and differentiates graphs of the
 * model with block checkpointing (each replay reads the parameters again).
 * Before ABI 2.8.1 this corrupted the heap in half the runs (set_value freed
 * a value the pass was copying) and a reload during a replay was reported as
 * the block breaking the checkpoint contract. Every pass now either succeeds
 * or is refused as stale, and the process survives. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "riftco_transformer/rt.h"

static rt_model* g_model;
static atomic_int g_stop;
static int32_t g_tokens[64];
static int32_t g_targets[64];
static const char* g_file;

static void* set_values(void* arg) {
  rt_variable* w = arg;
  int64_t n = 0;
  if (rt_variable_numel(w, &n) != RT_OK) return arg;
  float* v = malloc((size_t)n * sizeof *v);
  if (v == NULL || rt_variable_value(w, v, (size_t)n) != RT_OK) return arg;
  long failed = 0;
  while (!atomic_load(&g_stop)) failed += rt_variable_set_value(w, v, (size_t)n) != RT_OK;
  free(v);
  return failed != 0 ? arg : NULL; /* non-NULL: a change failed */
}

static void* reload(void* arg) {
  long failed = 0;
  while (!atomic_load(&g_stop)) failed += rt_model_load(g_model, g_file, 0) != RT_OK;
  return failed != 0 ? arg : NULL; /* non-NULL: a change failed */
}

/* Builds and differentiates `passes` graphs; returns how many ended neither
 * RT_OK nor RT_ERROR_STALE_GRAPH (printing the first few). */
static long train(int passes, long* stale) {
  long other = 0;
  for (int i = 0; i < passes; ++i) {
    rt_variable* loss = NULL;
    rt_status s = rt_model_loss(g_model, g_tokens, g_targets, 4, 16, &loss);
    if (s == RT_OK) s = rt_variable_backward(loss);
    if (s == RT_ERROR_STALE_GRAPH) ++*stale;
    if (s != RT_OK && s != RT_ERROR_STALE_GRAPH && other++ < 3) {
      fprintf(stderr, "pass %d: %s: %s\n", i, rt_status_name(s), rt_last_error_message());
    }
    rt_variable_destroy(loss);
  }
  return other;
}

static int run(void* (*changer)(void*), void* arg, const char* what) {
  pthread_t thread;
  atomic_store(&g_stop, 0);
  if (pthread_create(&thread, NULL, changer, arg) != 0) return 1;
  long stale = 0;
  const long other = train(150, &stale);
  atomic_store(&g_stop, 1);
  void* failed = NULL;
  pthread_join(thread, &failed);
  printf("%s: 150 passes, %ld refused as stale, %ld other errors; changer failed: %s\n", what, stale, other,
         failed ? "yes" : "no");
  return other != 0 || failed != NULL;
}

/* Readers that never pause: a change must still get in (the lock lets a
 * waiting writer go before new readers; with four such threads one
 * set_value waited over a minute before). */
static atomic_long g_reads;
static void* forward_forever(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    rt_variable* logits = NULL;
    if (rt_model_forward(g_model, g_tokens, 1, 16, &logits) == RT_OK) atomic_fetch_add(&g_reads, 1);
    rt_variable_destroy(logits);
  }
  return NULL;
}

static int writer_gets_in(rt_variable* w) {
  enum { kReaders = 4, kChanges = 20 };
  pthread_t readers[kReaders];
  atomic_store(&g_stop, 0);
  for (int i = 0; i < kReaders; ++i) {
    if (pthread_create(&readers[i], NULL, forward_forever, NULL) != 0) return 1;
  }
  const struct timespec ms = {0, 1000000};
  while (atomic_load(&g_reads) < 50) nanosleep(&ms, NULL); /* the readers are running */
  int64_t n = 0;
  rt_variable_numel(w, &n);
  float* v = malloc((size_t)n * sizeof *v);
  int failed = v == NULL || rt_variable_value(w, v, (size_t)n) != RT_OK;
  for (int i = 0; i < kChanges && !failed; ++i) failed = rt_variable_set_value(w, v, (size_t)n) != RT_OK;
  atomic_store(&g_stop, 1);
  for (int i = 0; i < kReaders; ++i) pthread_join(readers[i], NULL);
  free(v);
  printf("%d set_value calls beside %d threads of forwards (%ld forwards): %s\n", kChanges, kReaders,
         atomic_load(&g_reads), failed ? "failed" : "all in");
  return failed;
}

/* A hang is this test's failure: the whole program is stopped after 120 s. */
static void* watchdog(void* arg) {
  (void)arg;
  sleep(120);
  fprintf(stderr, "FAILED: a change waited more than 120 s (writer starvation?)\n");
  _exit(1);
  return NULL;
}

int main(void) {
  pthread_t dog;
  if (pthread_create(&dog, NULL, watchdog, NULL) != 0) return 1;
  pthread_detach(dog);
  for (int i = 0; i < 64; ++i) {
    g_tokens[i] = i % 256;
    g_targets[i] = (i + 1) % 256;
  }
  rt_transformer_config c;
  rt_transformer_config_init(&c, sizeof c);
  c.vocab_size = 256;
  c.context_length = 16;
  c.model_width = 16;
  c.heads = 2;
  c.layers = 2;
  c.feed_forward_width = 32;
  if (rt_model_create(&c, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &g_model) != RT_OK) {
    fprintf(stderr, "rt_model_create: %s\n", rt_last_error_message());
    return 1;
  }
  char file[] = "/tmp/rt_c_abi_threads_XXXXXX";
  const int fd = mkstemp(file);
  if (fd < 0) return 1;
  close(fd);
  g_file = file;
  if (rt_model_save(g_model, g_file) != RT_OK) return 1;
  rt_variable* weight = NULL;
  if (rt_model_parameter(g_model, "blocks.1.attention_norm.weight", &weight) != RT_OK) return 1;
  int failures = run(set_values, weight, "set_value beside backward");
  failures += run(reload, &g_stop, "rt_model_load beside backward");
  failures += writer_gets_in(weight);
  rt_variable_destroy(weight);
  rt_model_destroy(g_model);
  unlink(g_file);
  printf("%s\n", failures ? "FAILED" : "passed");
  return failures != 0;
}
