/* kernel_cases: one table of kernel cases (op × shape × dtype, as llama.cpp's tests/test-backend-ops.cpp lists
 * them), run by two drivers: tests/unit/test_kernel_cases.c (every row's CPU check: the kernels/<name>.c reference
 * against a naive double-precision reference or central finite differences) and tests/gpu/test_kernel_cases_gpu.c
 * (every row's CUDA check: the kernels/<name>.cu launcher on device copies against the CPU reference, then the same
 * check again on the same inputs, whose device downloads must be bitwise identical to the first run's).
 *
 * The table is kernel_cases[] in tests/kernel_cases.c; an op's checks live in tests/kernels/<family>.c (its CPU check
 * in plain C, its CUDA check under #ifdef DFLASH_CUDA: the GPU driver compiles the same file with DFLASH_CUDA).
 *
 * A new kernel becomes one op and its rows:
 *   1. in tests/kernels/<family>.c (a new file is picked up by the GNUmakefile), the checks, each taking the row
 *      (shape parameters c->p[], in the order op.params names them; c->seqs: packed sequence lengths; c->aux: a
 *      second int list, e.g. state slots):
 *        static void foo_cpu(const kc_case *c)   EXPECT()s of tests/test.h, against a naive double reference
 *        static void foo_cuda(const kc_case *c)  report lines "ok <what> ..." / "FAIL <what> ..." (failures++;
 *                                                kc_report, compare_bf16), against the CPU reference on the same
 *                                                bf16 values; every output downloaded with dev_get() (the driver
 *                                                compares the two runs' downloads)
 *      and the op:  const kc_op kc_foo = {"foo", "bf16", "rows dim ld", foo_cpu, KC_CUDA(foo_cuda)};
 *      (either check may be NULL: the row then runs on the other backend only; a CUDA check whose kernel does not
 *      run on this device calls kc_skip(why) before any report line: the row says it is skipped);
 *   2. one `extern const kc_op kc_foo;` line below;
 *   3. its rows in kernel_cases[] (tests/kernel_cases.c): {KC(kc_foo, rows, dim, ld), .why = "..."}: the model shapes
 *      it serves, its paths' boundaries, GQA groups of 3, odd lengths and one-token sequences where it takes heads or
 *      sequences; .only = KC_CUDA_ONLY where a shape is too large for the naive CPU check.
 * Neither driver, tests/gpu/run_all.sh nor the GNUmakefile changes: both drivers iterate the whole table. A test
 * written as its own file (tests/unit/test_foo.c, tests/gpu/test_foo_gpu.c) folds in the same way: its check
 * functions move into tests/kernels/ with their arguments read from c->p, its calls become rows, the file goes.
 * A benchmark-like timing goes to kernel_timings[] (printed by the GPU driver, not compared).
 * Inputs come from rnd_uniform(), reseeded from the row's name before each run: a row's data do not depend on the
 * rows before it, and the two device runs see the same inputs. */
#ifndef DFLASH_KERNEL_CASES_H
#define DFLASH_KERNEL_CASES_H

#include <stddef.h>
#include <stdint.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#define KC_CUDA(f) (f)
#else
#define KC_CUDA(f) NULL
#endif

#define KC_NP 10

typedef struct kc_case kc_case;
typedef void (*kc_check_fn)(const kc_case *c);

/* An op: a kernel (or a family of entry points sharing a reference) and its checks on each backend. */
typedef struct kc_op {
    const char *name;   /* e.g. "rmsnorm_forward" */
    const char *dtype;  /* the device's data: "bf16", "bf16->f32", "f32", "i32", ... */
    const char *params; /* names of the shape parameters p[0], p[1], ... separated by spaces */
    kc_check_fn cpu;    /* the CPU reference against a naive double reference / finite differences (NULL: none) */
    kc_check_fn cuda;   /* the CUDA launcher against the CPU reference (NULL: none) */
} kc_op;

enum { KC_ALL = 0, KC_CPU_ONLY = 1, KC_CUDA_ONLY = 2 };

/* A row: an op at one shape. */
struct kc_case {
    const kc_op *op;
    int p[KC_NP];      /* shape parameters, named by op->params */
    const int *seqs;   /* packed sequence lengths (NULL: none) */
    int nseqs;
    const int *aux;    /* a second list the op defines (state slots, anchors per sequence...) */
    int naux;
    int only;          /* KC_ALL, or the one backend that runs the row (a shape too large for the naive CPU check) */
    const char *why;   /* what the row is for */
};

/* A row is written {KC(kc_foo, p0, p1, ...), KC_SEQS(len, ...), KC_AUX(...), .only = ..., .why = "..."}. */
#define KC(op_, ...) .op = &(op_), .p = {__VA_ARGS__}
#define KC_LIST(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define KC_SEQS(...) .seqs = KC_LIST(__VA_ARGS__)
#define KC_AUX(...) .aux = KC_LIST(__VA_ARGS__)

extern const kc_case kernel_cases[];
extern const int kernel_ncases;

/* The row's name: "<op> <dtype> <param>=<value>... seqs=[...]" (a static buffer per call site: copy to keep). */
const char *kc_case_name(const kc_case *c, char *buf, size_t n);
/* The seed of a row: a hash of its name (the same inputs every run, whatever the rows before it). */
uint64_t kc_case_seed(const kc_case *c);

/* ---- random inputs (both builds) ---- */
extern uint64_t rng_state;
double rnd_uniform(void);                                  /* [-1, 1) */
uint64_t rnd_u64(void);
float *rnd_floats(size_t n, double amp);                   /* n floats of amplitude amp */
float *dup_floats(const float *src, size_t n);
uint16_t *rnd_bf16(size_t n, double amp, float *f);        /* n bf16 of amplitude amp, exact fp32 copies in f */
float *rnd_f32(size_t n, double amp, double bias);         /* n floats in bias + amp·[-1, 1) */

