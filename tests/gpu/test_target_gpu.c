/* The CUDA target forward against the CPU forward (target_model.c) on the golden checkpoints
 * ($DFLASH_GOLDENS/{tiny,tiny-bf16}, default tests/goldens) and on a random checkpoint with two layers of the
 * Qwen3-8B shape written to a temporary folder; then the hybrid (Qwen3.5) family: the goldens qwen35-tiny and
 * qwen35moe-tiny, and random checkpoints of the Qwen3.5-9B layer shape (4 layers: 3 Gated DeltaNet, 1 gated
 * attention) and of a Qwen3.5-MoE shape (64 experts, top 8, shared expert; 2 layers). Compares taps (one tapped twice, one the last layer), the last
 * hidden state and the logits; a second pass loads only the layers the taps need. The GPU runs bf16 weights and
 * activations with fp32 accumulation, the CPU fp32 throughout: errors are bf16-sized and grow with depth.
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "gpu_test.h"
#include "rand_fill.h"
#include "safetensors.h"
#include "target_model.h"
#include "target_model_cuda.h"
#include "util.h"

/* ‖gpu − cpu‖/‖cpu‖ and max|gpu − cpu| / max(1, max|cpu|). A bf16 checkpoint's weights are the same on both
 * sides; an fp32 checkpoint's weights are rounded to bf16 on the GPU (2^-9 relative each), which adds its own
 * error through every layer: 3e-2 there. */
#define TOL_NORM_REL_BF16 2e-2
#define TOL_NORM_REL_F32 3e-2
#define TOL_MAX_REL 6e-2
static double tol_norm_rel = TOL_NORM_REL_BF16;

static void compare(const char *name, const uint16_t *d_got, const float *ref, size_t n)
{
    uint16_t *got = xmalloc(n * 2);
    CHECK_CUDA(cudaMemcpy(got, d_got, n * 2, cudaMemcpyDeviceToHost));
    compare_bf16(name, got, ref, n, tol_norm_rel, TOL_MAX_REL);
    free(got);
}

