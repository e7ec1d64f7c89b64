/* trainer/report/provenance.h's comparison: two provenance documents parsed with data/json.h, the
 * fields that differ (flattened, both values, whether they can change the numbers), and the
 * verdict for each kind of difference; the JSON writer the values are shown with.
 * `test_provenance --compare A.json B.json` compares two files instead (tests/provenance.sh):
 * prints every difference and the verdict; exit 0, or 1 when a file cannot be read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/json.h"
#include "trainer/report/provenance.h"

/* A provenance document like the trainer's, with the fields given as printf arguments. */
static const char *const doc_fmt =
    "{\"trainer\": {\"version\": \"0.17.0\", \"commit\": \"%s\", \"built\": \"%s\"},\n"
    " \"build\": {\"type\": \"Release\", \"cuda\": \"OFF\"},\n"
    " \"backend\": \"cpu\", \"device\": \"cpu, fp32\", \"driver\": null,\n"
    " \"libraries\": {\"blas\": \"OpenBLAS 0.3.21\", \"nccl\": %s},\n"
    " \"layout\": {\"dp\": %d, \"tp\": %d, \"zero\": 0},\n"
    " \"ranks\": %d, \"hosts\": [%s], \"command\": \"%s\", \"cwd\": \"/w\",\n"
    " \"seeds\": {\"train\": %d},\n"
    " \"data\": {\"fingerprint\": \"00112233aabbccdd\", \"train\": \"x.txt\"},\n"
    " \"recipe\": {\"file\": \"%s\", \"training\": \"%s\"},\n"
    " \"time\": \"%s\", \"resume\": null, \"attempt\": 1%s}";

typedef struct {
    const char *commit, *built, *nccl;
    int dp, tp, ranks;
    const char *hosts, *command;
    int seed;
    const char *file, *training, *time, *extra;
} doc_args;

static const doc_args base = {
    "45f6992", "2025-01-02",           "null", 2, 1, 2, "\"a\"", "trainer run r.lua", 1337, "aaaa",
    "bbbb",    "2025-01-02T10:00:00Z", ""};

static int parse(tr_json *j, doc_args d) {
    char text[4096], err[256];
    snprintf(text, sizeof(text), doc_fmt, d.commit, d.built, d.nccl, d.dp, d.tp, d.ranks, d.hosts,
             d.command, d.seed, d.file, d.training, d.time, d.extra);
    if (tr_json_parse(j, text, strlen(text), err, sizeof(err))) {
        printf("FAIL the test's document does not parse: %s\n", err);
        exit(1);
    }
    return 0;
}

/* Compare base with b: the number of differences, and the verdict in verdict. */
static int compare(doc_args b, tr_prov_diff *d, char *verdict, size_t len) {
    tr_json ja, jb;
    parse(&ja, base);
    parse(&jb, b);
    int n = tr_provenance_diff(&ja, &jb, d, TR_PROV_MAX_DIFFS);
    tr_provenance_verdict(d, n, verdict, len);
    tr_json_free(&ja);
    tr_json_free(&jb);
    return n;
}

static const tr_prov_diff *find(const tr_prov_diff *d, int n, const char *field) {
    for (int i = 0; i < n; i++)
        if (!strcmp(d[i].field, field)) return &d[i];
    return NULL;
}

static void test_same_and_informational(void) {
    tr_prov_diff d[TR_PROV_MAX_DIFFS];
    char v[512];
    int n = compare(base, d, v, sizeof(v));
    check(n == 0 && !strcmp(v, "bitwise comparable"), "identical documents: %d, '%s'", n, v);

    doc_args b = base;
    b.time = "2025-01-03T11:00:00Z";
    b.hosts = "\"a\", \"b\"";
    b.command = "mpirun -np 2 trainer run r.lua";
    b.built = "2025-01-03";
    b.file = "cccc"; /* another output folder */
    n = compare(b, d, v, sizeof(v));
    const tr_prov_diff *h = find(d, n, "hosts");
    check(n == 5, "time, hosts, command, trainer.built, recipe.file differ: %d", n);
    check(h && !strcmp(h->a, "[\"a\"]") && !strcmp(h->b, "[\"a\",\"b\"]") && !h->numbers,
          "hosts compared whole, not numbers: %s -> %s", h ? h->a : "?", h ? h->b : "?");
    check(!strcmp(v, "bitwise comparable (differ only in trainer.built, hosts, command, "
                     "recipe.file, time)"),
          "verdict lists what differs, in the document's order: '%s'", v);
}

static void test_same_experiment(void) {
    tr_prov_diff d[TR_PROV_MAX_DIFFS];
    char v[512];
    doc_args b = base;
    b.tp = 2;
    b.dp = 1;
    b.nccl = "\"2.21.5\"";
    b.commit = "0123456-dirty";
    b.time = "later";
    int n = compare(b, d, v, sizeof(v));
    const tr_prov_diff *tp = find(d, n, "layout.tp"), *nc = find(d, n, "libraries.nccl");
    check(n == 5 && tp && nc, "layout.dp, layout.tp, libraries.nccl, trainer.commit, time: %d", n);
    check(tp && tp->numbers && !strcmp(tp->a, "1") && !strcmp(tp->b, "2"),
          "layout.tp can change the numbers, 1 -> 2");
    check(nc && nc->numbers && !strcmp(nc->a, "null") && !strcmp(nc->b, "\"2.21.5\""),
          "libraries.nccl null -> \"2.21.5\"");
    check(!strcmp(v, "comparable within tolerance: differ in trainer.commit, libraries.nccl, "
                     "layout.dp, layout.tp"),
          "verdict: '%s'", v);
}

