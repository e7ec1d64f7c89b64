/* Saving checkpoints: the blocks of the slab ranges a rank keeps, the writer thread that
 * copies them to the host and writes this rank's safetensors file, and rank 0's part: every
 * rank's block list, the manifest, publishing the folder and `latest`, retention. */
#include "trainer/checkpoint/private.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parallel/schedule.h"
#include "trainer/trainer.h"

/* ---- the writer ------------------------------------------------------------------------------ */

enum { W_IDLE = 0, W_COPY, W_WRITE };

struct tr_ckpt_writer {
    tr_model *m;
    /* the one-process model, planned (no memory): every global tensor, whichever pipeline
       stage holds it; gidx[i]: the index in it of this rank's tensor i */
    tr_model *g;
    int *gidx;
    char out[TR_PATH_MAX];
    char ckdir[TR_PATH_MAX + 16];
    char *recipe_text;
    size_t recipe_len;
    char sha[65];
    tr_model_desc desc;
    unsigned long long seed;
    tr_ckpt_opts o;
    /* the snapshot: this rank's blocks of the parameters, then of m, then of v */
    int n_params, n_sl;
    slice_info *sl;
    int copy_failed; /* a block this process does not keep (a wrong range list) */
    float *snap;
    size_t snap_floats;
    snap_meta meta;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state, quit;
    tr_ckpt_stats stats;
    char err[512];
};

static void copy_state(tr_ckpt_writer *w) {
    double t0 = tr_now();
    w->copy_failed = 0;
    for (int i = 0; i < w->n_sl; i++) {
        const slice_info *s = &w->sl[i];
        size_t lo = tr_model_param(w->m, s->param)->offset + s->local;
        if (tr_model_read_range(w->m, s->kind, lo, lo + s->count, w->snap + s->offset))
            w->copy_failed = 1;
    }
    w->stats.copy_s += tr_now() - t0;
}

/* Ranks other than 0 list the blocks they wrote in rank_R.part (appearing by rename once
 * their file is on disk, or saying why it failed); rank 0 waits for every list, then writes
 * the manifest and publishes the checkpoint. The folder must be shared by the ranks. */
static void part_path(char *out, size_t n, const char *tmp, int rank) {
    snprintf(out, n, "%s/rank_%05d.part", tmp, rank);
}

