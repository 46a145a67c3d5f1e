/* embedding: CPU gather of table rows by token id. */
#include "embedding.h"

#include <string.h>

#include "util.h"

void embedding_forward_cpu(float *out, const int32_t *ids, int n, const float *table, int vocab, int dim)
{
    DF_ASSERT(n >= 0 && dim >= 0);
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        DF_ASSERT(id >= 0 && id < vocab);
        memcpy(out + (size_t)i * dim, table + (size_t)id * dim, (size_t)dim * sizeof *out);
    }
}
