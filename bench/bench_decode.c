/* bench_decode: greedy decoding with the KV cache (target_decode_cuda) on the Qwen3-8B shape with random bf16
 * weights (--family qwen3_5: the Qwen3.5-9B-shaped hybrid target of bench/qwen35_9b.h, whose cache also carries each
 * sequence's conv histories and fp32 delta-rule states: a step reads and writes those too). For each batch size
 * (default 1, 4, 16, 64): steps launched kernel by kernel, then as CUDA graphs (target_cuda_cache_set_graphs), both
 * with the default kernels for the linear layers (gemv.h's GEMV_DEFAULT_ROWS), then (batches of at most 16) as graphs
 * with the other choice (cuBLASLt or the GEMV kernels: target_cuda_set_gemv_rows); first, the linear layers alone
 * (bench_linear):
 * prompts of --prompt random tokens prefilled in packed steps (the first prefill of a shape is timed apart from the
 * second: module loading and GEMM plans), then --new greedy steps, each one token per sequence: forward against the
 * cache, logits of the new rows, argmax on the device, the ids copied to the host (what the next step needs): the
 * loop `dflash generate` runs. Prints ms per decode step, tokens/s and the step time against the weight-read bound
 * (the bytes a step reads: layers + lm_head + the KV cache), the device time by kernel class of one instrumented
 * step, and whether the two modes decoded the same ids (they must: the same bits).
 * DFLASH_PDL=1 launches the step's small kernels as programmatic dependent launches (kernels/pdl.cuh), to compare;
 * DFLASH_GEMV_SPLIT=1 runs the CUDA-core GEMV without its k split and SwiGLU fold, DFLASH_KV_OLD=1 kv_attention on
 * its FMA loops with a chunk a CTA and the combine kernel (gemv.h, kv_attention.h): the kernels before, for an A/B in
 * one command (tests/gpu/decode_perf.sh).
 * usage: bench_decode [--family qwen3|qwen3_5] [--layers L] [--prompt N] [--new N] [--batch B]... [--bw TB/s]
 *                     [--no-linear (skip the linear layers alone)] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "argmax.h"
#include "cuda_check.h"
#include "gemv.h"
#include "matmul.h"
#include "qwen35_9b.h"
#include "qwen3_8b.h"
#include "target_decode_cuda.h"
#include "target_model_cuda.h"
#include "util.h"

static double now_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* The linear layers of a decoding step alone, back to back on one stream, each call reading its weights from another
 * place of a 2 GiB ring (so that L2 holds none of them): microseconds a call and the rate at which w is read, for
 * cuBLASLt and the GEMV kernels (gemv.h), at m = 1, 4, 8, 16 rows, on the Qwen3-8B shapes; at m = 1 and 2 the
 * CUDA-core GEMV by k split too (1, 2, 4, 8 warps a row pair). */
