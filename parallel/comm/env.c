/* Environment variables as settings (env.h): the three forms and their one line. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/env.h"

int tr_env_bad(const char *name, const char *what, const char *value, char *msg,
               size_t msglen) {
    if (msg && msglen) snprintf(msg, msglen, "%s must be %s, got '%s'", name, what, value);
    return -1;
}

int tr_env_int(const char *name, long lo, long hi, long *out, char *msg, size_t msglen) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char what[96];
        snprintf(what, sizeof what, "an integer from %ld to %ld", lo, hi);
        return tr_env_bad(name, what, v, msg, msglen);
    }
    *out = x;
    return 1;
}

int tr_env_name(const char *name, size_t maxlen, const char **out, char *msg, size_t msglen) {
    const char *v = getenv(name);
    if (!v) return 0;
    size_t n = strlen(v);
    int ok = n >= 1 && n <= maxlen;
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)v[i]) || v[i] == '.' || v[i] == '-' || v[i] == '_';
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "a name of 1 to %zu letters, digits, '.', '-' or '_'", maxlen);
        return tr_env_bad(name, what, v, msg, msglen);
    }
    *out = v;
    return 1;
}

int tr_env_bool(const char *name, int *out, char *msg, size_t msglen) {
    static const char *const words[] = {"0", "1", NULL};
    return tr_env_word(name, words, out, msg, msglen);
}

int tr_env_word(const char *name, const char *const *words, int *out, char *msg,
                size_t msglen) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    int n = 0;
    for (; words[n]; n++)
        if (!strcmp(v, words[n])) {
            *out = n;
            return 1;
        }
    char what[256] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof what; i++) /* "a, b or c" */
        len += (size_t)snprintf(what + len, sizeof what - len, "%s%s",
                                i == 0 ? "" : i == n - 1 ? " or " : ", ", words[i]);
    return tr_env_bad(name, what, v, msg, msglen);
}