static int write_part(const tr_ckpt_writer *w, const char *tmp, size_t bytes, const char *failed,
                      char *err, size_t errlen) {
    char *buf = NULL, path[TR_PATH_MAX + 128], fin[TR_PATH_MAX + 128];
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (failed) {
        fprintf(f, "failed %s\n", failed);
    } else {
        fprintf(f, "bytes %zu\n", bytes);
        for (int i = 0; i < w->n_sl; i++) {
            const slice_info *s = &w->sl[i];
            fprintf(f, "%d %d %ld %ld %ld %ld %zu %zu %08x\n", s->gparam, s->kind, s->start[0],
                    s->start[1], s->shape[0], s->shape[1], s->flat, s->count, s->crc);
        }
    }
    fclose(f);
    part_path(fin, sizeof(fin), tmp, w->o.rank);
    snprintf(path, sizeof(path), "%.*s.tmp", (int)(sizeof(path) - 8), fin);
    const void *pp[1] = {buf};
    size_t pl[1] = {len};
    int rc = ck_write_file(path, pp, pl, 1, err, errlen);
    free(buf);
    if (!rc && rename(path, fin))
        rc = tr_errf(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    return rc;
}

/* How long a save may take before it counts as stuck (tr_ckpt_opts.timeout_s). */
static double save_limit(const tr_ckpt_writer *w) {
    if (w->o.timeout_s <= 0) return 3600;
    return w->o.timeout_s + (double)w->snap_floats * sizeof(float) / 20e6;
}

/* Rank 0: wait for rank r's list and append its blocks. */
static int read_part(const tr_ckpt_writer *w, const char *tmp, int r, slice_info **sl, int *n,
                     int *cap, size_t *bytes, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 128];
    part_path(path, sizeof(path), tmp, r);
    double t0 = tr_now(), limit = save_limit(w);
    FILE *f;
    while (!(f = fopen(path, "r"))) {
        if (tr_now() - t0 > limit)
            return tr_errf(err, errlen,
                           "rank %d did not write its part of the checkpoint "
                           "within %.0f s (%s missing)",
                           r, limit, path);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char line[512];
    int rc = 0, np = tr_model_num_params(w->g);
    if (!fgets(line, sizeof(line), f)) line[0] = 0;
    if (!strncmp(line, "failed ", 7)) {
        line[strcspn(line, "\n")] = 0;
        rc = tr_errf(err, errlen, "rank %d: %s", r, line + 7);
    } else if (sscanf(line, "bytes %zu", bytes) != 1) {
        rc = tr_errf(err, errlen, "%s: damaged", path);
    }
    while (!rc && fgets(line, sizeof(line), f)) {
        slice_info s = {.rank = r, .param = -1}; /* its index in rank r's model is not ours */
        unsigned crc;
        if (sscanf(line, "%d %d %ld %ld %ld %ld %zu %zu %x", &s.gparam, &s.kind, &s.start[0],
                   &s.start[1], &s.shape[0], &s.shape[1], &s.flat, &s.count, &crc) != 9 ||
            s.gparam < 0 || s.gparam >= np || s.kind < -1 || s.kind > 1) {
            line[strcspn(line, "\n")] = 0;
            rc = tr_errf(err, errlen, "%s: damaged line '%.60s'", path, line);
            break;
        }
        s.crc = crc;
        s.ndim = tr_model_param(w->g, s.gparam)->ndim;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            *sl = realloc(*sl, (size_t)*cap * sizeof(slice_info));
        }
        (*sl)[(*n)++] = s;
    }
    fclose(f);
    return rc;
}

/* This rank's blocks, a CRC each, as one safetensors file in the temporary folder. */
static int write_rank_file(tr_ckpt_writer *w, const char *tmp, size_t *bytes, char *err,
                           size_t errlen) {
    tr_st_tensor *t = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(tr_st_tensor));
    char(*keys)[TR_PARAM_NAME_MAX + 48] = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(*keys));
    if (!t || !keys) {
        free(t);
        free(keys);
        return tr_errf(err, errlen, "out of memory for the list of %d blocks", w->n_sl);
    }
    for (int i = 0; i < w->n_sl; i++) {
        slice_info *s = &w->sl[i];
        const tr_param *p = tr_model_param(w->m, s->param);
        char name[TR_PARAM_NAME_MAX + 16];
        ck_slice_names(p, s, name, sizeof(name), keys[i], sizeof(keys[i]));
        t[i] = (tr_st_tensor){.name = keys[i],
                              .ndim = p->ndim,
                              .shape = {s->shape[0], s->shape[1]},
                              .data = w->snap + s->offset};
        s->crc = tr_crc32c(0, t[i].data, s->count * sizeof(float));
    }
    char path[TR_PATH_MAX + 128], stepbuf[32], rankbuf[16], worldbuf[16];
    snprintf(stepbuf, sizeof(stepbuf), "%ld", w->meta.step);
    snprintf(rankbuf, sizeof(rankbuf), "%d", w->o.rank);
    snprintf(worldbuf, sizeof(worldbuf), "%d", w->o.world);
    const char *meta[] = {"format", CKPT_FORMAT, "step",   stepbuf, "rank",
                          rankbuf,  "world",     worldbuf, NULL};
    snprintf(path, sizeof(path), "%s/rank_%05d.safetensors", tmp, w->o.rank);
    size_t hlen;
    unsigned char *h = ck_st_header(t, w->n_sl, meta, &hlen);
    const void *parts[2] = {h, w->snap};
    size_t lens[2] = {hlen, w->snap_floats * sizeof(float)};
    int rc = ck_write_file(path, parts, lens, 2, err, errlen);
    free(h);
    free(t);
    free(keys);
    *bytes = hlen + lens[1];
    return rc;
}

