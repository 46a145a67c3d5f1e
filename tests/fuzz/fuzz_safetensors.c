/* libFuzzer target: the input is a whole .safetensors file (in a memfd). st_open must reject malformed files with
 * an error and never crash; every tensor it accepts must be readable to its end. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) abort();
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_file *f = NULL;
    errbuf err;
    if (st_open(&f, path, &err) == 0) {
        (void)st_metadata(f, "format");
        for (int i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_at(f, i);
            if (st_find(f, t->name) != t) abort();
            if (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16) {
                float *v = NULL;
                size_t n = 0;
                if (st_load_f32(f, t->name, &v, -1, NULL, &n, &err) != 0) abort();
                if (st_read_f32(f, t->name, v, t->ndim, t->shape, &err) != 0) abort();
                free(v);
            } else if (t->dtype == ST_I32 || t->dtype == ST_I64) {
                int32_t *v = NULL;
                size_t n = 0;
                if (st_load_i32(f, t->name, &v, &n, &err) == 0) free(v);
            } else {
                /* other dtypes: touch every byte */
                volatile uint8_t acc = 0;
                for (size_t k = 0; k < t->nbytes; k++) acc ^= ((const uint8_t *)t->data)[k];
                (void)acc;
            }
        }
        st_close(&f);
    }
    close(fd);
    return 0;
}