/* Full forward (taps incl. a duplicate and the last layer, last, logits), then a partial model with shallow taps. */
static void check_model(const char *label, const char *dir, const target_batch *b)
{
    errbuf err = {{0}};
    target_model *cpu = NULL;
    target_cuda *gpu = NULL;
    if (target_model_load(&cpu, dir, -1, &err) || target_cuda_load(&gpu, dir, -1, b->ntok, b->nseq, NULL, &err)) {
        printf("FAIL %s load: %s\n", label, err.msg);
        failures++;
        target_model_destroy(&cpu);
        return;
    }
    const hf_config *c = target_model_config(cpu);
    int L = c->num_layers, H = c->hidden_size, V = c->vocab_size, T = b->ntok;
    int taps[4] = {L > 2 ? 1 : 0, L / 2, L / 2, L - 1}, ntaps = 4;
    size_t naux = (size_t)T * ntaps * H;
    float *aux = xmalloc(naux * 4), *last = xmalloc((size_t)T * H * 4), *logits = xmalloc((size_t)T * V * 4);
    if (target_model_forward(cpu, b, taps, ntaps, aux, last, logits, &err)) {
        printf("FAIL %s cpu forward: %s\n", label, err.msg);
        failures++;
        goto out;
    }
    uint16_t *d_aux = dev_poisoned(naux), *d_last = dev_poisoned((size_t)T * H), *d_logits = dev_poisoned((size_t)T * V);
    if (target_cuda_forward(gpu, b, taps, ntaps, d_aux, ntaps * H, d_last, d_logits, &err)) {
        printf("FAIL %s gpu forward: %s\n", label, err.msg);
        failures++;
    } else {
        CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)target_cuda_stream(gpu)));
        char name[256];
        snprintf(name, sizeof name, "%s aux_hidden taps=[%d,%d,%d,%d]", label, taps[0], taps[1], taps[2], taps[3]);
        compare(name, d_aux, aux, naux);
        snprintf(name, sizeof name, "%s last_hidden", label);
        compare(name, d_last, last, (size_t)T * H);
        snprintf(name, sizeof name, "%s logits", label);
        compare(name, d_logits, logits, (size_t)T * V);
    }
    CHECK_CUDA(cudaFree(d_aux));
    CHECK_CUDA(cudaFree(d_last));
    CHECK_CUDA(cudaFree(d_logits));
    target_cuda_destroy(&gpu);

    /* partial load: layers [0, L/2] only, taps ending there; the stride leaves a gap column block (poisoned, unread) */
    int ptaps[2] = {L / 2, 0};
    int ld = 3 * H;
    if (target_cuda_load(&gpu, dir, L / 2, b->ntok, b->nseq, NULL, &err) ||
        target_model_forward(cpu, b, ptaps, 2, aux, NULL, NULL, &err)) {
        printf("FAIL %s partial: %s\n", label, err.msg);
        failures++;
        goto out;
    }
    d_aux = dev_poisoned((size_t)T * ld);
    if (target_cuda_forward(gpu, b, ptaps, 2, d_aux, ld, NULL, NULL, &err)) {
        printf("FAIL %s partial gpu forward: %s\n", label, err.msg);
        failures++;
    } else {
        CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)target_cuda_stream(gpu)));
        uint16_t *packed = NULL;
        CHECK_CUDA(cudaMalloc((void **)&packed, (size_t)T * 2 * H * 2));
        CHECK_CUDA(cudaMemcpy2D(packed, (size_t)2 * H * 2, d_aux, (size_t)ld * 2, (size_t)2 * H * 2, (size_t)T,
                                cudaMemcpyDeviceToDevice));
        char name[256];
        snprintf(name, sizeof name, "%s partial(max_layer=%d) aux_hidden taps=[%d,%d] ld=%d", label, L / 2, ptaps[0],
                 ptaps[1], ld);
        compare(name, packed, aux, (size_t)T * 2 * H);
        CHECK_CUDA(cudaFree(packed));
        /* asking the partial model for logits is an error, as on the CPU */
        uint16_t *d_l = dev_poisoned((size_t)T * H);
        int rc = target_cuda_forward(gpu, b, ptaps, 2, d_aux, ld, d_l, NULL, &err);
        printf("%s %s partial model refuses last hidden (rc=%d: %s)\n", rc == -EINVAL ? "ok" : "FAIL", label, rc,
               err.msg);
        if (rc != -EINVAL) failures++;
        CHECK_CUDA(cudaFree(d_l));
    }
    CHECK_CUDA(cudaFree(d_aux));
out:
    target_cuda_destroy(&gpu);
    target_model_destroy(&cpu);
    free(aux), free(last), free(logits);
}

static void check_golden(const char *shared, const char *name)
{
    char dir[1024], casep[1024];
    snprintf(dir, sizeof dir, "%s/%s/target", shared, name);
    snprintf(casep, sizeof casep, "%s/%s/case.safetensors", shared, name);
    errbuf err = {{0}};
    st_file *st = NULL;
    int32_t *ids = NULL, *pos = NULL, *cu = NULL;
    size_t nids = 0, npos = 0, ncu = 0;
    if (st_open(&st, casep, &err) || st_load_i32(st, "input_ids", &ids, &nids, &err) ||
        st_load_i32(st, "position_ids", &pos, &npos, &err) || st_load_i32(st, "cu_seqlens", &cu, &ncu, &err)) {
        printf("FAIL golden %s: %s\n", name, err.msg);
        failures++;
    } else {
        target_batch b = {.ntok = (int)nids, .nseq = (int)ncu - 1, .input_ids = ids, .positions = pos,
                          .cu_seqlens = cu};
        char label[64];
        snprintf(label, sizeof label, "golden/%s", name);
        hf_config cfg;
        tol_norm_rel = !hf_config_load(&cfg, dir, &err) && !strcmp(cfg.torch_dtype, "float32") ? TOL_NORM_REL_F32
                                                                                                : TOL_NORM_REL_BF16;
        check_model(label, dir, &b);
        tol_norm_rel = TOL_NORM_REL_BF16;
    }
    st_close(&st);
    free(ids), free(pos), free(cu);
}

