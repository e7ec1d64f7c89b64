/* Saving checkpoints: the blocks of the slab ranges a rank keeps, the writer thread that
 * copies them to the host and writes this rank's safetensors file, and rank 0's part: every
 * rank's block list, the manifest, publishing the folder and `latest`, retention. */
#include "trainer/checkpoint_private.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trainer/trainer.h"

static int cmp_slice(const void *a, const void *b) {
    const slice_info *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->param != y->param) return x->param < y->param ? -1 : 1;
    return x->flat < y->flat ? -1 : x->flat > y->flat;
}

/* Append the blocks covering elements [a, b) of tensor p (at most three: a partial first row,
 * whole rows, a partial last row). */
static int add_blocks(slice_info **sl, int *n, int *cap, const tr_param *p, int param, int kind,
                      int rank, size_t a, size_t b) {
    size_t C = p->ndim > 1 ? (size_t)p->shape[1] : p->numel;
    while (a < b) {
        size_t r = a / C, c = a % C, len;
        long start[2], shape[2];
        if (p->ndim == 1) {
            len = b - a;
            start[0] = (long)a, shape[0] = (long)len;
            start[1] = 0, shape[1] = 1;
        } else if (c || b - a < C) { /* part of one row */
            len = C - c < b - a ? C - c : b - a;
            start[0] = (long)r, start[1] = (long)c, shape[0] = 1, shape[1] = (long)len;
        } else { /* whole rows */
            size_t rows = (b - a) / C;
            len = rows * C;
            start[0] = (long)r, start[1] = 0, shape[0] = (long)rows, shape[1] = (long)C;
        }
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            slice_info *g = realloc(*sl, (size_t)*cap * sizeof(slice_info));
            if (!g) return -1;
            *sl = g;
        }
        (*sl)[(*n)++] = (slice_info){.param = param,
                                     .kind = kind,
                                     .rank = rank,
                                     .ndim = p->ndim,
                                     .start = {start[0], start[1]},
                                     .shape = {shape[0], shape[1]},
                                     .flat = a,
                                     .count = len};
        a += len;
    }
    return 0;
}

/* ---- the writer ------------------------------------------------------------------------------ */

enum { W_IDLE = 0, W_COPY, W_WRITE };

