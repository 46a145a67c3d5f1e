/* bench_drafter: the CUDA drafter backend's forward_backward on the Qwen3-8B drafter shape of
 * ../shared/bench/torch_drafter_anchor.py (5 layers, H 4096, 32/8 heads, head_dim 128, I 12288, V 151936, K = 5
 * taps; one sequence of 3072 tokens, 512 anchors x block 16), or with --family qwen3_5 the drafter a job derives
 * from the Qwen3.5-9B-shaped target of qwen35_9b.h (job_plan's derive_drafter: hf_config_as_qwen3, 16/4 heads of
 * 256, V 248320, theta 1e7, taps [1, 8, 15, 22, 29] of its 32 layers, mask token V - 1), random bf16 weights, taps and frozen tables made on
 * the GPU (rand_fill, nothing downloaded). Warm-up at the shape, then --iters timed steps (each the backend op:
 * anchors on the host, upload, forward, loss, backward, metrics back, one host wait at its end) between CUDA events;
 * then one instrumented step for the split by kernel group; then the optimizer the reducer runs after it
 * (grad_sq_sum_cuda + adamw_apply_cuda over the flat fp32 state), timed alone. Useful FLOPs are counted exactly as
 * torch_drafter_anchor.py counts them (its anchors term with this run's anchors).
 * usage: bench_drafter [--family qwen3|qwen3_5] [--iters N] [--layers L] [--tflops R] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "adamw.h"
#include "anchors.h"
#include "cuda_check.h"
#include "drafter_cuda.h"
#include "drafter_layout.h"
#include "qwen35_9b.h"
#include "rand_fill.h"
#include "util.h"

int main(int argc, char **argv)
{
    int iters = 5, layers = 5, hybrid = 0;
    double tflops = 790.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            const char *f = argv[++i];
            if (strcmp(f, "qwen3") && strcmp(f, "qwen3_5")) {
                fprintf(stderr, "bench_drafter: --family %s: expected qwen3 or qwen3_5\n", f);
                return 2;
            }
            hybrid = !strcmp(f, "qwen3_5");
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tflops") && i + 1 < argc) tflops = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--family qwen3|qwen3_5] [--iters N] [--layers L] [--tflops R]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || layers < 1) {
        fprintf(stderr, "bench_drafter: --iters and --layers must be >= 1\n");
        return 2;
    }
    const int S = 3072, NANCH = 512, B = 16, K = 5;
    hf_config cfg = {0};
    if (hybrid) { /* as job_plan's derive_drafter on the 32-layer target */
        const int taps[5] = {1, 8, 15, 22, 29};
        qwen35_9b_config(&cfg, 32, 0);
        cfg.is_dflash = 1, cfg.num_layers = layers, cfg.block_size = B, cfg.num_target_layers = 32;
        cfg.mask_token_id = cfg.vocab_size - 1, cfg.num_taps = K;
        for (int i = 0; i < K; i++) cfg.taps[i] = taps[i];
        hf_config_as_qwen3(&cfg);
    } else {
        const int taps[5] = {1, 9, 17, 25, 33};
        cfg.arch = HF_ARCH_QWEN3;
        snprintf(cfg.model_type, sizeof cfg.model_type, "qwen3");
        cfg.hidden_size = 4096, cfg.num_layers = layers, cfg.num_heads = 32, cfg.num_kv_heads = 8, cfg.head_dim = 128;
        cfg.intermediate_size = 12288, cfg.vocab_size = 151936, cfg.rms_eps = 1e-6, cfg.rope_theta = 1e6;
        cfg.has_qk_norm = 1, cfg.max_position = 40960, cfg.is_dflash = 1, cfg.block_size = B;
        cfg.num_target_layers = 36, cfg.mask_token_id = 151669, cfg.num_taps = K;
        for (int i = 0; i < K; i++) cfg.taps[i] = taps[i];
        snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "bfloat16");
    }
    const int H = cfg.hidden_size, V = cfg.vocab_size, I = cfg.intermediate_size;
    const int NH = cfg.num_heads, NKV = cfg.num_kv_heads, HD = cfg.head_dim;

    CHECK_CUDA(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    size_t free0 = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free0, &total));

    drafter_train_config tc = {.drafter = &cfg, .max_anchors = NANCH, .seed = 1, .gamma = 7.0};
    errbuf err = {{0}};
    drafter_backend *be = NULL;
    if (drafter_cuda_create_random(&be, &tc, 99, 0, S, 1, &err)) {
        fprintf(stderr, "bench_drafter: %s\n", err.msg);
        return 1;
    }
    cudaStream_t st = (cudaStream_t)drafter_cuda_stream(be);

    /* the reducer's buffers: bf16 weights of step k, fp32 gradients; the slot's taps */
    drafter_layout L;
    drafter_layout_init(&L, &cfg);
    const size_t numel = L.numel;
    uint16_t *w = NULL, *aux = NULL;
    float *g = NULL;
    CHECK_CUDA(cudaMalloc((void **)&w, numel * 2));
    CHECK_CUDA(cudaMalloc((void **)&g, numel * 4));
    CHECK_CUDA(cudaMalloc((void **)&aux, (size_t)S * K * H * 2));
    const float a = 0.02f * sqrtf(3.0f);
    for (int i = 0; i < L.nparams; i++) {
        const drafter_param *p = &L.params[i];
        if (p->ndim == 2) rand_fill_bf16_cuda(w + p->offset, p->numel, 1000 + i, a, 0.0f, st);
        else rand_fill_bf16_cuda(w + p->offset, p->numel, 1000 + i, 0.0f, 1.0f, st);
    }
    rand_fill_bf16_cuda(aux, (size_t)S * K * H, 7, sqrtf(3.0f), 0.0f, st); /* std 1, as torch.randn */
    CHECK_CUDA(cudaMemsetAsync(g, 0, numel * 4, st));

    int32_t *ids = xmalloc(sizeof(int32_t) * S), *pos = xmalloc(sizeof(int32_t) * S), cu[2] = {0, S};
    uint8_t *lm = xmalloc(S);
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < S; t++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        ids[t] = (int32_t)((rs >> 33) % (uint64_t)(V - 300)), pos[t] = t, lm[t] = 1;
    }
    drafter_batch bt = {.id = 5, .ntok = S, .nseq = 1, .aux = aux, .input_ids = ids, .positions = pos,
                        .cu_seqlens = cu, .loss_mask = lm};
    /* the anchors the backend draws (the same call): N and Σ anchors for the FLOP count */
    int32_t *anc = NULL, *anc_seq = NULL;
    int N = anchors_sample(cu, 1, lm, NANCH, tc.seed, 0, bt.id, &anc, &anc_seq);
    double anc_sum = 0;
    for (int j = 0; j < N; j++) anc_sum += anc[j];
    free(anc), free(anc_seq);

    /* warm-up at the (only, hence largest) shape: cuBLASLt choices, module loading */
    drafter_metrics mt;
    for (int it = 0; it < 2; it++)
        if (be->ops->forward_backward(be, w, g, &bt, &mt, &err)) {
            fprintf(stderr, "bench_drafter: %s\n", err.msg);
            return 1;
        }
    CHECK_CUDA(cudaDeviceSynchronize());
    size_t free1 = 0;
    CHECK_CUDA(cudaMemGetInfo(&free1, &total));

    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    float ms_steps = 0;
    CHECK_CUDA(cudaEventRecord(t0, st));
    for (int it = 0; it < iters; it++)
        if (be->ops->forward_backward(be, w, g, &bt, &mt, &err)) {
            fprintf(stderr, "bench_drafter: %s\n", err.msg);
            return 1;
        }
    CHECK_CUDA(cudaEventRecord(t1, st));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaEventElapsedTime(&ms_steps, t0, t1));
    const double step_ms = ms_steps / iters;

    double cls[DRAFTER_CUDA_NCLASS];
    drafter_cuda_set_profiling(be, 1);
    if (be->ops->forward_backward(be, w, g, &bt, &mt, &err)) return 1;
    drafter_cuda_profile(be, cls);
    drafter_cuda_set_profiling(be, 0);

    /* sanity: the gradients are finite */
    size_t bad = 0;
    {
        const size_t chunk = (size_t)1 << 26;
        float *h = xmalloc(chunk * 4);
        for (size_t off = 0; off < numel; off += chunk) {
            size_t n = numel - off < chunk ? numel - off : chunk;
            CHECK_CUDA(cudaMemcpy(h, g + off, n * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; i++) bad += !isfinite(h[i]);
        }
        free(h);
    }

    /* the optimizer after the step (the reducer's part): Σ (g/Σw)², then clip + AdamW from fp32 state into fp32
     * state (in place here) and a bf16 copy */
    float *w32 = NULL, *m = NULL, *v = NULL;
    double *sq = NULL;
    void *gws = NULL;
    adamw_range *ranges = NULL;
    int *skipped = NULL;
    CHECK_CUDA(cudaMalloc((void **)&w32, numel * 4));
    CHECK_CUDA(cudaMalloc((void **)&m, numel * 4));
    CHECK_CUDA(cudaMalloc((void **)&v, numel * 4));
    CHECK_CUDA(cudaMalloc((void **)&sq, sizeof(double)));
    CHECK_CUDA(cudaMalloc(&gws, grad_sq_sum_cuda_workspace(numel)));
    CHECK_CUDA(cudaMalloc((void **)&skipped, sizeof(int)));
    adamw_range *hr = xcalloc((size_t)L.nparams, sizeof *hr);
    for (int i = 0; i < L.nparams; i++)
        hr[i] = (adamw_range){.offset = L.params[i].offset, .numel = L.params[i].numel, .decay = L.params[i].decay};
    CHECK_CUDA(cudaMalloc((void **)&ranges, sizeof *hr * (size_t)L.nparams));
    CHECK_CUDA(cudaMemcpy(ranges, hr, sizeof *hr * (size_t)L.nparams, cudaMemcpyHostToDevice));
    free(hr);
    CHECK_CUDA(cudaMemsetAsync(w32, 0, numel * 4, st));
    CHECK_CUDA(cudaMemsetAsync(m, 0, numel * 4, st));
    CHECK_CUDA(cudaMemsetAsync(v, 0, numel * 4, st));
    adamw_params ap = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
    uint16_t *wcopy = NULL; /* bf16 output of the optimizer: not the step's weights, so the step stays comparable */
    CHECK_CUDA(cudaMalloc((void **)&wcopy, numel * 2));
    for (int it = 0; it < 2; it++) {
        grad_sq_sum_cuda(sq, g, numel, 1.0f / 8000.0f, gws, st);
        adamw_apply_cuda(w32, m, v, wcopy, w32, m, v, g, 1.0f / 8000.0f, numel, ranges, L.nparams, sq, NULL, 1.0f,
                         &ap, 1, skipped, st);
    }
    float ms_opt = 0;
    CHECK_CUDA(cudaEventRecord(t0, st));
    for (int it = 0; it < iters; it++) {
        grad_sq_sum_cuda(sq, g, numel, 1.0f / 8000.0f, gws, st);
        adamw_apply_cuda(w32, m, v, wcopy, w32, m, v, g, 1.0f / 8000.0f, numel, ranges, L.nparams, sq, NULL, 1.0f,
                         &ap, 1 + it, skipped, st);
    }
    CHECK_CUDA(cudaEventRecord(t1, st));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaEventElapsedTime(&ms_opt, t0, t1));
    const double opt_ms = ms_opt / iters;
    size_t free2 = 0;
    CHECK_CUDA(cudaMemGetInfo(&free2, &total));

    /* FLOPs exactly as torch_drafter_anchor.py */
    const double Q = (double)N * B, Hd = H, Id = I, qdd = (double)NH * HD, kdd = (double)NKV * HD;
    const double per_layer = 2 * Hd * qdd * Q + 4 * Hd * kdd * (S + Q) + 2 * qdd * Hd * Q + 6 * Hd * Id * Q;
    const double fc_numel = (double)H * K * H;
    const double gemm_flop = 3.0 * layers * per_layer + 4 * fc_numel * S;
    const double ce_flop = 4 * Hd * V * Q;
    const double attn_flop = layers * 12.0 * qdd * B * (B * (double)N + anc_sum);
    const double flops = gemm_flop + ce_flop + attn_flop;
    const double tf = flops / (step_ms / 1e3) / 1e12, tf_all = flops / ((step_ms + opt_ms) / 1e3) / 1e12;

    double prof_total = 0;
    for (int i = 0; i < DRAFTER_CUDA_NCLASS; i++) prof_total += cls[i];
    printf("device: %s, %d SMs; drafter: %.3fB trainable, %d layers, H %d, %d/%d heads x %d, I %d, V %d, K %d; "
           "seq %d, %d anchors x block %d = %.0f block tokens\n",
           prop.name, prop.multiProcessorCount, numel / 1e9, layers, H, NH, NKV, HD, I, V, K, S, N, B, Q);
    printf("dflash drafter forward_backward: %.1f ms/step (%d iters), %.0f TFLOP/s useful, %.1f%% of %.0f TFLOP/s\n",
           step_ms, iters, tf, 100 * tf / tflops, tflops);
    printf("dflash drafter step + optimizer (grad norm + AdamW %.1f ms): %.1f ms -> %.2f seq/s, %.0f block tok/s, "
           "%.0f TFLOP/s useful (%.1f%% of %.0f)\n",
           opt_ms, step_ms + opt_ms, 1e3 / (step_ms + opt_ms), Q * 1e3 / (step_ms + opt_ms), tf_all,
           100 * tf_all / tflops, tflops);
    printf("time split (instrumented step, %.1f ms of device time): GEMMs %.1f ms (%.0f TFLOP/s), attention fwd %.1f "
           "ms + bwd %.1f ms (%.0f TFLOP/s useful), cross-entropy %.1f ms (%.0f TFLOP/s), the rest %.1f ms\n",
           prof_total, cls[DRAFTER_CUDA_GEMM], gemm_flop / (cls[DRAFTER_CUDA_GEMM] / 1e3) / 1e12,
           cls[DRAFTER_CUDA_ATTN_FWD], cls[DRAFTER_CUDA_ATTN_BWD],
           attn_flop / ((cls[DRAFTER_CUDA_ATTN_FWD] + cls[DRAFTER_CUDA_ATTN_BWD]) / 1e3) / 1e12, cls[DRAFTER_CUDA_CE],
           ce_flop / (cls[DRAFTER_CUDA_CE] / 1e3) / 1e12, cls[DRAFTER_CUDA_OTHER]);
    printf("useful GFLOP/step: %.1f (GEMMs %.1f, lm_head %.1f, attention %.1f); ideal at %.0f TFLOP/s: %.1f ms\n",
           flops / 1e9, gemm_flop / 1e9, ce_flop / 1e9, attn_flop / 1e9, tflops, flops / (tflops * 1e12) * 1e3);
    printf("peak GPU memory: %.2f GiB in use after warm-up (backend %.2f GiB incl. frozen tables %.2f GiB; bf16 "
           "weights %.2f GiB, fp32 grads %.2f GiB, taps %.2f GiB); %.2f GiB with the optimizer state\n",
           (double)(total - free1) / (1 << 30), (double)drafter_cuda_device_bytes(be) / (1 << 30),
           2.0 * V * H * 2 / (1 << 30), numel * 2.0 / (1 << 30), numel * 4.0 / (1 << 30),
           (double)S * K * H * 2 / (1 << 30), (double)(total - free2) / (1 << 30));
    printf("metrics of the last step: loss %.4f over %.0f weight, acceptance %.3f, %zu non-finite gradients\n",
           mt.loss_sum / mt.weight_sum, mt.weight_sum, drafter_metrics_acceptance(&mt), bad);
    (void)free0;

    CHECK_CUDA(cudaEventDestroy(t0));
    CHECK_CUDA(cudaEventDestroy(t1));
    void *bufs[] = {w, g, aux, w32, m, v, sq, gws, skipped, ranges, wcopy};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CHECK_CUDA(cudaFree(bufs[i]));
    drafter_backend_destroy(&be);
    drafter_layout_destroy(&L);
    free(ids), free(pos), free(lm);
    return bad ? 1 : 0;
}
