#include "step_plan.h"

#include <stdio.h>

void step_plan_describe(const step_plan *p, char *out, size_t n)
{
    size_t m = 0;
    out[0] = 0;
    for (uint32_t i = 1; i < p->n && m < n; i++) {
        const step_plan_segment *a = &p->seg[i - 1], *b = &p->seg[i];
        m += (size_t)snprintf(out + m, n - m, "%sstep %llu:", i > 1 ? "; " : "", (unsigned long long)b->from_step);
        if (m < n && a->drafters != b->drafters)
            m += (size_t)snprintf(out + m, n - m, " drafters %u -> %u", a->drafters, b->drafters);
        if (m < n && a->targets != b->targets)
            m += (size_t)snprintf(out + m, n - m, "%s targets %u -> %u", a->drafters != b->drafters ? "," : "",
                                  a->targets, b->targets);
    }
}