struct tr_ckpt_writer {
    tr_model *m;
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
        size_t lo = tr_model_param(w->m, s->param)->offset + s->flat;
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
            fprintf(f, "%d %d %ld %ld %ld %ld %zu %zu %08x\n", s->param, s->kind, s->start[0],
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
        rc = ck_fail(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
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
            return ck_fail(err, errlen,
                           "rank %d did not write its part of the checkpoint "
                           "within %.0f s (%s missing)",
                           r, limit, path);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char line[512];
    int rc = 0, np = tr_model_num_params(w->m);
    if (!fgets(line, sizeof(line), f)) line[0] = 0;
    if (!strncmp(line, "failed ", 7)) {
        line[strcspn(line, "\n")] = 0;
        rc = ck_fail(err, errlen, "rank %d: %s", r, line + 7);
    } else if (sscanf(line, "bytes %zu", bytes) != 1) {
        rc = ck_fail(err, errlen, "%s: damaged", path);
    }
    while (!rc && fgets(line, sizeof(line), f)) {
        slice_info s = {.rank = r};
        unsigned crc;
        if (sscanf(line, "%d %d %ld %ld %ld %ld %zu %zu %x", &s.param, &s.kind, &s.start[0],
                   &s.start[1], &s.shape[0], &s.shape[1], &s.flat, &s.count, &crc) != 9 ||
            s.param < 0 || s.param >= np || s.kind < -1 || s.kind > 1) {
            rc = ck_fail(err, errlen, "%s: damaged line '%.60s'", path, line);
            break;
        }
        s.crc = crc;
        s.ndim = tr_model_param(w->m, s.param)->ndim;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            *sl = realloc(*sl, (size_t)*cap * sizeof(slice_info));
        }
        (*sl)[(*n)++] = s;
    }
    fclose(f);
    return rc;
}

static int write_checkpoint(tr_ckpt_writer *w, size_t *bytes, char *err, size_t errlen) {
    const snap_meta *sm = &w->meta;
    char tmp[TR_PATH_MAX + 64], fin[TR_PATH_MAX + 64], path[TR_PATH_MAX + 128];
    snprintf(tmp, sizeof(tmp), "%s/.tmp_step_%08ld", w->ckdir, sm->step);
    snprintf(fin, sizeof(fin), "%s/step_%08ld", w->ckdir, sm->step);
    int world = w->o.world;
    if (world == 1) ck_remove_dir(tmp); /* several writers: rank 0 cleared leftovers at start */
    if (mkdir(tmp, 0755) && !(world > 1 && errno == EEXIST))
        return ck_fail(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
    if (w->copy_failed)
        return ck_fail(err, errlen, "rank %d was asked to save a range it does not keep",
                       w->o.rank);
    /* this rank's blocks: a CRC each, one safetensors file */
    tr_st_tensor *t = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(tr_st_tensor));
    char(*keys)[TR_PARAM_NAME_MAX + 48] = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(*keys));
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
    char file[32], stepbuf[32], rankbuf[16], worldbuf[16];
    snprintf(file, sizeof(file), "rank_%05d.safetensors", w->o.rank);
    snprintf(stepbuf, sizeof(stepbuf), "%ld", sm->step);
    snprintf(rankbuf, sizeof(rankbuf), "%d", w->o.rank);
    snprintf(worldbuf, sizeof(worldbuf), "%d", world);
    const char *meta[] = {"format", CKPT_FORMAT, "step",   stepbuf, "rank",
                          rankbuf,  "world",     worldbuf, NULL};
    snprintf(path, sizeof(path), "%s/%s", tmp, file);
    size_t hlen;
    unsigned char *h = ck_st_header(t, w->n_sl, meta, &hlen);
    const void *parts[2] = {h, w->snap};
    size_t lens[2] = {hlen, w->snap_floats * sizeof(float)};
    int rc = ck_write_file(path, parts, lens, 2, err, errlen);
    free(h);
    free(t);
    free(keys);
    if (rc) return -1;
    *bytes = hlen + lens[1];
    if (w->o.rank > 0) return write_part(w, tmp, *bytes, NULL, err, errlen);
    /* rank 0: every rank's blocks, then the manifest */
    size_t *fbytes = calloc((size_t)world, sizeof(size_t));
    int n_all = w->n_sl, cap = w->n_sl ? w->n_sl : 1;
    slice_info *all = malloc((size_t)cap * sizeof(slice_info));
    memcpy(all, w->sl, (size_t)w->n_sl * sizeof(slice_info));
    fbytes[0] = *bytes;
    for (int r = 1; r < world && !rc; r++) {
        rc = read_part(w, tmp, r, &all, &n_all, &cap, &fbytes[r], err, errlen);
        *bytes += fbytes[r];
    }
    if (!rc) {
        qsort(all, (size_t)n_all, sizeof(slice_info), cmp_slice);
        size_t mlen;
        char *man = ck_manifest_text(w->seed, w->recipe_text, w->sha, &w->desc, w->m, sm, all,
                                     n_all, fbytes, world, w->o.zero, &mlen);
        if (!man) {
            rc = ck_fail(err, errlen, "cannot format the manifest (libyaml emitter error)");
        } else {
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
    if (rc) return -1;
    for (int r = 1; r < world; r++) { /* the lists served their purpose */
        part_path(path, sizeof(path), tmp, r);
        unlink(path);
    }
    /* publish: the folder by rename, then `latest` by rename */
    if (ck_fsync_dir(tmp))
        return ck_fail(err, errlen, "cannot sync '%s': %s", tmp, strerror(errno));
    ck_remove_dir(fin); /* an older save of the same step (a resumed run redoing it) */
    if (rename(tmp, fin))
        return ck_fail(err, errlen, "cannot rename '%s': %s", tmp, strerror(errno));
    ck_fsync_dir(w->ckdir);
    char latest[64];
    snprintf(latest, sizeof(latest), "step_%08ld\n", sm->step);
    snprintf(path, sizeof(path), "%s/latest.tmp", w->ckdir);
    const void *lp[1] = {latest};
    size_t ll[1] = {strlen(latest)};
    if (ck_write_file(path, lp, ll, 1, err, errlen)) return -1;
    snprintf(tmp, sizeof(tmp), "%s/latest", w->ckdir);
    if (rename(path, tmp))
        return ck_fail(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    ck_fsync_dir(w->ckdir);
    /* retention: only now that a newer one is complete */
    long *steps;
    int n = ck_list_steps(w->ckdir, &steps);
    for (int i = 0, kept = 0; i < n; i++) {
        if (steps[i] > sm->step) continue; /* from a run this one resumed past: leave it */
        if (++kept <= w->o.keep) continue;
        snprintf(path, sizeof(path), "%s/step_%08ld", w->ckdir, steps[i]);
        ck_remove_dir(path);
    }
    free(steps);
    return 0;
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

int tr_ckpt_writer_init(tr_ckpt_writer **out, tr_model *m, const tr_recipe *recipe,
                        const tr_ckpt_opts *opts, char *err, size_t errlen) {
    *out = NULL;
    tr_ckpt_writer *w = calloc(1, sizeof(*w));
    if (!w) return ck_fail(err, errlen, "checkpoints: out of memory");
    w->m = m;
    w->o = *opts;
    if (w->o.keep < 1) w->o.keep = 1;
    if (w->o.world < 1) w->o.world = 1;
    w->desc = *tr_model_desc_of(m);
    w->seed = recipe->train.seed;
    snprintf(w->out, sizeof(w->out), "%s", opts->out);
    snprintf(w->ckdir, sizeof(w->ckdir), "%s/checkpoints", opts->out);
    if (tr_mkdirs(w->ckdir, err, errlen)) {
        free(w);
        return -1;
    }
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
    FILE *mf = open_memstream(&w->recipe_text, &w->recipe_len);
    tr_recipe_write_lua(recipe, mf);
    fclose(mf);
    tr_sha256_hex(w->recipe_text, w->recipe_len, w->sha);
    w->n_params = tr_model_num_params(m);
    /* this rank's blocks: every tensor's part inside each of its slab ranges, for the
       parameters, m and v */
    size_t whole[2] = {0, tr_model_slab_elements(m)};
    const size_t *rg = opts->ranges ? opts->ranges : whole;
    int n_rg = opts->ranges ? opts->n_ranges : 1, cap = 0;
    for (int kind = -1; kind <= 1; kind++)
        for (int r = 0; r < n_rg; r++)
            for (int i = 0; i < w->n_params; i++) {
                const tr_param *p = tr_model_param(m, i);
                size_t lo = rg[2 * r] > p->offset ? rg[2 * r] : p->offset;
                size_t hi =
                    rg[2 * r + 1] < p->offset + p->numel ? rg[2 * r + 1] : p->offset + p->numel;
                if (lo < hi && add_blocks(&w->sl, &w->n_sl, &cap, p, i, kind, w->o.rank,
                                          lo - p->offset, hi - p->offset)) {
                    free(w->sl);
                    free(w->recipe_text);
                    free(w);
                    return ck_fail(err, errlen, "checkpoints: out of memory");
                }
            }
    size_t off = 0;
    for (int i = 0; i < w->n_sl; i++) {
        w->sl[i].offset = off;
        off += w->sl[i].count;
    }
    w->o.ranges = NULL; /* the caller's, used only here */
    w->snap_floats = off;
    w->snap = malloc(off * sizeof(float) + 1);
    if (!w->snap) {
        free(w->sl);
        free(w->recipe_text);
        free(w);
        return ck_fail(err, errlen, "checkpoints: cannot allocate the host copy (%zu bytes)",
                       off * sizeof(float));
    }
    if (ck_fault_init(err, errlen)) {
        free(w->snap); /* not started: no thread, mutex or condition yet */
        free(w->sl);
        free(w->recipe_text);
        free(w);
        return -1;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        tr_ckpt_writer_free(w);
        return ck_fail(err, errlen, "checkpoints: cannot start the writer thread");
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

double tr_ckpt_save(tr_ckpt_writer *w, long step, const tr_loader_pos *pos) {
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
    free(w->snap);
    free(w->sl);
    free(w->recipe_text);
    free(w);
}