static void bench_linear(const hf_config *c, double bw)
{
    const int H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const int qkvw = (c->num_heads + 2 * c->num_kv_heads) * c->head_dim, qd = c->num_heads * c->head_dim;
    const struct { const char *name; int n, k; } sh[] = {
        {"q|k|v", qkvw, H}, {"o_proj", H, qd}, {"gate|up", 2 * I, H}, {"down", H, I}, {"lm_head", V, H}};
    const int ms[] = {1, 4, 8, 16}, reps = 30;
    const size_t ring = (size_t)2 << 30;
    uint16_t *w = NULL, *x = NULL, *y = NULL;
    CHECK_CUDA(cudaMalloc((void **)&w, ring));
    CHECK_CUDA(cudaMemset(w, 0, ring));
    CHECK_CUDA(cudaMalloc((void **)&x, (size_t)16 * I * 2));
    CHECK_CUDA(cudaMemset(x, 0, (size_t)16 * I * 2));
    CHECK_CUDA(cudaMalloc((void **)&y, (size_t)16 * V * 2));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    matmul_cuda *mm = matmul_cuda_create(0);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    printf("linear layers alone (us a call, w read at TB/s; bound %.1f TB/s):\n", bw);
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++)
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int n = sh[si].n, k = sh[si].k, m = ms[mi];
            const size_t wb = (size_t)n * k * 2, slots = ring / wb;
            printf("  %-8s n=%6d k=%5d m=%2d:", sh[si].name, n, k, m);
            for (int kern = 0; kern < 4; kern++) { /* 0 cuBLASLt, 1 GEMV mma, 2 GEMV fma, 3 GEMV fma unsplit */
                if (kern >= 2 && m > GEMV_FMA_MAX_M) continue;
                for (int r = -2; r < reps; r++) {
                    if (r == 0) CHECK_CUDA(cudaEventRecord(e0, st));
                    const uint16_t *wr = w + ((size_t)(r + 2) % slots) * (wb / 2);
                    if (kern == 0) matmul_forward_cuda(mm, y, n, NULL, 0, 0.0f, x, k, wr, m, n, k, st);
                    else gemv_forward_cuda_with(kern == 1 ? GEMV_KERNEL_MMA : kern == 2 ? GEMV_KERNEL_FMA
                                                                                     : GEMV_KERNEL_FMA_UNSPLIT,
                                                y, n, NULL, 0, 0.0f, x, k, wr, m, n, k, st);
                }
                CHECK_CUDA(cudaEventRecord(e1, st));
                CHECK_CUDA(cudaEventSynchronize(e1));
                double us = now_ms(e0, e1) * 1e3 / reps;
                static const char *const kname[] = {"cublasLt", "gemv-mma", "gemv-fma", "fma-unsplit"};
                printf("  %s %7.1f us %4.2f TB/s", kname[kern], us,
                       wb / (us * 1e-6) / 1e12);
            }
            printf("\n");
            if (m > 2) continue;
            printf("    CUDA-core GEMV by k split:"); /* gemv.cu's fma_split picks one from n and k */
            for (int split = 1; split <= 8; split *= 2) {
                for (int r = -2; r < reps; r++) {
                    if (r == 0) CHECK_CUDA(cudaEventRecord(e0, st));
                    const uint16_t *wr = w + ((size_t)(r + 2) % slots) * (wb / 2);
                    gemv_fma_split_forward_cuda(split, y, n, NULL, 0, 0.0f, x, k, wr, m, n, k, st);
                }
                CHECK_CUDA(cudaEventRecord(e1, st));
                CHECK_CUDA(cudaEventSynchronize(e1));
                double us = now_ms(e0, e1) * 1e3 / reps;
                printf("  %d: %6.1f us %4.2f TB/s", split, us, wb / (us * 1e-6) / 1e12);
            }
            printf("\n");
        }
    matmul_cuda_destroy(&mm);
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaStreamDestroy(st));
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
}

