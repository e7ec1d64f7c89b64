/* Tokenizing a corpus into shards with every core. The input is cut into chunks of about
 * 1 MiB at points where GPT-2's pre-tokenizer is known to start a new piece (after an ASCII
 * letter and before a space, so the pieces on both sides are the same as in the whole text;
 * JSONL at line starts), workers encode chunks in any order, and the calling thread writes
 * them in input order, so the shards do not depend on the number of threads. */
#define _DEFAULT_SOURCE /* DT_DIR, scandir and alphasort */
#include "data/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/shard.h"
#include "data/json.h"
#include "data/tokenizer_private.h"
#include "parallel/comm/base.h"

#define CHUNK_MAX (1 << 20)
#define CHUNK_MIN (1 << 16)
#define MAX_INPUT_FILES 1000000

typedef struct {
    char *path;
    const unsigned char *data;
    size_t size;
    int jsonl;
} input;

typedef struct {
    int file;
    size_t off, len;
    int doc_start; /* text: the chunk starts its file (a document) */
    int val;
} chunk;

typedef struct {
    const tr_corpus_opts *o;
    input *in;
    int n_in, cap_in;
    chunk *ch;
    long n_ch, cap_ch;
    int **ids;
    size_t *nids;
    char **errs;
    unsigned char *done;
    long next, written, window;
    int abort;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
} job;

/* ---- inputs ---------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int add_file(job *j, const char *path, int named, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    fstat(fd, &st);
    if (st.st_size == 0) {
        close(fd);
        if (!named)
            return 0; /* an empty document inside a folder adds nothing */
        snprintf(err, errlen, "%s: empty file", path);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    if (j->n_in == j->cap_in) {
        int cap = j->cap_in ? 2 * j->cap_in : 16;
        input *g = cap <= MAX_INPUT_FILES ? realloc(j->in, (size_t)cap * sizeof *g) : NULL;
        if (!g) {
            munmap(map, (size_t)st.st_size);
            snprintf(err, errlen, "%s: too many input files", path);
            return -1;
        }
        j->in = g;
        j->cap_in = cap;
    }
    input *in = &j->in[j->n_in++];
    in->path = strdup(path);
    in->data = map;
    in->size = (size_t)st.st_size;
    in->jsonl = ends_with(path, ".jsonl");
    return 0;
}

