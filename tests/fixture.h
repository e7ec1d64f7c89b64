/* A reader for the TRFX fixture files of tests/reference/ (written by make_fixtures.py):
 * named float32 / int32 tensors. Test code only. */
#ifndef TR_TEST_FIXTURE_H
#define TR_TEST_FIXTURE_H

#include <stddef.h>

typedef struct {
    char name[128];
    int dtype; /* 0 float32, 1 int32 */
    int ndim;
    int dims[4];
    size_t numel;
    void *data;
} fx_entry;

typedef struct {
    int count;
    fx_entry *e;
} fx_file;

int fx_load(fx_file *f, const char *path);
const fx_entry *fx_find(const fx_file *f, const char *name);
/* the i-th entry whose name starts with prefix, or NULL */
const fx_entry *fx_nth(const fx_file *f, const char *prefix, int i);
void fx_free(fx_file *f);

#endif