/* ---- CPU checks' helpers ---- */
double kc_max_abs(const float *a, size_t n);
/* Σ dy ⊙ y over a (rows, cols; ld) tensor, in double. */
double kc_dot_loss(const float *dy, const float *y, int rows, int cols, int ld);
/* Central differences (step 1e-3) of loss(ctx) with respect to each element of p (rows, cols; ld) against the
 * analytic gradient an (an_ld): a failure (test_failed_here) when max |fd − an| > 1e-2 · max(max |an|, 1e-2). */
void kc_check_grad(const char *what, float *p, int rows, int cols, int ld, const float *an, int an_ld,
                   double (*loss)(void *ctx), void *ctx);

/* ---- the ops (one line per op) ---- */
extern const kc_op kc_embedding_forward, kc_rmsnorm_forward, kc_rmsnorm_backward, kc_matmul_forward,
    kc_matmul_forward_k0, kc_matmul_backward, kc_matmul_forward_f32, kc_swiglu_forward, kc_swiglu_backward,
    kc_rope_inv_freq, kc_rope_apply, kc_qk_norm_rope, kc_qk_norm_rope_backward, kc_qk_norm_rope_partial,
    kc_attention_causal, kc_rand_fill, kc_cast_f32_bf16, kc_colsum_add, kc_adamw_step, kc_adamw_apply,
    kc_grad_sq_sum, kc_grad_clip_coef, kc_lr_schedule, kc_cross_entropy, kc_cross_entropy_argmax_ties,
    kc_dflash_attention, kc_dflash_attention_backward, kc_dflash_attention_props, kc_causal_conv1d,
    kc_causal_conv1d_state, kc_gated_delta_rule, kc_gated_delta_rule_state, kc_gated_delta_chunk,
    kc_gated_delta_chunk_state, kc_gated_delta_prep, kc_gated_rmsnorm, kc_sigmoid_gate, kc_moe_router_topk,
    kc_moe_combine, kc_moe_group, kc_moe_gemm, kc_logits_mask, kc_nonfinite, kc_embedding_rejects,
    kc_kv_attention, kc_argmax, kc_block_accept, kc_attention_wgmma, kc_attention_opts, kc_moe_gemm_opts,
    kc_bias_add, kc_swiglu_clamped, kc_gemv_forward, kc_gemv_rmsnorm, kc_gemv_rmsnorm_swiglu, kc_matmul_pick,
    kc_matmul_swiglu, kc_attention_qfold;

#ifdef DFLASH_CUDA
/* ---- the device side (the GPU driver) ---- */
extern int failures;          /* failed report lines of the current run */
extern cudaStream_t stream;   /* the stream every check launches on */
void *dev_upload(const void *src, size_t bytes);          /* device copy of src (NULL: uninitialised) */
uint16_t *dev_poisoned(size_t n);                         /* n bf16 (+16 bytes) of 0xffff (NaN) */
void dev_put(void *d, const void *src, size_t bytes);
/* bytes of device memory d after the stream's work, in a new host buffer; recorded for the twice-bitwise check */
void *dev_get(const void *d, size_t bytes);
/* got (bf16) against ref (fp32): ‖got − ref‖/‖ref‖ <= tol_norm and max|got − ref|/max(1, max|ref|) <= tol_max
 * (a report line) */
void compare_bf16(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm, double tol_max);
/* The row cannot run on this device (a kernel built for one architecture, on another): called by a CUDA check
 * before any report line, it makes the driver print "skip <row>: <why>" in place of the twice-bitwise line (a row
 * skipped is neither passed nor failed; the driver's last line counts them). */
void kc_skip(const char *why);
const char *kc_skipped(void); /* the reason given in the current run, or NULL */
/* Whether this is the run that reports (the second run of a row only records its downloads): timings skip it. */
int kc_reporting(void);
/* "ok|FAIL <name> max_err=<err> tol=<tol>" (NaN fails) */
void kc_report(const char *name, double err, double tol);
/* Two runs' outputs inside one check must be the same bits ("determinism <name> (two runs, bitwise)"). */
void report_same_bits(const char *name, const void *a, const void *b, size_t bytes, int is_f32);
/* max |bf16 got − ref| over a (rows, cols) block (NaN: inf); *mx = max |ref| */
double err_bf16(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *mx);
double err_f32(const float *got, const float *ref, size_t n, double *mx);
/* max |got − ref| / max |ref| (NaN: inf); *norm_rel = ‖got − ref‖/‖ref‖ */
double err_vs_max(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *norm_rel);
float *abs_copy(const float *a, size_t n);
double max_of(const float *a, size_t n);
float elapsed_ms(cudaEvent_t a, cudaEvent_t b);

/* the driver's side of the twice-bitwise check: run 0 keeps every dev_get download, run 1 compares with them */
void kc_record_begin(int run);
size_t kc_record_end(int *ndownloads, size_t *bytes); /* downloads of run 1 that differ (a count mismatch: 1 more) */

/* Timings (not cases: printed, not compared), run once after the table by the GPU driver. */
typedef struct kc_timing { const char *name; void (*fn)(void); } kc_timing;
extern const kc_timing kernel_timings[];
extern const int kernel_ntimings;
void kc_time_rmsnorm_backward(void);
void kc_time_adamw(void);
void kc_time_matmul_backward(void);
void kc_time_matmul_survey(void);
void kc_time_dense_layer_other(void);
void kc_time_matmul_swiglu(void);
#endif

#endif