/* Rank 0: every rank's blocks (waiting for their lists), checked to cover every global element
 * once, then the manifest. Adds the other files' and the manifest's sizes to *bytes. */
static int write_manifest(tr_ckpt_writer *w, const char *tmp, size_t *bytes, char *err,
                          size_t errlen) {
    int world = w->o.world, rc = 0;
    size_t *fbytes = calloc((size_t)world, sizeof(size_t));
    int n_all = w->n_sl, cap = w->n_sl ? w->n_sl : 1;
    slice_info *all = malloc((size_t)cap * sizeof(slice_info));
    if (!fbytes || !all) {
        free(fbytes);
        free(all);
        return tr_errf(err, errlen, "out of memory for the manifest");
    }
    memcpy(all, w->sl, (size_t)w->n_sl * sizeof(slice_info));
    fbytes[0] = *bytes;
    for (int r = 1; r < world && !rc; r++) {
        rc = read_part(w, tmp, r, &all, &n_all, &cap, &fbytes[r], err, errlen);
        *bytes += fbytes[r];
    }
    if (!rc) {
        ck_sort_blocks(all, n_all);
        rc = ck_check_cover(w->g, all, n_all, err, errlen);
    }
    if (!rc) {
        size_t mlen;
        char *man = ck_manifest_text(w->seed, w->recipe_text, w->sha, &w->desc, w->g, &w->meta, all,
                                     n_all, fbytes, &w->o, tr_model_num_chunks(w->m), &mlen);
        if (!man) {
            rc = tr_errf(err, errlen, "cannot format the manifest (libyaml emitter error)");
        } else {
            char path[TR_PATH_MAX + 128];
            snprintf(path, sizeof(path), "%s/manifest.yaml", tmp);
            const void *mp[1] = {man};
            size_t ml[1] = {mlen};
            rc = ck_write_file(path, mp, ml, 1, err, errlen);
            free(man);
            *bytes += mlen;
        }
    }
    free(all);
    free(fbytes);
    return rc;
}

/* Rank 0: the folder by rename, then `latest` by rename, then retention. */
static int publish(tr_ckpt_writer *w, const char *tmp, const char *fin, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 128], dst[TR_PATH_MAX + 64];
    for (int r = 1; r < w->o.world; r++) { /* the lists served their purpose */
        part_path(path, sizeof(path), tmp, r);
        unlink(path);
    }
    if (ck_fsync_dir(tmp))
        return tr_errf(err, errlen, "cannot sync '%s': %s", tmp, strerror(errno));
    ck_remove_dir(fin); /* an older save of the same step (a resumed run redoing it) */
    if (rename(tmp, fin))
        return tr_errf(err, errlen, "cannot rename '%s': %s", tmp, strerror(errno));
    ck_fsync_dir(w->ckdir);
    char latest[64];
    snprintf(latest, sizeof(latest), "step_%08ld\n", w->meta.step);
    snprintf(path, sizeof(path), "%s/latest.tmp", w->ckdir);
    const void *lp[1] = {latest};
    size_t ll[1] = {strlen(latest)};
    if (ck_write_file(path, lp, ll, 1, err, errlen)) return -1;
    snprintf(dst, sizeof(dst), "%s/latest", w->ckdir);
    if (rename(path, dst))
        return tr_errf(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    ck_fsync_dir(w->ckdir);
    /* retention: only now that a newer one is complete */
    long *steps;
    int n = ck_list_steps(w->ckdir, &steps);
    for (int i = 0, kept = 0; i < n; i++) {
        if (steps[i] > w->meta.step) continue; /* from a run this one resumed past: leave it */
        if (++kept <= w->o.keep) continue;
        snprintf(path, sizeof(path), "%s/step_%08ld", w->ckdir, steps[i]);
        ck_remove_dir(path);
    }
    free(steps);
    return 0;
}