static int add_path(job *j, const char *path, int named, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (!S_ISREG(st.st_mode)) {
            if (!named)
                return 0;
            snprintf(err, errlen, "%s: not a file or folder", path);
            return -1;
        }
        return add_file(j, path, named, err, errlen);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        snprintf(err, errlen, "%s: cannot list: %s", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!rc && names[i]->d_name[0] != '.') {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name);
            rc = add_path(j, sub, 0, err, errlen);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

/* ---- chunks ---------------------------------------------------------------------------------- */

static int is_ascii_letter(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* First safe cut at or after `want` (the file's size when there is none). */
static size_t boundary(const input *in, size_t want)
{
    const unsigned char *s = in->data;
    for (size_t p = want < 1 ? 1 : want; p < in->size; p++) {
        if (in->jsonl ? s[p - 1] == '\n' : (s[p] == ' ' && is_ascii_letter(s[p - 1])))
            return p;
    }
    return in->size;
}

static int add_chunk(job *j, chunk c)
{
    if (j->n_ch == j->cap_ch) {
        long cap = j->cap_ch ? 2 * j->cap_ch : 64;
        chunk *g = realloc(j->ch, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        j->ch = g;
        j->cap_ch = cap;
    }
    j->ch[j->n_ch++] = c;
    return 0;
}

/* Last safe cut before `want` inside a file (0 when there is none: the file's start). */
static size_t boundary_before(const input *in, size_t want)
{
    const unsigned char *s = in->data;
    for (size_t p = want > in->size ? in->size : want; p-- > 1;) {
        if (in->jsonl ? s[p - 1] == '\n' : (s[p] == ' ' && is_ascii_letter(s[p - 1])))
            return p;
    }
    return 0;
}

/* Where the validation tail starts, in bytes from the start of the input: the first safe cut
 * at or after (1 - val_fraction) of it, or, when the last document straddles that point and
 * has no safe cut after it (a long JSONL line, a text without "letter space"), the last safe
 * cut before it, a document's start at the latest. -1 when there is none at all (one document
 * with no safe cut); total + 1 without a validation set. */
static double val_cut(const job *j, double val_fraction, double total)
{
    if (val_fraction <= 0)
        return total + 1;
    double want = (1.0 - val_fraction) * total, base = 0;
    int f = 0;
    while (f < j->n_in - 1 && base + (double)j->in[f].size <= want)
        base += (double)j->in[f++].size;
    const input *in = &j->in[f];
    size_t local = (size_t)(want - base);
    if ((double)local < want - base) /* the first byte at or after the point */
        local++;
    if (local == 0 && f > 0) /* a document's start */
        return base;
    size_t cut = local >= in->size ? in->size : boundary(in, local);
    if (cut < in->size)
        return base + (double)cut;
    cut = boundary_before(in, local);
    if (cut > 0 || f > 0)
        return base + (double)cut;
    return -1;
}

/* Chunks of about 1 MiB, smaller for small inputs so that every thread gets work (where the
 * cuts fall does not change the tokens). The validation cut (val_cut) is one of the cuts. */
static int make_chunks(job *j, double split, int threads)
{
    double total = 0;
    for (int f = 0; f < j->n_in; f++)
        total += (double)j->in[f].size;
    double per = total / (8.0 * threads);
    size_t chunk_bytes = per > CHUNK_MAX ? CHUNK_MAX : per < CHUNK_MIN ? CHUNK_MIN : (size_t)per;
    double base = 0;
    for (int f = 0; f < j->n_in; f++) {
        const input *in = &j->in[f];
        double local = split - base; /* the split point inside this file, if it is there */
        size_t start = 0;
        while (start < in->size) {
            size_t want = start + chunk_bytes;
            if (local > (double)start && local < (double)want)
                want = (size_t)local;
            if (want <= start) /* the split point inside byte `start`: a cut there would be */
                want = start + 1; /* the chunk's own start again, and the loop would not end */
            size_t end = want >= in->size ? in->size : boundary(in, want);
            chunk c = {f, start, end - start, start == 0, base + (double)start >= split};
            if (add_chunk(j, c))
                return -1;
            start = end;
        }
        base += (double)in->size;
    }
    return 0;
}

/* ---- encoding -------------------------------------------------------------------------------- */

/* Encode one JSONL chunk: every non-blank line is an object whose `field` is the text. */
static int encode_jsonl(job *j, const chunk *c, int *ids, size_t *nids, char **errp)
{
    const input *in = &j->in[c->file];
    const char *field = j->o->field ? j->o->field : "text";
    const char *s = (const char *)in->data + c->off;
    int eot = tr_tokenizer_eot(j->o->tok);
    char *buf = malloc(c->len + 1);
    char err[512];
    size_t k = 0;
    if (!buf) {
        *errp = strdup("out of memory");
        return -1;
    }
    for (size_t i = 0; i < c->len;) {
        size_t e = i;
        while (e < c->len && s[e] != '\n')
            e++;
        tr_json_cur js = {.s = s + i, .n = e - i};
        tr_json_ws(&js);
        if (js.i == js.n) { /* blank line */
            i = e + 1;
            continue;
        }
        int found = 0;
        size_t len = 0;
        if (tr_json_expect(&js, '{'))
            goto bad;
        tr_json_ws(&js);
        if (js.i < js.n && js.s[js.i] == '}') {
            js.i++;
        } else {
            for (;;) {
                char keybuf[256];
                size_t klen;
                if (tr_json_string(&js, keybuf, sizeof keybuf - 1, &klen) ||
                    tr_json_expect(&js, ':'))
                    goto bad;
                keybuf[klen] = 0;
                tr_json_ws(&js);
                if (strcmp(keybuf, field) == 0 && js.i < js.n && js.s[js.i] == '"') {
                    if (tr_json_string(&js, buf, c->len, &len))
                        goto bad;
                    found = 1;
                } else if (tr_json_skip(&js)) {
                    goto bad;
                }
                tr_json_ws(&js);
                if (js.i < js.n && js.s[js.i] == ',') {
                    js.i++;
                    continue;
                }
                if (tr_json_expect(&js, '}'))
                    goto bad;
                break;
            }
        }
        tr_json_ws(&js);
        if (js.i != js.n) {
            snprintf(js.err, sizeof js.err, "unexpected text after the object");
            js.at = js.i;
            goto bad;
        }
        if (!found) {
            snprintf(err, sizeof err, "%s: byte %zu: no string field '%s' in this line", in->path,
                     c->off + i, field);
            free(buf);
            *errp = strdup(err);
            return -1;
        }
        if (eot >= 0)
            ids[k++] = eot;
        k += tr_tokenizer_encode(j->o->tok, buf, len, ids + k);
        i = e + 1;
        continue;
    bad:
        snprintf(err, sizeof err, "%s: byte %zu: %s", in->path, c->off + i + js.at, js.err);
        free(buf);
        *errp = strdup(err);
        return -1;
    }
    free(buf);
    *nids = k;
    return 0;
}

static void *worker(void *arg)
{
    job *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->abort && j->next < j->n_ch && j->next >= j->written + j->window)
            pthread_cond_wait(&j->cv_work, &j->mu);
        if (j->abort || j->next >= j->n_ch)
            break;
        long i = j->next++;
        pthread_mutex_unlock(&j->mu);
        const chunk *c = &j->ch[i];
        const input *in = &j->in[c->file];
        /* ids: at most one per byte, plus a separator per line (JSONL) or document */
        int *ids = malloc((2 * c->len + 2) * sizeof(int));
        size_t n = 0;
        char *e = NULL;
        if (!ids) {
            e = strdup("out of memory");
        } else if (in->jsonl) {
            encode_jsonl(j, c, ids, &n, &e);
        } else {
            int eot = tr_tokenizer_eot(j->o->tok);
            if (c->doc_start && eot >= 0)
                ids[n++] = eot;
            n += tr_tokenizer_encode(j->o->tok, (const char *)in->data + c->off, c->len, ids + n);
        }
        pthread_mutex_lock(&j->mu);
        j->ids[i] = ids;
        j->nids[i] = n;
        j->errs[i] = e;
        j->done[i] = 1;
        pthread_cond_broadcast(&j->cv_done);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* ---- output ---------------------------------------------------------------------------------- */

typedef struct {
    const char *dir, *prefix;
    int width, count;
    long shard_tokens, tokens;
    tr_shard_writer *w;
} stream;

static int stream_write(stream *s, const int *ids, size_t n, char *err, size_t errlen)
{
    while (n > 0) {
        if (!s->w) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, s->count);
            if (tr_shard_writer_open(&s->w, path, s->width, err, errlen))
                return -1;
            s->count++;
        }
        long room = s->shard_tokens - tr_shard_writer_count(s->w);
        size_t k = n < (size_t)room ? n : (size_t)room;
        if (tr_shard_writer_write(s->w, ids, k, err, errlen))
            return -1;
        s->tokens += (long)k;
        ids += k;
        n -= k;
        if (tr_shard_writer_count(s->w) == s->shard_tokens) {
            tr_shard_writer *w = s->w;
            s->w = NULL;
            if (tr_shard_writer_close(w, err, errlen))
                return -1;
        }
    }
    return 0;
}

static int stream_close(stream *s, char *err, size_t errlen)
{
    tr_shard_writer *w = s->w;
    s->w = NULL;
    return w ? tr_shard_writer_close(w, err, errlen) : 0;
}

static void remove_old_shards(const char *dir)
{
    static const char *const pats[] = {"train_*.bin", "val_*.bin", "*.bin.tmp"};
    for (int k = 0; k < 3; k++) {
        char pat[4096];
        glob_t g;
        snprintf(pat, sizeof pat, "%s/%s", dir, pats[k]);
        if (glob(pat, 0, NULL, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++)
                remove(g.gl_pathv[i]);
            globfree(&g);
        }
    }
}

int tr_corpus_tokenize(const tr_corpus_opts *o, tr_corpus_stats *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    job j;
    memset(&j, 0, sizeof j);
    j.o = o;
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv_work, NULL);
    pthread_cond_init(&j.cv_done, NULL);
    int rc = -1, nthreads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads < 1)
        nthreads = 1;
    pthread_t *th = NULL;
    int started = 0;
    int width = tr_shard_width_for_vocab(tr_tokenizer_vocab(o->tok));
    long shard_tokens = o->shard_tokens > 0 ? o->shard_tokens : 100000000L;
    stream train = {o->out_dir, "train", width, 0, shard_tokens, 0, NULL};
    stream val = {o->out_dir, "val", width, 0, shard_tokens, 0, NULL};
    double t0 = tr_now(), last = 0;
    err[0] = 0;

    if (o->n_inputs < 1) {
        snprintf(err, errlen, "tokenize: no input given");
        goto done;
    }
    for (int i = 0; i < o->n_inputs; i++)
        if (add_path(&j, o->inputs[i], 1, err, errlen))
            goto done;
    if (j.n_in == 0) {
        snprintf(err, errlen, "%s: no files with text in it", o->inputs[0]);
        goto done;
    }
    for (int f = 0; f < j.n_in; f++)
        st->bytes_total += (double)j.in[f].size;
    double split = val_cut(&j, o->val_fraction, st->bytes_total);
    if (split < 0) { /* said before the pass, not after it */
        snprintf(err, errlen,
                 "%s: cannot split off a validation set: the input is one document with no "
                 "place to cut it (a line start in JSONL, a space after a letter in text); use "
                 "--val-fraction 0, or give more than one document",
                 o->inputs[0]);
        goto done;
    }
    if (make_chunks(&j, split, nthreads))
        goto oom;
    st->val_bytes = split < st->bytes_total ? st->bytes_total - split : 0;
    j.ids = calloc((size_t)j.n_ch, sizeof *j.ids);
    j.nids = calloc((size_t)j.n_ch, sizeof *j.nids);
    j.errs = calloc((size_t)j.n_ch, sizeof *j.errs);
    j.done = calloc((size_t)j.n_ch, 1);
    th = calloc((size_t)nthreads, sizeof *th);
    if (!j.ids || !j.nids || !j.errs || !j.done || !th)
        goto oom;
    if (tr_mkdirs(o->out_dir, err, errlen))
        goto done;
    remove_old_shards(o->out_dir);
    j.window = 4L * nthreads;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, worker, &j))
            break;
    if (started == 0) {
        snprintf(err, errlen, "tokenize: cannot start threads");
        goto done;
    }
    for (long i = 0; i < j.n_ch; i++) {
        pthread_mutex_lock(&j.mu);
        while (!j.done[i])
            pthread_cond_wait(&j.cv_done, &j.mu);
        pthread_mutex_unlock(&j.mu);
        if (j.errs[i]) {
            snprintf(err, errlen, "%s", j.errs[i]);
            goto done;
        }
        stream *s = j.ch[i].val ? &val : &train;
        if (stream_write(s, j.ids[i], j.nids[i], err, errlen))
            goto done;
        free(j.ids[i]);
        j.ids[i] = NULL;
        pthread_mutex_lock(&j.mu);
        j.written++;
        pthread_cond_broadcast(&j.cv_work);
        pthread_mutex_unlock(&j.mu);
        st->bytes_done += (double)j.ch[i].len;
        st->train_tokens = train.tokens;
        st->val_tokens = val.tokens;
        st->seconds = tr_now() - t0;
        if (o->progress && (st->seconds - last > 0.25 || i + 1 == j.n_ch)) {
            last = st->seconds;
            o->progress(o->progress_ctx, st);
        }
    }
    if (stream_close(&train, err, errlen) || stream_close(&val, err, errlen))
        goto done;
    st->train_shards = train.count;
    st->val_shards = val.count;
    if (train.tokens == 0) {
        snprintf(err, errlen, val.tokens ? "%s: no training tokens (the input is all validation "
                                           "split)"
                                         : "%s: no tokens (nothing but blank lines or empty "
                                           "documents)",
                 o->inputs[0]);
        goto done;
    }
    if (o->val_fraction > 0 && val.tokens == 0) {
        snprintf(err, errlen,
                 "%s: cannot split off a validation set: no place to cut the text after %.0f%% "
                 "of it (give more text or a val fraction of 0)",
                 o->inputs[0], 100.0 * (1.0 - o->val_fraction));
        goto done;
    }
    st->seconds = tr_now() - t0;
    rc = 0;
    goto done;
