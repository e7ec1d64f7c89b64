/* Fuzz target: the recipe loader (dsl/recipe.h: tr_recipe_load_string), Lua sandbox included.
 * The input is the recipe's text (up to its first NUL). A recipe that loads is written back
 * (tr_recipe_write_lua) and must load again. The fuzz build lowers the sandbox's instruction
 * limit (TR_RECIPE_INSTR_LIMIT) so an endless loop costs milliseconds, not seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    static tr_recipe r, back; /* large: off the stack */
    char err[2048];
    if (!tr_recipe_load_string(&r, text, "fuzz.lua", fz_dir(), NULL, 0, err, sizeof err)) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        int wrote = f && !tr_recipe_write_lua(&r, f);
        if (f && fclose(f)) wrote = 0;
        if (wrote) {
            if (tr_recipe_load_string(&back, buf, "written.lua", fz_dir(), NULL, 0, err,
                                      sizeof err)) {
                fprintf(stderr, "a recipe written by tr_recipe_write_lua does not load: %s\n",
                        err);
                abort();
            }
            tr_recipe_free(&back);
        }
        free(buf);
        tr_recipe_free(&r);
    } else {
        fz_note("recipe", err);
    }
    free(text);
    return 0;
}