int main(int argc, char **argv)
{
    int layers = -1, prompt = 512, nnew = 128, nbatch = 0, batches[8], hybrid = 0, linear = 1;
    double bw = 4.3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            const char *f = argv[++i];
            hybrid = !strcmp(f, "qwen3_5");
            if (!hybrid && strcmp(f, "qwen3")) {
                fprintf(stderr, "bench_decode: --family %s: expected qwen3 or qwen3_5\n", f);
                return 2;
            }
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) nnew = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc && nbatch < 8) batches[nbatch++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-linear")) linear = 0;
        else {
            fprintf(stderr, "usage: %s [--family qwen3|qwen3_5] [--layers L] [--prompt N] [--new N] [--batch B]... "
                    "[--bw TB/s] [--no-linear]\n", argv[0]);
            return 2;
        }
    }
    if (layers < 0) layers = hybrid ? 32 : 36;
    if (!nbatch) batches[nbatch++] = 1, batches[nbatch++] = 4, batches[nbatch++] = 16, batches[nbatch++] = 64;
    int maxb = 0;
    for (int i = 0; i < nbatch; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    if (layers < 1 || prompt < 1 || nnew < 4 || maxb < 1) {
        fprintf(stderr, "bench_decode: --layers, --prompt, --batch must be >= 1 and --new >= 4\n");
        return 2;
    }
    hf_config cfg;
    if (hybrid) qwen35_9b_config(&cfg, layers, 0);
    else qwen3_8b_config(&cfg, layers);
    const int V = cfg.vocab_size, max_len = prompt + nnew;
    /* prefill in packed steps of at most 4096 tokens (whole prompts) */
    int per_step = 4096 / prompt > 0 ? 4096 / prompt : 1;
    const int step_tokens = per_step * prompt > maxb ? per_step * prompt : maxb;
    if (per_step > maxb) per_step = maxb;

    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    errbuf err = {{0}};
    target_cuda *m = NULL;
    if (target_cuda_init_random(&m, &cfg, 1234, 0.02f, step_tokens, maxb, NULL, &err)) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        return 1;
    }
    cudaStream_t st = (cudaStream_t)target_cuda_stream(m);
    uint16_t *logits = NULL;
    int32_t *d_next = NULL, *h_next = NULL;
    CHECK_CUDA(cudaMalloc((void **)&logits, (size_t)maxb * V * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_next, sizeof(int32_t) * (size_t)maxb));
    CHECK_CUDA(cudaMallocHost((void **)&h_next, sizeof(int32_t) * (size_t)maxb));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));

    /* bytes a step reads: every layer weight, the final norm, lm_head, one embedding row, the KV cache of the
     * attention layers; hybrid: per linear layer and sequence the conv history and the fp32 delta-rule state, read
     * and written */
    double H = cfg.hidden_size, I = cfg.intermediate_size, hd = cfg.head_dim;
    double qd = cfg.num_heads * hd, kd = cfg.num_kv_heads * hd;
    double attn_bytes = 2 * (qd * H + 2 * kd * H + H * qd + 3 * H * I + 2 * H + 2 * hd);
    double lin_bytes = 0, state_bytes = 0; /* per linear layer; per linear layer and sequence */
    int nlin = 0;
    if (hybrid) {
        attn_bytes += 2 * qd * H; /* the output gate's rows of q_proj */
        double HV = cfg.linear_num_v_heads, C = 2.0 * cfg.linear_num_k_heads * cfg.linear_k_head_dim +
                                                HV * cfg.linear_v_head_dim, VD = HV * cfg.linear_v_head_dim;
        lin_bytes = 2 * ((C + VD + 2 * HV) * H + H * VD + C * cfg.linear_conv_kernel + 3 * H * I + 2 * H +
                         cfg.linear_v_head_dim) + 8 * HV;
        state_bytes = 2 * (4 * HV * cfg.linear_k_head_dim * cfg.linear_v_head_dim +
                           2 * (cfg.linear_conv_kernel - 1) * C);
        for (int i = 0; i < layers; i++) nlin += cfg.layer_linear[i];
    }
    double weights_read = (layers - nlin) * attn_bytes + nlin * lin_bytes + 2 * (H + (double)V * H + H);
    printf("device: %s, %d SMs; %s shape, %d layers%s, random bf16 weights; prompts of %d tokens, %d new tokens\n",
           prop.name, prop.multiProcessorCount, hybrid ? "Qwen3.5-9B" : "Qwen3-8B", layers,
           hybrid ? " (3 Gated DeltaNet : 1 gated attention)" : "", prompt, nnew);
    if (!hybrid && linear) bench_linear(&cfg, bw);

    for (int bi = 0; bi < nbatch; bi++) {
        const int B = batches[bi];
        target_cuda_cache *cache = NULL;
        if (target_cuda_cache_create(&cache, m, B, max_len, step_tokens, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            return 1;
        }
        int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)B * prompt);
        int *seqs = xmalloc(sizeof(int) * (size_t)B), *n = xmalloc(sizeof(int) * (size_t)B);
        int32_t *trace[3] = {NULL, NULL, NULL}; /* the ids each mode decoded: (nnew - 1, B) */
        uint64_t rs = 0x9e3779b97f4a7c15ull + (uint64_t)B;
        for (size_t i = 0; i < (size_t)B * prompt; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((rs >> 33) % (uint64_t)V);
        }
        double prefill_ms[3], step_ms[3];
        int captured = 0;
        long long replayed = 0;
        const int nmodes = B <= GEMV_MAX_M ? 3 : 2;
        /* mode 0: every step kernel by kernel; mode 1: the steps as CUDA graphs (both with the default choice of
         * kernel for the linear layers, GEMV_DEFAULT_ROWS); mode 2 (B <= GEMV_MAX_M): graphs with the other choice
         * (cuBLASLt where the default is the GEMV, the tensor-core GEMV where it is cuBLASLt). Each mode empties the
         * cache and prefills the same prompts (mode 0's prefill is this shape's first: module loading, GEMM plans;
         * the others are warm), then decodes greedily. */
        const int other_rows = B <= GEMV_DEFAULT_ROWS ? 0 : GEMV_MAX_M;
        for (int mode = 0; mode < nmodes; mode++) {
            target_cuda_cache_set_graphs(cache, 0); /* drops the graphs of the previous mode */
            target_cuda_cache_set_graphs(cache, mode > 0);
            target_cuda_set_gemv_rows(m, mode == 2 ? other_rows : GEMV_DEFAULT_ROWS);
            for (int s = 0; s < B; s++)
                if (target_cuda_cache_crop(cache, s, 0, &err)) {
                    fprintf(stderr, "bench_decode: %s\n", err.msg);
                    return 1;
                }
            /* prefill: logits of each prompt's last row, argmax: the first new token */
            CHECK_CUDA(cudaEventRecord(e0, st));
            for (int s0 = 0; s0 < B; s0 += per_step) {
                int k = B - s0 < per_step ? B - s0 : per_step;
                for (int i = 0; i < k; i++) seqs[i] = s0 + i, n[i] = prompt;
                if (target_cuda_cache_forward(cache, k, seqs, n, ids + (size_t)s0 * prompt, NULL, 0, NULL, 0, logits,
                                              1, &err)) {
                    fprintf(stderr, "bench_decode: prefill: %s\n", err.msg);
                    return 1;
                }
                argmax_rows_cuda(d_next + s0, logits, V, k, V, st);
            }
            CHECK_CUDA(cudaMemcpyAsync(h_next, d_next, sizeof(int32_t) * (size_t)B, cudaMemcpyDeviceToHost, st));
            CHECK_CUDA(cudaEventRecord(e1, st));
            CHECK_CUDA(cudaEventSynchronize(e1));
            prefill_ms[mode] = now_ms(e0, e1);
            for (int i = 0; i < B; i++) seqs[i] = i, n[i] = 1;
            trace[mode] = xmalloc(sizeof(int32_t) * (size_t)(nnew - 1) * B);
            /* decode: the first step is a warm-up of this shape (and the second its capture), the rest are timed */
            for (int it = 0; it < nnew - 1; it++) {
                if (it == 2) CHECK_CUDA(cudaEventRecord(e0, st));
                if (target_cuda_cache_forward(cache, B, seqs, n, h_next, NULL, 0, NULL, 0, logits, 1, &err)) {
                    fprintf(stderr, "bench_decode: decode step %d: %s\n", it, err.msg);
                    return 1;
                }
                argmax_rows_cuda(d_next, logits, V, B, V, st);
                CHECK_CUDA(cudaMemcpyAsync(h_next, d_next, sizeof(int32_t) * (size_t)B, cudaMemcpyDeviceToHost, st));
                CHECK_CUDA(cudaStreamSynchronize(st));
                memcpy(trace[mode] + (size_t)it * B, h_next, sizeof(int32_t) * (size_t)B);
            }
            CHECK_CUDA(cudaEventRecord(e1, st));
            CHECK_CUDA(cudaEventSynchronize(e1));
            step_ms[mode] = now_ms(e0, e1) / (nnew - 3);
            if (mode == 1) target_cuda_cache_graph_stats(cache, &captured, &replayed);
        }
        target_cuda_set_gemv_rows(m, GEMV_DEFAULT_ROWS);
        /* one instrumented step (the cache's last free position): device time per kernel class */
        double cls[TARGET_CUDA_NCLASS];
        target_cuda_set_profiling(m, 1);
        if (target_cuda_cache_forward(cache, B, seqs, n, h_next, NULL, 0, NULL, 0, logits, 1, &err)) {
            fprintf(stderr, "bench_decode: profiled step: %s\n", err.msg);
            return 1;
        }
        target_cuda_profile(m, cls);
        target_cuda_set_profiling(m, 0);
        CHECK_CUDA(cudaStreamSynchronize(st));
        size_t bad = 0, differ = 0, differ_gemv = 0;
        for (size_t i = 0; i < (size_t)(nnew - 1) * B; i++) {
            bad += trace[1][i] < 0 || trace[1][i] >= V;
            differ += trace[0][i] != trace[1][i];
            if (trace[2]) differ_gemv += trace[0][i] != trace[2][i];
        }
        double kv_bytes = (double)(layers - nlin) * 2 * kd * 2 * (prompt + nnew / 2.0) * B;
        double st_bytes = (double)nlin * state_bytes * B, read = weights_read + kv_bytes + st_bytes;
        double bound_ours = read / (bw * 1e12) * 1e3;
        const char *lin = B <= GEMV_DEFAULT_ROWS ? "CUDA-core GEMV" : "cuBLASLt";
        char states[96] = "";
        if (hybrid) snprintf(states, sizeof states, " + conv/delta states read and written %.2f", st_bytes / 1e9);
        printf("batch %d: prefill %d x %d tokens: first %.1f ms (%.0f tok/s), again %.1f ms (%.0f tok/s); "
               "weight-read bound at %.1f TB/s: %.2f ms (%.2f GB read a step: weights %.2f + KV %.2f%s)\n",
               B, B, prompt, prefill_ms[0], B * prompt / (prefill_ms[0] / 1e3), prefill_ms[1],
               B * prompt / (prefill_ms[1] / 1e3), bw, bound_ours, read / 1e9, weights_read / 1e9, kv_bytes / 1e9,
               states);
        printf("  decode kernel by kernel: %.3f ms/step, %.0f tokens/s, %.2fx the bound (linear layers: %s)\n",
               step_ms[0], B / (step_ms[0] / 1e3), step_ms[0] / bound_ours, lin);
        printf("  decode as CUDA graphs:   %.3f ms/step, %.0f tokens/s, %.2fx the bound (%d graph(s) captured, %lld "
               "steps replayed%s)\n", step_ms[1], B / (step_ms[1] / 1e3), step_ms[1] / bound_ours, captured, replayed,
               captured ? "" : ": the family's step is not capturable");
        if (nmodes == 3)
            printf("  decode as graphs, %s for the linear layers instead of the default %s: %.3f ms/step, %.0f "
                   "tokens/s, %.2fx the bound (%zu of the %d x %d greedy ids differ from the default's: other "
                   "roundings, random weights' near-ties)\n", other_rows ? "the GEMV kernels" : "cuBLASLt", lin,
                   step_ms[2], B / (step_ms[2] / 1e3), step_ms[2] / bound_ours, differ_gemv, nnew - 1, B);
        printf("  one step's device time by kernel class: GEMMs %.3f ms, attention %.3f ms, delta rule %.3f ms, "
               "other %.3f ms, copies %.3f ms\n", cls[TARGET_CUDA_MATMUL], cls[TARGET_CUDA_ATTENTION],
               cls[TARGET_CUDA_DELTA_RULE], cls[TARGET_CUDA_OTHER], cls[TARGET_CUDA_COPY]);
        printf("%s batch %d: the %d x %d greedy ids of the two modes: %zu differ, %zu out of range\n",
               differ || bad ? "FAIL" : "ok", B, nnew - 1, B, differ, bad);
        printf("cache: %.2f GiB for %d x %d positions\n", (double)target_cuda_cache_bytes(cache) / (1 << 30), B,
               max_len);
        target_cuda_cache_destroy(&cache);
        free(ids), free(seqs), free(n), free(trace[0]), free(trace[1]), free(trace[2]);
    }
    CHECK_CUDA(cudaFree(logits));
    CHECK_CUDA(cudaFree(d_next));
    CHECK_CUDA(cudaFreeHost(h_next));
    target_cuda_destroy(&m);
    return 0;
}
