/* safetensors: read-only access to Hugging Face safetensors files by mmap (one file, or a sharded checkpoint
 * through model.safetensors.index.json), and an atomic writer (write, fsync, rename).
 * The st_file owns its mappings; tensor data pointers stay valid until st_close. Not thread-safe to open/close,
 * safe to read concurrently. Errors return -errno and fill an errbuf naming the file and the tensor or field. */
#ifndef DFLASH_SAFETENSORS_H
#define DFLASH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum st_dtype { ST_F32, ST_BF16, ST_F16, ST_I32, ST_I64, ST_U8, ST_I8, ST_BOOL, ST_F64, ST_I16 };

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;  /* inside the mapping */
    size_t nbytes;
    const char *file;  /* path of the file that holds it (sharded checkpoints) */
} st_tensor;

typedef struct st_file st_file;

/* Open path: a .safetensors file, a model.safetensors.index.json, or a directory holding either. */
int st_open(st_file **out, const char *path, errbuf *err);
/* Unmap and free; nulls *f. */
void st_close(st_file **f);
/* Number of tensors, and the i-th one (in file order; shards in index order). */
int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);
/* Tensor by name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* Value of a string entry of __metadata__ (first file), or NULL. */
const char *st_metadata(const st_file *f, const char *key);
/* Path given to st_open (for messages). */
const char *st_path(const st_file *f);
/* Bytes per element of a dtype; its name ("F32"...). */
size_t st_dtype_size(enum st_dtype dt);
const char *st_dtype_name(enum st_dtype dt);

/* Copy tensor `name` into dst as f32 (F32/BF16/F16 converted). The shape must equal shape[0..ndim) exactly;
 * otherwise (missing tensor, wrong shape, non-float dtype) an error names the file, tensor and both shapes. */
int st_read_f32(const st_file *f, const char *name, float *dst, int ndim, const int64_t *shape, errbuf *err);
/* Same, allocating: *out = xmalloc'd copy (caller frees). ndim < 0 accepts any shape (then *out_count = elements). */
int st_load_f32(const st_file *f, const char *name, float **out, int ndim, const int64_t *shape, size_t *out_count,
                errbuf *err);
/* Integer tensor (I32, or I64 within i32 range) into a freshly allocated int32 array; *out_count = elements. */
int st_load_i32(const st_file *f, const char *name, int32_t **out, size_t *out_count, errbuf *err);

/* One tensor to write: f32 data converted to `dtype` (ST_F32 or ST_BF16) on the way out, or raw I32 data. */
typedef struct st_write_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;  /* float* for F32/BF16 output, int32_t* for I32 */
} st_write_tensor;
/* Write a safetensors file atomically (path.tmp, fsync, rename, fsync dir). metadata_json: NULL or a JSON object
 * of string values for __metadata__. */
int st_write(const char *path, const st_write_tensor *tensors, int n, const char *metadata_json, errbuf *err);

#endif