static int write_checkpoint(tr_ckpt_writer *w, size_t *bytes, char *err, size_t errlen) {
    char tmp[TR_PATH_MAX + 64], fin[TR_PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s/.tmp_step_%08ld", w->ckdir, w->meta.step);
    snprintf(fin, sizeof(fin), "%s/step_%08ld", w->ckdir, w->meta.step);
    int world = w->o.world;
    if (world == 1) ck_remove_dir(tmp); /* several writers: rank 0 cleared leftovers at start */
    if (mkdir(tmp, 0755) && !(world > 1 && errno == EEXIST))
        return tr_errf(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
    if (w->copy_failed)
        return tr_errf(err, errlen, "rank %d was asked to save a range it does not keep",
                       w->o.rank);
    if (write_rank_file(w, tmp, bytes, err, errlen)) return -1;
    if (w->o.rank > 0) return write_part(w, tmp, *bytes, NULL, err, errlen);
    if (write_manifest(w, tmp, bytes, err, errlen)) return -1;
    return publish(w, tmp, fin, err, errlen);
}

static void *writer_main(void *arg) {
    tr_ckpt_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->state == W_IDLE && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->state == W_IDLE && w->quit) break;
        if (w->state == W_COPY) {
            pthread_mutex_unlock(&w->mu);
            copy_state(w);
            pthread_mutex_lock(&w->mu);
            w->state = W_WRITE;
            pthread_cond_broadcast(&w->cv);
        }
        pthread_mutex_unlock(&w->mu);
        double t0 = tr_now();
        char err[512];
        size_t bytes = 0;
        int rc = write_checkpoint(w, &bytes, err, sizeof(err));
        double dt = tr_now() - t0;
        if (rc) {
            char tmp[TR_PATH_MAX + 64], err2[512];
            snprintf(tmp, sizeof(tmp), "%s/.tmp_step_%08ld", w->ckdir, w->meta.step);
            if (w->o.rank == 0)
                ck_remove_dir(tmp);
            else /* tell rank 0, which publishes, rather than leave it waiting */
                write_part(w, tmp, 0, err, err2, sizeof(err2));
            if (w->o.world > 1)
                fprintf(stderr, "\ntrainer: rank %d: checkpoint of step %ld not saved: %s\n",
                        w->o.rank, w->meta.step, err);
            else
                fprintf(stderr, "\ntrainer: checkpoint of step %ld not saved: %s\n", w->meta.step,
                        err);
        }
        pthread_mutex_lock(&w->mu);
        if (rc) {
            w->stats.failed++;
            if (snprintf(w->err, sizeof(w->err), "checkpoint of step %ld not saved: %s",
                         w->meta.step, err) < 0)
                w->err[0] = 0;
        } else {
            w->stats.saves++;
            w->stats.bytes = bytes;
        }
        w->stats.write_s += dt;
        w->stats.last_write_s = dt;
        w->state = W_IDLE;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The layout recorded in the manifest, completed (tp, pp: 0 means 1; dp: 0 means the rest of
 * the world) and checked against the world. */
static int layout_opts(const tr_ckpt_opts *o, char *err, size_t errlen) {
    const tr_layout *l = &o->layout;
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->dp * l->tp * l->pp != o->world ||
        o->rank < 0 || o->rank >= o->world)
        return tr_errf(err, errlen,
                       "checkpoints: rank %d of a world of %d with dp %d x tp %d x "
                       "pp %d (the layout must fill the world)",
                       o->rank, o->world, l->dp, l->tp, l->pp);
    return 0;
}

/* A pipelined model's chunks must be the layout's (the manifest records the layout's
 * schedule, virtual stages and chunk starts): pp x V chunks, cut in order. */
static int layout_chunks(const tr_ckpt_opts *o, const tr_model *m, char *err, size_t errlen) {
    const tr_layout *l = &o->layout;
    int n = tr_model_num_chunks(m), ok = n == 1 || (l->virtual_stages >= 1 &&
                                                    l->pp * l->virtual_stages == n &&
                                                    (unsigned)l->schedule <= TR_PP_ZBV &&
                                                    l->microbatches >= 1 && l->chunk_start[0] == 0);
    for (int c = 0; ok && n > 1 && c < n; c++)
        ok = l->chunk_start[c] < l->chunk_start[c + 1];
    if (!ok)
        return tr_errf(err, errlen,
                       "checkpoints: the model's %d pipeline chunks are not the layout's (pp %d x "
                       "virtual_stages %d, schedule %d, chunks cut in order: a bug in the layout)",
                       n, l->pp, l->virtual_stages, l->schedule);
    return 0;
}

/* The index of the tensor named `name` in g, looked for from `from` on (a stage lists its
 * tensors in the global order), then from the start; -1 when g has none of that name. */
static int global_index(const tr_model *g, const char *name, int from) {
    int ng = tr_model_num_params(g);
    for (int k = 0; k < ng; k++) {
        int j = (from + k) % ng;
        if (!strcmp(tr_model_param(g, j)->name, name)) return j;
    }
    return -1;
}

/* The one-process model (every global tensor: a pipeline stage's model lists only its own)
 * and where this rank's tensors are in it (by name; the global shapes must agree). */
static int plan_global(tr_ckpt_writer *w, char *err, size_t errlen) {
    tr_model_opts one = {.B = 1, .T = 1};
    char why[256];
    if (tr_model_plan(&w->g, &w->desc, TR_DTYPE_F32, &one, why, sizeof(why)))
        return tr_errf(err, errlen, "checkpoints: planning the one-process model: %s", why);
    int n = tr_model_num_params(w->m), j = -1;
    if (!(w->gidx = malloc((size_t)(n ? n : 1) * sizeof(int))))
        return tr_errf(err, errlen, "checkpoints: out of memory");
    for (int i = 0; i < n; i++) {
        const tr_param *p = tr_model_param(w->m, i);
        j = global_index(w->g, p->name, j + 1);
        const tr_param *q = j >= 0 ? tr_model_param(w->g, j) : NULL;
        if (!q || q->gshape[0] != p->gshape[0] || q->gshape[1] != p->gshape[1])
            return tr_errf(err, errlen,
                           "checkpoints: rank %d's tensor '%s' (%d x %d) is not a tensor of the "
                           "one-process model (a bug in the layout)",
                           w->o.rank, p->name, p->gshape[0], p->gshape[1]);
        w->gidx[i] = j;
    }
    return 0;
}

/* This rank's blocks of the global tensors: every tensor's part inside each of its slab
 * ranges, for the parameters, m and v, each block at its offset in the snapshot. */
static int plan_blocks(tr_ckpt_writer *w, const tr_ckpt_opts *opts, char *err, size_t errlen) {
    w->n_params = tr_model_num_params(w->m);
    if (plan_global(w, err, errlen)) return -1;
    size_t whole[2] = {0, tr_model_slab_elements(w->m)};
    const size_t *rg = opts->ranges ? opts->ranges : whole;
    int n_rg = opts->ranges ? opts->n_ranges : 1, cap = 0;
    for (int kind = -1; kind <= 1; kind++)
        for (int r = 0; r < n_rg; r++)
            for (int i = 0; i < w->n_params; i++) {
                const tr_param *p = tr_model_param(w->m, i);
                size_t lo = rg[2 * r] > p->offset ? rg[2 * r] : p->offset;
                size_t hi =
                    rg[2 * r + 1] < p->offset + p->numel ? rg[2 * r + 1] : p->offset + p->numel;
                if (lo < hi && ck_add_blocks(&w->sl, &w->n_sl, &cap, p, i, w->gidx[i], kind,
                                             w->o.rank, lo - p->offset, hi - p->offset))
                    return tr_errf(err, errlen, "checkpoints: out of memory");
            }
    size_t off = 0;
    for (int i = 0; i < w->n_sl; i++) {
        w->sl[i].offset = off;
        off += w->sl[i].count;
    }
    w->snap_floats = off;
    return 0;
}

/* A writer that failed to start (no thread, mutex or condition yet): freed; returns -1. */
static int init_failed(tr_ckpt_writer *w) {
    tr_model_free(w->g);
    free(w->gidx);
    free(w->snap);
    free(w->sl);
    free(w->recipe_text);
    free(w);
    return -1;
}

int tr_ckpt_writer_init(tr_ckpt_writer **out, tr_model *m, const tr_recipe *recipe,
                        const tr_ckpt_opts *opts, char *err, size_t errlen) {
    *out = NULL;
    tr_ckpt_writer *w = calloc(1, sizeof(*w));
    if (!w) return tr_errf(err, errlen, "checkpoints: out of memory");
    w->m = m;
    w->o = *opts;
    if (w->o.keep < 1) w->o.keep = 1;
    if (w->o.world < 1) w->o.world = 1;
    w->desc = *tr_model_desc_of(m);
    w->seed = recipe->train.seed;
    snprintf(w->out, sizeof(w->out), "%s", opts->out);
    snprintf(w->ckdir, sizeof(w->ckdir), "%s/checkpoints", opts->out);
    if (layout_opts(&w->o, err, errlen) || layout_chunks(&w->o, m, err, errlen) ||
        tr_mkdirs(w->ckdir, err, errlen))
        return init_failed(w);
    /* leftovers of a save that was killed: never taken by a resume, removed here (by rank 0:
       the others may be writing into a new one once training runs) */
    DIR *d = w->o.rank == 0 ? opendir(w->ckdir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, ".tmp_step_", 10) != 0) continue;
            char p[TR_PATH_MAX + 300];
            snprintf(p, sizeof(p), "%s/%s", w->ckdir, e->d_name);
            ck_remove_dir(p);
        }
        closedir(d);
    }
    w->recipe_text = tr_recipe_text(recipe, &w->recipe_len);
    if (!w->recipe_text) {
        tr_errf(err, errlen, "checkpoints: cannot allocate the recipe's text");
        return init_failed(w);
    }
    tr_sha256_hex(w->recipe_text, w->recipe_len, w->sha);
    if (plan_blocks(w, opts, err, errlen)) return init_failed(w);
    w->o.ranges = NULL; /* the caller's, used only here */
    w->snap = malloc(w->snap_floats * sizeof(float) + 1);
    if (!w->snap) {
        tr_errf(err, errlen, "checkpoints: cannot allocate the host copy (%zu bytes)",
                w->snap_floats * sizeof(float));
        return init_failed(w);
    }
    ck_fault_init(opts->fault_bytes, opts->fault_hang);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        tr_ckpt_writer_free(w);
        return tr_errf(err, errlen, "checkpoints: cannot start the writer thread");
    }
    w->started = 1;
    *out = w;
    return 0;
}

