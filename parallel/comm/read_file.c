/* One rank reads a file, every rank gets its bytes (comm.h: tr_comm_read_file). */
#include <stdlib.h>

#include "parallel/comm/base.h"
#include "parallel/comm/comm.h"

int tr_comm_read_file(tr_comm *c, int root, const char *path, size_t max, char **text,
                      size_t *len) {
    int me = c ? tr_comm_rank(c) : root;
    char *t = NULL;
    long long size = -1; /* the root's bytes, -1 when it could not read them */
    if (me == root) {
        size_t n = 0;
        t = tr_read_file(path, max, &n);
        size = t ? (long long)n : -1;
    }
    if (c && tr_comm_size(c) > 1) {
        tr_comm_broadcast(c, &size, 1, TR_COMM_I64, root);
        if (size >= 0 && me != root) t = malloc((size_t)size + 1);
        int short_of = size >= 0 && !t;
        tr_comm_all_reduce(c, &short_of, 1, TR_COMM_I32);
        if (short_of) {
            free(t);
            return -1;
        }
        if (size >= 0) {
            tr_comm_broadcast(c, t, (size_t)size, TR_COMM_BYTE, root);
            t[size] = 0;
        }
    }
    if (size < 0) return 1;
    *text = t;
    *len = (size_t)size;
    return 0;
}
