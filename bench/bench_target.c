/* bench_target: the CUDA target step on the Qwen3-8B shape (36 layers, random bf16 weights made on the GPU, nothing
 * downloaded) over the benchmark batch of ../shared/bench/README.md (16 sequences, 19218 tokens), taps
 * [1, 9, 17, 25, 33] captured into a (T, 5*4096) slot buffer plus the last layer's output. One step = forward +
 * capture (done by the GEMM epilogues) + publication (an event recorded after the step; the host waits on that
 * event only). Prints tokens/s, useful TFLOP/s counted as torch_target_anchor.py counts them, the share of
 * 790 TFLOP/s, peak device memory and the time split by kernel class (from a separate instrumented step).
 * --family qwen3_5: the Qwen3.5-9B-shaped hybrid target instead (bench/qwen35_9b.h: 32 layers, 3 Gated DeltaNet : 1
 * gated attention), taps [1, 9, 17, 25] (those below the layer count), the split adding the delta rule's time.
 * --family qwen3_5_moe: the Qwen3.5-35B-A3B-shaped hybrid MoE target (bench/qwen35_a3b.h: 40 layers, 256 experts,
 * 8 routed + 1 shared); useful FLOPs count the active parameters (router, 8 routed and the shared expert).
 * --family gpt_oss: the gpt-oss-20b shape (bench/gpt_oss_20b.h, read by hf_config_parse: 24 layers alternating
 * sliding-window 128 and full attention with sinks and biases, 32 experts of 2880, top 4, clamped SwiGLU, YaRN);
 * useful FLOPs count the active parameters (router, 4 experts, biases) and each layer's attended keys.
 * --family qwen3_moe: the Qwen3-30B-A3B-shaped MoE target (bench/qwen3_30b_a3b.h: 48 layers, Qwen3 attention 32/4
 * heads of 128, 128 experts of width 768, 8 routed, no shared expert); useful FLOPs count the router and 8 experts.
 * usage: bench_target [--family qwen3|qwen3_5|qwen3_5_moe|qwen3_moe|gpt_oss] [--iters N] [--layers L] [--vocab V]
 *                     [--tflops R] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "bench_shapes.h"
#include "target_model_cuda.h"
#include "util.h"

static const int kLengths[] = {773, 1876, 1186, 496, 1599, 909, 2012, 1322, 632, 1735, 1045, 355, 1458, 768, 1871, 1181};
static const int kTaps[] = {1, 9, 17, 25, 33};

int main(int argc, char **argv)
{
    int iters = 10, layers = -1, vocab = 0;
    const bench_shape *shape = &bench_shapes[0];
    double tflops = 790.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            if (!(shape = bench_shape_find("bench_target", argv[++i]))) return 2;
        } else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tflops") && i + 1 < argc) tflops = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--family qwen3|qwen3_5|qwen3_5_moe|qwen3_moe|gpt_oss] [--iters N] [--layers L] "
                            "[--vocab V] [--tflops R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (layers < 0) layers = shape->layers;
    if (iters < 1 || layers < 2 || layers > shape->layers) {
        fprintf(stderr, "bench_target: --iters must be >= 1 and --layers 2..%d (the %s shape's depth)\n",
                shape->layers, shape->family);
        return 2;
    }
    hf_config cfg;
    errbuf perr = {{0}};
    if (shape->config(&cfg, layers, vocab, &perr)) {
        fprintf(stderr, "bench_target: --family %s: %s\n", shape->family, perr.msg);
        return 1;
    }

    const int nseq = (int)(sizeof kLengths / sizeof kLengths[0]);
    int T = 0;
    for (int s = 0; s < nseq; s++) T += kLengths[s];
    int ntaps = 0, taps[8];
    for (size_t i = 0; i < sizeof kTaps / sizeof kTaps[0]; i++)
        if (kTaps[i] < layers) taps[ntaps++] = kTaps[i];
    const int H = cfg.hidden_size;

    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    size_t free0 = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free0, &total));

    errbuf err = {{0}};
    target_cuda *m = NULL;
    if (target_cuda_init_random(&m, &cfg, 1234, 0.02f, T, nseq, NULL, &err)) {
        fprintf(stderr, "bench_target: %s\n", err.msg);
        return 1;
    }
    cudaStream_t st = (cudaStream_t)target_cuda_stream(m);

    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)T), *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t cu[17];
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    cu[0] = 0;
    for (int s = 0, t = 0; s < nseq; s++) {
        cu[s + 1] = cu[s] + kLengths[s];
        for (int j = 0; j < kLengths[s]; j++, t++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            ids[t] = (int32_t)((rs >> 33) % (uint64_t)cfg.vocab_size), pos[t] = j;
        }
    }
    target_batch b = {.ntok = T, .nseq = nseq, .input_ids = ids, .positions = pos, .cu_seqlens = cu};

    /* the slot: (T, ntaps*H) taps, and the last layer's output (T, H) */
    uint16_t *slot = NULL, *last = NULL;
    CHECK_CUDA(cudaMalloc((void **)&slot, (size_t)T * ntaps * H * 2));
    CHECK_CUDA(cudaMalloc((void **)&last, (size_t)T * H * 2));
    cudaEvent_t published, t0, t1;
    CHECK_CUDA(cudaEventCreateWithFlags(&published, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));

    /* warm-up with the largest (the only) shape: settles cuBLASLt's algorithm choices and module loading */
    if (target_cuda_forward(m, &b, taps, ntaps, slot, ntaps * H, last, NULL, &err)) {
        fprintf(stderr, "bench_target: %s\n", err.msg);
        return 1;
    }
    CHECK_CUDA(cudaStreamSynchronize(st));
    size_t free1 = 0;
    CHECK_CUDA(cudaMemGetInfo(&free1, &total));

    /* full steps: forward, publish (event), host waits on the event */
    float ms_steps = 0;
    CHECK_CUDA(cudaEventRecord(t0, st));
    for (int it = 0; it < iters; it++) {
        if (target_cuda_forward(m, &b, taps, ntaps, slot, ntaps * H, last, NULL, &err)) {
            fprintf(stderr, "bench_target: %s\n", err.msg);
            return 1;
        }
        CHECK_CUDA(cudaEventRecord(published, st));
        CHECK_CUDA(cudaEventSynchronize(published));
    }
    CHECK_CUDA(cudaEventRecord(t1, st));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaEventElapsedTime(&ms_steps, t0, t1));
    /* forwards back to back (no publication wait between them) */
    float ms_fwd = 0;
    CHECK_CUDA(cudaEventRecord(t0, st));
    for (int it = 0; it < iters; it++)
        if (target_cuda_forward(m, &b, taps, ntaps, slot, ntaps * H, last, NULL, &err)) return 1;
    CHECK_CUDA(cudaEventRecord(t1, st));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaEventElapsedTime(&ms_fwd, t0, t1));
    /* one instrumented step: device time per kernel class */
    double cls[TARGET_CUDA_NCLASS];
    target_cuda_set_profiling(m, 1);
    if (target_cuda_forward(m, &b, taps, ntaps, slot, ntaps * H, last, NULL, &err)) return 1;
    target_cuda_profile(m, cls);
    target_cuda_set_profiling(m, 0);
    CHECK_CUDA(cudaStreamSynchronize(st));

    /* sanity: every captured value finite */
    size_t nslot = (size_t)T * ntaps * H, bad = 0;
    uint16_t *h = xmalloc(nslot * 2);
    CHECK_CUDA(cudaMemcpy(h, slot, nslot * 2, cudaMemcpyDeviceToHost));
    double amax = 0;
    for (size_t i = 0; i < nslot; i++) {
        float f = bf16_to_f32(h[i]);
        if (!isfinite(f)) bad++;
        else amax = fmax(amax, fabs(f));
    }
    free(h);

    /* FLOPs as torch_target_anchor.py: 2 x the non-embedding parameters a token uses + attention (bench_shapes.h) */
    const double nonembed = shape->params_tok(&cfg), attn = bench_attention_flops_tok(&cfg, kLengths, nseq);
    double flops_tok = 2 * nonembed + attn;

    double step_s = ms_steps / 1e3 / iters, fwd_s = ms_fwd / 1e3 / iters;
    double tok_s = T / step_s, tf = flops_tok * T / step_s / 1e12;
    double prof_total = 0;
    for (int i = 0; i < TARGET_CUDA_NCLASS; i++) prof_total += cls[i];
    double publish_ms = (step_s - fwd_s) * 1e3;
    printf("device: %s, %d SMs; batch: %d sequences, %d tokens; %s target, %d layers, vocab %d, taps", prop.name,
           prop.multiProcessorCount, nseq, T,
           shape->about, layers, cfg.vocab_size);
    for (int i = 0; i < ntaps; i++) printf(" %d", taps[i]);
    printf(" + last\n");
    printf("dflash target step (forward + capture + publish): %.0f tok/s (%.1f ms/step, %d iters), %.0f TFLOP/s "
           "useful, %.1f%% of %.0f TFLOP/s\n",
           tok_s, step_s * 1e3, iters, tf, 100 * tf / tflops, tflops);
    printf("dflash forward alone (back to back): %.0f tok/s (%.1f ms)\n", T / fwd_s, fwd_s * 1e3);
    printf("ideal at %.0f TFLOP/s: %.0f tok/s (%.2f GFLOP/token)\n", tflops, tflops * 1e12 / flops_tok,
           flops_tok / 1e9);
    printf("time split (instrumented step, %.1f ms of device time): matmul %.1f ms (%.1f%%), attention %.1f ms "
           "(%.1f%%), delta rule %.1f ms (%.1f%%), other kernels %.1f ms (%.1f%%), capture copies %.2f ms; publication "
           "(step - forward) %.2f ms (%.2f%%)\n",
           prof_total, cls[TARGET_CUDA_MATMUL], 100 * cls[TARGET_CUDA_MATMUL] / prof_total, cls[TARGET_CUDA_ATTENTION],
           100 * cls[TARGET_CUDA_ATTENTION] / prof_total, cls[TARGET_CUDA_DELTA_RULE],
           100 * cls[TARGET_CUDA_DELTA_RULE] / prof_total, cls[TARGET_CUDA_OTHER],
           100 * cls[TARGET_CUDA_OTHER] / prof_total, cls[TARGET_CUDA_COPY], publish_ms,
           100 * publish_ms / (step_s * 1e3));
    double gemm_flop = 2 * nonembed * T, attn_flop = attn * T;
    printf("rates: matmul %.0f TFLOP/s, attention %.0f TFLOP/s (causal useful FLOPs)\n",
           gemm_flop / (cls[TARGET_CUDA_MATMUL] / 1e3) / 1e12, attn_flop / (cls[TARGET_CUDA_ATTENTION] / 1e3) / 1e12);
    printf("peak GPU memory: %.2f GiB in use on the device after warm-up (nothing is allocated later); model "
           "allocations %.2f GiB + slot %.2f GiB\n",
           (double)(total - free1) / (1 << 30), (double)target_cuda_device_bytes(m) / (1 << 30),
           (double)((size_t)T * (ntaps + 1) * H * 2) / (1 << 30));
    printf("captured values: %zu non-finite, max |value| %.3g\n", bad, amax);
    (void)free0;

    CHECK_CUDA(cudaFree(slot));
    CHECK_CUDA(cudaFree(last));
    CHECK_CUDA(cudaEventDestroy(published));
    CHECK_CUDA(cudaEventDestroy(t0));
    CHECK_CUDA(cudaEventDestroy(t1));
    target_cuda_destroy(&m);
    free(ids), free(pos);
    return bad ? 1 : 0;
}
