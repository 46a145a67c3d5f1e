/* tests/gptoss_flow.h, the CPU transcription of the CUDA gpt_oss forward that test_target_gpu measures the bf16
 * distance with: in fp32 it is the CPU forward (target_model_forward) on each gptoss golden, so the transcription
 * computes the model; with bf16 roundings it lands a bf16-sized distance away (printed: the size the GPU's error
 * is held to). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/gptoss_flow.h"
#include "tests/test.h"

/* max |a - ref| / max(1, max |ref|) (test_target_gpu's second metric) */
static double max_rel(const float *a, const float *ref, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - ref[i])), m = fmax(m, fabs(ref[i]));
    return e / fmax(1.0, m);
}

static double norm_rel(const float *a, const float *ref, size_t n)
{
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) se += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), sr += (double)ref[i] * ref[i];
    return sqrt(se / (sr > 0 ? sr : 1));
}

TEST(flow_is_the_cpu_forward_and_bf16_lands_near)
{
    const char *cases[] = {"gptoss-tiny", "gptoss-tiny-bf16", "gptoss-mxfp4"};
    for (int k = 0; k < 3; k++) {
        char dir[600], cs[600];
        snprintf(dir, sizeof dir, "%s/target", test_golden(cases[k]));
        snprintf(cs, sizeof cs, "%s/case.safetensors", test_golden(cases[k]));
        errbuf err = {{0}};
        st_file *st = NULL;
        int32_t *ids = NULL, *pos = NULL, *cu = NULL;
        size_t nids = 0, npos = 0, ncu = 0;
        REQUIRE(st_open(&st, cs, &err) == 0 && st_load_i32(st, "input_ids", &ids, &nids, &err) == 0 &&
                st_load_i32(st, "position_ids", &pos, &npos, &err) == 0 &&
                st_load_i32(st, "cu_seqlens", &cu, &ncu, &err) == 0);
        st_close(&st);
        target_batch b = {.ntok = (int)nids, .nseq = (int)ncu - 1, .input_ids = ids, .positions = pos,
                          .cu_seqlens = cu};
        target_model *m = NULL;
        REQUIRE(target_model_load(&m, dir, -1, &err) == 0);
        const hf_config *c = target_model_config(m);
        const int T = b.ntok, H = c->hidden_size, V = c->vocab_size, taps[2] = {0, c->num_layers - 1};
        float *aux = xmalloc(sizeof(float) * T * 2 * H), *logits = xmalloc(sizeof(float) * T * V);
        float *faux = xmalloc(sizeof(float) * T * 2 * H), *flog = xmalloc(sizeof(float) * T * V);
        REQUIRE(target_model_forward(m, &b, taps, 2, aux, NULL, logits, &err) == 0);
        gflow_forward(0, dir, &b, taps, 2, faux, NULL, flog);
        const double e32 = fmax(norm_rel(faux, aux, (size_t)T * 2 * H), norm_rel(flog, logits, (size_t)T * V));
        EXPECT(e32 < 1e-5);
        gflow_forward(1, dir, &b, taps, 2, faux, NULL, flog);
        const double ea = norm_rel(faux, aux, (size_t)T * 2 * H), el = norm_rel(flog, logits, (size_t)T * V);
        printf("  %s: fp32 flow vs forward %.2g; bf16 flow: taps %.3g / %.3g, logits %.3g / %.3g (norm / max)\n",
               cases[k], e32, ea, max_rel(faux, aux, (size_t)T * 2 * H), el, max_rel(flog, logits, (size_t)T * V));
        EXPECT(ea > 1e-4 && el > 1e-4 && ea < 0.5 && el < 0.5); /* rounded, and still the same model */
        target_model_destroy(&m);
        free(aux), free(logits), free(faux), free(flog), free(ids), free(pos), free(cu);
    }
}

TEST_MAIN