/* With w->mu held: wait until the writer is idle (or past W_COPY when `copy_only`), at most
 * save_limit. A writer stuck past it (a hung disk) cannot be stopped or joined: one line,
 * and the process exits, so that the job ends instead of hanging. */
static void wait_writer(tr_ckpt_writer *w, int copy_only) {
    double limit = save_limit(w), t0 = tr_now();
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)limit + 1;
    while (copy_only ? w->state == W_COPY : w->state != W_IDLE) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT &&
            (copy_only ? w->state == W_COPY : w->state != W_IDLE)) {
            fflush(stdout);
            char who[32] = "";
            if (w->o.world > 1) snprintf(who, sizeof(who), "rank %d: ", w->o.rank);
            fprintf(stderr,
                    "\ntrainer: %sthe checkpoint of step %ld is still being written "
                    "after %.0f s (a hung disk or file system?): stopping\n",
                    who, w->meta.step, tr_now() - t0);
            fflush(stderr);
            _exit(1);
        }
    }
}

/* The guard's state into w->meta (the writer is idle): its ring into arrays the writer owns,
 * as the caller goes on changing its own. Out of memory: saved without it (said). */
static void copy_guard(tr_ckpt_writer *w, const tr_ckpt_guard *g) {
    snap_meta *m = &w->meta;
    m->has_guard = 0;
    if (!g) return;
    if (m->guard_cap < g->n) {
        double *l = realloc(m->guard.loss, (size_t)g->n * sizeof(double));
        if (l) m->guard.loss = l;
        double *n = l ? realloc(m->guard.norm, (size_t)g->n * sizeof(double)) : NULL;
        if (n) m->guard.norm = n;
        if (!l || !n) {
            fprintf(stderr,
                    "\ntrainer: checkpoint of step %ld: out of memory for the guard's "
                    "state: saved without it\n",
                    m->step);
            return;
        }
        m->guard_cap = g->n;
    }
    double *l = m->guard.loss, *n = m->guard.norm;
    m->guard = *g;
    m->guard.loss = l, m->guard.norm = n;
    if (g->n) {
        memcpy(l, g->loss, (size_t)g->n * sizeof(double));
        memcpy(n, g->norm, (size_t)g->n * sizeof(double));
    }
    m->has_guard = 1;
}

