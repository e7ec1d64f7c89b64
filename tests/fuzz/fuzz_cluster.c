/* Fuzz target: cluster files (dsl/cluster.h: tr_cluster_load, YAML through libyaml). The input
 * is the file; one that loads is written back and must load again. */
#include <stdio.h>
#include <stdlib.h>

#include "dsl/cluster.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], err[1200];
    fz_write("cluster.yaml", data, size, path, sizeof path);
    static tr_cluster c, back; /* large: off the stack */
    if (tr_cluster_load(&c, path, err, sizeof err)) {
        fz_note("cluster", err);
        return 0;
    }
    char out[512];
    snprintf(out, sizeof out, "%s/written.yaml", fz_dir());
    if (tr_cluster_write(&c, out, err, sizeof err)) return 0; /* a full disk is no parser bug */
    if (tr_cluster_load(&back, out, err, sizeof err)) {
        fprintf(stderr, "a cluster written by tr_cluster_write does not load: %s\n", err);
        abort();
    }
    return 0;
}