oom:
    snprintf(err, errlen, "out of memory while tokenizing");
done:
    pthread_mutex_lock(&j.mu);
    j.abort = 1;
    pthread_cond_broadcast(&j.cv_work);
    pthread_mutex_unlock(&j.mu);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    free(th);
    tr_shard_writer_abort(train.w);
    tr_shard_writer_abort(val.w);
    if (rc != 0 && j.done) /* never leave a partial corpus that looks complete */
        remove_old_shards(o->out_dir);
    for (long i = 0; i < j.n_ch; i++) {
        if (j.ids)
            free(j.ids[i]);
        if (j.errs)
            free(j.errs[i]);
    }
    free(j.ids);
    free(j.nids);
    free(j.errs);
    free(j.done);
    free(j.ch);
    for (int f = 0; f < j.n_in; f++) {
        munmap((void *)j.in[f].data, j.in[f].size);
        free(j.in[f].path);
    }
    free(j.in);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv_work);
    pthread_cond_destroy(&j.cv_done);
    return rc;
}

/* ---- the cache of a recipe's text corpus --------------------------------------------------- */

int tr_corpus_cache(const tr_data_desc *d, char *dir, size_t dirlen, int *made,
                    void (*progress)(void *ctx, const tr_corpus_stats *st), void *progress_ctx,
                    char *err, size_t errlen)
{
    *made = 0;
    struct stat st;
    if (stat(d->text, &st)) {
        snprintf(err, errlen, "data: cannot read '%s': %s", d->text, strerror(errno));
        return -1;
    }
    const char *slash = strrchr(d->text, '/');
    const char *name = slash ? slash + 1 : d->text;
    int folder = slash ? (int)(slash - d->text) : 1;
    const char *tname = d->tokenizer == TR_TOKENIZER_GPT2 ? "gpt2" : "byte";
    if ((size_t)snprintf(dir, dirlen, "%.*s/cache/%s.%s", folder, slash ? d->text : ".", name,
                         tname) >= dirlen) {
        snprintf(err, errlen, "data: path too long: %s", d->text);
        return -1;
    }
    char stamp_path[4200], stamp[8192], old[8192] = "";
    snprintf(stamp_path, sizeof stamp_path, "%s/source.txt", dir);
    snprintf(stamp, sizeof stamp,
             "text %s\nsize %lld\nmtime %lld.%09ld\ntokenizer %s\nval_fraction %.9g\nencoder %s\n"
             "merges %s\n",
             d->text, (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
             tname, (double)d->val_fraction, d->encoder, d->merges);
    FILE *f = fopen(stamp_path, "r");
    if (f) {
        size_t n = fread(old, 1, sizeof old - 1, f);
        old[n] = 0;
        fclose(f);
        if (strcmp(old, stamp) == 0)
            return 0;
    }
    tr_tokenizer *tok;
    if (tr_tokenizer_open(&tok, d->tokenizer, d->encoder, d->merges, err, errlen))
        return -1;
    const char *inputs[1] = {d->text};
    tr_corpus_opts o = {.inputs = inputs, .n_inputs = 1, .out_dir = dir, .tok = tok,
                        .val_fraction = d->val_fraction, .progress = progress,
                        .progress_ctx = progress_ctx};
    tr_corpus_stats cs;
    remove(stamp_path);
    int rc = tr_corpus_tokenize(&o, &cs, err, errlen);
    tr_tokenizer_free(tok);
    if (rc)
        return -1;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", stamp_path);
    f = fopen(tmp, "w");
    if (!f || fputs(stamp, f) < 0 || fclose(f) || rename(tmp, stamp_path)) {
        snprintf(err, errlen, "%s: cannot write", stamp_path);
        return -1;
    }
    *made = 1;
    return 0;
}
