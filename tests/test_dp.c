/* parallel/dp.h in a world of one: the checks tr_dp_init makes before it builds anything. A
 * device backend (here the CPU table under another name, so dp.c cannot tell it from a GPU)
 * is accepted at every stage (ZeRO-2 and 3 keep their pieces and buckets in the backend's
 * memory: tests/emu_parallel.sh runs them on the emulated GPU); a model built for another
 * stage is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"

static int failures;

static void check(int ok, const char *what, const char *detail) {
    if (!ok) failures++;
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail[0] ? ": " : "", detail);
}

static const char *recipe =
    "model { vocab = 32, dim = 16, seq_len = 8, embedding {}, positions {},\n"
    "  residual { layernorm {}, attention { heads = 2 } }, layernorm {}, lm_head {} }\n"
    "data { text = 'x' } train { batch_tokens = 16, steps = 1 }\n";

int main(int argc, char **argv) {
    char err[512];
    tr_comm *world;
    if (tr_comm_init(&world, &argc, &argv, 30, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    tr_recipe r;
    if (tr_recipe_load_string(&r, recipe, "test", ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL recipe: %s\n", err);
        return 1;
    }
    tr_backend device = *tr_backend_cpu();
    device.name = "device-under-test";
    device.device_memory = 1; /* what dp.c looks at */
    for (int zero = 0; zero <= 3; zero++) {
        tr_model_opts o = {.B = 2, .T = 8, .external_grads = zero == 2, .external_params = zero == 3};
        for (int dev = 0; dev < 2; dev++) {
            tr_model *m;
            if (tr_model_init_opts(&m, &r.model, dev ? &device : tr_backend_cpu(), &o, err,
                                   sizeof(err))) {
                printf("FAIL model: %s\n", err);
                return 1;
            }
            tr_dp *d = NULL;
            err[0] = 0;
            int rc = tr_dp_init(&d, m, world, zero, 0, err, sizeof(err));
            char what[96];
            snprintf(what, sizeof(what), "ZeRO-%d on a %s backend starts", zero,
                     dev ? "device" : "host");
            check(rc == 0, what, err);
            tr_dp_free(d);
            tr_model_free(m);
        }
    }
    /* a model built for ZeRO-2 given to ZeRO-0 (and the reverse) */
    tr_model_opts o2 = {.B = 2, .T = 8, .external_grads = 1};
    tr_model *m;
    tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &o2, err, sizeof(err));
    tr_dp *d = NULL;
    int rc = tr_dp_init(&d, m, world, 0, 0, err, sizeof(err));
    check(rc != 0 && strstr(err, "external gradients"), "a ZeRO-2 model refused at ZeRO-0", err);
    rc = tr_dp_init(&d, m, world, 3, 0, err, sizeof(err));
    check(rc != 0 && strstr(err, "external parameters"), "a ZeRO-2 model refused at ZeRO-3", err);
    tr_model_free(m);
    tr_recipe_free(&r);
    tr_comm_free(world);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