double tr_ckpt_save(tr_ckpt_writer *w, long step, const tr_loader_pos *pos,
                    const tr_ckpt_guard *guard) {
    double t0 = tr_now();
    pthread_mutex_lock(&w->mu);
    if (w->state != W_IDLE) {
        wait_writer(w, 0);
        if (tr_now() - t0 >= 0.005)
            fprintf(stderr,
                    "\ntrainer: step %ld waited %.2f s for the previous checkpoint to be "
                    "written (save less often: train.checkpoint_every)\n",
                    step, tr_now() - t0);
    }
    w->meta.step = step;
    w->meta.adam_steps = tr_model_adam_steps(w->m);
    memset(&w->meta.pos, 0, sizeof(w->meta.pos));
    if (pos) w->meta.pos = *pos;
    copy_guard(w, guard);
    if (w->o.overlap && !w->o.sync) {
        w->state = W_COPY;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    } else {
        pthread_mutex_unlock(&w->mu);
        copy_state(w);
        pthread_mutex_lock(&w->mu);
        w->state = W_WRITE;
        pthread_cond_broadcast(&w->cv);
        if (w->o.sync) wait_writer(w, 0);
        pthread_mutex_unlock(&w->mu);
    }
    double dt = tr_now() - t0;
    w->stats.stall_s += dt;
    return dt;
}

double tr_ckpt_fence(tr_ckpt_writer *w) {
    if (!w) return 0;
    double t0 = tr_now();
    pthread_mutex_lock(&w->mu);
    wait_writer(w, 1);
    pthread_mutex_unlock(&w->mu);
    double dt = tr_now() - t0;
    w->stats.stall_s += dt;
    return dt;
}

int tr_ckpt_wait(tr_ckpt_writer *w, char *err, size_t errlen) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    wait_writer(w, 0);
    int rc = w->stats.failed ? -1 : 0;
    if (rc) snprintf(err, errlen, "%s", w->err);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

tr_ckpt_stats tr_ckpt_writer_stats(const tr_ckpt_writer *w) {
    return w->stats;
}

void tr_ckpt_writer_free(tr_ckpt_writer *w) {
    if (!w) return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        wait_writer(w, 0);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    tr_model_free(w->g);
    free(w->gidx);
    free(w->snap);
    free(w->sl);
    free(w->recipe_text);
    free(w->meta.guard.loss);
    free(w->meta.guard.norm);
    free(w);
}