static void test_other_experiment(void) {
    tr_prov_diff d[TR_PROV_MAX_DIFFS];
    char v[512];
    doc_args b = base;
    b.seed = 7;
    b.tp = 2;
    b.training = "dddd";
    int n = compare(b, d, v, sizeof(v));
    check(n == 3, "seeds.train, layout.tp, recipe.training: %d", n);
    check(!strcmp(v, "different experiments: differ in seeds.train, recipe.training"),
          "the experiment's fields decide the verdict: '%s'", v);
}

static void test_absent_and_unknown(void) {
    tr_prov_diff d[TR_PROV_MAX_DIFFS];
    char v[512];
    doc_args b = base;
    b.extra = ", \"new_field\": {\"x\": 1.5, \"y\": \"z\"}";
    int n = compare(b, d, v, sizeof(v));
    const tr_prov_diff *x = find(d, n, "new_field.x");
    check(n == 2 && x && !strcmp(x->a, "(absent)") && !strcmp(x->b, "1.5") && x->numbers,
          "a field only b has is flattened, absent in a, and counts (unknown fields can "
          "change the numbers): %d",
          n);
    check(!strncmp(v, "comparable within tolerance: differ in new_field.x, new_field.y", 63),
          "verdict: '%s'", v);
    /* out holds fewer than differ: the count is still all of them */
    tr_json ja, jb;
    parse(&ja, base);
    b = base;
    b.seed = 1;
    b.dp = 4;
    b.time = "t";
    parse(&jb, b);
    n = tr_provenance_diff(&ja, &jb, d, 1);
    check(n == 3 && !strcmp(d[0].field, "layout.dp"), "max 1: still counts 3 (%d), first %s", n,
          d[0].field);
    check(tr_provenance_diff(&ja, &jb, NULL, 0) == 3, "out NULL: only counts");
    tr_json_free(&ja);
    tr_json_free(&jb);
}

static void test_json_write(void) {
    const char *in = "{\"a\": [1, 0.1, -2.5e-7, true, null], \"b\": \"q\\\"\\\\\\n\", \"c\": {}}";
    tr_json j;
    char err[128], *out = NULL;
    size_t len = 0;
    int bad = tr_json_parse(&j, in, strlen(in), err, sizeof(err));
    FILE *f = open_memstream(&out, &len);
    if (!bad) tr_json_write(f, &j);
    fclose(f);
    check(!bad && !strcmp(out,
                          "{\"a\":[1,0.1,-2.5e-07,true,null],\"b\":\"q\\\"\\\\\\u000a\",\"c\":{}}"),
          "tr_json_write: %s", out);
    tr_json k;
    check(!bad && !tr_json_parse(&k, out, len, err, sizeof(err)) &&
              k.kids[0].kids[2].num == -2.5e-7,
          "what it writes reads back to the same numbers");
    if (!bad) tr_json_free(&j);
    tr_json_free(&k);
    free(out);
}

static int load(const char *path, tr_json *j) {
    FILE *f = fopen(path, "rb");
    char text[1 << 16], err[256];
    size_t n = f ? fread(text, 1, sizeof(text), f) : 0;
    if (f) fclose(f);
    if (!f || n == sizeof(text) || tr_json_parse(j, text, n, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", path,
                !f                  ? "cannot read"
                : n == sizeof(text) ? "too large"
                                    : err);
        return -1;
    }
    return 0;
}

static int compare_files(const char *pa, const char *pb) {
    tr_json a, b;
    if (load(pa, &a)) return 1;
    if (load(pb, &b)) {
        tr_json_free(&a);
        return 1;
    }
    tr_prov_diff d[TR_PROV_MAX_DIFFS];
    char v[1024];
    int n = tr_provenance_diff(&a, &b, d, TR_PROV_MAX_DIFFS);
    n = n < TR_PROV_MAX_DIFFS ? n : TR_PROV_MAX_DIFFS;
    for (int i = 0; i < n; i++)
        printf("%s %s: %s -> %s\n", d[i].numbers ? "numbers" : "info   ", d[i].field, d[i].a,
               d[i].b);
    tr_provenance_verdict(d, n, v, sizeof(v));
    printf("verdict: %s\n", v);
    tr_json_free(&a);
    tr_json_free(&b);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--compare")) return compare_files(argv[2], argv[3]);
    test_same_and_informational();
    test_same_experiment();
    test_other_experiment();
    test_absent_and_unknown();
    test_json_write();
    check(tr_fnv1a(TR_FNV1A_START, "a", 1) == 0xaf63dc4c8601ec8cULL, "FNV-1a 64 of \"a\"");
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