/* A tensor of rand_fill values as f32 for st_write (which stores bf16: the same values exactly). */
static float *rand_f32(size_t n, uint64_t seed, float scale, float bias)
{
    uint16_t *h = xmalloc(n * 2);
    rand_fill_bf16_cpu(h, n, seed, scale, bias);
    float *f = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* Two layers of the Qwen3-8B shape, random weights (std 0.02, tied embeddings), bf16 checkpoint in a temp dir. */
static void check_qwen3_8b_shape(void)
{
    const int H = 4096, NH = 32, NKV = 8, HD = 128, I = 12288, V = 151936, L = 2;
    char dir[] = "/tmp/dflash_target_gpu_XXXXXX";
    if (!mkdtemp(dir)) {
        printf("FAIL qwen3-8b-shape: mkdtemp: %s\n", strerror(errno));
        failures++;
        return;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": %d, "
            "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
            "\"intermediate_size\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, "
            "\"tie_word_embeddings\": true, \"max_position_embeddings\": 40960, \"torch_dtype\": \"bfloat16\"}\n",
            H, L, NH, NKV, HD, I, V);
    fclose(f);
    const float a = 0.02f * sqrtf(3.0f);
    enum { NT = 1 + 1 + 11 * 2 };
    st_write_tensor t[NT];
    char names[NT][96];
    int n = 0;
    uint64_t seed = 1000;
#define ADD(nm, d0, d1, scale, bias)                                                                   \
    do {                                                                                                \
        snprintf(names[n], sizeof names[n], "%s", nm);                                                  \
        t[n] = (st_write_tensor){.name = names[n], .dtype = ST_BF16, .ndim = (d1) > 0 ? 2 : 1,           \
                                 .shape = {(d0), (d1)}, .data = rand_f32((size_t)(d0) * ((d1) > 0 ? (d1) : 1), \
                                                                         seed++, scale, bias)};          \
        n++;                                                                                            \
    } while (0)
    ADD("model.embed_tokens.weight", V, H, a, 0.0f);
    ADD("model.norm.weight", H, 0, 0.1f, 1.0f);
    for (int l = 0; l < L; l++) {
        char p[96];
#define LAYER(suffix, d0, d1, scale, bias)                                    \
        snprintf(p, sizeof p, "model.layers.%d.%s", l, suffix);               \
        ADD(p, d0, d1, scale, bias)
        LAYER("input_layernorm.weight", H, 0, 0.1f, 1.0f);
        LAYER("post_attention_layernorm.weight", H, 0, 0.1f, 1.0f);
        LAYER("self_attn.q_norm.weight", HD, 0, 0.1f, 1.0f);
        LAYER("self_attn.k_norm.weight", HD, 0, 0.1f, 1.0f);
        LAYER("self_attn.q_proj.weight", NH * HD, H, a, 0.0f);
        LAYER("self_attn.k_proj.weight", NKV * HD, H, a, 0.0f);
        LAYER("self_attn.v_proj.weight", NKV * HD, H, a, 0.0f);
        LAYER("self_attn.o_proj.weight", H, NH * HD, a, 0.0f);
        LAYER("mlp.gate_proj.weight", I, H, a, 0.0f);
        LAYER("mlp.up_proj.weight", I, H, a, 0.0f);
        LAYER("mlp.down_proj.weight", H, I, a, 0.0f);
#undef LAYER
    }
#undef ADD
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(path, t, n, NULL, &err);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    if (rc) {
        printf("FAIL qwen3-8b-shape: %s\n", err.msg);
        failures++;
    } else {
        /* 3 sequences, 212 tokens, random ids */
        const int lens[3] = {37, 5, 170};
        int T = 212;
        int32_t ids[212], pos[212], cu[4] = {0, 37, 42, 212};
        uint64_t s = 99;
        for (int q = 0, tok = 0; q < 3; q++)
            for (int j = 0; j < lens[q]; j++, tok++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                ids[tok] = (int32_t)((s >> 33) % (uint64_t)V), pos[tok] = j;
            }
        target_batch b = {.ntok = T, .nseq = 3, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
        check_model("qwen3-8b-shape(2 layers)", dir, &b);
    }
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* A hybrid (Qwen3.5-style) checkpoint with random bf16 weights in a temp dir: the layer kinds of `kinds`
 * ('l' Gated DeltaNet, 'f' gated attention), dense MLP (E = 0) or MoE with transformers' fused expert tensors and a
 * shared expert. Zero-centred norms are stored as small w (the scale is 1 + w). */
typedef struct hybrid_spec {
    const char *kinds;
    int H, nh, nkv, hd, HK, HV, Dk, Dv, Kc, I, V, E, K, Im, Is;
} hybrid_spec;

static int write_hybrid_ckpt(const char *dir, const hybrid_spec *sp)
{
    const int L = (int)strlen(sp->kinds), H = sp->H, qd = sp->nh * sp->hd, kd = sp->nkv * sp->hd;
    const int C = 2 * sp->HK * sp->Dk + sp->HV * sp->Dv, VD = sp->HV * sp->Dv;
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": %d, "
            "\"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
            "\"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d, "
            "\"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": %d, "
            "\"rope_parameters\": {\"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25, \"rope_type\": \"default\"}, ",
            sp->E ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM", sp->E ? "qwen3_5_moe_text" : "qwen3_5_text", H, L,
            sp->nh, sp->nkv, sp->hd, sp->I, sp->V, sp->HK, sp->HV, sp->Dk, sp->Dv, sp->Kc);
    if (sp->E)
        fprintf(f, "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
                "\"shared_expert_intermediate_size\": %d, ", sp->E, sp->K, sp->Im, sp->Is);
    fprintf(f, "\"layer_types\": [");
    for (int l = 0; l < L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", sp->kinds[l] == 'l' ? "linear_attention" : "full_attention");
    fprintf(f, "]}\n");
    fclose(f);
    const float a = 0.02f * sqrtf(3.0f);
    int cap = 8 + L * 24, n = 0;
    st_write_tensor *t = xcalloc((size_t)cap, sizeof *t);
    char (*names)[96] = xcalloc((size_t)cap, sizeof *names);
    uint64_t seed = 2000;
#define HADD(nm, nd, d0, d1, d2, scale, bias)                                                                 \
    do {                                                                                                       \
        snprintf(names[n], sizeof names[n], "%s", nm);                                                         \
        size_t cnt_ = (size_t)(d0) * ((d1) > 0 ? (size_t)(d1) : 1) * ((d2) > 0 ? (size_t)(d2) : 1);            \
        t[n] = (st_write_tensor){.name = names[n], .dtype = ST_BF16, .ndim = (nd), .shape = {(d0), (d1), (d2)}, \
                                 .data = rand_f32(cnt_, seed++, scale, bias)};                                 \
        n++;                                                                                                   \
    } while (0)
    HADD("model.embed_tokens.weight", 2, sp->V, H, 0, a, 0.0f);
    HADD("model.norm.weight", 1, H, 0, 0, 0.1f, 0.0f);
    for (int l = 0; l < L; l++) {
        char p[128];
#define HL(suffix, nd, d0, d1, d2, scale, bias)                     \
        snprintf(p, sizeof p, "model.layers.%d.%s", l, suffix);     \
        HADD(p, nd, d0, d1, d2, scale, bias)
        HL("input_layernorm.weight", 1, H, 0, 0, 0.1f, 0.0f);
        HL("post_attention_layernorm.weight", 1, H, 0, 0, 0.1f, 0.0f);
        if (sp->kinds[l] == 'l') {
            HL("linear_attn.in_proj_qkv.weight", 2, C, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_z.weight", 2, VD, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_b.weight", 2, sp->HV, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_a.weight", 2, sp->HV, H, 0, a, 0.0f);
            HL("linear_attn.conv1d.weight", 3, C, 1, sp->Kc, 0.5f, 0.0f);
            HL("linear_attn.A_log", 1, sp->HV, 0, 0, 1.35f, 1.4f);
            HL("linear_attn.dt_bias", 1, sp->HV, 0, 0, 0.5f, 1.0f);
            HL("linear_attn.norm.weight", 1, sp->Dv, 0, 0, 0.1f, 1.0f);
            HL("linear_attn.out_proj.weight", 2, H, VD, 0, a, 0.0f);
        } else {
            HL("self_attn.q_proj.weight", 2, 2 * qd, H, 0, a, 0.0f);
            HL("self_attn.k_proj.weight", 2, kd, H, 0, a, 0.0f);
            HL("self_attn.v_proj.weight", 2, kd, H, 0, a, 0.0f);
            HL("self_attn.o_proj.weight", 2, H, qd, 0, a, 0.0f);
            HL("self_attn.q_norm.weight", 1, sp->hd, 0, 0, 0.1f, 0.0f);
            HL("self_attn.k_norm.weight", 1, sp->hd, 0, 0, 0.1f, 0.0f);
        }
        if (sp->E) {
            HL("mlp.gate.weight", 2, sp->E, H, 0, 0.2f, 0.0f);
            HL("mlp.experts.gate_up_proj", 3, sp->E, 2 * sp->Im, H, a, 0.0f);
            HL("mlp.experts.down_proj", 3, sp->E, H, sp->Im, a, 0.0f);
            HL("mlp.shared_expert.gate_proj.weight", 2, sp->Is, H, 0, a, 0.0f);
            HL("mlp.shared_expert.up_proj.weight", 2, sp->Is, H, 0, a, 0.0f);
            HL("mlp.shared_expert.down_proj.weight", 2, H, sp->Is, 0, a, 0.0f);
            HL("mlp.shared_expert_gate.weight", 2, 1, H, 0, a, 0.0f);
        } else {
            HL("mlp.gate_proj.weight", 2, sp->I, H, 0, a, 0.0f);
            HL("mlp.up_proj.weight", 2, sp->I, H, 0, a, 0.0f);
            HL("mlp.down_proj.weight", 2, H, sp->I, 0, a, 0.0f);
        }
#undef HL
    }
#undef HADD
    DF_ASSERT(n <= cap);
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(path, t, n, NULL, &err);
    if (rc) printf("FAIL hybrid checkpoint %s: %s\n", dir, err.msg);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    free(t), free(names);
    return rc;
}

/* Random hybrid checkpoints of real layer shapes, 3 packed sequences (37, 5, 170 tokens: 170 crosses the delta
 * rule's 64-token chunks twice). */
static void check_hybrid_shape(const char *label, const hybrid_spec *sp)
{
    char dir[] = "/tmp/dflash_target_hybrid_gpu_XXXXXX";
    if (!mkdtemp(dir)) {
        printf("FAIL %s: mkdtemp: %s\n", label, strerror(errno));
        failures++;
        return;
    }
    if (write_hybrid_ckpt(dir, sp)) {
        failures++;
    } else {
        const int lens[3] = {37, 5, 170};
        int T = 212;
        int32_t ids[212], pos[212], cu[4] = {0, 37, 42, 212};
        uint64_t s = 77;
        for (int q = 0, tok = 0; q < 3; q++)
            for (int j = 0; j < lens[q]; j++, tok++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                ids[tok] = (int32_t)((s >> 33) % (uint64_t)sp->V), pos[tok] = j;
            }
        target_batch b = {.ntok = T, .nseq = 3, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
        check_model(label, dir, &b);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("FAIL test_target_gpu: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    const char *shared = getenv("DFLASH_GOLDENS");
    if (!shared || !*shared) shared = "tests/goldens";
    check_golden(shared, "tiny");
    check_golden(shared, "tiny-bf16");
    check_qwen3_8b_shape();
    /* the hybrid family: goldens made by transformers' Qwen3.5 code (fp32), then real layer shapes */
    check_golden(shared, "qwen35-tiny");
    check_golden(shared, "qwen35moe-tiny");
    const hybrid_spec q35_9b = {.kinds = "lllf", .H = 4096, .nh = 16, .nkv = 4, .hd = 256, .HK = 16, .HV = 32,
                                .Dk = 128, .Dv = 128, .Kc = 4, .I = 12288, .V = 151936};
    check_hybrid_shape("qwen3.5-9b-shape(4 layers)", &q35_9b);
    const hybrid_spec q35_moe = {.kinds = "lf", .H = 2048, .nh = 16, .nkv = 2, .hd = 256, .HK = 16, .HV = 32,
                                 .Dk = 128, .Dv = 128, .Kc = 4, .I = 6144, .V = 8192, .E = 64, .K = 8, .Im = 512,
                                 .Is = 512};
    check_hybrid_shape("qwen3.5-moe-shape(2 layers, 64 experts)", &q35_moe);
    printf("test_target_gpu: %d case(s) failed\n", failures);
    return failures ? 1 : 0;
}
